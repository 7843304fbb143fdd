// flexcp plan: plans context parallelism for a mask without running it (DESIGN §4), beside the
// ring, Ulysses and all-gather baselines on the same mask and cost model.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.h"
#include "commands.h"
#include "flexcp/flexcp.h"

namespace flexcp::tools {
namespace {

struct PlanArgs {
  MaskArgs mask;
  PlanOptions options;
  bool json = false;
  bool all_ranks = false;
};

// Per-rank lines are printed up to this world size unless --all-ranks.
constexpr int kMaxRankLines = 16;

nlohmann::json baseline_json(const BaselineFigures& b) {
  return {{"comm_bytes_fwd", b.comm_bytes_fwd},
          {"imbalance", b.imbalance},
          {"predicted_us", b.predicted_us},
          {"idle_fraction", b.idle_fraction},
          {"applicable", b.applicable}};
}

void print_json(const Plan& p, const MaskArgs& mask_args) {
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const RankPlan& rp = p.ranks[r];
    ranks.push_back({{"rank", r},
                     {"q_tokens", rp.num_q_tokens},
                     {"area", rp.area},
                     {"recv_tokens", rp.recv_tokens},
                     {"send_tokens", rp.send_tokens},
                     {"stage_area", rp.stage_area},
                     {"predicted_us", rp.predicted_us},
                     {"exposed_comm_us", rp.exposed_comm_us}});
  }
  const nlohmann::json out = {{"mask", describe_mask(mask_args)},
                              {"world", p.options.world_size},
                              {"chunk_size", p.chunk_size},
                              {"num_chunks", p.chunks.size()},
                              {"num_stages", p.num_stages},
                              {"imbalance", p.imbalance},
                              {"comm_bytes_fwd", p.comm_bytes_fwd},
                              {"comm_bytes_intra", p.comm_bytes_intra},
                              {"comm_bytes_inter", p.comm_bytes_inter},
                              {"predicted_us", p.predicted_us},
                              {"plan_ms", p.plan_ms()},
                              {"global_ms", p.global_ms},
                              {"slowest_rank_ms", p.slowest_rank_ms},
                              {"ranks", ranks},
                              {"baselines",
                               {{"ring", baseline_json(p.ring)},
                                {"ulysses", baseline_json(p.ulysses)},
                                {"allgather", baseline_json(p.allgather)}}}};
  std::cout << out.dump() << "\n";
}

void print_text(const Plan& p, const Mask& mask, const PlanArgs& a) {
  const PlanOptions& o = p.options;
  const int world = o.world_size;
  std::printf("mask %s: %lld x %lld tokens, %zu slices, area %lld\n", describe_mask(a.mask).c_str(),
              (long long)mask.seqlen_q(), (long long)mask.seqlen_k(), mask.slices().size(),
              (long long)mask.area());
  std::printf(
      "world %d%s, chunk %lld tokens (%zu chunks, %zu per rank), %d remote stage(s); K/V: %lld "
      "heads x %lld dims\n",
      world,
      o.gpus_per_node > 0 ? (", " + std::to_string(o.gpus_per_node) + " GPUs per node").c_str()
                          : "",
      (long long)p.chunk_size, p.chunks.size(), p.chunks.size() / world, p.num_stages,
      (long long)o.heads_kv, (long long)o.head_dim);
  const double mean = static_cast<double>(mask.area()) / world;
  if (world <= kMaxRankLines || a.all_ranks) {
    std::printf("%6s %10s %14s %8s %12s %12s %12s %12s\n", "rank", "q_tokens", "area", "/mean",
                "recv_tokens", "send_tokens", "predicted_us", "exposed_us");
    for (int r = 0; r < world; ++r) {
      const RankPlan& rp = p.ranks[r];
      std::printf("%6d %10lld %14lld %8.3f %12lld %12lld %12.1f %12.1f\n", r,
                  (long long)rp.num_q_tokens, (long long)rp.area, mean > 0 ? rp.area / mean : 1.0,
                  (long long)rp.recv_tokens, (long long)rp.send_tokens, rp.predicted_us,
                  rp.exposed_comm_us);
    }
  }
  std::printf("imbalance %.4f (max rank area / mean)\n", p.imbalance);
  std::printf(
      "forward K/V bytes %lld (intra-node %lld, inter-node %lld); predicted forward %.1f us\n",
      (long long)p.comm_bytes_fwd, (long long)p.comm_bytes_intra, (long long)p.comm_bytes_inter,
      p.predicted_us);
  auto line = [&](const char* name, const BaselineFigures& b) {
    if (!b.applicable) {
      std::printf("  %-10s not applicable (heads %lld / %lld not divisible by world %d)\n", name,
                  (long long)o.heads_q, (long long)o.heads_kv, world);
      return;
    }
    std::printf(
        "  %-10s bytes %14lld (%6.2fx flexcp)  imbalance %.4f  predicted %10.1f us  idle %5.1f%%\n",
        name, (long long)b.comm_bytes_fwd,
        p.comm_bytes_fwd > 0 ? double(b.comm_bytes_fwd) / p.comm_bytes_fwd : 0.0, b.imbalance,
        b.predicted_us, 100 * b.idle_fraction);
  };
  std::printf("baselines (same mask and cost model):\n");
  line("ring", p.ring);
  line("ulysses", p.ulysses);
  line("allgather", p.allgather);
  std::printf("plan_ms %.3f (every rank: %.3f, slowest rank's own part: %.3f; single-threaded)\n",
              p.plan_ms(), p.global_ms, p.slowest_rank_ms);
}

}  // namespace

void add_plan_options(CLI::App& cmd, PlanOptions& o) {
  cmd.add_option("--world", o.world_size, "Ranks (GPUs)")->required()->check(CLI::PositiveNumber);
  cmd.add_option("--chunk", o.chunk_size,
                 "Tokens per chunk (default: chosen from the mask and world)");
  cmd.add_option("--heads", o.heads_q, "Query heads (compute time, Ulysses)")
      ->capture_default_str();
  cmd.add_option("--heads-kv", o.heads_kv, "K/V heads (bytes)")->capture_default_str();
  cmd.add_option("--head-dim", o.head_dim, "Head dimension")->capture_default_str();
  cmd.add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node (0: one node)")
      ->capture_default_str();
  cmd.add_option("--stages", o.num_stages, "Remote stages (0: chosen by the cost model)")
      ->capture_default_str();
  cmd.add_option("--kernel-tflops", o.cost.kernel_tflops, "Cost model: attention TFLOPS per GPU")
      ->capture_default_str();
  cmd.add_option("--intra-gbps", o.cost.intra_node_gbps,
                 "Cost model: GB/s into a GPU inside a node")
      ->capture_default_str();
  cmd.add_option("--inter-gbps", o.cost.inter_node_gbps, "Cost model: GB/s into a GPU across nodes")
      ->capture_default_str();
}

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd =
      app.add_subcommand("plan", "Plan context parallelism for a mask (no run), with baselines");
  add_mask_options(*cmd, args->mask);
  add_plan_options(*cmd, args->options);
  cmd->add_flag("--json", args->json, "One JSON object");
  cmd->add_flag("--all-ranks", args->all_ranks, "Print every rank's line, however many");
  cmd->callback([args] {
    const Mask mask = build_mask(args->mask);
    const Plan plan = make_plan(mask, args->options);
    if (args->json)
      print_json(plan, args->mask);
    else
      print_text(plan, mask, *args);
  });
}

}  // namespace flexcp::tools
