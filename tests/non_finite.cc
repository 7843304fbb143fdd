#include "non_finite.h"

#include <gtest/gtest.h>

#include <cmath>

namespace flexcp::test {

NonFiniteCase::NonFiniteCase(std::mt19937_64& rng, std::int64_t heads_q, std::int64_t head_dim,
                             DType type)
    : hq(heads_q),
      d(head_dim),
      dtype(type),
      q(random_tensor(rng, type, {t, heads_q, head_dim})),
      k(random_tensor(rng, type, {t, hk, head_dim})),
      v(random_tensor(rng, type, {t, hk, head_dim})),
      dout(random_tensor(rng, type, {t, heads_q, head_dim})) {
  q.set((nan_row * hq + 0) * d + 3, NAN);
  q.set((inf_row * hq + 0) * d + 0, INFINITY);
}

void expect_nan_exactly_where_reached(const NonFiniteCase& c, const Tensor& out, const Tensor& lse,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  for (std::int64_t x = 0; x < c.t; ++x)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const bool reached = h == 0 && (x == c.nan_row || x == c.inf_row);
      EXPECT_EQ(std::isnan(lse.get(x * c.hq + h)), reached) << "lse row " << x << " head " << h;
      EXPECT_EQ(std::isnan(dq.get((x * c.hq + h) * c.d)), reached)
          << "dq row " << x << " head " << h;
      for (std::int64_t col = 0; col < c.d; ++col)
        ASSERT_EQ(std::isnan(out.get((x * c.hq + h) * c.d + col)), reached)
            << "out row " << x << " head " << h;
    }
  for (std::int64_t y = 0; y <= c.nan_row; ++y) {  // keys the NaN row attends
    EXPECT_TRUE(std::isnan(dk.get(y * c.hk * c.d))) << "dk key " << y;
    EXPECT_TRUE(std::isnan(dv.get(y * c.hk * c.d))) << "dv key " << y;
  }
  for (std::int64_t y = 0; y < c.t; ++y) {  // the other kv head: nothing reaches it
    EXPECT_FALSE(std::isnan(dk.get((y * c.hk + 1) * c.d))) << "dk key " << y;
    EXPECT_FALSE(std::isnan(dv.get((y * c.hk + 1) * c.d))) << "dv key " << y;
  }
}

}  // namespace flexcp::test
