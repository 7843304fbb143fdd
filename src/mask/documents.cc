// The documents of a mask, read from the pairs it attends rather than from how its slices happen
// to be drawn: a bi_causal diagonal and a run of one-token causal documents attend the same pairs
// and must give the same documents (roll(within_documents) relies on it).
#include <algorithm>

#include "flexcp/band.h"
#include "flexcp/masks.h"

namespace flexcp::masks {

std::vector<std::int64_t> document_ids(const Mask& mask) {
  const std::int64_t tokens = std::max(mask.seqlen_q(), mask.seqlen_k());
  // crossings[i] counts attended pairs' spans that open at i - 1 / close at i - 1: the pair
  // (x, y) crosses every boundary i with min(x, y) < i <= max(x, y). A row's pairs together cross
  // (min(x, begin), max(x, end - 1)], one interval, so each row adds one span.
  std::vector<std::int64_t> crossings(static_cast<std::size_t>(tokens) + 2, 0);
  for (const Band& band : mask_bands(mask)) {
    for (std::int64_t x = band.row_begin; x < band.row_end; ++x) {
      const std::int64_t low = std::min(x, band.begin(x));
      const std::int64_t high = std::max(x, band.end(x) - 1);
      if (high <= low) continue;  // the row attends only its own position
      crossings[low + 1] += 1;
      crossings[high + 1] -= 1;
    }
  }
  std::vector<std::int64_t> ids(static_cast<std::size_t>(tokens));
  std::int64_t open = 0, doc = 0;
  for (std::int64_t i = 0; i < tokens; ++i) {
    open += crossings[i];
    if (i > 0 && open == 0) ++doc;
    ids[i] = doc;
  }
  return ids;
}

}  // namespace flexcp::masks
