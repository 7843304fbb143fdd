// CPU backward, deterministic and without atomics, in two passes over the two work lists:
//   1. k-tile-major (column-major list): each worker owns one (k tile, kv head) and accumulates
//      its dK and dV over every q block and every q head of the group: S^T, P^T, dV += P^T dO,
//      dP^T = V dO^T, dS^T, dK += dS^T Q.
//   2. q-tile-major (row-major list): each worker owns one (q tile, kv head) and accumulates dQ:
//      S, P, dP = dO V^T, dS, dQ += dS K.
// Pass 2 recomputes S and dP (3 GEMMs per block against 4 in pass 1) in exchange for writing
// every gradient exactly once.
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tile_ops.h"
#include "kernels/tiles.h"

namespace flexcp::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kBlockCols = tiles::kCpuBlockCols;

struct RowStats {
  // Per (token, q head): lse in log2 units, +inf where the row attends nothing (so that 2^(s - lse)
  // is 0 even for s = -inf), and delta = <dout, out>.
  std::vector<float> lse2;
  std::vector<float> delta;
  std::int64_t heads = 0;
  float lse2_at(std::int64_t x, std::int64_t h) const { return lse2[x * heads + h]; }
  float delta_at(std::int64_t x, std::int64_t h) const { return delta[x * heads + h]; }
};

RowStats row_stats(const CallShape& s, const TensorView& dout, const TensorView& out,
                   const TensorView& lse) {
  RowStats st;
  st.heads = s.heads_q;
  st.lse2.resize(static_cast<std::size_t>(s.seqlen_q * s.heads_q));
  st.delta.resize(st.lse2.size());
  const float* lse_data = static_cast<const float*>(lse.data);
#pragma omp parallel for schedule(static)
  for (std::int64_t x = 0; x < s.seqlen_q; ++x) {
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const float l = lse_data[x * lse.strides[0] + h * lse.strides[1]];
      st.lse2[x * s.heads_q + h] = std::isinf(l) && l < 0 ? kInf : l * kLog2e;
      double acc = 0.0;
      const std::int64_t o_off = x * out.strides[0] + h * out.strides[1];
      const std::int64_t d_off = x * dout.strides[0] + h * dout.strides[1];
      for (std::int64_t d = 0; d < s.head_dim; ++d)
        acc += static_cast<double>(load_float(out.data, out.dtype, o_off + d * out.strides[2])) *
               load_float(dout.data, dout.dtype, d_off + d * dout.strides[2]);
      st.delta[x * s.heads_q + h] = static_cast<float>(acc);
    }
  }
  return st;
}

// Logits of one block from raw q.k products (natural units times scale): softcap, then log2.
void finish_logits(float* sc, int ld, int rows, const AttentionOptions& options, float* deriv) {
  if (options.softcap > 0)
    apply_softcap(sc, ld, rows, static_cast<float>(options.softcap), kLog2e, deriv);
}

void key_pass(const CallShape& s, const RowStats& st, const TensorView& dout, const TensorView& q,
              const TensorView& k, const TensorView& v, const WorkList& list, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options) {
  const int key_tile = static_cast<int>(list.tile_rows);
  const int group = static_cast<int>(s.group());
  const int dp = round_up(static_cast<int>(s.head_dim), kLanes);
  const bool softcap = options.softcap > 0;
  const float q_mul = static_cast<float>(softcap ? s.scale : s.scale * kLog2e);
  const std::int64_t num_tasks = list.num_tiles() * s.heads_kv;

#pragma omp parallel
  {
    const std::size_t key_buf = static_cast<std::size_t>(key_tile) * dp;
    const std::size_t blk_buf = static_cast<std::size_t>(key_tile) * kBlockCols;
    std::vector<float> kb(key_buf), vb(key_buf), dk_acc(key_buf), dv_acc(key_buf);
    std::vector<float> qt(static_cast<std::size_t>(dp) * kBlockCols), dot(qt.size());
    std::vector<float> qb(static_cast<std::size_t>(kBlockCols) * dp), dob(qb.size());
    std::vector<float> p(blk_buf), dpt(blk_buf), deriv(softcap ? blk_buf : 0);
    std::vector<float> lse2(kBlockCols), delta(kBlockCols);

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < num_tasks; ++task) {
      const std::int64_t tile = list.tile_order[task / s.heads_kv];
      const std::int64_t h = task % s.heads_kv;
      const std::int64_t y0 = tile * key_tile;
      const TileRows keys{y0, static_cast<int>(std::min<std::int64_t>(key_tile, s.seqlen_k - y0)),
                          h, 1};
      const int ny = keys.rows();
      gather_rows(k, keys, 1.0f, kb.data(), dp, ny);
      gather_rows(v, keys, 1.0f, vb.data(), dp, ny);
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);

      for (std::int64_t e = list.tile_offsets[tile]; e < list.tile_offsets[tile + 1]; ++e) {
        const WorkEntry& entry = list.entries[e];
        const Band& band = list.bands[entry.band];
        for (int j = 0; j < group; ++j) {
          const std::int64_t hq = h * group + j;
          for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kBlockCols) {
            const int nc = static_cast<int>(std::min<std::int64_t>(kBlockCols, entry.end - c0));
            const TileRows qrows{c0, nc, hq, 1};
            gather_transposed(q, qrows, q_mul, qt.data(), kBlockCols, dp);
            gather_transposed(dout, qrows, 1.0f, dot.data(), kBlockCols, dp);
            gather_rows(q, qrows, 1.0f, qb.data(), dp, kBlockCols);
            gather_rows(dout, qrows, 1.0f, dob.data(), dp, kBlockCols);
            for (int c = 0; c < kBlockCols; ++c) {
              lse2[c] = c < nc ? st.lse2_at(c0 + c, hq) : kInf;
              delta[c] = c < nc ? st.delta_at(c0 + c, hq) : 0.0f;
            }
            const std::size_t n = static_cast<std::size_t>(ny) * kBlockCols;
            std::fill(p.begin(), p.begin() + n, 0.0f);
            gemm_acc(ny, kBlockCols, dp, kb.data(), dp, qt.data(), kBlockCols, p.data(),
                     kBlockCols);
            finish_logits(p.data(), kBlockCols, ny, options, softcap ? deriv.data() : nullptr);
            mask_block(p.data(), kBlockCols, keys, c0, nc, band, entry.mask);
            exp2_minus_cols(p.data(), kBlockCols, ny, lse2.data());
            gemm_acc(ny, dp, kBlockCols, p.data(), kBlockCols, dob.data(), dp, dv_acc.data(), dp);
            std::fill(dpt.begin(), dpt.begin() + n, 0.0f);
            gemm_acc(ny, kBlockCols, dp, vb.data(), dp, dot.data(), kBlockCols, dpt.data(),
                     kBlockCols);
            softmax_grad_cols(p.data(), dpt.data(), kBlockCols, ny, delta.data(),
                              softcap ? deriv.data() : nullptr);
            gemm_acc(ny, dp, kBlockCols, dpt.data(), kBlockCols, qb.data(), dp, dk_acc.data(), dp);
          }
        }
      }
      std::vector<float> dk_mul(ny, static_cast<float>(s.scale));
      scatter_rows(dk_acc.data(), dp, dk_mul.data(), dk, keys);
      scatter_rows(dv_acc.data(), dp, nullptr, dv, keys);
    }
  }
}

void query_pass(const CallShape& s, const RowStats& st, const TensorView& dout, const TensorView& q,
                const TensorView& k, const TensorView& v, const WorkList& list,
                const TensorView& dq, const AttentionOptions& options) {
  const int group = static_cast<int>(s.group());
  const int tile_tokens = static_cast<int>(list.tile_rows);
  const int dp = round_up(static_cast<int>(s.head_dim), kLanes);
  const int max_rows = tile_tokens * group;
  const bool softcap = options.softcap > 0;
  const float q_mul = static_cast<float>(softcap ? s.scale : s.scale * kLog2e);
  const std::int64_t num_tasks = list.num_tiles() * s.heads_kv;

#pragma omp parallel
  {
    const std::size_t row_buf = static_cast<std::size_t>(max_rows) * dp;
    const std::size_t blk_buf = static_cast<std::size_t>(max_rows) * kBlockCols;
    std::vector<float> qs(row_buf), dos(row_buf), dq_acc(row_buf);
    std::vector<float> kt(static_cast<std::size_t>(dp) * kBlockCols), vt(kt.size());
    std::vector<float> kb(static_cast<std::size_t>(kBlockCols) * dp);
    std::vector<float> p(blk_buf), dpb(blk_buf), deriv(softcap ? blk_buf : 0);
    std::vector<float> lse2(max_rows), delta(max_rows),
        dq_mul(max_rows, static_cast<float>(s.scale));

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < num_tasks; ++task) {
      const std::int64_t tile = list.tile_order[task / s.heads_kv];
      const std::int64_t h = task % s.heads_kv;
      const std::int64_t x0 = tile * tile_tokens;
      const TileRows rows{x0,
                          static_cast<int>(std::min<std::int64_t>(tile_tokens, s.seqlen_q - x0)),
                          h * group, group};
      const int num_rows = rows.rows();
      gather_rows(q, rows, q_mul, qs.data(), dp, num_rows);
      gather_rows(dout, rows, 1.0f, dos.data(), dp, num_rows);
      for (int r = 0; r < num_rows; ++r) {
        lse2[r] = st.lse2_at(x0 + r / group, rows.head0 + r % group);
        delta[r] = st.delta_at(x0 + r / group, rows.head0 + r % group);
      }
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);

      for (std::int64_t e = list.tile_offsets[tile]; e < list.tile_offsets[tile + 1]; ++e) {
        const WorkEntry& entry = list.entries[e];
        const Band& band = list.bands[entry.band];
        for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kBlockCols) {
          const int nc = static_cast<int>(std::min<std::int64_t>(kBlockCols, entry.end - c0));
          const TileRows cols{c0, nc, h, 1};
          gather_transposed(k, cols, 1.0f, kt.data(), kBlockCols, dp);
          gather_transposed(v, cols, 1.0f, vt.data(), kBlockCols, dp);
          gather_rows(k, cols, 1.0f, kb.data(), dp, kBlockCols);
          const std::size_t n = static_cast<std::size_t>(num_rows) * kBlockCols;
          std::fill(p.begin(), p.begin() + n, 0.0f);
          gemm_acc(num_rows, kBlockCols, dp, qs.data(), dp, kt.data(), kBlockCols, p.data(),
                   kBlockCols);
          finish_logits(p.data(), kBlockCols, num_rows, options, softcap ? deriv.data() : nullptr);
          mask_block(p.data(), kBlockCols, rows, c0, nc, band, entry.mask);
          exp2_minus_rows(p.data(), kBlockCols, num_rows, lse2.data());
          std::fill(dpb.begin(), dpb.begin() + n, 0.0f);
          gemm_acc(num_rows, kBlockCols, dp, dos.data(), dp, vt.data(), kBlockCols, dpb.data(),
                   kBlockCols);
          softmax_grad_rows(p.data(), dpb.data(), kBlockCols, num_rows, delta.data(),
                            softcap ? deriv.data() : nullptr);
          gemm_acc(num_rows, dp, kBlockCols, dpb.data(), kBlockCols, kb.data(), dp, dq_acc.data(),
                   dp);
        }
      }
      scatter_rows(dq_acc.data(), dp, dq_mul.data(), dq, rows);
    }
  }
}

// d lse / d sink = exp(sink - lse); d loss / d sink[h] = -sum_q exp(sink[h] - lse[q]) delta[q].
void sink_grad(const CallShape& s, const RowStats& st, const AttentionOptions& options,
               const TensorView& dsink) {
  const float* sink = static_cast<const float*>(options.sink.data);
  float* out = static_cast<float*>(dsink.data);
  for (std::int64_t h = 0; h < s.heads_q; ++h) {
    double acc = 0.0;
    for (std::int64_t x = 0; x < s.seqlen_q; ++x) {
      const float l2 = st.lse2_at(x, h);
      if (std::isinf(l2)) continue;  // a row with no attended key has out = 0
      acc -= std::exp(static_cast<double>(sink[h]) - l2 / kLog2e) * st.delta_at(x, h);
    }
    out[h * dsink.strides[0]] = static_cast<float>(acc);
  }
}

}  // namespace

void sink_gradient(const CallShape& s, const TensorView& dout, const TensorView& out,
                   const TensorView& lse, const AttentionOptions& options,
                   const TensorView& dsink) {
  sink_grad(s, row_stats(s, dout, out, lse), options, dsink);
}

void backward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& dout,
              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options, const TensorView& dsink) {
  const RowStats st = row_stats(s, dout, out, lse);
  key_pass(s, st, dout, q, k, v, plan.cols, dk, dv, options);
  query_pass(s, st, dout, q, k, v, plan.rows, dq, options);
  if (!options.sink.empty() && !dsink.empty()) sink_grad(s, st, options, dsink);
}

}  // namespace flexcp::cpu
