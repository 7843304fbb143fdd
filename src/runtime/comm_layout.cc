#include "runtime/comm_layout.h"

#include <algorithm>
#include <climits>
#include <string>

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

CommLayout make_comm_layout(const RankPlan& rp) {
  CommLayout layout;
  for (const Range& r : rp.k_tokens) {
    if (r.empty()) continue;
    layout.own_ranges.push_back(r);
    layout.own_offsets.push_back(layout.own_columns);
    layout.own_columns += r.size();
  }
  // Received pieces follow the own rows in the plan's receive order (stage order): the order the
  // local work's columns were numbered in.
  std::int64_t column = layout.own_columns;
  int max_index = 0;
  for (const RemoteRange& r : rp.recv) {
    layout.recv_column.push_back(column);
    column += r.tokens.size();
    max_index = std::max(max_index, r.index);
  }
  for (const SendRange& s : rp.sends) max_index = std::max(max_index, s.index);
  layout.total_columns = column;
  if (max_index >= INT_MAX / 4)
    throw Error(Status::kInvalidArgument,
                "flexcp::DistAttention: " + std::to_string(max_index + 1) +
                    " K/V pieces between two ranks, more than message tags can number");
  return layout;
}

}  // namespace flexcp::runtime
