// Planner benchmark (issue 10's protocol), on packed documents from real lengths (the ones the
// tool ships, or --doc-lens):
//   sweep:  1M tokens on every world size W in 2..1024 (or every --step-th): the default chunk
//           count's forward K/V bytes against the best of 8, 12, 16, 24 and 32 chunks per rank,
//           its imbalance, and MagiAttention's default dispatch on the same mask, for documents
//           capped at a quarter of the sequence, and uncapped with the longest ones first;
//   time:   plan_ms (the dispatch every rank repeats plus the slowest rank's own plan, kernel plans
//           included; single-threaded) for 1M on 64 ranks and 8M on 1024;
//   memory: peak resident memory of planning plain causal 1M on 4096 ranks, one rank's plan and
//           the whole report (each in a child process).
//   --kernel-plans: only one GPU's kernel plans (AttentionPlan, forward and forward+backward),
//           causal and documents at 1K to 1M tokens.
// One line per case; a Markdown table goes to --out. The sweep runs world sizes in parallel (its
// figures are byte counts); the timed cases run alone, single-threaded.
#include <omp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "default_documents.h"
#include "flexcp/flexcp.h"
#include "plan/plan_internal.h"

namespace {

using flexcp::Mask;
using flexcp::PlanOptions;
constexpr std::int64_t kMillion = 1 << 20;

std::string shell(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[256];
  while (pipe && fgets(buf, sizeof buf, pipe.get())) out += buf;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

PlanOptions options_for(int world) {
  PlanOptions o;
  o.world_size = world;
  o.gpus_per_node = 8;
  return o;
}

struct Bytes {
  std::int64_t bytes = 0;
  double imbalance = 1;
};

// Forward K/V bytes and imbalance of the plan these options give (every rank's receive list).
Bytes plan_bytes(const Mask& mask, const PlanOptions& o) {
  const flexcp::plan_detail::Planner planner(mask, o);
  Bytes b;
  for (int r = 0; r < o.world_size; ++r) b.bytes += planner.recv_tokens(r);
  b.bytes *= 2 * o.heads_kv * o.head_dim * static_cast<std::int64_t>(dtype_size(o.dtype));
  b.imbalance = planner.dispatch().imbalance;
  return b;
}

struct SweepRow {
  int world;
  std::int64_t chunks_per_rank;
  Bytes chosen;
  std::int64_t best_bytes;
  std::int64_t best_count;
  std::int64_t magi_bytes;
};

struct SweepSummary {
  std::string mask;
  int cases = 0, within_10pct = 0, balanced = 0, at_most_magi = 0;
  double worst_vs_best = 0, worst_imbalance = 0, worst_vs_magi = 0;
  int worst_best_world = 0, worst_imbalance_world = 0, worst_magi_world = 0;
  std::vector<SweepRow> shown;  // powers of two and the worst cases
};

SweepSummary sweep(const std::string& name, const flexcp::masks::Lengths& docs, int step) {
  const Mask mask = flexcp::masks::varlen_causal(docs);
  SweepSummary s;
  s.mask = name;
  std::vector<int> worlds;
  for (int world = 2; world <= 1024; world += step) worlds.push_back(world);
  std::vector<SweepRow> rows(worlds.size());
  // Byte counts do not depend on timing: the world sizes run in parallel.
#pragma omp parallel for schedule(dynamic, 1)
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    const int world = worlds[i];
    PlanOptions o = options_for(world);
    SweepRow row{world, 0, plan_bytes(mask, o), 0, 0, 0};
    row.chunks_per_rank = flexcp::make_dispatch(mask, o).chunks_per_rank;
    for (std::int64_t count : flexcp::kChunksPerRankChoices) {
      if (count * world > mask.seqlen_q()) continue;
      o.chunks_per_rank = count;
      const std::int64_t bytes = plan_bytes(mask, o).bytes;
      if (row.best_count == 0 || bytes < row.best_bytes)
        row.best_bytes = bytes, row.best_count = count;
    }
    o.chunks_per_rank = 0;
    row.magi_bytes =
        flexcp::plan_detail::magi_baseline(flexcp::mask_bands(mask), mask, o).comm_bytes_fwd;
    rows[i] = row;
  }
  for (const SweepRow& row : rows) {
    const int world = row.world;
    const double vs_best = double(row.chosen.bytes) / double(row.best_bytes);
    const double vs_magi = double(row.chosen.bytes) / double(row.magi_bytes);
    ++s.cases;
    s.within_10pct += vs_best <= 1.10;
    s.balanced += row.chosen.imbalance <= 1.01;
    s.at_most_magi += row.chosen.bytes <= row.magi_bytes;
    if (vs_best > s.worst_vs_best) s.worst_vs_best = vs_best, s.worst_best_world = world;
    if (row.chosen.imbalance > s.worst_imbalance)
      s.worst_imbalance = row.chosen.imbalance, s.worst_imbalance_world = world;
    if (vs_magi > s.worst_vs_magi) s.worst_vs_magi = vs_magi, s.worst_magi_world = world;
    std::printf(
        "[case] sweep mask=%s T=%lld world=%d chunks_per_rank=%lld [result] bytes=%lld "
        "imbalance=%.4f best=%lld (%lld per rank) vs_best=%.3f magi=%lld vs_magi=%.3f\n",
        name.c_str(), (long long)mask.seqlen_q(), world, (long long)row.chunks_per_rank,
        (long long)row.chosen.bytes, row.chosen.imbalance, (long long)row.best_bytes,
        (long long)row.best_count, vs_best, (long long)row.magi_bytes, vs_magi);
    std::fflush(stdout);
  }
  for (const SweepRow& r : rows)
    if ((r.world & (r.world - 1)) == 0 || r.world == s.worst_best_world ||
        r.world == s.worst_imbalance_world || r.world == s.worst_magi_world)
      s.shown.push_back(r);
  return s;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct TimeRow {
  std::string mask;
  std::int64_t tokens;
  int world;
  double plan_ms, dispatch_ms, slowest_rank_ms, one_rank_ms;
  std::int64_t chunks_per_rank;
  double imbalance;
};

TimeRow time_case(const std::string& name, const Mask& mask, int world, int repeat) {
  const PlanOptions o = options_for(world);
  std::vector<double> report_ms, one_ms, dispatch_ms, rank_ms;
  flexcp::PlanReport report;
  for (int i = 0; i < repeat; ++i) {
    report = flexcp::make_plan_report(mask, o);
    report_ms.push_back(report.plan_ms());
    dispatch_ms.push_back(report.dispatch_ms);
    rank_ms.push_back(report.slowest_rank_ms);
    one_ms.push_back(flexcp::make_plan(mask, o, 0).plan_ms());
  }
  const TimeRow row{name,
                    mask.seqlen_q(),
                    world,
                    median_of(report_ms),
                    median_of(dispatch_ms),
                    median_of(rank_ms),
                    median_of(one_ms),
                    report.dispatch.chunks_per_rank,
                    report.dispatch.imbalance};
  std::printf(
      "[case] time mask=%s T=%lld world=%d [result] plan_ms=%.2f dispatch_ms=%.2f "
      "slowest_rank_ms=%.2f rank0_plan_ms=%.2f imbalance=%.4f\n",
      name.c_str(), (long long)row.tokens, world, row.plan_ms, row.dispatch_ms, row.slowest_rank_ms,
      row.one_rank_ms, row.imbalance);
  std::fflush(stdout);
  return row;
}

// One GPU's kernel plan (AttentionPlan for a CUDA shape, GQA 64:8, head dim 128, bf16: what a
// call of flexcp.attention with a mask builds each time), forward only and forward+backward, on
// causal and packed documents from 1K to 1M tokens, single-threaded. Planned for 132 SMs where
// no GPU is present. Returns the Markdown table.
std::string time_kernel_plans(const std::vector<std::int64_t>& lengths, int repeat) {
  std::ostringstream md;
  md << "## Kernel plans (one GPU; median of " << repeat << ", single-threaded)\n\n"
     << "| mask | tokens | forward ms | forward+backward ms |\n|---|---|---|---|\n";
  for (const std::int64_t tokens : {1024L, 4096L, 32768L, 131072L, kMillion}) {
    const auto docs = flexcp::masks::pack_lengths(lengths, tokens, tokens / 4);
    for (const auto& [name, mask] :
         {std::pair{std::string("causal"), flexcp::masks::causal(tokens, tokens)},
          std::pair{std::string("varlen-causal"), flexcp::masks::varlen_causal(docs)}}) {
      const flexcp::AttentionShape shape{.seqlen_q = tokens,
                                         .seqlen_k = tokens,
                                         .heads_q = 64,
                                         .heads_kv = 8,
                                         .head_dim = 128,
                                         .dtype = flexcp::DType::kBFloat16,
                                         .device = flexcp::Device::kCuda};
      double ms[2];
      for (const bool backward : {false, true}) {
        std::vector<double> times;
        for (int i = 0; i < repeat; ++i) {
          const auto start = std::chrono::steady_clock::now();
          const flexcp::AttentionPlan plan(mask, shape, {.backward = backward});
          times.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
        }
        ms[backward] = median_of(times);
      }
      std::printf("[case] kernel-plan mask=%s T=%lld [result] forward_ms=%.3f both_ms=%.3f\n",
                  name.c_str(), (long long)tokens, ms[0], ms[1]);
      md << "| " << name << " | " << tokens << " | " << ms[0] << " | " << ms[1] << " |\n";
    }
  }
  return md.str();
}

// Peak resident memory (MiB) of `work` run in a child process.
double child_peak_mib(const std::function<void()>& work) {
  const pid_t pid = fork();
  if (pid == 0) {
    work();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  struct rusage usage {};
  getrusage(RUSAGE_CHILDREN, &usage);  // the largest child so far: run the smaller case first
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? usage.ru_maxrss / 1024.0 : -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexcp planner benchmark"};
  std::string doc_lens, out_path;
  int repeat = 3, step = 1;
  std::int64_t window = 4096;
  app.add_option("--doc-lens", doc_lens, "Document lengths file (default: the ones flexcp ships)")
      ->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "Markdown table to write");
  app.add_option("--repeat", repeat, "Plans per timed case (the median is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--step", step, "World sizes of the sweep: 2, 2 + step, ... up to 1024")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--window", window, "Sliding window of the timed cases")->capture_default_str();
  bool kernel_plans = false;
  app.add_flag("--kernel-plans", kernel_plans,
               "Only time one GPU's kernel plans (what a call with a mask builds), 1K to 1M");
  CLI11_PARSE(app, argc, argv);
  const auto lengths = doc_lens.empty() ? flexcp::tools::default_document_lengths()
                                        : flexcp::masks::read_lengths_file(doc_lens);
  if (kernel_plans) {
    omp_set_num_threads(1);
    const std::string table = time_kernel_plans(lengths, repeat);
    if (!out_path.empty()) std::ofstream(out_path) << table;
    return 0;
  }

  // Memory first, in children (getrusage reports the largest child, so the smaller case first).
  const Mask causal = flexcp::masks::causal(kMillion, kMillion);
  const double one_rank_mib =
      child_peak_mib([&] { flexcp::make_plan(causal, options_for(4096), 0); });
  const double report_mib =
      child_peak_mib([&] { flexcp::make_plan_report(causal, options_for(4096)); });
  std::printf(
      "[case] memory mask=causal T=%lld world=4096 [result] one_rank_peak_mib=%.0f "
      "report_peak_mib=%.0f\n",
      (long long)kMillion, one_rank_mib, report_mib);

  // Plan times as one rank sees them: one thread.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<TimeRow> times;
  for (const auto& [tokens, world] : {std::pair{kMillion, 64}, {8 * kMillion, 1024}}) {
    const auto docs = flexcp::masks::pack_lengths(lengths, tokens, tokens / 4);
    times.push_back(time_case("varlen-causal", flexcp::masks::varlen_causal(docs), world, repeat));
    times.push_back(
        time_case("sliding-window-" + std::to_string(window),
                  flexcp::masks::sliding_window(docs, window, flexcp::masks::WindowKind::kCausal),
                  world, repeat));
  }

  omp_set_num_threads(threads);
  std::vector<SweepSummary> sweeps;
  sweeps.push_back(
      sweep("docs-capped", flexcp::masks::pack_lengths(lengths, kMillion, kMillion / 4), step));
  // Uncapped, longest documents first: the first million tokens are a few very long documents.
  auto longest_first = lengths;
  std::sort(longest_first.rbegin(), longest_first.rend());
  sweeps.push_back(sweep("docs-uncapped-longest-first",
                         flexcp::masks::pack_lengths(longest_first, kMillion, kMillion), step));

  if (out_path.empty()) return 0;
  std::ofstream md(out_path);
  md << "# Planner benchmark\n\n"
     << "- date: " << shell("date -u +%Y-%m-%dT%H:%MZ") << "\n"
     << "- machine: " << shell("lscpu | sed -n 's/^Model name: *//p'")
     << " (plan time single-threaded)\n"
     << "- commit: " << shell("git rev-parse --short HEAD 2>/dev/null") << "\n"
     << "- documents: "
     << (doc_lens.empty() ? "the lengths flexcp ships (903 Perl modules)" : doc_lens)
     << ", packed cyclically\n"
     << "- cost model: defaults (450 TFLOPS kernel, 150 GB/s NVLink, 25 GB/s across nodes, 8 GPUs "
        "per node), 64 q heads, 8 K/V heads, head dim 128, bf16\n\n";
  md << "## Memory: plain causal, 1M tokens, 4096 ranks\n\n"
     << "| what | peak resident MiB |\n|---|---|\n"
     << "| one rank's plan (make_plan) | " << static_cast<long>(one_rank_mib + 0.5) << " |\n"
     << "| every rank in turn (make_plan_report, `flexcp plan`) | "
     << static_cast<long>(report_mib + 0.5) << " |\n\n";
  md << "## Plan time (median of " << repeat << ")\n\n"
     << "plan_ms = the dispatch every rank repeats + the slowest rank's own plan (receive and "
        "send lists, stages, local work, kernel plans).\n\n"
     << "| mask | tokens | ranks | chunks/rank | imbalance | plan_ms | dispatch ms | slowest rank "
        "ms | rank 0 alone ms |\n|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const TimeRow& r : times) {
    std::snprintf(buf, sizeof buf, "| %s | %lld | %d | %lld | %.4f | %.2f | %.2f | %.2f | %.2f |\n",
                  r.mask.c_str(), (long long)r.tokens, r.world, (long long)r.chunks_per_rank,
                  r.imbalance, r.plan_ms, r.dispatch_ms, r.slowest_rank_ms, r.one_rank_ms);
    md << buf;
  }
  md << "\n## Chunk count sweep: varlen causal, 1M tokens, W = 2.." << 1024 << " step " << step
     << "\n\n"
     << "| documents | cases | default bytes <= 1.10x best of 8/12/16/24/32 per rank | worst "
        "(W) | imbalance <= 1.01 | worst (W) | bytes <= MagiAttention's | worst ratio (W) |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const SweepSummary& s : sweeps) {
    std::snprintf(buf, sizeof buf,
                  "| %s | %d | %d | %.3f (%d) | %d | %.4f (%d) | %d | %.3f (%d) |\n",
                  s.mask.c_str(), s.cases, s.within_10pct, s.worst_vs_best, s.worst_best_world,
                  s.balanced, s.worst_imbalance, s.worst_imbalance_world, s.at_most_magi,
                  s.worst_vs_magi, s.worst_magi_world);
    md << buf;
  }
  for (const SweepSummary& s : sweeps) {
    md << "\n"
       << s.mask << ": powers of two and the worst cases\n\n"
       << "| W | chunks/rank | bytes | imbalance | best bytes (per rank) | / best | MagiAttention "
          "bytes | / magi |\n|---|---|---|---|---|---|---|---|\n";
    for (const SweepRow& r : s.shown) {
      std::snprintf(
          buf, sizeof buf, "| %d | %lld | %.4g | %.4f | %.4g (%lld) | %.3f | %.4g | %.3f |\n",
          r.world, (long long)r.chunks_per_rank, double(r.chosen.bytes), r.chosen.imbalance,
          double(r.best_bytes), (long long)r.best_count, double(r.chosen.bytes) / r.best_bytes,
          double(r.magi_bytes), double(r.chosen.bytes) / r.magi_bytes);
      md << buf;
    }
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
