// CommLayout: one object owns every offset of a rank's transfers (DESIGN §3, DeepEP's layout
// struct): where its own K/V rows sit, where each received piece lands in the K/V columns, and the
// message tags. The forward group-casts K/V along it; the backward group-reduces dK/dV along the
// same pieces in the other direction.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/comm.h"
#include "flexcp/plan.h"

namespace flexcp::runtime {

// The four messages of one piece: its K and V (forward, owner to receiver), and its dK and dV
// partials (backward, receiver to owner). Each has its own tag space, so that a forward and a
// backward between the same two ranks can never match each other's messages.
enum class Message { kK = 0, kV = 1, kGradK = 2, kGradV = 3 };

struct CommLayout {
  std::int64_t own_columns = 0;    // K/V rows this rank holds (columns [0, own_columns))
  std::int64_t total_columns = 0;  // plus every received piece
  std::vector<Range> own_ranges;   // global K/V tokens held, in local order
  std::vector<std::int64_t> own_offsets;
  std::vector<std::int64_t> recv_column;  // column of each RankPlan::recv entry's first token
  // Exchanges, matched in order on every rank (flexcp/comm.h): exchange s (1..exchanges) carries
  // the pieces every receiver consumes in its stage s, K/V forward and their partials backward.
  // send_stage[i] is the receiver's stage of RankPlan::sends[i] (learn_send_stages).
  std::vector<int> send_stage;
  int exchanges = 0;  // the most stages of any rank

  // Local K/V row of a global token this rank holds.
  std::int64_t own_row(std::int64_t token) const;
  // The tag of one message of the piece with this index (RemoteRange / SendRange::index).
  static int tag(int index, Message m) { return 4 * index + static_cast<int>(m); }
};

// Throws Error(kInvalidArgument) when a pair of ranks exchanges more pieces than tags can number.
// Its send stages are not known yet: learn_send_stages fills them.
CommLayout make_comm_layout(const RankPlan& rp);

// Collective, once per plan: each rank tells the owners of the pieces it receives in which of its
// stages it consumes them (a rank's plan knows its own stages only, DESIGN §3's per-rank planning).
void learn_send_stages(CommLayout& layout, const RankPlan& rp, Communicator& comm);

}  // namespace flexcp::runtime
