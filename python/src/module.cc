// flexcp._flexcp: the compiled module under the Python package. Thin by design (STYLE.md,
// "Bindings"): DLPack tensors become TensorViews, C++ errors become Python exceptions, and every
// rule stays in the C++ library. It does not link against libtorch: any framework's tensors that
// speak DLPack (torch's do) come in as nb::ndarray.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "flexcp/flexcp.h"

namespace nb = nanobind;

namespace flexcp::python {
namespace {

using Array = nb::ndarray<nb::ro>;
using MutableArray = nb::ndarray<>;
using SliceTuple = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::string>;

[[noreturn]] void bad(const std::string& message) {
  throw Error(Status::kInvalidArgument, message);
}

// A DLPack dtype as NumPy and torch spell it (int32, uint8, bool, complex64), for messages.
std::string dtype_name(const nb::dlpack::dtype& d) {
  // Indexed by DLPack's type code (3 is unused); codes past these are the 8-, 6- and 4-bit
  // floats, which only newer nanobinds name.
  constexpr const char* kKinds[] = {"int", "uint", "float", nullptr, "bfloat", "complex"};
  if (d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool)) return "bool";
  if (d.code >= std::size(kKinds) || kKinds[d.code] == nullptr)
    return std::to_string(d.bits) + "-bit DLPack type code " + std::to_string(d.code);
  std::string name = kKinds[d.code] + std::to_string(d.bits);
  if (d.lanes != 1) name += "x" + std::to_string(d.lanes);
  return name;
}

DType dtype_of(const nb::dlpack::dtype& d, const char* fn, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(d.code);
  if (d.lanes == 1) {
    if (code == Code::Float && d.bits == 32) return DType::kFloat32;
    if (code == Code::Float && d.bits == 16) return DType::kFloat16;
    if (code == Code::Bfloat && d.bits == 16) return DType::kBFloat16;
    if (code == Code::Float && d.bits == 64) return DType::kFloat64;
  }
  bad(std::string(fn) + ": " + name + " has dtype " + dtype_name(d) +
      ", expected float32, bfloat16 or float16");
}

// A DLPack tensor as a flexcp view (strides in elements; row-major when the producer gave none).
template <class A>
TensorView view_of(const A& a, const char* fn, const char* name) {
  TensorView v;
  if (a.ndim() > static_cast<std::size_t>(kMaxTensorDims))
    bad(std::string(fn) + ": " + name + " has " + std::to_string(a.ndim()) +
        " dims, expected at most " + std::to_string(kMaxTensorDims));
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a.dtype(), fn, name);
  v.ndim = static_cast<int>(a.ndim());
  std::int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = static_cast<std::int64_t>(a.shape(d));
    v.strides[d] = a.stride_ptr() ? a.stride(d) : stride;
    stride *= v.shape[d];
  }
  switch (a.device_type()) {
    case nb::device::cpu::value:
      v.device = Device::kCpu;
      break;
    case nb::device::cuda::value:
      v.device = Device::kCuda;
      v.device_index = a.device_id();
      break;
    default:
      bad(std::string(fn) + ": " + name + " is on DLPack device type " +
          std::to_string(a.device_type()) + ", expected cpu or cuda");
  }
  return v;
}

// An optional tensor argument: None is an empty view.
TensorView optional_view(const nb::object& o, const char* fn, const char* name) {
  if (o.is_none()) return {};
  return view_of(nb::cast<Array>(o), fn, name);
}

AttentionOptions options_of(double scale, double softcap, const nb::object& sink,
                            std::uintptr_t stream, const char* fn) {
  AttentionOptions o;
  o.scale = scale;
  o.softcap = softcap;
  o.sink = optional_view(sink, fn, "sink");
  o.cuda_stream = reinterpret_cast<void*>(stream);
  return o;
}

// The arguments of a forward as views (what the mask and plan entries share).
struct ForwardViews {
  static constexpr const char* kFn = "flexcp.attention";
  ForwardViews(const Array& q_, const Array& k_, const Array& v_, const MutableArray& out_,
               const MutableArray& lse_, double scale, double softcap, const nb::object& sink,
               std::uintptr_t stream)
      : q(view_of(q_, kFn, "q")),
        k(view_of(k_, kFn, "k")),
        v(view_of(v_, kFn, "v")),
        out(view_of(out_, kFn, "out")),
        lse(view_of(lse_, kFn, "lse")),
        options(options_of(scale, softcap, sink, stream, kFn)) {}
  TensorView q, k, v, out, lse;
  AttentionOptions options;
};

// The arguments of a backward as views.
struct BackwardViews {
  static constexpr const char* kFn = "flexcp.attention (backward)";
  BackwardViews(const Array& dout_, const Array& q_, const Array& k_, const Array& v_,
                const Array& out_, const Array& lse_, const MutableArray& dq_,
                const MutableArray& dk_, const MutableArray& dv_, double scale, double softcap,
                const nb::object& sink, const nb::object& dsink_, bool deterministic,
                std::uintptr_t stream)
      : dout(view_of(dout_, kFn, "grad of out")),
        q(view_of(q_, kFn, "q")),
        k(view_of(k_, kFn, "k")),
        v(view_of(v_, kFn, "v")),
        out(view_of(out_, kFn, "out")),
        lse(view_of(lse_, kFn, "lse")),
        dq(view_of(dq_, kFn, "dq")),
        dk(view_of(dk_, kFn, "dk")),
        dv(view_of(dv_, kFn, "dv")),
        dsink(optional_view(dsink_, kFn, "dsink")),
        options(options_of(scale, softcap, sink, stream, kFn)) {
    options.deterministic = deterministic;
  }
  TensorView dout, q, k, v, out, lse, dq, dk, dv, dsink;
  AttentionOptions options;
};

Mask mask_of(const std::vector<SliceTuple>& slices, std::int64_t seqlen_q, std::int64_t seqlen_k) {
  std::vector<Slice> s;
  s.reserve(slices.size());
  for (const auto& [q0, q1, k0, k1, type] : slices)
    s.push_back({{q0, q1}, {k0, k1}, parse_mask_type(type)});
  return Mask(seqlen_q, seqlen_k, std::move(s));
}

// The slices as an int64 [n, 5] array (q begin, q end, k begin, k end, type): what the torch ops
// take, since a custom op's arguments are tensors and numbers.
nb::ndarray<nb::numpy, std::int64_t> slice_array(const Mask& m) {
  const std::size_t n = m.slices().size();
  auto* data = new std::int64_t[std::max<std::size_t>(n, 1) * 5];
  for (std::size_t i = 0; i < n; ++i) {
    const Slice& s = m.slices()[i];
    const std::int64_t row[5] = {s.q.begin, s.q.end, s.k.begin, s.k.end,
                                 static_cast<std::int64_t>(s.type)};
    std::copy(row, row + 5, data + 5 * i);
  }
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<std::int64_t*>(p); });
  return nb::ndarray<nb::numpy, std::int64_t>(data, {n, 5}, owner);
}

Mask mask_from_array(const nb::ndarray<nb::ro, std::int64_t, nb::shape<-1, 5>, nb::device::cpu>& a,
                     std::int64_t seqlen_q, std::int64_t seqlen_k) {
  std::vector<Slice> s(a.shape(0));
  const auto v = a.view();
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::int64_t type = v(i, 4);
    if (type < 0 || type > static_cast<std::int64_t>(MaskType::kBiCausal))
      bad("flexcp: slice " + std::to_string(i) + " has type " + std::to_string(type) +
          ", expected 0 (full) to 3 (bi_causal)");
    s[i] = Slice{{v(i, 0), v(i, 1)}, {v(i, 2), v(i, 3)}, static_cast<MaskType>(type)};
  }
  return Mask(seqlen_q, seqlen_k, std::move(s));
}

// A vector of int64 records (an int64 each, or a struct of them) handed to NumPy without a
// copy, [n] or [n, fields]: a list of a Python int per value would cost ~30x the memory.
template <class T>
nb::ndarray<nb::numpy, std::int64_t> int64_array(std::vector<T> values) {
  constexpr std::size_t kFields = sizeof(T) / sizeof(std::int64_t);
  static_assert(sizeof(T) == kFields * sizeof(std::int64_t) && alignof(T) == alignof(std::int64_t));
  auto* held = new std::vector<T>(std::move(values));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const std::size_t shape[2] = {held->size(), kFields};
  return nb::ndarray<nb::numpy, std::int64_t>(reinterpret_cast<std::int64_t*>(held->data()),
                                              kFields == 1 ? 1 : 2, shape, owner);
}

std::vector<SliceTuple> slice_tuples(const Mask& m) {
  std::vector<SliceTuple> out;
  for (const Slice& s : m.slices())
    out.emplace_back(s.q.begin, s.q.end, s.k.begin, s.k.end, mask_type_name(s.type));
  return out;
}

// A communicator whose exchanges a Python object makes (flexcp._dist: torch.distributed over a
// process group). Buffers go to Python as (peer, address, bytes, tag); the GIL is taken for each
// call, and the C++ side keeps every buffer alive until the exchange's handle completes.
class PyHandle final : public CommHandle {
 public:
  PyHandle(nb::object handle, Communicator* comm) : handle_(std::move(handle)), comm_(comm) {}
  ~PyHandle() override {
    if (done_) return;
    // NOTE: as ~MpiHandle: an unfinished exchange must finish before its buffers go; if it
    // cannot (a peer is gone), the job ends instead of letting the transport write freed memory.
    nb::gil_scoped_acquire gil;
    try {
      handle_.attr("wait")();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flexcp: an abandoned exchange did not finish (%s); ending the job\n",
                   e.what());
      comm_->abort(3);
    }
  }
  void wait() override {
    nb::gil_scoped_acquire gil;
    handle_.attr("wait")();
    received_ = nb::cast<std::size_t>(handle_.attr("bytes_received"));
    done_ = true;
  }
  std::size_t bytes_received() const override { return received_; }

 private:
  nb::object handle_;
  Communicator* comm_;
  bool done_ = false;
  std::size_t received_ = 0;
};

class PyCommunicator final : public Communicator {
 public:
  explicit PyCommunicator(nb::object impl) : impl_(std::move(impl)) {
    rank_ = nb::cast<int>(impl_.attr("rank")());
    size_ = nb::cast<int>(impl_.attr("size")());
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<CommHandle> start(const std::vector<SendOp>& sends,
                                    const std::vector<RecvOp>& recvs) override {
    nb::gil_scoped_acquire gil;
    nb::list s, r;
    for (const SendOp& op : sends)
      s.append(
          nb::make_tuple(op.peer, reinterpret_cast<std::uintptr_t>(op.data), op.bytes, op.tag));
    for (const RecvOp& op : recvs)
      r.append(
          nb::make_tuple(op.peer, reinterpret_cast<std::uintptr_t>(op.data), op.bytes, op.tag));
    return std::make_unique<PyHandle>(impl_.attr("start")(s, r), this);
  }
  void all_gather(const void* mine, std::size_t bytes, void* all) override {
    nb::gil_scoped_acquire gil;
    impl_.attr("all_gather")(reinterpret_cast<std::uintptr_t>(mine), bytes,
                             reinterpret_cast<std::uintptr_t>(all));
  }
  void all_gather_v(const void* mine, const std::vector<std::size_t>& counts, void* all) override {
    nb::gil_scoped_acquire gil;
    nb::list c;
    for (std::size_t n : counts) c.append(n);
    impl_.attr("all_gather_v")(reinterpret_cast<std::uintptr_t>(mine), c,
                               reinterpret_cast<std::uintptr_t>(all));
  }
  void barrier() override {
    nb::gil_scoped_acquire gil;
    impl_.attr("barrier")();
  }
  [[noreturn]] void abort(int code) override {
    {
      nb::gil_scoped_acquire gil;
      impl_.attr("abort")(code);
    }
    std::_Exit(code);
  }

 private:
  nb::object impl_;
  int rank_ = 0, size_ = 1;
};

// The communicators of a group on one device, which any number of DistAttentions share (a
// packed batch's mask changes every step; communicators are made once): the Python one and, for
// device tensors, one built on it: flexcp's NCCL (its unique id gathered over the Python one) or
// the staged backend (device buffers through host memory over it).
struct PyDistComm {
  std::unique_ptr<PyCommunicator> comm;
  std::unique_ptr<Communicator> device_comm;
  Communicator& for_tensors() { return device_comm ? *device_comm : *comm; }
};

// DistAttention over a PyDistComm, which the binding keeps alive as long as the plan.
struct PyDistAttention {
  std::unique_ptr<DistAttention> attn;
};

Device device_of(const std::string& name, const char* fn) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  bad(std::string(fn) + ": device is '" + name + "', expected 'cpu' or 'cuda'");
}

std::unique_ptr<Communicator> device_communicator(Communicator& host, const std::string& backend,
                                                  int device_index, const char* fn) {
  DeviceCommOptions o;
  o.device = device_index;
  if (backend == "nccl") return make_nccl_communicator(host, o);
  if (backend == "staged") return make_staged_communicator(host, o);
  bad(std::string(fn) + ": backend is '" + backend + "', expected 'nccl' or 'staged'");
}

}  // namespace
}  // namespace flexcp::python

using namespace flexcp;
using namespace flexcp::python;

NB_MODULE(_flexcp, m) {
  m.doc() = "flexcp's compiled core (use the flexcp package)";
  m.def("version", [] { return std::string(version()); });
  m.def("built_with_cuda", &built_with_cuda);
  m.attr("max_seqlen") = kMaxSeqlen;

  // C++ errors: bad arguments are ValueError, everything else RuntimeError, with the message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const std::string what = std::string(e.what());
      if (e.status() == Status::kInvalidArgument)
        PyErr_SetString(PyExc_ValueError, what.c_str());
      else
        PyErr_SetString(PyExc_RuntimeError,
                        (std::string(status_string(e.status())) + ": " + what).c_str());
    }
  });

  nb::class_<Mask>(m, "Mask")
      .def(
          "__init__",
          [](Mask* self, const std::vector<SliceTuple>& slices, std::int64_t seqlen_q,
             std::int64_t seqlen_k) { new (self) Mask(mask_of(slices, seqlen_q, seqlen_k)); },
          nb::arg("slices"), nb::arg("seqlen_q"), nb::arg("seqlen_k"))
      .def_static("from_json", &Mask::from_json, nb::arg("text"))
      .def_static("from_array", &mask_from_array, nb::arg("slices"), nb::arg("seqlen_q"),
                  nb::arg("seqlen_k"))
      .def("to_json", &Mask::to_json)
      .def("area", [](const Mask& mask) { return mask.area(); })
      .def(
          "area_of",
          [](const Mask& mask, std::int64_t q0, std::int64_t q1, std::int64_t k0, std::int64_t k1) {
            return mask.area({q0, q1}, {k0, k1});
          })
      .def("attends", &Mask::attends)
      .def_prop_ro("seqlen_q", &Mask::seqlen_q)
      .def_prop_ro("seqlen_k", &Mask::seqlen_k)
      .def("slices", &slice_tuples)
      .def("slice_array", &slice_array);

  nb::module_ mk = m.def_submodule("masks", "Builders of the masks people train with");
  mk.def("full", &masks::full, nb::arg("seqlen_q"), nb::arg("seqlen_k"));
  mk.def("causal", &masks::causal, nb::arg("seqlen_q"), nb::arg("seqlen_k"));
  mk.def(
      "batch",
      [](std::int64_t n, std::int64_t len, const std::string& type) {
        return masks::batch(n, len, parse_mask_type(type));
      },
      nb::arg("num_seqs"), nb::arg("seqlen"), nb::arg("type"));
  mk.def(
      "varlen",
      [](const masks::Lengths& docs, const std::string& type) {
        return masks::varlen(docs, parse_mask_type(type));
      },
      nb::arg("doc_lens"), nb::arg("type"));
  mk.def("varlen_full", &masks::varlen_full, nb::arg("doc_lens"));
  mk.def("varlen_causal", &masks::varlen_causal, nb::arg("doc_lens"));
  mk.def(
      "from_cu_seqlens",
      [](const masks::Lengths& q, const masks::Lengths& k, const std::string& type) {
        return masks::from_cu_seqlens(q, k, parse_mask_type(type));
      },
      nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("type"));
  mk.def(
      "sliding_window",
      [](const masks::Lengths& docs, std::int64_t window, bool symmetric) {
        return masks::sliding_window(
            docs, window, symmetric ? masks::WindowKind::kSymmetric : masks::WindowKind::kCausal);
      },
      nb::arg("doc_lens"), nb::arg("window"), nb::arg("symmetric") = false);
  mk.def("block_causal", &masks::block_causal, nb::arg("doc_lens"), nb::arg("block"));
  mk.def("prefix_lm", &masks::prefix_lm, nb::arg("doc_lens"), nb::arg("prefix_lens"));
  mk.def("shared_question", &masks::shared_question, nb::arg("question_len"),
         nb::arg("answer_lens"));
  // Runs of attended keys as an int64 [n, 3] array (row, begin, end): what flexcp.masks.from_dense
  // and from_mask_mod extract, on any device, from a boolean matrix.
  mk.def(
      "from_row_runs",
      [](std::int64_t seqlen_q, std::int64_t seqlen_k,
         const nb::ndarray<nb::ro, std::int64_t, nb::shape<-1, 3>, nb::device::cpu>& a) {
        std::vector<masks::RowRun> runs(a.shape(0));
        const auto v = a.view();
        for (std::size_t i = 0; i < runs.size(); ++i) runs[i] = {v(i, 0), v(i, 1), v(i, 2)};
        return masks::from_row_runs(seqlen_q, seqlen_k, runs);
      },
      nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("runs"));
  mk.def(
      "row_runs", [](const Mask& mask) { return int64_array(masks::row_runs(mask)); },
      nb::arg("mask"));
  mk.def(
      "document_ids", [](const Mask& mask) { return int64_array(masks::document_ids(mask)); },
      nb::arg("mask"));
  mk.def("pack", &masks::pack, nb::arg("masks"));
  mk.def("unite", &masks::unite, nb::arg("masks"));
  mk.def("intersect", &masks::intersect, nb::arg("masks"));
  mk.def("read_lengths_file", &masks::read_lengths_file, nb::arg("path"));
  mk.def("pack_lengths", &masks::pack_lengths, nb::arg("lengths"), nb::arg("total"),
         nb::arg("max_len"));

  // The kernels on caller-allocated outputs (the torch layer allocates them), over a mask
  // (planned for the one call) or over a plan built once. stream: the cudaStream_t as an integer
  // (0 for host tensors or the legacy default stream).
  m.def(
      "forward",
      [](const Array& q, const Array& k, const Array& v, const Mask& mask, const MutableArray& out,
         const MutableArray& lse, double scale, double softcap, const nb::object& sink,
         std::uintptr_t stream) {
        const ForwardViews f(q, k, v, out, lse, scale, softcap, sink, stream);
        nb::gil_scoped_release release;
        forward(f.q, f.k, f.v, mask, f.out, f.lse, f.options);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask"), nb::arg("out"), nb::arg("lse"),
      nb::arg("scale"), nb::arg("softcap"), nb::arg("sink").none(), nb::arg("stream"));
  m.def(
      "forward_planned",
      [](const AttentionPlan& plan, const Array& q, const Array& k, const Array& v,
         const MutableArray& out, const MutableArray& lse, double scale, double softcap,
         const nb::object& sink, std::uintptr_t stream) {
        const ForwardViews f(q, k, v, out, lse, scale, softcap, sink, stream);
        nb::gil_scoped_release release;
        forward(plan, f.q, f.k, f.v, f.out, f.lse, f.options);
      },
      nb::arg("plan"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
      nb::arg("scale"), nb::arg("softcap"), nb::arg("sink").none(), nb::arg("stream"));
  m.def(
      "backward",
      [](const Array& dout, const Array& q, const Array& k, const Array& v, const Array& out,
         const Array& lse, const Mask& mask, const MutableArray& dq, const MutableArray& dk,
         const MutableArray& dv, double scale, double softcap, const nb::object& sink,
         const nb::object& dsink, bool deterministic, std::uintptr_t stream) {
        const BackwardViews b(dout, q, k, v, out, lse, dq, dk, dv, scale, softcap, sink, dsink,
                              deterministic, stream);
        nb::gil_scoped_release release;
        backward(b.dout, b.q, b.k, b.v, b.out, b.lse, mask, b.dq, b.dk, b.dv, b.options, b.dsink);
      },
      nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
      nb::arg("mask"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("scale"),
      nb::arg("softcap"), nb::arg("sink").none(), nb::arg("dsink").none(), nb::arg("deterministic"),
      nb::arg("stream"));
  m.def(
      "backward_planned",
      [](const AttentionPlan& plan, const Array& dout, const Array& q, const Array& k,
         const Array& v, const Array& out, const Array& lse, const MutableArray& dq,
         const MutableArray& dk, const MutableArray& dv, double scale, double softcap,
         const nb::object& sink, const nb::object& dsink, bool deterministic,
         std::uintptr_t stream) {
        const BackwardViews b(dout, q, k, v, out, lse, dq, dk, dv, scale, softcap, sink, dsink,
                              deterministic, stream);
        nb::gil_scoped_release release;
        backward(plan, b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, b.options, b.dsink);
      },
      nb::arg("plan"), nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
      nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("scale"),
      nb::arg("softcap"), nb::arg("sink").none(), nb::arg("dsink").none(), nb::arg("deterministic"),
      nb::arg("stream"));

  // A mask planned once for one shape, dtype and device (flexcp.AttentionPlan wraps it). A device
  // plan runs once its workspace is bound (memory the Python side allocates through torch).
  nb::class_<AttentionPlan>(m, "AttentionPlan")
      .def(
          "__init__",
          [](AttentionPlan* self, const Mask& mask, std::int64_t heads_q, std::int64_t heads_kv,
             std::int64_t head_dim, const std::string& dtype, const std::string& device,
             int device_index, bool backward) {
            const AttentionShape shape{.seqlen_q = mask.seqlen_q(),
                                       .seqlen_k = mask.seqlen_k(),
                                       .heads_q = heads_q,
                                       .heads_kv = heads_kv,
                                       .head_dim = head_dim,
                                       .dtype = parse_dtype(dtype),
                                       .device = device_of(device, "flexcp.AttentionPlan"),
                                       .device_index = device_index};
            AttentionPlan plan;
            {
              // Planning a long mask takes a while; other Python threads go on meanwhile.
              nb::gil_scoped_release release;
              plan = AttentionPlan(mask, shape, {.backward = backward});
            }
            new (self) AttentionPlan(std::move(plan));
          },
          nb::arg("mask"), nb::arg("heads_q"), nb::arg("heads_kv"), nb::arg("head_dim"),
          nb::arg("dtype"), nb::arg("device"), nb::arg("device_index"), nb::arg("backward"))
      .def("workspace_bytes", &AttentionPlan::workspace_bytes)
      .def(
          "bind_workspace",
          [](AttentionPlan& plan, std::uintptr_t workspace, std::size_t bytes,
             std::uintptr_t stream) {
            plan.bind_workspace(reinterpret_cast<void*>(workspace), bytes,
                                reinterpret_cast<void*>(stream));
          },
          nb::arg("workspace"), nb::arg("bytes"), nb::arg("stream"))
      .def("has_workspace", &AttentionPlan::has_workspace)
      .def("has_backward", &AttentionPlan::has_backward)
      .def("area", &AttentionPlan::area);

  // What a forward (and its backward, once it ran) moved and how long it took (DistStats): bytes,
  // then per stage (stage 0 first) (wait, compute) in ms, forward and backward, and the totals;
  // device time on device tensors (reading them waits for the work).
  nb::class_<DistContext>(m, "DistContext")
      .def("empty", &DistContext::empty)
      .def("stats", [](const DistContext& c) {
        const DistStats& st = c.stats();
        auto stages = [](const std::vector<StageTiming>& v) {
          nb::list out;
          for (const StageTiming& t : v) out.append(nb::make_tuple(t.wait_ms, t.compute_ms));
          return out;
        };
        nb::dict d;
        d["fwd_bytes_received"] = st.fwd_bytes_received;
        d["fwd_bytes_sent"] = st.fwd_bytes_sent;
        d["bwd_bytes_received"] = st.bwd_bytes_received;
        d["bwd_bytes_sent"] = st.bwd_bytes_sent;
        d["forward_stages_ms"] = stages(st.forward);
        d["backward_stages_ms"] = stages(st.backward);
        d["forward_ms"] = st.forward_ms;
        d["backward_ms"] = st.backward_ms;
        return d;
      });

  // A group's communicators on one device (flexcp._dist keeps one per device and shares it).
  nb::class_<PyDistComm>(m, "DistComm")
      .def(
          "__init__",
          [](PyDistComm* self, nb::object comm, const std::string& device, int device_index,
             const std::string& backend) {
            const char* fn = "flexcp.DistAttention";
            new (self) PyDistComm();
            self->comm = std::make_unique<PyCommunicator>(std::move(comm));
            if (device_of(device, fn) == Device::kCuda)
              self->device_comm = device_communicator(*self->comm, backend, device_index, fn);
          },
          nb::arg("comm"), nb::arg("device") = "cpu", nb::arg("device_index") = 0,
          nb::arg("backend") = "");

  // DistAttention on one rank, over a group's communicators (flexcp._dist). Collective calls.
  nb::class_<PyDistAttention>(m, "DistAttention")
      .def(
          "__init__",
          [](PyDistAttention* self, const Mask& mask, PyDistComm& comm, std::int64_t heads_q,
             std::int64_t heads_kv, std::int64_t head_dim, const std::string& dtype,
             std::int64_t chunk_size, std::int64_t chunks_per_rank, const std::string& device,
             int device_index) {
            const char* fn = "flexcp.DistAttention";
            new (self) PyDistAttention();
            DistAttentionOptions o;
            o.plan.chunk_size = chunk_size;
            o.plan.chunks_per_rank = chunks_per_rank;
            o.plan.device = device_of(device, fn);
            o.plan.device_index = device_index;
            if ((o.plan.device == Device::kCuda) != (comm.device_comm != nullptr))
              bad(std::string(fn) + ": the communicators are for another device than '" + device +
                  "'");
            self->attn = std::make_unique<DistAttention>(mask, comm.for_tensors(), heads_q,
                                                         heads_kv, head_dim, parse_dtype(dtype), o);
          },
          // The communicators outlive every plan made over them.
          nb::keep_alive<1, 3>(), nb::arg("mask"), nb::arg("comm"), nb::arg("heads_q"),
          nb::arg("heads_kv"), nb::arg("head_dim"), nb::arg("dtype"), nb::arg("chunk_size") = 0,
          nb::arg("chunks_per_rank") = 0, nb::arg("device") = "cpu", nb::arg("device_index") = 0)
      .def("local_q_tokens", [](const PyDistAttention& d) { return d.attn->local_q_tokens(); })
      .def("local_k_tokens", [](const PyDistAttention& d) { return d.attn->local_k_tokens(); })
      .def("position_ids", [](const PyDistAttention& d) { return d.attn->position_ids(); })
      .def("kv_token_ids",
           [](const PyDistAttention& d) {
             std::vector<std::int64_t> ids;
             for (const Range& r : d.attn->plan().rank.k_tokens)
               for (std::int64_t t = r.begin; t < r.end; ++t) ids.push_back(t);
             return ids;
           })
      .def("imbalance", [](const PyDistAttention& d) { return d.attn->plan().dispatch.imbalance; })
      // Every global q token's rank and index among that rank's local rows (the dispatch, which
      // every rank knows), for exchanges the Python side makes itself (roll).
      .def("token_ranks",
           [](const PyDistAttention& d) { return d.attn->plan().dispatch.global_to_rank_q(); })
      .def("token_local_rows",
           [](const PyDistAttention& d) { return d.attn->plan().dispatch.global_to_local_q(); })
      .def("recv_tokens", [](const PyDistAttention& d) { return d.attn->plan().rank.recv_tokens; })
      .def(
          "forward",
          [](PyDistAttention& d, const Array& q, const Array& k, const Array& v,
             const MutableArray& out, const MutableArray& lse, double scale, double softcap,
             const nb::object& sink, std::uintptr_t stream) {
            const char* fn = "flexcp.DistAttention";
            return d.attn->forward(view_of(q, fn, "q"), view_of(k, fn, "k"), view_of(v, fn, "v"),
                                   view_of(out, fn, "out"), view_of(lse, fn, "lse"),
                                   options_of(scale, softcap, sink, stream, fn));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
          nb::arg("scale"), nb::arg("softcap"), nb::arg("sink").none(), nb::arg("stream") = 0)
      .def(
          "backward",
          [](PyDistAttention& d, DistContext& ctx, const Array& dout, const Array& q,
             const Array& out, const Array& lse, const MutableArray& dq, const MutableArray& dk,
             const MutableArray& dv, const nb::object& dsink) {
            const char* fn = "flexcp.DistAttention (backward)";
            d.attn->backward(ctx, view_of(dout, fn, "grad of out"), view_of(q, fn, "q"),
                             view_of(out, fn, "out"), view_of(lse, fn, "lse"),
                             view_of(dq, fn, "dq"), view_of(dk, fn, "dk"), view_of(dv, fn, "dv"),
                             optional_view(dsink, fn, "dsink"));
          },
          nb::arg("context"), nb::arg("dout"), nb::arg("q"), nb::arg("out"), nb::arg("lse"),
          nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsink").none());
}
