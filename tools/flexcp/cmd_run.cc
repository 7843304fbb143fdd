// flexcp run: the main job. Distributed attention on a packed-document mask over the ranks it was
// started with (`mpirun -np 4 flexcp run`), checked against a single-rank forward and backward;
// prints per-rank balance, bytes moved against the plan's prediction, stage timings and total time.
// Exit code 1 on a mismatch.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cli_options.h"
#include "commands.h"
#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "timing.h"

namespace flexcp::tools {
namespace {

struct RunArgs {
  MaskArgs mask;
  ShapeArgs shape{8, 2, 128, "bf16"};
  std::uint64_t seed = 7;
  std::int64_t chunk = 0;
  int stages = 0;
};

// What each rank reports to rank 0.
struct RankReport {
  std::int64_t q_tokens, area, bytes_predicted, bytes_moved, bwd_bytes_moved;
  double forward_ms, backward_ms, wait_ms, compute_ms;
};

struct Errors {
  double out = 0, dq = 0, dk = 0, dv = 0;
};

double max_error(const HostTensor& got, const HostTensor& want, double* magnitude) {
  const std::vector<float> g = got.to_float(), w = want.to_float();
  double worst = 0, mag = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(static_cast<double>(g[i]) - w[i]);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    mag = std::max(mag, std::abs(static_cast<double>(w[i])));
  }
  *magnitude = mag;
  return worst;
}

void run_ranks(RunArgs a, Communicator& comm_ref);

void run_main_job(const RunArgs& a) {
  auto comm = make_mpi_communicator();
  try {
    run_ranks(a, *comm);
  } catch (const Error& e) {
    // One rank failing must not leave the others waiting: end the whole job.
    if (comm->size() > 1) {
      std::fprintf(stderr, "flexcp: error on rank %d (%s): %s\n", comm->rank(),
                   status_string(e.status()), e.what());
      comm->abort(2);
    }
    throw;
  }
}

void run_ranks(RunArgs a, Communicator& comm_ref) {
  if (a.mask.file.empty() && a.mask.kind.empty()) a.mask.kind = "varlen-causal";
  if (a.mask.seqlen == 0) a.mask.seqlen = 32768;
  Communicator* comm = &comm_ref;
  const int rank = comm->rank(), world = comm->size();
  const DType dtype = parse_dtype(a.shape.dtype);
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();

  // The same global inputs on every rank (same seed); each keeps its own rows.
  std::mt19937_64 rng(a.seed);
  HostTensor q(dtype, {tq, a.shape.heads, a.shape.head_dim}),
      k(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      v(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      dout(dtype, {tq, a.shape.heads, a.shape.head_dim});
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_uniform(rng, 1.0f);
  DistAttentionOptions options;
  options.plan.chunk_size = a.chunk;
  options.plan.num_stages = a.stages;
  DistAttention dist(mask, *comm, a.shape.heads, a.shape.heads_kv, a.shape.head_dim, dtype,
                     options);
  const Plan& plan = dist.plan();
  const std::int64_t lq = dist.local_q_tokens(), lk = dist.local_k_tokens();
  HostTensor ql(dtype, {lq, a.shape.heads, a.shape.head_dim}),
      dol(dtype, {lq, a.shape.heads, a.shape.head_dim}),
      kl(dtype, {lk, a.shape.heads_kv, a.shape.head_dim}),
      vl(dtype, {lk, a.shape.heads_kv, a.shape.head_dim});
  dist.dispatch_q(q.view(), ql.view());
  dist.dispatch_q(dout.view(), dol.view());
  dist.dispatch_kv(k.view(), kl.view());
  dist.dispatch_kv(v.view(), vl.view());
  HostTensor ol(dtype, {lq, a.shape.heads, a.shape.head_dim}),
      ll(DType::kFloat32, {lq, a.shape.heads}), dql(dtype, {lq, a.shape.heads, a.shape.head_dim}),
      dkl(dtype, {lk, a.shape.heads_kv, a.shape.head_dim}),
      dvl(dtype, {lk, a.shape.heads_kv, a.shape.head_dim});
  comm->barrier();
  dist.forward(ql.view(), kl.view(), vl.view(), ol.view(), ll.view());
  dist.backward(dol.view(), ql.view(), kl.view(), vl.view(), ol.view(), ll.view(), dql.view(),
                dkl.view(), dvl.view());
  comm->barrier();

  const DistStats& st = dist.stats();
  RankReport mine{lq,
                  plan.ranks[rank].area,
                  plan.ranks[rank].recv_tokens * 2 * a.shape.heads_kv * a.shape.head_dim *
                      static_cast<std::int64_t>(dtype_size(dtype)),
                  st.fwd_bytes_received,
                  st.bwd_bytes_received,
                  st.forward_ms,
                  st.backward_ms,
                  0,
                  0};
  for (const StageTiming& s : st.forward)
    mine.wait_ms += s.wait_ms, mine.compute_ms += s.compute_ms;
  std::vector<RankReport> reports(world);
  comm->all_gather(&mine, sizeof mine, reports.data());

  HostTensor og(dtype, {tq, a.shape.heads, a.shape.head_dim}),
      dqg(dtype, {tq, a.shape.heads, a.shape.head_dim}),
      dkg(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      dvg(dtype, {tk, a.shape.heads_kv, a.shape.head_dim});
  dist.undispatch_q(ol.view(), og.view());
  dist.undispatch_q(dql.view(), dqg.view());
  dist.undispatch_kv(dkl.view(), dkg.view());
  dist.undispatch_kv(dvl.view(), dvg.view());

  int ok = 1;
  if (rank == 0) {
    std::printf("flexcp %s: %d rank(s); mask %s: %zu slices, %lld of %lld pairs attended\n",
                version(), world, describe_mask(a.mask).c_str(), mask.slices().size(),
                static_cast<long long>(mask.area()), static_cast<long long>(tq * tk));
    std::printf(
        "q [%lld, %lld, %lld], k/v [%lld, %lld, %lld], %s; plan: chunk %lld, %d remote stage(s), "
        "imbalance %.4f, "
        "plan_ms %.2f\n",
        (long long)tq, (long long)a.shape.heads, (long long)a.shape.head_dim, (long long)tk,
        (long long)a.shape.heads_kv, (long long)a.shape.head_dim, a.shape.dtype.c_str(),
        (long long)plan.chunk_size, plan.num_stages, plan.imbalance, plan.plan_ms());
    std::printf("%5s %9s %12s %8s %14s %14s %10s %10s %10s %10s\n", "rank", "q_tokens", "area",
                "/mean", "kv_bytes_plan", "kv_bytes_moved", "fwd_ms", "fwd_wait", "bwd_ms",
                "dkv_bytes");
    bool bytes_match = true;
    std::int64_t moved = 0;
    for (int r = 0; r < world; ++r) {
      const RankReport& x = reports[r];
      bytes_match = bytes_match && x.bytes_predicted == x.bytes_moved;
      moved += x.bytes_moved;
      std::printf("%5d %9lld %12lld %8.3f %14lld %14lld %10.1f %10.1f %10.1f %10lld\n", r,
                  (long long)x.q_tokens, (long long)x.area,
                  x.area / (static_cast<double>(mask.area()) / world), (long long)x.bytes_predicted,
                  (long long)x.bytes_moved, x.forward_ms, x.wait_ms, x.backward_ms,
                  (long long)x.bwd_bytes_moved);
    }
    double fwd = 0, bwd = 0, wait = 0, busy = 0;
    for (const RankReport& x : reports) {
      fwd = std::max(fwd, x.forward_ms), bwd = std::max(bwd, x.backward_ms);
      wait += x.wait_ms, busy += x.forward_ms;
    }
    const double flops = forward_flops(mask.area(), a.shape.head_dim, a.shape.heads);
    std::printf(
        "forward %.1f ms (%.1f GFLOPS), backward %.1f ms (%.1f GFLOPS); forward time waiting for "
        "K/V: %.1f%%\n",
        fwd, flops / fwd / 1e6, bwd, kBackwardFlopsRatio * flops / bwd / 1e6,
        busy > 0 ? 100 * wait / busy : 0.0);
    std::printf("stages on rank 0 (wait for K/V / compute, ms):");
    for (std::size_t i = 0; i < st.forward.size(); ++i)
      std::printf(" %zu: %.1f / %.1f", i, st.forward[i].wait_ms, st.forward[i].compute_ms);
    std::printf("\n");
    std::printf("K/V bytes moved %lld, plan predicted %lld: %s\n", (long long)moved,
                (long long)plan.comm_bytes_fwd,
                bytes_match && moved == plan.comm_bytes_fwd ? "equal" : "DIFFERENT");
    ok = bytes_match && moved == plan.comm_bytes_fwd;

    // The single-rank computation, with every core of this machine.
    omp_set_num_threads(omp_get_num_procs());
    HostTensor out(dtype, {tq, a.shape.heads, a.shape.head_dim}),
        lse(DType::kFloat32, {tq, a.shape.heads}), dq(dtype, {tq, a.shape.heads, a.shape.head_dim}),
        dk(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
        dv(dtype, {tk, a.shape.heads_kv, a.shape.head_dim});
    forward(q.view(), k.view(), v.view(), mask, out.view(), lse.view());
    backward(dout.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), mask, dq.view(),
             dk.view(), dv.view());
    // Stages merge in another order than one kernel call: allow a few ulps of the dtype, relative
    // to each tensor's largest value.
    const double ulp =
        dtype == DType::kFloat32 ? 1e-5 : (dtype == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048);
    bool close = true;
    std::printf("check against the single-rank forward and backward:");
    for (auto [name, got, want] :
         {std::tuple{"out", &og, &out}, {"dq", &dqg, &dq}, {"dk", &dkg, &dk}, {"dv", &dvg, &dv}}) {
      double mag = 0;
      const double err = max_error(*got, *want, &mag);
      const double limit = 2 * ulp * std::max(1.0, mag);
      close = close && err <= limit;
      std::printf(" %s %.3g (limit %.3g)", name, err, limit);
    }
    std::printf(": %s\n", close ? "ok" : "MISMATCH");
    ok = ok && close;
  }
  std::vector<int> verdicts(world);
  comm->all_gather(&ok, sizeof ok, verdicts.data());
  if (!verdicts[0]) throw CLI::RuntimeError("distributed result does not match", 1);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "The main job: distributed attention (mpirun -np N flexcp run), checked");
  add_mask_options(*cmd, args->mask);
  add_shape_options(*cmd, args->shape);
  cmd->add_option("--chunk", args->chunk, "Tokens per chunk (default: automatic)");
  cmd->add_option("--stages", args->stages, "Remote stages (default: from the cost model)");
  cmd->add_option("--seed", args->seed, "Random seed for the inputs")->capture_default_str();
  cmd->callback([args] { run_main_job(*args); });
}

}  // namespace flexcp::tools
