#include "runtime/comm_layout.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

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

void learn_send_stages(CommLayout& layout, const RankPlan& rp, Communicator& comm) {
  // (owner, index, stage) of every piece received, from every rank.
  struct Entry {
    std::int32_t owner, index, stage;
  };
  std::vector<Entry> mine;
  for (const RemoteRange& r : rp.recv) mine.push_back({r.owner, r.index, r.stage});
  const int world = comm.size();
  // Each rank's piece count and stage count: a rank's last stages may receive nothing (pieces cut
  // by tokens, or more stages forced than pieces), and every rank still starts one exchange per
  // stage of the rank with the most.
  struct Header {
    std::int64_t pieces, stages;
  };
  std::vector<Header> heads(world);
  const Header head{static_cast<std::int64_t>(mine.size()), rp.num_stages};
  comm.all_gather(&head, sizeof head, heads.data());
  std::vector<std::size_t> bytes(world);
  std::int64_t total = 0;
  layout.exchanges = 0;
  for (int r = 0; r < world; ++r) {
    bytes[r] = static_cast<std::size_t>(heads[r].pieces) * sizeof(Entry);
    total += heads[r].pieces;
    layout.exchanges = std::max(layout.exchanges, static_cast<int>(heads[r].stages));
  }
  std::vector<Entry> all(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)));
  comm.all_gather_v(mine.data(), bytes, all.data());

  // The send to rank r with index i is the piece r lists as (owner = this rank, index i).
  std::vector<std::vector<std::pair<int, int>>> stage_of(world);  // per receiver: (index, stage)
  std::int64_t at = 0;
  for (int r = 0; r < world; ++r)
    for (std::int64_t j = 0; j < heads[r].pieces; ++j, ++at) {
      const Entry& e = all[at];
      if (e.owner == rp.rank) stage_of[r].push_back({e.index, e.stage});
    }
  for (auto& v : stage_of) std::sort(v.begin(), v.end());
  layout.send_stage.clear();
  for (const SendRange& s : rp.sends) {
    const auto& v = stage_of[s.dest];
    const auto it = std::lower_bound(v.begin(), v.end(), std::pair{s.index, 0});
    if (it == v.end() || it->first != s.index)
      throw Error(Status::kInternal, "flexcp::DistAttention: rank " + std::to_string(s.dest) +
                                         " does not receive piece " + std::to_string(s.index) +
                                         " that rank " + std::to_string(rp.rank) + " sends it");
    layout.send_stage.push_back(it->second);
  }
}

}  // namespace flexcp::runtime
