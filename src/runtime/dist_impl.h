// DistAttention's internals, shared by its host path (dist_attention.cc) and its device path
// (dist_device.cc): the context's state, the object's state, its argument checks, and the
// message lists of both exchanges, built once here for host and device buffers alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/checks.h"
#include "core/dtype.h"
#include "flexcp/dist_attention.h"
#include "runtime/comm_layout.h"
#include "runtime/dist_device.h"

namespace flexcp {

namespace runtime {

// A contiguous owned host buffer with a [rows, heads(, dim)] view.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;
  Buffer() = default;
  Buffer(DType dtype, std::int64_t rows, std::int64_t heads, std::int64_t dim) {
    bytes.assign(
        static_cast<std::size_t>(std::max<std::int64_t>(rows * heads * dim, 1)) * dtype_size(dtype),
        0);
    view = make_view(bytes.data(), dtype, {rows, heads, dim});
  }
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  std::size_t row_bytes() const {
    return static_cast<std::size_t>(view.strides[0]) * dtype_size(view.dtype);
  }
  unsigned char* row(std::int64_t r) { return bytes.data() + r * row_bytes(); }
};

// The operations of a sequence of exchanges: sends[s] and recvs[s] for s in [1, exchanges]
// (index 0 unused), started in order on every rank (flexcp/comm.h: exchanges match in order).
struct Exchanges {
  std::vector<std::vector<SendOp>> sends;
  std::vector<std::vector<RecvOp>> recvs;
  explicit Exchanges(int exchanges) : sends(exchanges + 1), recvs(exchanges + 1) {}
};

}  // namespace runtime

struct DistContext::State {
  std::uint64_t owner = 0;        // the DistAttention that made it
  double scale = 0, softcap = 0;  // the forward's options, for its backward
  bool deterministic = false;
  DistStats stats;
  // Host tensors: [own + received columns, Hk, D], what the forward's work read, and a copy of
  // its sink logits (empty: none).
  runtime::Buffer k, v;
  std::vector<float> sink;
  // Device tensors: the same in device memory (runtime/dist_device.h), k and v empty above.
  runtime::DeviceColumns device;

  AttentionOptions options() const {
    AttentionOptions o;
    o.scale = scale;
    o.softcap = softcap;
    o.deterministic = deterministic;
    if (device.sink)
      o.sink = device.sink_view();
    else if (!sink.empty())
      o.sink = make_view(const_cast<float*>(sink.data()), DType::kFloat32,
                         {static_cast<std::int64_t>(sink.size())});
    return o;
  }
};

namespace runtime {

// What a DistAttention holds (its Impl is exactly this; named here so that the device path,
// outside the class, can take it).
struct DistCore {
  std::uint64_t id = 0;
  Communicator* comm = nullptr;
  Plan plan;
  CommLayout layout;
  std::int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;  // where the tensors live and the kernels run
  int device_index = 0;
  std::vector<std::int64_t> positions;  // global q token of each local row
  DeviceRunPtr device_run;              // device tensors: the kernel plan and its workspace

  const RankPlan& me() const { return plan.rank; }
  std::int64_t q_rows() const { return plan.rank.num_q_tokens; }
  std::size_t kv_row_bytes() const {
    return static_cast<std::size_t>(heads_kv * head_dim) * dtype_size(dtype);
  }
  std::size_t grad_row_bytes() const {  // dK and dV partials travel in fp32
    return static_cast<std::size_t>(heads_kv * head_dim) * sizeof(float);
  }

  // Local shards: contiguous, this object's dtype, on its device.
  void check_local(const ArgChecker& c, const char* name, const TensorView& t, std::int64_t rows,
                   std::int64_t heads) const {
    c.tensor(name, t, {rows, heads, head_dim}, "[T_local, H, D]", dtype, device, device_index);
    c.contiguous(name, t);
  }
  void check_lse(const ArgChecker& c, const TensorView& lse) const {
    c.tensor("lse", lse, {q_rows(), heads_q}, "[Tq_local, Hq]", DType::kFloat32, device,
             device_index);
    c.contiguous("lse", lse);
  }

  // A kernel call's shape: `shape` with the options' scale (1/sqrt(D) when it is 0).
  CallShape call_shape(const AttentionShape& shape, double scale) const {
    CallShape s;
    static_cast<AttentionShape&>(s) = shape;
    s.scale = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
    return s;
  }
  CallShape stage_shape(int stage, double scale) const {
    return call_shape(me().stage_plans[stage].shape(), scale);
  }

  // The per-call options: a finite scale, a softcap >= 0, an fp32 [Hq] sink on this device.
  void check_options(const ArgChecker& c, const AttentionOptions& o) const {
    if (!std::isfinite(o.scale))
      c.fail("scale is " + std::to_string(o.scale) + ", expected a finite number");
    if (!std::isfinite(o.softcap) || o.softcap < 0)
      c.fail("softcap is " + std::to_string(o.softcap) + ", expected a finite number >= 0");
    if (!o.sink.empty()) {
      c.tensor("sink", o.sink, {heads_q}, "[Hq]", DType::kFloat32, device, device_index);
      c.contiguous("sink", o.sink);
    }
  }

  // The forward's group-cast of K/V into the column buffers k_cols/v_cols ([total_columns, Hk,
  // D], own rows first, then each received piece at its column; host or device memory alike).
  // Sends read the own rows from k_own/v_own (the rank's shards, rows in the same order), or
  // there when those are null. Exchange s sends the pieces their receivers consume in stage s and
  // receives this rank's stage s.
  Exchanges kv_exchanges(unsigned char* k_cols, unsigned char* v_cols, DistStats& stats,
                         const unsigned char* k_own = nullptr,
                         const unsigned char* v_own = nullptr) const;
  // The backward's group-reduce: exchange s returns the fp32 dK/dV partials of the columns this
  // rank received in stage s (rows of dk_cols/dv_cols) to their owners, and receives the partials
  // of the pieces this rank sent whose receivers consumed them in stage s, into `partials`: piece
  // i's dK rows at partial_row(i), its dV rows right after.
  Exchanges grad_exchanges(unsigned char* dk_cols, unsigned char* dv_cols, unsigned char* partials,
                           DistStats& stats) const;
  std::int64_t partial_row(std::size_t piece) const;  // 2 x the tokens of the pieces before it
  std::int64_t partial_rows() const { return partial_row(me().sends.size()); }
};

}  // namespace runtime
}  // namespace flexcp
