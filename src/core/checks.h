// The one place where arguments are checked, for every entry (single device and distributed).
// Messages read "<fn>: <argument> <what it is>, expected <what>", e.g.
// "flexcp::forward: q has 2 dims, expected [Tq, Hq, D]" or
// "flexcp::DistAttention::forward: q is on cuda:0, expected cpu".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "flexcp/attention.h"

namespace flexcp {

// An attention call's shape with its options resolved, as the kernels take it.
struct CallShape : AttentionShape {
  double scale = 0.0;  // 1/sqrt(D) when the options say 0
};

// "cpu", "cuda:1".
std::string device_name(Device device, int device_index);

class ArgChecker {
 public:
  explicit ArgChecker(std::string fn) : fn_(std::move(fn)) {}
  const std::string& fn() const { return fn_; }
  [[noreturn]] void fail(const std::string& message) const;  // Error(kInvalidArgument)

  // `t` has `ndim` dims (named by `layout`, e.g. "[Tq, Hq, D]") and a data pointer when not empty.
  void dims(const char* name, const TensorView& t, int ndim, const char* layout) const;
  // Dim d of `t` is `expected`; `what` says why ("heads of q").
  void dim(const char* name, const TensorView& t, int d, std::int64_t expected,
           const std::string& what) const;
  void dtype(const char* name, const TensorView& t, DType expected) const;
  void device(const char* name, const TensorView& t, Device device, int device_index) const;
  void contiguous(const char* name, const TensorView& t) const;
  // All of the above at once: exactly `shape`, `dtype`, on `device`.
  void tensor(const char* name, const TensorView& t, std::initializer_list<std::int64_t> shape,
              const char* layout, DType dtype, Device device, int device_index = 0) const;

  using Named = std::pair<const char*, const TensorView*>;
  // Outputs must not overlap anything else passed: nothing a user passed may be corrupted.
  void no_alias(std::initializer_list<Named> outputs, std::initializer_list<Named> all) const;

 private:
  std::string fn_;
};

// The shape of a call read off q, k and v (dims, dtypes, heads, one device), before any mask or
// plan is involved. References also take fp64 inputs.
AttentionShape read_shape(const ArgChecker& c, const TensorView& q, const TensorView& k,
                          const TensorView& v, bool reference = false);

// The tensors of a forward or backward against the shape they must have (a plan's, or a mask's
// read off the tensors), the options, and the outputs' aliasing. `out_dtype` is the input dtype
// for kernels, fp64 for references (whose out and lse are not inputs of the backward).
CallShape check_forward(const ArgChecker& c, const AttentionShape& shape, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const AttentionOptions& options,
                        bool reference = false);
CallShape check_backward(const ArgChecker& c, const AttentionShape& shape, const TensorView& dout,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse, const TensorView& dq,
                         const TensorView& dk, const TensorView& dv,
                         const AttentionOptions& options, const TensorView& dsink,
                         bool reference = false);

// The mask's seqlens against the shape read off q and k.
void check_mask(const ArgChecker& c, const AttentionShape& shape, const Mask& mask);

}  // namespace flexcp
