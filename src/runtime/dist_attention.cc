// DistAttention: public call -> argument checks -> this rank's plan (constructor) -> per stage:
// wait for that stage's K/V, run the stage's kernel plan, merge through LSE -> write the outputs.
// The forward's gathered K/V go into the context it returns; the backward reads them from there.
#include "flexcp/dist_attention.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/checks.h"
#include "core/dtype.h"
#include "flexcp/status.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/lse_merge.h"
#include "runtime/comm_layout.h"
#include "runtime/dist_impl.h"

namespace flexcp {
namespace {

using runtime::Buffer;
using runtime::CommLayout;
using runtime::Exchanges;
using runtime::Message;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// FNV-1a over the bytes of everything that shapes the plan.
struct Fingerprint {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T& x) {
    add(&x, sizeof x);
  }
};

// Every DistAttention gets its own number, so a context names the object it belongs to.
std::uint64_t next_attention_id() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

}  // namespace

DistContext::DistContext() = default;
DistContext::DistContext(std::unique_ptr<State> state) : state_(std::move(state)) {}
DistContext::DistContext(DistContext&&) noexcept = default;
DistContext& DistContext::operator=(DistContext&&) noexcept = default;
DistContext::~DistContext() = default;
bool DistContext::empty() const {
  return state_ == nullptr;
}
const DistStats& DistContext::stats() const {
  if (!state_)
    throw Error(Status::kInvalidUsage, "flexcp::DistContext::stats: the context is empty");
  runtime::read_device_timings(*state_);  // device tensors: the events, once they are reached
  return state_->stats;
}

struct DistAttention::Impl : runtime::DistCore {};

namespace runtime {

namespace {

// A piece's K and V (or its dK and dV partials): two messages of `bytes` each, to or from `peer`.
template <class Op, class Bytes>
void push_pair(std::vector<Op>& ops, int peer, Bytes* first, Bytes* second, std::size_t bytes,
               int index, Message first_kind, Message second_kind) {
  ops.push_back({peer, first, bytes, CommLayout::tag(index, first_kind)});
  ops.push_back({peer, second, bytes, CommLayout::tag(index, second_kind)});
}

}  // namespace

Exchanges DistCore::kv_exchanges(unsigned char* k_cols, unsigned char* v_cols, DistStats& stats,
                                 const unsigned char* k_own, const unsigned char* v_own) const {
  const std::size_t row = kv_row_bytes();
  if (k_own == nullptr || v_own == nullptr) k_own = k_cols, v_own = v_cols;
  Exchanges x(layout.exchanges);
  for (std::size_t i = 0; i < me().sends.size(); ++i) {
    const SendRange& s = me().sends[i];
    const std::int64_t r = layout.own_row(s.tokens.begin);  // a piece's rows are neighbours
    const std::size_t bytes = s.tokens.size() * row;
    push_pair(x.sends[layout.send_stage[i]], s.dest, k_own + r * row, v_own + r * row, bytes,
              s.index, Message::kK, Message::kV);
    stats.fwd_bytes_sent += 2 * static_cast<std::int64_t>(bytes);
  }
  for (std::size_t i = 0; i < me().recv.size(); ++i) {
    const RemoteRange& r = me().recv[i];
    const std::int64_t col = layout.recv_column[i];
    push_pair(x.recvs[r.stage], r.owner, k_cols + col * row, v_cols + col * row,
              r.tokens.size() * row, r.index, Message::kK, Message::kV);
  }
  return x;
}

std::int64_t DistCore::partial_row(std::size_t piece) const {
  std::int64_t rows = 0;
  for (std::size_t i = 0; i < piece; ++i) rows += 2 * me().sends[i].tokens.size();
  return rows;
}

Exchanges DistCore::grad_exchanges(unsigned char* dk_cols, unsigned char* dv_cols,
                                   unsigned char* partials, DistStats& stats) const {
  const std::size_t row = grad_row_bytes();
  Exchanges x(layout.exchanges);
  for (std::size_t i = 0; i < me().sends.size(); ++i) {
    const SendRange& s = me().sends[i];
    const std::size_t bytes = s.tokens.size() * row;
    unsigned char* at = partials + partial_row(i) * row;
    push_pair(x.recvs[layout.send_stage[i]], s.dest, at, at + bytes, bytes, s.index,
              Message::kGradK, Message::kGradV);
  }
  for (std::size_t i = 0; i < me().recv.size(); ++i) {
    const RemoteRange& r = me().recv[i];
    const std::int64_t col = layout.recv_column[i];
    const std::size_t bytes = r.tokens.size() * row;
    push_pair(x.sends[r.stage], r.owner, dk_cols + col * row, dv_cols + col * row, bytes, r.index,
              Message::kGradK, Message::kGradV);
    stats.bwd_bytes_sent += 2 * static_cast<std::int64_t>(bytes);
  }
  return x;
}

}  // namespace runtime

DistAttention::DistAttention(const Mask& mask, Communicator& comm, std::int64_t heads_q,
                             std::int64_t heads_kv, std::int64_t head_dim, DType dtype,
                             const DistAttentionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const ArgChecker c("flexcp::DistAttention");
  m.id = next_attention_id();
  m.comm = &comm;
  m.heads_q = heads_q;
  m.heads_kv = heads_kv;
  m.head_dim = head_dim;
  m.dtype = dtype;
  if (heads_q < 1 || heads_kv < 1 || head_dim < 1 || heads_q % heads_kv != 0)
    c.fail("heads_q " + std::to_string(heads_q) + ", heads_kv " + std::to_string(heads_kv) +
           ", head_dim " + std::to_string(head_dim) +
           ": expected positive sizes with heads_q a multiple of heads_kv");
  if (dtype == DType::kFloat64) c.fail("dtype fp64: expected fp32, bf16 or fp16");
  m.device = options.plan.device;
  m.device_index = options.plan.device_index;
  auto memory = [](Device d) { return d == Device::kCuda ? "device" : "host"; };
  if (m.device != comm.memory())
    c.fail(std::string("plan.device is ") + (m.device == Device::kCuda ? "cuda" : "cpu") +
           " but the communicator moves " + memory(comm.memory()) + " memory; expected " +
           memory(m.device) + " memory (local or mpi for cpu, nccl or staged for cuda)");
  PlanOptions po = options.plan;
  po.world_size = comm.size();
  po.heads_q = heads_q;
  po.heads_kv = heads_kv;
  po.head_dim = head_dim;
  po.dtype = dtype;
  po.device = Device::kCpu;

  // Every rank must plan the same problem: compare fingerprints before any data moves.
  Fingerprint fp;
  const std::string spec = mask.to_json();
  fp.add(spec.data(), spec.size());
  for (std::int64_t x :
       {heads_q, heads_kv, head_dim, po.chunk_size, po.chunks_per_rank,
        static_cast<std::int64_t>(dtype), static_cast<std::int64_t>(po.gpus_per_node),
        static_cast<std::int64_t>(po.num_stages), static_cast<std::int64_t>(m.device)})
    fp.add(x);
  for (double x : {po.cost.kernel_tflops, po.cost.intra_node_gbps, po.cost.inter_node_gbps,
                   po.cost.stage_overhead_us})
    fp.add(x);
  std::vector<std::uint64_t> all(comm.size());
  comm.all_gather(&fp.h, sizeof fp.h, all.data());
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0])
      throw Error(Status::kInvalidUsage,
                  "flexcp::DistAttention: rank " + std::to_string(r) +
                      "'s mask, shapes or options differ from rank 0's; every rank must plan "
                      "the same problem");

  m.plan = make_plan(mask, po, comm.rank());
  m.layout = runtime::make_comm_layout(m.plan.rank);
  runtime::learn_send_stages(m.layout, m.plan.rank, comm);
  m.positions = m.plan.dispatch.position_ids(comm.rank());
  if (m.device == Device::kCuda) m.device_run = runtime::make_device_run(m);
}

DistAttention::~DistAttention() = default;

const Plan& DistAttention::plan() const {
  return impl_->plan;
}
int DistAttention::rank() const {
  return impl_->comm->rank();
}
std::int64_t DistAttention::local_q_tokens() const {
  return impl_->q_rows();
}
std::int64_t DistAttention::local_k_tokens() const {
  return impl_->layout.own_columns;
}
std::vector<std::int64_t> DistAttention::position_ids() const {
  return impl_->positions;
}

namespace {

// Copies rows between a global [T, H, D] tensor and local rows listed by global index.
void copy_rows(const TensorView& from, const TensorView& to, const std::vector<std::int64_t>& rows,
               bool gather) {
  const std::size_t row = static_cast<std::size_t>(from.strides[0]) * dtype_size(from.dtype);
  auto* src = static_cast<const unsigned char*>(from.data);
  auto* dst = static_cast<unsigned char*>(to.data);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (gather)
      std::memcpy(dst + i * row, src + rows[i] * row, row);
    else
      std::memcpy(dst + rows[i] * row, src + i * row, row);
  }
}

std::vector<std::int64_t> own_kv_tokens(const CommLayout& layout) {
  std::vector<std::int64_t> t;
  for (const Range& r : layout.own_ranges)
    for (std::int64_t x = r.begin; x < r.end; ++x) t.push_back(x);
  return t;
}

// A global tensor and a local one of the same heads, dim and dtype, in host memory, contiguous.
void check_pair(const ArgChecker& c, const TensorView& global, const TensorView& local,
                std::int64_t total, std::int64_t rows) {
  c.dims("global", global, 3, "[T, H, D]");
  c.tensor("global", global, {total, global.shape[1], global.shape[2]}, "[T, H, D]", global.dtype,
           Device::kCpu);
  c.tensor("local", local, {rows, global.shape[1], global.shape[2]}, "[T_local, H, D]",
           global.dtype, Device::kCpu);
  c.contiguous("global", global);
  c.contiguous("local", local);
}

std::int64_t total_k_tokens(const Dispatch& d) {
  std::int64_t total = 0;
  for (const Range& r : d.kv_chunks) total += r.size();
  return total;
}

}  // namespace

void DistAttention::dispatch_q(const TensorView& global, const TensorView& local) const {
  check_pair(ArgChecker("flexcp::DistAttention::dispatch_q"), global, local,
             impl_->plan.dispatch.chunks.back().end, local_q_tokens());
  copy_rows(global, local, impl_->positions, true);
}

void DistAttention::dispatch_kv(const TensorView& global, const TensorView& local) const {
  check_pair(ArgChecker("flexcp::DistAttention::dispatch_kv"), global, local,
             total_k_tokens(impl_->plan.dispatch), local_k_tokens());
  copy_rows(global, local, own_kv_tokens(impl_->layout), true);
}

void DistAttention::undispatch_q(const TensorView& local, const TensorView& global) {
  const Dispatch& d = impl_->plan.dispatch;
  check_pair(ArgChecker("flexcp::DistAttention::undispatch_q"), global, local, d.chunks.back().end,
             local_q_tokens());
  const std::size_t row = static_cast<std::size_t>(local.strides[0]) * dtype_size(local.dtype);
  std::vector<std::size_t> counts;
  std::vector<std::int64_t> order;
  for (int r = 0; r < d.world_size; ++r) {
    const auto ids = d.position_ids(r);
    counts.push_back(ids.size() * row);
    order.insert(order.end(), ids.begin(), ids.end());
  }
  std::vector<unsigned char> all(row * global.shape[0]);
  impl_->comm->all_gather_v(local.data, counts, all.data());
  copy_rows(make_view(all.data(), local.dtype, {global.shape[0], global.shape[1], global.shape[2]}),
            global, order, false);
}

void DistAttention::undispatch_kv(const TensorView& local, const TensorView& global) {
  const Dispatch& d = impl_->plan.dispatch;
  const std::int64_t total = total_k_tokens(d);
  check_pair(ArgChecker("flexcp::DistAttention::undispatch_kv"), global, local, total,
             local_k_tokens());
  const std::size_t row = static_cast<std::size_t>(local.strides[0]) * dtype_size(local.dtype);
  std::vector<std::size_t> counts(d.world_size, 0);
  std::vector<std::vector<std::int64_t>> tokens(d.world_size);
  for (std::size_t c = 0; c < d.kv_chunks.size(); ++c) {
    counts[d.kv_owner[c]] += d.kv_chunks[c].size() * row;
    for (std::int64_t t = d.kv_chunks[c].begin; t < d.kv_chunks[c].end; ++t)
      tokens[d.kv_owner[c]].push_back(t);
  }
  std::vector<std::int64_t> order;
  for (const auto& t : tokens) order.insert(order.end(), t.begin(), t.end());
  std::vector<unsigned char> all(row * total);
  impl_->comm->all_gather_v(local.data, counts, all.data());
  copy_rows(make_view(all.data(), local.dtype, {total, global.shape[1], global.shape[2]}), global,
            order, false);
}

void DistAttention::gather_kv(const TensorView& k, const TensorView& v, const TensorView& k_buffer,
                              const TensorView& v_buffer) {
  Impl& m = *impl_;
  const ArgChecker c("flexcp::DistAttention::gather_kv");
  m.check_local(c, "k", k, m.layout.own_columns, m.heads_kv);
  m.check_local(c, "v", v, m.layout.own_columns, m.heads_kv);
  m.check_local(c, "k_buffer", k_buffer, m.layout.total_columns, m.heads_kv);
  m.check_local(c, "v_buffer", v_buffer, m.layout.total_columns, m.heads_kv);
  c.no_alias({{"k_buffer", &k_buffer}, {"v_buffer", &v_buffer}},
             {{"k", &k}, {"v", &v}, {"k_buffer", &k_buffer}, {"v_buffer", &v_buffer}});
  if (m.device == Device::kCuda) {
    runtime::device_gather_kv(m, k, v, k_buffer, v_buffer);
    return;
  }
  const std::size_t own = m.layout.own_columns * m.kv_row_bytes();
  std::memcpy(k_buffer.data, k.data, own);
  std::memcpy(v_buffer.data, v.data, own);
  DistStats stats;
  Exchanges x = m.kv_exchanges(static_cast<unsigned char*>(k_buffer.data),
                               static_cast<unsigned char*>(v_buffer.data), stats);
  for (int s = 1; s <= m.layout.exchanges; ++s) m.comm->start(x.sends[s], x.recvs[s])->wait();
}

DistContext DistAttention::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse,
                                   const AttentionOptions& options) {
  Impl& m = *impl_;
  const auto t_all = std::chrono::steady_clock::now();
  const ArgChecker c("flexcp::DistAttention::forward");
  const std::int64_t tq = m.q_rows(), hq = m.heads_q, dim = m.head_dim;
  m.check_local(c, "q", q, tq, hq);
  m.check_local(c, "k", k, m.layout.own_columns, m.heads_kv);
  m.check_local(c, "v", v, m.layout.own_columns, m.heads_kv);
  m.check_local(c, "out", out, tq, hq);
  m.check_lse(c, lse);
  m.check_options(c, options);
  c.no_alias({{"out", &out}, {"lse", &lse}},
             {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});

  auto state = std::make_unique<DistContext::State>();
  state->owner = m.id;
  state->scale = options.scale;
  state->softcap = options.softcap;
  state->deterministic = options.deterministic;
  if (m.device == Device::kCuda) {
    runtime::device_forward(m, *state, q, k, v, out, lse, options);  // timed on the device
    return DistContext(std::move(state));
  }
  if (!options.sink.empty())
    state->sink.assign(static_cast<const float*>(options.sink.data),
                       static_cast<const float*>(options.sink.data) + hq);
  state->k = Buffer(m.dtype, m.layout.total_columns, m.heads_kv, dim);
  state->v = Buffer(m.dtype, m.layout.total_columns, m.heads_kv, dim);
  DistStats& stats = state->stats;
  const int stages = m.me().num_stages;
  stats.forward.assign(stages + 1, {});
  // Sends read the own rows in the column buffers: copied in first.
  std::memcpy(state->k.bytes.data(), k.data, m.layout.own_columns * m.kv_row_bytes());
  std::memcpy(state->v.bytes.data(), v.data, m.layout.own_columns * m.kv_row_bytes());
  Exchanges x = m.kv_exchanges(state->k.bytes.data(), state->v.bytes.data(), stats);
  std::vector<std::unique_ptr<CommHandle>> handles(m.layout.exchanges + 1);
  for (int s = 1; s <= m.layout.exchanges; ++s) handles[s] = m.comm->start(x.sends[s], x.recvs[s]);

  // Partial results of each stage merge into fp32 accumulators through their LSE; the sink joins
  // the denominator once, after the merge.
  AttentionOptions partial = options;
  partial.sink = {};
  Buffer acc(DType::kFloat32, tq, hq, dim), part(DType::kFloat32, tq, hq, dim);
  std::vector<float> acc_lse(tq * hq, kNegInf), part_lse(tq * hq);
  const TensorView part_lse_view = make_view(part_lse.data(), DType::kFloat32, {tq, hq});
  for (int s = 0; s <= stages; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    if (s > 0) {
      handles[s]->wait();
      stats.fwd_bytes_received += static_cast<std::int64_t>(handles[s]->bytes_received());
    }
    stats.forward[s].wait_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (m.me().stage_plans[s].area() > 0) {
      cpu::forward(m.stage_shape(s, options.scale), m.me().stage_plans[s].impl(), q, state->k.view,
                   state->v.view, part.view, part_lse_view, partial);
      float* o = acc.f32();
      const float* po = part.f32();
      for (std::int64_t i = 0; i < tq * hq; ++i) {
        if (part_lse[i] == kNegInf) continue;
        const LseMerge mg = merge_lse(acc_lse[i], part_lse[i]);
        for (std::int64_t d = 0; d < dim; ++d)
          o[i * dim + d] = mg.weight_a * o[i * dim + d] + mg.weight_b * po[i * dim + d];
        acc_lse[i] = mg.lse;
      }
    }
    stats.forward[s].compute_ms = ms_since(t0);
  }
  for (int s = stages + 1; s <= m.layout.exchanges; ++s) handles[s]->wait();  // sends only
  // Sink, then the outputs in their dtypes; a row with no attended key keeps out = 0, lse = -inf.
  const float* sink = state->sink.empty() ? nullptr : state->sink.data();
  float* o = acc.f32();
  for (std::int64_t i = 0; i < tq * hq; ++i) {
    float l = acc_lse[i];
    if (sink && l != kNegInf) {
      const LseMerge mg = merge_lse(l, sink[i % hq]);
      for (std::int64_t d = 0; d < dim; ++d) o[i * dim + d] *= mg.weight_a;
      l = mg.lse;
    }
    static_cast<float*>(lse.data)[i] = l;
    for (std::int64_t d = 0; d < dim; ++d)
      store_float(out.data, m.dtype, i * dim + d, o[i * dim + d]);
  }
  stats.forward_ms = ms_since(t_all);
  return DistContext(std::move(state));
}

void DistAttention::backward(DistContext& context, const TensorView& dout, const TensorView& q,
                             const TensorView& out, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const TensorView& dsink) {
  Impl& m = *impl_;
  const auto t_all = std::chrono::steady_clock::now();
  const ArgChecker c("flexcp::DistAttention::backward");
  if (context.empty())
    throw Error(Status::kInvalidUsage,
                c.fn() + ": the context is empty; pass the one this object's forward returned");
  DistContext::State& ctx = *context.state_;
  if (ctx.owner != m.id)
    throw Error(Status::kInvalidUsage,
                c.fn() +
                    ": the context comes from another DistAttention; a backward takes the "
                    "context of a forward of the same object");
  const std::int64_t tq = m.q_rows(), own = m.layout.own_columns, cols = m.layout.total_columns;
  const std::int64_t hq = m.heads_q, hk = m.heads_kv, dim = m.head_dim;
  for (auto [name, t] : {std::pair{"dout", &dout}, {"q", &q}, {"out", &out}, {"dq", &dq}})
    m.check_local(c, name, *t, tq, hq);
  m.check_lse(c, lse);
  for (auto [name, t] : {std::pair{"dk", &dk}, {"dv", &dv}}) m.check_local(c, name, *t, own, hk);
  const AttentionOptions options = ctx.options();
  if (!dsink.empty()) {
    if (options.sink.empty()) c.fail("dsink was given but its forward had no sink");
    c.tensor("dsink", dsink, {hq}, "[Hq]", DType::kFloat32, m.device, m.device_index);
    c.contiguous("dsink", dsink);
  }
  c.no_alias({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dsink", &dsink}}, {{"dout", &dout},
                                                                          {"q", &q},
                                                                          {"out", &out},
                                                                          {"lse", &lse},
                                                                          {"dq", &dq},
                                                                          {"dk", &dk},
                                                                          {"dv", &dv},
                                                                          {"dsink", &dsink}});
  DistStats& stats = ctx.stats;
  stats.bwd_bytes_received = stats.bwd_bytes_sent = 0;
  if (m.device == Device::kCuda) {
    runtime::device_backward(m, ctx, dout, q, out, lse, dq, dk, dv, dsink);  // timed on the device
    return;
  }
  const int stages = m.me().num_stages;
  stats.backward.assign(stages + 1, {});

  AttentionOptions partial = options;
  partial.sink = {};
  Buffer dq_acc(DType::kFloat32, tq, hq, dim), dq_part(DType::kFloat32, tq, hq, dim);
  Buffer dk_acc(DType::kFloat32, cols, hk, dim), dv_acc(DType::kFloat32, cols, hk, dim);
  Buffer dk_part(DType::kFloat32, cols, hk, dim), dv_part(DType::kFloat32, cols, hk, dim);
  Buffer partials(DType::kFloat32, m.partial_rows(), hk, dim);
  // Exchange s starts once stage s has run: its received columns are final then.
  Exchanges x =
      m.grad_exchanges(dk_acc.bytes.data(), dv_acc.bytes.data(), partials.bytes.data(), stats);
  std::vector<std::unique_ptr<CommHandle>> reduce(m.layout.exchanges + 1);
  for (int s = 0; s <= m.layout.exchanges; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (s <= stages && m.me().stage_plans[s].area() > 0) {
      cpu::backward(m.stage_shape(s, options.scale), m.me().stage_plans[s].impl(), dout, q,
                    ctx.k.view, ctx.v.view, out, lse, dq_part.view, dk_part.view, dv_part.view,
                    partial, {});
      for (auto [acc, part, n] : {std::tuple{&dq_acc, &dq_part, tq * hq * dim},
                                  {&dk_acc, &dk_part, cols * hk * dim},
                                  {&dv_acc, &dv_part, cols * hk * dim}}) {
        float* a = acc->f32();
        const float* p = part->f32();
        for (std::int64_t i = 0; i < n; ++i) a[i] += p[i];
      }
    }
    if (s <= stages) stats.backward[s].compute_ms = ms_since(t0);
    if (s > 0) reduce[s] = m.comm->start(x.sends[s], x.recvs[s]);
  }
  for (int s = 1; s <= m.layout.exchanges; ++s) {
    reduce[s]->wait();
    stats.bwd_bytes_received += static_cast<std::int64_t>(reduce[s]->bytes_received());
  }
  // Sum the partials in a fixed order (destinations, then pieces): deterministic.
  for (std::size_t i = 0; i < m.me().sends.size(); ++i) {
    const SendRange& s = m.me().sends[i];
    const std::int64_t first = m.partial_row(i);
    for (std::int64_t t = s.tokens.begin; t < s.tokens.end; ++t) {
      const std::int64_t r = m.layout.own_row(t);
      const float* pk = reinterpret_cast<const float*>(partials.row(first + t - s.tokens.begin));
      const float* pv = reinterpret_cast<const float*>(
          partials.row(first + s.tokens.size() + (t - s.tokens.begin)));
      float* ak = reinterpret_cast<float*>(dk_acc.row(r));
      float* av = reinterpret_cast<float*>(dv_acc.row(r));
      for (std::int64_t j = 0; j < hk * dim; ++j) ak[j] += pk[j], av[j] += pv[j];
    }
  }
  for (std::int64_t i = 0; i < tq * hq * dim; ++i)
    store_float(dq.data, m.dtype, i, dq_acc.f32()[i]);
  for (std::int64_t i = 0; i < own * hk * dim; ++i) {
    store_float(dk.data, m.dtype, i, dk_acc.f32()[i]);
    store_float(dv.data, m.dtype, i, dv_acc.f32()[i]);
  }
  if (!dsink.empty()) {
    // Each rank's rows, then the sum over ranks in rank order (deterministic).
    std::vector<float> mine(hq), all(hq * m.comm->size());
    CallShape shape;
    static_cast<AttentionShape&>(shape) = m.me().stage_plans[0].shape();
    cpu::sink_gradient(shape, dout, out, lse, options,
                       make_view(mine.data(), DType::kFloat32, {hq}));
    m.comm->all_gather(mine.data(), mine.size() * sizeof(float), all.data());
    for (std::int64_t h = 0; h < hq; ++h) {
      float total = 0;
      for (int r = 0; r < m.comm->size(); ++r) total += all[r * hq + h];
      static_cast<float*>(dsink.data)[h] = total;
    }
  }
  stats.backward_ms = ms_since(t_all);
}

}  // namespace flexcp
