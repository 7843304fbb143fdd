// flexcp bench: times the attention kernel on random inputs over a mask (DESIGN §4).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "cli_options.h"
#include "commands.h"
#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "timing.h"
#if defined(FLEXCP_TOOLS_CUDA)
#include "device_tensor.h"
#endif

namespace flexcp::tools {
namespace {

struct BenchArgs {
  MaskArgs mask;
  ShapeArgs shape{8, 8, 128, "bf16"};
  std::string device = "cpu";
  bool backward = false;
  bool deterministic = false;
  bool dist = false;  // also through DistAttention on one rank (NCCL)
  bool json = false;
  int warmup = 1, repeat = 3;
  int warmup_ms = 0;  // untimed runs for at least this long after `warmup` (timing.h)
  std::string only;   // one direction timed ("fwd", "bwd", "fwd+bwd"); empty: all asked
};

// The directions a bench times: the forward, and with --backward the backward and the pair;
// --only keeps one (an A/B of one direction then spends no device time on the others).
struct Directions {
  bool fwd, bwd, fwd_bwd;
};
Directions directions(const BenchArgs& a) {
  if (a.only.empty()) return {true, a.backward, a.backward};
  return {a.only == "fwd", a.only == "bwd", a.only == "fwd+bwd"};
}

// One direction's median seconds (0 where not timed) and when its timed runs ran.
struct Timed {
  double seconds = 0;
  TimedWindow window;
};
struct Times {
  Timed fwd, bwd, fwd_bwd;
};

#if defined(FLEXCP_TOOLS_CUDA)
// One way of running the forward and, with --backward, the backward on the device, with the state
// it owns; it stays where it was built (the calls point into it).
struct DeviceCalls {
  std::function<void()> fwd, bwd;  // bwd empty without --backward
  virtual ~DeviceCalls() = default;
};

// The bare kernel: the plan built and bound once, as in training where every layer shares the
// mask, so that each call only launches. The backward runs on the forward's out and lse.
struct KernelCalls : DeviceCalls {
  const DeviceTensor q, k, v, out, lse;
  std::optional<DeviceTensor> dout, dq, dk, dv;
  AttentionPlan plan;
  const DeviceWorkspace workspace;
  KernelCalls(const HostTensor& hq, const HostTensor& hk, const HostTensor& hv, const Mask& mask,
              const HostTensor& hout, const HostTensor& hlse, const HostTensor* hdout,
              const AttentionOptions& options)
      : q(hq),
        k(hk),
        v(hv),
        out(hout),
        lse(hlse),
        plan(mask,
             {mask.seqlen_q(), mask.seqlen_k(), hq.shape()[1], hk.shape()[1], hq.shape()[2],
              hq.view().dtype, Device::kCuda},
             {.backward = hdout != nullptr}),
        workspace(plan) {
    fwd = [this] { forward(plan, q.view(), k.view(), v.view(), out.view(), lse.view()); };
    if (hdout == nullptr) return;
    dout.emplace(*hdout), dq.emplace(hq), dk.emplace(hk), dv.emplace(hv);
    bwd = [this, options] {
      backward(plan, dout->view(), q.view(), k.view(), v.view(), out.view(), lse.view(), dq->view(),
               dk->view(), dv->view(), options);
    };
  }
};

// A tensor in one rank's order (dispatched by `dist`).
HostTensor dispatched(const DistAttention& dist, const HostTensor& t, bool kv) {
  HostTensor local(t.view().dtype, t.shape());
  if (kv)
    dist.dispatch_kv(t.view(), local.view());
  else
    dist.dispatch_q(t.view(), local.view());
  return local;
}

DistAttentionOptions on_device() {
  DistAttentionOptions o;
  o.plan.device = Device::kCuda;
  return o;
}

// The same calls through DistAttention on one rank over flexcp's NCCL communicator: what the
// distributed path costs beyond the kernels (a stream-ordered allocation of the context's
// columns, the own K/V copied into them beside the kernel, events; no exchange). The inputs are
// dispatched first (one rank's order is the global one, but the bench does not rely on it).
struct DistCalls : DeviceCalls {
  std::unique_ptr<Communicator> comm;
  DistAttention dist;
  const DeviceTensor q, k, v, out, lse;
  std::optional<DeviceTensor> dout, dq, dk, dv;
  DistContext ctx;
  DistCalls(const HostTensor& hq, const HostTensor& hk, const HostTensor& hv, const Mask& mask,
            const HostTensor* hdout, const AttentionOptions& options)
      : comm(make_nccl_communicator(make_nccl_unique_id(), 0, 1)),
        dist(mask, *comm, hq.shape()[1], hk.shape()[1], hq.shape()[2], hq.view().dtype,
             on_device()),
        q(dispatched(dist, hq, false)),
        k(dispatched(dist, hk, true)),
        v(dispatched(dist, hv, true)),
        out(hq),
        lse(HostTensor(DType::kFloat32, {hq.shape()[0], hq.shape()[1]})) {
    fwd = [this, options] {
      ctx = dist.forward(q.view(), k.view(), v.view(), out.view(), lse.view(), options);
    };
    if (hdout == nullptr) return;
    dout.emplace(dispatched(dist, *hdout, false)), dq.emplace(hq), dk.emplace(hk), dv.emplace(hv);
    bwd = [this] {
      dist.backward(ctx, dout->view(), q.view(), out.view(), lse.view(), dq->view(), dk->view(),
                    dv->view());
    };
  }
};

// Median device seconds of each way, per direction (fwd; with a backward, bwd and the pair back to
// back), their samples taken in turn so that the ratios between them are fair.
std::vector<Times> device_times(const std::vector<const DeviceCalls*>& ways, Directions dirs,
                                int warmup, int repeat, int warmup_ms) {
  std::vector<Times> t(ways.size());
  auto time = [&](auto&& call_of, Timed Times::*field) {
    std::vector<std::function<void()>> fns;
    for (const DeviceCalls* w : ways) fns.push_back(call_of(*w));
    TimedWindow window;
    const std::vector<double> medians =
        alternating_median_device_seconds(fns, std::max(warmup, 1), repeat, warmup_ms, &window);
    for (std::size_t i = 0; i < ways.size(); ++i) t[i].*field = {medians[i], window};
  };
  if (dirs.fwd) time([](const DeviceCalls& w) { return w.fwd; }, &Times::fwd);
  if (dirs.bwd) {
    if (!dirs.fwd)
      for (const DeviceCalls* w : ways) w->fwd();  // the out and lse that the backward reads
    time([](const DeviceCalls& w) { return w.bwd; }, &Times::bwd);
  }
  if (dirs.fwd_bwd)
    time(
        [](const DeviceCalls& w) {
          return std::function<void()>([&w] {
            w.fwd();
            w.bwd();
          });
        },
        &Times::fwd_bwd);
  return t;
}
#endif

// Median seconds on the GPU (event-timed) of the bare kernel and, with `dist`, of the same calls
// through DistAttention (the second entry), sampled in turn.
std::vector<Times> time_on_device(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                  const Mask& mask, HostTensor& out, HostTensor& lse,
                                  const HostTensor* dout, const AttentionOptions& options,
                                  bool dist, Directions dirs, int warmup, int repeat,
                                  int warmup_ms) {
#if defined(FLEXCP_TOOLS_CUDA)
  const KernelCalls kernel(q, k, v, mask, out, lse, dout, options);
  std::optional<DistCalls> through_dist;
  std::vector<const DeviceCalls*> ways{&kernel};
  if (dist) ways.push_back(&through_dist.emplace(q, k, v, mask, dout, options));
  return device_times(ways, dirs, warmup, repeat, warmup_ms);
#else
  static_cast<void>(
      std::tie(q, k, v, mask, out, lse, dout, options, dist, dirs, warmup, repeat, warmup_ms));
  throw Error(
      Status::kNotCompiled,
      "flexcp bench: --device cuda: this build has no CUDA kernels (configured without CUDA)");
#endif
}

void run_bench(const BenchArgs& a) {
  const DType dtype = parse_dtype(a.shape.dtype);
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  HostTensor q(dtype, {tq, a.shape.heads, a.shape.head_dim}),
      k(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      v(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      out(dtype, {tq, a.shape.heads, a.shape.head_dim}), lse(DType::kFloat32, {tq, a.shape.heads});
  std::uint64_t seed = 2024;
  for (HostTensor* t : {&q, &k, &v}) t->fill_uniform(seed++, 1.0f);
  const double flops = forward_flops(mask.area(), a.shape.head_dim, a.shape.heads);
  nlohmann::json results = nlohmann::json::array();
  // kernel_seconds: for a time through DistAttention, the bare kernel's, for the ratio. The
  // window (monotonic seconds, timing.h) lets a clock sampler in another process average over
  // the timed runs only (bench/gpu_clocks.py).
  auto report = [&](const char* dir, const Timed& timed, double dir_flops,
                    double kernel_seconds = 0) {
    const double seconds = timed.seconds;
    const double tflops = dir_flops / seconds / 1e12;
    const bool dist = kernel_seconds > 0;
    const std::string head =
        "[case] mask=" + describe_mask(a.mask) + " Tq=" + std::to_string(tq) +
        " Tk=" + std::to_string(tk) + " H=" + std::to_string(a.shape.heads) +
        " HK=" + std::to_string(a.shape.heads_kv) + " D=" + std::to_string(a.shape.head_dim) +
        " dtype=" + a.shape.dtype + " device=" + a.device + " dir=" + dir +
        (a.deterministic ? " deterministic=1" : "") + (dist ? " path=dist" : "");
    if (a.json) {
      results.push_back({{"mask", describe_mask(a.mask)},
                         {"seqlen_q", tq},
                         {"seqlen_k", tk},
                         {"heads", a.shape.heads},
                         {"heads_kv", a.shape.heads_kv},
                         {"head_dim", a.shape.head_dim},
                         {"dtype", a.shape.dtype},
                         {"device", a.device},
                         {"direction", dir},
                         {"deterministic", a.deterministic},
                         {"area", mask.area()},
                         {"path", dist ? "dist" : "kernel"},
                         {"time_us", seconds * 1e6},
                         {"tflops", tflops},
                         {"window_s", {timed.window.from_s, timed.window.to_s}}});
      if (dist) results.back()["kernel_over_dist"] = kernel_seconds / seconds;
    } else if (dist) {
      std::printf("%s [result] time_us=%.1f TFLOPS=%.4f kernel_over_dist=%.4f window_s=%.6f:%.6f\n",
                  head.c_str(), seconds * 1e6, tflops, kernel_seconds / seconds,
                  timed.window.from_s, timed.window.to_s);
    } else {
      std::printf("%s [result] time_us=%.1f TFLOPS=%.4f window_s=%.6f:%.6f\n", head.c_str(),
                  seconds * 1e6, tflops, timed.window.from_s, timed.window.to_s);
    }
  };
  std::optional<HostTensor> dout;
  if (a.backward) {
    dout.emplace(dtype, std::vector<std::int64_t>{tq, a.shape.heads, a.shape.head_dim});
    dout->fill_uniform(seed++, 1.0f);
  }
  AttentionOptions options;
  options.deterministic = a.deterministic;
  const Directions dirs = directions(a);
  Times t;
  std::optional<Times> through_dist;  // --dist: the same calls through DistAttention
  if (a.device == "cuda") {
    const std::vector<Times> times =
        time_on_device(q, k, v, mask, out, lse, dout ? &*dout : nullptr, options, a.dist, dirs,
                       a.warmup, a.repeat, a.warmup_ms);
    t = times.front();
    if (a.dist) through_dist = times.back();
  } else {
    // On the CPU too the plan is built once, so that the times are the kernels'.
    const AttentionShape shape{tq, tk, a.shape.heads, a.shape.heads_kv, a.shape.head_dim, dtype};
    const AttentionPlan plan(mask, shape, {.backward = a.backward});
    auto fwd = [&] { forward(plan, q.view(), k.view(), v.view(), out.view(), lse.view()); };
    auto time = [&](const std::function<void()>& fn, Timed& into) {
      into.seconds = median_seconds(fn, a.warmup, a.repeat, a.warmup_ms, &into.window);
    };
    if (dirs.fwd)
      time(fwd, t.fwd);
    else
      fwd();  // the out and lse that the backward reads
    if (dout) {
      HostTensor dq(dtype, q.shape()), dk(dtype, k.shape()), dv(dtype, v.shape());
      auto bwd = [&] {
        backward(plan, dout->view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                 dq.view(), dk.view(), dv.view());
      };
      if (dirs.bwd) time(bwd, t.bwd);
      if (dirs.fwd_bwd)
        time(
            [&] {
              fwd();
              bwd();
            },
            t.fwd_bwd);
    }
  }
  if (dirs.fwd) report("fwd", t.fwd, flops);
  if (dirs.bwd) report("bwd", t.bwd, kBackwardFlopsRatio * flops);
  if (dirs.fwd_bwd) report("fwd+bwd", t.fwd_bwd, (1 + kBackwardFlopsRatio) * flops);
  if (through_dist) {
    const Times& d = *through_dist;
    if (dirs.fwd) report("fwd", d.fwd, flops, t.fwd.seconds);
    if (dirs.bwd) report("bwd", d.bwd, kBackwardFlopsRatio * flops, t.bwd.seconds);
    if (dirs.fwd_bwd)
      report("fwd+bwd", d.fwd_bwd, (1 + kBackwardFlopsRatio) * flops, t.fwd_bwd.seconds);
  }
  if (a.json) std::cout << results.dump() << "\n";
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Time the attention kernel on a mask (TFLOPS on attended pairs)");
  add_mask_options(*cmd, args->mask);
  add_shape_options(*cmd, args->shape);
  cmd->add_option("--device", args->device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--backward", args->backward, "Time the backward too");
  cmd->add_option("--only", args->only,
                  "Time one direction only: fwd, bwd or fwd+bwd (the last two imply --backward)")
      ->check(CLI::IsMember({"fwd", "bwd", "fwd+bwd"}));
  cmd->add_flag("--deterministic", args->deterministic,
                "Backward with dQ in a fixed order (bitwise repeatable; the CPU's always is)");
  cmd->add_flag("--dist", args->dist,
                "With --device cuda: also through DistAttention on one rank (NCCL), with the "
                "ratio to the bare kernel (what the distributed path costs)");
  cmd->add_flag("--json", args->json, "One JSON array instead of text lines");
  cmd->add_option("--warmup", args->warmup, "Untimed runs first")
      ->check(whole_number(0))
      ->capture_default_str();
  cmd->add_option("--warmup-ms", args->warmup_ms,
                  "Untimed runs for at least this many milliseconds more, after --warmup (a GPU "
                  "meets its power limit after about a second of sustained work)")
      ->check(whole_number(0))
      ->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Timed runs (the median is reported)")
      ->check(whole_number(1))
      ->capture_default_str();
  cmd->callback([args] {
    if (args->dist && args->device != "cuda")
      throw CLI::ValidationError("--dist", "needs --device cuda");
    if (args->only == "bwd" || args->only == "fwd+bwd") args->backward = true;
    run_bench(*args);
  });
}

}  // namespace flexcp::tools
