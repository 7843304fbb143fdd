// The mask model of DESIGN §2: a mask is a union of slices over a packed (THD) sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flexcp/export.h"

namespace flexcp {

// Half-open token range [begin, end).
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

// With i = q - q.begin, j = k - k.begin, sq = |q|, sk = |k|, the pair (q, k) is attended when:
//   kFull:       always
//   kCausal:     j <= i + (sk - sq)        (bottom-right aligned diagonal)
//   kInvCausal:  j >= i                    (top-left aligned diagonal)
//   kBiCausal:   i <= j <= i + (sk - sq)   (a band; empty when sq > sk)
enum class MaskType { kFull, kCausal, kInvCausal, kBiCausal };

FLEXCP_API const char* mask_type_name(MaskType type);          // "full", "causal", ...
FLEXCP_API MaskType parse_mask_type(const std::string& name);  // throws Error

struct Slice {
  Range q;
  Range k;
  MaskType type = MaskType::kFull;
  friend bool operator==(const Slice&, const Slice&) = default;
};

// Attended pairs of one slice, and of the part of it inside the rectangle q x k (closed form).
FLEXCP_API std::int64_t slice_area(const Slice& slice);
FLEXCP_API std::int64_t slice_area(const Slice& slice, Range q, Range k);
// Whether one slice attends (q, k); the definition every other piece of flexcp is tested against.
FLEXCP_API bool slice_attends(const Slice& slice, std::int64_t q, std::int64_t k);

// The longest sequence flexcp takes, on either side: 2^31 tokens. Every area (at most 2^62
// pairs), index and byte count computed from lengths up to it is exact in 64 bits; masks,
// attention shapes and the tool's options are checked against it.
inline constexpr std::int64_t kMaxSeqlen = std::int64_t{1} << 31;

// A validated mask: ranges inside [0, seqlen_q) x [0, seqlen_k) and no pair covered twice.
// Construction throws Error(kInvalidArgument) naming the slice(s) and a pair at fault.
class FLEXCP_API Mask {
 public:
  Mask(std::int64_t seqlen_q, std::int64_t seqlen_k, std::vector<Slice> slices);

  std::int64_t seqlen_q() const { return seqlen_q_; }
  std::int64_t seqlen_k() const { return seqlen_k_; }
  const std::vector<Slice>& slices() const { return slices_; }

  // Attended pairs in the whole mask, and in the rectangle q x k of it.
  std::int64_t area() const { return area_; }
  std::int64_t area(Range q, Range k) const;
  bool attends(std::int64_t q, std::int64_t k) const;

  // DESIGN §2's JSON mask spec.
  std::string to_json() const;
  static Mask from_json(const std::string& text);
  static Mask from_json_file(const std::string& path);
  void write_json_file(const std::string& path) const;

 private:
  std::int64_t seqlen_q_;
  std::int64_t seqlen_k_;
  std::vector<Slice> slices_;
  std::int64_t area_ = 0;
};

// Checks the rules of DESIGN §2 without building a Mask; throws the same errors.
FLEXCP_API void validate_slices(std::int64_t seqlen_q, std::int64_t seqlen_k,
                                const std::vector<Slice>& slices);
// Its check of the lengths alone (0 to kMaxSeqlen each), for code that takes them before it has
// slices; `fn`, if given, starts the message ("flexcp::masks::causal").
FLEXCP_API void validate_seqlens(std::int64_t seqlen_q, std::int64_t seqlen_k,
                                 const char* fn = nullptr);

}  // namespace flexcp
