// CPU forward: one worker per (q tile, kv head) walks the tile's k intervals from the row-major
// work list: S = Q K^T (GEMM), mask, online softmax, O += P V (GEMM). No atomics; deterministic.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tile_ops.h"
#include "kernels/tiles.h"

namespace flexcp::cpu {

void forward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& q,
             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options) {
  constexpr int kBlockCols = tiles::kCpuBlockCols;
  const int group = static_cast<int>(s.group());
  const WorkList& list = plan.rows;
  const int tile_tokens = static_cast<int>(list.tile_rows);
  const int dp = round_up(static_cast<int>(s.head_dim), kLanes);
  const int max_rows = tile_tokens * group;
  const bool softcap = options.softcap > 0;
  // Without softcap the log2(e) of exp2 is folded into q; with it, logits need natural units first.
  const float q_mul = static_cast<float>(softcap ? s.scale : s.scale * kLog2e);
  const float* sink = static_cast<const float*>(options.sink.data);
  const std::int64_t num_tasks = list.num_tiles() * s.heads_kv;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    std::vector<float> qs(static_cast<std::size_t>(max_rows) * dp), o(qs.size());
    std::vector<float> sc(static_cast<std::size_t>(max_rows) * kBlockCols);
    std::vector<float> kt(static_cast<std::size_t>(dp) * kBlockCols), vb(kt.size());
    std::vector<float> m(max_rows), l(max_rows), inv_l(max_rows);
    std::vector<float> lse_row(max_rows);

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
      std::fill(o.begin(), o.end(), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);

      for (std::int64_t e = list.tile_offsets[tile]; e < list.tile_offsets[tile + 1]; ++e) {
        const WorkEntry& entry = list.entries[e];
        const Band& band = list.bands[entry.band];
        for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kBlockCols) {
          const int nc = static_cast<int>(std::min<std::int64_t>(kBlockCols, entry.end - c0));
          const TileRows cols{c0, nc, h, 1};
          gather_transposed(k, cols, 1.0f, kt.data(), kBlockCols, dp);
          gather_rows(v, cols, 1.0f, vb.data(), dp, kBlockCols);
          std::fill(sc.begin(), sc.begin() + static_cast<std::int64_t>(num_rows) * kBlockCols,
                    0.0f);
          gemm_acc(num_rows, kBlockCols, dp, qs.data(), dp, kt.data(), kBlockCols, sc.data(),
                   kBlockCols);
          if (softcap)
            apply_softcap(sc.data(), kBlockCols, num_rows, static_cast<float>(options.softcap),
                          kLog2e, nullptr);
          mask_block(sc.data(), kBlockCols, rows, c0, nc, band, entry.mask);
          online_softmax(sc.data(), kBlockCols, num_rows, m.data(), l.data(), o.data(), dp);
          gemm_acc(num_rows, dp, kBlockCols, sc.data(), kBlockCols, vb.data(), dp, o.data(), dp);
        }
      }

      for (int r = 0; r < num_rows; ++r) {
        if (l[r] == 0.0f) {  // no attended key: out = 0, lse = -inf (DESIGN §2)
          inv_l[r] = 0.0f;
          lse_row[r] = kNegInf;
          continue;
        }
        float row_lse = (m[r] + std::log2(l[r])) * kLn2;
        float mul = 1.0f / l[r];
        if (sink) {
          const LseMerge with_sink = merge_lse(row_lse, sink[rows.head0 + r % group]);
          mul *= with_sink.weight_a;
          row_lse = with_sink.lse;
        }
        inv_l[r] = mul;
        lse_row[r] = row_lse;
      }
      scatter_rows(o.data(), dp, inv_l.data(), out, rows);
      float* lse_data = static_cast<float*>(lse.data);
      for (int r = 0; r < num_rows; ++r)
        lse_data[(x0 + r / group) * lse.strides[0] + (rows.head0 + r % group) * lse.strides[1]] =
            lse_row[r];
    }
  }
}

}  // namespace flexcp::cpu
