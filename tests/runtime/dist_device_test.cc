// DistAttention on device tensors under mpirun: `--backend staged` (any number of ranks sharing
// one GPU) or `--backend nccl` (one rank per GPU). Global inputs are the same on every rank; each
// rank also runs the whole problem on one GPU, and the distributed forward and backward (shards
// dispatched on the host, copied to the device, results copied back and undispatched) must match
// it to within a few ulps of the output dtype (the columns are summed in another order); dK and dV
// repeat bit for bit (fixed-order sums), and so does dq in the deterministic mode; bytes moved are
// the plan's. Skips, saying why, where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "../kernels/cuda_test_util.h"
#include "device_world.h"
#include "flexcp/comm.h"
#include "flexcp/dist_attention.h"

namespace flexcp {
namespace {

using test::cuda_ok;
using test::DeviceCopy;
using test::Tensor;

Communicator* g_host = nullptr;    // MPI
Communicator* g_device = nullptr;  // the backend under test
std::string g_skip;                // why the tests skip (no GPU)

#define SKIP_WITHOUT_DEVICE()                    \
  do {                                           \
    if (!g_skip.empty()) GTEST_SKIP() << g_skip; \
  } while (0)

// `stages` > 0 forces that many remote stages on every rank that receives K/V (0: the cost
// model's choice).
DistAttentionOptions on_device(int stages = 0) {
  DistAttentionOptions o;
  o.plan.device = Device::kCuda;
  o.plan.num_stages = stages;
  int device = 0;
  cudaGetDevice(&device);
  o.plan.device_index = device;
  return o;
}

struct Problem {
  std::string name;
  Mask mask;
  std::int64_t hq, hk, d;
  DType dtype = DType::kBFloat16;
  double softcap = 0;
  bool sink = false;
  bool deterministic = false;
  int stages = 0;  // PlanOptions::num_stages
};

// One GPU's results on the global problem, and the distributed ones, undispatched.
struct Results {
  Tensor out, lse, dq, dk, dv, dsink;
};

Results one_gpu(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& dout, const AttentionOptions& host_options, const Tensor& sink) {
  const std::int64_t tq = p.mask.seqlen_q(), tk = p.mask.seqlen_k();
  Results r{Tensor(p.dtype, {tq, p.hq, p.d}), Tensor(DType::kFloat32, {tq, p.hq}),
            Tensor(p.dtype, {tq, p.hq, p.d}), Tensor(p.dtype, {tk, p.hk, p.d}),
            Tensor(p.dtype, {tk, p.hk, p.d}), Tensor(DType::kFloat32, {p.hq})};
  const DeviceCopy dq_(q), dk_(k), dv_(v), ddo(dout), o(r.out, true), l(r.lse, true);
  const DeviceCopy gq(r.dq, true), gk(r.dk, true), gv(r.dv, true), gs(r.dsink, true), s(sink);
  AttentionOptions opt = host_options;
  if (p.sink) opt.sink = s.view;
  forward(dq_.view, dk_.view, dv_.view, p.mask, o.view, l.view, opt);
  backward(ddo.view, dq_.view, dk_.view, dv_.view, o.view, l.view, p.mask, gq.view, gk.view,
           gv.view, opt, p.sink ? gs.view : TensorView{});
  o.copy_to(r.out);
  l.copy_to(r.lse);
  gq.copy_to(r.dq);
  gk.copy_to(r.dk);
  gv.copy_to(r.dv);
  gs.copy_to(r.dsink);
  return r;
}

// |got - want| <= ulps of the output dtype times the tensor's largest magnitude.
void expect_close(const char* what, const Tensor& got, const Tensor& want, double ulps) {
  const double ulp = got.view.dtype == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  double worst = 0, mag = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_FALSE(std::isnan(got.get(i))) << what << " element " << i;
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
    mag = std::max(mag, std::abs(want.get(i)));
  }
  EXPECT_LE(worst, ulps * ulp * std::max(1.0, mag)) << what;
}

void check_problem(const Problem& p) {
  SCOPED_TRACE(p.name + " on " + std::to_string(g_device->size()) + " ranks");
  if (g_device->rank() == 0) {  // names the problem a crash stopped in
    std::printf("  problem %s on %d ranks\n", p.name.c_str(), g_device->size());
    std::fflush(stdout);
  }
  std::mt19937_64 rng(7);  // the same global inputs on every rank
  const std::int64_t tq = p.mask.seqlen_q(), tk = p.mask.seqlen_k();
  const Tensor q = test::random_tensor(rng, p.dtype, {tq, p.hq, p.d}, 2.0),
               k = test::random_tensor(rng, p.dtype, {tk, p.hk, p.d}, 2.0),
               v = test::random_tensor(rng, p.dtype, {tk, p.hk, p.d}),
               dout = test::random_tensor(rng, p.dtype, {tq, p.hq, p.d}),
               sink = test::random_tensor(rng, DType::kFloat32, {p.hq}, 2.0);
  AttentionOptions options;
  options.softcap = p.softcap;
  options.deterministic = p.deterministic;
  const Results want = one_gpu(p, q, k, v, dout, options, sink);

  DistAttention dist(p.mask, *g_device, p.hq, p.hk, p.d, p.dtype, on_device(p.stages));
  const std::int64_t lq = dist.local_q_tokens(), lk = dist.local_k_tokens();
  Tensor ql(p.dtype, {lq, p.hq, p.d}), kl(p.dtype, {lk, p.hk, p.d}), vl(p.dtype, {lk, p.hk, p.d}),
      dol(p.dtype, {lq, p.hq, p.d});
  dist.dispatch_q(q.view, ql.view);
  dist.dispatch_q(dout.view, dol.view);
  dist.dispatch_kv(k.view, kl.view);
  dist.dispatch_kv(v.view, vl.view);
  Tensor ol(p.dtype, {lq, p.hq, p.d}), ll(DType::kFloat32, {lq, p.hq}),
      dql(p.dtype, {lq, p.hq, p.d}), dkl(p.dtype, {lk, p.hk, p.d}), dvl(p.dtype, {lk, p.hk, p.d}),
      dsink(DType::kFloat32, {p.hq});
  const DeviceCopy dq_(ql), dk_(kl), dv_(vl), ddo(dol), ds(sink);
  const DeviceCopy o(ol, true), l(ll, true), gq(dql, true), gk(dkl, true), gv(dvl, true),
      gs(dsink, true);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  AttentionOptions opt = options;
  opt.cuda_stream = stream;
  if (p.sink) opt.sink = ds.view;
  Tensor dk_again(p.dtype, {lk, p.hk, p.d}), dv_again(p.dtype, {lk, p.hk, p.d}),
      dq_again(p.dtype, {lq, p.hq, p.d});
  // An earlier layer's forward on the same object, on another stream, its context kept alive (as
  // in training): the forward after it, not waited for on the host, must give the same bits, and
  // so must the earlier context's backward (both share the object's scratch memory).
  Tensor ol_earlier(p.dtype, {lq, p.hq, p.d}), ll_earlier(DType::kFloat32, {lq, p.hq}),
      dkl_earlier(p.dtype, {lk, p.hk, p.d}), dvl_earlier(p.dtype, {lk, p.hk, p.d}),
      dql_earlier(p.dtype, {lq, p.hq, p.d}), dsink_earlier(DType::kFloat32, {p.hq});
  const DeviceCopy o_earlier(ol_earlier, true), l_earlier(ll_earlier, true),
      gk_earlier(dkl_earlier, true), gv_earlier(dvl_earlier, true), gq_earlier(dql_earlier, true),
      gs_earlier(dsink_earlier, true);
  cudaStream_t other = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  AttentionOptions opt_other = opt;
  opt_other.cuda_stream = other;
  {
    // Contexts free their memory on the forward's stream: they go before it.
    DistContext earlier =
        dist.forward(dq_.view, dk_.view, dv_.view, o_earlier.view, l_earlier.view, opt_other);
    DistContext ctx = dist.forward(dq_.view, dk_.view, dv_.view, o.view, l.view, opt);
    // The bytes of the plan: K and V of every received piece; fp32 dK and dV of every sent one.
    std::int64_t recv_tokens = 0, send_tokens = 0;
    for (const RemoteRange& r : dist.plan().rank.recv) recv_tokens += r.tokens.size();
    for (const SendRange& s : dist.plan().rank.sends) send_tokens += s.tokens.size();
    const std::int64_t row = p.hk * p.d;
    EXPECT_EQ(ctx.stats().fwd_bytes_received, 2 * recv_tokens * row * 2);  // bf16 and fp16
    // Timed on the device: each stage's exposed wait and kernel, inside the forward's span.
    const DistStats& st = ctx.stats();
    ASSERT_EQ(st.forward.size(), static_cast<std::size_t>(dist.plan().rank.num_stages + 1));
    double stages_ms = 0;
    for (const StageTiming& t : st.forward) {
      EXPECT_GE(t.wait_ms, 0);
      EXPECT_GE(t.compute_ms, 0);
      stages_ms += t.wait_ms + t.compute_ms;
    }
    EXPECT_GT(st.forward[0].compute_ms, 0);
    EXPECT_LE(stages_ms, st.forward_ms + 1e-3);
    dist.backward(ctx, ddo.view, dq_.view, o.view, l.view, gq.view, gk.view, gv.view,
                  p.sink ? gs.view : TensorView{});
    EXPECT_EQ(ctx.stats().bwd_bytes_received, 2 * send_tokens * row * 4);
    EXPECT_EQ(ctx.stats().bwd_bytes_sent, 2 * recv_tokens * row * 4);
    // The backward stage by stage too (the last first), then the wait for this rank's partials.
    const DistStats& bst = ctx.stats();
    ASSERT_EQ(bst.backward.size(), static_cast<std::size_t>(dist.plan().rank.num_stages + 1));
    double bwd_stages_ms = 0, bwd_compute_ms = 0;
    for (std::size_t s = 0; s < bst.backward.size(); ++s) {
      EXPECT_GE(bst.backward[s].compute_ms, 0);
      EXPECT_GE(bst.backward[s].wait_ms, 0);
      if (s > 0) {
        EXPECT_EQ(bst.backward[s].wait_ms, 0);
      }
      bwd_compute_ms += bst.backward[s].compute_ms;
      bwd_stages_ms += bst.backward[s].compute_ms + bst.backward[s].wait_ms;
    }
    EXPECT_GT(bwd_compute_ms, 0);
    EXPECT_LE(bwd_stages_ms, bst.backward_ms + 1e-3);
    cuda_ok(cudaStreamSynchronize(stream));
    gk.copy_to(dk_again);
    gv.copy_to(dv_again);
    gq.copy_to(dq_again);
    dist.backward(ctx, ddo.view, dq_.view, o.view, l.view, gq.view, gk.view, gv.view,
                  p.sink ? gs.view : TensorView{});
    dist.backward(earlier, ddo.view, dq_.view, o_earlier.view, l_earlier.view, gq_earlier.view,
                  gk_earlier.view, gv_earlier.view, p.sink ? gs_earlier.view : TensorView{});
    cuda_ok(cudaStreamSynchronize(stream));
    cuda_ok(cudaStreamSynchronize(other));
  }
  cuda_ok(cudaStreamDestroy(stream));
  cuda_ok(cudaStreamDestroy(other));
  gk_earlier.copy_to(dkl_earlier);
  gv_earlier.copy_to(dvl_earlier);
  EXPECT_EQ(dkl_earlier.bytes, dk_again.bytes);
  EXPECT_EQ(dvl_earlier.bytes, dv_again.bytes);
  o.copy_to(ol);
  l.copy_to(ll);
  o_earlier.copy_to(ol_earlier);
  l_earlier.copy_to(ll_earlier);
  EXPECT_EQ(ol.bytes, ol_earlier.bytes);
  EXPECT_EQ(ll.bytes, ll_earlier.bytes);
  gq.copy_to(dql);
  gk.copy_to(dkl);
  gv.copy_to(dvl);
  gs.copy_to(dsink);
  // A second backward of the same context: dK and dV bit for bit, dq too when deterministic.
  EXPECT_EQ(dkl.bytes, dk_again.bytes);
  EXPECT_EQ(dvl.bytes, dv_again.bytes);
  if (p.deterministic) {
    EXPECT_EQ(dql.bytes, dq_again.bytes);
  }

  Results got{Tensor(p.dtype, {tq, p.hq, p.d}), {},
              Tensor(p.dtype, {tq, p.hq, p.d}), Tensor(p.dtype, {tk, p.hk, p.d}),
              Tensor(p.dtype, {tk, p.hk, p.d}), {}};
  dist.undispatch_q(ol.view, got.out.view);
  dist.undispatch_q(dql.view, got.dq.view);
  dist.undispatch_kv(dkl.view, got.dk.view);
  dist.undispatch_kv(dvl.view, got.dv.view);
  expect_close("out", got.out, want.out, 2);
  expect_close("dq", got.dq, want.dq, 4);
  expect_close("dk", got.dk, want.dk, 4);
  expect_close("dv", got.dv, want.dv, 4);
  const std::vector<std::int64_t> pos = dist.position_ids();
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t h = 0; h < p.hq; ++h) {
      const double w = want.lse.get(pos[i] * p.hq + h), g = ll.get(i * p.hq + h);
      if (std::isinf(w))
        ASSERT_EQ(g, w) << "lse row " << pos[i];
      else
        ASSERT_NEAR(g, w, 1e-4) << "lse row " << pos[i];
    }
  if (p.sink) {
    for (std::int64_t h = 0; h < p.hq; ++h)
      EXPECT_NEAR(dsink.get(h), want.dsink.get(h), 2e-3 * (1 + std::abs(want.dsink.get(h))))
          << "dsink head " << h;
  }
}

TEST(DistDevice, ForwardAndBackwardMatchOneGpu) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(11);  // same on every rank
  const Problem problems[] = {
      {"documents", masks::varlen_causal({900, 77, 1500, 1, 611}), 16, 2, 128},
      {"window-in-documents", masks::sliding_window({1700, 1389}, 256, masks::WindowKind::kCausal),
       8, 8, 64, DType::kFloat16},
      {"multimodal-prefix", masks::prefix_lm({1200, 900}, {300, 500}), 8, 1, 128},
      {"random-slices", test::random_mask(rng, 1531, 1531), 8, 2, 128, DType::kBFloat16, 0, false,
       /*deterministic=*/true},
      {"softcap-sink", masks::causal(2048, 2048), 4, 2, 64, DType::kBFloat16, 5.0, true},
      // Several remote stages per rank (some may be empty): the backward's keys-only plans add
      // into the same fp32 columns one after another, the last stage first.
      {"documents-in-3-stages", masks::varlen_causal({1300, 200, 999, 1500}), 8, 2, 128,
       DType::kBFloat16, 0, false, false, 3},
      {"deterministic-in-3-stages", masks::causal(1800, 1800), 8, 4, 64, DType::kFloat16, 0, true,
       true, 3},
  };
  for (const Problem& p : problems) check_problem(p);
}

TEST(DistDevice, GatheredColumnsAreTheOwnersRows) {
  SKIP_WITHOUT_DEVICE();
  const Mask mask = masks::varlen_causal({500, 300, 800});
  const std::int64_t hk = 2, d = 64, t = mask.seqlen_k();
  DistAttention dist(mask, *g_device, 4, hk, d, DType::kBFloat16, on_device());
  std::mt19937_64 rng(12);
  const Tensor k = test::random_tensor(rng, DType::kBFloat16, {t, hk, d}),
               v = test::random_tensor(rng, DType::kBFloat16, {t, hk, d});
  const std::int64_t lk = dist.local_k_tokens();
  Tensor kl(DType::kBFloat16, {lk, hk, d}), vl(DType::kBFloat16, {lk, hk, d});
  dist.dispatch_kv(k.view, kl.view);
  dist.dispatch_kv(v.view, vl.view);
  std::vector<std::int64_t> cols;  // global token of each column: own rows, then received pieces
  for (const Range& r : dist.plan().rank.k_tokens)
    for (std::int64_t x = r.begin; x < r.end; ++x) cols.push_back(x);
  for (const RemoteRange& r : dist.plan().rank.recv)
    for (std::int64_t x = r.tokens.begin; x < r.tokens.end; ++x) cols.push_back(x);
  const auto n = static_cast<std::int64_t>(cols.size());
  Tensor kb(DType::kBFloat16, {n, hk, d}), vb(DType::kBFloat16, {n, hk, d});
  const DeviceCopy dkl(kl), dvl(vl), dkb(kb, true), dvb(vb, true);
  dist.gather_kv(dkl.view, dvl.view, dkb.view, dvb.view);
  dkb.copy_to(kb);
  dvb.copy_to(vb);
  for (std::int64_t c = 0; c < n; ++c)
    for (std::int64_t j = 0; j < hk * d; ++j) {
      ASSERT_EQ(kb.get(c * hk * d + j), k.get(cols[c] * hk * d + j)) << "column " << c;
      ASSERT_EQ(vb.get(c * hk * d + j), v.get(cols[c] * hk * d + j)) << "column " << c;
    }
}

TEST(DistDevice, TheCommunicatorMustMoveThePlansMemory) {
  SKIP_WITHOUT_DEVICE();
  const Mask mask = masks::causal(256, 256);
  try {
    DistAttention dist(mask, *g_host, 2, 2, 64, DType::kBFloat16, on_device());
    ADD_FAILURE() << "a device plan over a host communicator was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "flexcp::DistAttention: plan.device is cuda but the communicator moves host "
                 "memory; expected device memory (local or mpi for cpu, nccl or staged for cuda)");
  }
  EXPECT_THROW(DistAttention(mask, *g_device, 2, 2, 64, DType::kBFloat16), Error);
}

}  // namespace
}  // namespace flexcp

int main(int argc, char** argv) {
  std::string backend;
  return flexcp::test::run_device_tests(argc, argv, flexcp::g_host, flexcp::g_device, backend,
                                        flexcp::g_skip);
}
