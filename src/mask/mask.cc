#include "flexcp/mask.h"

#include <algorithm>
#include <sstream>

#include "flexcp/band.h"
#include "flexcp/status.h"

namespace flexcp {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, message);
}

std::string range_string(Range r) {
  std::ostringstream os;
  os << "[" << r.begin << ", " << r.end << ")";
  return os.str();
}

void check_range(std::size_t index, const char* name, Range r, std::int64_t seqlen,
                 const char* seqlen_name) {
  std::ostringstream os;
  os << "slice " << index << ": " << name << "_range " << range_string(r);
  if (r.begin < 0) fail(os.str() + " starts before 0");
  if (r.end < r.begin) fail(os.str() + " ends before it begins");
  if (r.end > seqlen) {
    os << " ends past " << seqlen_name << " " << seqlen;
    fail(os.str());
  }
}

[[noreturn]] void fail_overlap(std::size_t a, std::size_t b, const Band& cells) {
  if (a > b) std::swap(a, b);
  std::ostringstream os;
  os << "slices " << a << " and " << b << " both cover the pair (q=" << cells.row_begin
     << ", k=" << cells.begin(cells.row_begin) << "); a mask's slices must not overlap";
  fail(os.str());
}

void check_no_overlap(const std::vector<Slice>& slices) {
  std::vector<std::size_t> owner;
  const std::vector<Band> bands = slice_bands(slices, &owner);
  if (const BandOverlap o = find_overlap(bands); o.found)
    fail_overlap(owner[o.first], owner[o.second], o.cells);
}

}  // namespace

const char* mask_type_name(MaskType type) {
  switch (type) {
    case MaskType::kFull:
      return "full";
    case MaskType::kCausal:
      return "causal";
    case MaskType::kInvCausal:
      return "inv_causal";
    case MaskType::kBiCausal:
      return "bi_causal";
  }
  return "?";
}

MaskType parse_mask_type(const std::string& name) {
  for (MaskType t : {MaskType::kFull, MaskType::kCausal, MaskType::kInvCausal, MaskType::kBiCausal})
    if (name == mask_type_name(t)) return t;
  fail("mask type '" + name + "' is unknown; expected full, causal, inv_causal or bi_causal");
}

std::int64_t slice_area(const Slice& slice) {
  const Band b = slice_band(slice);
  return band_area(b, b.row_begin, b.row_end, slice.k.begin, slice.k.end);
}

std::int64_t slice_area(const Slice& slice, Range q, Range k) {
  if (q.empty() || k.empty()) return 0;
  return band_area(slice_band(slice), q.begin, q.end, k.begin, k.end);
}

bool slice_attends(const Slice& s, std::int64_t q, std::int64_t k) {
  if (q < s.q.begin || q >= s.q.end || k < s.k.begin || k >= s.k.end) return false;
  const std::int64_t i = q - s.q.begin, j = k - s.k.begin;
  const std::int64_t sq = s.q.size(), sk = s.k.size();
  switch (s.type) {
    case MaskType::kFull:
      return true;
    case MaskType::kCausal:
      return j <= i + (sk - sq);
    case MaskType::kInvCausal:
      return j >= i;
    case MaskType::kBiCausal:
      return i <= j && j <= i + (sk - sq);
  }
  return false;
}

void validate_seqlens(std::int64_t seqlen_q, std::int64_t seqlen_k, const char* fn) {
  for (auto [name, n] : {std::pair{"seqlen_q", seqlen_q}, {"seqlen_k", seqlen_k}})
    if (n < 0 || n > kMaxSeqlen)
      fail((fn ? std::string(fn) + ": " : std::string()) + name + " is " + std::to_string(n) +
           ", expected 0 to " + std::to_string(kMaxSeqlen) + " (kMaxSeqlen, 2^31 tokens)");
}

void validate_slices(std::int64_t seqlen_q, std::int64_t seqlen_k,
                     const std::vector<Slice>& slices) {
  validate_seqlens(seqlen_q, seqlen_k);
  for (std::size_t i = 0; i < slices.size(); ++i) {
    check_range(i, "q", slices[i].q, seqlen_q, "seqlen_q");
    check_range(i, "k", slices[i].k, seqlen_k, "seqlen_k");
  }
  check_no_overlap(slices);
}

Mask::Mask(std::int64_t seqlen_q, std::int64_t seqlen_k, std::vector<Slice> slices)
    : seqlen_q_(seqlen_q), seqlen_k_(seqlen_k), slices_(std::move(slices)) {
  validate_slices(seqlen_q_, seqlen_k_, slices_);
  for (const Slice& s : slices_) area_ += slice_area(s);
}

std::int64_t Mask::area(Range q, Range k) const {
  std::int64_t total = 0;
  for (const Slice& s : slices_) {
    if (s.q.end <= q.begin || s.q.begin >= q.end || s.k.end <= k.begin || s.k.begin >= k.end)
      continue;
    total += slice_area(s, q, k);
  }
  return total;
}

bool Mask::attends(std::int64_t q, std::int64_t k) const {
  return std::any_of(slices_.begin(), slices_.end(),
                     [&](const Slice& s) { return slice_attends(s, q, k); });
}

}  // namespace flexcp
