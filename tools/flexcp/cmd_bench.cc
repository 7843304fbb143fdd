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
};

struct Times {
  double fwd = 0, bwd = 0, fwd_bwd = 0;  // median seconds; bwd and fwd_bwd only with backward
};

#if defined(FLEXCP_TOOLS_CUDA)
// Median device seconds of `fwd`, and where there is a `bwd`, of it and of the pair back to back.
Times device_times(const std::function<void()>& fwd, const std::function<void()>& bwd, int warmup,
                   int repeat) {
  Times t;
  const int w = std::max(warmup, 1);
  t.fwd = median_device_seconds(fwd, w, repeat);
  if (!bwd) return t;
  t.bwd = median_device_seconds(bwd, w, repeat);
  t.fwd_bwd = median_device_seconds(
      [&] {
        fwd();
        bwd();
      },
      w, repeat);
  return t;
}

// The same calls through DistAttention on one rank over flexcp's NCCL communicator: what the
// distributed path costs beyond the kernels (the own K/V copied into the context's columns, the
// fp32 dK/dV columns rounded once, events; no exchange). The inputs are dispatched first (one
// rank's order is the global one, but the bench does not rely on it).
Times time_through_dist(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                        const Mask& mask, const HostTensor* dout, const AttentionOptions& options,
                        int warmup, int repeat) {
  auto comm = make_nccl_communicator(make_nccl_unique_id(), 0, 1);
  DistAttentionOptions o;
  o.plan.device = Device::kCuda;
  const DType dtype = q.view().dtype;
  DistAttention dist(mask, *comm, q.shape()[1], k.shape()[1], q.shape()[2], dtype, o);
  HostTensor ql(dtype, q.shape()), kl(dtype, k.shape()), vl(dtype, v.shape()),
      dol(dtype, q.shape());
  dist.dispatch_q(q.view(), ql.view());
  dist.dispatch_kv(k.view(), kl.view());
  dist.dispatch_kv(v.view(), vl.view());
  if (dout != nullptr) dist.dispatch_q(dout->view(), dol.view());
  const DeviceTensor dq(ql), dk(kl), dv(vl), out(ql), g(dol), gq(ql), gk(kl), gv(vl),
      lse(HostTensor(DType::kFloat32, {q.shape()[0], q.shape()[1]}));
  DistContext ctx;
  auto fwd = [&] {
    ctx = dist.forward(dq.view(), dk.view(), dv.view(), out.view(), lse.view(), options);
  };
  std::function<void()> bwd;
  if (dout != nullptr)
    bwd = [&] {
      dist.backward(ctx, g.view(), dq.view(), out.view(), lse.view(), gq.view(), gk.view(),
                    gv.view());
    };
  return device_times(fwd, bwd, warmup, repeat);
}
#endif

// Median seconds on the GPU (event-timed): the plan is built and bound once, as in training where
// every layer shares the mask, so each call only launches. The backward runs on the forward's out
// and lse; fwd+bwd times the pair back to back.
Times time_on_device(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                     const Mask& mask, HostTensor& out, HostTensor& lse, const HostTensor* dout,
                     const AttentionOptions& options, int warmup, int repeat) {
#if defined(FLEXCP_TOOLS_CUDA)
  const DeviceTensor dq(q), dk(k), dv(v), dout_(out), dlse(lse);
  struct Grads {  // the backward's tensors, only when it is timed
    DeviceTensor g, gq, gk, gv;
    Grads(const HostTensor& d, const HostTensor& q, const HostTensor& k, const HostTensor& v)
        : g(d), gq(q), gk(k), gv(v) {}
  };
  std::optional<Grads> b;
  if (dout != nullptr) b.emplace(*dout, q, k, v);
  AttentionShape shape{mask.seqlen_q(), mask.seqlen_k(), q.shape()[1], k.shape()[1],
                       q.shape()[2],    q.view().dtype,  Device::kCuda};
  AttentionPlan plan(mask, shape, {.backward = dout != nullptr});
  const DeviceWorkspace workspace(plan);
  auto fwd = [&] { forward(plan, dq.view(), dk.view(), dv.view(), dout_.view(), dlse.view()); };
  std::function<void()> bwd;
  if (dout != nullptr)
    bwd = [&] {
      backward(plan, b->g.view(), dq.view(), dk.view(), dv.view(), dout_.view(), dlse.view(),
               b->gq.view(), b->gk.view(), b->gv.view(), options);
    };
  return device_times(fwd, bwd, warmup, repeat);
#else
  static_cast<void>(std::tie(q, k, v, mask, out, lse, dout, options, warmup, repeat));
  throw Error(
      Status::kNotCompiled,
      "flexcp bench: --device cuda: this build has no CUDA kernels (configured without CUDA)");
#endif
}

void run_bench(const BenchArgs& a) {
  const DType dtype = parse_dtype(a.shape.dtype);
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  std::mt19937_64 rng(2024);
  HostTensor q(dtype, {tq, a.shape.heads, a.shape.head_dim}),
      k(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      v(dtype, {tk, a.shape.heads_kv, a.shape.head_dim}),
      out(dtype, {tq, a.shape.heads, a.shape.head_dim}), lse(DType::kFloat32, {tq, a.shape.heads});
  for (HostTensor* t : {&q, &k, &v}) t->fill_uniform(rng, 1.0f);
  const double flops = forward_flops(mask.area(), a.shape.head_dim, a.shape.heads);
  nlohmann::json results = nlohmann::json::array();
  // kernel_seconds: for a time through DistAttention, the bare kernel's, for the ratio.
  auto report = [&](const char* dir, double seconds, double dir_flops, double kernel_seconds = 0) {
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
                         {"tflops", tflops}});
      if (dist) results.back()["kernel_over_dist"] = kernel_seconds / seconds;
    } else if (dist) {
      std::printf("%s [result] time_us=%.1f TFLOPS=%.4f kernel_over_dist=%.4f\n", head.c_str(),
                  seconds * 1e6, tflops, kernel_seconds / seconds);
    } else {
      std::printf("%s [result] time_us=%.1f TFLOPS=%.4f\n", head.c_str(), seconds * 1e6, tflops);
    }
  };
  std::optional<HostTensor> dout;
  if (a.backward) {
    dout.emplace(dtype, std::vector<std::int64_t>{tq, a.shape.heads, a.shape.head_dim});
    dout->fill_uniform(rng, 1.0f);
  }
  AttentionOptions options;
  options.deterministic = a.deterministic;
  Times t;
  if (a.device == "cuda") {
    t = time_on_device(q, k, v, mask, out, lse, dout ? &*dout : nullptr, options, a.warmup,
                       a.repeat);
  } else {
    // On the CPU too the plan is built once, so that the times are the kernels'.
    const AttentionShape shape{tq, tk, a.shape.heads, a.shape.heads_kv, a.shape.head_dim, dtype};
    const AttentionPlan plan(mask, shape, {.backward = a.backward});
    auto fwd = [&] { forward(plan, q.view(), k.view(), v.view(), out.view(), lse.view()); };
    t.fwd = median_seconds(fwd, a.warmup, a.repeat);
    if (dout) {
      HostTensor dq(dtype, q.shape()), dk(dtype, k.shape()), dv(dtype, v.shape());
      auto bwd = [&] {
        backward(plan, dout->view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                 dq.view(), dk.view(), dv.view());
      };
      t.bwd = median_seconds(bwd, a.warmup, a.repeat);
      t.fwd_bwd = median_seconds(
          [&] {
            fwd();
            bwd();
          },
          a.warmup, a.repeat);
    }
  }
  report("fwd", t.fwd, flops);
  if (dout) {
    report("bwd", t.bwd, kBackwardFlopsRatio * flops);
    report("fwd+bwd", t.fwd_bwd, (1 + kBackwardFlopsRatio) * flops);
  }
  if (a.dist) {
#if defined(FLEXCP_TOOLS_CUDA)
    const Times d =
        time_through_dist(q, k, v, mask, dout ? &*dout : nullptr, options, a.warmup, a.repeat);
    report("fwd", d.fwd, flops, t.fwd);
    if (dout) {
      report("bwd", d.bwd, kBackwardFlopsRatio * flops, t.bwd);
      report("fwd+bwd", d.fwd_bwd, (1 + kBackwardFlopsRatio) * flops, t.fwd_bwd);
    }
#endif
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
  cmd->add_flag("--deterministic", args->deterministic,
                "Backward with dQ in a fixed order (bitwise repeatable; the CPU's always is)");
  cmd->add_flag("--dist", args->dist,
                "With --device cuda: also through DistAttention on one rank (NCCL), with the "
                "ratio to the bare kernel (what the distributed path costs)");
  cmd->add_flag("--json", args->json, "One JSON array instead of text lines");
  cmd->add_option("--warmup", args->warmup, "Untimed runs first")
      ->check(whole_number(0))
      ->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Timed runs (the median is reported)")
      ->check(whole_number(1))
      ->capture_default_str();
  cmd->callback([args] {
    if (args->dist && args->device != "cuda")
      throw CLI::ValidationError("--dist", "needs --device cuda");
    run_bench(*args);
  });
}

}  // namespace flexcp::tools
