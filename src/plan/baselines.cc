// The peers on the same mask and cost model: ring attention with zigzag balancing, Ulysses
// (all-to-all over heads), all-gather of K/V, and MagiAttention's default dispatch.
#include <algorithm>

#include "core/parallel.h"
#include "plan/plan_internal.h"

namespace flexcp::plan_detail {
namespace {

// Ring with zigzag: 2W equal chunks; rank r holds chunks r and 2W-1-r (q and K/V). In step s it
// computes its queries against the K/V of rank (r - s) mod W, while receiving the next block.
BaselineFigures ring_zigzag(const std::vector<Band>& bands, const PlanOptions& o, std::int64_t tq,
                            std::int64_t tk) {
  const int w = o.world_size;
  const std::vector<Range> qc = equal_chunks(tq, 2 * w), kc = equal_chunks(tk, 2 * w);
  auto holder = [w](std::int64_t chunk) {
    return static_cast<int>(chunk < w ? chunk : 2 * w - 1 - chunk);
  };
  // area[r][owner]: pairs of rank r's queries against owner's K/V, visiting only K/V chunks inside
  // each band's span.
  std::vector<std::vector<std::int64_t>> area(w, std::vector<std::int64_t>(w, 0));
  const ChunkIndex index = index_bands(bands, qc);
  for (std::int64_t c = 0; c < 2 * w; ++c)
    for (std::int64_t i = index.offsets[c]; i < index.offsets[c + 1]; ++i) {
      const Band& b = bands[index.band_ids[i]];
      const TileSpan s = band_tile_span(b, qc[c].begin, qc[c].end);
      if (s.span_begin >= s.span_end) continue;
      const auto first = std::upper_bound(kc.begin(), kc.end(), s.span_begin,
                                          [](std::int64_t x, const Range& r) { return x < r.end; });
      for (std::int64_t k = first - kc.begin(); k < 2 * w && kc[k].begin < s.span_end; ++k) {
        area[holder(c)][holder(k)] += band_area(b, qc[c].begin, qc[c].end, kc[k].begin, kc[k].end);
      }
    }
  BaselineFigures f;
  const std::int64_t block = (tk + w - 1) / w;
  f.comm_bytes_fwd = static_cast<std::int64_t>(w - 1) * tk * kv_bytes_per_token(o);
  const bool one_node = o.gpus_per_node == 0 || o.gpus_per_node >= w;
  const double step_comm = transfer_us(block, one_node, o);
  std::vector<double> busy(w, 0.0);
  double total = 0;
  for (int s = 0; s < w; ++s) {
    double slowest = 0;
    for (int r = 0; r < w; ++r) {
      const double t = compute_us(area[r][(r - s + w) % w], o);
      busy[r] += t;
      slowest = std::max(slowest, t);
    }
    total += s == 0 ? slowest : std::max(slowest, step_comm);
  }
  double sum = 0, worst = 0;
  for (double b : busy) sum += b, worst = std::max(worst, b);
  f.imbalance = sum > 0 ? worst / (sum / w) : 1.0;
  f.predicted_us = total;
  f.idle_fraction = total > 0 ? 1.0 - sum / (w * total) : 0.0;
  return f;
}

bool one_node(const PlanOptions& o) {
  return o.gpus_per_node == 0 || o.gpus_per_node >= o.world_size;
}

double link_gbps(const PlanOptions& o) {
  return one_node(o) ? o.cost.intra_node_gbps : o.cost.inter_node_gbps;
}

}  // namespace

BaselineFigures ring_baseline(const std::vector<Band>& bands, const Mask& mask,
                              const PlanOptions& o) {
  return ring_zigzag(bands, o, mask.seqlen_q(), mask.seqlen_k());
}

// Ulysses: all-to-all of q, k, v before and out after; each rank then has every token for
// Hq / W heads, so compute is perfectly balanced, but nothing overlaps the all-to-alls.
BaselineFigures ulysses_baseline(const Mask& mask, const PlanOptions& o) {
  const int w = o.world_size;
  BaselineFigures u;
  u.applicable = o.heads_q % w == 0 && (o.heads_kv % w == 0 || w % o.heads_kv == 0);
  const std::int64_t per_token = (2 * o.heads_q + 2 * o.heads_kv) * o.head_dim *
                                 static_cast<std::int64_t>(dtype_size(o.dtype));
  u.comm_bytes_fwd = static_cast<std::int64_t>(
      static_cast<double>(w - 1) / w *
      static_cast<double>(std::max(mask.seqlen_q(), mask.seqlen_k()) * per_token));
  const double a2a_us = static_cast<double>(u.comm_bytes_fwd) / w / (link_gbps(o) * 1e9) * 1e6;
  u.predicted_us = a2a_us + compute_us(mask.area(), o) / w;
  u.imbalance = 1.0;
  u.idle_fraction = u.predicted_us > 0 ? a2a_us / u.predicted_us : 0.0;
  return u;
}

// All-gather: every rank receives all K/V it does not hold, then computes flexcp's dispatch.
BaselineFigures allgather_baseline(const Mask& mask, const PlanReport& report) {
  const PlanOptions& o = report.options;
  const int w = o.world_size;
  const std::int64_t tk = mask.seqlen_k();
  BaselineFigures g;
  g.comm_bytes_fwd = static_cast<std::int64_t>(w - 1) * tk * kv_bytes_per_token(o);
  const double gather_us =
      static_cast<double>(tk) * (w - 1) / w * kv_bytes_per_token(o) / (link_gbps(o) * 1e9) * 1e6;
  double worst = 0, sum = 0;
  for (std::int64_t a : report.dispatch.rank_area)
    worst = std::max(worst, compute_us(a, o)), sum += compute_us(a, o);
  g.imbalance = report.dispatch.imbalance;
  g.predicted_us = gather_us + worst;
  g.idle_fraction = g.predicted_us > 0 ? 1.0 - sum / (w * g.predicted_us) : 0.0;
  return g;
}

// MagiAttention's default: chunks of ceil(T / 8W) tokens, largest first to the least-loaded rank
// with room, zero-redundancy K/V (each rank receives exactly the remote columns it attends),
// priced with the same stages and cost model as flexcp's own plan. Self-attention only.
BaselineFigures magi_baseline(const std::vector<Band>& bands, const Mask& mask,
                              const PlanOptions& o) {
  BaselineFigures m;
  const std::int64_t tq = mask.seqlen_q();
  const int w = o.world_size;
  if (tq != mask.seqlen_k() || tq < w) {
    m.applicable = false;
    return m;
  }
  const std::int64_t size = (tq + 8 * std::int64_t{w} - 1) / (8 * std::int64_t{w});
  const std::int64_t n = (tq + size - 1) / size;
  std::vector<Range> chunks(n);
  for (std::int64_t i = 0; i < n; ++i) chunks[i] = {i * size, std::min((i + 1) * size, tq)};
  const ChunkIndex index = index_bands(bands, chunks);
  const std::vector<std::int64_t> costs = chunk_costs(bands, index);
  KvLayout kv{chunks, assign_longest_first(costs, w)};
  std::vector<std::vector<std::int64_t>> mine(w);
  for (std::int64_t c = 0; c < n; ++c) mine[kv.owner[c]].push_back(c);
  std::int64_t total = 0, worst = 0, tokens = 0;
  double slowest = 0, busy = 0;
  FirstError errors;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : total, tokens, busy) \
    reduction(max : worst, slowest)
  for (int r = 0; r < w; ++r)
    errors.run([&, r] {
      std::vector<Piece> pieces = remote_pieces(attended_spans(bands, index, mine[r]), kv, r);
      const std::int64_t local = piece_areas(bands, index, mine[r], pieces);
      std::int64_t area = local;
      for (const Piece& p : pieces) area += p.area, tokens += p.tokens.size();
      total += area;
      worst = std::max(worst, area);
      const Staging st = price_pieces(local, pieces, r, o);
      slowest = std::max(slowest, simulate(st, std::max(choose_stages(st, o), 1), o).total_us);
      busy += compute_us(area, o);
    });
  errors.rethrow();
  m.comm_bytes_fwd = tokens * kv_bytes_per_token(o);
  m.imbalance = total > 0 ? static_cast<double>(worst) / (static_cast<double>(total) / w) : 1.0;
  m.predicted_us = slowest;
  m.idle_fraction = slowest > 0 ? 1.0 - busy / (w * slowest) : 0.0;
  return m;
}

}  // namespace flexcp::plan_detail
