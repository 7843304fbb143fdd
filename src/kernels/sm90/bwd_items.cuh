// The backward kernel's items as its roles walk them: a unit of a key tile's work with its
// entries, and the unit's q blocks in the order the producer loads them, the consumers compute
// them and the dQ writer adds them (bwd_kernel.cuh, bwd_dq_writer.cuh).
#pragma once

#include "kernels/sm90/bwd_params.h"
#include "kernels/worklist/bwd_walk.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90::detail {

// A unit (kernels/worklist/bwd_units.h) with its tile's entries.
struct BwdItem : BwdUnit {
  int e_begin, e_end;
};

__device__ __forceinline__ BwdItem decode_bwd_item(const BwdParams& p, int i) {
  BwdItem it;
  static_cast<BwdUnit&>(it) = p.units[i];
  it.e_begin = int(p.work.tile_offsets[it.tile]);
  it.e_end = int(p.work.tile_offsets[it.tile + 1]);
  return it;
}

// The unit's q blocks of kBlockM rows in walk order (kernels/worklist/bwd_walk.h): f(q head,
// first row, entry).
// The producer, the consumers and the dQ writer walk alike.
template <int kBlockM, class F>
__device__ __forceinline__ void walk_unit(const BwdParams& p, const BwdItem& it, F&& f) {
  walk_bwd_unit(it, p.work.entries, it.e_begin, it.e_end, p.group, kBlockM, f);
}

}  // namespace flexcp::sm90::detail
