// The host does not wait for the stream where it need not. A call with a mask plans and copies its
// work lists each time; from pageable memory that copy would first wait for all the stream's
// earlier work, so the lists go through pinned staging blocks (kernels/cuda/host_staging.h), each
// reused only once its copy has completed. Here a stream is held shut by a host function until the
// test opens it: a call that waited for the stream would find it shut; the gate gives up after
// 60 s and says so, so that the test fails instead of hanging. Skips where no GPU is present.
#include "kernels/cuda/host_staging.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace flexcp {
namespace {

using test::cuda_ok;
using test::DeviceCopy;
using test::Tensor;

// Holds `stream` shut from its construction until open().
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    cuda_ok(cudaLaunchHostFunc(stream, &StreamGate::wait, this));
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(stream_);  // the host function is done with `this`
  }
  void open() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  // After the stream has passed the gate: whether it waited out its 60 s (someone waited for it).
  bool gave_up() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return gave_up_;
  }

 private:
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(g->mutex_);
    g->gave_up_ = !g->opened_.wait_for(lock, std::chrono::seconds(60), [g] { return g->open_; });
  }
  cudaStream_t stream_;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false, gave_up_ = false;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

std::vector<unsigned char> pattern(std::size_t bytes, unsigned seed) {
  std::vector<unsigned char> v(bytes);
  std::mt19937 rng(seed);
  for (unsigned char& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

std::vector<unsigned char> read_back(const void* device, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  cuda_ok(cudaMemcpy(v.data(), device, bytes, cudaMemcpyDeviceToHost));
  return v;
}

std::int64_t non_finite(const Tensor& t) {
  const Tensor x = test::as_fp64(t);
  const auto* p = reinterpret_cast<const double*>(x.bytes.data());
  std::int64_t n = 0;
  for (std::size_t i = 0; i < x.bytes.size() / sizeof(double); ++i) n += !std::isfinite(p[i]);
  return n;
}

auto fill_with(const std::vector<unsigned char>& bytes) {
  return [&bytes](unsigned char* dst) { std::memcpy(dst, bytes.data(), bytes.size()); };
}

TEST(HostStaging, CopiesWithoutWaitingAndReusesOnlyCompletedBlocks) {
  SKIP_WITHOUT_GPU();
  cuda::HostStaging pool(std::size_t{64} << 20);
  const Stream stream;
  const std::size_t n = 100000;  // one 128 KiB block each
  const auto a = pattern(n, 1), b = pattern(n, 2), c = pattern(3 * n, 3), d = pattern(n, 4);
  unsigned char* dst = nullptr;
  cuda_ok(cudaMalloc(&dst, 6 * n));
  {
    StreamGate gate(stream.s);
    EXPECT_TRUE(pool.copy_to_device(dst, n, stream.s, fill_with(a), "test"));
    // A's copy has not run (the stream is shut): B must not overwrite its block.
    EXPECT_TRUE(pool.copy_to_device(dst + n, n, stream.s, fill_with(b), "test"));
    EXPECT_EQ(pool.blocks(), 2u);
    EXPECT_TRUE(pool.copy_to_device(dst + 2 * n, 3 * n, stream.s, fill_with(c), "test"));
    EXPECT_EQ(pool.blocks(), 3u);
    EXPECT_EQ(pool.pinned_bytes(), std::size_t{(128 + 128 + 512) << 10});
    gate.open();
    cuda_ok(cudaStreamSynchronize(stream.s));
    EXPECT_FALSE(gate.gave_up()) << "a copy waited for the stream";
  }
  EXPECT_EQ(read_back(dst, n), a);
  EXPECT_EQ(read_back(dst + n, n), b);
  EXPECT_EQ(read_back(dst + 2 * n, 3 * n), c);
  // Every copy has completed: the smallest block that holds D is reused.
  EXPECT_TRUE(pool.copy_to_device(dst + 5 * n, n, stream.s, fill_with(d), "test"));
  EXPECT_EQ(pool.blocks(), 3u);
  cuda_ok(cudaStreamSynchronize(stream.s));
  EXPECT_EQ(read_back(dst + 5 * n, n), d);
  cuda_ok(cudaFree(dst));
}

TEST(HostStaging, AFullPoolCopiesFromPageableMemoryAndAFailedFillFreesItsBlock) {
  SKIP_WITHOUT_GPU();
  const Stream stream;
  const std::size_t n = 5000;
  const auto a = pattern(n, 5), b = pattern(n, 6);
  unsigned char* dst = nullptr;
  cuda_ok(cudaMalloc(&dst, 2 * n));
  cuda::HostStaging none(0);
  EXPECT_FALSE(none.copy_to_device(dst, n, stream.s, fill_with(a), "test"));  // pageable
  EXPECT_EQ(none.blocks(), 0u);

  cuda::HostStaging pool(std::size_t{1} << 20);
  EXPECT_THROW(
      pool.copy_to_device(
          dst + n, n, stream.s, [](unsigned char*) { throw std::runtime_error("fill"); }, "test"),
      std::runtime_error);
  EXPECT_TRUE(pool.copy_to_device(dst + n, n, stream.s, fill_with(b), "test"));
  EXPECT_EQ(pool.blocks(), 1u);  // the failed fill's block, given back
  cuda_ok(cudaStreamSynchronize(stream.s));
  EXPECT_EQ(read_back(dst, n), a);
  EXPECT_EQ(read_back(dst + n, n), b);
  cuda_ok(cudaFree(dst));
}

// The calls users make with a mask, forward and backward, queue their work behind a shut stream
// and return; the results are the bits the same calls give on an open one.
TEST(HostStaging, CallsWithAMaskDoNotWaitForTheStream) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(91);
  const std::int64_t t = 1500, hq = 16, hk = 2, d = 128;
  const Mask mask = masks::varlen_causal({600, 77, 823});
  const Tensor q = test::random_tensor(rng, DType::kBFloat16, {t, hq, d}, 2.0);
  const Tensor k = test::random_tensor(rng, DType::kBFloat16, {t, hk, d}, 2.0);
  const Tensor v = test::random_tensor(rng, DType::kBFloat16, {t, hk, d});
  const Tensor dout = test::random_tensor(rng, DType::kBFloat16, {t, hq, d});
  Tensor out(DType::kBFloat16, {t, hq, d}), lse(DType::kFloat32, {t, hq});
  Tensor dq(DType::kBFloat16, {t, hq, d}), dk(DType::kBFloat16, {t, hk, d}), dv = dk;
  const DeviceCopy gq(q), gk(k), gv(v), gdo(dout);
  const Stream stream;
  AttentionOptions o;
  o.cuda_stream = stream.s;
  // gated: behind a shut stream. Ungated first: the first launch of each kernel loads it (CUDA's
  // lazy loading), which may wait for the device; the calls under test are the ones after.
  auto run = [&](bool gated, std::vector<Tensor>& got) {
    const DeviceCopy go(out, true), gl(lse, true), gdq(dq, true), gdk(dk, true), gdv(dv, true);
    // Each call behind its own gate: a failure names the call that waited.
    std::string waited;
    auto call = [&](const char* name, auto&& f) {
      std::optional<StreamGate> gate;
      if (gated) gate.emplace(stream.s);
      f();
      if (!gated) return;
      gate->open();
      cuda_ok(cudaStreamSynchronize(stream.s));
      if (gate->gave_up()) waited += std::string(waited.empty() ? "" : ", ") + name;
    };
    call("forward", [&] { forward(gq.view, gk.view, gv.view, mask, go.view, gl.view, o); });
    call("backward", [&] {
      backward(gdo.view, gq.view, gk.view, gv.view, go.view, gl.view, mask, gdq.view, gdk.view,
               gdv.view, o);
    });
    cuda_ok(cudaStreamSynchronize(stream.s));
    got = {out, lse, dq, dk, dv};
    go.copy_to(got[0]);
    gl.copy_to(got[1]);
    gdq.copy_to(got[2]);
    gdk.copy_to(got[3]);
    gdv.copy_to(got[4]);
    return waited;
  };
  for (const bool deterministic : {true, false}) {  // dq bit for bit in the first only
    o.deterministic = deterministic;
    std::vector<Tensor> want, got;
    run(false, want);
    EXPECT_EQ(run(true, got), "") << "these calls with a mask waited for the stream";
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) {
      if (i != 2 || deterministic) {
        EXPECT_EQ(got[i].bytes, want[i].bytes) << names[i];
      }
      EXPECT_EQ(non_finite(got[i]), 0) << names[i];  // written: its poisoned storage read NaN
    }
  }
}

// A plan's one copy of its lists is not for a graph: a replay would read a staging block that
// later calls reuse. Refused with the reason, the capture still usable.
TEST(HostStaging, BindingAPlanWhileTheStreamCapturesIsRefused) {
  SKIP_WITHOUT_GPU();
  const Mask mask = masks::causal(256, 256);
  AttentionPlan plan(mask, {256, 256, 2, 2, 128, DType::kBFloat16, Device::kCuda, 0});
  void* ws = nullptr;
  cuda_ok(cudaMalloc(&ws, plan.workspace_bytes()));
  const Stream stream;
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  try {
    plan.bind_workspace(ws, plan.workspace_bytes(), stream.s);
    ADD_FAILURE() << "bind_workspace ran on a capturing stream";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("capturing"), std::string::npos) << e.what();
  }
  cuda_ok(cudaStreamEndCapture(stream.s, &graph));
  cuda_ok(cudaGraphDestroy(graph));
  EXPECT_FALSE(plan.has_workspace());
  plan.bind_workspace(ws, plan.workspace_bytes(), stream.s);
  EXPECT_TRUE(plan.has_workspace());
  cuda_ok(cudaStreamSynchronize(stream.s));
  cuda_ok(cudaFree(ws));
}

}  // namespace
}  // namespace flexcp
