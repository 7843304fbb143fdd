// The Hopper forward against the float64 reference (DESIGN §6): its error may be at most twice that
// of a naive implementation in the same input precision, plus a small atol. Outputs are poisoned
// on the device first; rows that attend nothing must read exactly 0 and -inf. Skips, saying why,
// where no GPU is present.
#include <cmath>
#include <optional>
#include <random>

#include "cuda_test_util.h"
#include "kernels/sm90/sm90_forward.h"

namespace flexcp {
namespace {

using test::Tensor;

using test::cuda_ok;
using test::DeviceCopy;

void check_case(const test::KernelCase& c, const Mask& mask, std::mt19937_64& rng) {
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
    // The sink lives on the device of q too (read by the kernel, no copy per call).
    std::optional<DeviceCopy> dsink;
    AttentionOptions on_device = o;
    if (c.sink) on_device.sink = dsink.emplace(sink).view;
    forward(dq.view, dk.view, dv.view, mask, dout.view, dlse.view, on_device);
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
  test::standard_masks(check_case, rng);
}

TEST(Sm90Forward, RandomSliceSetsAwkwardSizesAndGqa) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(72);
  test::random_slice_sets(check_case, rng);
}

TEST(Sm90Forward, SoftcapSinkAndScale) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(73);
  test::softcap_sink_and_scale(check_case, rng);
}

TEST(Sm90Forward, FullyMaskedRowsAndEmptyMasks) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(74);
  test::fully_masked_rows_and_empty_masks(check_case, rng);
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

  // The same mask on two streams at once: each call plans and binds its own workspace.
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

// out into an fp32 tensor: the kernel's normalised sums unrounded (what the distributed forward
// merges across stages). Rounded to the input dtype they are the bits the same call writes into an
// input-dtype out; lse is the same. Packed GQA heads (hd128) and one head per tile (hd64, fp16),
// with sink and softcap, and rows that attend nothing (out 0).
TEST(Sm90Forward, Fp32OutputRoundsToTheInputDtypesBits) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(77);
  const test::KernelCase cases[] = {{"gqa", 700, 900, 16, 2, 128, DType::kBFloat16, 0, true},
                                    {"mha", 333, 500, 3, 3, 64, DType::kFloat16, 20.0}};
  for (const test::KernelCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Mask mask = test::random_mask(rng, c.tq, c.tk);
    const Tensor q = test::random_tensor(rng, c.dtype, {c.tq, c.hq, c.d}, 2.0);
    const Tensor k = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d}, 2.0);
    const Tensor v = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d});
    const Tensor sink = test::random_tensor(rng, DType::kFloat32, {c.hq}, 2.0);
    Tensor out(c.dtype, {c.tq, c.hq, c.d}), out32(DType::kFloat32, {c.tq, c.hq, c.d});
    Tensor lse(DType::kFloat32, {c.tq, c.hq}), lse32 = lse;
    {
      const DeviceCopy dq(q), dk(k), dv(v), dsink(sink);
      const DeviceCopy o(out, true), o32(out32, true), l(lse, true), l32(lse32, true);
      AttentionOptions opt;
      opt.softcap = c.softcap;
      if (c.sink) opt.sink = dsink.view;
      forward(dq.view, dk.view, dv.view, mask, o.view, l.view, opt);
      forward(dq.view, dk.view, dv.view, mask, o32.view, l32.view, opt);
      o.copy_to(out);
      o32.copy_to(out32);
      l.copy_to(lse);
      l32.copy_to(lse32);
    }
    EXPECT_EQ(test::rounded_to(out32, c.dtype).bytes, out.bytes);
    EXPECT_EQ(lse32.bytes, lse.bytes);
  }
}

// Plan once, bind once, run many times: what a model does with one mask for every layer. Each run
// only launches, so a plan's forward can be captured in a CUDA graph; its replays give the same
// bits as the plain launches, and plans bound to their own workspaces run on two streams at once.
struct PlanCase {
  std::int64_t tq = 1500, tk = 1500, hq = 16, hk = 2, d = 128;
  Mask mask = masks::varlen_causal({600, 77, 823});
  Tensor q, k, v, out, lse;
  explicit PlanCase(std::mt19937_64& rng)
      : q(test::random_tensor(rng, DType::kBFloat16, {tq, hq, d}, 2.0)),
        k(test::random_tensor(rng, DType::kBFloat16, {tk, hk, d}, 2.0)),
        v(test::random_tensor(rng, DType::kBFloat16, {tk, hk, d})),
        out(DType::kBFloat16, {tq, hq, d}),
        lse(DType::kFloat32, {tq, hq}) {}
  AttentionShape shape() const { return {tq, tk, hq, hk, d, DType::kBFloat16, Device::kCuda, 0}; }
};

struct Workspace {
  void* ptr = nullptr;
  explicit Workspace(AttentionPlan& plan, cudaStream_t stream = nullptr) {
    cuda_ok(cudaMalloc(&ptr, plan.workspace_bytes()));
    plan.bind_workspace(ptr, plan.workspace_bytes(), stream);
  }
  ~Workspace() { cudaFree(ptr); }
};

TEST(Sm90Forward, APlanBoundOnceRunsRepeatedlyAndInACudaGraph) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(78);
  PlanCase c(rng);
  const DeviceCopy dq(c.q), dk(c.k), dv(c.v), dout(c.out, true), dlse(c.lse, true);
  // The per-call path first: what every plan run must reproduce bit for bit.
  Tensor want_out = c.out, want_lse = c.lse;
  forward(dq.view, dk.view, dv.view, c.mask, dout.view, dlse.view);
  dout.copy_to(want_out);
  dlse.copy_to(want_lse);

  AttentionPlan plan(c.mask, c.shape());
  EXPECT_GT(plan.workspace_bytes(), 0u);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Workspace ws(plan, stream);
  EXPECT_TRUE(plan.has_workspace());
  AttentionOptions o;
  o.cuda_stream = stream;
  for (int i = 0; i < 3; ++i) forward(plan, dq.view, dk.view, dv.view, dout.view, dlse.view, o);
  Tensor got_out = c.out, got_lse = c.lse;
  cuda_ok(cudaStreamSynchronize(stream));
  dout.copy_to(got_out);
  dlse.copy_to(got_lse);
  EXPECT_EQ(got_out.bytes, want_out.bytes);
  EXPECT_EQ(got_lse.bytes, want_lse.bytes);

  // Captured: the graph holds the launch; poisoned outputs must come back written.
  const DeviceCopy gout(c.out, true), glse(c.lse, true);
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  // A call with a mask would leave the graph a copy of lists freed after the call: refused before
  // it enqueues anything, so that the capture goes on.
  try {
    forward(dq.view, dk.view, dv.view, c.mask, gout.view, glse.view, o);
    ADD_FAILURE() << "a call with a mask ran on a capturing stream";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("AttentionPlan"), std::string::npos) << e.what();
  }
  forward(plan, dq.view, dk.view, dv.view, gout.view, glse.view, o);
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    Tensor replay_out = c.out, replay_lse = c.lse;
    gout.copy_to(replay_out);
    glse.copy_to(replay_lse);
    EXPECT_EQ(replay_out.bytes, want_out.bytes) << "replay " << replay;
    EXPECT_EQ(replay_lse.bytes, want_lse.bytes) << "replay " << replay;
    // Poison again, on the replay's stream: a non-blocking stream does not wait for the legacy
    // default stream, so a plain cudaMemset could land after the next replay's writes.
    cuda_ok(cudaMemsetAsync(gout.ptr, 0xff, c.out.bytes.size(), stream));
    cuda_ok(cudaMemsetAsync(glse.ptr, 0xff, c.lse.bytes.size(), stream));
  }
  cuda_ok(cudaGraphExecDestroy(exec));
  cuda_ok(cudaGraphDestroy(graph));

  // Two plans of one mask, each with its own workspace, on two streams at once.
  AttentionPlan plan_b(c.mask, c.shape());
  cudaStream_t stream_b;
  cuda_ok(cudaStreamCreateWithFlags(&stream_b, cudaStreamNonBlocking));
  const Workspace ws_b(plan_b, stream_b);
  const DeviceCopy bout(c.out, true), blse(c.lse, true);
  AttentionOptions ob;
  ob.cuda_stream = stream_b;
  for (int i = 0; i < 3; ++i) {
    forward(plan, dq.view, dk.view, dv.view, dout.view, dlse.view, o);
    forward(plan_b, dq.view, dk.view, dv.view, bout.view, blse.view, ob);
  }
  cuda_ok(cudaStreamSynchronize(stream));
  cuda_ok(cudaStreamSynchronize(stream_b));
  Tensor b_out = c.out;
  bout.copy_to(b_out);
  dout.copy_to(got_out);
  EXPECT_EQ(b_out.bytes, want_out.bytes);
  EXPECT_EQ(got_out.bytes, want_out.bytes);
  cuda_ok(cudaStreamDestroy(stream));
  cuda_ok(cudaStreamDestroy(stream_b));
}

TEST(Sm90Forward, DevicePlansNeedAWorkspaceOfTheirDevice) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(79);
  PlanCase c(rng);
  const DeviceCopy dq(c.q), dk(c.k), dv(c.v), dout(c.out, true), dlse(c.lse, true);
  AttentionPlan plan(c.mask, c.shape());
  auto error_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(status_string(e.status())) + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of([&] {
              forward(plan, dq.view, dk.view, dv.view, dout.view, dlse.view);
            }).find("invalid usage: flexcp::forward: the plan has no device workspace"),
            std::string::npos);
  std::vector<unsigned char> host(plan.workspace_bytes() + 256);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(host.data()) + 255) / 256 * 256);
  EXPECT_EQ(error_of([&] { plan.bind_workspace(aligned, plan.workspace_bytes()); }),
            "invalid argument: flexcp::AttentionPlan::bind_workspace: workspace is not device "
            "memory of cuda:0");
  void* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, plan.workspace_bytes()));
  EXPECT_NE(error_of([&] { plan.bind_workspace(dev, plan.workspace_bytes() - 1); })
                .find("workspace has " + std::to_string(plan.workspace_bytes() - 1) +
                      " bytes, expected at least " + std::to_string(plan.workspace_bytes()) +
                      " (tile offsets"),
            std::string::npos);
  // A host sink with device tensors is named, never read as device memory.
  Tensor sink = test::random_tensor(rng, DType::kFloat32, {c.hq});
  AttentionOptions o;
  o.sink = sink.view;
  plan.bind_workspace(dev, plan.workspace_bytes());
  EXPECT_EQ(error_of([&] { forward(plan, dq.view, dk.view, dv.view, dout.view, dlse.view, o); }),
            "invalid argument: flexcp::forward: sink is on cpu, expected cuda:0");
  cuda_ok(cudaFree(dev));
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
