// The MPI communicator (host memory). Waits poll with a deadline so that a lost peer becomes an
// error on this rank instead of a hang; a rank that fails calls abort() so the job ends everywhere.
// The collectives (all-gathers, the barrier) are point-to-point exchanges with every peer under
// the same deadline, so that a rank that never arrives is named in the error instead of hanging
// everyone in MPI_Allgather (O(world) messages per rank: fine for the small exchanges of planning
// and checks this runtime makes).
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "core/env.h"
#include "flexcp/comm.h"
#include "flexcp/status.h"

namespace flexcp {
namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error(Status::kCommError, std::string("MPI ") + what + ": " + std::string(text, len));
  }
}

int count_of(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw Error(Status::kInvalidArgument,
                "MPI message of " + std::to_string(bytes) + " bytes exceeds 2^31 - 1");
  return static_cast<int>(bytes);
}

// What the handles of one communicator share: the deadline, and the first failure seen (a wait
// that timed out), after which an abandoned handle no longer waits for a peer that is gone.
struct MpiState {
  double timeout_s = 0;
  int rank = 0;
  std::string failure;
};

// After a failure, how long an abandoned handle still lets cancelled requests complete.
constexpr double kGraceAfterFailureS = 0.5;

class MpiHandle final : public CommHandle {
 public:
  // requests[0, num_recvs) are receives; peers[i] is request i's peer rank.
  MpiHandle(std::vector<MPI_Request> requests, std::size_t num_recvs, std::vector<int> peers,
            std::shared_ptr<MpiState> state)
      : requests_(std::move(requests)),
        num_recvs_(num_recvs),
        peers_(std::move(peers)),
        state_(std::move(state)) {}

  ~MpiHandle() override {
    // NOTE: a cancelled request is not finished: MPI may still write into (or read from) its
    // buffer until it completes, and a receive already matched cannot be cancelled at all. So
    // cancel, then complete every request before the caller frees the buffers; where that cannot
    // happen (a peer is gone), end the job instead of returning.
    if (completed_) return;
    for (MPI_Request& r : requests_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    const double limit = state_->failure.empty() ? state_->timeout_s : kGraceAfterFailureS;
    if (test_until(limit)) return;
    const std::string why = state_->failure.empty()
                                ? "transfers with rank(s) " + pending_peers() + " did not finish"
                                : state_->failure;
    std::fprintf(stderr,
                 "flexcp: rank %d: %s: %s; ending the job, since MPI still holds buffers that are "
                 "being released\n",
                 state_->rank, status_string(Status::kCommError), why.c_str());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }

  void wait() override {
    if (completed_) return;
    if (!test_until(state_->timeout_s)) {
      const std::string message = "flexcp: waited " + std::to_string(state_->timeout_s) +
                                  " s for transfers with rank(s) " + pending_peers() +
                                  " (FLEXCP_COMM_TIMEOUT_S); a peer failed or is stuck";
      if (state_->failure.empty()) state_->failure = message;
      throw Error(Status::kCommError, message);
    }
    for (std::size_t i = 0; i < num_recvs_; ++i) {
      int count = 0;
      check(MPI_Get_count(&statuses_[i], MPI_BYTE, &count), "Get_count");
      received_ += static_cast<std::size_t>(count);
    }
  }

  std::size_t bytes_received() const override { return received_; }

 private:
  // Polls until every request completed (true) or `seconds` passed (false). Testsome (not
  // Testall, which leaves every request in place until all are done) retires each request as it
  // completes, so that the ones left name the peers that did not answer.
  bool test_until(double seconds) {
    const int n = static_cast<int>(requests_.size());
    statuses_.resize(requests_.size());
    std::vector<int> indices(requests_.size());
    std::vector<MPI_Status> statuses(requests_.size());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      int count = 0;
      check(MPI_Testsome(n, requests_.data(), &count, indices.data(), statuses.data()), "Testsome");
      if (count == MPI_UNDEFINED) return completed_ = true;  // no active request left
      for (int i = 0; i < count; ++i) statuses_[indices[i]] = statuses[i];
      if (count == 0 && std::chrono::steady_clock::now() > deadline) return false;
      if (count == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The distinct peers of unfinished requests, ascending.
  std::string pending_peers() const {
    std::set<int> pending;
    for (std::size_t i = 0; i < requests_.size(); ++i)
      if (requests_[i] != MPI_REQUEST_NULL) pending.insert(peers_[i]);
    std::string list;
    for (int p : pending) list += (list.empty() ? "" : ", ") + std::to_string(p);
    return list;
  }

  std::vector<MPI_Request> requests_;
  std::size_t num_recvs_;
  std::vector<int> peers_;
  std::shared_ptr<MpiState> state_;
  std::vector<MPI_Status> statuses_;
  bool completed_ = false;
  std::size_t received_ = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : state_(std::make_shared<MpiState>()) {
    state_->timeout_s = timeout_s;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "Init_thread");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    state_->rank = rank_;
    // MPI promises tags up to 32767 only; Open MPI allows 2^31 - 1. Checked per message below.
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    if (found && ub) tag_ub_ = *ub;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<CommHandle> start(const std::vector<SendOp>& sends,
                                    const std::vector<RecvOp>& recvs) override {
    for (const RecvOp& r : recvs) check_tag(r.tag);
    for (const SendOp& s : sends) check_tag(s.tag);
    return post(sends, recvs);
  }
  void all_gather(const void* mine, std::size_t bytes, void* all) override {
    all_gather_v(mine, std::vector<std::size_t>(size_, bytes), all);
  }
  void all_gather_v(const void* mine, const std::vector<std::size_t>& counts, void* all) override {
    if (counts.size() != static_cast<std::size_t>(size_))
      throw Error(Status::kInvalidArgument, "all_gather_v: " + std::to_string(counts.size()) +
                                                " counts for " + std::to_string(size_) + " ranks");
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    auto* out = static_cast<unsigned char*>(all);
    std::size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        if (counts[r] > 0) std::memcpy(out + offset, mine, counts[r]);
      } else {
        sends.push_back({r, mine, counts[rank_], collective_tag()});
        recvs.push_back({r, out + offset, counts[r], collective_tag()});
      }
      offset += counts[r];
    }
    exchange(sends, recvs, "an all-gather");
  }
  void barrier() override { exchange_tokens("a barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  // The largest tag is the collectives' (the plans' transfers get the others): it keeps them
  // apart without a communicator of their own, whose creation would be a collective that could
  // hang. MPI keeps the messages of one (peer, tag) in order, so successive collectives match up.
  int collective_tag() const { return tag_ub_; }

  void check_tag(int tag) const {
    if (tag < 0 || tag >= tag_ub_)
      throw Error(Status::kInvalidArgument,
                  "MPI tag " + std::to_string(tag) + " is not below this MPI's MPI_TAG_UB " +
                      std::to_string(tag_ub_) +
                      " (kept for collectives; too many transfer items in one plan)");
  }

  // Posts the receives, then the sends; the handle completes them.
  std::unique_ptr<MpiHandle> post(const std::vector<SendOp>& sends,
                                  const std::vector<RecvOp>& recvs) {
    std::vector<MPI_Request> requests;
    std::vector<int> peers;
    for (const RecvOp& r : recvs) {
      requests.emplace_back();
      peers.push_back(r.peer);
      check(MPI_Irecv(r.data, count_of(r.bytes), MPI_BYTE, r.peer, r.tag, MPI_COMM_WORLD,
                      &requests.back()),
            "Irecv");
    }
    for (const SendOp& s : sends) {
      requests.emplace_back();
      peers.push_back(s.peer);
      check(MPI_Isend(s.data, count_of(s.bytes), MPI_BYTE, s.peer, s.tag, MPI_COMM_WORLD,
                      &requests.back()),
            "Isend");
    }
    return std::make_unique<MpiHandle>(std::move(requests), recvs.size(), std::move(peers), state_);
  }

  // One exchange of a collective under the deadline: a peer that does not take part is named
  // ("waited ... for transfers with rank(s) 3").
  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs,
                const char* what) {
    const std::unique_ptr<MpiHandle> handle = post(sends, recvs);
    try {
      handle->wait();
    } catch (const Error& e) {
      throw Error(e.status(), std::string(e.what()) + " (in " + what + ")");
    }
  }
  void exchange_tokens(const char* what) {
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) {
        sends.push_back({r, nullptr, 0, collective_tag()});
        recvs.push_back({r, nullptr, 0, collective_tag()});
      }
    exchange(sends, recvs, what);
  }

  std::shared_ptr<MpiState> state_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options) {
  const double timeout =
      options.timeout_s > 0 ? options.timeout_s : env_double("FLEXCP_COMM_TIMEOUT_S");
  if (!(timeout > 0)) throw Error(Status::kInvalidArgument, "FLEXCP_COMM_TIMEOUT_S must be > 0");
  return std::make_unique<MpiCommunicator>(timeout);
}

}  // namespace flexcp
