// Float64 references: the definitions of DESIGN §2 evaluated pair by pair. Slow and obvious on
// purpose; every kernel is tested against these.
#include <cmath>
#include <limits>
#include <vector>

#include "core/checks.h"
#include "core/dtype.h"
#include "flexcp/attention.h"
#include "flexcp/band.h"

namespace flexcp {
namespace {

struct Reader {
  const TensorView& t;
  double operator()(std::int64_t x, std::int64_t h, std::int64_t d) const {
    return load_double(t.data, t.dtype, x * t.strides[0] + h * t.strides[1] + d * t.strides[2]);
  }
};

double* at(const TensorView& t, std::int64_t x, std::int64_t h, std::int64_t d = 0) {
  return static_cast<double*>(t.data) + x * t.strides[0] + h * t.strides[1] +
         (t.ndim > 2 ? d * t.strides[2] : 0);
}

// The keys row x attends, as disjoint intervals, from the slices' bands.
std::vector<std::pair<std::int64_t, std::int64_t>> row_intervals(const std::vector<Band>& bands,
                                                                 std::int64_t x) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const Band& b : bands)
    if (x >= b.row_begin && x < b.row_end && b.begin(x) < b.end(x))
      out.emplace_back(b.begin(x), b.end(x));
  return out;
}

// Probabilities of one row (one q head) over its attended keys, and its lse; lse = -inf when the
// row attends nothing. `raw` receives the pre-softcap logits' tanh for the chain rule.
struct RowSoftmax {
  std::vector<std::int64_t> keys;
  std::vector<double> p;
  std::vector<double> tanh_u;
  double lse = -std::numeric_limits<double>::infinity();
};

RowSoftmax row_softmax(const CallShape& s, const AttentionOptions& o, const Reader& q,
                       const Reader& k, const std::vector<Band>& bands, std::int64_t x,
                       std::int64_t hq) {
  RowSoftmax r;
  const std::int64_t hk = hq / s.group();
  for (auto [b, e] : row_intervals(bands, x))
    for (std::int64_t y = b; y < e; ++y) r.keys.push_back(y);
  if (r.keys.empty()) return r;
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t y : r.keys) {
    double dot = 0.0;
    for (std::int64_t d = 0; d < s.head_dim; ++d) dot += q(x, hq, d) * k(y, hk, d);
    double logit = s.scale * dot;
    if (o.softcap > 0) {
      const double t = std::tanh(logit / o.softcap);
      r.tanh_u.push_back(t);
      logit = o.softcap * t;
    }
    r.p.push_back(logit);
    m = std::max(m, logit);
  }
  double sum = 0.0;
  for (double logit : r.p) sum += std::exp(logit - m);
  if (!o.sink.empty()) sum += std::exp(static_cast<const float*>(o.sink.data)[hq] - m);
  r.lse = m + std::log(sum);
  for (double& logit : r.p) logit = std::exp(logit - r.lse);
  return r;
}

}  // namespace

void reference_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Mask& mask, const TensorView& out, const TensorView& lse,
                       const AttentionOptions& options) {
  const ArgChecker c("flexcp::reference_forward");
  check_mask(c, read_shape(c, q, k, v, true), mask);
  const CallShape s =
      check_forward(c, read_shape(c, q, k, v, true), q, k, v, out, lse, options, true);
  const std::vector<Band> bands = mask_bands(mask);
  const Reader rq{q}, rk{k}, rv{v};
  for (std::int64_t x = 0; x < s.seqlen_q; ++x) {
    for (std::int64_t hq = 0; hq < s.heads_q; ++hq) {
      const RowSoftmax r = row_softmax(s, options, rq, rk, bands, x, hq);
      for (std::int64_t d = 0; d < s.head_dim; ++d) {
        double acc = 0.0;
        for (std::size_t i = 0; i < r.keys.size(); ++i)
          acc += r.p[i] * rv(r.keys[i], hq / s.group(), d);
        *at(out, x, hq, d) = acc;
      }
      *at(lse, x, hq) = r.keys.empty() ? -std::numeric_limits<double>::infinity() : r.lse;
    }
  }
}

void reference_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const Mask& mask, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const TensorView& dsink) {
  const ArgChecker c("flexcp::reference_backward");
  check_mask(c, read_shape(c, q, k, v, true), mask);
  const CallShape s = check_backward(c, read_shape(c, q, k, v, true), dout, q, k, v, {}, {}, dq, dk,
                                     dv, options, dsink, true);
  const std::vector<Band> bands = mask_bands(mask);
  const Reader rq{q}, rk{k}, rv{v}, rdo{dout};
  const std::int64_t dim = s.head_dim;
  for (const TensorView* g : {&dq, &dk, &dv})
    for (std::int64_t x = 0; x < g->shape[0]; ++x)
      for (std::int64_t h = 0; h < g->shape[1]; ++h)
        for (std::int64_t d = 0; d < dim; ++d) *at(*g, x, h, d) = 0.0;
  std::vector<double> dsink_acc(s.heads_q, 0.0);
  for (std::int64_t x = 0; x < s.seqlen_q; ++x) {
    for (std::int64_t hq = 0; hq < s.heads_q; ++hq) {
      const std::int64_t hk = hq / s.group();
      const RowSoftmax r = row_softmax(s, options, rq, rk, bands, x, hq);
      if (r.keys.empty()) continue;
      // dP_i = <dout, v_i>; delta = sum_i p_i dP_i = <dout, out>.
      std::vector<double> dp(r.keys.size());
      double delta = 0.0;
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        double acc = 0.0;
        for (std::int64_t d = 0; d < dim; ++d) acc += rdo(x, hq, d) * rv(r.keys[i], hk, d);
        dp[i] = acc;
        delta += r.p[i] * acc;
      }
      if (!options.sink.empty())
        dsink_acc[hq] -= std::exp(static_cast<const float*>(options.sink.data)[hq] - r.lse) * delta;
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        const std::int64_t y = r.keys[i];
        double ds = r.p[i] * (dp[i] - delta);
        if (options.softcap > 0) ds *= 1.0 - r.tanh_u[i] * r.tanh_u[i];
        for (std::int64_t d = 0; d < dim; ++d) {
          *at(dv, y, hk, d) += r.p[i] * rdo(x, hq, d);
          *at(dq, x, hq, d) += s.scale * ds * rk(y, hk, d);
          *at(dk, y, hk, d) += s.scale * ds * rq(x, hq, d);
        }
      }
    }
  }
  if (!dsink.empty())
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      static_cast<double*>(dsink.data)[h * dsink.strides[0]] = dsink_acc[h];
}

}  // namespace flexcp
