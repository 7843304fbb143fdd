// Masks given row by row (runs of attended keys, or a dense matrix) turned into slices.
//
// Every slice type is a band whose two ends have slope 0 or 1 (band.h), so a stretch of
// consecutive rows is one slice exactly when each row's run moves both ends by the same step, 0 or
// 1, from the row above: (0, 0) full, (0, 1) causal, (1, 0) inv_causal, (1, 1) bi_causal. Runs of
// a row are made maximal first (touching ones joined), so two runs of a row are at least one key
// apart and a run has at most one run above it that it could continue: linking each run to that
// one makes chains without any choice, and each chain is cut into the fewest slices its steps
// allow. The slices cover exactly the given pairs, each once.
#include <algorithm>
#include <string>
#include <utility>

#include "flexcp/masks.h"
#include "flexcp/status.h"

namespace flexcp::masks {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, message);
}

void check_length(const char* fn, const char* name, std::int64_t n) {
  if (n < 0 || n > kMaxSeqlen)
    fail(std::string("flexcp::masks::") + fn + ": " + name + " is " + std::to_string(n) +
         ", expected 0 to " + std::to_string(kMaxSeqlen) + " (kMaxSeqlen)");
}

std::string describe(std::size_t index, const RowRun& run) {
  return "run " + std::to_string(index) + " (row " + std::to_string(run.row) + ", keys [" +
         std::to_string(run.begin) + ", " + std::to_string(run.end) + "))";
}

// How the ends of a run move from the run above it: a slice continues while both stay equal.
struct Step {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const Step&, const Step&) = default;
};

Step step_between(const RowRun& above, const RowRun& below) {
  return {below.begin - above.begin, below.end - above.end};
}

bool joinable(const Step& s) {
  return s.begin >= 0 && s.begin <= 1 && s.end >= 0 && s.end <= 1;
}

// The slice of DESIGN §2 over the consecutive runs [first, last] of a chain, whose ends all move
// by `step`: its k range runs from the first run's begin to the last run's end, and the type's
// diagonal (bottom-right for causal, top-left for inv_causal) reproduces the ends that move.
Slice slice_over(const RowRun& first, const RowRun& last, const Step& step) {
  const Range q{first.row, last.row + 1};
  if (first.row == last.row || (step.begin == 0 && step.end == 0))
    return {q, {first.begin, first.end}, MaskType::kFull};
  if (step.begin == 0) return {q, {first.begin, last.end}, MaskType::kCausal};
  if (step.end == 0) return {q, {first.begin, first.end}, MaskType::kInvCausal};
  return {q, {first.begin, last.end}, MaskType::kBiCausal};
}

// Cuts a chain (runs of consecutive rows, each joinable to the next) into the fewest slices:
// with fewest[i] the fewest slices over the first i runs, a slice ending before run i may start
// at any run from `earliest` (where the steps into run i - 1 stopped being equal, less one) and
// fewest never decreases, so fewest[i] = fewest[earliest] + 1. Walking back from the end takes
// the earliest start each time: the longest last slice, so a document of one token that chains
// into the next document's first row is cut off as its own slice instead of taking that row.
void cut_chain(const std::vector<RowRun>& chain, std::vector<std::size_t>& earliest,
               std::vector<Slice>& out) {
  const std::size_t n = chain.size();
  earliest.assign(n + 1, 0);
  std::size_t equal_from = 1;  // first step of the current stretch of equal steps
  for (std::size_t i = 2; i <= n; ++i) {
    // The step into run i - 1 is step_between(chain[i - 2], chain[i - 1]).
    if (i >= 3 &&
        !(step_between(chain[i - 3], chain[i - 2]) == step_between(chain[i - 2], chain[i - 1])))
      equal_from = i - 1;
    earliest[i] = equal_from - 1;
  }
  std::size_t end = n;
  while (end > 0) {
    const std::size_t begin = earliest[end];
    const RowRun& first = chain[begin];
    const RowRun& last = chain[end - 1];
    out.push_back(
        slice_over(first, last, begin + 1 < end ? step_between(first, chain[begin + 1]) : Step{}));
    end = begin;
  }
}

}  // namespace

Mask from_row_runs(std::int64_t seqlen_q, std::int64_t seqlen_k, const std::vector<RowRun>& runs) {
  check_length("from_row_runs", "seqlen_q", seqlen_q);
  check_length("from_row_runs", "seqlen_k", seqlen_k);
  const std::string fn = "flexcp::masks::from_row_runs: ";
  // The runs, checked, with touching runs of a row joined; row_starts[r] is where row r's runs
  // begin in `joined`, for the rows that have any.
  std::vector<RowRun> joined;
  std::vector<std::size_t> row_starts;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RowRun& run = runs[i];
    const bool new_row = joined.empty() || run.row != joined.back().row;
    if (run.row < 0 || run.row >= seqlen_q)
      fail(fn + describe(i, run) + ": the row is outside [0, " + std::to_string(seqlen_q) +
           ") (seqlen_q)");
    if (new_row && !joined.empty() && run.row < joined.back().row)
      fail(fn + describe(i, run) + " comes after row " + std::to_string(joined.back().row) +
           ": runs must be sorted by row, then by key");
    if (run.begin < 0 || run.end > seqlen_k || run.begin >= run.end)
      fail(fn + describe(i, run) + ": expected 0 <= begin < end <= " + std::to_string(seqlen_k) +
           " (seqlen_k)");
    if (!new_row && run.begin < joined.back().end)
      fail(fn + describe(i, run) + " begins before the row's previous keys end (at " +
           std::to_string(joined.back().end) +
           "): runs of a row must be sorted by key and must not overlap");
    if (new_row) {
      row_starts.push_back(joined.size());
      joined.push_back(run);
    } else if (run.begin == joined.back().end) {
      joined.back().end = run.end;
    } else {
      joined.push_back(run);
    }
  }
  row_starts.push_back(joined.size());

  // Link each run to the one below it, if joinable. Runs of a row are maximal, hence at least one
  // key apart, so a run has at most one joinable run in the next row and the reverse: both rows
  // are walked once, in key order.
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> below(joined.size(), kNone);
  std::vector<char> has_above(joined.size(), 0);
  for (std::size_t r = 0; r + 2 < row_starts.size(); ++r) {
    const std::size_t a_end = row_starts[r + 1], b_end = row_starts[r + 2];
    if (joined[row_starts[r + 1]].row != joined[row_starts[r]].row + 1) continue;
    std::size_t a = row_starts[r];
    for (std::size_t b = a_end; b < b_end; ++b) {
      while (a < a_end && joined[a].begin + 1 < joined[b].begin) ++a;
      if (a < a_end && joinable(step_between(joined[a], joined[b]))) {
        below[a] = b;
        has_above[b] = 1;
      }
    }
  }

  // Each chain, from its top run down, cut into slices.
  std::vector<Slice> slices;
  std::vector<RowRun> chain;
  std::vector<std::size_t> earliest;
  for (std::size_t top = 0; top < joined.size(); ++top) {
    if (has_above[top]) continue;
    chain.clear();
    for (std::size_t i = top; i != kNone; i = below[i]) chain.push_back(joined[i]);
    cut_chain(chain, earliest, slices);
  }
  std::sort(slices.begin(), slices.end(), [](const Slice& x, const Slice& y) {
    return std::pair(x.q.begin, x.k.begin) < std::pair(y.q.begin, y.k.begin);
  });
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

Mask from_dense(std::int64_t seqlen_q, std::int64_t seqlen_k, const std::uint8_t* attended) {
  check_length("from_dense", "seqlen_q", seqlen_q);
  check_length("from_dense", "seqlen_k", seqlen_k);
  if (attended == nullptr && seqlen_q > 0 && seqlen_k > 0)
    fail("flexcp::masks::from_dense: attended is null, expected " + std::to_string(seqlen_q) +
         " x " + std::to_string(seqlen_k) + " bytes");
  std::vector<RowRun> runs;
  for (std::int64_t q = 0; q < seqlen_q; ++q) {
    const std::uint8_t* row = attended + q * seqlen_k;
    for (std::int64_t k = 0; k < seqlen_k;) {
      if (!row[k]) {
        ++k;
        continue;
      }
      const std::int64_t begin = k;
      while (k < seqlen_k && row[k]) ++k;
      runs.push_back({q, begin, k});
    }
  }
  return from_row_runs(seqlen_q, seqlen_k, runs);
}

}  // namespace flexcp::masks
