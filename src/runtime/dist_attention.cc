// DistAttention: public call -> shape checks -> plan (constructor) -> per stage: wait for that
// stage's K/V, run the CPU kernel on its local work, merge through LSE -> write the outputs.
#include "flexcp/dist_attention.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/checks.h"
#include "core/dtype.h"
#include "flexcp/status.h"
#include "kernels/cpu/cpu_attention.h"
#include "runtime/comm_layout.h"

namespace flexcp {
namespace {

using runtime::CommLayout;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[noreturn]] void fail(Status status, const std::string& message) {
  throw Error(status, "flexcp::DistAttention: " + message);
}

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

// A contiguous owned buffer with a [rows, heads, dim] view.
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
  Buffer(DType dtype, std::int64_t rows, std::int64_t heads) {
    bytes.assign(
        static_cast<std::size_t>(std::max<std::int64_t>(rows * heads, 1)) * dtype_size(dtype), 0);
    view = make_view(bytes.data(), dtype, {rows, heads});
  }
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  std::size_t row_bytes() const {
    return static_cast<std::size_t>(view.strides[0]) * dtype_size(view.dtype);
  }
  unsigned char* row(std::int64_t r) { return bytes.data() + r * row_bytes(); }
};

void require_contiguous(const char* fn, const char* name, const TensorView& t) {
  if (!t.is_contiguous())
    fail(Status::kInvalidArgument, std::string(fn) + ": " + name + " must be contiguous");
}

}  // namespace

struct DistAttention::Impl {
  Communicator* comm = nullptr;
  Plan plan;
  CommLayout layout;
  std::int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  DType dtype = DType::kFloat32;
  AttentionOptions attention;
  std::vector<std::int64_t> positions;  // global q token of each local row
  Buffer k_buf, v_buf;                  // K/V columns of the last forward, reused by backward
  bool have_kv = false;
  DistStats stats;

  std::size_t kv_row_bytes() const {
    return static_cast<std::size_t>(heads_kv * head_dim) * dtype_size(dtype);
  }

  void check_local(const char* fn, const char* name, const TensorView& t, std::int64_t rows,
                   std::int64_t heads, DType want) const {
    if (t.ndim != 3 || t.shape[0] != rows || t.shape[1] != heads || t.shape[2] != head_dim)
      fail(Status::kInvalidArgument, std::string(fn) + ": " + name + " has shape " +
                                         t.shape_string() + ", expected [" + std::to_string(rows) +
                                         ", " + std::to_string(heads) + ", " +
                                         std::to_string(head_dim) + "]");
    if (t.dtype != want)
      fail(Status::kInvalidArgument, std::string(fn) + ": " + name + " has dtype " +
                                         dtype_name(t.dtype) + ", expected " + dtype_name(want));
    require_contiguous(fn, name, t);
  }

  AttentionShape kernel_shape(std::int64_t columns) const {
    AttentionShape s;
    s.seqlen_q = plan.ranks[comm->rank()].num_q_tokens;
    s.seqlen_k = columns;
    s.heads_q = heads_q;
    s.heads_kv = heads_kv;
    s.head_dim = head_dim;
    s.dtype = dtype;
    s.scale =
        attention.scale != 0 ? attention.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
    return s;
  }

  // Group-cast of K/V along the layout: own rows first, then each received item lands at its
  // column; returns one handle per stage (index 0: the sends).
  std::vector<std::unique_ptr<CommHandle>> start_kv_exchange(const TensorView& k,
                                                             const TensorView& v,
                                                             std::vector<unsigned char>& packed) {
    const std::size_t row = kv_row_bytes();
    k_buf = Buffer(dtype, layout.total_columns, heads_kv, head_dim);
    v_buf = Buffer(dtype, layout.total_columns, heads_kv, head_dim);
    std::memcpy(k_buf.bytes.data(), k.data, layout.own_columns * row);
    std::memcpy(v_buf.bytes.data(), v.data, layout.own_columns * row);
    // Each item is packed once ([K rows][V rows]) and sent to every destination.
    std::size_t total = 0;
    for (const auto& s : layout.sends) total += 2 * s.tokens.size() * row;
    packed.assign(total, 0);
    std::vector<SendOp> sends;
    std::size_t offset = 0;
    for (const auto& s : layout.sends) {
      unsigned char* kpart = packed.data() + offset;
      unsigned char* vpart = kpart + s.tokens.size() * row;
      for (std::int64_t t = s.tokens.begin; t < s.tokens.end; ++t) {
        const std::int64_t r = layout.own_row(t);
        std::memcpy(kpart + (t - s.tokens.begin) * row, k_buf.row(r), row);
        std::memcpy(vpart + (t - s.tokens.begin) * row, v_buf.row(r), row);
      }
      for (int d : s.dests) {
        sends.push_back({d, kpart, s.tokens.size() * row, CommLayout::tag_k(s.item)});
        sends.push_back({d, vpart, s.tokens.size() * row, CommLayout::tag_v(s.item)});
        stats.fwd_bytes_sent += 2 * s.tokens.size() * row;
      }
      offset += 2 * s.tokens.size() * row;
    }
    const int stages = plan.num_stages;
    std::vector<std::vector<RecvOp>> recvs(stages + 1);
    for (const auto& r : layout.recvs) {
      recvs[r.stage].push_back(
          {r.owner, k_buf.row(r.column), r.tokens.size() * row, CommLayout::tag_k(r.item)});
      recvs[r.stage].push_back(
          {r.owner, v_buf.row(r.column), r.tokens.size() * row, CommLayout::tag_v(r.item)});
      stats.fwd_bytes_received += 2 * r.tokens.size() * row;
    }
    std::vector<std::unique_ptr<CommHandle>> handles;
    handles.push_back(comm->start(sends, {}));
    for (int s = 1; s <= stages; ++s) handles.push_back(comm->start({}, recvs[s]));
    have_kv = true;
    return handles;
  }
};

DistAttention::DistAttention(const Mask& mask, Communicator& comm, std::int64_t heads_q,
                             std::int64_t heads_kv, std::int64_t head_dim, DType dtype,
                             const DistAttentionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.comm = &comm;
  m.heads_q = heads_q;
  m.heads_kv = heads_kv;
  m.head_dim = head_dim;
  m.dtype = dtype;
  m.attention = options.attention;
  if (heads_q < 1 || heads_kv < 1 || head_dim < 1 || heads_q % heads_kv != 0)
    fail(Status::kInvalidArgument,
         "heads_q " + std::to_string(heads_q) + ", heads_kv " + std::to_string(heads_kv) +
             ", head_dim " + std::to_string(head_dim) +
             ": expected positive sizes with heads_q a multiple of heads_kv");
  if (dtype == DType::kFloat64)
    fail(Status::kInvalidArgument, "dtype fp64: expected fp32, bf16 or fp16");
  if (!options.attention.sink.empty() &&
      (options.attention.sink.ndim != 1 || options.attention.sink.shape[0] != heads_q ||
       options.attention.sink.dtype != DType::kFloat32))
    fail(Status::kInvalidArgument, "sink must be fp32 [" + std::to_string(heads_q) + "]");
  PlanOptions po = options.plan;
  po.world_size = comm.size();
  po.heads_q = heads_q;
  po.heads_kv = heads_kv;
  po.head_dim = head_dim;
  po.element_bytes = static_cast<std::int64_t>(dtype_size(dtype));

  // Every rank must plan the same problem: compare fingerprints before any data moves.
  Fingerprint fp;
  const std::string spec = mask.to_json();
  fp.add(spec.data(), spec.size());
  for (std::int64_t x :
       {heads_q, heads_kv, head_dim, po.chunk_size, static_cast<std::int64_t>(dtype),
        static_cast<std::int64_t>(po.gpus_per_node), static_cast<std::int64_t>(po.num_stages)})
    fp.add(x);
  for (double x : {options.attention.scale, options.attention.softcap, po.cost.kernel_tflops,
                   po.cost.intra_node_gbps, po.cost.inter_node_gbps, po.cost.stage_overhead_us})
    fp.add(x);
  std::vector<std::uint64_t> all(comm.size());
  comm.all_gather(&fp.h, sizeof fp.h, all.data());
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0])
      fail(Status::kInvalidUsage, "rank " + std::to_string(r) +
                                      "'s mask, shapes or options differ from rank 0's; every rank "
                                      "must plan the same problem");

  m.plan = make_plan(mask, po);
  m.layout = runtime::make_comm_layout(m.plan, comm.rank());
  m.positions = m.plan.position_ids(comm.rank());
}

DistAttention::~DistAttention() = default;

const Plan& DistAttention::plan() const {
  return impl_->plan;
}
int DistAttention::rank() const {
  return impl_->comm->rank();
}
std::int64_t DistAttention::local_q_tokens() const {
  return impl_->plan.ranks[rank()].num_q_tokens;
}
std::int64_t DistAttention::local_k_tokens() const {
  return impl_->layout.own_columns;
}
std::vector<std::int64_t> DistAttention::position_ids() const {
  return impl_->positions;
}
const DistStats& DistAttention::stats() const {
  return impl_->stats;
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

void check_pair(const char* fn, const TensorView& global, const TensorView& local,
                std::int64_t total, std::int64_t rows) {
  if (global.ndim != 3 || local.ndim != 3 || global.shape[0] != total || local.shape[0] != rows ||
      global.shape[1] != local.shape[1] || global.shape[2] != local.shape[2] ||
      global.dtype != local.dtype)
    fail(Status::kInvalidArgument,
         std::string(fn) + ": global " + global.shape_string() + " and local " +
             local.shape_string() + " do not match (" + std::to_string(total) + " global and " +
             std::to_string(rows) + " local tokens, same heads, dim, dtype)");
  require_contiguous(fn, "global", global);
  require_contiguous(fn, "local", local);
}

}  // namespace

void DistAttention::dispatch_q(const TensorView& global, const TensorView& local) const {
  check_pair("dispatch_q", global, local, impl_->plan.chunks.back().end, local_q_tokens());
  copy_rows(global, local, impl_->positions, true);
}

void DistAttention::dispatch_kv(const TensorView& global, const TensorView& local) const {
  const std::vector<std::int64_t> tokens = own_kv_tokens(impl_->layout);
  std::int64_t total = 0;
  for (const RankPlan& r : impl_->plan.ranks) total += r.num_k_tokens;
  check_pair("dispatch_kv", global, local, total, local_k_tokens());
  copy_rows(global, local, tokens, true);
}

void DistAttention::undispatch_q(const TensorView& local, const TensorView& global) {
  const Plan& p = impl_->plan;
  check_pair("undispatch_q", global, local, p.chunks.back().end, local_q_tokens());
  const std::size_t row = static_cast<std::size_t>(local.strides[0]) * dtype_size(local.dtype);
  std::vector<std::size_t> counts;
  for (const RankPlan& r : p.ranks) counts.push_back(r.num_q_tokens * row);
  std::vector<unsigned char> all(row * global.shape[0]);
  impl_->comm->all_gather_v(local.data, counts, all.data());
  std::vector<std::int64_t> order;
  for (int r = 0; r < static_cast<int>(p.ranks.size()); ++r) {
    const auto ids = p.position_ids(r);
    order.insert(order.end(), ids.begin(), ids.end());
  }
  copy_rows(make_view(all.data(), local.dtype, {global.shape[0], global.shape[1], global.shape[2]}),
            global, order, false);
}

void DistAttention::undispatch_kv(const TensorView& local, const TensorView& global) {
  const Plan& p = impl_->plan;
  std::int64_t total = 0;
  for (const RankPlan& r : p.ranks) total += r.num_k_tokens;
  check_pair("undispatch_kv", global, local, total, local_k_tokens());
  const std::size_t row = static_cast<std::size_t>(local.strides[0]) * dtype_size(local.dtype);
  std::vector<std::size_t> counts;
  std::vector<std::int64_t> order;
  for (const RankPlan& r : p.ranks) {
    counts.push_back(r.num_k_tokens * row);
    for (const Range& k : r.k_tokens)
      for (std::int64_t t = k.begin; t < k.end; ++t) order.push_back(t);
  }
  std::vector<unsigned char> all(row * total);
  impl_->comm->all_gather_v(local.data, counts, all.data());
  copy_rows(make_view(all.data(), local.dtype, {total, global.shape[1], global.shape[2]}), global,
            order, false);
}

void DistAttention::gather_kv(const TensorView& k, const TensorView& v, const TensorView& k_buffer,
                              const TensorView& v_buffer) {
  Impl& m = *impl_;
  m.check_local("gather_kv", "k", k, m.layout.own_columns, m.heads_kv, m.dtype);
  m.check_local("gather_kv", "v", v, m.layout.own_columns, m.heads_kv, m.dtype);
  m.check_local("gather_kv", "k_buffer", k_buffer, m.layout.total_columns, m.heads_kv, m.dtype);
  m.check_local("gather_kv", "v_buffer", v_buffer, m.layout.total_columns, m.heads_kv, m.dtype);
  std::vector<unsigned char> packed;
  auto handles = m.start_kv_exchange(k, v, packed);
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) (*it)->wait();
  std::memcpy(k_buffer.data, m.k_buf.bytes.data(), m.layout.total_columns * m.kv_row_bytes());
  std::memcpy(v_buffer.data, m.v_buf.bytes.data(), m.layout.total_columns * m.kv_row_bytes());
}

void DistAttention::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse) {
  Impl& m = *impl_;
  const auto t_all = std::chrono::steady_clock::now();
  const std::int64_t tq = local_q_tokens();
  m.check_local("forward", "q", q, tq, m.heads_q, m.dtype);
  m.check_local("forward", "k", k, m.layout.own_columns, m.heads_kv, m.dtype);
  m.check_local("forward", "v", v, m.layout.own_columns, m.heads_kv, m.dtype);
  m.check_local("forward", "out", out, tq, m.heads_q, m.dtype);
  if (lse.ndim != 2 || lse.shape[0] != tq || lse.shape[1] != m.heads_q ||
      lse.dtype != DType::kFloat32 || !lse.is_contiguous())
    fail(Status::kInvalidArgument, "forward: lse has shape " + lse.shape_string() +
                                       ", expected contiguous fp32 [" + std::to_string(tq) + ", " +
                                       std::to_string(m.heads_q) + "]");
  m.stats.forward.assign(m.plan.num_stages + 1, {});
  std::vector<unsigned char> packed;
  auto handles = m.start_kv_exchange(k, v, packed);

  // Partial results of each stage merge into fp32 accumulators through their LSE.
  const AttentionShape shape = m.kernel_shape(m.layout.total_columns);
  AttentionOptions partial = m.attention;
  partial.sink = {};  // the sink joins the denominator once, after the merge
  Buffer acc(DType::kFloat32, tq, m.heads_q, m.head_dim), acc_lse(DType::kFloat32, tq, m.heads_q);
  Buffer part(DType::kFloat32, tq, m.heads_q, m.head_dim), part_lse(DType::kFloat32, tq, m.heads_q);
  std::fill(acc_lse.f32(), acc_lse.f32() + tq * m.heads_q, kNegInf);
  const RankPlan& rp = m.plan.ranks[rank()];
  for (int s = 0; s <= m.plan.num_stages; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    if (s > 0) handles[s]->wait();
    m.stats.forward[s].wait_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (!rp.stage_work[s].empty()) {
      cpu::forward(shape, q, m.k_buf.view, m.v_buf.view, rp.stage_work[s], part.view, part_lse.view,
                   partial);
      float* o = acc.f32();
      float* l = acc_lse.f32();
      const float* po = part.f32();
      const float* pl = part_lse.f32();
      for (std::int64_t i = 0; i < tq * m.heads_q; ++i) {
        if (pl[i] == kNegInf) continue;
        const float mx = std::max(l[i], pl[i]);
        const float merged = mx + std::log(std::exp(l[i] - mx) + std::exp(pl[i] - mx));
        const float wa = l[i] == kNegInf ? 0.0f : std::exp(l[i] - merged),
                    wb = std::exp(pl[i] - merged);
        for (std::int64_t d = 0; d < m.head_dim; ++d)
          o[i * m.head_dim + d] = wa * o[i * m.head_dim + d] + wb * po[i * m.head_dim + d];
        l[i] = merged;
      }
    }
    m.stats.forward[s].compute_ms = ms_since(t0);
  }
  handles[0]->wait();
  // Sink, then the outputs in their dtypes; a row with no attended key keeps out = 0, lse = -inf.
  const float* sink = static_cast<const float*>(m.attention.sink.data);
  float* o = acc.f32();
  float* l = acc_lse.f32();
  for (std::int64_t i = 0; i < tq * m.heads_q; ++i) {
    if (sink && l[i] != kNegInf) {
      const float sk = sink[i % m.heads_q];
      const float total = std::max(l[i], sk) + std::log1p(std::exp(-std::abs(l[i] - sk)));
      const float w = std::exp(l[i] - total);
      for (std::int64_t d = 0; d < m.head_dim; ++d) o[i * m.head_dim + d] *= w;
      l[i] = total;
    }
    static_cast<float*>(lse.data)[i] = l[i];
    for (std::int64_t d = 0; d < m.head_dim; ++d)
      store_float(out.data, m.dtype, i * m.head_dim + d, o[i * m.head_dim + d]);
  }
  m.stats.forward_ms = ms_since(t_all);
}

void DistAttention::backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& out, const TensorView& lse,
                             const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dsink) {
  Impl& m = *impl_;
  const auto t_all = std::chrono::steady_clock::now();
  const std::int64_t tq = local_q_tokens(), own = m.layout.own_columns,
                     cols = m.layout.total_columns;
  if (!m.have_kv)
    fail(Status::kInvalidUsage, "backward: call forward first (backward reuses its K/V)");
  for (auto [name, t] : {std::pair{"dout", &dout}, {"q", &q}, {"out", &out}, {"dq", &dq}})
    m.check_local("backward", name, *t, tq, m.heads_q, m.dtype);
  for (auto [name, t] : {std::pair{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}})
    m.check_local("backward", name, *t, own, m.heads_kv, m.dtype);
  m.stats.backward.assign(m.plan.num_stages + 1, {});
  const std::size_t row = static_cast<std::size_t>(m.heads_kv * m.head_dim) * sizeof(float);

  // Group-reduce receives, posted first: every destination's dK/dV partials of each item we own.
  std::vector<RecvOp> recvs;
  std::vector<std::unique_ptr<Buffer>> partials;
  for (const auto& s : m.layout.sends)
    for (int d : s.dests) {
      partials.push_back(
          std::make_unique<Buffer>(DType::kFloat32, 2 * s.tokens.size(), m.heads_kv, m.head_dim));
      recvs.push_back(
          {d, partials.back()->row(0), s.tokens.size() * row, CommLayout::tag_k(s.item)});
      recvs.push_back({d, partials.back()->row(s.tokens.size()), s.tokens.size() * row,
                       CommLayout::tag_v(s.item)});
      m.stats.bwd_bytes_received += 2 * s.tokens.size() * row;
    }
  auto reduce_in = m.comm->start({}, recvs);

  const AttentionShape shape = m.kernel_shape(cols);
  AttentionOptions partial = m.attention;
  partial.sink = {};
  Buffer dq_acc(DType::kFloat32, tq, m.heads_q, m.head_dim),
      dq_part(DType::kFloat32, tq, m.heads_q, m.head_dim);
  Buffer dk_acc(DType::kFloat32, cols, m.heads_kv, m.head_dim),
      dv_acc(DType::kFloat32, cols, m.heads_kv, m.head_dim);
  Buffer dk_part(DType::kFloat32, cols, m.heads_kv, m.head_dim),
      dv_part(DType::kFloat32, cols, m.heads_kv, m.head_dim);
  const RankPlan& rp = m.plan.ranks[rank()];
  std::vector<std::unique_ptr<CommHandle>> reduce_out;
  for (int s = 0; s <= m.plan.num_stages; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!rp.stage_work[s].empty()) {
      cpu::backward(shape, dout, q, m.k_buf.view, m.v_buf.view, out, lse, rp.stage_work[s],
                    dq_part.view, dk_part.view, dv_part.view, partial, {});
      for (auto [acc, part, n] : {std::tuple{&dq_acc, &dq_part, tq * m.heads_q * m.head_dim},
                                  {&dk_acc, &dk_part, cols * m.heads_kv * m.head_dim},
                                  {&dv_acc, &dv_part, cols * m.heads_kv * m.head_dim}}) {
        float* a = acc->f32();
        const float* p = part->f32();
        for (std::int64_t i = 0; i < n; ++i) a[i] += p[i];
      }
    }
    m.stats.backward[s].compute_ms = ms_since(t0);
    // This stage's received columns are final now: return their partials to the owners.
    std::vector<SendOp> sends;
    for (const auto& r : m.layout.recvs)
      if (r.stage == s) {
        sends.push_back(
            {r.owner, dk_acc.row(r.column), r.tokens.size() * row, CommLayout::tag_k(r.item)});
        sends.push_back(
            {r.owner, dv_acc.row(r.column), r.tokens.size() * row, CommLayout::tag_v(r.item)});
        m.stats.bwd_bytes_sent += 2 * r.tokens.size() * row;
      }
    if (!sends.empty()) reduce_out.push_back(m.comm->start(sends, {}));
  }
  reduce_in->wait();
  // Sum the partials in a fixed order (items, then destinations): deterministic.
  std::size_t next = 0;
  for (const auto& s : m.layout.sends)
    for (std::size_t di = 0; di < s.dests.size(); ++di, ++next) {
      Buffer& p = *partials[next];
      for (std::int64_t t = s.tokens.begin; t < s.tokens.end; ++t) {
        const std::int64_t r = m.layout.own_row(t);
        const float* pk = reinterpret_cast<const float*>(p.row(t - s.tokens.begin));
        const float* pv =
            reinterpret_cast<const float*>(p.row(s.tokens.size() + (t - s.tokens.begin)));
        float* ak = reinterpret_cast<float*>(dk_acc.row(r));
        float* av = reinterpret_cast<float*>(dv_acc.row(r));
        for (std::int64_t i = 0; i < m.heads_kv * m.head_dim; ++i) ak[i] += pk[i], av[i] += pv[i];
      }
    }
  for (auto& h : reduce_out) h->wait();
  for (std::int64_t i = 0; i < tq * m.heads_q * m.head_dim; ++i)
    store_float(dq.data, m.dtype, i, dq_acc.f32()[i]);
  for (std::int64_t i = 0; i < own * m.heads_kv * m.head_dim; ++i) {
    store_float(dk.data, m.dtype, i, dk_acc.f32()[i]);
    store_float(dv.data, m.dtype, i, dv_acc.f32()[i]);
  }
  if (!dsink.empty()) {
    if (m.attention.sink.empty())
      fail(Status::kInvalidArgument, "backward: dsink was given but the options carry no sink");
    if (dsink.ndim != 1 || dsink.shape[0] != m.heads_q || dsink.dtype != DType::kFloat32 ||
        !dsink.is_contiguous())
      fail(Status::kInvalidArgument, "backward: dsink has shape " + dsink.shape_string() +
                                         ", expected contiguous fp32 [" +
                                         std::to_string(m.heads_q) + "]");
    // Each rank's rows, then the sum over ranks in rank order (deterministic).
    std::vector<float> mine(m.heads_q), all(m.heads_q * m.comm->size());
    cpu::sink_gradient(shape, dout, out, lse, m.attention,
                       make_view(mine.data(), DType::kFloat32, {m.heads_q}));
    m.comm->all_gather(mine.data(), mine.size() * sizeof(float), all.data());
    for (std::int64_t h = 0; h < m.heads_q; ++h) {
      float total = 0;
      for (int r = 0; r < m.comm->size(); ++r) total += all[r * m.heads_q + h];
      static_cast<float*>(dsink.data)[h] = total;
    }
  }
  m.stats.backward_ms = ms_since(t_all);
}

}  // namespace flexcp
