// flexcp run: the main job. Until the distributed runtime lands, one process: forward and backward
// on a realistic packed-document mask, timed, with a sample of rows checked against the float64
// reference.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "mask_args.h"
#include "timing.h"

namespace flexcp::tools {
namespace {

struct RunArgs {
  MaskArgs mask;
  std::int64_t heads = 8, heads_kv = 2, head_dim = 128;
  std::string dtype = "bf16";
  int check_rows = 48;
  std::uint64_t seed = 7;
};

// Max |out - reference| over a random sample of rows, all heads.
double sampled_error(const RunArgs& a, const Mask& mask, const HostTensor& q, const HostTensor& k,
                     const HostTensor& v, const HostTensor& out, std::mt19937_64& rng) {
  std::vector<std::int64_t> rows;
  std::uniform_int_distribution<std::int64_t> pick(0, mask.seqlen_q() - 1);
  for (int i = 0; i < a.check_rows; ++i) rows.push_back(pick(rng));
  const Mask sub = mask.select_rows(rows);
  const std::int64_t n = static_cast<std::int64_t>(rows.size()), h = a.heads, d = a.head_dim;
  // The sampled rows of q, as a view into q with row stride... rows are scattered, so copy them.
  HostTensor q_rows(q.view().dtype, {n, h, d});
  const std::vector<float> qf = q.to_float();
  std::vector<float> picked(static_cast<std::size_t>(n * h * d));
  for (std::int64_t i = 0; i < n; ++i)
    std::copy_n(qf.begin() + rows[i] * h * d, h * d, picked.begin() + i * h * d);
  q_rows.assign(picked);
  std::vector<double> ref(static_cast<std::size_t>(n * h * d)),
      ref_lse(static_cast<std::size_t>(n * h));
  reference_forward(q_rows.view(), k.view(), v.view(), sub,
                    make_view(ref.data(), DType::kFloat64, {n, h, d}),
                    make_view(ref_lse.data(), DType::kFloat64, {n, h}));
  const std::vector<float> of = out.to_float();
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < h * d; ++j) {
      const double e = std::abs(of[rows[i] * h * d + j] - ref[i * h * d + j]);
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
  return worst;
}

void run_main_job(RunArgs a) {
  if (a.mask.file.empty() && a.mask.kind.empty()) a.mask.kind = "varlen-causal";
  if (a.mask.seqlen == 0) a.mask.seqlen = 16384;
  const DType dtype = parse_dtype(a.dtype);
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  std::printf("flexcp %s, single process (the distributed runtime is not built yet)\n", version());
  std::printf("mask: %s, %zu slices, %lld of %lld pairs attended (%.2f%%)\n",
              describe_mask(a.mask).c_str(), mask.slices().size(),
              static_cast<long long>(mask.area()), static_cast<long long>(tq * tk),
              100.0 * static_cast<double>(mask.area()) /
                  static_cast<double>(std::max<std::int64_t>(1, tq * tk)));
  std::printf("shape: q [%lld, %lld, %lld], k/v [%lld, %lld, %lld], %s\n",
              static_cast<long long>(tq), static_cast<long long>(a.heads),
              static_cast<long long>(a.head_dim), static_cast<long long>(tk),
              static_cast<long long>(a.heads_kv), static_cast<long long>(a.head_dim),
              a.dtype.c_str());

  std::mt19937_64 rng(a.seed);
  HostTensor q(dtype, {tq, a.heads, a.head_dim}), k(dtype, {tk, a.heads_kv, a.head_dim}),
      v(dtype, {tk, a.heads_kv, a.head_dim}), dout(dtype, {tq, a.heads, a.head_dim});
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_uniform(rng, 1.0f);
  HostTensor out(dtype, {tq, a.heads, a.head_dim}), lse(DType::kFloat32, {tq, a.heads});
  HostTensor dq(dtype, {tq, a.heads, a.head_dim}), dk(dtype, {tk, a.heads_kv, a.head_dim}),
      dv(dtype, {tk, a.heads_kv, a.head_dim});

  const double flops = forward_flops(mask.area(), a.head_dim, a.heads);
  const double t_fwd = median_seconds(
      [&] { forward(q.view(), k.view(), v.view(), mask, out.view(), lse.view()); }, 1, 3);
  const double t_bwd = median_seconds(
      [&] {
        backward(dout.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), mask, dq.view(),
                 dk.view(), dv.view());
      },
      1, 3);
  std::printf("forward:  %9.2f ms  %7.1f GFLOPS (attended pairs)\n", t_fwd * 1e3,
              flops / t_fwd / 1e9);
  std::printf("backward: %9.2f ms  %7.1f GFLOPS (attended pairs)\n", t_bwd * 1e3,
              kBackwardFlopsRatio * flops / t_bwd / 1e9);

  const double err = sampled_error(a, mask, q, k, v, out, rng);
  // Output rounding alone is up to half an ulp of |out| <= 1 in the dtype; allow twice that.
  const double tol =
      dtype == DType::kFloat32 ? 1e-5 : (dtype == DType::kBFloat16 ? 2.0 / 256 : 2.0 / 2048);
  std::printf(
      "check: %d random rows x %lld heads against the float64 reference: max |error| %.3g (limit "
      "%.3g) %s\n",
      a.check_rows, static_cast<long long>(a.heads), err, tol, err <= tol ? "ok" : "MISMATCH");
  if (!(err <= tol)) throw CLI::RuntimeError("forward output does not match the reference", 1);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "The main job: attention on a packed-document mask, timed and checked");
  add_mask_options(*cmd, args->mask);
  cmd->add_option("--heads", args->heads, "Query heads")->capture_default_str();
  cmd->add_option("--heads-kv", args->heads_kv, "Key/value heads")->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "Head dimension")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--check-rows", args->check_rows, "Rows checked against the reference")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed for the inputs")->capture_default_str();
  cmd->callback([args] { run_main_job(*args); });
}

}  // namespace flexcp::tools
