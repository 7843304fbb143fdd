// The staged communicator: device buffers copied to pinned host memory, exchanged over a host
// communicator (MPI, or torch.distributed's gloo from Python), and copied into the device buffers
// at the receiver. It lets several processes share one GPU (NCCL refuses two ranks on a device),
// so that the device runtime's multi-rank logic is tested on a one-GPU host. Slow by design: a
// start waits on the host for its stream, and a handle waits on the host for the transfer.
#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/device_comm.h"
#include "flexcp/comm.h"
#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"

namespace flexcp {
namespace {

constexpr const char* kFn = "flexcp: staged communicator";

// Pinned host memory for the lifetime of one exchange.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    if (bytes > 0) cuda::check(cudaMallocHost(&data_, bytes), kFn, "allocating pinned memory");
  }
  ~PinnedBuffer() { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
};

class StagedHandle final : public CommHandle {
 public:
  StagedHandle(std::unique_ptr<CommHandle> host, std::unique_ptr<PinnedBuffer> staging,
               std::vector<RecvOp> device_recvs, std::vector<std::size_t> offsets, int device,
               cudaStream_t stream)
      : host_(std::move(host)),
        staging_(std::move(staging)),
        recvs_(std::move(device_recvs)),
        offsets_(std::move(offsets)),
        device_(device),
        stream_(stream) {}
  ~StagedHandle() override {
    host_.reset();  // completes (or ends the job) before the staging memory goes
    if (copied_ != nullptr) {
      cudaEventSynchronize(copied_);
      cudaEventDestroy(copied_);
    }
  }
  void wait() override {
    wait_on(stream_);
    cuda::check(cudaEventSynchronize(copied_), kFn, "copying received data to the device");
  }
  void wait_on(void* stream) override {
    if (copied_ != nullptr) return;
    host_->wait();
    const cuda::DeviceGuard guard(device_, kFn);
    auto s = static_cast<cudaStream_t>(stream);
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (recvs_[i].bytes > 0)
        cuda::check(cudaMemcpyAsync(recvs_[i].data, staging_->data() + offsets_[i], recvs_[i].bytes,
                                    cudaMemcpyHostToDevice, s),
                    kFn, "copying received data to the device");
    // The staging memory is freed only once these copies have read it (the destructor waits).
    cuda::check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), kFn,
                "creating an event");
    cuda::check(cudaEventRecord(copied_, s), kFn, "recording the copies");
  }
  std::size_t bytes_received() const override { return host_->bytes_received(); }

 private:
  std::unique_ptr<CommHandle> host_;
  std::unique_ptr<PinnedBuffer> staging_;
  std::vector<RecvOp> recvs_;
  std::vector<std::size_t> offsets_;
  int device_;
  cudaStream_t stream_;
  cudaEvent_t copied_ = nullptr;
};

class StagedCommunicator final : public comm_detail::DeviceCommunicator {
 public:
  StagedCommunicator(Communicator& host, int device) : host_(host), device_(device) {
    if (host.memory() != Device::kCpu)
      throw Error(Status::kInvalidArgument,
                  "flexcp::make_staged_communicator: the host communicator moves device memory; "
                  "expected one over host memory (mpi)");
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::unique_ptr<CommHandle> start_on(void* stream, const std::vector<SendOp>& sends,
                                       const std::vector<RecvOp>& recvs) override {
    const cuda::DeviceGuard guard(device_, kFn);
    auto s = static_cast<cudaStream_t>(stream);
    // One pinned buffer per exchange: the sends, then the receives.
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    for (const SendOp& op : sends) offsets.push_back(std::exchange(total, total + op.bytes));
    for (const RecvOp& op : recvs) offsets.push_back(std::exchange(total, total + op.bytes));
    auto staging = std::make_unique<PinnedBuffer>(total);
    std::vector<SendOp> host_sends = sends;
    for (std::size_t i = 0; i < sends.size(); ++i) {
      host_sends[i].data = staging->data() + offsets[i];
      if (sends[i].bytes > 0)
        cuda::check(cudaMemcpyAsync(staging->data() + offsets[i], sends[i].data, sends[i].bytes,
                                    cudaMemcpyDeviceToHost, s),
                    kFn, "copying a send to the host");
    }
    cuda::check(cudaStreamSynchronize(s), kFn, "waiting for the sends' data");
    std::vector<RecvOp> host_recvs = recvs;
    std::vector<std::size_t> recv_offsets(offsets.begin() + sends.size(), offsets.end());
    for (std::size_t i = 0; i < recvs.size(); ++i)
      host_recvs[i].data = staging->data() + recv_offsets[i];
    auto host = host_.start(host_sends, host_recvs);
    return std::make_unique<StagedHandle>(std::move(host), std::move(staging), recvs,
                                          std::move(recv_offsets), device_, s);
  }

  void all_gather(const void* mine, std::size_t bytes, void* all) override {
    host_.all_gather(mine, bytes, all);
  }
  void all_gather_v(const void* mine, const std::vector<std::size_t>& counts, void* all) override {
    host_.all_gather_v(mine, counts, all);
  }
  void barrier() override { host_.barrier(); }
  [[noreturn]] void abort(int code) override {
    host_.abort(code);
    std::_Exit(code);  // not reached: the host communicator's abort does not return
  }

 private:
  Communicator& host_;
  int device_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host,
                                                       const DeviceCommOptions& options) {
  int device = options.device;
  if (device < 0)
    cuda::check(cudaGetDevice(&device), "flexcp::make_staged_communicator", "cudaGetDevice");
  return std::make_unique<StagedCommunicator>(host, device);
}

}  // namespace flexcp
