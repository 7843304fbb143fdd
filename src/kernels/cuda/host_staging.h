// Copies from the host to the device that do not wait for the stream. A cudaMemcpyAsync from
// pageable memory first waits for all earlier work on its stream (CUDA's documented behaviour for
// pageable host-to-device copies), so a call that plans and copies its work lists each time would
// hold the host for the GPU's whole queue: no overlap of the next call's planning with this one's
// kernels. The bytes go through pinned blocks instead, each reused only once the copy that last
// read it has completed (an event recorded after it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace flexcp::cuda {

class HostStaging {
 public:
  // `max_bytes`: the pinned memory the pool may hold; past it a copy goes from pageable memory
  // (correct, but it waits for the stream).
  explicit HostStaging(std::size_t max_bytes) : max_bytes_(max_bytes) {}
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // The process's pool (256 MiB at most; never freed: the CUDA runtime may be gone at exit).
  static HostStaging& shared();

  // Writes `bytes` through fill(destination) into host memory and copies them to `device_dst`
  // (device memory of the current device) on `stream`, returning before the stream reaches the
  // copy when a pinned block is free or can be made. `fn` names the caller in errors. Returns
  // whether the copy went through pinned memory (false: through pageable memory, after waiting).
  bool copy_to_device(void* device_dst, std::size_t bytes, cudaStream_t stream,
                      const std::function<void(unsigned char*)>& fill, const std::string& fn);

  std::size_t pinned_bytes() const;  // held now, in use or not
  std::size_t blocks() const;

 private:
  struct Block {
    unsigned char* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t copied = nullptr;  // recorded after the block's last copy
    int device = 0;
    bool filling = false;  // a thread is writing it or enqueueing its copy
  };
  int acquire(std::size_t bytes, int device, const std::string& fn);

  mutable std::mutex mutex_;
  std::vector<Block> blocks_;
  std::size_t held_ = 0;
  const std::size_t max_bytes_;
};

}  // namespace flexcp::cuda
