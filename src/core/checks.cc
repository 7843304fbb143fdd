#include "core/checks.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "flexcp/status.h"

namespace flexcp {
namespace {

struct Checker {
  const char* fn;

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(Status::kInvalidArgument, std::string(fn) + ": " + message);
  }

  void dims(const char* name, const TensorView& t, int ndim, const char* layout) const {
    if (t.ndim != ndim)
      fail(std::string(name) + " has " + std::to_string(t.ndim) + " dims, expected " + layout);
    for (int d = 0; d < ndim; ++d)
      if (t.shape[d] < 0) fail(std::string(name) + " has shape " + t.shape_string());
    if (t.data == nullptr && t.numel() > 0) fail(std::string(name) + " has no data pointer");
  }

  void dim(const char* name, const TensorView& t, int d, std::int64_t expected,
           const std::string& what) const {
    if (t.shape[d] != expected)
      fail(std::string(name) + " has shape " + t.shape_string() + ", expected dim " +
           std::to_string(d) + " to be " + std::to_string(expected) + " (" + what + ")");
  }

  void dtype(const char* name, const TensorView& t, DType expected) const {
    if (t.dtype != expected)
      fail(std::string(name) + " has dtype " + dtype_name(t.dtype) + ", expected " +
           dtype_name(expected));
  }

  void device(const char* name, const TensorView& t, const TensorView& ref) const {
    if (t.device != ref.device || t.device_index != ref.device_index)
      fail(std::string(name) + " is on another device than q");
  }

  // Byte extent [lo, hi) that a strided view touches.
  static std::pair<std::uintptr_t, std::uintptr_t> extent(const TensorView& t) {
    const auto base = reinterpret_cast<std::uintptr_t>(t.data);
    std::int64_t lo = 0, hi = 0;
    for (int d = 0; d < t.ndim; ++d) {
      if (t.shape[d] == 0) return {base, base};
      const std::int64_t span = (t.shape[d] - 1) * t.strides[d];
      (span < 0 ? lo : hi) += span;
    }
    const auto size = static_cast<std::int64_t>(dtype_size(t.dtype));
    return {base + lo * size, base + (hi + 1) * size};
  }

  // Outputs must not overlap anything else passed: nothing a user passed may be corrupted.
  void no_alias(std::initializer_list<std::pair<const char*, const TensorView*>> outputs,
                std::initializer_list<std::pair<const char*, const TensorView*>> all) const {
    for (auto [out_name, out] : outputs) {
      if (out->empty()) continue;
      const auto [olo, ohi] = extent(*out);
      for (auto [name, other] : all) {
        if (std::string(name) == out_name || other->empty()) continue;
        const auto [lo, hi] = extent(*other);
        if (olo < hi && lo < ohi)
          fail(std::string(out_name) + " overlaps " + name +
               " in memory; outputs need their own buffers");
      }
    }
  }
};

bool supported_input(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

AttentionShape check_inputs(const Checker& c, const TensorView& q, const TensorView& k,
                            const TensorView& v, const Mask& mask, const AttentionOptions& options,
                            bool reference) {
  c.dims("q", q, 3, "[Tq, Hq, D]");
  c.dims("k", k, 3, "[Tk, Hk, D]");
  c.dims("v", v, 3, "[Tk, Hk, D]");
  AttentionShape s;
  s.seqlen_q = q.shape[0];
  s.seqlen_k = k.shape[0];
  s.heads_q = q.shape[1];
  s.heads_kv = k.shape[1];
  s.head_dim = q.shape[2];
  s.dtype = q.dtype;
  s.device = q.device;
  // References also take fp64 inputs (finite-difference checks need them).
  if (!supported_input(q.dtype) && !(reference && q.dtype == DType::kFloat64))
    c.fail(std::string("q has dtype ") + dtype_name(q.dtype) + ", expected fp32, bf16 or fp16");
  c.dtype("k", k, q.dtype);
  c.dtype("v", v, q.dtype);
  c.device("k", k, q);
  c.device("v", v, q);
  if (s.seqlen_q != mask.seqlen_q())
    c.fail("q has " + std::to_string(s.seqlen_q) + " tokens but the mask has seqlen_q " +
           std::to_string(mask.seqlen_q()));
  if (s.seqlen_k != mask.seqlen_k())
    c.fail("k has " + std::to_string(s.seqlen_k) + " tokens but the mask has seqlen_k " +
           std::to_string(mask.seqlen_k()));
  if (s.head_dim < 1) c.fail("q has shape " + q.shape_string() + ", expected head dim D >= 1");
  if (s.heads_q < 1) c.fail("q has shape " + q.shape_string() + ", expected Hq >= 1");
  if (s.heads_kv < 1) c.fail("k has shape " + k.shape_string() + ", expected Hk >= 1");
  if (s.heads_q % s.heads_kv != 0)
    c.fail("q has " + std::to_string(s.heads_q) + " heads and k " + std::to_string(s.heads_kv) +
           ", expected Hq to be a multiple of Hk");
  c.dim("k", k, 2, s.head_dim, "head dim of q");
  c.dim("v", v, 0, s.seqlen_k, "tokens of k");
  c.dim("v", v, 1, s.heads_kv, "heads of k");
  c.dim("v", v, 2, s.head_dim, "head dim of q");
  if (!std::isfinite(options.scale))
    c.fail("scale is " + std::to_string(options.scale) + ", expected a finite number");
  if (!std::isfinite(options.softcap) || options.softcap < 0)
    c.fail("softcap is " + std::to_string(options.softcap) + ", expected a finite number >= 0");
  s.scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  if (!options.sink.empty()) {
    c.dims("sink", options.sink, 1, "[Hq]");
    c.dim("sink", options.sink, 0, s.heads_q, "heads of q");
    c.dtype("sink", options.sink, DType::kFloat32);
    if (options.sink.device != Device::kCpu)
      c.fail("sink must be in host memory (it is read once per call)");
  }
  return s;
}

void check_like(const Checker& c, const char* name, const TensorView& t, const TensorView& like,
                DType dtype, const char* layout) {
  c.dims(name, t, like.ndim, layout);
  for (int d = 0; d < like.ndim; ++d)
    if (t.shape[d] != like.shape[d])
      c.fail(std::string(name) + " has shape " + t.shape_string() + ", expected " +
             like.shape_string());
  c.dtype(name, t, dtype);
  c.device(name, t, like);
}

void check_lse(const Checker& c, const char* name, const TensorView& lse, const AttentionShape& s,
               const TensorView& q, DType dtype) {
  c.dims(name, lse, 2, "[Tq, Hq]");
  c.dim(name, lse, 0, s.seqlen_q, "tokens of q");
  c.dim(name, lse, 1, s.heads_q, "heads of q");
  c.dtype(name, lse, dtype);
  c.device(name, lse, q);
}

}  // namespace

AttentionShape check_forward_args(const char* fn, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const Mask& mask, const TensorView& out,
                                  const TensorView& lse, const AttentionOptions& options,
                                  bool reference) {
  const Checker c{fn};
  AttentionShape s = check_inputs(c, q, k, v, mask, options, reference);
  const DType out_dtype = reference ? DType::kFloat64 : s.dtype;
  check_like(c, "out", out, q, out_dtype, "[Tq, Hq, D]");
  check_lse(c, "lse", lse, s, q, reference ? DType::kFloat64 : DType::kFloat32);
  c.no_alias(
      {{"out", &out}, {"lse", &lse}},
      {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"sink", &options.sink}});
  return s;
}

AttentionShape check_backward_args(const char* fn, const TensorView& dout, const TensorView& q,
                                   const TensorView& k, const TensorView& v, const TensorView& out,
                                   const TensorView& lse, const Mask& mask, const TensorView& dq,
                                   const TensorView& dk, const TensorView& dv,
                                   const AttentionOptions& options, const TensorView& dsink,
                                   bool reference) {
  const Checker c{fn};
  AttentionShape s = check_inputs(c, q, k, v, mask, options, reference);
  const DType grad_dtype = reference ? DType::kFloat64 : s.dtype;
  check_like(c, "dout", dout, q, s.dtype, "[Tq, Hq, D]");
  if (!reference) {
    check_like(c, "out", out, q, s.dtype, "[Tq, Hq, D]");
    check_lse(c, "lse", lse, s, q, DType::kFloat32);
  }
  check_like(c, "dq", dq, q, grad_dtype, "[Tq, Hq, D]");
  check_like(c, "dk", dk, k, grad_dtype, "[Tk, Hk, D]");
  check_like(c, "dv", dv, v, grad_dtype, "[Tk, Hk, D]");
  if (!dsink.empty()) {
    if (options.sink.empty()) c.fail("dsink was given but the options carry no sink");
    c.dims("dsink", dsink, 1, "[Hq]");
    c.dim("dsink", dsink, 0, s.heads_q, "heads of q");
    c.dtype("dsink", dsink, reference ? DType::kFloat64 : DType::kFloat32);
    if (dsink.device != Device::kCpu) c.fail("dsink must be in host memory");
  }
  c.no_alias({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dsink", &dsink}}, {{"dout", &dout},
                                                                          {"q", &q},
                                                                          {"k", &k},
                                                                          {"v", &v},
                                                                          {"out", &out},
                                                                          {"lse", &lse},
                                                                          {"dq", &dq},
                                                                          {"dk", &dk},
                                                                          {"dv", &dv},
                                                                          {"sink", &options.sink},
                                                                          {"dsink", &dsink}});
  return s;
}

}  // namespace flexcp
