// What the host passes to the sm90 backward's kernels: plain data, shared by the host code (.cc)
// and the kernels (.cu). Tile sizes are in kernels/tiles.h, the scratch layout in bwd_scratch.h.
#pragma once

#include <cuda.h>  // CUtensorMap (a header-only type)

#include <cstdint>

#include "kernels/plan/workspace.h"
#include "kernels/sm90/bwd_scratch.h"
#include "kernels/tiles.h"
#include "kernels/worklist/bwd_units.h"

namespace flexcp::sm90 {

// One CTA owns kBwdBlockN keys of one kv head (two consumer warp groups of 64 keys each) and
// walks the q blocks its column-major work list names (tiles::sm90_bwd_block_m rows: BwdConfig's
// kBlockM), for every q head of the group, or the part of that walk its unit names
// (kernels/worklist/bwd_units.h).
inline constexpr int kBwdBlockN = tiles::kSm90BwdBlockN;
// The dQ accumulator's TMA box is 32 fp32 wide, the 128 bytes a 128-byte swizzle allows, and 64
// rows: a consumer group's staged tile is 64 rows x 64 columns of a block's dQ at either head dim.
inline constexpr int kBwdDqBoxCols = 32;
inline constexpr int kBwdDqBoxRows = 64;

struct BwdParams {
  // q and dout as {D, Tq, Hq}, boxes of {64, block rows, 1}; k and v as {D, Tk, Hk}, boxes of
  // {64, kBwdBlockN, 1}; 128-byte swizzle, out-of-bounds rows read as zeros.
  CUtensorMap tma_q;
  CUtensorMap tma_do;
  CUtensorMap tma_k;
  CUtensorMap tma_v;
  // The fp32 dQ accumulator as {D, Tq, Hq}, boxes of {kBwdDqBoxCols, kBwdDqBoxRows, 1}, 128-byte
  // swizzle: each consumer group adds its staged half of a block's dQ with TMA reductions (rows
  // past Tq are dropped by the unit).
  CUtensorMap tma_dq;
  // The row statistics (bwd_scratch.h), [Hq, stats_stride] fp32, read with plain bulk copies of
  // a block's span (bwd_stats_span) from the 16-byte boundary at or below its first row.
  const float* lse2 = nullptr;
  const float* delta = nullptr;
  std::int64_t stats_stride = 0;

  // dK and dV, [Tk, Hk, D] with a unit stride along D, written once per (key tile, kv head): by
  // its unit, or by the last of its units to finish, from their partials summed in unit order;
  // in the input dtype, or in fp32 when dkv_fp32 (the sums unrounded).
  void* dk = nullptr;
  void* dv = nullptr;
  bool dkv_fp32 = false;
  bool dkv_add = false;  // fp32 only: added to what dk and dv hold (sm90::backward_keys)
  std::int64_t dk_stride_t = 0, dk_stride_h = 0;
  std::int64_t dv_stride_t = 0, dv_stride_h = 0;
  // The plan's column-major work list (tiles of kBwdBlockN keys, intervals of q rows) in its
  // workspace, with the scheduler's counters (as in the forward).
  DeviceWorkList work;
  // Its units, in the order the scheduler hands them out. A split item's units each store their
  // fp32 dK and dV in their slot of `partials` (bwd_scratch.h) and count themselves in the item's
  // `split_counters` entry, or add up in one slot, taking turns on its counter (BwdPartials); the
  // counters are zero between launches (the last unit on each resets it).
  const BwdUnit* units = nullptr;
  float* partials = nullptr;
  int* split_counters = nullptr;

  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int group = 1;  // q heads per kv head
  int items = 0;  // units

  // P = 2^(s * log2(e) - lse2): without softcap s * log2(e) = q.k * scale_log2; with softcap,
  // s = softcap * tanh(q.k * scale / softcap), t = tanh from 2^(q.k * softcap_scale), and the
  // gradient of s carries (1 - t^2). dK is scaled by `scale` here, dQ by the postprocessing.
  float scale = 0.f;
  float scale_log2 = 0.f;
  float softcap = 0.f;
  float softcap_scale = 0.f;
  float softcap_t = 0.f;  // ln(2) / softcap: t = (log2(P) + lse2) softcap_t
  // false in the deterministic mode: selects the kernel instance without the dQ product
  // (BwdConfig::kAccumulateDq); the kernel itself does not read it.
  bool accumulate_dq = true;
};

// The deterministic mode's dQ pass: one CTA owns kBwdDqBlockM rows of one q head and walks the key
// blocks of its row-major work list in order, so each dQ row is summed in one fixed order and
// written once.
inline constexpr int kBwdDqBlockM = tiles::kSm90BwdDqBlockM;
inline constexpr int kBwdDqBlockN = tiles::kSm90BwdDqBlockN;

struct BwdDqParams {
  // q and dout as {D, Tq, Hq}, boxes of {64, kBwdDqBlockM, 1}; k and v as {D, Tk, Hk}, boxes of
  // {64, kBwdDqBlockN, 1}; 128-byte swizzle, out-of-bounds rows read as zeros.
  CUtensorMap tma_q;
  CUtensorMap tma_do;
  CUtensorMap tma_k;
  CUtensorMap tma_v;
  // The row statistics (bwd_scratch.h), read kBwdDqBlockM at a time from a tile's first row.
  const float* lse2 = nullptr;
  const float* delta = nullptr;
  std::int64_t stats_stride = 0;
  // dq, [Tq, Hq, D] with a unit stride along D, written once per (q tile, q head), scaled.
  void* dq = nullptr;
  std::int64_t dq_stride_t = 0, dq_stride_h = 0;
  // The plan's q-tile-major list in this pass's tiles, with its own scheduler counters.
  DeviceWorkList work;
  int num_tiles = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int group = 1;
  int items = 0;  // num_tiles * heads_q
  // As in BwdParams.
  float scale = 0.f;
  float scale_log2 = 0.f;
  float softcap = 0.f;
  float softcap_scale = 0.f;
  float softcap_t = 0.f;
};

}  // namespace flexcp::sm90
