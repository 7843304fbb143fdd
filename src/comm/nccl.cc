// The NCCL communicator (device memory). NCCL is loaded at run time (dlopen of libnccl.so.2, or
// FLEXCP_NCCL_LIB), so that one build works with the CUDA toolkit's NCCL and with the one a
// PyTorch process has already loaded, and a build runs on machines without NCCL until NCCL is
// asked for. An exchange is one NCCL group of sends and receives on this communicator's stream,
// after an event of the caller's stream; its handle carries the completion event. NCCL has no
// tags: messages between two ranks match in posting order, so each side posts them sorted by tag.
// Host waits poll the event with a deadline and NCCL's asynchronous error; past it the
// communicator is aborted (its kernels end) and the wait throws.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include "comm/device_comm.h"
#include "core/env.h"
#include "flexcp/comm.h"
#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"

namespace flexcp {
namespace {

constexpr const char* kFn = "flexcp::make_nccl_communicator";

// The entry points flexcp uses, from the loaded library.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    const std::string name = env_value("FLEXCP_NCCL_LIB");
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr)
      throw Error(Status::kNotCompiled,
                  std::string(kFn) + ": cannot load NCCL (" + name + ": " + dlerror() +
                      "); install it (the CUDA toolkit's libnccl, or `pip install "
                      "nvidia-nccl-cu13`) or name the library in FLEXCP_NCCL_LIB");
    NcclApi a;
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr)
        throw Error(Status::kNotCompiled, std::string(kFn) + ": " + name + " has no " + symbol +
                                              " (NCCL 2.19 or newer is needed)");
    };
    load(a.get_unique_id, "ncclGetUniqueId");
    load(a.init_rank, "ncclCommInitRank");
    load(a.destroy, "ncclCommDestroy");
    load(a.abort, "ncclCommAbort");
    load(a.async_error, "ncclCommGetAsyncError");
    load(a.group_start, "ncclGroupStart");
    load(a.group_end, "ncclGroupEnd");
    load(a.send, "ncclSend");
    load(a.recv, "ncclRecv");
    load(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return api;
}

void check(ncclResult_t rc, const std::string& what) {
  if (rc != ncclSuccess && rc != ncclInProgress)
    throw Error(Status::kCommError, "NCCL " + what + ": " + nccl().error_string(rc));
}

double timeout_from(const DeviceCommOptions& o) {
  const double t = o.timeout_s > 0 ? o.timeout_s : env_double("FLEXCP_COMM_TIMEOUT_S");
  if (!(t > 0)) throw Error(Status::kInvalidArgument, "FLEXCP_COMM_TIMEOUT_S must be > 0");
  return t;
}

// What the handles share with their communicator: NCCL's, the deadline, and the first failure
// (after which every wait throws at once: the communicator is aborted).
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the exchanges' stream
  int device = 0, rank = 0, size = 1;
  double timeout_s = 0;
  std::string failure;

  // Blocks until `done` has happened on the device, or fails past the deadline.
  void host_wait(cudaEvent_t done, const char* what) {
    if (!failure.empty()) throw Error(Status::kCommError, failure);
    const auto t0 = std::chrono::steady_clock::now();
    for (auto pause = std::chrono::microseconds(1);;
         pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda::check(q, "flexcp: NCCL communicator", what);
      ncclResult_t async = ncclSuccess;
      nccl().async_error(comm, &async);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (async != ncclSuccess && async != ncclInProgress)
        fail("rank " + std::to_string(rank) + ": NCCL reported " + nccl().error_string(async) +
             " while " + what);
      else if (waited > timeout_s)
        fail("rank " + std::to_string(rank) + ": waited " + std::to_string(waited) + " s for " +
             what + " (FLEXCP_COMM_TIMEOUT_S = " + std::to_string(timeout_s) +
             "); a peer is gone or stuck");
      std::this_thread::sleep_for(pause);
    }
  }
  [[noreturn]] void fail(const std::string& why) {
    failure = "flexcp: " + why + "; the NCCL communicator was aborted";
    nccl().abort(comm);  // ends its kernels, so the stream can drain
    comm = nullptr;
    throw Error(Status::kCommError, failure);
  }
};

class NcclHandle final : public CommHandle {
 public:
  NcclHandle(std::shared_ptr<NcclState> state, cudaEvent_t done, std::size_t bytes)
      : state_(std::move(state)), done_(done), bytes_(bytes) {}
  ~NcclHandle() override { cudaEventDestroy(done_); }
  void wait() override { state_->host_wait(done_, "an exchange"); }
  std::size_t bytes_received() const override { return bytes_; }
  void wait_on(void* stream) override {
    if (!state_->failure.empty()) throw Error(Status::kCommError, state_->failure);
    cuda::check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0),
                "flexcp: NCCL communicator", "ordering a stream after an exchange");
  }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t done_;
  std::size_t bytes_;
};

class NcclCommunicator final : public comm_detail::DeviceCommunicator {
 public:
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, const DeviceCommOptions& o)
      : s_(std::make_shared<NcclState>()) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error(Status::kInvalidArgument, std::string(kFn) + ": rank " + std::to_string(rank) +
                                                " of " + std::to_string(size) +
                                                ", expected 0 <= rank < size");
    s_->rank = rank;
    s_->size = size;
    s_->timeout_s = timeout_from(o);
    int device = o.device;
    if (device < 0) cuda::check(cudaGetDevice(&device), kFn, "cudaGetDevice");
    s_->device = device;
    const cuda::DeviceGuard guard(device, kFn);
    cuda::check(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), kFn,
                "creating the exchange stream");
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof(NcclUniqueId));
    std::memcpy(&uid, id.data(), sizeof uid);
    check(nccl().init_rank(&s_->comm, size, uid, rank), "ncclCommInitRank");
    scratch_event_ = make_event();
  }
  ~NcclCommunicator() override {
    if (s_->comm != nullptr) {
      cudaStreamSynchronize(s_->stream);
      nccl().destroy(s_->comm);
    }
    cudaEventDestroy(scratch_event_);
    cudaStreamDestroy(s_->stream);
  }

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }
  std::unique_ptr<CommHandle> start_on(void* stream, const std::vector<SendOp>& sends,
                                       const std::vector<RecvOp>& recvs) override {
    if (!s_->failure.empty()) throw Error(Status::kCommError, s_->failure);
    const cuda::DeviceGuard guard(s_->device, "flexcp: NCCL communicator");
    for (const SendOp& op : sends) check_peer(op.peer, "a send");
    for (const RecvOp& op : recvs) check_peer(op.peer, "a receive");
    // Sends read what the caller's stream wrote before this call.
    cuda::check(cudaEventRecord(scratch_event_, static_cast<cudaStream_t>(stream)),
                "flexcp: NCCL communicator", "recording the caller's stream");
    cuda::check(cudaStreamWaitEvent(s_->stream, scratch_event_, 0), "flexcp: NCCL communicator",
                "ordering the exchange after the caller's stream");
    std::vector<const SendOp*> so;
    for (const SendOp& op : sends) so.push_back(&op);
    std::vector<const RecvOp*> ro;
    for (const RecvOp& op : recvs) ro.push_back(&op);
    auto by_peer_and_tag = [](const auto* a, const auto* b) {
      return a->peer != b->peer ? a->peer < b->peer : a->tag < b->tag;
    };
    std::stable_sort(so.begin(), so.end(), by_peer_and_tag);
    std::stable_sort(ro.begin(), ro.end(), by_peer_and_tag);
    std::size_t bytes = 0;
    check(nccl().group_start(), "ncclGroupStart");
    for (const SendOp* op : so)
      if (op->bytes > 0)
        check(nccl().send(op->data, op->bytes, ncclUint8, op->peer, s_->comm, s_->stream),
              "ncclSend");
    for (const RecvOp* op : ro)
      if (op->bytes > 0) {
        check(nccl().recv(op->data, op->bytes, ncclUint8, op->peer, s_->comm, s_->stream),
              "ncclRecv");
        bytes += op->bytes;
      }
    check(nccl().group_end(), "ncclGroupEnd");
    cudaEvent_t done = make_event();
    cuda::check(cudaEventRecord(done, s_->stream), "flexcp: NCCL communicator",
                "recording an exchange");
    return std::make_unique<NcclHandle>(s_, done, bytes);
  }

  // The host collectives go through device buffers: every rank's piece from every rank in one
  // group (a v-collective as sends and receives, under the same deadline as any wait).
  void all_gather(const void* mine, std::size_t bytes, void* all) override {
    all_gather_v(mine, std::vector<std::size_t>(s_->size, bytes), all);
  }
  void all_gather_v(const void* mine, const std::vector<std::size_t>& counts, void* all) override {
    if (counts.size() != static_cast<std::size_t>(s_->size))
      throw Error(Status::kInvalidArgument,
                  "flexcp: NCCL all_gather_v: " + std::to_string(counts.size()) + " counts for " +
                      std::to_string(s_->size) + " ranks");
    std::vector<std::size_t> offset(s_->size + 1, 0);
    for (int r = 0; r < s_->size; ++r) offset[r + 1] = offset[r] + counts[r];
    const cuda::DeviceGuard guard(s_->device, "flexcp: NCCL communicator");
    void* buf = nullptr;
    cuda::check(cudaMallocAsync(&buf, std::max<std::size_t>(offset.back(), 1), s_->stream),
                "flexcp: NCCL all_gather_v", "allocating its device buffer");
    auto* base = static_cast<unsigned char*>(buf);
    const std::size_t me = counts[s_->rank];
    if (me > 0)
      cuda::check(
          cudaMemcpyAsync(base + offset[s_->rank], mine, me, cudaMemcpyHostToDevice, s_->stream),
          "flexcp: NCCL all_gather_v", "copying this rank's piece");
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int r = 0; r < s_->size; ++r) {
      if (r == s_->rank) continue;
      sends.push_back({r, base + offset[s_->rank], me, 0});
      recvs.push_back({r, base + offset[r], counts[r], 0});
    }
    auto handle = start_on(s_->stream, sends, recvs);
    handle->wait();
    cuda::check(cudaMemcpyAsync(all, buf, offset.back(), cudaMemcpyDeviceToHost, s_->stream),
                "flexcp: NCCL all_gather_v", "copying the pieces back");
    cuda::check(cudaFreeAsync(buf, s_->stream), "flexcp: NCCL all_gather_v", "freeing");
    cuda::check(cudaEventRecord(scratch_event_, s_->stream), "flexcp: NCCL all_gather_v",
                "recording");
    s_->host_wait(scratch_event_, "an all-gather");
  }
  void barrier() override {
    const char one = 1;
    std::vector<char> all(s_->size);
    all_gather(&one, 1, all.data());
  }
  [[noreturn]] void abort(int code) override {
    if (s_->comm != nullptr) nccl().abort(s_->comm);
    std::_Exit(code);
  }

 private:
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= s_->size)
      throw Error(Status::kInvalidArgument, "flexcp: NCCL communicator: " + std::string(what) +
                                                " names peer " + std::to_string(peer) + " of " +
                                                std::to_string(s_->size) + " ranks");
  }
  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "flexcp: NCCL communicator",
                "creating an event");
    return e;
  }

  std::shared_ptr<NcclState> s_;
  cudaEvent_t scratch_event_ = nullptr;
};

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  ncclUniqueId uid;
  check(nccl().get_unique_id(&uid), "ncclGetUniqueId");
  NcclUniqueId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int rank, int size,
                                                     const DeviceCommOptions& options) {
  return std::make_unique<NcclCommunicator>(id, rank, size, options);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const DeviceCommOptions& options) {
  NcclUniqueId id{};
  if (bootstrap.rank() == 0) id = make_nccl_unique_id();
  std::vector<NcclUniqueId> all(bootstrap.size());
  bootstrap.all_gather(id.data(), id.size(), all.data());
  return make_nccl_communicator(all[0], bootstrap.rank(), bootstrap.size(), options);
}

}  // namespace flexcp
