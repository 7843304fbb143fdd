// flexcp plan: plans context parallelism for a mask without running it (DESIGN §4): every rank's
// own plan in turn, beside the ring, Ulysses, all-gather and MagiAttention baselines on the same
// mask and cost model.
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

void print_json(const PlanReport& p, const MaskArgs& mask_args) {
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const RankSummary& rs = p.ranks[r];
    ranks.push_back({{"rank", r},
                     {"q_tokens", rs.q_tokens},
                     {"area", rs.area},
                     {"recv_tokens", rs.recv_tokens},
                     {"send_tokens", rs.send_tokens},
                     {"num_stages", rs.num_stages},
                     {"stage_area", rs.stage_area},
                     {"predicted_us", rs.predicted_us},
                     {"exposed_comm_us", rs.exposed_comm_us},
                     {"rank_ms", rs.rank_ms}});
  }
  const Dispatch& d = p.dispatch;
  const nlohmann::json out = {{"mask", describe_mask(mask_args)},
                              {"world", p.options.world_size},
                              {"chunk_size", d.chunk_size},
                              {"num_chunks", d.chunks.size()},
                              {"chunks_per_rank", d.chunks_per_rank},
                              {"imbalance", d.imbalance},
                              {"comm_bytes_fwd", p.comm_bytes_fwd},
                              {"comm_bytes_intra", p.comm_bytes_intra},
                              {"comm_bytes_inter", p.comm_bytes_inter},
                              {"predicted_us", p.predicted_us},
                              {"plan_ms", p.plan_ms()},
                              {"dispatch_ms", p.dispatch_ms},
                              {"slowest_rank_ms", p.slowest_rank_ms},
                              {"ranks", ranks},
                              {"baselines",
                               {{"ring", baseline_json(p.ring)},
                                {"ulysses", baseline_json(p.ulysses)},
                                {"allgather", baseline_json(p.allgather)},
                                {"magi", baseline_json(p.magi)}}}};
  std::cout << out.dump() << "\n";
}

void print_text(const PlanReport& p, const Mask& mask, const PlanArgs& a) {
  const PlanOptions& o = p.options;
  const Dispatch& d = p.dispatch;
  const int world = o.world_size;
  std::printf("mask %s: %lld x %lld tokens, %zu slices, area %lld\n", describe_mask(a.mask).c_str(),
              (long long)mask.seqlen_q(), (long long)mask.seqlen_k(), mask.slices().size(),
              (long long)mask.area());
  std::printf(
      "world %d%s, chunk %lld tokens (%zu chunks, %lld per rank); K/V: %lld heads x %lld "
      "dims\n",
      world,
      o.gpus_per_node > 0 ? (", " + std::to_string(o.gpus_per_node) + " GPUs per node").c_str()
                          : "",
      (long long)d.chunk_size, d.chunks.size(), (long long)d.chunks_per_rank, (long long)o.heads_kv,
      (long long)o.head_dim);
  const double mean = static_cast<double>(mask.area()) / world;
  if (world <= kMaxRankLines || a.all_ranks) {
    std::printf("%6s %10s %14s %8s %7s %12s %12s %12s %12s\n", "rank", "q_tokens", "area", "/mean",
                "stages", "recv_tokens", "send_tokens", "predicted_us", "exposed_us");
    for (int r = 0; r < world; ++r) {
      const RankSummary& rs = p.ranks[r];
      std::printf("%6d %10lld %14lld %8.3f %7d %12lld %12lld %12.1f %12.1f\n", r,
                  (long long)rs.q_tokens, (long long)rs.area, mean > 0 ? rs.area / mean : 1.0,
                  rs.num_stages, (long long)rs.recv_tokens, (long long)rs.send_tokens,
                  rs.predicted_us, rs.exposed_comm_us);
    }
  }
  std::printf("imbalance %.4f (max rank area / mean)\n", d.imbalance);
  std::printf(
      "forward K/V bytes %lld (intra-node %lld, inter-node %lld); predicted forward %.1f us\n",
      (long long)p.comm_bytes_fwd, (long long)p.comm_bytes_intra, (long long)p.comm_bytes_inter,
      p.predicted_us);
  auto line = [&](const char* name, const BaselineFigures& b, const char* why) {
    if (!b.applicable) {
      std::printf("  %-10s not applicable (%s)\n", name, why);
      return;
    }
    // A ratio to flexcp's bytes only where flexcp moves some (one rank moves none: 0 / 0).
    char ratio[32] = "     - ";
    if (p.comm_bytes_fwd > 0)
      std::snprintf(ratio, sizeof ratio, "%6.2fx", double(b.comm_bytes_fwd) / p.comm_bytes_fwd);
    std::printf(
        "  %-10s bytes %14lld (%s flexcp)  imbalance %.4f  predicted %10.1f us  idle %5.1f%%\n",
        name, (long long)b.comm_bytes_fwd, ratio, b.imbalance, b.predicted_us,
        100 * b.idle_fraction);
  };
  const std::string heads = "heads " + std::to_string(o.heads_q) + " / " +
                            std::to_string(o.heads_kv) + " not divisible by world " +
                            std::to_string(world);
  std::printf("baselines (same mask and cost model):\n");
  line("ring", p.ring, "");
  line("ulysses", p.ulysses, heads.c_str());
  line("allgather", p.allgather, "");
  line("magi", p.magi, "self-attention only");
  std::printf(
      "plan_ms %.3f (the dispatch every rank computes: %.3f, the slowest rank's own part: %.3f; "
      "single-threaded)\n",
      p.plan_ms(), p.dispatch_ms, p.slowest_rank_ms);
}

}  // namespace

void add_plan_options(CLI::App& cmd, PlanOptions& o) {
  cmd.add_option("--world", o.world_size, "Ranks (GPUs)")->required()->check(whole_number(1));
  cmd.add_option("--chunk", o.chunk_size,
                 "Tokens per chunk, exactly (their count must be a multiple of the world)")
      ->check(whole_number(0));
  cmd.add_option("--chunks-per-rank", o.chunks_per_rank,
                 "Equal chunks per rank instead (default: chosen from the length and world)")
      ->check(whole_number(0));
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
    const PlanReport report = make_plan_report(mask, args->options);
    if (args->json)
      print_json(report, args->mask);
    else
      print_text(report, mask, *args);
  });
}

}  // namespace flexcp::tools
