// The order in which a unit of the sm90 backward walks its q blocks (BwdWalk, bwd_units.h): one
// definition for the kernel's three roles (its producer loads the blocks in this order, its
// consumers compute them and its dQ writer adds them, each walking alike) and for the tests.
// Header-only, so that device code calls the same function.
#pragma once

#include <cstdint>

#include "flexcp/band.h"  // FLEXCP_HOST_DEVICE
#include "kernels/worklist/bwd_units.h"
#include "kernels/worklist/worklist.h"

#if defined(__CUDACC__)
#define FLEXCP_WALK_INLINE __host__ __device__ __forceinline__
#else
#define FLEXCP_WALK_INLINE inline
#endif

namespace flexcp {

// f(q head, first row, entry) for each q block of `unit`, the blocks [block_begin, block_end) of
// its item's walk, in order. The item's tile owns entries [e_begin, e_end); `group` q heads share
// the unit's kv head; blocks are `block_rows` rows from their entry's begin (the last one may be
// short). One call site for f: the consumers' f is the whole block of products, inlined once.
template <class F>
FLEXCP_WALK_INLINE void walk_bwd_unit(const BwdUnit& unit, const WorkEntry* entries, int e_begin,
                                      int e_end, int group, int block_rows, F&& f) {
  if (e_begin == e_end || unit.block_begin >= unit.block_end) return;
  const auto blocks_of = [block_rows](const WorkEntry& en) {
    return int((en.end - en.begin + block_rows - 1) / block_rows);
  };
  const bool heads_inner = unit.walk == BwdWalk::kHeadsInnerFromLast;
  // The unit's first block: head j, entry e, block b of the entry.
  int j = 0, e = 0, b = 0, pos = unit.block_begin;
  if (heads_inner) {
    for (e = e_end - 1; pos >= blocks_of(entries[e]) * group; --e)
      pos -= blocks_of(entries[e]) * group;
    j = pos % group;
    b = blocks_of(entries[e]) - 1 - pos / group;
  } else {
    int per_head = 0;
    for (int k = e_begin; k < e_end; ++k) per_head += blocks_of(entries[k]);
    j = pos / per_head;
    pos -= j * per_head;
    for (e = e_begin; pos >= blocks_of(entries[e]); ++e) pos -= blocks_of(entries[e]);
    b = pos;
  }
  WorkEntry entry = entries[e];
  int blocks = blocks_of(entry);
  const int hq0 = unit.kv_head * group;
  for (int s = unit.block_begin;;) {
    f(hq0 + j, int(entry.begin) + b * block_rows, entry);
    if (++s == unit.block_end) return;  // the next step would read past the unit's entries
    if (heads_inner) {
      if (++j < group) continue;
      j = 0;
      if (--b >= 0) continue;
      do {
        entry = entries[--e];
        blocks = blocks_of(entry);
      } while (blocks == 0);
      b = blocks - 1;
    } else {
      if (++b < blocks) continue;
      b = 0;
      do {
        if (++e == e_end) {
          e = e_begin;
          ++j;
        }
        entry = entries[e];
        blocks = blocks_of(entry);
      } while (blocks == 0);
    }
  }
}

}  // namespace flexcp

#undef FLEXCP_WALK_INLINE
