// Helpers shared by the tests: owned tensors, random inputs and masks, brute-force mask
// enumeration, naive low-precision attention (the yardstick of DESIGN §6's tolerance rule).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "flexcp/flexcp.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::test {

// An owned, contiguous tensor with a view onto it.
struct Tensor {
  std::vector<unsigned char> bytes;
  TensorView view;

  Tensor() = default;
  Tensor(DType dtype, std::initializer_list<std::int64_t> shape);
  std::int64_t numel() const { return view.numel(); }
  double get(std::int64_t i) const;  // element i as double
  void set(std::int64_t i, double x);
  void fill(double x);
  // NaN everywhere (fp32/bf16/fp16/fp64): a kernel that skips an element leaves it visible.
  void poison();
};

// Uniform(-1, 1) values rounded to the tensor's dtype.
Tensor random_tensor(std::mt19937_64& rng, DType dtype, std::initializer_list<std::int64_t> shape,
                     double amplitude = 1.0);

// A random valid mask: q and k cut into random segments, a random subset of the (q, k) cells of
// that grid each carrying a random type (so rows are shared between slices), plus empty slices.
Mask random_mask(std::mt19937_64& rng, std::int64_t seqlen_q, std::int64_t seqlen_k);

// Replays a work list the way a kernel does, block by block (of `block` columns) with the one
// in-tile rule (attended_columns), and counts how often each (q, k) pair is computed, row-major.
// Sets *outside when the rule keeps a pair its band does not contain.
std::vector<int> replay_work_list(const WorkList& list, const Mask& mask, bool row_major,
                                  std::int64_t block, bool* outside);

// All attended (q, k) pairs by the definition (slice_attends), as a dense row-major bitmap.
std::vector<char> enumerate_pairs(const std::vector<Slice>& slices, std::int64_t seqlen_q,
                                  std::int64_t seqlen_k);

// Plain attention in float arithmetic, output rounded to `out_dtype`: what an ordinary
// implementation in the input precision gets. out [Tq, Hq, D], lse [Tq, Hq] as fp64 tensors.
void naive_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& mask,
                   const AttentionOptions& options, DType out_dtype, Tensor& out, Tensor& lse);
// Its gradients, float arithmetic, rounded to `out_dtype`; fp64 tensors shaped like q, k, v.
// Like every backward that is given the forward's output and runs its products in the input
// precision (flexcp's, FlashAttention's, cuDNN's), it takes the row sums delta = <dout, out> from
// out rounded to `out_dtype`, and rounds P and dS to it before the products for dV, dK and dQ:
// those roundings are part of the input precision's error. (Without them, flexcp's GPU backward
// was 1.1-1.4x over the bound on single-row cases, tq = 1, where no sum averages them.)
void naive_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                    const TensorView& v, const Mask& mask, const AttentionOptions& options,
                    DType out_dtype, Tensor& dq, Tensor& dk, Tensor& dv);

// The sink's gradient from a naive forward's rounded out and lse: -sum_q exp(sink - lse) <dout,
// out>, an fp64 tensor [Hq].
Tensor naive_dsink(const TensorView& dout, const Tensor& naive_out, const Tensor& naive_lse,
                   const TensorView& sink);

// The same values (and shape) as a float64 tensor, for comparing with references.
Tensor as_fp64(const Tensor& t);
// t's values rounded to dtype (to nearest even), as a kernel's store rounds its fp32 sums.
Tensor rounded_to(const Tensor& t, DType dtype);

// max |a - b| over elements, with -inf == -inf counted as 0 and NaN as infinity.
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace flexcp::test
