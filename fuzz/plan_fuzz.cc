// libFuzzer target: masks built from the input's bytes (small sizes, any slice set), then the
// kernel work lists (both orders, awkward tiles) replayed against the mask's pairs, and the
// distributed plan for 1-4 ranks against the mask's area. An invalid mask must throw
// flexcp::Error; a valid one must be computed exactly once, pair by pair.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "flexcp/flexcp.h"
#include "kernels/worklist/worklist.h"
#include "test_util.h"

namespace {

// Reads the input a byte at a time (zeros past its end).
struct Bytes {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  int next() { return at < size ? data[at++] : 0; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace flexcp;
  Bytes in{data, size};
  const std::int64_t tq = in.next() % 97, tk = in.next() % 97;
  const int num_slices = in.next() % 9;
  std::vector<Slice> slices;
  for (int i = 0; i < num_slices; ++i) {
    Slice s;
    s.q.begin = in.next() % 100;
    s.q.end = in.next() % 100;
    s.k.begin = in.next() % 100;
    s.k.end = in.next() % 100;
    s.type = static_cast<MaskType>(in.next() % 4);
    slices.push_back(s);
  }
  try {
    const Mask mask(tq, tk, slices);
    const std::vector<char> pairs = test::enumerate_pairs(mask.slices(), tq, tk);
    for (bool row_major : {true, false}) {
      const WorkListOptions options{
          row_major ? WorkListOrder::kRowMajor : WorkListOrder::kColumnMajor, 1 + in.next() % 17,
          1 + in.next() % 9};
      const WorkList list = build_work_list(mask_bands(mask), tq, tk, options);
      bool outside = false;
      const std::vector<int> seen =
          test::replay_work_list(list, mask, row_major, options.block_cols, &outside);
      if (outside) std::abort();
      for (std::size_t i = 0; i < pairs.size(); ++i)
        if (seen[i] != pairs[i]) std::abort();
    }
    if (tq > 0 && tk > 0) {
      PlanOptions o;
      o.world_size = 1 + in.next() % 4;
      o.heads_kv = 2;
      o.head_dim = 4;
      std::int64_t area = 0;
      for (int r = 0; r < o.world_size; ++r) {
        const Plan p = make_plan(mask, o, r);
        std::int64_t staged = 0;
        for (std::int64_t a : p.rank.stage_area) staged += a;
        if (staged != p.rank.area) std::abort();  // the stages compute what the rank owns
        area += p.rank.area;
      }
      if (area != mask.area()) std::abort();  // and the ranks, the mask
    }
  } catch (const Error&) {
  }
  return 0;
}
