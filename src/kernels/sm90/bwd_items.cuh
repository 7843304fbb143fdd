// The backward kernel's items as its roles walk them: a unit of a key tile's work with its
// entries, and the unit's q blocks in the order the producer loads them, the consumers compute
// them and the dQ writer adds them (bwd_kernel.cuh, bwd_dq_writer.cuh).
#pragma once

#include "kernels/sm90/bwd_params.h"
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

// The unit's q blocks in walk order: the q heads of the group, the tile's entries, each entry's
// blocks of kBwdBlockM rows from its begin; f(q head, first row, entry) for those in
// [block_begin, block_end). The producer, the consumers and the dQ writer walk alike.
template <class F>
__device__ __forceinline__ void walk_unit(const BwdParams& p, const BwdItem& it, F&& f) {
  int walked = 0;  // blocks before the current entry
  for (int j = 0; j < p.group; ++j) {
    const int hq = it.kv_head * p.group + j;
    for (int e = it.e_begin; e < it.e_end; ++e) {
      const WorkEntry entry = p.work.entries[e];
      const int begin = int(entry.begin);
      const int blocks = (int(entry.end) - begin + kBwdBlockM - 1) / kBwdBlockM;
      const int lo = max(it.block_begin - walked, 0), hi = min(it.block_end - walked, blocks);
      for (int b = lo; b < hi; ++b) f(hq, begin + b * kBwdBlockM, entry);
      walked += blocks;
      if (walked >= it.block_end) return;
    }
  }
}

}  // namespace flexcp::sm90::detail
