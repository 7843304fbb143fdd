// What the sm90 backward computes on a mask, block by block, without a GPU: its key tiles' work
// list (the plan's, kSm90BwdBlockN keys a tile, q blocks of kSm90BwdBlockM rows from each entry's
// first row), and per block each consumer group's 64 keys: whether they attend nothing of the block
// (a "dead" group block, bench/results/h100-2026-12-06.md section 3), some of it, or all of it.
// Prints a Markdown row per mask file (`flexcp mask --out`, e.g. bench/protocol_masks.sh's):
//   build/default/bench/bwd_block_census MASK.json...
// Columns: q blocks (of one q head), entries whose first row is not a multiple of kSm90BwdBlockM
// (their blocks straddle those of other tiles' entries), blocks cut short by their entry's end,
// dead and partial group blocks, and the attended share of the pairs the blocks compute.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "flexcp/band.h"
#include "flexcp/mask.h"
#include "kernels/tiles.h"
#include "kernels/worklist/tile_mask.h"
#include "kernels/worklist/worklist.h"

namespace {

constexpr std::int64_t kRows = flexcp::tiles::kSm90BwdBlockM;  // q rows a block
constexpr std::int64_t kKeys = flexcp::tiles::kSm90BwdBlockN;  // keys a tile
constexpr std::int64_t kGroupKeys = 64;                        // keys a consumer group

void census(const char* path) {
  using namespace flexcp;
  const Mask mask = Mask::from_json_file(path);
  const WorkList cols = build_work_list(
      mask_bands(mask), mask.seqlen_q(), mask.seqlen_k(),
      {.order = WorkListOrder::kColumnMajor, .tile_rows = kKeys, .block_cols = kRows});
  std::int64_t blocks = 0, short_blocks = 0, dead = 0, partial = 0, attended = 0, unaligned = 0;
  for (std::int64_t t = 0; t < cols.num_tiles(); ++t) {
    for (std::int64_t e = cols.tile_offsets[t]; e < cols.tile_offsets[t + 1]; ++e) {
      const WorkEntry& entry = cols.entries[e];
      const Band& band = cols.bands[entry.band];
      unaligned += entry.begin % kRows != 0;
      for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kRows) {
        ++blocks;
        short_blocks += c0 + kRows > entry.end;
        for (std::int64_t key0 = t * kKeys; key0 < (t + 1) * kKeys; key0 += kGroupKeys) {
          std::int64_t pairs = 0;
          for (std::int64_t k = key0; k < key0 + kGroupKeys && k < cols.num_rows; ++k) {
            const BlockColumns c = attended_columns(band, entry.mask, k, c0, entry.end, kRows);
            pairs += c.hi - c.lo;
          }
          attended += pairs;
          dead += pairs == 0;
          partial += pairs > 0 && pairs < kGroupKeys * kRows;
        }
      }
    }
  }
  const double group_blocks = double(blocks) * double(kKeys / kGroupKeys);
  std::printf("| %s | %lld | %lld of %lld | %.1f%% | %.2f%% | %.1f%% | %.1f%% |\n", path,
              static_cast<long long>(blocks), static_cast<long long>(unaligned),
              static_cast<long long>(cols.entries.size()),
              100.0 * double(short_blocks) / double(blocks), 100.0 * double(dead) / group_blocks,
              100.0 * double(partial) / group_blocks,
              100.0 * double(attended) / (group_blocks * double(kGroupKeys * kRows)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MASK.json...\n", argv[0]);
    return 2;
  }
  std::printf(
      "| mask | q blocks | entries off the block grid | short | dead group blocks | partial | "
      "attended pairs |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int i = 1; i < argc; ++i) {
    try {
      census(argv[i]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", argv[i], e.what());
      return 1;
    }
  }
  return 0;
}
