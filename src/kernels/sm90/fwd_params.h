// What the host passes to the sm90 forward kernel: plain data, shared by the host code (.cc) and
// the kernel (.cu). Tile sizes live here because the host builds the work list with them.
#pragma once

#include <cuda.h>  // CUtensorMap (a header-only type; the driver is reached through the runtime)

#include <cstdint>

#include "flexcp/band.h"
#include "kernels/plan/workspace.h"
#include "kernels/tiles.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90 {

// One CTA owns kBlockM rows of q (the q heads of one kv head packed into them, DESIGN §3) and
// walks its work list in K/V blocks of FwdConfig::kBlockN keys, which depends on the head dim
// (kernels/tiles.h says why these sizes).
inline constexpr int kBlockM = tiles::kSm90BlockM;

struct FwdParams {
  // q as {D, Tq, Hq}, boxes of {64, rows_per_tile, pack}; k and v as {D, Tk, Hk}, boxes of
  // {64, block_n, 1}; out in half tiles ({64, 64, 1} when pack is 1, else {64, rows_per_tile,
  // pack / 2}), one per consumer warp group. 128-byte swizzle; out-of-bounds rows read as zeros
  // and are never written.
  CUtensorMap tma_q;
  CUtensorMap tma_k;
  CUtensorMap tma_v;
  CUtensorMap tma_o;

  // Or out in fp32 (the caller passed an fp32 out, a partial output to merge with others): the
  // epilogue stores the normalised accumulator from registers and tma_o is unused.
  float* out_f32 = nullptr;  // [Tq, Hq, D], unit stride along D
  std::int64_t out_stride_t = 0, out_stride_h = 0;

  float* lse = nullptr;  // [Tq, Hq]
  std::int64_t lse_stride_t = 0, lse_stride_h = 0;
  const float* sink = nullptr;  // [Hq] on the device (the caller's tensor), or null

  // The plan's row-major work list (tiles of rows_per_tile q rows) in its workspace, with the
  // scheduler's counters: {next item - gridDim.x, CTAs done}, zero at launch, reset to zero by
  // the last CTA.
  DeviceWorkList work;

  int num_tiles = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int group = 1;        // q heads per kv head
  int pack = 1;         // q heads sharing one CTA's rows (a power of two dividing group)
  int rows_log2 = 7;    // rows_per_tile = kBlockM / pack = 1 << rows_log2
  int head_blocks = 1;  // group / pack
  int items = 0;        // num_tiles * heads_kv * head_blocks

  // Logits: s = q.k; with softcap, s = softcap * tanh(scale * s / softcap), computed from
  // 2^(s * softcap_scale) with softcap_scale = 2 log2(e) scale / softcap, and the softmax runs on
  // s * log2(e); without, on s * scale_log2 (negate flips s first when the scale is negative, so
  // that the row maximum stays a maximum).
  float scale_log2 = 0.f;
  float softcap = 0.f;
  float softcap_scale = 0.f;
  int negate = 0;
};

}  // namespace flexcp::sm90
