// DistAttention on device tensors (the plan of runtime/dist_device.h): buffers in stream-ordered
// device memory, exchanges on the caller's stream, the rank's work as one kernel plan.
#include "runtime/dist_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/runtime.h"
#include "runtime/dist_device_kernels.h"
#include "runtime/dist_impl.h"

namespace flexcp::runtime {
namespace {

constexpr const char* kCtor = "flexcp::DistAttention";
constexpr const char* kFwd = "flexcp::DistAttention::forward";
constexpr const char* kBwd = "flexcp::DistAttention::backward";
constexpr const char* kGather = "flexcp::DistAttention::gather_kv";

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Device memory allocated and freed in stream order on `stream`.
std::shared_ptr<void> device_alloc(std::size_t bytes, void* stream, const char* fn,
                                   const char* what) {
  void* p = nullptr;
  cuda::check(cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), as_stream(stream)), fn,
              (std::string("allocating ") + what).c_str());
  return std::shared_ptr<void>(p, [stream](void* q) { cudaFreeAsync(q, as_stream(stream)); });
}

unsigned char* bytes_of(const std::shared_ptr<void>& p) {
  return static_cast<unsigned char*>(p.get());
}

TensorView device_view(void* data, DType dtype, std::int64_t rows, std::int64_t heads,
                       std::int64_t dim, int device_index) {
  TensorView v = make_view(data, dtype, {rows, heads, dim});
  v.device = Device::kCuda;
  v.device_index = device_index;
  return v;
}

TensorView device_vector(void* data, std::int64_t n, int device_index) {
  TensorView v = make_view(data, DType::kFloat32, {n});
  v.device = Device::kCuda;
  v.device_index = device_index;
  return v;
}

// Starts exchanges 1..n of `x` on `stream`, orders the stream after each, and returns the bytes
// the transport received.
std::int64_t exchange_in_stream_order(Communicator& comm, Exchanges& x, void* stream) {
  const int n = static_cast<int>(x.sends.size()) - 1;
  std::vector<std::unique_ptr<CommHandle>> handles(n + 1);
  for (int s = 1; s <= n; ++s) handles[s] = comm.start_on(stream, x.sends[s], x.recvs[s]);
  std::int64_t received = 0;
  for (int s = 1; s <= n; ++s) {
    handles[s]->wait_on(stream);
    received += static_cast<std::int64_t>(handles[s]->bytes_received());
  }
  return received;
}

}  // namespace

struct DeviceRun {
  AttentionPlan plan;  // every stage's work over [q rows, own + received columns)
  void* workspace = nullptr;
  int device_index = 0;
  ~DeviceRun() {
    if (workspace == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_index);
    cudaFree(workspace);
    cudaSetDevice(previous);
  }
};

void DeviceRunDeleter::operator()(DeviceRun* run) const {
  delete run;
}

TensorView DeviceColumns::sink_view() const {
  return device_vector(sink.get(), heads_q, device_index);
}

DeviceRunPtr make_device_run(const DistCore& m) {
  std::vector<Band> work;
  for (const std::vector<Band>& stage : m.me().stage_work)
    work.insert(work.end(), stage.begin(), stage.end());
  const AttentionShape shape{
      m.q_rows(), m.layout.total_columns, m.heads_q,     m.heads_kv, m.head_dim,
      m.dtype,    Device::kCuda,          m.device_index};
  DeviceRunPtr run(new DeviceRun);
  run->plan = AttentionPlan(work, shape);
  run->device_index = m.device_index;
  const cuda::DeviceGuard guard(m.device_index, kCtor);
  const std::size_t bytes = run->plan.workspace_bytes();
  cuda::check(cudaMalloc(&run->workspace, std::max<std::size_t>(bytes, 1)), kCtor,
              "allocating the plan's workspace");
  run->plan.bind_workspace(run->workspace, bytes, nullptr);
  // Written before any stream (blocking or not) runs the plan.
  cuda::check(cudaStreamSynchronize(nullptr), kCtor, "writing the plan's workspace");
  return run;
}

void device_forward(DistCore& m, DistContext::State& ctx, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, const TensorView& lse,
                    const AttentionOptions& options) {
  const cuda::DeviceGuard guard(m.device_index, kFwd);
  void* stream = options.cuda_stream;
  const std::size_t row = m.kv_row_bytes();
  const std::int64_t cols = m.layout.total_columns;
  DeviceColumns& d = ctx.device;
  d.stream = stream;
  d.heads_q = m.heads_q;
  d.device_index = m.device_index;
  d.k = device_alloc(cols * row, stream, kFwd, "the K columns");
  d.v = device_alloc(cols * row, stream, kFwd, "the V columns");
  // Sends read the own rows in the column buffers: copied in first, on the same stream.
  const std::size_t own = m.layout.own_columns * row;
  cuda::check(cudaMemcpyAsync(d.k.get(), k.data, own, cudaMemcpyDeviceToDevice, as_stream(stream)),
              kFwd, "copying the own K rows");
  cuda::check(cudaMemcpyAsync(d.v.get(), v.data, own, cudaMemcpyDeviceToDevice, as_stream(stream)),
              kFwd, "copying the own V rows");
  if (!options.sink.empty()) {  // the backward's copy: the caller may change its sink
    const std::size_t sink_bytes = m.heads_q * sizeof(float);
    d.sink = device_alloc(sink_bytes, stream, kFwd, "the sink copy");
    cuda::check(cudaMemcpyAsync(d.sink.get(), options.sink.data, sink_bytes,
                                cudaMemcpyDeviceToDevice, as_stream(stream)),
                kFwd, "copying the sink");
  }
  Exchanges x = m.kv_exchanges(bytes_of(d.k), bytes_of(d.v), ctx.stats);
  ctx.stats.fwd_bytes_received = exchange_in_stream_order(*m.comm, x, stream);
  // Every stage's columns are in: one kernel over all of them.
  forward(m.device_run->plan, q,
          device_view(d.k.get(), m.dtype, cols, m.heads_kv, m.head_dim, m.device_index),
          device_view(d.v.get(), m.dtype, cols, m.heads_kv, m.head_dim, m.device_index), out, lse,
          options);
}

void device_backward(DistCore& m, DistContext::State& ctx, const TensorView& dout,
                     const TensorView& q, const TensorView& out, const TensorView& lse,
                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const TensorView& dsink) {
  const cuda::DeviceGuard guard(m.device_index, kBwd);
  const DeviceColumns& d = ctx.device;
  void* stream = d.stream;
  const std::int64_t cols = m.layout.total_columns, own = m.layout.own_columns;
  const std::int64_t hk = m.heads_kv, dim = m.head_dim, hq = m.heads_q;
  const std::size_t frow = m.grad_row_bytes();
  auto dk_cols = device_alloc(cols * frow, stream, kBwd, "the fp32 dK columns");
  auto dv_cols = device_alloc(cols * frow, stream, kBwd, "the fp32 dV columns");
  auto partials = device_alloc(m.partial_rows() * frow, stream, kBwd, "the received partials");
  std::shared_ptr<void> dsink_mine;
  if (!dsink.empty()) dsink_mine = device_alloc(hq * sizeof(float), stream, kBwd, "dsink");

  AttentionOptions options = ctx.options();
  options.cuda_stream = stream;
  backward(m.device_run->plan, dout, q,
           device_view(d.k.get(), m.dtype, cols, hk, dim, m.device_index),
           device_view(d.v.get(), m.dtype, cols, hk, dim, m.device_index), out, lse, dq,
           device_view(dk_cols.get(), DType::kFloat32, cols, hk, dim, m.device_index),
           device_view(dv_cols.get(), DType::kFloat32, cols, hk, dim, m.device_index), options,
           dsink.empty() ? TensorView{} : device_vector(dsink_mine.get(), hq, m.device_index));

  // Received columns' partials to their owners; this rank's pieces' partials back from theirs.
  Exchanges x =
      m.grad_exchanges(bytes_of(dk_cols), bytes_of(dv_cols), bytes_of(partials), ctx.stats);
  ctx.stats.bwd_bytes_received = exchange_in_stream_order(*m.comm, x, stream);
  // The owner's sum, in a fixed order (its own partial, then the pieces in plan order), rounded
  // once: the same bits on every run.
  const auto s = as_stream(stream);
  auto* dkc = reinterpret_cast<float*>(dk_cols.get());
  auto* dvc = reinterpret_cast<float*>(dv_cols.get());
  const auto* parts = reinterpret_cast<const float*>(partials.get());
  const std::int64_t per_row = hk * dim;
  for (std::size_t i = 0; i < m.me().sends.size(); ++i) {
    const SendRange& piece = m.me().sends[i];
    const std::int64_t rows = piece.tokens.size(), at = m.layout.own_row(piece.tokens.begin);
    const float* pk = parts + m.partial_row(i) * per_row;
    add_f32(dkc + at * per_row, pk, rows * per_row, s);
    add_f32(dvc + at * per_row, pk + rows * per_row, rows * per_row, s);
  }
  store_as(dk.data, m.dtype, dkc, own * per_row, s);
  store_as(dv.data, m.dtype, dvc, own * per_row, s);

  if (!dsink.empty()) {  // each rank's rows, then the sum over ranks in rank order
    std::vector<float> mine(hq), all(hq * m.comm->size()), total(hq, 0.f);
    cuda::check(cudaMemcpyAsync(mine.data(), dsink_mine.get(), hq * sizeof(float),
                                cudaMemcpyDeviceToHost, s),
                kBwd, "reading this rank's dsink");
    cuda::check(cudaStreamSynchronize(s), kBwd, "reading this rank's dsink");
    m.comm->all_gather(mine.data(), mine.size() * sizeof(float), all.data());
    for (std::int64_t h = 0; h < hq; ++h)
      for (int r = 0; r < m.comm->size(); ++r) total[h] += all[r * hq + h];
    // From pageable memory: returns once `total` has been read.
    cuda::check(
        cudaMemcpyAsync(dsink.data, total.data(), hq * sizeof(float), cudaMemcpyHostToDevice, s),
        kBwd, "writing dsink");
  }
}

void device_gather_kv(DistCore& m, const TensorView& k, const TensorView& v,
                      const TensorView& k_buffer, const TensorView& v_buffer) {
  const cuda::DeviceGuard guard(m.device_index, kGather);
  const std::size_t own = m.layout.own_columns * m.kv_row_bytes();
  cuda::check(cudaMemcpy(k_buffer.data, k.data, own, cudaMemcpyDeviceToDevice), kGather,
              "copying the own K rows");
  cuda::check(cudaMemcpy(v_buffer.data, v.data, own, cudaMemcpyDeviceToDevice), kGather,
              "copying the own V rows");
  DistStats stats;
  Exchanges x = m.kv_exchanges(static_cast<unsigned char*>(k_buffer.data),
                               static_cast<unsigned char*>(v_buffer.data), stats);
  exchange_in_stream_order(*m.comm, x, nullptr);
  cuda::check(cudaStreamSynchronize(nullptr), kGather, "the exchanges");
}

}  // namespace flexcp::runtime
