#include "kernels/cuda/host_staging.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace flexcp::cuda {

namespace {
// Blocks are made in powers of two from 64 KiB, so that plans of nearby sizes share them.
constexpr std::size_t kSmallestBlock = std::size_t{64} << 10;

std::size_t block_size(std::size_t bytes) {
  std::size_t size = kSmallestBlock;
  while (size < bytes) size *= 2;
  return size;
}
}  // namespace

HostStaging::~HostStaging() {
  for (Block& b : blocks_) {
    if (b.copied != nullptr) {
      cudaEventSynchronize(b.copied);
      cudaEventDestroy(b.copied);
    }
    cudaFreeHost(b.host);
  }
}

HostStaging& HostStaging::shared() {
  static HostStaging* pool = new HostStaging(std::size_t{256} << 20);
  return *pool;
}

std::size_t HostStaging::pinned_bytes() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

std::size_t HostStaging::blocks() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return blocks_.size();
}

// The smallest free block of `device` that holds `bytes` and whose last copy has completed, else
// a new one; -1 when the pool is full.
int HostStaging::acquire(std::size_t bytes, int device, const std::string& fn) {
  const std::lock_guard<std::mutex> lock(mutex_);
  int best = -1;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.filling || b.device != device || b.bytes < bytes) continue;
    if (best >= 0 && blocks_[best].bytes <= b.bytes) continue;
    const cudaError_t done = cudaEventQuery(b.copied);
    if (done == cudaErrorNotReady) continue;
    check(done, fn, "asking whether a staging block's copy has completed");
    best = static_cast<int>(i);
  }
  if (best < 0) {
    const std::size_t size = block_size(bytes);
    if (held_ + size > max_bytes_) return -1;
    Block b;
    b.bytes = size;
    b.device = device;
    check(cudaHostAlloc(reinterpret_cast<void**>(&b.host), size, cudaHostAllocPortable), fn,
          "cudaHostAlloc (a pinned staging block for the work lists)");
    const cudaError_t made = cudaEventCreateWithFlags(&b.copied, cudaEventDisableTiming);
    if (made != cudaSuccess) {
      cudaFreeHost(b.host);
      check(made, fn, "cudaEventCreateWithFlags (a staging block's event)");
    }
    blocks_.push_back(b);
    held_ += size;
    best = static_cast<int>(blocks_.size() - 1);
  }
  blocks_[best].filling = true;
  return best;
}

bool HostStaging::copy_to_device(void* device_dst, std::size_t bytes, cudaStream_t stream,
                                 const std::function<void(unsigned char*)>& fill,
                                 const std::string& fn) {
  if (bytes == 0) return true;
  int device = 0;
  check(cudaGetDevice(&device), fn, "cudaGetDevice");
  const int i = acquire(bytes, device, fn);
  if (i < 0) {
    // From pageable memory: the copy returns once the bytes are staged, so they may go out of
    // scope; it waits for the stream first.
    std::vector<unsigned char> image(bytes);
    fill(image.data());
    check(cudaMemcpyAsync(device_dst, image.data(), bytes, cudaMemcpyHostToDevice, stream), fn,
          "copying from pageable memory to the device");
    return false;
  }
  unsigned char* host = nullptr;
  cudaEvent_t copied = nullptr;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    host = blocks_[i].host;
    copied = blocks_[i].copied;
  }
  auto release = [&] {
    const std::lock_guard<std::mutex> lock(mutex_);
    blocks_[i].filling = false;
  };
  try {
    fill(host);
    check(cudaMemcpyAsync(device_dst, host, bytes, cudaMemcpyHostToDevice, stream), fn,
          "copying a pinned staging block to the device");
  } catch (...) {
    release();  // nothing was enqueued from the block
    throw;
  }
  // Without its event a queued copy could not be waited for: the block then stays marked in use,
  // never handed out again, rather than be overwritten before the copy reads it.
  check(cudaEventRecord(copied, stream), fn, "recording the end of a staging block's copy");
  release();
  return true;
}

}  // namespace flexcp::cuda
