// The device communicators under mpirun: `--backend staged` (any number of ranks, sharing one GPU)
// or `--backend nccl` (one rank per GPU; on a one-GPU host, one rank). Device buffers with a
// pattern that names sender, receiver, tag and byte go around in several exchanges, into
// poisoned receive buffers, and must arrive bit for bit; sends are written on the caller's stream
// just before the exchange starts (the exchange must be ordered after them), and results are read
// back on the stream a handle was waited on. Skips, saying why, where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device_world.h"
#include "flexcp/comm.h"
#include "flexcp/status.h"
#include "kernels/cuda/device.h"

namespace flexcp {
namespace {

Communicator* g_host = nullptr;    // MPI
Communicator* g_device = nullptr;  // the backend under test
std::string g_backend;
std::string g_skip;  // why the tests skip (no GPU)

#define SKIP_WITHOUT_DEVICE()                    \
  do {                                           \
    if (!g_skip.empty()) GTEST_SKIP() << g_skip; \
  } while (0)

void ok(cudaError_t err) {
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

unsigned char pattern(int from, int to, int tag, std::size_t i) {
  return static_cast<unsigned char>((from * 131 + to * 31 + tag * 7 + i * 13 + i / 251) & 0xff);
}

// Awkward sizes: a byte, an odd few KB, an MB and three.
constexpr std::size_t kSizes[] = {1, 4097, (1u << 20) + 3};

struct Message {
  int peer, tag;
  std::size_t bytes;
  void* device = nullptr;
};

// Exchange `round`: every rank sends each size to every other rank (and to itself on NCCL), with
// tags that differ per round; receives are posted in the reverse order of the sends.
void exchange_round(int round, cudaStream_t stream) {
  const int me = g_device->rank(), n = g_device->size();
  std::vector<Message> sends, recvs;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me && g_backend != "nccl") continue;
    for (int k = 0; k < 3; ++k) {
      const int tag = 10 * round + k;
      sends.push_back({peer, tag, kSizes[k]});
      recvs.push_back({peer, tag, kSizes[k]});
    }
  }
  std::vector<SendOp> send_ops;
  std::vector<RecvOp> recv_ops;
  for (Message& s : sends) {
    ok(cudaMalloc(&s.device, s.bytes));
    std::vector<unsigned char> host(s.bytes);
    for (std::size_t i = 0; i < s.bytes; ++i) host[i] = pattern(me, s.peer, s.tag, i);
    // Queued, not waited for: the exchange must come after it on the stream.
    ok(cudaMemcpyAsync(s.device, host.data(), s.bytes, cudaMemcpyHostToDevice, stream));
    send_ops.push_back({s.peer, s.device, s.bytes, s.tag});
  }
  for (auto it = recvs.rbegin(); it != recvs.rend(); ++it) {  // the sends' order reversed
    ok(cudaMalloc(&it->device, it->bytes));
    ok(cudaMemsetAsync(it->device, 0xA5, it->bytes, stream));  // poison
    recv_ops.push_back({it->peer, it->device, it->bytes, it->tag});
  }
  auto handle = g_device->start_on(stream, send_ops, recv_ops);
  handle->wait_on(stream);
  std::size_t want_bytes = 0;
  for (const Message& r : recvs) {
    std::vector<unsigned char> got(r.bytes);
    ok(cudaMemcpyAsync(got.data(), r.device, r.bytes, cudaMemcpyDeviceToHost, stream));
    ok(cudaStreamSynchronize(stream));
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < r.bytes; ++i)
      if (got[i] != pattern(r.peer, me, r.tag, i) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << "rank " << me << " from " << r.peer << " tag " << r.tag << ": " << bad
                       << " of " << r.bytes << " bytes wrong, the first at " << first;
    want_bytes += r.bytes;
  }
  handle->wait();  // after wait_on, a host wait returns at once
  EXPECT_EQ(handle->bytes_received(), want_bytes);
  handle.reset();
  for (Message& m : sends) ok(cudaFree(m.device));
  for (Message& m : recvs) ok(cudaFree(m.device));
}

TEST(DeviceComm, ExchangesArriveBitForBitInOrder) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(g_device->memory(), Device::kCuda);
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) exchange_round(round, stream);
  ok(cudaStreamDestroy(stream));
  g_device->barrier();
}

// Several exchanges started before any is waited for, waited in reverse.
TEST(DeviceComm, OutstandingExchangesWaitedInAnyOrder) {
  SKIP_WITHOUT_DEVICE();
  const int me = g_device->rank(), n = g_device->size();
  if (n == 1 && g_backend != "nccl") GTEST_SKIP() << "one rank: nothing to exchange on staged";
  const int to = (me + 1) % n, from = (me + n - 1) % n;
  constexpr int kExchanges = 4;
  constexpr std::size_t kBytes = 3 << 16;
  std::vector<void*> out(kExchanges), in(kExchanges);
  std::vector<std::unique_ptr<CommHandle>> handles;
  for (int e = 0; e < kExchanges; ++e) {
    ok(cudaMalloc(&out[e], kBytes));
    ok(cudaMalloc(&in[e], kBytes));
    std::vector<unsigned char> host(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) host[i] = pattern(me, to, e, i);
    ok(cudaMemcpy(out[e], host.data(), kBytes, cudaMemcpyHostToDevice));
    ok(cudaMemset(in[e], 0, kBytes));
    handles.push_back(g_device->start({{to, out[e], kBytes, e}}, {{from, in[e], kBytes, e}}));
  }
  for (int e = kExchanges - 1; e >= 0; --e) {
    handles[e]->wait();
    std::vector<unsigned char> got(kBytes);
    ok(cudaMemcpy(got.data(), in[e], kBytes, cudaMemcpyDeviceToHost));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < kBytes; ++i) bad += got[i] != pattern(from, me, e, i);
    EXPECT_EQ(bad, 0u) << "exchange " << e;
  }
  handles.clear();
  for (int e = 0; e < kExchanges; ++e) {
    ok(cudaFree(out[e]));
    ok(cudaFree(in[e]));
  }
}

// The collectives take host memory on every backend.
TEST(DeviceComm, HostCollectives) {
  SKIP_WITHOUT_DEVICE();
  const int me = g_device->rank(), n = g_device->size();
  const std::int64_t mine = 1000 + me;
  std::vector<std::int64_t> all(n);
  g_device->all_gather(&mine, sizeof mine, all.data());
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], 1000 + r);
  std::vector<std::size_t> counts;
  std::size_t total = 0;
  for (int r = 0; r < n; ++r) total += counts.emplace_back(r + 1);
  std::vector<char> piece(me + 1, static_cast<char>('a' + me)), gathered(total);
  g_device->all_gather_v(piece.data(), counts, gathered.data());
  std::size_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i <= r; ++i) EXPECT_EQ(gathered[at++], 'a' + r) << "rank " << r;
  g_device->barrier();
}

TEST(DeviceComm, BadPeerIsAnError) {
  SKIP_WITHOUT_DEVICE();
  if (g_backend != "nccl") GTEST_SKIP() << "peer checks of staged are the host communicator's";
  void* buf = nullptr;
  ok(cudaMalloc(&buf, 16));
  try {
    g_device->start({{g_device->size(), buf, 16, 0}}, {});
    ADD_FAILURE() << "a send to a rank that does not exist started";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("names peer"), std::string::npos) << e.what();
  }
  ok(cudaFree(buf));
}

}  // namespace
}  // namespace flexcp

int main(int argc, char** argv) {
  return flexcp::test::run_device_tests(argc, argv, flexcp::g_host, flexcp::g_device,
                                        flexcp::g_backend, flexcp::g_skip);
}
