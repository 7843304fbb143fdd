// DistAttention on device tensors (the plan of runtime/dist_device.h): buffers in stream-ordered
// device memory, exchanges on the caller's stream, the rank's work as one kernel plan.
#include "runtime/dist_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/runtime.h"
#include "kernels/plan/attention_plan_impl.h"
#include "kernels/sm90/sm90_backward.h"
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

// A memory pool that keeps what is freed into it (no release threshold): the contexts' columns of
// one step are the next step's, without mapping memory again after each synchronisation (the
// default pool gives its free memory back at every one). Destroyed with the last of the run and
// the contexts that hold it (memory still allocated from it is released when freed).
using MemPool = std::shared_ptr<CUmemPoolHandle_st>;

MemPool make_pool(int device_index, const char* fn) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_index;
  cudaMemPool_t pool = nullptr;
  cuda::check(cudaMemPoolCreate(&pool, &props), fn, "creating the context memory pool");
  MemPool owned(pool, [](cudaMemPool_t q) { cudaMemPoolDestroy(q); });
  std::uint64_t keep = UINT64_MAX;
  cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), fn,
              "keeping the context memory pool's free memory");
  return owned;
}

// Device memory from `pool`, allocated and freed in stream order on `stream`.
std::shared_ptr<void> device_alloc(const MemPool& pool, std::size_t bytes, void* stream,
                                   const char* fn, const char* what) {
  void* p = nullptr;
  cuda::check(
      cudaMallocFromPoolAsync(&p, std::max<std::size_t>(bytes, 1), pool.get(), as_stream(stream)),
      fn, (std::string("allocating ") + what).c_str());
  return std::shared_ptr<void>(p, [pool, stream](void* q) { cudaFreeAsync(q, as_stream(stream)); });
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

// Starts exchanges 1..n of `x` on `stream` (n..1 with last_first: the backward's order), orders
// the stream after each, and returns the bytes the transport received.
std::int64_t exchange_in_stream_order(Communicator& comm, Exchanges& x, void* stream,
                                      bool last_first = false) {
  const int n = static_cast<int>(x.sends.size()) - 1;
  std::vector<std::unique_ptr<CommHandle>> handles(n + 1);
  for (int i = 1; i <= n; ++i) {
    const int s = last_first ? n + 1 - i : i;
    handles[s] = comm.start_on(stream, x.sends[s], x.recvs[s]);
  }
  std::int64_t received = 0;
  for (int s = 1; s <= n; ++s) {
    handles[s]->wait_on(stream);
    received += static_cast<std::int64_t>(handles[s]->bytes_received());
  }
  return received;
}

constexpr std::size_t kWorkspaceAlign = 256;  // AttentionPlan::bind_workspace's alignment

std::size_t aligned(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace

// Events recorded on a call's stream, per direction: `begin` when the call starts, per stage s
// `waiting[s]` before a wait for data and `arrived[s]` after it, `computed[s]` after the stage's
// kernel (and merge), `end` when the call's work is done. The forward runs its stages in order,
// each waiting for its K/V first; the backward runs them last first, stage 0 last, then waits
// (waiting[0], arrived[0]) for the dK/dV partials of this rank's pieces. Read once per direction.
struct DeviceTimeline {
  struct Span {
    cudaEvent_t begin = nullptr, end = nullptr;
    std::vector<cudaEvent_t> waiting, arrived, computed;
    void reset(std::size_t stages) {
      begin = end = nullptr;
      waiting.assign(stages, nullptr);
      arrived.assign(stages, nullptr);
      computed.assign(stages, nullptr);
    }
  } fwd, bwd;
  bool fwd_read = false, bwd_read = false;
  std::vector<cudaEvent_t> all;  // every event made, destroyed with the timeline
  int device_index = 0;

  cudaEvent_t record(void* stream, const char* fn) {
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreate(&e), fn, "creating a timing event");
    all.push_back(e);
    cuda::check(cudaEventRecord(e, as_stream(stream)), fn, "recording a timing event");
    return e;
  }
  ~DeviceTimeline() {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_index);
    for (cudaEvent_t e : all) cudaEventDestroy(e);
    cudaSetDevice(previous);
  }
};

void DeviceTimelineDeleter::operator()(DeviceTimeline* t) const {
  delete t;
}

// Scratch memory sized once per plan and reused by every call (no allocation per step): the
// forward's fp32 merged and per-stage outputs, the backward's fp32 dK/dV columns, the partials it
// receives and this rank's dsink. Allocated at its first use (cudaMalloc: that call waits for the
// device once).
struct DeviceScratch {
  std::vector<void*> buffers;  // freed with the run

  // `bytes` of device memory per entry of `sizes`, once; every later call gets the same.
  void ensure(const std::vector<std::size_t>& sizes, const char* fn, const char* what) {
    if (!buffers.empty()) return;
    for (std::size_t bytes : sizes) {
      void* p = nullptr;
      cuda::check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), fn,
                  (std::string("allocating ") + what).c_str());
      buffers.push_back(p);
    }
  }
  template <typename T>
  T* at(std::size_t i) const {
    return static_cast<T*>(buffers[i]);
  }
  void release() {
    for (void* p : buffers) cudaFree(p);
    buffers.clear();
  }
};

struct DeviceRun {
  // All of the rank's work over [q rows, own + received columns). Without remote stages it runs
  // the whole forward and backward; with them, it holds the backward's rows (statistics, the dQ
  // accumulator, the deterministic dQ pass) for the stages' keys.
  AttentionPlan plan;
  // With remote stages, each stage's work alone, in the same workspace: the forward runs stage by
  // stage as the K/V arrive, the backward stage by stage (keys-only plans: sm90::backward_keys)
  // while the partials of the stage before travel. Stage s's plan reads only the first
  // stage_columns[s] columns (the own ones and those of stages 1..s, laid out in stage order):
  // a forward block at the edge of its work would otherwise read columns still in flight (the
  // memory of an earlier call, NaN as likely as not), and 0 x NaN in P V is NaN. Past them the
  // kernel's loads read zeros.
  std::vector<AttentionPlan> stage_plans;
  std::vector<std::int64_t> stage_columns;
  void* workspace = nullptr;
  DeviceScratch forward_scratch, backward_scratch;
  // Every call shares the workspace and the scratch, and calls may come on different streams:
  // each waits on the event its predecessor recorded at its end (a no-op on the same stream).
  cudaEvent_t last_use = nullptr;
  // Copies the own K/V rows into a context's columns beside stage 0's kernel, which reads the
  // caller's shards (the copy is what the backward reads).
  cudaStream_t copy_stream = nullptr;
  MemPool pool;  // the contexts' columns and sink copies
  int device_index = 0;

  void begin_use(void* stream, const char* fn) const {
    cuda::check(cudaStreamWaitEvent(as_stream(stream), last_use, 0), fn,
                "ordering after the previous call on this DistAttention");
  }
  void end_use(void* stream, const char* fn) const {
    cuda::check(cudaEventRecord(last_use, as_stream(stream)), fn,
                "recording the end of this call's use of the workspace");
  }
  ~DeviceRun() {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_index);
    if (workspace != nullptr) cudaFree(workspace);  // cudaFree waits for the work using it
    forward_scratch.release();
    backward_scratch.release();
    if (last_use != nullptr) cudaEventDestroy(last_use);
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
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
  if (m.me().num_stages > 0) {
    run->stage_columns.assign(m.me().stage_work.size(), m.layout.own_columns);
    for (std::size_t i = 0; i < m.me().recv.size(); ++i) {
      const RemoteRange& r = m.me().recv[i];
      for (std::size_t st = r.stage; st < run->stage_columns.size(); ++st)
        run->stage_columns[st] =
            std::max(run->stage_columns[st], m.layout.recv_column[i] + r.tokens.size());
    }
    AttentionPlanBuild keys_only;
    keys_only.fn = kCtor;
    keys_only.keys_only = true;
    for (std::size_t st = 0; st < m.me().stage_work.size(); ++st) {
      AttentionShape upto = shape;
      upto.seqlen_k = run->stage_columns[st];
      run->stage_plans.push_back(make_attention_plan(m.me().stage_work[st], upto, keys_only));
    }
  }
  run->device_index = m.device_index;
  const cuda::DeviceGuard guard(m.device_index, kCtor);
  cuda::check(cudaEventCreateWithFlags(&run->last_use, cudaEventDisableTiming), kCtor,
              "creating the event that orders calls");
  cuda::check(cudaStreamCreateWithFlags(&run->copy_stream, cudaStreamNonBlocking), kCtor,
              "creating the stream that copies the own K/V rows");
  run->pool = make_pool(m.device_index, kCtor);
  std::size_t bytes = aligned(run->plan.workspace_bytes());
  for (const AttentionPlan& p : run->stage_plans) bytes += aligned(p.workspace_bytes());
  cuda::check(cudaMalloc(&run->workspace, std::max<std::size_t>(bytes, 1)), kCtor,
              "allocating the plans' workspace");
  auto* at = static_cast<unsigned char*>(run->workspace);
  run->plan.bind_workspace(at, run->plan.workspace_bytes(), nullptr);
  at += aligned(run->plan.workspace_bytes());
  for (AttentionPlan& p : run->stage_plans) {
    p.bind_workspace(at, p.workspace_bytes(), nullptr);
    at += aligned(p.workspace_bytes());
  }
  // Written before any stream (blocking or not) runs the plan.
  cuda::check(cudaStreamSynchronize(nullptr), kCtor, "writing the plan's workspace");
  return run;
}

namespace {

TensorView columns_view(const DistCore& m, void* data, DType dtype, std::int64_t columns) {
  return device_view(data, dtype, columns, m.heads_kv, m.head_dim, m.device_index);
}

// With remote stages: each stage's kernel into an fp32 partial as soon as its K/V are in (stage 0
// at once, on the caller's shards), merged into the first stage's through the lse, then the sink
// and one rounding. Later stages read the columns, after the own rows' copy (`copied`).
void staged_forward(DistCore& m, DeviceTimeline& t, std::vector<std::unique_ptr<CommHandle>>& h,
                    const TensorView& q, const TensorView& k, const TensorView& v,
                    const DeviceColumns& d, cudaEvent_t copied, const TensorView& out,
                    const TensorView& lse, const AttentionOptions& options, DistStats& stats) {
  void* stream = options.cuda_stream;
  const auto s = as_stream(stream);
  const std::int64_t tq = m.q_rows(), hq = m.heads_q, dim = m.head_dim, rows = tq * hq;
  DeviceScratch& scratch = m.device_run->forward_scratch;
  const std::size_t out_bytes = rows * dim * sizeof(float), lse_bytes = rows * sizeof(float);
  scratch.ensure({out_bytes, lse_bytes, out_bytes, lse_bytes}, kFwd,
                 "the forward's fp32 partial outputs");
  float* const acc = scratch.at<float>(0);  // the merged output and lse
  float* const acc_lse = scratch.at<float>(1);
  float* const part = scratch.at<float>(2);  // a later stage's, merged into acc
  float* const part_lse = scratch.at<float>(3);
  auto out_view = [&](float* p) {
    return device_view(p, DType::kFloat32, tq, hq, dim, m.device_index);
  };
  auto lse_view = [&](float* p) {
    TensorView v = make_view(p, DType::kFloat32, {tq, hq});
    v.device = Device::kCuda;
    v.device_index = m.device_index;
    return v;
  };
  AttentionOptions partial = options;
  partial.sink = {};  // joins once, after the merge
  bool merged_any = false;
  const int stages = m.me().num_stages;
  for (int st = 0; st <= stages; ++st) {
    if (st > 0) {
      t.fwd.waiting[st] = t.record(stream, kFwd);
      if (st == 1)
        cuda::check(cudaStreamWaitEvent(s, copied, 0), kFwd, "waiting for the own rows' copy");
      h[st]->wait_on(stream);
      stats.fwd_bytes_received += static_cast<std::int64_t>(h[st]->bytes_received());
      t.fwd.arrived[st] = t.record(stream, kFwd);
    }
    const AttentionPlan& plan = m.device_run->stage_plans[st];
    if (plan.area() > 0) {
      const bool first = !merged_any;
      const std::int64_t cols = m.device_run->stage_columns[st];
      // Stage 0 reads the own columns only (stage_columns[0] = own_columns): the caller's shards.
      const TensorView k_cols = st == 0 ? k : columns_view(m, d.k.get(), m.dtype, cols);
      const TensorView v_cols = st == 0 ? v : columns_view(m, d.v.get(), m.dtype, cols);
      forward(plan, q, k_cols, v_cols, out_view(first ? acc : part),
              lse_view(first ? acc_lse : part_lse), partial);
      if (!first) merge_partial(acc, acc_lse, part, part_lse, rows, dim, s);
      merged_any = true;
    }
    t.fwd.computed[st] = t.record(stream, kFwd);
  }
  if (!merged_any) {  // no stage attends anything: out = 0, lse = -inf
    cuda::check(cudaMemsetAsync(acc, 0, out_bytes, s), kFwd, "clearing the output");
    fill_empty_lse(acc_lse, rows, s);
  }
  finish_output(acc, acc_lse, static_cast<const float*>(options.sink.data), hq, out.data, m.dtype,
                static_cast<float*>(lse.data), rows, dim, s);
}

}  // namespace

void device_forward(DistCore& m, DistContext::State& ctx, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, const TensorView& lse,
                    const AttentionOptions& options) {
  const cuda::DeviceGuard guard(m.device_index, kFwd);
  void* stream = options.cuda_stream;
  const auto s = as_stream(stream);
  DeviceRun& run = *m.device_run;
  const std::size_t row = m.kv_row_bytes();
  const std::int64_t cols = m.layout.total_columns;
  DeviceColumns& d = ctx.device;
  d.stream = stream;
  d.heads_q = m.heads_q;
  d.device_index = m.device_index;
  d.timeline.reset(new DeviceTimeline);
  DeviceTimeline& t = *d.timeline;
  t.device_index = m.device_index;
  const int stages = m.me().num_stages, exchanges = m.layout.exchanges;
  run.begin_use(stream, kFwd);
  t.fwd.reset(stages + 1);
  t.fwd.begin = t.record(stream, kFwd);

  d.k = device_alloc(run.pool, cols * row, stream, kFwd, "the K columns");
  d.v = device_alloc(run.pool, cols * row, stream, kFwd, "the V columns");
  // The own rows into the columns on the copy stream, after the allocation and the inputs, while
  // the kernels and the sends read the caller's shards.
  const std::size_t own = m.layout.own_columns * row;
  cuda::check(cudaStreamWaitEvent(run.copy_stream, t.record(stream, kFwd), 0), kFwd,
              "ordering the own rows' copy");
  cuda::check(cudaMemcpyAsync(d.k.get(), k.data, own, cudaMemcpyDeviceToDevice, run.copy_stream),
              kFwd, "copying the own K rows");
  cuda::check(cudaMemcpyAsync(d.v.get(), v.data, own, cudaMemcpyDeviceToDevice, run.copy_stream),
              kFwd, "copying the own V rows");
  const cudaEvent_t copied = t.record(run.copy_stream, kFwd);
  AttentionOptions opts = options;
  if (!options.sink.empty()) {  // the backward's copy: the caller may change its sink
    const std::size_t sink_bytes = m.heads_q * sizeof(float);
    d.sink = device_alloc(run.pool, sink_bytes, stream, kFwd, "the sink copy");
    cuda::check(
        cudaMemcpyAsync(d.sink.get(), options.sink.data, sink_bytes, cudaMemcpyDeviceToDevice, s),
        kFwd, "copying the sink");
    opts.sink = d.sink_view();
  }
  Exchanges x = m.kv_exchanges(bytes_of(d.k), bytes_of(d.v), ctx.stats,
                               static_cast<const unsigned char*>(k.data),
                               static_cast<const unsigned char*>(v.data));
  std::vector<std::unique_ptr<CommHandle>> handles(exchanges + 1);
  for (int e = 1; e <= exchanges; ++e)
    handles[e] = m.comm->start_on(stream, x.sends[e], x.recvs[e]);

  ctx.stats.fwd_bytes_received = 0;
  if (stages == 0) {  // only the own columns: one kernel, straight into out and lse
    forward(run.plan, q, k, v, out, lse, opts);
    t.fwd.computed[0] = t.record(stream, kFwd);
  } else {
    staged_forward(m, t, handles, q, k, v, d, copied, out, lse, opts, ctx.stats);
  }
  for (int e = stages + 1; e <= exchanges; ++e) {  // what this rank sends for later stages
    handles[e]->wait_on(stream);
    ctx.stats.fwd_bytes_received += static_cast<std::int64_t>(handles[e]->bytes_received());
  }
  cuda::check(cudaStreamWaitEvent(s, copied, 0), kFwd, "waiting for the own rows' copy");
  t.fwd.end = t.record(stream, kFwd);
  run.end_use(stream, kFwd);
}

namespace {

// The backward stage by stage, with remote stages: the row statistics, then each remote stage's
// keys last first, adding into the fp32 columns; exchange e starts as soon as stage e's kernel is
// queued (its columns are final then: later kernels read fewer columns), or at once when this rank
// received nothing in stage e. Stage 0's keys run while the partials travel, then dq. Every rank
// starts the exchanges in the same order (the last first). Without remote stages one kernel over
// all columns; the exchanges, receives only, start before it.
void backward_by_stage(DistCore& m, DeviceTimeline& t, const DeviceColumns& d,
                       const AttentionOptions& options, const TensorView& dout, const TensorView& q,
                       const TensorView& out, const TensorView& lse, const TensorView& dq,
                       float* dkc, float* dvc, Exchanges& x,
                       std::vector<std::unique_ptr<CommHandle>>& handles,
                       const TensorView& dsink_mine) {
  void* stream = options.cuda_stream;
  const DeviceRun& run = *m.device_run;
  const int stages = m.me().num_stages, exchanges = m.layout.exchanges;
  const std::int64_t cols = m.layout.total_columns;
  auto start = [&](int e) { handles[e] = m.comm->start_on(stream, x.sends[e], x.recvs[e]); };
  if (stages == 0) {
    for (int e = exchanges; e >= 1; --e) start(e);
    backward(run.plan, dout, q, columns_view(m, d.k.get(), m.dtype, cols),
             columns_view(m, d.v.get(), m.dtype, cols), out, lse, dq,
             columns_view(m, dkc, DType::kFloat32, cols),
             columns_view(m, dvc, DType::kFloat32, cols), options, dsink_mine);
    t.bwd.computed[0] = t.record(stream, kBwd);
    return;
  }
  const CallShape shape = m.call_shape(run.plan.shape(), options.scale);
  const AttentionPlan::Impl& rows = run.plan.impl();
  sm90::backward_rows_begin(shape, rows, dout, out, lse, options, dsink_mine);
  const std::size_t column_bytes = cols * m.grad_row_bytes();
  for (float* c : {dkc, dvc})
    cuda::check(cudaMemsetAsync(c, 0, column_bytes, as_stream(stream)), kBwd,
                "clearing the fp32 dK/dV columns");
  auto keys = [&](int st) {
    const AttentionPlan& plan = run.stage_plans[st];
    if (plan.area() > 0) {
      const std::int64_t n = run.stage_columns[st];
      sm90::backward_keys(shape, rows, plan.impl(), dout, q, columns_view(m, d.k.get(), m.dtype, n),
                          columns_view(m, d.v.get(), m.dtype, n),
                          columns_view(m, dkc, DType::kFloat32, n),
                          columns_view(m, dvc, DType::kFloat32, n), options, true);
    }
    t.bwd.computed[st] = t.record(stream, kBwd);
  };
  for (int e = exchanges; e >= 1; --e) {
    if (e <= stages) keys(e);
    start(e);
  }
  keys(0);
  sm90::backward_rows_end(shape, rows, dout, q, columns_view(m, d.k.get(), m.dtype, cols),
                          columns_view(m, d.v.get(), m.dtype, cols), out, lse, dq, options,
                          dsink_mine);
}

}  // namespace

void device_backward(DistCore& m, DistContext::State& ctx, const TensorView& dout,
                     const TensorView& q, const TensorView& out, const TensorView& lse,
                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const TensorView& dsink) {
  const cuda::DeviceGuard guard(m.device_index, kBwd);
  const DeviceColumns& d = ctx.device;
  void* stream = d.stream;
  const auto s = as_stream(stream);
  DeviceRun& run = *m.device_run;
  const std::int64_t cols = m.layout.total_columns, own = m.layout.own_columns;
  const std::int64_t hk = m.heads_kv, dim = m.head_dim, hq = m.heads_q;
  const int stages = m.me().num_stages, exchanges = m.layout.exchanges;
  DeviceTimeline& t = *ctx.device.timeline;
  run.begin_use(stream, kBwd);
  t.bwd.reset(stages + 1);
  t.bwd_read = false;
  t.bwd.begin = t.record(stream, kBwd);
  AttentionOptions options = ctx.options();
  options.cuda_stream = stream;
  DeviceScratch& scratch = run.backward_scratch;
  const std::size_t frow = m.grad_row_bytes();
  scratch.ensure({cols * frow, cols * frow, m.partial_rows() * frow, hq * sizeof(float)}, kBwd,
                 "the backward's fp32 dK/dV columns and partials");
  float* const dsink_mine = scratch.at<float>(3);
  const TensorView dsink_view =
      dsink.empty() ? TensorView{} : device_vector(dsink_mine, hq, m.device_index);

  if (stages == 0 && m.me().sends.empty()) {
    // Nothing received, nothing of this rank's read elsewhere: no partials either way, so dK and
    // dV come straight from the kernel in the caller's dtype. The exchanges (empty here) still
    // start, in the order every rank starts them.
    backward(run.plan, dout, q, columns_view(m, d.k.get(), m.dtype, cols),
             columns_view(m, d.v.get(), m.dtype, cols), out, lse, dq, dk, dv, options, dsink_view);
    t.bwd.computed[0] = t.record(stream, kBwd);
    Exchanges none(exchanges);
    ctx.stats.bwd_bytes_received =
        exchange_in_stream_order(*m.comm, none, stream, /*last_first=*/true);
  } else {
    float* const dkc = scratch.at<float>(0);
    float* const dvc = scratch.at<float>(1);
    auto* const partials = scratch.at<unsigned char>(2);
    // Received columns' partials to their owners; this rank's pieces' partials back from theirs.
    Exchanges x = m.grad_exchanges(reinterpret_cast<unsigned char*>(dkc),
                                   reinterpret_cast<unsigned char*>(dvc), partials, ctx.stats);
    std::vector<std::unique_ptr<CommHandle>> handles(exchanges + 1);
    backward_by_stage(m, t, d, options, dout, q, out, lse, dq, dkc, dvc, x, handles, dsink_view);
    t.bwd.waiting[0] = t.record(stream, kBwd);
    ctx.stats.bwd_bytes_received = 0;
    for (int e = 1; e <= exchanges; ++e) {
      handles[e]->wait_on(stream);
      ctx.stats.bwd_bytes_received += static_cast<std::int64_t>(handles[e]->bytes_received());
    }
    t.bwd.arrived[0] = t.record(stream, kBwd);
    // The owner's sum, in a fixed order (its own partial, then the pieces in plan order), rounded
    // once: the same bits on every run.
    const auto* parts = reinterpret_cast<const float*>(partials);
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
  }
  t.bwd.end = t.record(stream, kBwd);

  if (!dsink.empty()) {  // each rank's rows, then the sum over ranks in rank order
    std::vector<float> mine(hq), all(hq * m.comm->size()), total(hq, 0.f);
    cuda::check(
        cudaMemcpyAsync(mine.data(), dsink_mine, hq * sizeof(float), cudaMemcpyDeviceToHost, s),
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
  run.end_use(stream, kBwd);
}

void read_device_timings(DistContext::State& ctx) {
  if (!ctx.device.timeline) return;
  DeviceTimeline& t = *ctx.device.timeline;
  constexpr const char* kStats = "flexcp::DistContext::stats";
  const cuda::DeviceGuard guard(t.device_index, kStats);
  auto ms = [&](cudaEvent_t a, cudaEvent_t b) {
    cuda::check(cudaEventSynchronize(b), kStats, "waiting for the timed work");
    float v = 0;
    cuda::check(cudaEventElapsedTime(&v, a, b), kStats, "reading a timing event");
    return static_cast<double>(v);
  };
  DistStats& st = ctx.stats;
  // Stages in the order they ran; a stage's compute runs from the event before it in stream order
  // to its `computed`; with `waits_first` (the forward) a stage first waits for its data.
  auto stage_times = [&](const DeviceTimeline::Span& span, const std::vector<int>& order,
                         bool waits_first, std::vector<StageTiming>& out) {
    out.assign(span.computed.size(), {});
    cudaEvent_t last = span.begin;
    for (int s : order) {
      if (waits_first && span.arrived[s] != nullptr) {
        out[s].wait_ms = ms(span.waiting[s], span.arrived[s]);
        last = span.arrived[s];
      }
      if (span.computed[s] != nullptr) {
        out[s].compute_ms = ms(last, span.computed[s]);
        last = span.computed[s];
      }
    }
  };
  if (!t.fwd_read && t.fwd.end != nullptr) {
    std::vector<int> order(t.fwd.computed.size());
    for (std::size_t s = 0; s < order.size(); ++s) order[s] = static_cast<int>(s);
    stage_times(t.fwd, order, true, st.forward);
    st.forward_ms = ms(t.fwd.begin, t.fwd.end);
    t.fwd_read = true;
  }
  if (!t.bwd_read && t.bwd.end != nullptr) {
    std::vector<int> order;  // the last stage first, stage 0 last
    for (int s = static_cast<int>(t.bwd.computed.size()) - 1; s >= 0; --s) order.push_back(s);
    stage_times(t.bwd, order, false, st.backward);
    if (t.bwd.arrived[0] != nullptr)
      st.backward[0].wait_ms = ms(t.bwd.waiting[0], t.bwd.arrived[0]);
    st.backward_ms = ms(t.bwd.begin, t.bwd.end);
    t.bwd_read = true;
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
