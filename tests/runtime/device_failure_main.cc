// A job on device tensors in which rank 1 fails, for the failure tests of the GPU runtime:
// DistAttention over the staged communicator (the ranks share the one GPU), or with a second
// argument `nccl` over NCCL (rank r on GPU r mod the GPUs: a host with one GPU per rank), `die`
// ends rank 1 abruptly, `throw` makes it pass a wrong shape (and, like the flexcp tool, abort the
// job), `stall` makes it stop taking part in the exchanges. The other ranks must exit with an error
// within a bounded time, never hang (expect_failure.cmake). Without a GPU every rank prints
// "SKIPPED" and exits 0 (the test's skip expression).
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <thread>

#include "flexcp/flexcp.h"

namespace {

// Zeroed device memory for one tensor (the job ends with the process: nothing is freed).
flexcp::TensorView device_zeros(flexcp::DType dtype, std::initializer_list<std::int64_t> shape) {
  std::size_t bytes = flexcp::dtype_size(dtype);
  for (std::int64_t n : shape) bytes *= n;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0, bytes) != cudaSuccess)
    throw flexcp::Error(flexcp::Status::kCudaError, "device_failure: allocating a tensor");
  flexcp::TensorView v = flexcp::make_view(p, dtype, shape);
  v.device = flexcp::Device::kCuda;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "die";
  const bool nccl = argc > 2 && !std::strcmp(argv[2], "nccl");
  auto host = flexcp::make_mpi_communicator();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("SKIPPED: no GPU on this host\n");
    return 0;
  }
  if (nccl && cudaSetDevice(host->rank() % gpus) != cudaSuccess) {
    std::fprintf(stderr, "rank %d: cannot use GPU %d\n", host->rank(), host->rank() % gpus);
    host->abort(2);
  }
  auto comm =
      nccl ? flexcp::make_nccl_communicator(*host) : flexcp::make_staged_communicator(*host);
  try {
    using flexcp::DType;
    const flexcp::Mask mask = flexcp::masks::causal(4096, 4096);
    flexcp::DistAttentionOptions options;
    options.plan.device = flexcp::Device::kCuda;
    cudaGetDevice(&options.plan.device_index);
    flexcp::DistAttention dist(mask, *comm, 2, 2, 64, DType::kBFloat16, options);
    std::int64_t lq = dist.local_q_tokens();
    const std::int64_t lk = dist.local_k_tokens();
    if (comm->rank() == 1) {
      if (!std::strcmp(mode, "die")) _exit(3);
      if (!std::strcmp(mode, "stall")) std::this_thread::sleep_for(std::chrono::hours(1));
      if (!std::strcmp(mode, "throw")) lq += 1;  // a wrong shape: forward throws
    }
    const DType bf16 = DType::kBFloat16;
    dist.forward(device_zeros(bf16, {lq, 2, 64}), device_zeros(bf16, {lk, 2, 64}),
                 device_zeros(bf16, {lk, 2, 64}), device_zeros(bf16, {lq, 2, 64}),
                 device_zeros(DType::kFloat32, {lq, 2}));
    if (cudaDeviceSynchronize() != cudaSuccess)
      throw flexcp::Error(flexcp::Status::kCudaError, "device_failure: the forward failed");
  } catch (const flexcp::Error& e) {
    std::fprintf(stderr, "rank %d: %s: %s\n", comm->rank(), flexcp::status_string(e.status()),
                 e.what());
    comm->abort(2);
  }
  std::printf("rank %d finished\n", comm->rank());
  return 0;
}
