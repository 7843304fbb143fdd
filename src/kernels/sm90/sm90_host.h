// Host-side pieces both sm90 directions use: tensor-memory-accelerator descriptors, the layout
// checks TMA and the kernels' stores need, and the device check. Errors name the entry (`fn`).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "flexcp/tensor.h"

namespace flexcp::sm90 {

// t ([T, H, D], bf16 or fp16) viewed as {D, T, H} (innermost first), read in boxes of {64,
// box_rows, box_heads}, 128-byte swizzle; out-of-bounds rows read as zeros.
CUtensorMap tensor_map(const std::string& fn, const char* name, const TensorView& t,
                       std::uint32_t box_rows, std::uint32_t box_heads);
// An fp32 accumulator [T, H, D] (contiguous) viewed as {D, T, H}, in boxes of {box_cols,
// box_rows, 1} with a 128-byte swizzle (box_cols * 4 <= 128), for TMA reductions into it.
CUtensorMap accumulator_map(const std::string& fn, const char* name, float* data,
                            std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            std::uint32_t box_cols, std::uint32_t box_rows);
// A unit stride along D, a 16-byte aligned data pointer and token/head strides (TMA, and the
// kernels' vector stores).
void check_layout(const std::string& fn, const char* name, const TensorView& t);
// The device is an sm_90 one (what the kernels are built for); returns its multiprocessor count.
int check_device(const std::string& fn, int device_index);
// The multiprocessor count the backward's units are planned for: the device's, or 132 (an H100's
// and an H200's) where it cannot be read (a plan built where no GPU is visible; it runs nowhere
// until its workspace is bound on one).
int planned_multiprocessors(int device_index);
// The device memory's peak bandwidth per multiprocessor in GB/s (memory clock x 2 transfers x bus
// width, over the SMs), for the backward's unit rule (BwdUnitOptions::memory_gbs_per_sm); 0 where
// it cannot be read.
double planned_memory_gbs_per_sm(int device_index);

}  // namespace flexcp::sm90
