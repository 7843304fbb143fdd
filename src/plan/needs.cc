// What K/V a rank needs and from whom: the union of its chunks' band spans (the union of a band's
// columns over consecutive rows is one interval), cut by K/V chunk. The receiver and each sender
// cut the same spans with the same function, so both list the same pieces in the same order.
#include <algorithm>

#include "plan/plan_internal.h"

namespace flexcp::plan_detail {

std::vector<Range> attended_spans(const std::vector<Band>& bands, const ChunkIndex& q_index,
                                  const std::vector<std::int64_t>& q_chunks) {
  std::vector<Range> spans;
  for (std::int64_t c : q_chunks) {
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
  return merged;
}

namespace {

// Appends one owner's part of a span; parts of one owner that touch form one piece.
void append_part(std::vector<Piece>& pieces, int owner, Range part) {
  if (part.empty()) return;
  if (!pieces.empty() && pieces.back().owner == owner && pieces.back().tokens.end == part.begin)
    pieces.back().tokens.end = part.end;
  else
    pieces.push_back({owner, part, 0});
}

}  // namespace

std::vector<Piece> pieces_in(const std::vector<Range>& spans, const KvLayout& kv,
                             const std::vector<std::int64_t>& kv_chunk_ids) {
  std::vector<Piece> pieces;
  for (std::int64_t c : kv_chunk_ids) {
    const Range chunk = kv.chunks[c];
    auto it = std::upper_bound(spans.begin(), spans.end(), chunk.begin,
                               [](std::int64_t x, const Range& s) { return x < s.end; });
    for (; it != spans.end() && it->begin < chunk.end; ++it)
      append_part(pieces, kv.owner[c],
                  {std::max(it->begin, chunk.begin), std::min(it->end, chunk.end)});
  }
  return pieces;
}

std::vector<Piece> remote_pieces(const std::vector<Range>& spans, const KvLayout& kv, int rank) {
  std::vector<Piece> pieces;
  for (const Range& span : spans) {
    auto c = std::upper_bound(kv.chunks.begin(), kv.chunks.end(), span.begin,
                              [](std::int64_t x, const Range& k) { return x < k.end; });
    for (; c != kv.chunks.end() && c->begin < span.end; ++c) {
      const int owner = kv.owner[c - kv.chunks.begin()];
      if (owner != rank)
        append_part(pieces, owner, {std::max(span.begin, c->begin), std::min(span.end, c->end)});
    }
  }
  return pieces;
}

std::int64_t piece_areas(const std::vector<Band>& bands, const ChunkIndex& q_index,
                         const std::vector<std::int64_t>& q_chunks, std::vector<Piece>& pieces) {
  std::int64_t total = 0, remote = 0;
  for (std::int64_t c : q_chunks) {
    const Range rows = q_index.chunks[c];
    for (std::int64_t i = q_index.offsets[c]; i < q_index.offsets[c + 1]; ++i) {
      const Band& b = bands[q_index.band_ids[i]];
      const TileSpan s = band_tile_span(b, rows.begin, rows.end);
      if (s.span_begin >= s.span_end) continue;
      total += band_area(b, rows.begin, rows.end, s.span_begin, s.span_end);
      auto p = std::upper_bound(pieces.begin(), pieces.end(), s.span_begin,
                                [](std::int64_t x, const Piece& q) { return x < q.tokens.end; });
      for (; p != pieces.end() && p->tokens.begin < s.span_end; ++p) {
        const std::int64_t a = band_area(b, rows.begin, rows.end, p->tokens.begin, p->tokens.end);
        p->area += a;
        remote += a;
      }
    }
  }
  return total - remote;
}

}  // namespace flexcp::plan_detail
