// Communicators (DESIGN §3): one interface over host or device memory, with backends `local`
// (one rank) and `mpi` (host memory, Open MPI). Transfers are asynchronous: start an exchange,
// compute, then wait on its handle. A wait that outlasts the timeout throws Error(kCommError)
// instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flexcp/export.h"

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
  // After wait(): the bytes its receives took in, as the transport counted them (not as posted).
  virtual std::size_t bytes_received() const = 0;
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

}  // namespace flexcp
