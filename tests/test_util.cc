#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "flexcp/band.h"

namespace flexcp::test {

Tensor::Tensor(DType dtype, std::initializer_list<std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  bytes.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype));
  view = make_view(bytes.data(), dtype, shape);
}

double Tensor::get(std::int64_t i) const {
  return load_double(view.data, view.dtype, i);
}

void Tensor::set(std::int64_t i, double x) {
  if (view.dtype == DType::kFloat64)
    static_cast<double*>(view.data)[i] = x;
  else
    store_float(view.data, view.dtype, i, static_cast<float>(x));
}

void Tensor::fill(double x) {
  for (std::int64_t i = 0; i < numel(); ++i) set(i, x);
}

void Tensor::poison() {
  fill(std::numeric_limits<double>::quiet_NaN());
}

Tensor random_tensor(std::mt19937_64& rng, DType dtype, std::initializer_list<std::int64_t> shape,
                     double amplitude) {
  Tensor t(dtype, shape);
  std::uniform_real_distribution<double> u(-amplitude, amplitude);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

namespace {

std::vector<std::int64_t> random_cuts(std::mt19937_64& rng, std::int64_t n) {
  std::vector<std::int64_t> cuts = {0, n};
  const int extra = std::uniform_int_distribution<int>(0, 4)(rng);
  for (int i = 0; i < extra && n > 1; ++i)
    cuts.push_back(std::uniform_int_distribution<std::int64_t>(0, n)(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

}  // namespace

Mask random_mask(std::mt19937_64& rng, std::int64_t seqlen_q, std::int64_t seqlen_k) {
  const auto qc = random_cuts(rng, seqlen_q), kc = random_cuts(rng, seqlen_k);
  std::vector<Slice> slices;
  std::uniform_int_distribution<int> type(0, 3), keep(0, 3);
  for (std::size_t i = 0; i + 1 < qc.size(); ++i)
    for (std::size_t j = 0; j + 1 < kc.size(); ++j)
      if (keep(rng) != 0)  // three cells in four carry a slice
        slices.push_back(
            {{qc[i], qc[i + 1]}, {kc[j], kc[j + 1]}, static_cast<MaskType>(type(rng))});
  std::shuffle(slices.begin(), slices.end(), rng);
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

std::vector<char> enumerate_pairs(const std::vector<Slice>& slices, std::int64_t seqlen_q,
                                  std::int64_t seqlen_k) {
  std::vector<char> pairs(static_cast<std::size_t>(seqlen_q * seqlen_k), 0);
  for (const Slice& s : slices)
    for (std::int64_t q = s.q.begin; q < s.q.end; ++q)
      for (std::int64_t k = s.k.begin; k < s.k.end; ++k)
        if (slice_attends(s, q, k)) pairs[q * seqlen_k + k] += 1;
  return pairs;
}

namespace {

struct Dims {
  std::int64_t tq, tk, hq, hk, d;
  double scale;
};

Dims dims_of(const TensorView& q, const TensorView& k, const AttentionOptions& o) {
  Dims d{q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2], o.scale};
  if (d.scale == 0) d.scale = 1.0 / std::sqrt(static_cast<double>(d.d));
  return d;
}

float at(const TensorView& t, std::int64_t x, std::int64_t h, std::int64_t d) {
  return load_float(t.data, t.dtype, x * t.strides[0] + h * t.strides[1] + d * t.strides[2]);
}

// Keys of row x in increasing order.
std::vector<std::int64_t> row_keys(const Mask& mask, std::int64_t x) {
  std::vector<std::int64_t> keys;
  for (const Slice& s : mask.slices()) {
    const Band b = slice_band(s);
    if (x < b.row_begin || x >= b.row_end) continue;
    for (std::int64_t y = b.begin(x); y < b.end(x); ++y) keys.push_back(y);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

struct FloatRow {
  std::vector<std::int64_t> keys;
  std::vector<float> p, tanh_u;
  float lse = -std::numeric_limits<float>::infinity();
};

FloatRow float_row(const Dims& dm, const AttentionOptions& o, const TensorView& q,
                   const TensorView& k, const Mask& mask, std::int64_t x, std::int64_t h) {
  FloatRow r;
  r.keys = row_keys(mask, x);
  if (r.keys.empty()) return r;
  const std::int64_t hk = h / (dm.hq / dm.hk);
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t y : r.keys) {
    float dot = 0;
    for (std::int64_t d = 0; d < dm.d; ++d) dot += at(q, x, h, d) * at(k, y, hk, d);
    float s = static_cast<float>(dm.scale) * dot;
    if (o.softcap > 0) {
      const float t = std::tanh(s / static_cast<float>(o.softcap));
      r.tanh_u.push_back(t);
      s = static_cast<float>(o.softcap) * t;
    }
    r.p.push_back(s);
    m = std::max(m, s);
  }
  float sum = 0;
  for (float s : r.p) sum += std::exp(s - m);
  if (!o.sink.empty()) sum += std::exp(static_cast<const float*>(o.sink.data)[h] - m);
  r.lse = m + std::log(sum);
  for (float& s : r.p) s = std::exp(s - r.lse);
  return r;
}

}  // namespace

void naive_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& mask,
                   const AttentionOptions& options, DType out_dtype, Tensor& out, Tensor& lse) {
  const Dims dm = dims_of(q, k, options);
  out = Tensor(DType::kFloat64, {dm.tq, dm.hq, dm.d});
  lse = Tensor(DType::kFloat64, {dm.tq, dm.hq});
  for (std::int64_t x = 0; x < dm.tq; ++x)
    for (std::int64_t h = 0; h < dm.hq; ++h) {
      const FloatRow r = float_row(dm, options, q, k, mask, x, h);
      for (std::int64_t d = 0; d < dm.d; ++d) {
        float acc = 0;
        for (std::size_t i = 0; i < r.keys.size(); ++i)
          acc += r.p[i] * at(v, r.keys[i], h / (dm.hq / dm.hk), d);
        out.set((x * dm.hq + h) * dm.d + d, round_to(out_dtype, acc));
      }
      lse.set(x * dm.hq + h, r.lse);
    }
}

void naive_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                    const TensorView& v, const Mask& mask, const AttentionOptions& options,
                    DType out_dtype, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims dm = dims_of(q, k, options);
  std::vector<float> gq(dm.tq * dm.hq * dm.d, 0), gk(dm.tk * dm.hk * dm.d, 0), gv(gk.size(), 0);
  const std::int64_t group = dm.hq / dm.hk;
  for (std::int64_t x = 0; x < dm.tq; ++x)
    for (std::int64_t h = 0; h < dm.hq; ++h) {
      const FloatRow r = float_row(dm, options, q, k, mask, x, h);
      const std::int64_t hk = h / group;
      std::vector<float> dp(r.keys.size());
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        float acc = 0;
        for (std::int64_t d = 0; d < dm.d; ++d) acc += at(dout, x, h, d) * at(v, r.keys[i], hk, d);
        dp[i] = acc;
      }
      // delta = <dout, out> with out as the forward stored it (rounded to out_dtype): what a
      // backward that takes the forward's output gets.
      float delta = 0;
      for (std::int64_t d = 0; d < dm.d; ++d) {
        float o = 0;
        for (std::size_t i = 0; i < r.keys.size(); ++i) o += r.p[i] * at(v, r.keys[i], hk, d);
        delta += at(dout, x, h, d) * static_cast<float>(round_to(out_dtype, o));
      }
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        const std::int64_t y = r.keys[i];
        float ds = r.p[i] * (dp[i] - delta);
        if (options.softcap > 0) ds *= 1 - r.tanh_u[i] * r.tanh_u[i];
        // P and dS enter the gradient products in the input precision, as in any backward whose
        // products run in it (tensor cores take bf16/fp16 operands).
        ds = static_cast<float>(round_to(out_dtype, ds));
        const float p = static_cast<float>(round_to(out_dtype, r.p[i]));
        for (std::int64_t d = 0; d < dm.d; ++d) {
          gv[(y * dm.hk + hk) * dm.d + d] += p * at(dout, x, h, d);
          gq[(x * dm.hq + h) * dm.d + d] += static_cast<float>(dm.scale) * ds * at(k, y, hk, d);
          gk[(y * dm.hk + hk) * dm.d + d] += static_cast<float>(dm.scale) * ds * at(q, x, h, d);
        }
      }
    }
  dq = Tensor(DType::kFloat64, {dm.tq, dm.hq, dm.d});
  dk = Tensor(DType::kFloat64, {dm.tk, dm.hk, dm.d});
  dv = Tensor(DType::kFloat64, {dm.tk, dm.hk, dm.d});
  for (std::size_t i = 0; i < gq.size(); ++i) dq.set(i, round_to(out_dtype, gq[i]));
  for (std::size_t i = 0; i < gk.size(); ++i) dk.set(i, round_to(out_dtype, gk[i]));
  for (std::size_t i = 0; i < gv.size(); ++i) dv.set(i, round_to(out_dtype, gv[i]));
}

Tensor naive_dsink(const TensorView& dout, const Tensor& naive_out, const Tensor& naive_lse,
                   const TensorView& sink) {
  const std::int64_t tq = dout.shape[0], hq = dout.shape[1], d = dout.shape[2];
  Tensor g(DType::kFloat64, {hq});
  for (std::int64_t h = 0; h < hq; ++h) {
    double acc = 0;
    for (std::int64_t x = 0; x < tq; ++x) {
      const double l = naive_lse.get(x * hq + h);
      if (std::isinf(l)) continue;
      double delta = 0;
      for (std::int64_t c = 0; c < d; ++c)
        delta += at(dout, x, h, c) * naive_out.get((x * hq + h) * d + c);
      acc -= std::exp(static_cast<const float*>(sink.data)[h * sink.strides[0]] - l) * delta;
    }
    g.set(h, acc);
  }
  return g;
}

std::vector<int> replay_work_list(const WorkList& list, const Mask& mask, bool row_major,
                                  std::int64_t block, bool* outside) {
  const std::int64_t tk = mask.seqlen_k();
  std::vector<int> seen(static_cast<std::size_t>(mask.seqlen_q() * tk), 0);
  for (std::int64_t t = 0; t < list.num_tiles(); ++t) {
    const std::int64_t r0 = t * list.tile_rows, r1 = std::min(r0 + list.tile_rows, list.num_rows);
    for (std::int64_t e = list.tile_offsets[t]; e < list.tile_offsets[t + 1]; ++e) {
      const WorkEntry& w = list.entries[e];
      const Band& b = list.bands[w.band];
      for (std::int64_t c0 = w.begin; c0 < w.end; c0 += block)
        for (std::int64_t x = r0; x < r1; ++x) {
          const BlockColumns cols = attended_columns(b, w.mask, x, c0, w.end, block);
          for (std::int64_t y = c0 + cols.lo; y < c0 + cols.hi; ++y) {
            if (!b.contains(x, y)) *outside = true;
            ++seen[row_major ? x * tk + y : y * tk + x];
          }
        }
    }
  }
  return seen;
}

Tensor rounded_to(const Tensor& t, DType dtype) {
  Tensor r;
  r.bytes.assign(static_cast<std::size_t>(t.numel()) * dtype_size(dtype), 0);
  r.view = t.view;
  r.view.data = r.bytes.data();
  r.view.dtype = dtype;
  for (std::int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

Tensor as_fp64(const Tensor& t) {
  Tensor out(DType::kFloat64, {});
  out.bytes.resize(t.numel() * sizeof(double));
  out.view = t.view;
  out.view.data = out.bytes.data();
  out.view.dtype = DType::kFloat64;
  for (std::int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::infinity();
    if (x == y) continue;  // includes -inf == -inf
    worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}

}  // namespace flexcp::test
