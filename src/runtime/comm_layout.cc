#include "runtime/comm_layout.h"

#include <algorithm>
#include <climits>

#include "flexcp/status.h"

namespace flexcp::runtime {

std::int64_t CommLayout::own_row(std::int64_t token) const {
  const auto it = std::upper_bound(own_ranges.begin(), own_ranges.end(), token,
                                   [](std::int64_t t, const Range& r) { return t < r.end; });
  if (it == own_ranges.end() || token < it->begin)
    throw Error(Status::kInternal,
                "CommLayout: token " + std::to_string(token) + " is not held here");
  return own_offsets[it - own_ranges.begin()] + (token - it->begin);
}

CommLayout make_comm_layout(const Plan& plan, int rank) {
  const RankPlan& rp = plan.ranks.at(rank);
  CommLayout layout;
  for (const Range& r : rp.k_tokens) {
    if (r.empty()) continue;
    layout.own_ranges.push_back(r);
    layout.own_offsets.push_back(layout.own_columns);
    layout.own_columns += r.size();
  }
  // Received pieces in buffer order (stage order), then looked up by token.
  struct Piece {
    Range tokens;
    std::int64_t column;
    int stage;
  };
  std::vector<Piece> pieces;
  std::int64_t column = layout.own_columns;
  for (const RemoteRange& r : rp.recv) {
    pieces.push_back({r.tokens, column, r.stage});
    column += r.tokens.size();
  }
  layout.total_columns = column;
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.tokens.begin < b.tokens.begin; });
  if (plan.casts.size() > static_cast<std::size_t>(INT_MAX / 2))
    throw Error(Status::kInvalidArgument, "CommLayout: too many group-cast items for message tags");
  for (std::size_t i = 0; i < plan.casts.size(); ++i) {
    const CastItem& item = plan.casts[i];
    if (item.owner == rank) layout.sends.push_back({static_cast<int>(i), item.tokens, item.dests});
    if (!std::binary_search(item.dests.begin(), item.dests.end(), rank)) continue;
    // Items are cut at every piece boundary, so each lies inside one received piece.
    const auto p =
        std::upper_bound(pieces.begin(), pieces.end(), item.tokens.begin,
                         [](std::int64_t t, const Piece& q) { return t < q.tokens.end; });
    if (p == pieces.end() || item.tokens.begin < p->tokens.begin || item.tokens.end > p->tokens.end)
      throw Error(Status::kInternal, "CommLayout: cast item outside this rank's receive list");
    layout.recvs.push_back({static_cast<int>(i), item.owner, item.tokens,
                            p->column + (item.tokens.begin - p->tokens.begin), p->stage});
  }
  return layout;
}

}  // namespace flexcp::runtime
