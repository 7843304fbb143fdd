// Bad arguments give Error(kInvalidArgument) with a message naming the argument and what was
// expected; outputs are left alone.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "test_util.h"

namespace flexcp {
namespace {

using test::Tensor;

struct Fixture {
  Tensor q{DType::kFloat32, {8, 4, 16}}, k{DType::kFloat32, {10, 2, 16}},
      v{DType::kFloat32, {10, 2, 16}};
  Tensor out{DType::kFloat32, {8, 4, 16}}, lse{DType::kFloat32, {8, 4}};
  Mask mask = masks::causal(8, 10);
  Fixture() {
    for (Tensor* t : {&q, &k, &v}) t->fill(0.5);
    out.poison();
  }
};

std::string error_of(const std::function<void()>& fn, Status want = Status::kInvalidArgument) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    return e.what();
  }
  return "no error";
}

TEST(Errors, ForwardShapeDtypeAndDeviceMistakes) {
  Fixture f;
  auto fwd = [&](TensorView q, TensorView k, TensorView v, TensorView out, TensorView lse,
                 AttentionOptions o = {}) {
    return error_of([&] { forward(q, k, v, f.mask, out, lse, o); });
  };
  TensorView q2 = f.q.view;
  q2.ndim = 2;
  EXPECT_EQ(fwd(q2, f.k.view, f.v.view, f.out.view, f.lse.view),
            "flexcp::forward: q has 2 dims, expected [Tq, Hq, D]");
  Tensor k3(DType::kFloat32, {10, 3, 16});
  EXPECT_EQ(fwd(f.q.view, k3.view, f.v.view, f.out.view, f.lse.view),
            "flexcp::forward: q has 4 heads and k 3, expected Hq to be a multiple of Hk");
  Tensor kb(DType::kBFloat16, {10, 2, 16});
  EXPECT_EQ(fwd(f.q.view, kb.view, f.v.view, f.out.view, f.lse.view),
            "flexcp::forward: k has dtype bf16, expected fp32");
  Tensor q9(DType::kFloat32, {9, 4, 16});
  EXPECT_EQ(fwd(q9.view, f.k.view, f.v.view, f.out.view, f.lse.view),
            "flexcp::forward: q has 9 tokens but the mask has seqlen_q 8");
  Tensor vd(DType::kFloat32, {10, 2, 8});
  EXPECT_EQ(fwd(f.q.view, f.k.view, vd.view, f.out.view, f.lse.view),
            "flexcp::forward: v has shape [10, 2, 8], expected dim 2 to be 16 (head dim of q)");
  Tensor lse_bad(DType::kFloat32, {8, 3});
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, f.out.view, lse_bad.view),
            "flexcp::forward: lse has shape [8, 3], expected dim 1 to be 4 (heads of q)");
  Tensor out_bf(DType::kBFloat16, {8, 4, 16});
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, out_bf.view, f.lse.view),
            "flexcp::forward: out has dtype bf16, expected fp32");
  // Output aliasing an input would destroy what the user passed.
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, f.q.view, f.lse.view),
            "flexcp::forward: out overlaps q in memory; outputs need their own buffers");
  AttentionOptions bad;
  bad.softcap = -1;
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, bad),
            "flexcp::forward: softcap is -1.000000, expected a finite number >= 0");
  bad = {};
  bad.scale = NAN;
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, bad),
            "flexcp::forward: scale is nan, expected a finite number");
  Tensor sink(DType::kFloat32, {3});
  bad = {};
  bad.sink = sink.view;
  EXPECT_EQ(fwd(f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, bad),
            "flexcp::forward: sink has shape [3], expected dim 0 to be 4 (heads of q)");
  TensorView kdev = f.k.view;
  kdev.device = Device::kCuda;
  EXPECT_EQ(fwd(f.q.view, kdev, f.v.view, f.out.view, f.lse.view),
            "flexcp::forward: k is on cuda:0, expected cpu (the device of q)");
  // Nothing above wrote to out.
  for (std::int64_t i = 0; i < f.out.numel(); ++i) ASSERT_TRUE(std::isnan(f.out.get(i)));
}

TEST(Errors, BackwardMistakes) {
  Fixture f;
  forward(f.q.view, f.k.view, f.v.view, f.mask, f.out.view, f.lse.view);
  Tensor dout(DType::kFloat32, {8, 4, 16}), dq(DType::kFloat32, {8, 4, 16}),
      dk(DType::kFloat32, {10, 2, 16}), dv(DType::kFloat32, {10, 2, 16}),
      dsink(DType::kFloat32, {4});
  EXPECT_EQ(error_of([&] {
              backward(dout.view, f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, f.mask,
                       dq.view, dk.view, dk.view);
            }),
            "flexcp::backward: dk overlaps dv in memory; outputs need their own buffers");
  EXPECT_EQ(error_of([&] {
              backward(dout.view, f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, f.mask,
                       dq.view, dk.view, dv.view, {}, dsink.view);
            }),
            "flexcp::backward: dsink was given but the options carry no sink");
  Tensor dq_short(DType::kFloat32, {8, 4, 8});
  EXPECT_EQ(error_of([&] {
              backward(dout.view, f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view, f.mask,
                       dq_short.view, dk.view, dv.view);
            }),
            "flexcp::backward: dq has shape [8, 4, 8], expected [8, 4, 16]");
  // fp32 dK and dV go together (bf16 inputs, fp32 dk, bf16 dv).
  Tensor qb(DType::kBFloat16, {8, 4, 16}), kb(DType::kBFloat16, {10, 2, 16}),
      vb(DType::kBFloat16, {10, 2, 16}), ob(DType::kBFloat16, {8, 4, 16}),
      gq(DType::kBFloat16, {8, 4, 16}), gv(DType::kBFloat16, {10, 2, 16});
  EXPECT_EQ(error_of([&] {
              backward(ob.view, qb.view, kb.view, vb.view, ob.view, f.lse.view, f.mask, gq.view,
                       dk.view, gv.view);
            }),
            "flexcp::backward: dv has dtype bf16, expected fp32");
}

TEST(Errors, PlansCheckTheirWorkAndTheTensorsTheyRunOn) {
  Fixture f;
  const AttentionShape shape{8, 10, 4, 2, 16, DType::kFloat32, Device::kCpu};
  const AttentionPlan plan(f.mask, shape);
  EXPECT_EQ(plan.area(), f.mask.area());
  EXPECT_EQ(plan.workspace_bytes(), 0u);
  Tensor q9(DType::kFloat32, {9, 4, 16});
  EXPECT_EQ(error_of([&] { forward(plan, q9.view, f.k.view, f.v.view, f.out.view, f.lse.view); }),
            "flexcp::forward: q has shape [9, 4, 16], expected [8, 4, 16] (the plan's shape)");
  Tensor qb(DType::kBFloat16, {8, 4, 16}), kb(DType::kBFloat16, {10, 2, 16});
  EXPECT_EQ(error_of([&] { forward(plan, qb.view, kb.view, kb.view, f.out.view, f.lse.view); }),
            "flexcp::forward: q has dtype bf16, expected fp32 (the plan's dtype)");
  EXPECT_EQ(
      error_of(
          [&] { forward(AttentionPlan(), f.q.view, f.k.view, f.v.view, f.out.view, f.lse.view); },
          Status::kInvalidUsage),
      "flexcp::forward: the plan is empty (default-constructed or moved from)");
  EXPECT_EQ(error_of([] {
              AttentionPlan(masks::causal(8, 8), {8, 10, 4, 2, 16});
            }),
            "flexcp::AttentionPlan: the mask is 8 x 8 tokens, expected the shape's 8 x 10");
  // Bands given directly are checked like a mask's slices: inside the shape, no pair twice.
  const Band full = slice_band({{0, 8}, {0, 10}, MaskType::kFull});
  const Band tail = slice_band({{6, 8}, {9, 12}, MaskType::kFull});
  EXPECT_EQ(error_of([&] { AttentionPlan({tail}, shape); }),
            "flexcp::AttentionPlan: work band 0 covers rows [6, 8) and columns [9, 12), expected "
            "inside [0, 8) x [0, 10)");
  EXPECT_EQ(error_of([&] {
              AttentionPlan({full, slice_band({{3, 4}, {5, 6}, MaskType::kFull})}, shape);
            }),
            "flexcp::AttentionPlan: work bands 0 and 1 (of the non-empty ones) both cover the "
            "pair (q=3, k=5); the work must not cover a pair twice");
  // Nothing above wrote to out.
  for (std::int64_t i = 0; i < f.out.numel(); ++i) ASSERT_TRUE(std::isnan(f.out.get(i)));
}

TEST(Errors, HostPlansHaveNoWorkspaceAndDevicePlansNeedOne) {
  const AttentionPlan host(masks::causal(8, 8), {8, 8, 2, 1, 16, DType::kFloat32});
  AttentionPlan copy = AttentionPlan(masks::causal(8, 8), {8, 8, 2, 1, 16, DType::kFloat32});
  EXPECT_EQ(error_of([&] { copy.bind_workspace(nullptr, 0); }, Status::kInvalidUsage),
            "flexcp::AttentionPlan::bind_workspace: a host plan needs no workspace");
  EXPECT_FALSE(host.has_workspace());
}

TEST(Errors, CudaTensorsWithoutACudaKernelSayNotCompiled) {
  Fixture f;
  TensorView q = f.q.view, k = f.k.view, v = f.v.view, out = f.out.view, lse = f.lse.view;
  for (TensorView* t : {&q, &k, &v, &out, &lse}) t->device = Device::kCuda;
  const std::string msg =
      error_of([&] { forward(q, k, v, f.mask, out, lse); }, Status::kNotCompiled);
  // fp32: no CUDA kernel takes it (CUDA builds); no CUDA kernel at all (CPU-only builds).
  EXPECT_NE(msg.find("flexcp::forward: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA kernel"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexcp
