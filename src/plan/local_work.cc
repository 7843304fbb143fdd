// A rank's work in local coordinates: rows are its q tokens in chunk order; columns are its K/V
// buffer (own tokens in chunk order, then the received ranges in stage order). Each band of the
// mask is clipped to one run of q chunks and one K/V segment and shifted; the stage is the
// segment's. Runs and segments are as long as the local order allows: neighbouring chunks held
// together (all of them on one rank) give one run, and neighbouring K/V ranges of one stage at
// neighbouring columns one segment, so a band is cut only where its local image breaks. Each cut
// costs the kernels an interval per tile and a masked block where it falls inside one.
#include <algorithm>

#include "plan/plan_internal.h"

namespace flexcp::plan_detail {
namespace {

struct Segment {
  Range global;
  std::int64_t local_begin;
  int stage;
};

}  // namespace

// The cells of `b` in rows `rows` and columns `cols`, moved by (dr, dc).
Band clip_and_shift(Band b, Range rows, Range cols, std::int64_t dr, std::int64_t dc) {
  b.row_begin = std::max(b.row_begin, rows.begin) + dr;
  b.row_end = std::min(b.row_end, rows.end) + dr;
  b.begin_min = std::max(b.begin_min, cols.begin) + dc;
  b.end_max = std::min(b.end_max, cols.end) + dc;
  b.begin_off = b.begin_slope ? b.begin_off - dr + dc : b.begin_min;
  b.end_off = b.end_slope ? b.end_off - dr + dc : b.end_max;
  if (!b.begin_slope) b.begin_off = b.begin_min = std::max(b.begin_min, b.begin_off);
  if (!b.end_slope) b.end_off = b.end_max = std::min(b.end_max, b.end_off);
  return trim_band(b);
}

void build_local_work(const std::vector<Band>& bands, const ChunkIndex& q_index, RankPlan& rp) {
  const int num_stages = rp.num_stages;
  std::vector<Segment> pieces;
  std::int64_t offset = 0;
  for (const Range& r : rp.k_tokens) {
    // NOTE: empty chunks are left out: the lookup below needs segment ends increasing.
    if (!r.empty()) pieces.push_back({r, offset, 0});
    offset += r.size();
  }
  for (const RemoteRange& r : rp.recv) {
    pieces.push_back({r.tokens, offset, r.stage});
    offset += r.tokens.size();
  }
  std::sort(pieces.begin(), pieces.end(),
            [](auto& a, auto& b) { return a.global.begin < b.global.begin; });
  std::vector<Segment> segments;
  for (const Segment& g : pieces) {
    Segment* last = segments.empty() ? nullptr : &segments.back();
    if (last != nullptr && last->stage == g.stage && last->global.end == g.global.begin &&
        last->local_begin + last->global.size() == g.local_begin)
      last->global.end = g.global.end;
    else
      segments.push_back(g);
  }
  rp.stage_work.assign(num_stages + 1, {});
  rp.stage_area.assign(num_stages + 1, 0);
  std::vector<std::int32_t> run_bands;
  std::int64_t local_row = 0;
  for (std::size_t i = 0; i < rp.chunks.size();) {
    // The run of chunks i..j-1: each begins where the one before ends.
    Range rows = q_index.chunks[rp.chunks[i]];
    std::size_t j = i + 1;
    while (j < rp.chunks.size() && q_index.chunks[rp.chunks[j]].begin == rows.end)
      rows.end = q_index.chunks[rp.chunks[j++]].end;
    run_bands.clear();
    for (std::size_t c = i; c < j; ++c)
      run_bands.insert(run_bands.end(), q_index.band_ids.begin() + q_index.offsets[rp.chunks[c]],
                       q_index.band_ids.begin() + q_index.offsets[rp.chunks[c] + 1]);
    std::sort(run_bands.begin(), run_bands.end());
    run_bands.erase(std::unique(run_bands.begin(), run_bands.end()), run_bands.end());
    const std::int64_t dr = local_row - rows.begin;
    for (const std::int32_t id : run_bands) {
      const Band& b = bands[id];
      const TileSpan s = band_tile_span(b, rows.begin, rows.end);
      if (s.span_begin >= s.span_end) continue;
      auto seg =
          std::upper_bound(segments.begin(), segments.end(), s.span_begin,
                           [](std::int64_t x, const Segment& g) { return x < g.global.end; });
      for (; seg != segments.end() && seg->global.begin < s.span_end; ++seg) {
        const Band local =
            clip_and_shift(b, rows, seg->global, dr, seg->local_begin - seg->global.begin);
        if (local.row_begin >= local.row_end) continue;
        rp.stage_area[seg->stage] +=
            band_area(local, local.row_begin, local.row_end, local.begin_min, local.end_max);
        rp.stage_work[seg->stage].push_back(local);
      }
    }
    local_row += rows.size();
    i = j;
  }
}

}  // namespace flexcp::plan_detail
