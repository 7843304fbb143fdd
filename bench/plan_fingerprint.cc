// A fingerprint of what the kernel plans decide, for a change to the planner that is meant to
// leave its output as it is (a faster search, a cleaner loop): run it before and after, the two
// hashes must match (what scripts/sass-diff.sh is to the kernels). It builds, for a fixed,
// seeded set of masks (causal, cross-length causal, documents causal and full, windows, block
// causal, prefix LM, unions, 1 to 300K tokens), every work list a kernel plan holds (the sm90
// forward's rows at each GQA packing and head dim's key block, the backward's key tiles, the
// deterministic dQ pass's rows, the CPU kernels' rows and key tiles) and the sm90 backward's
// units (at both head dims' q blocks) on 1, 7, 132 and 1000 SMs for GQA 1:1, 2:3 and 8:8, and
// hashes every field (FNV-1a, doubles by their bits):
//   build/default/bench/plan_fingerprint        -> "lists <hash> units <hash> (<n> masks)"
// Not a test: a change that means to alter the plans changes the hashes, and that is fine.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "flexcp/band.h"
#include "flexcp/flexcp.h"
#include "kernels/tiles.h"
#include "kernels/worklist/bwd_units.h"
#include "kernels/worklist/worklist.h"

namespace {

using flexcp::Mask;
namespace masks = flexcp::masks;

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void operator()(std::int64_t v) { h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull; }
  void operator()(double v) { (*this)(std::bit_cast<std::int64_t>(v)); }
};

masks::Lengths documents(std::mt19937_64& rng, std::int64_t tokens) {
  masks::Lengths lens;
  for (std::int64_t left = tokens; left > 0;) {
    const std::int64_t n =
        std::min<std::int64_t>(left, 1 + static_cast<std::int64_t>(rng() % (1 + tokens / 3)));
    lens.push_back(n);
    left -= n;
  }
  return lens;
}

Mask mask_of(std::mt19937_64& rng, int kind, std::int64_t t) {
  const masks::Lengths docs = documents(rng, t);
  switch (kind) {
    case 0:
      return masks::causal(t, t);
    case 1:
      return masks::causal(t, 1 + static_cast<std::int64_t>(rng() % (2 * t)));
    case 2:
      return masks::varlen_causal(docs);
    case 3:
      return masks::varlen_full(docs);
    case 4:
      return masks::sliding_window(
          docs, 1 + static_cast<std::int64_t>(rng() % 4096),
          rng() % 2 ? masks::WindowKind::kCausal : masks::WindowKind::kSymmetric);
    case 5:
      return masks::block_causal(docs, 1 + static_cast<std::int64_t>(rng() % 512));
    case 6: {
      masks::Lengths prefixes;
      for (const std::int64_t n : docs)
        prefixes.push_back(static_cast<std::int64_t>(rng() % (n + 1)));
      return masks::prefix_lm(docs, prefixes);
    }
    default:
      return masks::unite({masks::varlen_causal(docs),
                           masks::sliding_window({t}, 1 + static_cast<std::int64_t>(rng() % 2048),
                                                 masks::WindowKind::kSymmetric)});
  }
}

void hash_list(Fnv& f, const flexcp::WorkList& l) {
  f(l.num_rows), f(l.num_cols), f(l.tile_rows), f(static_cast<std::int64_t>(l.bands.size()));
  for (const std::int64_t o : l.tile_offsets) f(o);
  for (const std::int64_t a : l.tile_area) f(a);
  for (const std::int32_t t : l.tile_order) f(std::int64_t{t});
  for (const flexcp::WorkEntry& e : l.entries)
    f(e.begin), f(e.end), f(std::int64_t{e.band}), f(static_cast<std::int64_t>(e.mask));
}

void hash_units(Fnv& f, const flexcp::BwdUnits& u) {
  f(static_cast<std::int64_t>(u.kind)), f(u.slots), f(u.counters), f(u.predicted),
      f(u.predicted_unsplit);
  for (const flexcp::BwdUnit& x : u.units) {
    for (const std::int64_t v :
         {std::int64_t{x.tile}, std::int64_t{x.kv_head}, std::int64_t{x.block_begin},
          std::int64_t{x.block_end}, std::int64_t{x.splits}, std::int64_t{x.split},
          std::int64_t{x.slot}, std::int64_t{x.counter}, std::int64_t{x.wait_for},
          std::int64_t{x.then_set}})
      f(v);
    f(static_cast<std::int64_t>(x.walk)), f(static_cast<std::int64_t>(x.partials));
  }
}

}  // namespace

int main() {
  namespace tiles = flexcp::tiles;
  using flexcp::WorkListOrder;
  std::mt19937_64 rng(2026);
  Fnv lists, units;
  int count = 0;
  for (int i = 0; i < 240; ++i, ++count) {
    // Mostly short (many tiles' edges), some long (many units, head units past 32K).
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % (i % 10 == 0 ? 300000 : 20000));
    const Mask mask = mask_of(rng, i % 8, t);
    const std::vector<flexcp::Band> bands = flexcp::mask_bands(mask);
    const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
    const auto list = [&](WorkListOrder order, std::int64_t rows, std::int64_t cols) {
      return flexcp::build_work_list(bands, tq, tk,
                                     {.order = order, .tile_rows = rows, .block_cols = cols});
    };
    for (const std::int64_t head_dim : {64, 128})
      for (const std::int64_t group : {1, 2, 8})
        hash_list(lists,
                  list(WorkListOrder::kRowMajor, tiles::kSm90BlockM / tiles::sm90_pack(group),
                       tiles::sm90_fwd_block_n(head_dim)));
    hash_list(lists,
              list(WorkListOrder::kRowMajor, tiles::kSm90BwdDqBlockM, tiles::kSm90BwdDqBlockN));
    hash_list(lists,
              list(WorkListOrder::kRowMajor, tiles::cpu_q_tile_tokens(8), tiles::kCpuBlockCols));
    hash_list(lists,
              list(WorkListOrder::kColumnMajor, tiles::kCpuKeyTileTokens, tiles::kCpuBlockCols));
    for (const std::int64_t head_dim : {64, 128}) {
      const int block_rows = tiles::sm90_bwd_block_m(head_dim);
      const flexcp::WorkList cols =
          list(WorkListOrder::kColumnMajor, tiles::kSm90BwdBlockN, block_rows);
      hash_list(lists, cols);
      for (const int sms : {1, 7, 132, 1000})
        for (const auto& [heads_kv, group] : {std::pair{1, 1}, {2, 3}, {8, 8}})
          hash_units(units, flexcp::plan_bwd_units(cols, {.sms = sms,
                                                          .block_rows = block_rows,
                                                          .heads_kv = heads_kv,
                                                          .group = group,
                                                          .head_dim = head_dim,
                                                          .walk = std::nullopt,
                                                          .order = std::nullopt,
                                                          .kind = std::nullopt,
                                                          .unit_heads = std::nullopt}));
    }
  }
  std::printf("lists %016llx units %016llx (%d masks)\n", static_cast<unsigned long long>(lists.h),
              static_cast<unsigned long long>(units.h), count);
  return 0;
}
