// The Hopper forward against the float64 reference (DESIGN §6): its error may be at most twice that
// of a naive implementation in the same input precision, plus a small atol. Outputs are poisoned
// on the device first; rows that attend nothing must read exactly 0 and -inf. Skips, saying why,
// where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cuda/device.h"
#include "kernels/sm90/sm90_forward.h"
#include "test_util.h"

namespace flexcp {
namespace {

using test::Tensor;

#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    std::string why;                                                                          \
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here (" << why << ")"; \
  } while (0)

void cuda_ok(cudaError_t err) {
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

// A device copy of a host tensor (or NaN-poisoned storage of its shape).
struct DeviceCopy {
  void* ptr = nullptr;
  TensorView view;
  explicit DeviceCopy(const Tensor& host, bool poison = false) : view(host.view) {
    const std::size_t bytes = host.bytes.size();
    cuda_ok(cudaMalloc(&ptr, bytes + 16));
    if (poison)
      cuda_ok(cudaMemset(ptr, 0xff, bytes));  // all-ones bits: NaN in fp32, bf16 and fp16
    else
      cuda_ok(cudaMemcpy(ptr, host.bytes.data(), bytes, cudaMemcpyHostToDevice));
    view.data = ptr;
    view.device = Device::kCuda;
  }
  void copy_to(Tensor& host) const {
    cuda_ok(cudaDeviceSynchronize());
    cuda_ok(cudaMemcpy(host.bytes.data(), ptr, host.bytes.size(), cudaMemcpyDeviceToHost));
  }
  ~DeviceCopy() { cudaFree(ptr); }
};

struct Case {
  std::string name;
  std::int64_t tq, tk, hq, hk, d;
  DType dtype = DType::kBFloat16;
  double softcap = 0.0;
  bool sink = false;
  double scale = 0.0;
};

void check_case(const Case& c, const Mask& mask, std::mt19937_64& rng) {
  SCOPED_TRACE(c.name + " tq=" + std::to_string(c.tq) + " tk=" + std::to_string(c.tk) +
               " hq=" + std::to_string(c.hq) + " hk=" + std::to_string(c.hk) +
               " d=" + std::to_string(c.d) + " dtype=" + dtype_name(c.dtype));
  const Tensor q = test::random_tensor(rng, c.dtype, {c.tq, c.hq, c.d}, 2.0);
  const Tensor k = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d}, 2.0);
  const Tensor v = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d});
  Tensor sink;
  AttentionOptions o;
  o.scale = c.scale;
  o.softcap = c.softcap;
  if (c.sink) {
    sink = test::random_tensor(rng, DType::kFloat32, {c.hq}, 2.0);
    o.sink = sink.view;
  }

  Tensor ref_out(DType::kFloat64, {c.tq, c.hq, c.d}), ref_lse(DType::kFloat64, {c.tq, c.hq});
  reference_forward(q.view, k.view, v.view, mask, ref_out.view, ref_lse.view, o);
  Tensor naive_out, naive_lse;
  test::naive_forward(q.view, k.view, v.view, mask, o, c.dtype, naive_out, naive_lse);

  Tensor out(c.dtype, {c.tq, c.hq, c.d}), lse(DType::kFloat32, {c.tq, c.hq});
  {
    const DeviceCopy dq(q), dk(k), dv(v), dout(out, true), dlse(lse, true);
    forward(dq.view, dk.view, dv.view, mask, dout.view, dlse.view, o);
    dout.copy_to(out);
    dlse.copy_to(lse);
  }
  const double naive_err = test::max_abs_diff(naive_out, ref_out);
  const double err = test::max_abs_diff(test::as_fp64(out), ref_out);
  EXPECT_LE(err, 2 * naive_err + 2e-4) << "naive error " << naive_err;
  EXPECT_LE(test::max_abs_diff(test::as_fp64(lse), ref_lse),
            2 * test::max_abs_diff(naive_lse, ref_lse) + 1e-4);
  for (std::int64_t i = 0; i < ref_lse.numel(); ++i)
    if (std::isinf(ref_lse.get(i))) {  // a row that attends nothing: lse -inf and out exactly 0
      ASSERT_EQ(lse.get(i), -INFINITY) << "row " << i / c.hq << " head " << i % c.hq;
      for (std::int64_t d = 0; d < c.d; ++d) ASSERT_EQ(out.get(i * c.d + d), 0.0);
    }
}

TEST(Sm90Forward, StandardMasks) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(71);
  check_case({"causal", 1024, 1024, 2, 2, 128}, masks::causal(1024, 1024), rng);
  check_case({"full-cross", 113, 1023, 8, 2, 64, DType::kFloat16}, masks::full(113, 1023), rng);
  check_case({"varlen-causal", 777, 777, 8, 1, 128}, masks::varlen_causal({300, 1, 129, 200, 147}),
             rng);
  check_case({"sliding-window", 1000, 1000, 6, 2, 128, DType::kFloat16},
             masks::sliding_window({1000}, 100, masks::WindowKind::kCausal), rng);
  check_case({"block-causal", 900, 900, 4, 4, 64}, masks::block_causal({500, 400}, 128), rng);
  check_case({"prefix-lm", 600, 600, 2, 1, 128}, masks::prefix_lm({350, 250}, {100, 7}), rng);
}

TEST(Sm90Forward, RandomSliceSetsAwkwardSizesAndGqa) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(72);
  const std::int64_t sizes[][2] = {{1, 1}, {113, 239}, {239, 113}, {1023, 300}, {65, 1}, {1, 130}};
  const std::int64_t heads[][2] = {{1, 1}, {2, 1}, {8, 1}, {12, 4}, {16, 2}};
  int i = 0;
  for (auto [tq, tk] : sizes)
    for (auto [hq, hk] : heads) {
      const DType dtype = (i % 3 == 0) ? DType::kFloat16 : DType::kBFloat16;
      check_case({"random", tq, tk, hq, hk, (i++ % 2) ? 64 : 128, dtype},
                 test::random_mask(rng, tq, tk), rng);
    }
}

TEST(Sm90Forward, SoftcapSinkAndScale) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(73);
  check_case({"softcap", 300, 300, 2, 1, 128, DType::kBFloat16, 5.0}, masks::causal(300, 300), rng);
  check_case({"sink", 200, 170, 4, 2, 64, DType::kFloat16, 0.0, true},
             test::random_mask(rng, 200, 170), rng);
  check_case({"negative-scale", 257, 257, 4, 1, 128, DType::kBFloat16, 0.0, false, -0.1},
             masks::causal(257, 257), rng);
  check_case({"all", 150, 150, 4, 1, 64, DType::kBFloat16, 3.0, true, 0.3},
             masks::sliding_window({150}, 17, masks::WindowKind::kCausal), rng);
}

TEST(Sm90Forward, FullyMaskedRowsAndEmptyMasks) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(74);
  const Mask holes(
      330, 350, {{{0, 40}, {0, 60}, MaskType::kCausal}, {{190, 330}, {10, 320}, MaskType::kFull}});
  check_case({"holes", 330, 350, 2, 1, 128}, holes, rng);
  check_case({"holes-sink", 330, 350, 2, 1, 64, DType::kBFloat16, 0.0, true}, holes, rng);
  check_case({"empty", 50, 60, 2, 2, 64}, Mask(50, 60, {}), rng);
  check_case({"causal-tall", 290, 30, 2, 1, 128}, masks::causal(290, 30), rng);
}

// Many tiles and every SM busy: a long varlen mask, so that the persistent walk wraps around.
TEST(Sm90Forward, LongVarlenGqa) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(75);
  check_case({"varlen-causal-long", 4100, 4100, 16, 2, 128},
             masks::varlen_causal({1500, 2000, 77, 523}), rng);
}

// Same inputs, same bits: no atomics on results, fixed order within each row.
TEST(Sm90Forward, Deterministic) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(76);
  const Mask mask = test::random_mask(rng, 700, 900);
  const Tensor q = test::random_tensor(rng, DType::kBFloat16, {700, 8, 128});
  const Tensor k = test::random_tensor(rng, DType::kBFloat16, {900, 2, 128});
  const Tensor v = test::random_tensor(rng, DType::kBFloat16, {900, 2, 128});
  Tensor out1(DType::kBFloat16, {700, 8, 128}), out2 = out1;
  Tensor lse1(DType::kFloat32, {700, 8}), lse2 = lse1;
  const DeviceCopy dq(q), dk(k), dv(v), dout(out1, true), dlse(lse1, true);
  forward(dq.view, dk.view, dv.view, mask, dout.view, dlse.view);
  dout.copy_to(out1);
  dlse.copy_to(lse1);
  // Several launches back to back on one stream (the scheduler's counters reset in between).
  for (int i = 0; i < 5; ++i) forward(dq.view, dk.view, dv.view, mask, dout.view, dlse.view);
  dout.copy_to(out2);
  dlse.copy_to(lse2);
  EXPECT_EQ(out1.bytes, out2.bytes);
  EXPECT_EQ(lse1.bytes, lse2.bytes);

  // The same mask on two streams at once: each stream has its own scheduler state.
  cudaStream_t streams[2];
  for (cudaStream_t& st : streams) cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const DeviceCopy dout_b(out1, true), dlse_b(lse1, true);
  for (int i = 0; i < 3; ++i) {
    AttentionOptions o;
    o.cuda_stream = streams[0];
    forward(dq.view, dk.view, dv.view, mask, dout.view, dlse.view, o);
    o.cuda_stream = streams[1];
    forward(dq.view, dk.view, dv.view, mask, dout_b.view, dlse_b.view, o);
  }
  Tensor out3 = out1, lse3 = lse1;
  dout_b.copy_to(out3);
  dlse_b.copy_to(lse3);
  dout.copy_to(out2);
  for (cudaStream_t st : streams) cuda_ok(cudaStreamDestroy(st));
  EXPECT_EQ(out1.bytes, out2.bytes);
  EXPECT_EQ(out1.bytes, out3.bytes);
  EXPECT_EQ(lse1.bytes, lse3.bytes);
}

// What the GPU path refuses, with the argument named: pruned or absent instantiations, fp32, and
// layouts TMA cannot read. Runs without a GPU too where the check comes before any device call.
TEST(Sm90Forward, ClearErrors) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(77);
  auto expect_error = [&](std::int64_t d, DType dtype, Status status, const char* text,
                          bool misalign = false) {
    const Tensor q = test::random_tensor(rng, dtype, {64, 2, d});
    const Tensor k = test::random_tensor(rng, dtype, {64, 2, d});
    Tensor out(dtype, {64, 2, d}), lse(DType::kFloat32, {64, 2});
    const DeviceCopy dq(q), dk(k), dout(out, true), dlse(lse, true);
    TensorView qv = dq.view;
    if (misalign) qv.data = static_cast<char*>(qv.data) + 2;
    try {
      forward(qv, dk.view, dk.view, masks::causal(64, 64), dout.view, dlse.view);
      ADD_FAILURE() << "expected an error containing '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(96, DType::kBFloat16, Status::kNotCompiled, "head dim 96");
  expect_error(64, DType::kFloat32, Status::kNotCompiled, "fp32");
  expect_error(64, DType::kBFloat16, Status::kInvalidArgument, "q has strides", true);
  EXPECT_TRUE(sm90::compiled(DType::kBFloat16, 128) || sm90::compiled(DType::kFloat16, 64));
}

}  // namespace
}  // namespace flexcp
