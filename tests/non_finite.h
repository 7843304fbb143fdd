// The non-finite-input case shared by the CPU and GPU tests, and its gtest expectations (apart
// from test_util, which the fuzzers link without gtest).
#pragma once

#include <cstdint>
#include <random>

#include "test_util.h"

namespace flexcp::test {

// Non-finite input on a causal mask: q head 0 of row `nan_row` holds a NaN and of row `inf_row`
// an inf (an fp16 overflow); every other value is finite. What it reaches must be NaN, and only
// that: those rows' out, lse and dq in q head 0, and dk and dv of the keys the NaN row attends in
// kv head 0 (kv head 1 sees no row of q head 0). Needs hq / hk q heads per kv head and hk = 2.
struct NonFiniteCase {
  std::int64_t t = 150, hq = 2, hk = 2, d = 32;
  std::int64_t nan_row = 10, inf_row = 120;
  DType dtype = DType::kFloat32;
  Mask mask() const { return masks::causal(t, t); }
  Tensor q, k, v, dout;
  NonFiniteCase(std::mt19937_64& rng, std::int64_t heads_q, std::int64_t head_dim, DType type);
};
void expect_nan_exactly_where_reached(const NonFiniteCase& c, const Tensor& out, const Tensor& lse,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace flexcp::test
