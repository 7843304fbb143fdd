// libFuzzer target: masks given row by row (masks::from_row_runs, masks::from_dense) and the
// documents read from them (masks::document_ids). The first byte picks the sizes and the form:
//   dense: the other bytes' bits are a small matrix; the mask must attend exactly its set bits,
//          and its documents must follow the definition pair by pair;
//   runs:  the other bytes are (row, begin, end) triples, any values; from_row_runs must refuse
//          them with flexcp::Error or attend exactly their union.
// Anything else (a crash, another exception, a sanitizer report, a wrong pair) fails.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "flexcp/masks.h"
#include "flexcp/status.h"
#include "test_util.h"

namespace {

using flexcp::Mask;
using flexcp::masks::RowRun;

void check_pairs(const Mask& mask, const std::vector<std::uint8_t>& want) {
  const auto got = flexcp::test::enumerate_pairs(mask.slices(), mask.seqlen_q(), mask.seqlen_k());
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != (want[i] ? 1 : 0)) std::abort();
}

void check_documents(const Mask& mask, const std::vector<std::uint8_t>& pairs) {
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k(), t = std::max(tq, tk);
  const auto ids = flexcp::masks::document_ids(mask);
  if (static_cast<std::int64_t>(ids.size()) != t) std::abort();
  for (std::int64_t i = 1; i < t; ++i) {
    bool crossed = false;
    for (std::int64_t q = 0; q < tq; ++q)
      for (std::int64_t k = 0; k < tk; ++k)
        crossed |= pairs[q * tk + k] && std::min(q, k) < i && i <= std::max(q, k);
    if (ids[i] != ids[i - 1] + (crossed ? 0 : 1)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::int64_t tq = data[0] % 17, tk = (data[0] / 17) % 15;
  const bool dense = data[0] & 0x80;
  ++data, --size;
  std::vector<std::uint8_t> pairs(static_cast<std::size_t>(tq * tk), 0);
  if (dense) {
    for (std::size_t i = 0; i < pairs.size() && i / 8 < size; ++i)
      pairs[i] = (data[i / 8] >> (i % 8)) & 1;
    const Mask mask = flexcp::masks::from_dense(tq, tk, pairs.data());
    check_pairs(mask, pairs);
    check_documents(mask, pairs);
    return 0;
  }
  std::vector<RowRun> runs;
  for (std::size_t i = 0; i + 2 < size; i += 3) {
    // Values a little outside the bounds on both sides, to reach every refusal.
    auto value = [](std::uint8_t b) { return static_cast<std::int64_t>(b % 24) - 3; };
    runs.push_back({value(data[i]), value(data[i + 1]), value(data[i + 2])});
  }
  try {
    const Mask mask = flexcp::masks::from_row_runs(tq, tk, runs);
    for (const RowRun& r : runs)
      for (std::int64_t k = r.begin; k < r.end; ++k) pairs[r.row * tk + k] = 1;
    check_pairs(mask, pairs);
  } catch (const flexcp::Error&) {
  }
  return 0;
}
