// Planner benchmark (issue 3's protocol): plan time, imbalance and forward K/V bytes against ring
// attention, for 1M tokens packed from real document lengths on 8, 64 and 512 ranks, and 8M tokens
// on 1024 ranks. One line per case; a Markdown table goes to --out.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "flexcp/flexcp.h"

namespace {

std::string shell(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[256];
  while (pipe && fgets(buf, sizeof buf, pipe.get())) out += buf;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

struct Row {
  std::string mask;
  std::int64_t tokens;
  int world;
  flexcp::Plan plan;
  double plan_ms;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexcp planner benchmark"};
  std::string doc_lens, out_path;
  int repeat = 3;
  std::int64_t window = 4096;
  app.add_option("--doc-lens", doc_lens, "Document lengths file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "Markdown table to write");
  app.add_option("--repeat", repeat, "Plans per case (the median plan time is reported)")
      ->capture_default_str();
  app.add_option("--window", window, "Sliding window")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto lengths = flexcp::masks::read_lengths_file(doc_lens);
  constexpr std::int64_t kMillion = 1 << 20;
  struct Case {
    std::int64_t tokens;
    int world;
  };
  const std::vector<Case> cases = {
      {kMillion, 8}, {kMillion, 64}, {kMillion, 512}, {8 * kMillion, 1024}};
  std::vector<Row> rows;
  for (const Case& c : cases) {
    const auto docs = flexcp::masks::pack_lengths(lengths, c.tokens, c.tokens / 4);
    const std::vector<std::pair<std::string, flexcp::Mask>> masks = {
        {"varlen-causal", flexcp::masks::varlen_causal(docs)},
        {"sliding-window-" + std::to_string(window),
         flexcp::masks::sliding_window(docs, window, flexcp::masks::WindowKind::kCausal)}};
    for (const auto& [name, mask] : masks) {
      flexcp::PlanOptions o;
      o.world_size = c.world;
      o.gpus_per_node = 8;
      std::vector<double> times;
      flexcp::Plan plan;
      for (int i = 0; i < repeat; ++i) {
        plan = flexcp::make_plan(mask, o);
        times.push_back(plan.plan_ms());
      }
      std::sort(times.begin(), times.end());
      const double ms = times[times.size() / 2];
      std::printf(
          "[case] mask=%s T=%lld world=%d chunk=%lld stages=%d [result] plan_ms=%.2f "
          "imbalance=%.4f "
          "bytes=%lld ring_bytes=%lld bytes/ring=%.3f inter_bytes=%lld predicted_us=%.0f "
          "ring_us=%.0f "
          "ring_imbalance=%.3f\n",
          name.c_str(), (long long)c.tokens, c.world, (long long)plan.chunk_size, plan.num_stages,
          ms, plan.imbalance, (long long)plan.comm_bytes_fwd, (long long)plan.ring.comm_bytes_fwd,
          double(plan.comm_bytes_fwd) / plan.ring.comm_bytes_fwd, (long long)plan.comm_bytes_inter,
          plan.predicted_us, plan.ring.predicted_us, plan.ring.imbalance);
      std::fflush(stdout);
      rows.push_back({name, c.tokens, c.world, std::move(plan), ms});
    }
  }
  if (out_path.empty()) return 0;
  std::ofstream md(out_path);
  md << "# Planner benchmark\n\n"
     << "- date: " << shell("date -u +%Y-%m-%dT%H:%MZ") << "\n"
     << "- machine: " << shell("lscpu | sed -n 's/^Model name: *//p'")
     << " (plan time single-threaded)\n"
     << "- commit: " << shell("git rev-parse --short HEAD 2>/dev/null") << "\n"
     << "- documents: " << doc_lens
     << ", packed cyclically, each capped at a quarter of the total\n"
     << "- cost model: defaults (450 TFLOPS kernel, 150 GB/s NVLink, 25 GB/s across nodes, 8 GPUs "
        "per node), "
     << "64 q heads, 8 K/V heads, head dim 128, bf16\n"
     << "- plan_ms: every rank's shared part plus the slowest rank's own part, median of " << repeat
     << "\n\n"
     << "| mask | tokens | ranks | chunk | stages | plan ms | imbalance | fwd bytes | / ring | "
        "inter-node bytes | "
        "predicted us | ring us | ring imbalance |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const Row& r : rows) {
    std::snprintf(
        buf, sizeof buf,
        "| %s | %lld | %d | %lld | %d | %.2f | %.4f | %.3g | %.3f | %.3g | %.0f | %.0f | %.3f |\n",
        r.mask.c_str(), (long long)r.tokens, r.world, (long long)r.plan.chunk_size,
        r.plan.num_stages, r.plan_ms, r.plan.imbalance, double(r.plan.comm_bytes_fwd),
        double(r.plan.comm_bytes_fwd) / r.plan.ring.comm_bytes_fwd, double(r.plan.comm_bytes_inter),
        r.plan.predicted_us, r.plan.ring.predicted_us, r.plan.ring.imbalance);
    md << buf;
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
