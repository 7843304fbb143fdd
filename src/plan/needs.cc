// What K/V one rank needs: for each of its q chunks, the columns its bands attend (the union of a
// band's columns over consecutive rows is one interval), minus what it holds, split by owner.
#include <algorithm>

#include "plan/plan_internal.h"

namespace flexcp::plan_detail {

std::vector<Piece> remote_needs(const std::vector<Band>& bands, const ChunkIndex& q_index,
                                const std::vector<std::int64_t>& own_q_chunks, const KvLayout& kv,
                                int rank, std::int64_t* local_area) {
  std::vector<Range> spans;
  for (std::int64_t c : own_q_chunks) {
    const Range rows = q_index.chunks[c];
    for (std::int64_t i = q_index.offsets[c]; i < q_index.offsets[c + 1]; ++i) {
      const TileSpan s = band_tile_span(bands[q_index.band_ids[i]], rows.begin, rows.end);
      if (s.rows_begin < s.rows_end && s.span_begin < s.span_end)
        spans.push_back({s.span_begin, s.span_end});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> merged;
  for (const Range& r : spans) {
    if (!merged.empty() && r.begin <= merged.back().end)
      merged.back().end = std::max(merged.back().end, r.end);
    else
      merged.push_back(r);
  }
  // Cut by K/V chunk, drop what the rank holds, join neighbours of one owner.
  std::vector<Piece> pieces;
  for (const Range& need : merged) {
    auto it = std::upper_bound(kv.chunks.begin(), kv.chunks.end(), need.begin,
                               [](std::int64_t x, const Range& c) { return x < c.begin; });
    for (std::size_t c = static_cast<std::size_t>(it - kv.chunks.begin()) - 1;
         c < kv.chunks.size() && kv.chunks[c].begin < need.end; ++c) {
      const Range part{std::max(need.begin, kv.chunks[c].begin),
                       std::min(need.end, kv.chunks[c].end)};
      if (part.empty() || kv.owner[c] == rank) continue;
      if (!pieces.empty() && pieces.back().owner == kv.owner[c] &&
          pieces.back().tokens.end == part.begin)
        pieces.back().tokens.end = part.end;
      else
        pieces.push_back({kv.owner[c], part, 0});
    }
  }
  // Attended pairs of the rank's rows per piece, and in its own columns.
  std::int64_t total = 0;
  for (std::int64_t c : own_q_chunks) {
    const Range rows = q_index.chunks[c];
    for (std::int64_t i = q_index.offsets[c]; i < q_index.offsets[c + 1]; ++i) {
      const Band& b = bands[q_index.band_ids[i]];
      const TileSpan s = band_tile_span(b, rows.begin, rows.end);
      if (s.span_begin >= s.span_end) continue;
      total += band_area(b, rows.begin, rows.end, s.span_begin, s.span_end);
      auto first =
          std::upper_bound(pieces.begin(), pieces.end(), s.span_begin,
                           [](std::int64_t x, const Piece& p) { return x < p.tokens.end; });
      for (auto p = first; p != pieces.end() && p->tokens.begin < s.span_end; ++p)
        p->area += band_area(b, rows.begin, rows.end, p->tokens.begin, p->tokens.end);
    }
  }
  std::int64_t remote = 0;
  for (const Piece& p : pieces) remote += p.area;
  *local_area = total - remote;
  return pieces;
}

}  // namespace flexcp::plan_detail
