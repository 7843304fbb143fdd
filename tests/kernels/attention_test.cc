// CPU forward and backward against the float64 reference (DESIGN §6): the kernel's error may be at
// most twice that of a naive implementation in the same input precision, plus a small atol.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "non_finite.h"
#include "test_util.h"

namespace flexcp {
namespace {

using test::Tensor;

struct Case {
  std::string name;
  std::int64_t tq, tk, hq, hk, d;
  DType dtype = DType::kFloat32;
  double softcap = 0.0;
  bool sink = false;
  double scale = 0.0;
};

// Small absolute slack on top of the 2x rule: the naive error can be ~0 on tiny outputs.
double atol_for(DType dtype) {
  return dtype == DType::kFloat32 ? 2e-6 : 2e-4;
}

struct Run {
  Tensor q, k, v, dout, sink;
  AttentionOptions options;
};

Run make_inputs(std::mt19937_64& rng, const Case& c) {
  Run r;
  r.q = test::random_tensor(rng, c.dtype, {c.tq, c.hq, c.d}, 2.0);
  r.k = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d}, 2.0);
  r.v = test::random_tensor(rng, c.dtype, {c.tk, c.hk, c.d});
  r.dout = test::random_tensor(rng, c.dtype, {c.tq, c.hq, c.d});
  r.options.scale = c.scale;
  r.options.softcap = c.softcap;
  if (c.sink) {
    r.sink = test::random_tensor(rng, DType::kFloat32, {c.hq}, 2.0);
    r.options.sink = r.sink.view;
  }
  return r;
}

void check_case(const Case& c, const Mask& mask, std::mt19937_64& rng) {
  SCOPED_TRACE(c.name + " tq=" + std::to_string(c.tq) + " tk=" + std::to_string(c.tk) +
               " hq=" + std::to_string(c.hq) + " hk=" + std::to_string(c.hk) +
               " d=" + std::to_string(c.d) + " dtype=" + dtype_name(c.dtype));
  Run in = make_inputs(rng, c);
  const AttentionOptions& o = in.options;

  Tensor ref_out(DType::kFloat64, {c.tq, c.hq, c.d}), ref_lse(DType::kFloat64, {c.tq, c.hq});
  reference_forward(in.q.view, in.k.view, in.v.view, mask, ref_out.view, ref_lse.view, o);
  Tensor naive_out, naive_lse;
  test::naive_forward(in.q.view, in.k.view, in.v.view, mask, o, c.dtype, naive_out, naive_lse);

  Tensor out(c.dtype, {c.tq, c.hq, c.d}), lse(DType::kFloat32, {c.tq, c.hq});
  out.poison();
  lse.poison();
  forward(in.q.view, in.k.view, in.v.view, mask, out.view, lse.view, o);
  const double tol_out = 2 * test::max_abs_diff(naive_out, ref_out) + atol_for(c.dtype);
  EXPECT_LE(test::max_abs_diff(test::as_fp64(out), ref_out), tol_out);
  EXPECT_LE(test::max_abs_diff(test::as_fp64(lse), ref_lse),
            2 * test::max_abs_diff(naive_lse, ref_lse) + 1e-5);
  for (std::int64_t i = 0; i < ref_lse.numel(); ++i)
    if (std::isinf(ref_lse.get(i))) {  // a row that attends nothing: lse -inf and out exactly 0
      ASSERT_EQ(lse.get(i), -INFINITY);
      for (std::int64_t d = 0; d < c.d; ++d) ASSERT_EQ(out.get(i * c.d + d), 0.0);
    }

  // Forward again: bit-identical (no atomics, fixed order).
  Tensor out2(c.dtype, {c.tq, c.hq, c.d}), lse2(DType::kFloat32, {c.tq, c.hq});
  forward(in.q.view, in.k.view, in.v.view, mask, out2.view, lse2.view, o);
  EXPECT_EQ(out.bytes, out2.bytes);
  EXPECT_EQ(lse.bytes, lse2.bytes);

  Tensor ref_dq(DType::kFloat64, {c.tq, c.hq, c.d}), ref_dk(DType::kFloat64, {c.tk, c.hk, c.d}),
      ref_dv(DType::kFloat64, {c.tk, c.hk, c.d}), ref_dsink(DType::kFloat64, {c.hq});
  reference_backward(in.dout.view, in.q.view, in.k.view, in.v.view, mask, ref_dq.view, ref_dk.view,
                     ref_dv.view, o, c.sink ? ref_dsink.view : TensorView{});
  Tensor naive_dq, naive_dk, naive_dv;
  test::naive_backward(in.dout.view, in.q.view, in.k.view, in.v.view, mask, o, c.dtype, naive_dq,
                       naive_dk, naive_dv);

  Tensor dq(c.dtype, {c.tq, c.hq, c.d}), dk(c.dtype, {c.tk, c.hk, c.d}),
      dv(c.dtype, {c.tk, c.hk, c.d});
  Tensor dsink(DType::kFloat32, {c.hq});
  for (Tensor* t : {&dq, &dk, &dv, &dsink}) t->poison();
  backward(in.dout.view, in.q.view, in.k.view, in.v.view, out.view, lse.view, mask, dq.view,
           dk.view, dv.view, o, c.sink ? dsink.view : TensorView{});
  EXPECT_LE(test::max_abs_diff(test::as_fp64(dq), ref_dq),
            2 * test::max_abs_diff(naive_dq, ref_dq) + atol_for(c.dtype));
  EXPECT_LE(test::max_abs_diff(test::as_fp64(dk), ref_dk),
            2 * test::max_abs_diff(naive_dk, ref_dk) + atol_for(c.dtype));
  EXPECT_LE(test::max_abs_diff(test::as_fp64(dv), ref_dv),
            2 * test::max_abs_diff(naive_dv, ref_dv) + atol_for(c.dtype));
  if (c.sink) {
    // dsink as one tensor over the heads, like every other output (DESIGN §6; the Python tests do
    // the same): compared head by head, each head's error is one sample of rounding noise set
    // against another of the same size, which fails the 2x rule for up to 30% of heads (the ratio
    // of two such samples); the GPU split test's deterministic run did, on one head.
    const Tensor naive = test::naive_dsink(in.dout.view, naive_out, naive_lse, in.sink.view);
    EXPECT_LE(test::max_abs_diff(test::as_fp64(dsink), ref_dsink),
              2 * test::max_abs_diff(naive, ref_dsink) + 1e-4);
  }

  Tensor dq2(c.dtype, {c.tq, c.hq, c.d}), dk2(c.dtype, {c.tk, c.hk, c.d}),
      dv2(c.dtype, {c.tk, c.hk, c.d});
  backward(in.dout.view, in.q.view, in.k.view, in.v.view, out.view, lse.view, mask, dq2.view,
           dk2.view, dv2.view, o);
  EXPECT_EQ(dq.bytes, dq2.bytes);
  EXPECT_EQ(dk.bytes, dk2.bytes);
  EXPECT_EQ(dv.bytes, dv2.bytes);
}

TEST(Attention, RandomMasksAwkwardSizesAndGqa) {
  std::mt19937_64 rng(51);
  const std::int64_t sizes[][2] = {{1, 1}, {113, 239}, {239, 113}, {200, 200}, {65, 1}, {1, 130}};
  const std::int64_t heads[][2] = {{1, 1}, {2, 1}, {8, 1}, {4, 2}};
  int i = 0;
  for (auto [tq, tk] : sizes)
    for (auto [hq, hk] : heads) {
      const Mask mask = test::random_mask(rng, tq, tk);
      check_case({"random", tq, tk, hq, hk, (i++ % 2) ? 64 : 40}, mask, rng);
    }
}

TEST(Attention, LongRowsAtHeadDim128) {
  std::mt19937_64 rng(52);
  check_case({"varlen-causal", 1023, 1023, 2, 1, 128}, masks::varlen_causal({300, 1, 600, 122}),
             rng);
  check_case({"sliding", 700, 700, 2, 2, 128},
             masks::sliding_window({500, 200}, 129, masks::WindowKind::kSymmetric), rng);
}

TEST(Attention, LowPrecisionInputs) {
  std::mt19937_64 rng(53);
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    check_case({"causal", 300, 300, 4, 2, 64, dt}, masks::causal(300, 300), rng);
    check_case({"random", 150, 190, 8, 1, 64, dt}, test::random_mask(rng, 150, 190), rng);
  }
}

TEST(Attention, SoftcapSinkAndScale) {
  std::mt19937_64 rng(54);
  check_case({"softcap", 200, 200, 2, 1, 64, DType::kFloat32, 5.0}, masks::causal(200, 200), rng);
  check_case({"sink", 200, 170, 4, 2, 64, DType::kFloat32, 0.0, true},
             test::random_mask(rng, 200, 170), rng);
  check_case({"all", 150, 150, 4, 1, 64, DType::kBFloat16, 3.0, true, 0.3},
             masks::sliding_window({150}, 17, masks::WindowKind::kCausal), rng);
}

TEST(Attention, FullyMaskedRowsAndEmptyMasks) {
  std::mt19937_64 rng(55);
  // Rows 40..89 and every key past 120 are attended by nobody.
  const Mask holes(
      130, 150, {{{0, 40}, {0, 60}, MaskType::kCausal}, {{90, 130}, {10, 120}, MaskType::kFull}});
  check_case({"holes", 130, 150, 2, 1, 64}, holes, rng);
  check_case({"holes-sink", 130, 150, 2, 1, 64, DType::kFloat32, 0.0, true}, holes, rng);
  check_case({"empty", 50, 60, 2, 2, 64}, Mask(50, 60, {}), rng);
  check_case({"causal-tall", 90, 30, 2, 1, 64}, masks::causal(90, 30), rng);  // top 60 rows empty
}

// A NaN (or an infinity) in q is not a masked row: the rows it reaches end as NaN in out and lse,
// and in the gradients of what they touch; the other heads stay finite.
TEST(Attention, NonFiniteInputsShowAsNaNInTheRowsTheyReach) {
  std::mt19937_64 rng(57);
  const test::NonFiniteCase c(rng, 2, 32, DType::kFloat32);
  Tensor out(DType::kFloat32, {c.t, c.hq, c.d}), lse(DType::kFloat32, {c.t, c.hq});
  forward(c.q.view, c.k.view, c.v.view, c.mask(), out.view, lse.view);
  Tensor dq(DType::kFloat32, {c.t, c.hq, c.d}), dk(DType::kFloat32, {c.t, c.hk, c.d}),
      dv(DType::kFloat32, {c.t, c.hk, c.d});
  backward(c.dout.view, c.q.view, c.k.view, c.v.view, out.view, lse.view, c.mask(), dq.view,
           dk.view, dv.view);
  test::expect_nan_exactly_where_reached(c, out, lse, dq, dk, dv);
}

// The reference gradients themselves, against central finite differences of the reference
// forward in float64 (loss = sum dout * out).
TEST(Attention, ReferenceGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(56);
  const std::int64_t tq = 7, tk = 9, hq = 2, hk = 1, d = 5;
  const Mask mask = test::random_mask(rng, tq, tk);
  Tensor q = test::random_tensor(rng, DType::kFloat64, {tq, hq, d}),
         k = test::random_tensor(rng, DType::kFloat64, {tk, hk, d}),
         v = test::random_tensor(rng, DType::kFloat64, {tk, hk, d}),
         dout = test::random_tensor(rng, DType::kFloat64, {tq, hq, d}),
         sink = test::random_tensor(rng, DType::kFloat32, {hq});
  AttentionOptions o;
  o.softcap = 2.0;
  o.sink = sink.view;
  auto loss = [&]() {
    Tensor out(DType::kFloat64, {tq, hq, d}), lse(DType::kFloat64, {tq, hq});
    reference_forward(q.view, k.view, v.view, mask, out.view, lse.view, o);
    double l = 0;
    for (std::int64_t i = 0; i < out.numel(); ++i) l += out.get(i) * dout.get(i);
    return l;
  };
  Tensor dq(DType::kFloat64, {tq, hq, d}), dk(DType::kFloat64, {tk, hk, d}),
      dv(DType::kFloat64, {tk, hk, d}), dsink(DType::kFloat64, {hq});
  reference_backward(dout.view, q.view, k.view, v.view, mask, dq.view, dk.view, dv.view, o,
                     dsink.view);
  const double eps = 1e-6;
  for (auto [x, g] : {std::pair{&q, &dq}, {&k, &dk}, {&v, &dv}})
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      const double x0 = x->get(i);
      x->set(i, x0 + eps);
      const double up = loss();
      x->set(i, x0 - eps);
      const double down = loss();
      x->set(i, x0);
      ASSERT_NEAR(g->get(i), (up - down) / (2 * eps), 1e-6);
    }
  // Sinks are fp32 inputs: a coarser step.
  for (std::int64_t h = 0; h < hq; ++h) {
    const double s0 = sink.get(h), step = 1e-2;
    sink.set(h, s0 + step);
    const double up = loss();
    sink.set(h, s0 - step);
    const double down = loss();
    sink.set(h, s0);
    ASSERT_NEAR(dsink.get(h), (up - down) / (2 * step), 1e-4);
  }
}

// dK and dV into fp32 tensors: the kernel's sums unrounded. Rounded to the input dtype they are
// the bits the same call writes into input-dtype gradients; dq is the same.
TEST(Attention, Fp32KeyGradientsRoundToTheInputDtypesBits) {
  std::mt19937_64 rng(61);
  const std::int64_t tq = 190, tk = 230, hq = 8, hk = 2, d = 64;
  for (const DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Mask mask = test::random_mask(rng, tq, tk);
    const Tensor q = test::random_tensor(rng, dt, {tq, hq, d}, 2.0),
                 k = test::random_tensor(rng, dt, {tk, hk, d}, 2.0),
                 v = test::random_tensor(rng, dt, {tk, hk, d}),
                 dout = test::random_tensor(rng, dt, {tq, hq, d});
    Tensor out(dt, {tq, hq, d}), lse(DType::kFloat32, {tq, hq});
    forward(q.view, k.view, v.view, mask, out.view, lse.view);
    Tensor dq(dt, {tq, hq, d}), dk(dt, {tk, hk, d}), dv(dt, {tk, hk, d});
    Tensor dq2(dt, {tq, hq, d}), dk32(DType::kFloat32, {tk, hk, d}),
        dv32(DType::kFloat32, {tk, hk, d});
    for (Tensor* t : {&dq, &dk, &dv, &dq2, &dk32, &dv32}) t->poison();
    backward(dout.view, q.view, k.view, v.view, out.view, lse.view, mask, dq.view, dk.view,
             dv.view);
    backward(dout.view, q.view, k.view, v.view, out.view, lse.view, mask, dq2.view, dk32.view,
             dv32.view);
    EXPECT_EQ(test::rounded_to(dk32, dt).bytes, dk.bytes);
    EXPECT_EQ(test::rounded_to(dv32, dt).bytes, dv.bytes);
    EXPECT_EQ(dq2.bytes, dq.bytes);
  }
}

// out into an fp32 tensor: the normalised fp32 sums unrounded. Rounded to the input dtype they are
// the bits the same call writes into an input-dtype out; lse is the same.
TEST(Attention, Fp32OutputRoundsToTheInputDtypesBits) {
  std::mt19937_64 rng(62);
  const std::int64_t tq = 170, tk = 210, hq = 8, hk = 2, d = 64;
  for (const DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Mask mask = test::random_mask(rng, tq, tk);
    const Tensor q = test::random_tensor(rng, dt, {tq, hq, d}, 2.0),
                 k = test::random_tensor(rng, dt, {tk, hk, d}, 2.0),
                 v = test::random_tensor(rng, dt, {tk, hk, d});
    Tensor out(dt, {tq, hq, d}), out32(DType::kFloat32, {tq, hq, d});
    Tensor lse(DType::kFloat32, {tq, hq}), lse32(DType::kFloat32, {tq, hq});
    for (Tensor* t : {&out, &out32, &lse, &lse32}) t->poison();
    forward(q.view, k.view, v.view, mask, out.view, lse.view);
    forward(q.view, k.view, v.view, mask, out32.view, lse32.view);
    EXPECT_EQ(test::rounded_to(out32, dt).bytes, out.bytes);
    EXPECT_EQ(lse32.bytes, lse.bytes);
  }
}

TEST(Attention, StridedInputsAndOutputs) {
  // q, k, v as views into one interleaved [T, 3, H, D] buffer, out with a padded row stride.
  std::mt19937_64 rng(57);
  const std::int64_t t = 97, h = 2, d = 64;
  Tensor qkv = test::random_tensor(rng, DType::kFloat32, {t, 3, h, d});
  auto part = [&](int which) {
    TensorView view =
        make_view(static_cast<float*>(qkv.view.data) + which * h * d, DType::kFloat32, {t, h, d});
    view.strides[0] = 3 * h * d;
    return view;
  };
  const Mask mask = masks::causal(t, t);
  std::vector<float> out_buf(t * (h * d + 8), NAN), lse_buf(t * h, NAN);
  TensorView out = make_view(out_buf.data(), DType::kFloat32, {t, h, d});
  out.strides[0] = h * d + 8;
  forward(part(0), part(1), part(2), mask, out, make_view(lse_buf.data(), DType::kFloat32, {t, h}));
  Tensor ref(DType::kFloat64, {t, h, d}), ref_lse(DType::kFloat64, {t, h});
  reference_forward(part(0), part(1), part(2), mask, ref.view, ref_lse.view);
  for (std::int64_t x = 0; x < t; ++x)
    for (std::int64_t i = 0; i < h * d; ++i) {
      ASSERT_NEAR(out_buf[x * (h * d + 8) + i], ref.get(x * h * d + i), 1e-5);
    }
  for (std::int64_t x = 0; x < t; ++x)  // the padding between rows is untouched
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(std::isnan(out_buf[x * (h * d + 8) + h * d + i]));
}

}  // namespace
}  // namespace flexcp
