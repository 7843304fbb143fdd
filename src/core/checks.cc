#include "core/checks.h"

#include <cmath>
#include <string>

#include "flexcp/status.h"

namespace flexcp {
namespace {

bool kernel_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

std::string shape_of(std::int64_t a, std::int64_t b, std::int64_t c) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + "]";
}

// Byte extent [lo, hi) that a strided view touches.
std::pair<std::uintptr_t, std::uintptr_t> extent(const TensorView& t) {
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

void check_options(const ArgChecker& c, const AttentionShape& s, const AttentionOptions& options) {
  if (!std::isfinite(options.scale))
    c.fail("scale is " + std::to_string(options.scale) + ", expected a finite number");
  if (!std::isfinite(options.softcap) || options.softcap < 0)
    c.fail("softcap is " + std::to_string(options.softcap) + ", expected a finite number >= 0");
  if (!options.sink.empty()) {
    c.dims("sink", options.sink, 1, "[Hq]");
    c.dim("sink", options.sink, 0, s.heads_q, "heads of q");
    c.dtype("sink", options.sink, DType::kFloat32);
    c.device("sink", options.sink, s.device, s.device_index);
  }
}

// The tensors' own shape against the shape they must have (a plan's).
void check_against(const ArgChecker& c, const AttentionShape& got, const AttentionShape& want,
                   const TensorView& q, const TensorView& k) {
  if (got.seqlen_q != want.seqlen_q || got.heads_q != want.heads_q || got.head_dim != want.head_dim)
    c.fail("q has shape " + q.shape_string() + ", expected " +
           shape_of(want.seqlen_q, want.heads_q, want.head_dim) + " (the plan's shape)");
  if (got.seqlen_k != want.seqlen_k || got.heads_kv != want.heads_kv)
    c.fail("k has shape " + k.shape_string() + ", expected " +
           shape_of(want.seqlen_k, want.heads_kv, want.head_dim) + " (the plan's shape)");
  if (got.dtype != want.dtype)
    c.fail(std::string("q has dtype ") + dtype_name(got.dtype) + ", expected " +
           dtype_name(want.dtype) + " (the plan's dtype)");
  if (got.device != want.device ||
      (want.device == Device::kCuda && got.device_index != want.device_index))
    c.fail("q is on " + device_name(got.device, got.device_index) + ", expected " +
           device_name(want.device, want.device_index) + " (the plan's device)");
}

void check_like(const ArgChecker& c, const char* name, const TensorView& t, const TensorView& like,
                DType dtype, const char* layout) {
  c.dims(name, t, like.ndim, layout);
  for (int d = 0; d < like.ndim; ++d)
    if (t.shape[d] != like.shape[d])
      c.fail(std::string(name) + " has shape " + t.shape_string() + ", expected " +
             like.shape_string());
  c.dtype(name, t, dtype);
  c.device(name, t, like.device, like.device_index);
}

void check_lse(const ArgChecker& c, const char* name, const TensorView& lse,
               const AttentionShape& s, DType dtype) {
  c.dims(name, lse, 2, "[Tq, Hq]");
  c.dim(name, lse, 0, s.seqlen_q, "tokens of q");
  c.dim(name, lse, 1, s.heads_q, "heads of q");
  c.dtype(name, lse, dtype);
  c.device(name, lse, s.device, s.device_index);
}

CallShape resolve(const AttentionShape& s, const AttentionOptions& options) {
  CallShape r;
  static_cast<AttentionShape&>(r) = s;
  r.scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  return r;
}

}  // namespace

std::string device_name(Device device, int device_index) {
  return device == Device::kCpu ? "cpu" : "cuda:" + std::to_string(device_index);
}

void ArgChecker::fail(const std::string& message) const {
  throw Error(Status::kInvalidArgument, fn_ + ": " + message);
}

void ArgChecker::dims(const char* name, const TensorView& t, int ndim, const char* layout) const {
  if (t.ndim != ndim)
    fail(std::string(name) + " has " + std::to_string(t.ndim) + " dims, expected " + layout);
  for (int d = 0; d < ndim; ++d)
    if (t.shape[d] < 0) fail(std::string(name) + " has shape " + t.shape_string());
  if (t.data == nullptr && t.numel() > 0) fail(std::string(name) + " has no data pointer");
}

void ArgChecker::dim(const char* name, const TensorView& t, int d, std::int64_t expected,
                     const std::string& what) const {
  if (t.shape[d] != expected)
    fail(std::string(name) + " has shape " + t.shape_string() + ", expected dim " +
         std::to_string(d) + " to be " + std::to_string(expected) + " (" + what + ")");
}

void ArgChecker::dtype(const char* name, const TensorView& t, DType expected) const {
  if (t.dtype != expected)
    fail(std::string(name) + " has dtype " + dtype_name(t.dtype) + ", expected " +
         dtype_name(expected));
}

void ArgChecker::device(const char* name, const TensorView& t, Device device,
                        int device_index) const {
  if (t.device != device || (device == Device::kCuda && t.device_index != device_index))
    fail(std::string(name) + " is on " + device_name(t.device, t.device_index) + ", expected " +
         device_name(device, device_index));
}

void ArgChecker::contiguous(const char* name, const TensorView& t) const {
  if (!t.is_contiguous())
    fail(std::string(name) + " has shape " + t.shape_string() + " with strides that are not " +
         "contiguous, expected a contiguous (row-major) tensor");
}

void ArgChecker::tensor(const char* name, const TensorView& t,
                        std::initializer_list<std::int64_t> shape, const char* layout, DType dt,
                        Device dev, int device_index) const {
  dims(name, t, static_cast<int>(shape.size()), layout);
  std::string want = "[";
  bool same = true;
  int d = 0;
  for (std::int64_t n : shape) {
    want += (d ? ", " : "") + std::to_string(n);
    same = same && t.shape[d++] == n;
  }
  if (!same)
    fail(std::string(name) + " has shape " + t.shape_string() + ", expected " + want + "]");
  dtype(name, t, dt);
  device(name, t, dev, device_index);
}

void ArgChecker::no_alias(std::initializer_list<Named> outputs,
                          std::initializer_list<Named> all) const {
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

AttentionShape read_shape(const ArgChecker& c, const TensorView& q, const TensorView& k,
                          const TensorView& v, bool reference) {
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
  s.device_index = q.device == Device::kCuda ? q.device_index : 0;
  // References also take fp64 inputs (finite-difference checks need them).
  if (!kernel_dtype(q.dtype) && !(reference && q.dtype == DType::kFloat64))
    c.fail(std::string("q has dtype ") + dtype_name(q.dtype) + ", expected fp32, bf16 or fp16");
  if (reference && q.device != Device::kCpu)
    c.fail("q is on " + device_name(q.device, q.device_index) +
           ", expected cpu (the references read host memory)");
  c.dtype("k", k, q.dtype);
  c.dtype("v", v, q.dtype);
  for (auto [name, t] : {std::pair{"k", &k}, {"v", &v}})
    if (t->device != q.device || (q.device == Device::kCuda && t->device_index != q.device_index))
      c.fail(std::string(name) + " is on " + device_name(t->device, t->device_index) +
             ", expected " + device_name(q.device, q.device_index) + " (the device of q)");
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
  return s;
}

void check_mask(const ArgChecker& c, const AttentionShape& s, const Mask& mask) {
  if (s.seqlen_q != mask.seqlen_q())
    c.fail("q has " + std::to_string(s.seqlen_q) + " tokens but the mask has seqlen_q " +
           std::to_string(mask.seqlen_q()));
  if (s.seqlen_k != mask.seqlen_k())
    c.fail("k has " + std::to_string(s.seqlen_k) + " tokens but the mask has seqlen_k " +
           std::to_string(mask.seqlen_k()));
}

CallShape check_forward(const ArgChecker& c, const AttentionShape& shape, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const AttentionOptions& options, bool reference) {
  check_against(c, read_shape(c, q, k, v, reference), shape, q, k);
  check_options(c, shape, options);
  // out may also be fp32: the kernels' normalised fp32 sums, unrounded, for a caller that merges
  // them with other partial outputs (the distributed forward's stages).
  const DType out_dtype = reference                      ? DType::kFloat64
                          : out.dtype == DType::kFloat32 ? DType::kFloat32
                                                         : shape.dtype;
  check_like(c, "out", out, q, out_dtype, "[Tq, Hq, D]");
  check_lse(c, "lse", lse, shape, reference ? DType::kFloat64 : DType::kFloat32);
  c.no_alias(
      {{"out", &out}, {"lse", &lse}},
      {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"sink", &options.sink}});
  return resolve(shape, options);
}

CallShape check_backward(const ArgChecker& c, const AttentionShape& shape, const TensorView& dout,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse, const TensorView& dq,
                         const TensorView& dk, const TensorView& dv,
                         const AttentionOptions& options, const TensorView& dsink, bool reference) {
  check_against(c, read_shape(c, q, k, v, reference), shape, q, k);
  check_options(c, shape, options);
  const DType grad_dtype = reference ? DType::kFloat64 : shape.dtype;
  check_like(c, "dout", dout, q, shape.dtype, "[Tq, Hq, D]");
  if (!reference) {
    check_like(c, "out", out, q, shape.dtype, "[Tq, Hq, D]");
    check_lse(c, "lse", lse, shape, DType::kFloat32);
  }
  check_like(c, "dq", dq, q, grad_dtype, "[Tq, Hq, D]");
  // dK and dV may also be fp32 (both): the kernels' fp32 sums, unrounded, for a caller that adds
  // them to other partial gradients (the distributed backward returns them to their owners).
  const DType kv_grad_dtype = !reference && dk.dtype == DType::kFloat32 ? dk.dtype : grad_dtype;
  check_like(c, "dk", dk, k, kv_grad_dtype, "[Tk, Hk, D]");
  check_like(c, "dv", dv, v, kv_grad_dtype, "[Tk, Hk, D]");
  if (!dsink.empty()) {
    if (options.sink.empty()) c.fail("dsink was given but the options carry no sink");
    c.dims("dsink", dsink, 1, "[Hq]");
    c.dim("dsink", dsink, 0, shape.heads_q, "heads of q");
    c.dtype("dsink", dsink, reference ? DType::kFloat64 : DType::kFloat32);
    c.device("dsink", dsink, shape.device, shape.device_index);
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
  return resolve(shape, options);
}

}  // namespace flexcp
