// A job in which rank 1 fails, for the failure tests: `die` ends rank 1 abruptly, `throw` makes it
// throw (and, like the flexcp tool, abort the job), `stall` makes it stop taking part in the
// transfers; `stall-collective` and `sigstop` make it sleep, or stop its process, before the
// all-gather in which the ranks compare their plans. The other ranks must exit with an error
// within a bounded time, never hang (checked by expect_failure.cmake).
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "flexcp/flexcp.h"

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "die";
  auto comm = flexcp::make_mpi_communicator();
  const flexcp::Mask mask = flexcp::masks::causal(4096, 4096);
  if (comm->rank() == 1 && !std::strcmp(mode, "stall-collective"))
    std::this_thread::sleep_for(std::chrono::hours(1));
  if (comm->rank() == 1 && !std::strcmp(mode, "sigstop")) std::raise(SIGSTOP);
  try {
    flexcp::DistAttention dist(mask, *comm, 2, 2, 16, flexcp::DType::kFloat32);
    std::int64_t lq = dist.local_q_tokens();
    const std::int64_t lk = dist.local_k_tokens();
    std::vector<float> q(lq * 32, 0.5f), k(lk * 32, 0.5f), v(lk * 32, 0.5f), out(lq * 32),
        lse(lq * 2);
    if (comm->rank() == 1) {
      if (!std::strcmp(mode, "die")) _exit(3);
      if (!std::strcmp(mode, "stall")) std::this_thread::sleep_for(std::chrono::hours(1));
      if (!std::strcmp(mode, "throw")) lq += 1;  // a wrong shape: forward throws
    }
    using flexcp::make_view;
    dist.forward(make_view(q.data(), flexcp::DType::kFloat32, {lq, 2, 16}),
                 make_view(k.data(), flexcp::DType::kFloat32, {lk, 2, 16}),
                 make_view(v.data(), flexcp::DType::kFloat32, {lk, 2, 16}),
                 make_view(out.data(), flexcp::DType::kFloat32, {lq, 2, 16}),
                 make_view(lse.data(), flexcp::DType::kFloat32, {lq, 2}));
  } catch (const flexcp::Error& e) {
    std::fprintf(stderr, "rank %d: %s: %s\n", comm->rank(), flexcp::status_string(e.status()),
                 e.what());
    comm->abort(2);
  }
  std::printf("rank %d finished\n", comm->rank());
  return 0;
}
