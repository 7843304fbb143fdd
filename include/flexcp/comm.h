// Communicators (DESIGN §3): one interface over host or device memory, with backends `local`
// (one rank) and `mpi` (host memory, Open MPI), and on device memory `nccl` and `staged` (device
// buffers through pinned host memory over a host communicator: several ranks sharing one GPU in
// tests, where NCCL refuses). Transfers are asynchronous: start an exchange, compute, then wait on
// its handle. A wait that outlasts the timeout throws Error(kCommError) instead of hanging.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flexcp/export.h"
#include "flexcp/tensor.h"

namespace flexcp {

struct SendOp {
  int peer = 0;
  const void* data = nullptr;
  std::size_t bytes = 0;
  int tag = 0;
};

struct RecvOp {
  int peer = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
  int tag = 0;
};

class FLEXCP_API CommHandle {
 public:
  // A handle destroyed before wait() cancels what it can and completes the rest (with the same
  // deadline) before it returns, so that no transfer touches its buffers afterwards.
  virtual ~CommHandle() = default;
  // Blocks until every operation completed; throws Error(kCommError) past the timeout.
  virtual void wait() = 0;
  // After wait(): the bytes its receives took in, as the transport counted them (NCCL counts
  // nothing: there, as posted).
  virtual std::size_t bytes_received() const = 0;
  // Makes `stream` (a cudaStream_t; null: the legacy default stream) wait on the device until the
  // exchange has completed, without blocking the host (nccl); the host backends, and staged, block
  // as wait() does (staged then queues its copies into the device buffers on `stream`). Either
  // way the time-out applies to what blocks the host; a device wait that never ends shows at the
  // next host wait on this communicator.
  virtual void wait_on(void* stream) {
    static_cast<void>(stream);
    wait();
  }
};

class FLEXCP_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts the given sends and receives; buffers stay untouched until wait(). Exchanges match in
  // order: a send in a rank's n-th start() must be received in its peer's n-th start() (NCCL
  // matches messages in posting order and has no tags; MPI would not need this). Within one
  // start(), messages between two ranks match by tag.
  virtual std::unique_ptr<CommHandle> start(const std::vector<SendOp>& sends,
                                            const std::vector<RecvOp>& recvs) = 0;
  // The memory start() moves: Device::kCpu (local, mpi) or Device::kCuda (nccl, staged). The
  // collectives below always take host memory.
  virtual Device memory() const { return Device::kCpu; }
  // start() ordered after the work queued so far on `stream` (a cudaStream_t; null: the legacy
  // default stream), so that sends read what that work wrote. The device buffers stay in use
  // until the handle's wait() or the work wait_on() ordered behind it. Host backends ignore the
  // stream (their buffers are host memory, written before the call).
  virtual std::unique_ptr<CommHandle> start_on(void* stream, const std::vector<SendOp>& sends,
                                               const std::vector<RecvOp>& recvs) {
    static_cast<void>(stream);
    return start(sends, recvs);
  }
  // Every rank's `bytes` bytes, in rank order, into `all` (size() * bytes).
  virtual void all_gather(const void* mine, std::size_t bytes, void* all) = 0;
  // Rank r's counts[r] bytes, concatenated in rank order, into `all`.
  virtual void all_gather_v(const void* mine, const std::vector<std::size_t>& counts,
                            void* all) = 0;
  virtual void barrier() = 0;
  // Ends every rank's process with `code` (a rank that failed calls this so the others do not
  // hang).
  [[noreturn]] virtual void abort(int code) = 0;
};

// One rank, no copies: exchanges with itself are invalid (plans for one rank have none).
FLEXCP_API std::unique_ptr<Communicator> make_local_communicator();

struct MpiOptions {
  // Seconds a wait may last before it throws; 0 reads FLEXCP_COMM_TIMEOUT_S (default 120).
  double timeout_s = 0;
};

// MPI_COMM_WORLD, initialising MPI (and finalising it at exit) when the caller has not. In a build
// configured with -DFLEXCP_WITH_MPI=OFF, throws Error(kNotCompiled).
FLEXCP_API std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options = {});

struct DeviceCommOptions {
  int device = -1;       // this rank's CUDA device; -1: the current one
  double timeout_s = 0;  // seconds a host wait may last; 0 reads FLEXCP_COMM_TIMEOUT_S
};

// NCCL's unique id (ncclGetUniqueId): made by one rank, given to every rank of the communicator.
using NcclUniqueId = std::array<char, 128>;
FLEXCP_API NcclUniqueId make_nccl_unique_id();

// NCCL over `size` ranks from an id the caller distributed (e.g. over torch.distributed). NCCL is
// loaded at run time (libnccl.so.2, the CUDA toolkit's or the one beside PyTorch; FLEXCP_NCCL_LIB
// names another); one rank per GPU. A build without CUDA throws Error(kNotCompiled).
FLEXCP_API std::unique_ptr<Communicator> make_nccl_communicator(
    const NcclUniqueId& id, int rank, int size, const DeviceCommOptions& options = {});
// The same, bootstrapped over `bootstrap` (e.g. MPI): rank 0 makes the id, all-gathered to all.
FLEXCP_API std::unique_ptr<Communicator> make_nccl_communicator(
    Communicator& bootstrap, const DeviceCommOptions& options = {});

// Device buffers copied through pinned host memory and exchanged over `host` (host memory, e.g.
// MPI), which must outlive it and whose time-out applies (options.timeout_s is not used): a test
// and fallback path (several ranks may share one GPU), not a fast one: start_on() waits for its
// stream on the host. A build without CUDA throws Error(kNotCompiled).
FLEXCP_API std::unique_ptr<Communicator> make_staged_communicator(
    Communicator& host, const DeviceCommOptions& options = {});

}  // namespace flexcp
