#include <cuda_runtime.h>

#include "flexcp/status.h"
#include "kernels/cuda/device.h"

namespace flexcp::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(Status::kCudaError, std::string(what) + ": " + cudaGetErrorString(err));
}

__global__ void tile_spans_kernel(const Band* bands, const std::int64_t* rows, TileSpan* out,
                                  int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = band_tile_span(bands[i], rows[2 * i], rows[2 * i + 1]);
}

__global__ void attended_columns_kernel(const ColumnQuery* queries, BlockColumns* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const ColumnQuery& q = queries[i];
    out[i] = attended_columns(q.band, q.mask, q.row, q.c0, q.end, q.width);
  }
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(std::size_t n) { check(cudaMalloc(&ptr, n * sizeof(T) + 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

}  // namespace

int device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so that later calls start clean
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device";
  return count;
}

std::vector<TileSpan> tile_spans_on_device(const std::vector<Band>& bands,
                                           const std::vector<std::int64_t>& rows) {
  const int n = static_cast<int>(bands.size());
  if (rows.size() != 2 * bands.size())
    throw Error(Status::kInvalidArgument, "tile_spans_on_device: rows needs two entries per band");
  std::vector<TileSpan> out(n);
  if (n == 0) return out;
  DeviceBuffer<Band> d_bands(n);
  DeviceBuffer<std::int64_t> d_rows(2 * n);
  DeviceBuffer<TileSpan> d_out(n);
  check(cudaMemcpy(d_bands.ptr, bands.data(), n * sizeof(Band), cudaMemcpyHostToDevice),
        "copy bands");
  check(cudaMemcpy(d_rows.ptr, rows.data(), 2 * n * sizeof(std::int64_t), cudaMemcpyHostToDevice),
        "copy rows");
  constexpr int kThreads = 256;
  tile_spans_kernel<<<(n + kThreads - 1) / kThreads, kThreads>>>(d_bands.ptr, d_rows.ptr, d_out.ptr,
                                                                 n);
  check(cudaGetLastError(), "tile_spans_kernel launch");
  check(cudaMemcpy(out.data(), d_out.ptr, n * sizeof(TileSpan), cudaMemcpyDeviceToHost),
        "copy spans");
  return out;
}

std::vector<BlockColumns> attended_columns_on_device(const std::vector<ColumnQuery>& queries) {
  const int n = static_cast<int>(queries.size());
  std::vector<BlockColumns> out(n);
  if (n == 0) return out;
  DeviceBuffer<ColumnQuery> d_queries(n);
  DeviceBuffer<BlockColumns> d_out(n);
  check(cudaMemcpy(d_queries.ptr, queries.data(), n * sizeof(ColumnQuery), cudaMemcpyHostToDevice),
        "copy queries");
  constexpr int kThreads = 256;
  attended_columns_kernel<<<(n + kThreads - 1) / kThreads, kThreads>>>(d_queries.ptr, d_out.ptr, n);
  check(cudaGetLastError(), "attended_columns_kernel launch");
  check(cudaMemcpy(out.data(), d_out.ptr, n * sizeof(BlockColumns), cudaMemcpyDeviceToHost),
        "copy columns");
  return out;
}

}  // namespace flexcp::cuda
