// What the tests of the sm90 backward's plan share: its column-major work list in the kernel's
// tile sizes, and the unit options for a GPU of `sms` SMs, every choice left to the plan.
#pragma once

#include <cstdint>

#include "flexcp/band.h"
#include "flexcp/mask.h"
#include "kernels/tiles.h"
#include "kernels/worklist/bwd_units.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::test {

inline WorkList key_tiles(const Mask& mask) {
  return build_work_list(mask_bands(mask), mask.seqlen_q(), mask.seqlen_k(),
                         {.order = WorkListOrder::kColumnMajor,
                          .tile_rows = tiles::kSm90BwdBlockN,
                          .block_cols = tiles::kSm90BwdBlockM});
}

inline BwdUnitOptions bwd_options(int sms, std::int64_t heads_kv, std::int64_t group) {
  BwdUnitOptions o;
  o.sms = sms;
  o.block_rows = tiles::kSm90BwdBlockM;
  o.heads_kv = heads_kv;
  o.group = group;
  return o;
}

}  // namespace flexcp::test
