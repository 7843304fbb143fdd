// CommLayout: one object owns every offset of a rank's transfers (DESIGN §3, DeepEP's layout
// struct): which token ranges it packs and sends to whom, and where each received range lands in
// its K/V buffer. The forward group-casts K/V along it; the backward group-reduces dK/dV along the
// same items in the other direction.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/plan.h"

namespace flexcp::runtime {

struct CastSend {
  int item = 0;  // index into plan.casts; message tags derive from it
  Range tokens;
  std::vector<int> dests;
};

struct CastRecv {
  int item = 0;
  int owner = 0;
  Range tokens;
  std::int64_t column = 0;  // K/V buffer column of tokens.begin
  int stage = 1;
};

struct CommLayout {
  std::int64_t own_columns = 0;    // K/V rows this rank holds (columns [0, own_columns))
  std::int64_t total_columns = 0;  // plus every received range
  std::vector<CastSend> sends;     // items this rank owns, in item order
  std::vector<CastRecv> recvs;     // items this rank receives, in item order
  std::vector<Range> own_ranges;   // global K/V tokens held, in local order
  std::vector<std::int64_t> own_offsets;

  // Local K/V row of a global token this rank holds.
  std::int64_t own_row(std::int64_t token) const;
  // Message tags of an item's K (or dK) and V (or dV) parts.
  static int tag_k(int item) { return 2 * item; }
  static int tag_v(int item) { return 2 * item + 1; }
};

CommLayout make_comm_layout(const Plan& plan, int rank);

}  // namespace flexcp::runtime
