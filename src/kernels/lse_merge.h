// The one merge rule for softmax partials (DESIGN §2's lse): two partial results over disjoint key
// sets with log-sum-exps a and b (natural log; -inf for an empty set) combine into
// log(e^a + e^b), each part weighted by its share. The same rule folds a sink logit into a row's
// denominator. Header-only, for host and device code alike.
#pragma once

#include <cmath>

#include "flexcp/band.h"  // FLEXCP_HOST_DEVICE

namespace flexcp {

// Kernels run the softmax in base 2 (exp2 is one instruction); lse is reported in natural units.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct LseMerge {
  float lse = -INFINITY;  // log(e^a + e^b)
  float weight_a = 0.f;   // e^(a - lse): what part a's normalised result is scaled by
  float weight_b = 0.f;
};

FLEXCP_HOST_DEVICE inline LseMerge merge_lse(float a, float b) {
  // A NaN part (non-finite input reached the row) makes the merge NaN: the comparisons below
  // alone would drop it against an empty part and report an empty row.
  if (a != a || b != b) return {NAN, NAN, NAN};
  const float top = a > b ? a : b;
  if (top == -INFINITY) return {};
  // exp of the smaller over the larger is in (0, 1]: no overflow, and log1p keeps it exact.
  const float ea = expf(a - top), eb = expf(b - top);
  const float total = top + log1pf((a > b ? eb : ea));
  return {total, expf(a - total), expf(b - total)};
}

}  // namespace flexcp
