// The forward's mainloop, both sides of it; fwd_kernel.cuh assigns the warp-group roles and runs
// the item loop:
// - load_fwd_items: the producer (one thread) takes items from the scheduler, publishes them to
//   the consumers and loads each: Q once, then K and V per key block of its entries;
// - FwdMainloop: a consumer warp group's state and steps: the block cursor over an item's
//   entries, S = Q K^T and O += P V issued in turns with the other group, the online softmax
//   (fwd_softmax.cuh) and the epilogue (fwd_epilogue.cuh).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_epilogue.cuh"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/phase_clock.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flexcp::sm90::detail {

// Items run kv head by kv head (busiest tiles first within each), so that the CTAs running at one
// time stream the K/V of one head and share it through L2. CTAs take the next item when they are
// ready for it (a global counter), which keeps them balanced whatever the tiles' sizes.
__device__ __forceinline__ Item decode_item(const FwdParams& p, int i) {
  const int per_head = p.num_tiles * p.head_blocks;
  Item it;
  it.kv_head = i / per_head;
  const int rest = i % per_head;
  it.tile = p.work.tile_order[rest / p.head_blocks];
  it.head0 = it.kv_head * p.group + (rest % p.head_blocks) * p.pack;
  it.e_begin = int(p.work.tile_offsets[it.tile]);
  it.e_end = int(p.work.tile_offsets[it.tile + 1]);
  return it;
}

template <class Cfg>
__device__ __forceinline__ void load_fwd_items(const FwdParams& p, typename Cfg::SharedStorage& ss,
                                               typename Cfg::PipelineQ& pipe_q,
                                               typename Cfg::PipelineKV& pipe_k,
                                               typename Cfg::PipelineKV& pipe_v,
                                               typename Cfg::PipelineItem& pipe_item) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kBlockN = Cfg::kBlockN;
  prefetch_tma_descriptor(&p.tma_q);
  if (p.seqlen_k > 0) {  // without keys the K/V maps are left empty
    prefetch_tma_descriptor(&p.tma_k);
    prefetch_tma_descriptor(&p.tma_v);
  }
  constexpr std::uint64_t kHint = static_cast<std::uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
  auto q_state = cutlass::make_producer_start_state<PipelineQ>();
  auto k_state = cutlass::make_producer_start_state<PipelineKV>();
  auto v_state = cutlass::make_producer_start_state<PipelineKV>();
  Cfg::Items::produce(pipe_item, ss.items, p.work.scheduler, p.items, [&](int i) {
    const detail::Item it = decode_item(p, i);
    if (it.e_begin == it.e_end) return;
    pipe_q.producer_acquire(q_state);
    Element* q_dst = ss.q.data() + q_state.index() * kBlockM * kHeadDim;
    for (int c = 0; c < Cfg::kPanels; ++c)
      SM90_TMA_LOAD_3D::copy(&p.tma_q, pipe_q.producer_get_barrier(q_state), kHint,
                             q_dst + c * kBlockM * 64, c * 64, it.tile << p.rows_log2, it.head0);
    ++q_state;
    for (int e = it.e_begin; e < it.e_end; ++e) {
      const WorkEntry entry = p.work.entries[e];
      for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kBlockN) {
        pipe_k.producer_acquire(k_state);
        Element* k_dst = ss.k.data() + k_state.index() * kBlockN * kHeadDim;
        for (int c = 0; c < Cfg::kPanels; ++c)
          SM90_TMA_LOAD_3D::copy(&p.tma_k, pipe_k.producer_get_barrier(k_state), kHint,
                                 k_dst + c * kBlockN * 64, c * 64, int(c0), it.kv_head);
        ++k_state;
        pipe_v.producer_acquire(v_state);
        Element* v_dst = ss.v.data() + v_state.index() * kBlockN * kHeadDim;
        for (int c = 0; c < Cfg::kPanels; ++c)
          SM90_TMA_LOAD_3D::copy(&p.tma_v, pipe_v.producer_get_barrier(v_state), kHint,
                                 v_dst + c * kBlockN * 64, c * 64, int(c0), it.kv_head);
        ++v_state;
      }
    }
  });
}

// The phases of a consumer group's key block after an item's first, for the phase clocks
// (phase_clock.cuh).
enum class FwdPhase : int {
  kLoads,    // wait for K (V is waited for in the turn, after S is issued)
  kTurn,     // wait for this group's turn on the tensor cores, issue S and the last P V
  kWaitS,    // wait for S
  kCursor,   // move the cursor on
  kBounds,   // an edge block: softcap (if on), its band and the columns each row attends
  kMask,     // an edge block: its mask; another: softcap (if on)
  kMax,      // row maxima
  kWaitPv,   // wait for the last P V, rescale O
  kExp,      // exponentials and row sums
  kConvert,  // release V, P to the input dtype
  kCount
};
inline constexpr const char* kFwdPhaseNames[] = {"loads", "turn", "wait-s",  "cursor", "bounds",
                                                 "mask",  "max",  "wait-pv", "exp",    "convert"};
static_assert(sizeof(kFwdPhaseNames) / sizeof(kFwdPhaseNames[0]) == int(FwdPhase::kCount));
// And of its item loop, from one item's last block to the next's second (PhaseClock::mark_outside).
enum class FwdOutsidePhase : int {
  kLastTurn,  // take the next item; wait for its Q and K; the turn with this item's last P V and
              // the next item's first S; wait for S
  kFirstSoftmax,  // the next item's first block: cursor, mask, softmax while this item's last
                  // P V runs; wait for that product, P converted
  kEpilogue,      // the finished item's O and lse normalised, staged and stored
  kCount
};
inline constexpr const char* kFwdOutsidePhaseNames[] = {"out-last-turn", "out-first-softmax",
                                                        "out-epilogue"};
static_assert(sizeof(kFwdOutsidePhaseNames) / sizeof(kFwdOutsidePhaseNames[0]) ==
              int(FwdOutsidePhase::kCount));

// A consumer warp group's part of the forward: its 64 rows of the tile, the block cursor over the
// item's entries, the products it issues in its turns on the tensor cores, its softmax and its
// epilogue. The kernel's item loop calls these steps in order (fwd_kernel.cuh).
template <class Cfg>
struct FwdMainloop {
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  using MmaQK = typename Cfg::MmaQK;
  using MmaPV = typename Cfg::MmaPV;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kBlockN = Cfg::kBlockN;
  template <class Layout>
  using Smem =
      decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), Layout{}));
  // O goes to shared memory with stmatrix (16 bytes per instruction, shared-space addresses).
  using StoreO = decltype(cute::make_tiled_copy_C(
      cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>{}, std::declval<MmaPV&>()));
  using ThrStoreO = decltype(std::declval<StoreO&>().get_thread_slice(0));
  // P in the A-operand register layout of P V: ((2,2,2), 1, kBlockN/16). Element i of the
  // accumulator S, i = c + 2*half + 4*j (column pair c, row half, column group j), is element i
  // of this layout, so the conversion is a plain element-wise copy.
  using PLayout = cute::Layout<
      cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<kBlockN / 16>>>;

  const FwdParams& p;
  typename Cfg::SharedStorage& ss;
  PipelineQ& pipe_q;
  PipelineKV &pipe_k, &pipe_v;
  const int wg, ctid;
  MmaQK mma_qk;
  MmaPV mma_pv;
  decltype(cute::partition_fragment_C(mma_qk, cute::select<0, 1>(typename Cfg::TileQK{}))) tSrS;
  decltype(cute::partition_fragment_C(mma_pv, cute::select<0, 1>(typename Cfg::TilePV{}))) tOrO;
  StoreO store_o;
  ThrStoreO thr_store_o;
  decltype(thr_store_o.partition_D(std::declval<Smem<typename Cfg::SmemLayoutO>&>())) tOsO;
  decltype(cute::make_tensor<Element>(PLayout{})) tOrP;
  // This thread's two rows of the tile (the accumulator layout of a 64xN wgmma) and column base.
  const int row_in_tile, col_base, rows_mask;
  // Turn-taking on the tensor cores: named barrier c is consumer warp group c's turn.
  const std::uint32_t my_turn, other_turn;
  typename PipelineQ::PipelineState q_state;
  typename PipelineKV::PipelineState k_state, v_state;
  Rows rows{};
  // The block cursor: entry e and the first column c0 of the next block to issue. Kept in 32 bits
  // (the host checks the sizes); the band is read only for blocks that need masking.
  int e = 0, c0 = 0, end = 0;
  WorkEntry entry{};
  // The block whose S was just computed.
  int blk_c0 = 0, blk_end = 0, blk_band = 0;
  EntryMask blk_mask = EntryMask::kNone;
  // The softmax's rescale of what O accumulated before.
  float correction[2];
  float m_use[2];  // what each row's exponents subtract (softmax_max to softmax_exp)
  PhaseClock<FwdPhase, ClockedKernel::kForward> clock;  // empty unless FLEXCP_SM90_PHASE_CLOCKS

  // wg: this consumer's warp group (1 or 2); ctid: 0..255 over both consumer warp groups.
  __device__ __forceinline__ FwdMainloop(const FwdParams& p_, typename Cfg::SharedStorage& ss_,
                                         PipelineQ& pipe_q_, PipelineKV& pipe_k_,
                                         PipelineKV& pipe_v_, int wg_, int ctid_)
      : p(p_),
        ss(ss_),
        pipe_q(pipe_q_),
        pipe_k(pipe_k_),
        pipe_v(pipe_v_),
        wg(wg_),
        ctid(ctid_),
        tSrS(cute::partition_fragment_C(mma_qk, cute::select<0, 1>(typename Cfg::TileQK{}))),
        tOrO(cute::partition_fragment_C(mma_pv, cute::select<0, 1>(typename Cfg::TilePV{}))),
        thr_store_o(store_o.get_thread_slice(ctid_)),
        tOsO(thr_store_o.partition_D(smem(ss_.o.data(), typename Cfg::SmemLayoutO{}))),
        tOrP(cute::make_tensor<Element>(PLayout{})),
        row_in_tile((wg_ - 1) * 64 + ((threadIdx.x / 32) % 4) * 16 + (threadIdx.x % 32) / 4),
        col_base(2 * (threadIdx.x % 32 % 4)),
        rows_mask((1 << p_.rows_log2) - 1),
        my_turn(static_cast<std::uint32_t>(FwdBarrier::kTurn) + wg_ - 1),
        other_turn(static_cast<std::uint32_t>(FwdBarrier::kTurn) + 2 - wg_) {
    static_assert(decltype(cute::size(tSrS))::value == kBlockN / 2 &&
                  decltype(cute::size(tOrO))::value == kHeadDim / 2);
    // The second group's first arrival lets the first one start.
    if (wg == 2)
      cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads,
                                          static_cast<std::uint32_t>(FwdBarrier::kTurn));
  }
  template <class Layout>
  __device__ __forceinline__ static auto smem(Element* data, Layout layout) {
    return cute::make_tensor(cute::make_smem_ptr(data), layout);
  }

  __device__ __forceinline__ void start_item(const Item& next) {
    rows.it = next;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int m = row_in_tile + 8 * h;
      rows.token[h] = (next.tile << p.rows_log2) + (m & rows_mask);
      rows.head[h] = next.head0 + (m >> p.rows_log2);
      rows.max[h] = -INFINITY;
      rows.sum[h] = 0.f;
    }
  }
  __device__ __forceinline__ void start_cursor() {
    e = rows.it.e_begin;
    entry = p.work.entries[e];
    c0 = int(entry.begin);
    end = int(entry.end);
  }
  // The block whose S was just computed; moves the cursor on. Returns whether it was the item's
  // last (and then lets Q go).
  __device__ __forceinline__ bool take_block() {
    blk_c0 = c0;
    blk_end = end;
    blk_band = entry.band;
    blk_mask = entry.mask;
    c0 += kBlockN;
    if (c0 < end) return false;
    if (++e == rows.it.e_end) {  // Q is no longer read: the producer may load a later item's
      pipe_q.consumer_release(q_state);
      ++q_state;
      return true;
    }
    entry = p.work.entries[e];
    c0 = int(entry.begin);
    end = int(entry.end);
    return false;
  }
  // Softcap, mask and online softmax of S in place (S becomes P in fp32, fwd_softmax.cuh);
  // `correction` rescales what O accumulated before.
  __device__ __forceinline__ void softmax() {
    online_softmax<kBlockN>(p, tSrS, {blk_c0, blk_end, blk_band, blk_mask}, rows, col_base,
                            correction);
  }
  // The same in two steps (the row maxima, then row h's exponentials), for the blocks whose
  // softmax waits for the P V of the block before between them (wait_pv_and_rescale).
  __device__ __forceinline__ void softmax_max() {
    detail::softmax_max<kBlockN>(
        p, tSrS, {blk_c0, blk_end, blk_band, blk_mask}, rows, col_base, correction, m_use,
        [&](int step) { clock.mark(step == 0 ? FwdPhase::kBounds : FwdPhase::kMask); });
  }
  __device__ __forceinline__ void softmax_exp(int h) {
    detail::softmax_exp<kBlockN>(p, tSrS, rows, h, correction, m_use);
  }
  __device__ __forceinline__ void convert_p() {
    constexpr int n = decltype(cute::size(tSrS))::value;
    cutlass::NumericArrayConverter<Element, float, n> convert;
    *reinterpret_cast<cutlass::Array<Element, n>*>(tOrP.data()) =
        convert(*reinterpret_cast<const cutlass::Array<float, n>*>(tSrS.data()));
  }

  __device__ __forceinline__ void wait_q() { pipe_q.consumer_wait(q_state); }
  __device__ __forceinline__ void wait_k() { pipe_k.consumer_wait(k_state); }
  __device__ __forceinline__ void wait_v() { pipe_v.consumer_wait(v_state); }
  // One committed group each: S = Q K^T of the current K stage, O += P V of the current V.
  __device__ __forceinline__ void issue_s() {
    using namespace cute;
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    // The operands described again at each turn from warp-uniform values (the group index, and
    // the stages through a shuffle from lane 0, which the compiler knows to be uniform): the
    // descriptors are then built in uniform registers, as FlashAttention-4's are, where the
    // members' per-thread ones are moved across before every wgmma. The opaque zero keeps the
    // compiler from hoisting them back.
    const auto thr = mma_qk.get_thread_slice((cutlass::canonical_warp_group_idx() - 1) * 128);
    const int z = opaque_zero();
    Tensor q = thr.partition_fragment_A(smem(ss.q.data() + z, typename Cfg::SmemLayoutQ{}));
    Tensor k = thr.partition_fragment_B(smem(ss.k.data() + z, typename Cfg::SmemLayoutKV{}));
    const int qs = __shfl_sync(0xffffffffu, int(q_state.index()), 0);
    const int ks = __shfl_sync(0xffffffffu, int(k_state.index()), 0);
    issue_gemm<true>(mma_qk, q(_, _, _, qs), k(_, _, _, ks), tSrS);
    warpgroup_commit_batch();
  }
  __device__ __forceinline__ void issue_pv() {
    using namespace cute;
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    const auto thr = mma_pv.get_thread_slice((cutlass::canonical_warp_group_idx() - 1) * 128);
    Tensor v =
        thr.partition_fragment_B(smem(ss.v.data() + opaque_zero(), typename Cfg::SmemLayoutVt{}));
    const int vs = __shfl_sync(0xffffffffu, int(v_state.index()), 0);
    issue_gemm<false>(mma_pv, tOrP, v(_, _, _, vs), tOrO);
    warpgroup_commit_batch();
  }
  // One turn on the tensor cores: issue this group's products, then hand the turn over.
  __device__ __forceinline__ void turn_s() {
    cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, my_turn);
    issue_s();
    cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, other_turn);
  }
  // V is waited for between the two products: its wait (loaded a block ahead, it is there) then
  // costs the turn nothing the S product's issue does not already cover.
  __device__ __forceinline__ void turn_s_pv() {
    cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, my_turn);
    issue_s();
    wait_v();
    issue_pv();
    cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, other_turn);
  }
  __device__ __forceinline__ void turn_pv() {
    cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, my_turn);
    issue_pv();
    cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, other_turn);
  }
  // S landed; with kBehind, the P V issued after it may still run.
  template <int kBehind>
  __device__ __forceinline__ void wait_s() {
    cute::warpgroup_wait<kBehind>();
    cute::warpgroup_fence_operand(tSrS);
  }
  __device__ __forceinline__ void wait_pv() {
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(tOrO);
    cute::warpgroup_fence_operand(tOrP);
  }
  // Between the two steps of the softmax of a block whose P V of the block before still runs:
  // wait for that product and rescale O when a row's maximum moved. The exponentials then run
  // beside the other group's products rather than beside this group's own P V (+2.5-3.2% at 32K
  // against waiting after the whole softmax, bench/results/h200-forward-2026-12-04.md). ptxas
  // hoists a wgmma wait to the top of its basic block: the branch, which reads the corrections,
  // keeps the wait after the maxima. Once the row maxima settle, most blocks leave them
  // unchanged: the rescale is skipped when no row of the warp moved (a warp-uniform test).
  __device__ __forceinline__ void wait_pv_and_rescale() {
    if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
      wait_pv();
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kHeadDim / 8; ++j) {
        tOrO(2 * h + 4 * j) *= correction[h];
        tOrO(1 + 2 * h + 4 * j) *= correction[h];
      }
    } else {
      wait_pv();
    }
  }
  __device__ __forceinline__ void release_k() {
    pipe_k.consumer_release(k_state);
    ++k_state;
  }
  __device__ __forceinline__ void release_v() {
    pipe_v.consumer_release(v_state);
    ++v_state;
  }
  // Epilogue (fwd_epilogue.cuh): normalise and fold in the sink; lse straight from registers,
  // out through shared memory and this group's own TMA store, which runs on while the next item
  // starts.
  __device__ __forceinline__ void epilogue(const Rows& r) {
    write_out_lse<Cfg>(p, r, tOrO, store_o, thr_store_o, tOsO, ss.o.data(), wg - 1, ctid);
  }
};

}  // namespace flexcp::sm90::detail
