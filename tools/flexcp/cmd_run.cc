// flexcp run: the main job. Distributed attention on a packed-document mask over the ranks it was
// started with (`mpirun -np 4 flexcp run`): L layers share one DistAttention, forwards in order and
// backwards in reverse (the training pattern), each layer checked against a single-rank forward and
// backward; prints per-rank balance, bytes moved against the plan's prediction, stage timings and
// total time. Exit code 1 on a mismatch. With --device cuda the layers' shards live on the GPUs
// (rank r on GPU r mod the GPUs here), over NCCL (one rank per GPU) or the staged backend (ranks
// sharing a GPU), checked against one GPU.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli_options.h"
#include "commands.h"
#include "device_tensor.h"
#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "own_work.h"
#include "timing.h"

namespace flexcp::tools {
namespace {

struct RunArgs {
  MaskArgs mask;
  ShapeArgs shape{8, 2, 128, "bf16"};
  std::uint64_t seed = 7;
  std::int64_t chunk = 0;
  std::int64_t chunks_per_rank = 0;
  int stages = 0;
  int layers = 2;
  std::string device = "cpu";
  std::string comm;  // with --device cuda: nccl (the default) or staged
  // --timing R: R timed passes after an untimed one, medians reported, each rank's kernel on its
  // own work timed alike (the weak-scaling baseline); inputs made per rank, nothing checked.
  int timing = 0;
};

// What each rank reports to rank 0 (times summed over layers).
struct RankReport {
  std::int64_t q_tokens, area, num_stages, bytes_predicted, bytes_moved, bwd_bytes_moved;
  std::int32_t bytes_equal;  // every layer moved exactly what the plan predicts
  double forward_ms, backward_ms, wait_ms, plan_ms;
  double model_wait_ms;  // the cost model's exposed wait for K/V in one forward (PlanOptions)
  double kernel_fwd_ms, kernel_bwd_ms;  // --timing: the bare kernel on this rank's own work
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

// One layer's global tensors (the same on every rank: same seed; empty with --timing) and this
// rank's shards of them.
struct Layer {
  HostTensor q, k, v, dout;          // global inputs
  HostTensor ql, kl, vl, dol;        // local shards
  HostTensor ol, ll, dql, dkl, dvl;  // local outputs
  DistContext context;
  Layer(DType dt, std::int64_t tq, std::int64_t tk, std::int64_t lq, std::int64_t lk,
        const ShapeArgs& s)
      : q(dt, {tq, s.heads, s.head_dim}),
        k(dt, {tk, s.heads_kv, s.head_dim}),
        v(dt, {tk, s.heads_kv, s.head_dim}),
        dout(dt, {tq, s.heads, s.head_dim}),
        ql(dt, {lq, s.heads, s.head_dim}),
        kl(dt, {lk, s.heads_kv, s.head_dim}),
        vl(dt, {lk, s.heads_kv, s.head_dim}),
        dol(dt, {lq, s.heads, s.head_dim}),
        ol(dt, {lq, s.heads, s.head_dim}),
        ll(DType::kFloat32, {lq, s.heads}),
        dql(dt, {lq, s.heads, s.head_dim}),
        dkl(dt, {lk, s.heads_kv, s.head_dim}),
        dvl(dt, {lk, s.heads_kv, s.head_dim}) {}
};

// The tensors one layer's distributed calls take: its host shards, or device copies of them.
struct LayerViews {
  TensorView q, k, v, dout, out, lse, dq, dk, dv;
};

LayerViews host_views(const Layer& l) {
  return {l.ql.view(), l.kl.view(),  l.vl.view(),  l.dol.view(), l.ol.view(),
          l.ll.view(), l.dql.view(), l.dkl.view(), l.dvl.view()};
}

#if defined(FLEXCP_TOOLS_CUDA)
// A layer's shards and (poisoned) outputs on the current GPU.
struct DeviceLayer {
  DeviceTensor q, k, v, dout, out, lse, dq, dk, dv;
  explicit DeviceLayer(const Layer& l)
      : q(l.ql),
        k(l.kl),
        v(l.vl),
        dout(l.dol),
        out(l.ol),
        lse(l.ll),
        dq(l.dql),
        dk(l.dkl),
        dv(l.dvl) {}
  LayerViews views() const {
    return {q.view(),   k.view(),  v.view(),  dout.view(), out.view(),
            lse.view(), dq.view(), dk.view(), dv.view()};
  }
  void copy_outputs_to(Layer& l) const {
    out.copy_to(l.ol);
    lse.copy_to(l.ll);
    dq.copy_to(l.dql);
    dk.copy_to(l.dkl);
    dv.copy_to(l.dvl);
  }
};

// The single-GPU forward and backward of a layer's global tensors.
void reference_on_gpu(const Layer& l, const Mask& mask, HostTensor& out, HostTensor& lse,
                      HostTensor& dq, HostTensor& dk, HostTensor& dv) {
  const DeviceTensor q(l.q), k(l.k), v(l.v), dout(l.dout), o(out), s(lse), gq(dq), gk(dk), gv(dv);
  forward(q.view(), k.view(), v.view(), mask, o.view(), s.view());
  backward(dout.view(), q.view(), k.view(), v.view(), o.view(), s.view(), mask, gq.view(),
           gk.view(), gv.view());
  o.copy_to(out);
  gq.copy_to(dq);
  gk.copy_to(dk);
  gv.copy_to(dv);
}
#endif

void run_ranks(RunArgs a, Communicator& comm_ref);

// Every rank of the job says whether its own arguments parsed: a rank whose arguments did not
// takes part too (fail_arguments_of_mpi_rank), so that all ranks end together, each with exit
// code 2 and no MPI_Abort. (A rank that exited before MPI_Init while the others waited in it
// sometimes left Open MPI's mpirun hung, ignoring SIGTERM.)
void agree_on_arguments(Communicator& comm, bool mine_ok) {
  const char ok = mine_ok ? 1 : 0;
  std::vector<char> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&ok, 1, all.data());
  for (int r = 0; r < comm.size(); ++r)
    if (all[static_cast<std::size_t>(r)] == 0)
      throw Error(Status::kInvalidArgument,
                  "flexcp run: rank " + std::to_string(r) +
                      "'s arguments were invalid (its message says why); every rank stops");
}

void run_main_job(const RunArgs& a) {
  auto comm = make_mpi_communicator();
  agree_on_arguments(*comm, true);
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

// Rank 0's check of one layer against the single-rank kernels (on one GPU with --device cuda);
// prints one line.
bool check_layer(int index, const Layer& l, const Mask& mask, DType dtype, bool on_gpu,
                 const HostTensor& og, const HostTensor& dqg, const HostTensor& dkg,
                 const HostTensor& dvg) {
  HostTensor out(dtype, l.q.shape()), lse(DType::kFloat32, {l.q.shape()[0], l.q.shape()[1]}),
      dq(dtype, l.q.shape()), dk(dtype, l.k.shape()), dv(dtype, l.v.shape());
  if (on_gpu) {
#if defined(FLEXCP_TOOLS_CUDA)
    reference_on_gpu(l, mask, out, lse, dq, dk, dv);
#endif
  } else {
    forward(l.q.view(), l.k.view(), l.v.view(), mask, out.view(), lse.view());
    backward(l.dout.view(), l.q.view(), l.k.view(), l.v.view(), out.view(), lse.view(), mask,
             dq.view(), dk.view(), dv.view());
  }
  // Stages merge in another order than one kernel call (and on the GPU dQ sums in arrival
  // order): allow a few ulps of the dtype, relative to each tensor's largest value.
  const double ulp =
      dtype == DType::kFloat32 ? 1e-5 : (dtype == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048);
  bool close = true;
  std::printf("layer %d against one %s:", index, on_gpu ? "GPU" : "rank");
  for (auto [name, got, want] :
       {std::tuple{"out", &og, &out}, {"dq", &dqg, &dq}, {"dk", &dkg, &dk}, {"dv", &dvg, &dv}}) {
    double mag = 0;
    const double err = max_error(*got, *want, &mag);
    const double ulps = on_gpu && got != &og ? 4 : 2;
    const double limit = ulps * ulp * std::max(1.0, mag);
    close = close && err <= limit;
    std::printf(" %s %.3g (limit %.3g)", name, err, limit);
  }
  std::printf(": %s\n", close ? "ok" : "MISMATCH");
  return close;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --timing: each rank's kernel on its own work, and the weak-scaling efficiency per direction.
// The ideal is every rank's own work at the bare kernel's speed, perfectly balanced: the mean of
// the ranks' kernel times; the efficiency is that over the slowest rank's time. Per-GPU TFLOPS
// count the mask's attended pairs over the ranks.
void print_weak_scaling(const std::vector<RankReport>& reports, int passes, double flops,
                        double per_layer) {
  const auto world = static_cast<double>(reports.size());
  std::printf("%5s %14s %14s %10s %10s\n", "rank", "kernel_fwd_ms", "kernel_bwd_ms", "fwd_ms",
              "bwd_ms");
  double kernel_fwd = 0, kernel_bwd = 0, fwd = 0, bwd = 0;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const RankReport& x = reports[r];
    std::printf("%5zu %14.2f %14.2f %10.2f %10.2f\n", r, x.kernel_fwd_ms, x.kernel_bwd_ms,
                x.forward_ms * per_layer, x.backward_ms * per_layer);
    kernel_fwd += x.kernel_fwd_ms / world, kernel_bwd += x.kernel_bwd_ms / world;
    fwd = std::max(fwd, x.forward_ms * per_layer), bwd = std::max(bwd, x.backward_ms * per_layer);
  }
  auto per_gpu_tflops = [&](double f, double ms) { return f / world / (ms * 1e-3) / 1e12; };
  const double bwd_flops = kBackwardFlopsRatio * flops;
  std::printf(
      "weak scaling per layer (median of %d passes): forward %.2f ms on the slowest rank, the "
      "ranks' kernels on their own work %.2f ms on average: efficiency %.3f (%.4g of %.4g "
      "TFLOPS per GPU); backward %.2f ms, kernels %.2f ms: efficiency %.3f (%.4g of %.4g TFLOPS "
      "per GPU)\n",
      passes, fwd, kernel_fwd, kernel_fwd / fwd, per_gpu_tflops(flops, fwd),
      per_gpu_tflops(flops, kernel_fwd), bwd, kernel_bwd, kernel_bwd / bwd,
      per_gpu_tflops(bwd_flops, bwd), per_gpu_tflops(bwd_flops, kernel_bwd));
}

void run_ranks(RunArgs a, Communicator& comm_ref) {
  if (a.mask.file.empty() && a.mask.kind.empty()) a.mask.kind = "varlen-causal";
  if (a.mask.seqlen == 0) a.mask.seqlen = 32768;
  Communicator* comm = &comm_ref;
  const int rank = comm->rank(), world = comm->size();
  const DType dtype = parse_dtype(a.shape.dtype);
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  DistAttentionOptions options;
  options.plan.chunk_size = a.chunk;
  options.plan.chunks_per_rank = a.chunks_per_rank;
  options.plan.num_stages = a.stages;
  const bool on_gpu = a.device == "cuda";
  std::unique_ptr<Communicator> device_comm;  // over the MPI one
  if (on_gpu) {
#if defined(FLEXCP_TOOLS_CUDA)
    options.plan.device = Device::kCuda;
    options.plan.device_index = use_rank_gpu(rank);
    if (a.comm.empty()) a.comm = "nccl";
    device_comm =
        a.comm == "staged" ? make_staged_communicator(comm_ref) : make_nccl_communicator(comm_ref);
#else
    throw Error(Status::kNotCompiled,
                "flexcp run: --device cuda: this build has no CUDA kernels (configured without "
                "CUDA)");
#endif
  }
  DistAttention dist(mask, on_gpu ? *device_comm : *comm, a.shape.heads, a.shape.heads_kv,
                     a.shape.head_dim, dtype, options);
  const Plan& plan = dist.plan();
  const std::int64_t lq = dist.local_q_tokens(), lk = dist.local_k_tokens();

  const bool timing = a.timing > 0;
  std::vector<Layer> layers;
  layers.reserve(a.layers);
  for (int i = 0; i < a.layers; ++i) {
    // With --timing only the shards, random on each rank: no rank holds the global sequence
    // (at a million tokens per GPU it would not fit).
    layers.emplace_back(dtype, timing ? 0 : tq, timing ? 0 : tk, lq, lk, a.shape);
    Layer& l = layers.back();
    if (timing) {
      std::uint64_t seed =
          a.seed + static_cast<std::uint64_t>(i) * 1000003 + static_cast<std::uint64_t>(rank) * 4;
      for (HostTensor* t : {&l.ql, &l.kl, &l.vl, &l.dol}) t->fill_uniform(seed++, 1.0f);
    } else {
      std::uint64_t seed = a.seed + static_cast<std::uint64_t>(i) * 4;
      for (HostTensor* t : {&l.q, &l.k, &l.v, &l.dout}) t->fill_uniform(seed++, 1.0f);
      dist.dispatch_q(l.q.view(), l.ql.view());
      dist.dispatch_q(l.dout.view(), l.dol.view());
      dist.dispatch_kv(l.k.view(), l.kl.view());
      dist.dispatch_kv(l.v.view(), l.vl.view());
    }
    for (HostTensor* t : {&l.ol, &l.ll, &l.dql, &l.dkl, &l.dvl}) t->poison();
  }
  std::vector<LayerViews> views;
#if defined(FLEXCP_TOOLS_CUDA)
  std::vector<std::unique_ptr<DeviceLayer>> on_device;
#endif
  for (const Layer& l : layers) {
#if defined(FLEXCP_TOOLS_CUDA)
    if (on_gpu) {
      on_device.push_back(std::make_unique<DeviceLayer>(l));
      views.push_back(on_device.back()->views());
      continue;
    }
#endif
    views.push_back(host_views(l));
  }
  // On the GPU the calls return before their kernels finish: each direction is timed from the
  // first call to the device's idle (DistStats' per-stage figures are device time there).
  auto wall_ms = [on_gpu](std::chrono::steady_clock::time_point t0) {
#if defined(FLEXCP_TOOLS_CUDA)
    if (on_gpu) device_synchronize();
#endif
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // One pass: every layer's forward, then the backwards in reverse. With --timing an untimed pass
  // first, then the median of the timed ones, per direction.
  std::vector<double> forward_walls, backward_walls;
  for (int pass = 0; pass < (timing ? a.timing + 1 : 1); ++pass) {
    comm->barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const LayerViews& x = views[i];
      layers[i].context = dist.forward(x.q, x.k, x.v, x.out, x.lse);
    }
    const double fwd = wall_ms(t0);
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = layers.size(); i-- > 0;) {
      const LayerViews& x = views[i];
      dist.backward(layers[i].context, x.dout, x.q, x.out, x.lse, x.dq, x.dk, x.dv);
    }
    const double bwd = wall_ms(t0);
    if (timing && pass == 0) continue;
    forward_walls.push_back(fwd);
    backward_walls.push_back(bwd);
  }
  const double forward_wall_ms = median_of(forward_walls);
  const double backward_wall_ms = median_of(backward_walls);
  comm->barrier();
#if defined(FLEXCP_TOOLS_CUDA)
  if (!timing)
    for (std::size_t i = 0; i < on_device.size(); ++i) on_device[i]->copy_outputs_to(layers[i]);
#endif

  const std::int64_t bpt =
      2 * a.shape.heads_kv * a.shape.head_dim * static_cast<std::int64_t>(dtype_size(dtype));
  RankReport mine{lq,
                  plan.rank.area,
                  plan.rank.num_stages,
                  plan.rank.recv_tokens * bpt,
                  0,
                  0,
                  1,
                  0,
                  0,
                  0,
                  plan.plan_ms(),
                  plan.rank.exposed_comm_us / 1000,
                  0,
                  0};
  for (const Layer& l : layers) {
    const DistStats& st = l.context.stats();
    mine.bytes_equal &= st.fwd_bytes_received == mine.bytes_predicted;
    mine.bytes_moved = st.fwd_bytes_received;
    mine.bwd_bytes_moved = st.bwd_bytes_received;
    mine.forward_ms += st.forward_ms;
    mine.backward_ms += st.backward_ms;
    for (const StageTiming& s : st.forward) mine.wait_ms += s.wait_ms;
  }
  if (on_gpu || timing) mine.forward_ms = forward_wall_ms, mine.backward_ms = backward_wall_ms;
  if (timing) {
    const OwnWorkTimes own =
        time_own_work(plan.rank, a.shape, dtype, on_gpu, options.plan.device_index, a.timing);
    mine.kernel_fwd_ms = own.fwd_ms, mine.kernel_bwd_ms = own.bwd_ms;
  }
  std::vector<RankReport> reports(world);
  comm->all_gather(&mine, sizeof mine, reports.data());

  std::vector<HostTensor> gathered;  // per layer: out, dq, dk, dv in global order
  if (!timing) {
    for (const Layer& l : layers) {
      gathered.emplace_back(dtype, l.q.shape());
      gathered.emplace_back(dtype, l.q.shape());
      gathered.emplace_back(dtype, l.k.shape());
      gathered.emplace_back(dtype, l.v.shape());
      HostTensor* g = &gathered[gathered.size() - 4];
      dist.undispatch_q(l.ol.view(), g[0].view());
      dist.undispatch_q(l.dql.view(), g[1].view());
      dist.undispatch_kv(l.dkl.view(), g[2].view());
      dist.undispatch_kv(l.dvl.view(), g[3].view());
    }
  }

  int ok = 1;
  if (rank == 0) {
    const Dispatch& d = plan.dispatch;
    double plan_ms = 0;
    for (const RankReport& x : reports) plan_ms = std::max(plan_ms, x.plan_ms);
    std::printf("flexcp %s: %d rank(s); mask %s: %zu slices, %lld of %lld pairs attended\n",
                version(), world, describe_mask(a.mask).c_str(), mask.slices().size(),
                static_cast<long long>(mask.area()), static_cast<long long>(tq * tk));
    std::printf(
        "q [%lld, %lld, %lld], k/v [%lld, %lld, %lld], %s, %d layer(s) sharing one plan: chunk "
        "%lld (%lld per rank), imbalance %.4f, plan_ms %.2f (slowest rank)\n",
        (long long)tq, (long long)a.shape.heads, (long long)a.shape.head_dim, (long long)tk,
        (long long)a.shape.heads_kv, (long long)a.shape.head_dim, a.shape.dtype.c_str(), a.layers,
        (long long)d.chunk_size, (long long)d.chunks_per_rank, d.imbalance, plan_ms);
    // fwd_wait: the time the forward waited for K/V, measured; model_wait: the cost model's
    // prediction of it (its link and kernel rates, PlanOptions, not this machine's).
    std::printf("%5s %9s %12s %8s %7s %14s %14s %10s %10s %10s %10s %10s\n", "rank", "q_tokens",
                "area", "/mean", "stages", "kv_bytes_plan", "kv_bytes_moved", "fwd_ms", "fwd_wait",
                "model_wait", "bwd_ms", "dkv_bytes");
    bool bytes_match = true;
    std::int64_t moved = 0, predicted = 0;
    const double per_layer = 1.0 / std::max(a.layers, 1);
    for (int r = 0; r < world; ++r) {
      const RankReport& x = reports[r];
      bytes_match = bytes_match && x.bytes_equal;
      moved += x.bytes_moved;
      predicted += x.bytes_predicted;
      std::printf("%5d %9lld %12lld %8.3f %7lld %14lld %14lld %10.1f %10.2f %10.2f %10.1f %10lld\n",
                  r, (long long)x.q_tokens, (long long)x.area,
                  x.area / (static_cast<double>(mask.area()) / world), (long long)x.num_stages,
                  (long long)x.bytes_predicted, (long long)x.bytes_moved, x.forward_ms * per_layer,
                  x.wait_ms * per_layer, x.model_wait_ms, x.backward_ms * per_layer,
                  (long long)x.bwd_bytes_moved);
    }
    double fwd = 0, bwd = 0, wait = 0, busy = 0;
    for (const RankReport& x : reports) {
      fwd = std::max(fwd, x.forward_ms * per_layer), bwd = std::max(bwd, x.backward_ms * per_layer);
      wait += x.wait_ms, busy += x.forward_ms;
    }
    const double flops = forward_flops(mask.area(), a.shape.head_dim, a.shape.heads);
    std::printf(
        "per layer: forward %.1f ms (%.1f GFLOPS), backward %.1f ms (%.1f GFLOPS); forward time "
        "waiting for K/V: %.1f%%\n",
        fwd, flops / fwd / 1e6, bwd, kBackwardFlopsRatio * flops / bwd / 1e6,
        busy > 0 ? 100 * wait / busy : 0.0);
    // On device tensors (over the communicator a.comm) timed by events on the stream.
    std::printf("stages on rank 0, layer 0 (wait for K/V / compute, ms%s%s):",
                on_gpu ? ", device time over " : "", on_gpu ? a.comm.c_str() : "");
    const DistStats& st0 = layers.front().context.stats();
    for (std::size_t i = 0; i < st0.forward.size(); ++i)
      std::printf(" %zu: %.2f / %.2f", i, st0.forward[i].wait_ms, st0.forward[i].compute_ms);
    std::printf("\nbackward stages on rank 0, layer 0 (compute, ms):");
    for (std::size_t i = 0; i < st0.backward.size(); ++i)
      std::printf(" %zu: %.2f", i, st0.backward[i].compute_ms);
    std::printf("; then the wait for dK/dV partials: %.2f ms\n",
                st0.backward.empty() ? 0.0 : st0.backward[0].wait_ms);
    std::printf(
        "K/V bytes moved per layer %lld (as the transport counted them), plan predicted "
        "%lld: %s\n",
        (long long)moved, (long long)predicted,
        bytes_match && moved == predicted ? "equal" : "DIFFERENT");
    ok = bytes_match && moved == predicted;

    if (timing) {
      print_weak_scaling(reports, a.timing, flops, per_layer);
    } else {
      // The single-rank computations, with every core of this machine.
      omp_set_num_threads(omp_get_num_procs());
      for (int i = 0; i < a.layers; ++i)
        ok = check_layer(i, layers[i], mask, dtype, on_gpu, gathered[4 * i], gathered[4 * i + 1],
                         gathered[4 * i + 2], gathered[4 * i + 3]) &&
             ok;
    }
  }
  // Only rank 0 knows the verdict, and the job's exit code is its: the other ranks do not wait
  // for it in a collective, whose deadline (FLEXCP_COMM_TIMEOUT_S) the single-rank check on a
  // loaded machine exceeded (every rank but 0 then failed with a time-out). MPI_Finalize at exit
  // holds them until rank 0 is done, without a deadline.
  if (!ok) throw CLI::RuntimeError("distributed result does not match", 1);
}

}  // namespace

bool fail_arguments_of_mpi_rank(int argc, const char* const* argv) {
  // Only `flexcp run` starts MPI; mpirun's ranks carry its size in the environment.
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (argc < 2 || std::string(argv[1]) != "run" || size == nullptr || std::atoi(size) < 2)
    return false;
  try {
    auto comm = make_mpi_communicator();
    agree_on_arguments(*comm, false);
  } catch (const Error&) {  // expected: this rank's own failure, reported by the caller
  }
  return true;
}

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "The main job: distributed attention (mpirun -np N flexcp run), checked against one rank");
  add_mask_options(*cmd, args->mask);
  add_shape_options(*cmd, args->shape);
  cmd->add_option("--layers", args->layers,
                  "Layers sharing one plan: forwards in order, backwards in reverse")
      ->check(whole_number(1))
      ->capture_default_str();
  cmd->add_option("--chunk", args->chunk,
                  "Tokens per chunk, exactly (their count must be a multiple of the ranks)")
      ->check(whole_number(0));
  cmd->add_option("--chunks-per-rank", args->chunks_per_rank,
                  "Equal chunks per rank (default: chosen)")
      ->check(whole_number(0));
  cmd->add_option("--stages", args->stages, "Remote stages (default: from the cost model)")
      ->check(whole_number(0));
  cmd->add_option("--seed", args->seed, "Random seed for the inputs")->capture_default_str();
  cmd->add_option("--timing", args->timing,
                  "Weak-scaling timing: R timed passes after an untimed one (medians), each "
                  "rank's kernel on its own work timed alike, inputs made per rank, no check "
                  "against one rank (0: one pass, checked)")
      ->check(whole_number(0))
      ->capture_default_str();
  cmd->add_option("--device", args->device,
                  "cpu (MPI, the CPU kernels) or cuda (rank r on GPU r mod the GPUs here)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--comm", args->comm,
                  "With --device cuda: nccl (the default; one rank per GPU) or staged (ranks "
                  "sharing a GPU, through pinned host memory over MPI; slow, for tests)")
      ->check(CLI::IsMember({"nccl", "staged"}));
  cmd->callback([args] {
    if (!args->comm.empty() && args->device != "cuda")
      throw CLI::ValidationError("--comm",
                                 args->comm + " needs --device cuda (CPU ranks talk over MPI)");
    run_main_job(*args);
  });
}

}  // namespace flexcp::tools
