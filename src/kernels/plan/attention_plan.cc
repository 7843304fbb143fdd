// AttentionPlan: the checks of a problem, its work lists in the tile sizes of the kernels that
// will run it (kernels/tiles.h), and for device plans the workspace they are copied to once.
#include "flexcp/attention_plan.h"

#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/checks.h"
#include "core/env.h"
#include "flexcp/status.h"
#include "kernels/plan/attention_plan_impl.h"
#include "kernels/tiles.h"
#if defined(FLEXCP_WITH_CUDA)
#include "kernels/cuda/host_staging.h"
#include "kernels/cuda/runtime.h"
#include "kernels/sm90/sm90_forward.h"
#include "kernels/sm90/sm90_host.h"
#endif

namespace flexcp {

DeviceWorkList lay_out(const WorkList& list, WorkspaceWriter& writer) {
  DeviceWorkList d;
  d.tile_offsets = writer.put("tile offsets", list.tile_offsets);
  d.entries = writer.put("entries", list.entries);
  d.bands = writer.put("bands", list.bands);
  d.tile_order = writer.put("tile order", list.tile_order);
  d.scheduler = writer.zeros<int>("scheduler counters", kSchedulerInts);
  d.num_tiles = list.num_tiles();
  return d;
}

namespace {

// The workspace of a device plan: the forward's list, and for the backward its list and scratch.
// The one layout both workspace_bytes() and bind_workspace use.
void lay_out_plan(AttentionPlan::Impl& m, WorkspaceWriter& writer) {
  m.device_rows = lay_out(m.rows, writer);
  if (!m.backward) return;
  m.device_cols = lay_out(m.cols, writer);
  if (!m.keys_only) m.device_dq_rows = lay_out(m.dq_rows, writer);
  m.device_units = writer.put("backward units", m.bwd_units.units);
  m.device_split_counters =
      writer.zeros<int>("backward split counters", static_cast<std::size_t>(m.bwd_units.counters));
  m.scratch = sm90::lay_out_bwd_scratch(m.shape, m.bwd_units.slots, !m.keys_only, writer);
}

void check_shape(const ArgChecker& c, const AttentionShape& s) {
  if (s.seqlen_q < 0 || s.seqlen_k < 0 || s.seqlen_q > kMaxSeqlen || s.seqlen_k > kMaxSeqlen)
    c.fail("seqlen_q " + std::to_string(s.seqlen_q) + " and seqlen_k " +
           std::to_string(s.seqlen_k) + ", expected sizes from 0 to " + std::to_string(kMaxSeqlen) +
           " (kMaxSeqlen)");
  if (s.heads_q < 1 || s.heads_kv < 1 || s.heads_q % s.heads_kv != 0)
    c.fail("heads_q " + std::to_string(s.heads_q) + " and heads_kv " + std::to_string(s.heads_kv) +
           ", expected heads_q a positive multiple of heads_kv");
  if (s.head_dim < 1) c.fail("head_dim is " + std::to_string(s.head_dim) + ", expected >= 1");
  if (s.dtype == DType::kFloat64) c.fail("dtype is fp64, expected fp32, bf16 or fp16");
  if (s.device == Device::kCuda && s.device_index < 0)
    c.fail("device_index is " + std::to_string(s.device_index) + ", expected >= 0");
}

// Whether a kernel for the shape is in this build, said before any list is built.
void check_kernel(const ArgChecker& c, const AttentionShape& s) {
  if (s.device != Device::kCuda) return;
#if defined(FLEXCP_WITH_CUDA)
  if (s.dtype == DType::kFloat32)
    throw Error(Status::kNotCompiled,
                c.fn() + ": q has dtype fp32; the CUDA kernel takes bf16 or fp16");
  if (!sm90::compiled(s.dtype, s.head_dim))
    throw Error(Status::kNotCompiled, c.fn() + ": no CUDA kernel for dtype " + dtype_name(s.dtype) +
                                          " and head dim " + std::to_string(s.head_dim) +
                                          " in this build (compiled: " + sm90::compiled_list() +
                                          ")");
  // The kernel keeps token and column indices in 32 bits (a tile may overhang the end by a block).
  constexpr std::int64_t kMaxTokens = INT32_MAX - 2 * tiles::kSm90BlockM;
  if (s.seqlen_q > kMaxTokens || s.seqlen_k > kMaxTokens)
    c.fail("seqlen_q " + std::to_string(s.seqlen_q) + " and seqlen_k " +
           std::to_string(s.seqlen_k) + ": the CUDA kernel takes at most " +
           std::to_string(kMaxTokens) + " tokens");
#else
  throw Error(Status::kNotCompiled,
              c.fn() +
                  ": this build has no CUDA kernels (configured without CUDA); pass tensors "
                  "in host memory (device cpu)");
#endif
}

// Bands inside the shape's rectangle that cover no pair twice: what every kernel assumes.
std::vector<Band> checked_work(const ArgChecker& c, const std::vector<Band>& work,
                               const AttentionShape& s) {
  std::vector<Band> bands;
  bands.reserve(work.size());
  for (std::size_t i = 0; i < work.size(); ++i) {
    const Band b = trim_band(work[i]);
    if (b.row_begin >= b.row_end) continue;
    // begin and end never decrease with the row: the extremes sit at the first and last rows.
    if (b.row_begin < 0 || b.row_end > s.seqlen_q || b.begin(b.row_begin) < 0 ||
        b.end(b.row_end - 1) > s.seqlen_k)
      c.fail("work band " + std::to_string(i) + " covers rows [" + std::to_string(b.row_begin) +
             ", " + std::to_string(b.row_end) + ") and columns [" +
             std::to_string(b.begin(b.row_begin)) + ", " + std::to_string(b.end(b.row_end - 1)) +
             "), expected inside [0, " + std::to_string(s.seqlen_q) + ") x [0, " +
             std::to_string(s.seqlen_k) + ")");
    bands.push_back(b);
  }
  if (const BandOverlap o = find_overlap(bands); o.found)
    c.fail("work bands " + std::to_string(o.first) + " and " + std::to_string(o.second) +
           " (of the non-empty ones) both cover the pair (q=" + std::to_string(o.cells.row_begin) +
           ", k=" + std::to_string(o.cells.begin(o.cells.row_begin)) +
           "); the work must not cover a pair twice");
  return bands;
}

#if defined(FLEXCP_WITH_CUDA)
// A setting read from the environment variable `name` (core/env.cc): empty for "auto", else the
// named choice; anything else fails, naming the variable, its value and the choices.
template <class T>
std::optional<T> choice_from_env(const ArgChecker& c, const char* name,
                                 std::initializer_list<std::pair<const char*, T>> choices) {
  const std::string v = env_value(name);
  if (v == "auto") return std::nullopt;
  std::string expected = "auto";
  std::size_t i = 0;
  for (const auto& [word, value] : choices) {
    if (v == word) return value;
    expected += (++i == choices.size() ? " or " : ", ") + std::string(word);
  }
  c.fail(std::string(name) + " is '" + v + "', expected " + expected);
}
#endif

AttentionPlan plan_for_mask(const Mask& mask, const AttentionShape& shape,
                            const AttentionPlanOptions& options) {
  const ArgChecker c("flexcp::AttentionPlan");
  if (mask.seqlen_q() != shape.seqlen_q || mask.seqlen_k() != shape.seqlen_k)
    c.fail("the mask is " + std::to_string(mask.seqlen_q()) + " x " +
           std::to_string(mask.seqlen_k()) + " tokens, expected the shape's " +
           std::to_string(shape.seqlen_q) + " x " + std::to_string(shape.seqlen_k));
  return make_attention_plan(mask_bands(mask), shape, "flexcp::AttentionPlan", options);
}

}  // namespace

AttentionPlan make_attention_plan(const std::vector<Band>& work, const AttentionShape& shape,
                                  const AttentionPlanBuild& build) {
  const ArgChecker c(build.fn);
  const AttentionPlanOptions& options = build.options;
  check_shape(c, shape);
  check_kernel(c, shape);
  const std::vector<Band> bands = checked_work(c, work, shape);
  auto impl = std::make_unique<AttentionPlan::Impl>();
  impl->shape = shape;
  impl->backward = options.backward;
  impl->keys_only = build.keys_only && options.backward && shape.device == Device::kCuda;
  for (const Band& b : bands)
    impl->area += band_area(b, b.row_begin, b.row_end, b.begin_min, b.end_max);
  const std::int64_t tq = shape.seqlen_q, tk = shape.seqlen_k;
  if (shape.device == Device::kCpu) {
    impl->rows = build_work_list(bands, tq, tk,
                                 {.order = WorkListOrder::kRowMajor,
                                  .tile_rows = tiles::cpu_q_tile_tokens(shape.group()),
                                  .block_cols = tiles::kCpuBlockCols});
    if (options.backward)
      impl->cols = build_work_list(bands, tq, tk,
                                   {.order = WorkListOrder::kColumnMajor,
                                    .tile_rows = tiles::kCpuKeyTileTokens,
                                    .block_cols = tiles::kCpuBlockCols});
    return AttentionPlan(std::move(impl));
  }
  impl->pack = tiles::sm90_pack(shape.group());
  impl->rows = build_work_list(bands, tq, tk,
                               {.order = WorkListOrder::kRowMajor,
                                .tile_rows = tiles::kSm90BlockM / impl->pack,
                                .block_cols = tiles::sm90_fwd_block_n(shape.head_dim)});
  const std::int64_t items = impl->rows.num_tiles() * shape.heads_kv * (shape.group() / impl->pack);
  if (impl->rows.entries.size() > static_cast<std::size_t>(INT32_MAX) || items > INT32_MAX)
    c.fail("the work list has " + std::to_string(impl->rows.entries.size()) + " entries and " +
           std::to_string(items) +
           " (tile, head) items; the CUDA kernel takes at most 2^31 - 1 of each (fewer slices "
           "per tile, or fewer tokens per call)");
  if (options.backward) {
    impl->cols = build_work_list(bands, tq, tk,
                                 {.order = WorkListOrder::kColumnMajor,
                                  .tile_rows = tiles::kSm90BwdBlockN,
                                  .block_cols = tiles::sm90_bwd_block_m(shape.head_dim)});
    const std::int64_t bwd_items = impl->cols.num_tiles() * shape.heads_kv;
    if (impl->cols.entries.size() > static_cast<std::size_t>(INT32_MAX) || bwd_items > INT32_MAX)
      c.fail("the backward's work list has " + std::to_string(impl->cols.entries.size()) +
             " entries and " + std::to_string(bwd_items) +
             " (key tile, head) items; the CUDA kernel takes at most 2^31 - 1 of each");
#if defined(FLEXCP_WITH_CUDA)
    try {
      impl->bwd_units = plan_bwd_units(
          impl->cols,
          {.sms = sm90::planned_multiprocessors(static_cast<int>(shape.device_index)),
           .block_rows = tiles::sm90_bwd_block_m(shape.head_dim),
           .heads_kv = shape.heads_kv,
           .group = shape.group(),
           .head_dim = shape.head_dim,
           .walk = choice_from_env<BwdWalk>(c, "FLEXCP_SM90_BWD_WALK",
                                            {{"heads-outer", BwdWalk::kHeadsOuter},
                                             {"from-last", BwdWalk::kHeadsInnerFromLast}}),
           .order = choice_from_env<BwdOrder>(
               c, "FLEXCP_SM90_BWD_ORDER",
               {{"kv-heads", BwdOrder::kKvHeads}, {"across", BwdOrder::kAcrossKvHeads}}),
           .kind = choice_from_env<BwdUnitKind>(
               c, "FLEXCP_SM90_BWD_UNITS",
               {{"items", BwdUnitKind::kItems}, {"heads", BwdUnitKind::kHeads}}),
           .unit_heads = choice_from_env<std::int64_t>(c, "FLEXCP_SM90_BWD_UNIT_HEADS",
                                                       {{"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}}),
           .memory_gbs_per_sm =
               sm90::planned_memory_gbs_per_sm(static_cast<int>(shape.device_index))});
    } catch (const std::length_error& e) {
      c.fail(e.what());
    }
    if (impl->bwd_units.units.size() > static_cast<std::size_t>(INT32_MAX))
      c.fail("the backward has " + std::to_string(impl->bwd_units.units.size()) +
             " units of work; the CUDA kernel takes at most 2^31 - 1");
#endif
    if (!impl->keys_only)
      impl->dq_rows = build_work_list(bands, tq, tk,
                                      {.order = WorkListOrder::kRowMajor,
                                       .tile_rows = tiles::kSm90BwdDqBlockM,
                                       .block_cols = tiles::kSm90BwdDqBlockN});
    const std::int64_t dq_items = impl->dq_rows.num_tiles() * shape.heads_q;
    if (impl->dq_rows.entries.size() > static_cast<std::size_t>(INT32_MAX) || dq_items > INT32_MAX)
      c.fail("the deterministic dQ pass's work list has " +
             std::to_string(impl->dq_rows.entries.size()) + " entries and " +
             std::to_string(dq_items) +
             " (q tile, head) items; the CUDA kernel takes at most 2^31 - 1 of each");
  }
  WorkspaceWriter sizer(0, nullptr);
  lay_out_plan(*impl, sizer);
  impl->workspace_bytes = sizer.size();
  impl->workspace_regions = sizer.regions();
  return AttentionPlan(std::move(impl));
}

AttentionPlan::AttentionPlan() = default;
AttentionPlan::AttentionPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AttentionPlan::AttentionPlan(const Mask& mask, const AttentionShape& shape,
                             const AttentionPlanOptions& options)
    : AttentionPlan(plan_for_mask(mask, shape, options)) {}
AttentionPlan::AttentionPlan(const std::vector<Band>& work, const AttentionShape& shape,
                             const AttentionPlanOptions& options)
    : AttentionPlan(make_attention_plan(work, shape, "flexcp::AttentionPlan", options)) {}
AttentionPlan::AttentionPlan(AttentionPlan&&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(AttentionPlan&&) noexcept = default;
AttentionPlan::~AttentionPlan() = default;

bool AttentionPlan::empty() const {
  return impl_ == nullptr;
}

const AttentionPlan::Impl& AttentionPlan::impl() const {
  if (!impl_)
    throw Error(Status::kInvalidUsage,
                "flexcp::AttentionPlan: the plan is empty (default-"
                "constructed or moved from)");
  return *impl_;
}

const AttentionShape& AttentionPlan::shape() const {
  return impl().shape;
}

bool AttentionPlan::has_backward() const {
  return impl().backward;
}

std::int64_t AttentionPlan::area() const {
  return impl().area;
}

std::size_t AttentionPlan::workspace_bytes() const {
  return impl().workspace_bytes;
}

bool AttentionPlan::has_workspace() const {
  return impl_ && impl_->workspace != nullptr;
}

void AttentionPlan::bind_workspace(void* workspace, std::size_t bytes, void* cuda_stream) {
  const std::string fn = "flexcp::AttentionPlan::bind_workspace";
  impl();  // an empty plan is an error
  Impl& m = *impl_;
  if (m.shape.device != Device::kCuda)
    throw Error(Status::kInvalidUsage, fn + ": a host plan needs no workspace");
  const ArgChecker c(fn);
  if (workspace == nullptr || bytes < m.workspace_bytes)
    c.fail("workspace has " + std::to_string(bytes) + " bytes, expected at least " +
           std::to_string(m.workspace_bytes) + " (" + m.workspace_regions + ")");
  if (reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlign != 0)
    c.fail("workspace is not " + std::to_string(kWorkspaceAlign) + "-byte aligned");
#if defined(FLEXCP_WITH_CUDA)
  cudaPointerAttributes attr{};
  cuda::check(cudaPointerGetAttributes(&attr, workspace), fn, "cudaPointerGetAttributes");
  if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != m.shape.device_index)
    c.fail("workspace is not device memory of " + device_name(Device::kCuda, m.shape.device_index));
  const cuda::DeviceGuard guard(m.shape.device_index, fn);
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  // A graph would replay the copy from a staging block that later calls reuse.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(stream, &capture), fn, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(Status::kInvalidUsage,
                fn + ": the stream is capturing a CUDA graph; bind the workspace before the "
                     "capture (the plan's calls may be captured, its one copy of the lists not)");
  WorkspaceWriter sizer(0, nullptr);
  lay_out_plan(m, sizer);
  // Only the lists are copied; the backward's scratch (which may be gigabytes) is filled by its
  // kernels. Through pinned memory, so that the host does not wait for the stream's earlier work.
  cuda::HostStaging::shared().copy_to_device(
      workspace, sizer.copied_size(), stream,
      [&](unsigned char* image) {
        WorkspaceWriter writer(reinterpret_cast<std::uintptr_t>(workspace), image);
        lay_out_plan(m, writer);
      },
      fn);
  m.workspace = workspace;
#else
  (void)cuda_stream;
  throw Error(Status::kNotCompiled, fn + ": this build has no CUDA support");
#endif
}

}  // namespace flexcp
