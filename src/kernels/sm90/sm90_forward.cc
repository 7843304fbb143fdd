#include "kernels/sm90/sm90_forward.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "flexcp/status.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90 {

// One declaration per generated instance file (src/CMakeLists.txt writes the list).
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  void launch_forward_##dt##_hd##hd(const FwdParams&, int, cudaStream_t);
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE

namespace {

using Launcher = void (*)(const FwdParams&, int, cudaStream_t);

Launcher find_launcher(DType dtype, std::int64_t head_dim) {
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && head_dim == hd) return &launch_forward_##dt##_hd##hd;
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE
  return nullptr;
}

std::string compiled_list() {
  std::string s;
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  s += std::string(s.empty() ? "" : ", ") + #dt "/" #hd;
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE
  return s.empty() ? "none" : s;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(Status::kCudaError,
                std::string("flexcp::forward: ") + what + ": " + cudaGetErrorString(err));
}

// The largest power of two dividing the group, so that one CTA's 128 rows hold whole heads.
int pack_for(std::int64_t group) {
  int pack = 1;
  while (group % (2 * pack) == 0 && 2 * pack <= kBlockM) pack *= 2;
  return pack;
}

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<T>& host) {
    if (host.empty()) return;
    check_cuda(cudaMalloc(&ptr, host.size() * sizeof(T)), "cudaMalloc (work list)");
    check_cuda(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
               "copy work list to the device");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr) cudaFree(ptr);
  }
};

// A work list in device memory, with what identifies the mask it came from, and the persistent
// scheduler's counters (zero between launches: the kernel's last CTA resets them). Launches on one
// stream run one after another, so each stream gets its own entry; within it, launches rotate
// through kCounterSlots pairs: a stream handle reused while the destroyed stream's last launch
// still runs would share that launch's counters only after kCounterSlots more launches.
inline constexpr int kCounterSlots = 64;

struct DeviceWork {
  void* stream = nullptr;
  int device = 0;
  int pack = 1;
  std::int64_t rows = 0, cols = 0;
  std::vector<Band> key;
  int num_tiles = 0;
  DeviceArray<std::int64_t> tile_offsets;
  DeviceArray<WorkEntry> entries;
  DeviceArray<Band> bands;
  DeviceArray<std::int32_t> tile_order;
  DeviceArray<int> counters;  // kCounterSlots pairs
  mutable std::atomic<unsigned> next_slot{0};

  DeviceWork(void* stream_, int device_, int pack_, std::int64_t rows_, std::int64_t cols_,
             const std::vector<Band>& work, const WorkList& list)
      : stream(stream_),
        device(device_),
        pack(pack_),
        rows(rows_),
        cols(cols_),
        key(work),
        num_tiles(static_cast<int>(list.num_tiles())),
        tile_offsets(list.tile_offsets),
        entries(list.entries),
        bands(list.bands),
        tile_order(list.tile_order),
        counters(std::vector<int>(2 * kCounterSlots, 0)) {}

  bool matches(void* stream_, int device_, int pack_, std::int64_t rows_, std::int64_t cols_,
               const std::vector<Band>& work) const {
    return stream == stream_ && device == device_ && pack == pack_ && rows == rows_ &&
           cols == cols_ && key.size() == work.size() &&
           (work.empty() || std::memcmp(key.data(), work.data(), work.size() * sizeof(Band)) == 0);
  }
};

// The few most recent masks. A model calls forward with one mask for every layer of a step.
class WorkCache {
 public:
  std::shared_ptr<const DeviceWork> get(void* stream, int device, int pack, std::int64_t rows,
                                        std::int64_t cols, const std::vector<Band>& work) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if ((*it)->matches(stream, device, pack, rows, cols, work)) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front();
      }
    WorkListOptions options;
    options.tile_rows = kBlockM / pack;
    options.block_cols = kBlockN;
    const WorkList list = build_work_list(work, rows, cols, options);
    if (list.entries.size() > static_cast<std::size_t>(INT32_MAX))
      throw Error(Status::kInvalidArgument,
                  "flexcp::forward: the mask's work list has " +
                      std::to_string(list.entries.size()) +
                      " entries; the CUDA kernel takes at most 2^31 - 1 (fewer slices per tile)");
    entries_.push_front(
        std::make_shared<const DeviceWork>(stream, device, pack, rows, cols, work, list));
    if (entries_.size() > kCapacity) entries_.pop_back();
    return entries_.front();
  }

 private:
  static constexpr std::size_t kCapacity = 8;
  std::mutex mutex_;
  std::list<std::shared_ptr<const DeviceWork>> entries_;
};

WorkCache& work_cache() {
  static WorkCache cache;
  return cache;
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                cudaEnableDefault, &found),
               "looking up cuTensorMapEncodeTiled in the driver");
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error(
          Status::kCudaError,
          "flexcp::forward: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// t viewed as {D, T, H} (innermost first), read in boxes of {64, box_rows, box_heads}.
CUtensorMap make_tensor_map(const char* name, const TensorView& t, std::uint32_t box_rows,
                            std::uint32_t box_heads) {
  const std::size_t esize = dtype_size(t.dtype);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.shape[2]),
                              static_cast<cuuint64_t>(t.shape[0]),
                              static_cast<cuuint64_t>(t.shape[1])};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(t.strides[0]) * esize,
                                 static_cast<cuuint64_t>(t.strides[1]) * esize};
  const cuuint32_t box[3] = {64, box_rows, box_heads};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult res =
      tensor_map_encoder()(&map,
                           t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                           3, t.data, dims, strides, box, element_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw Error(Status::kCudaError, std::string("flexcp::forward: describing ") + name +
                                        " (shape " + t.shape_string() +
                                        ") for the tensor memory accelerator failed, CUresult " +
                                        std::to_string(static_cast<int>(res)));
  return map;
}

// What TMA and the 4-byte output stores need: a unit stride along D, 16-byte aligned rows.
void check_layout(const char* name, const TensorView& t) {
  const std::size_t esize = dtype_size(t.dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
                       (t.strides[0] * esize) % 16 == 0 && (t.strides[1] * esize) % 16 == 0;
  if (t.strides[2] != 1 || !aligned)
    throw Error(Status::kInvalidArgument,
                std::string("flexcp::forward: ") + name + " has strides [" +
                    std::to_string(t.strides[0]) + ", " + std::to_string(t.strides[1]) + ", " +
                    std::to_string(t.strides[2]) +
                    "]; the CUDA kernel expects a unit stride along D, a 16-byte aligned data "
                    "pointer and token/head strides that are multiples of 16 bytes");
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

bool compiled(DType dtype, std::int64_t head_dim) {
  return find_launcher(dtype, head_dim) != nullptr;
}

void forward(const AttentionShape& s, const TensorView& q, const TensorView& k, const TensorView& v,
             const std::vector<Band>& work, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options) {
  const Launcher launch = find_launcher(s.dtype, s.head_dim);
  if (launch == nullptr)
    throw Error(Status::kNotCompiled, std::string("flexcp::forward: no CUDA kernel for dtype ") +
                                          dtype_name(s.dtype) + " and head dim " +
                                          std::to_string(s.head_dim) +
                                          " in this build (compiled: " + compiled_list() + ")");
  // The kernel keeps token and column indices in 32 bits (a tile may overhang the end by a block).
  constexpr std::int64_t kMaxTokens = INT32_MAX - 2 * kBlockM;
  if (s.seqlen_q > kMaxTokens || s.seqlen_k > kMaxTokens)
    throw Error(Status::kInvalidArgument,
                "flexcp::forward: seqlen_q " + std::to_string(s.seqlen_q) + " and seqlen_k " +
                    std::to_string(s.seqlen_k) + ": the CUDA kernel takes at most " +
                    std::to_string(kMaxTokens) + " tokens");
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    check_layout(name, *t);
  if (s.seqlen_q == 0) return;

  DeviceGuard guard(q.device_index);
  int major = 0, minor = 0, sms = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device_index),
             "reading the compute capability");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.device_index),
             "reading the compute capability");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.device_index),
             "reading the multiprocessor count");
  if (major != 9 || minor != 0)
    throw Error(Status::kNotCompiled,
                "flexcp::forward: the CUDA kernel is built for sm_90a "
                "(Hopper); device " +
                    std::to_string(q.device_index) + " has compute capability " +
                    std::to_string(major) + "." + std::to_string(minor));

  const int pack = pack_for(s.group());
  const auto dev_work =
      work_cache().get(options.cuda_stream, q.device_index, pack, s.seqlen_q, s.seqlen_k, work);
  auto stream = static_cast<cudaStream_t>(options.cuda_stream);

  FwdParams p{};
  const int rows = kBlockM / pack;
  p.tma_q = make_tensor_map("q", q, rows, pack);
  if (s.seqlen_k > 0) {
    p.tma_k = make_tensor_map("k", k, kBlockN, 1);
    p.tma_v = make_tensor_map("v", v, kBlockN, 1);
  }
  // Each consumer warp group stores its own 64 rows: half the tile's tokens of one head, or
  // half of its packed heads.
  p.tma_o = pack == 1 ? make_tensor_map("out", out, kBlockM / 2, 1)
                      : make_tensor_map("out", out, rows, pack / 2);
  p.lse = static_cast<float*>(lse.data);
  p.lse_stride_t = lse.strides[0];
  p.lse_stride_h = lse.strides[1];
  p.tile_offsets = dev_work->tile_offsets.ptr;
  p.entries = dev_work->entries.ptr;
  p.bands = dev_work->bands.ptr;
  p.tile_order = dev_work->tile_order.ptr;
  p.num_tiles = dev_work->num_tiles;
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.heads_q = static_cast<int>(s.heads_q);
  p.group = static_cast<int>(s.group());
  p.pack = pack;
  p.rows_log2 = 0;
  while ((1 << p.rows_log2) < rows) ++p.rows_log2;
  p.head_blocks = p.group / pack;
  const std::int64_t items = std::int64_t(p.num_tiles) * s.heads_kv * p.head_blocks;
  if (items > INT32_MAX)
    throw Error(Status::kInvalidArgument, "flexcp::forward: " + std::to_string(items) +
                                              " (tile, head) items, expected fewer than 2^31");
  p.items = static_cast<int>(items);
  constexpr double kLog2e = 1.4426950408889634;
  if (options.softcap > 0) {
    p.softcap = static_cast<float>(options.softcap);
    p.softcap_scale = static_cast<float>(2 * kLog2e * s.scale / options.softcap);
    p.scale_log2 = static_cast<float>(kLog2e);
  } else {
    p.scale_log2 = static_cast<float>(std::abs(s.scale) * kLog2e);
    p.negate = s.scale < 0;
  }

  p.item_counter = dev_work->counters.ptr + 2 * (dev_work->next_slot++ % kCounterSlots);
  const int grid = static_cast<int>(std::min<std::int64_t>(sms, items));
  if (options.sink.empty()) {
    launch(p, grid, stream);
    return;
  }
  // The sink, copied to the device in stream order (a per-call buffer from the stream's pool).
  float* sink = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&sink), s.heads_q * sizeof(float), stream),
             "cudaMallocAsync (sink)");
  try {
    check_cuda(cudaMemcpyAsync(sink, options.sink.data, s.heads_q * sizeof(float),
                               cudaMemcpyHostToDevice, stream),
               "copy sink to the device");
    p.sink = sink;
    launch(p, grid, stream);
  } catch (...) {
    cudaFreeAsync(sink, stream);
    throw;
  }
  check_cuda(cudaFreeAsync(sink, stream), "cudaFreeAsync (sink)");
}

}  // namespace flexcp::sm90
