// The tile sizes every kernel's work lists are built in: one table, with why each fits. Plans
// (kernels/plan/) build their lists from it, and the kernels read the same constants.
#pragma once

#include <cstdint>

namespace flexcp::tiles {

// CPU kernels. A q tile holds about kCpuTileRows (token, head) rows, so that one worker's Q, O
// and S buffers (about 200 KiB at D = 128) stay in its L2 cache; at least kCpuMinTileTokens
// tokens, so that a large GQA group still walks its keys in long runs. Key blocks of
// kCpuBlockCols columns are one micro-kernel width on AVX-512. The backward's k tiles are
// kCpuKeyTileTokens keys of one head (their dK and dV accumulators, 64 KiB at D = 128).
inline constexpr int kCpuTileRows = 128;
inline constexpr int kCpuMinTileTokens = 16;
inline constexpr int kCpuBlockCols = 64;
inline constexpr int kCpuKeyTileTokens = 64;
inline int cpu_q_tile_tokens(std::int64_t group) {
  const std::int64_t t = kCpuTileRows / group;
  return t < kCpuMinTileTokens ? kCpuMinTileTokens : static_cast<int>(t);
}

// sm90 forward. One CTA owns kSm90BlockM rows of q (two consumer warp groups of 64 rows, the
// wgmma M) and walks K/V in blocks of kSm90BlockN keys: at head dim 128 the two Q buffers, two
// K and V stages and the O staging tile take 224 KiB of the 227 KiB of shared memory, and a
// 128-key S tile is 64 fp32 registers per thread (176 keys spilled at the 232-register budget).
inline constexpr int kSm90BlockM = 128;
inline constexpr int kSm90BlockN = 128;
// At head dim 64 a block's products take half the tensor cores' time of head dim 128's while its
// softmax takes as long: the two groups' softmaxes, not the products, set the pace. Longer key
// blocks give each softmax more products to hide under (its fixed costs, the turn, the row
// maxima's shuffles and the waits, are per block). 3 K/V stages of 192 keys, two Q buffers and
// the O tile take 192 KiB; S is 96 fp32 registers a thread. Against 128 keys on an H100: +5-7%
// on full, causal and documents, +1.5% on windows; 160 keys were 5-7% slower than 128.
inline constexpr int kSm90BlockNHd64 = 192;
// The forward's key block at a head dim (the plan's work list is cut in these blocks).
constexpr int sm90_fwd_block_n(std::int64_t head_dim) {
  return head_dim <= 64 ? kSm90BlockNHd64 : kSm90BlockN;
}
// sm90 backward. One CTA owns kSm90BwdBlockN keys of one kv head (two consumer warp groups of 64
// keys, the wgmma M, so that P^T and dS^T land in registers as the A operands of dV and dK) and
// walks q in blocks of kSm90BwdBlockM rows: the dK and dV accumulators (64 keys x 128 dims each,
// 128 fp32 registers a thread at head dim 128) leave room for one 64-column S^T and dP^T tile and
// the dQ tile within the 240-register budget; at head dim 128, K, V, two Q and dO stages, two dS
// buffers and the statistics take 160 KiB of shared memory.
inline constexpr int kSm90BwdBlockM = 64;
inline constexpr int kSm90BwdBlockN = 128;
// At head dim 64 a block's products are half head dim 128's and its fixed costs (the dS barrier,
// dQ's staging and hand-over, the waits) the same, so the q blocks are 128 rows, which fill the
// same registers (S^T and dP^T 64 a thread, dK and dV 32) and the same shared memory as head dim
// 128's 64 rows; each group then stages 64 rows of dQ instead of half its columns, and reads the
// rows' statistics from shared memory where it uses them. Against 64 rows on an H100 (GQA 64:8,
// 8K and 32K): +7-9% on full, causal and documents, +7-14% on windows of 1024.
inline constexpr int kSm90BwdBlockMHd64 = 128;
// The backward's q block at a head dim (the plan's column-major list is cut in these blocks).
constexpr int sm90_bwd_block_m(std::int64_t head_dim) {
  return head_dim <= 64 ? kSm90BwdBlockMHd64 : kSm90BwdBlockM;
}
// sm90 deterministic dQ pass (q-tile-major). One CTA owns kSm90BwdDqBlockM rows of one q head (two
// consumer warp groups of 64 rows) and walks K/V in blocks of kSm90BwdDqBlockN keys: the dQ
// accumulator (64 fp32 registers a thread at head dim 128) with one 64-key S and dP tile (32
// each) fit the 240-register budget; two Q and dO stages and two K/V stages take 192 KiB.
inline constexpr int kSm90BwdDqBlockM = 128;
inline constexpr int kSm90BwdDqBlockN = 64;
// q heads of one kv head packed into a tile's rows: the largest power of two dividing the group
// (so that a tile holds whole heads and K/V blocks load once for all of them), at most the tile.
inline int sm90_pack(std::int64_t group) {
  int pack = 1;
  while (group % (2 * pack) == 0 && 2 * pack <= kSm90BlockM) pack *= 2;
  return pack;
}

}  // namespace flexcp::tiles
