// CPU benchmark (DESIGN §6, CPU protocol): flexcp's CPU kernel, forward and backward, on the masks
// users train with, beside the machine's OpenBLAS sgemm rate and torch's CPU SDPA (when torch is
// importable), all in one run. One line per case; a Markdown table goes to --out.
//
//   cpu_attention_bench [--doc-lens FILE] --out bench/results/x.md
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "default_documents.h"
#include "flexcp/flexcp.h"
#include "timing.h"

namespace {

using flexcp::DType;
using flexcp::Mask;
using flexcp::tools::median_seconds;
constexpr int kWarmup = 1;

std::string shell(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return "";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe.get())) out += buf;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

double field(const std::string& line, const std::string& key) {
  const auto pos = line.find(key + "=");
  return pos == std::string::npos ? 0.0 : std::stod(line.substr(pos + key.size() + 1));
}

// sgemm GFLOPS, all threads, on C[m x n] = A[m x k] B[k x n].
double sgemm_gflops(int m, int n, int k, int repeat) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(k) * n),
      c(static_cast<std::size_t>(m) * n);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  const double t = median_seconds(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(),
                    n, 0.0f, c.data(), n);
      },
      kWarmup, repeat);
  return 2.0 * m * n * k / t / 1e9;
}

struct Tensor {
  std::vector<unsigned char> bytes;
  flexcp::TensorView view;
  Tensor(DType dtype, std::initializer_list<std::int64_t> shape, std::mt19937_64& rng) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    bytes.resize(n * flexcp::dtype_size(dtype));
    view = flexcp::make_view(bytes.data(), dtype, shape);
    std::uniform_real_distribution<float> u(-1, 1);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = u(rng);
      if (dtype == DType::kFloat32) {
        reinterpret_cast<float*>(bytes.data())[i] = x;
      } else {  // bf16: the top half of the float (truncation is fine for random inputs)
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        reinterpret_cast<std::uint16_t*>(bytes.data())[i] = static_cast<std::uint16_t>(bits >> 16);
      }
    }
  }
};

struct Row {
  std::string mask;
  std::int64_t seqlen, area;
  double fwd_gflops, bwd_gflops, torch_fwd_gflops, torch_bwd_gflops;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexcp CPU attention benchmark"};
  std::string doc_lens, out_path, dtype_name = "bf16";
  std::vector<std::int64_t> sizes = {4096, 8192, 16384};
  std::int64_t heads = 8, heads_kv = 8, head_dim = 128, window = 1024;
  int repeat = 3;
  bool backward = true;
  app.add_option("--doc-lens", doc_lens, "Document lengths file (default: the ones flexcp ships)")
      ->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "Markdown table to write");
  app.add_option("--sizes", sizes, "Sequence lengths")->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--heads-kv", heads_kv)->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--window", window, "Sliding window")->capture_default_str();
  app.add_option("--dtype", dtype_name)
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--repeat", repeat)->capture_default_str();
  app.add_flag("!--no-backward", backward, "Skip the backward");
  CLI11_PARSE(app, argc, argv);
  const DType dtype = flexcp::parse_dtype(dtype_name);

  // The machine's sgemm rate: on the two GEMM shapes of attention at 4K tokens (S = Q K^T and
  // O = P V), and on a large square product (the ceiling).
  const int t4k = 4096, d = static_cast<int>(head_dim);
  const double sgemm_qk = sgemm_gflops(t4k, t4k, d, repeat);
  const double sgemm_pv = sgemm_gflops(t4k, d, t4k, repeat);
  const double sgemm_attn = 2.0 / (1.0 / sgemm_qk + 1.0 / sgemm_pv);  // equal flops in both
  const double sgemm_square = sgemm_gflops(2048, 2048, 2048, repeat);
  std::printf("[case] sgemm m=%d n=%d k=%d [result] GFLOPS=%.1f\n", t4k, t4k, d, sgemm_qk);
  std::printf("[case] sgemm m=%d n=%d k=%d [result] GFLOPS=%.1f\n", t4k, d, t4k, sgemm_pv);
  std::printf("[case] sgemm attention-shaped (harmonic mean of the two) [result] GFLOPS=%.1f\n",
              sgemm_attn);
  std::printf("[case] sgemm m=n=k=2048 [result] GFLOPS=%.1f\n", sgemm_square);

  const bool have_torch = shell("python3 -c 'import torch' 2>/dev/null && echo yes") == "yes";
  const std::string script = std::string(FLEXCP_BENCH_DIR) + "/torch_sdpa_cpu.py";
  const auto docs_all = doc_lens.empty() ? flexcp::tools::default_document_lengths()
                                         : flexcp::masks::read_lengths_file(doc_lens);
  std::vector<Row> rows;
  std::mt19937_64 rng(3);
  for (std::int64_t t : sizes) {
    const auto docs = flexcp::masks::pack_lengths(docs_all, t, t / 4);
    const std::vector<std::pair<std::string, Mask>> cases = {
        {"full", flexcp::masks::full(t, t)},
        {"causal", flexcp::masks::causal(t, t)},
        {"varlen-causal", flexcp::masks::varlen_causal(docs)},
        {"sliding-window-" + std::to_string(window),
         flexcp::masks::sliding_window(docs, window, flexcp::masks::WindowKind::kCausal)},
    };
    Tensor q(dtype, {t, heads, head_dim}, rng), k(dtype, {t, heads_kv, head_dim}, rng),
        v(dtype, {t, heads_kv, head_dim}, rng), dout(dtype, {t, heads, head_dim}, rng),
        out(dtype, {t, heads, head_dim}, rng), lse(DType::kFloat32, {t, heads}, rng),
        dq(dtype, {t, heads, head_dim}, rng), dk(dtype, {t, heads_kv, head_dim}, rng),
        dv(dtype, {t, heads_kv, head_dim}, rng);
    for (const auto& [name, mask] : cases) {
      const double flops = 4.0 * mask.area() * head_dim * heads;
      Row r{name, t, mask.area(), 0, 0, 0, 0};
      r.fwd_gflops =
          flops /
          median_seconds([&] { flexcp::forward(q.view, k.view, v.view, mask, out.view, lse.view); },
                         kWarmup, repeat) /
          1e9;
      if (backward)
        r.bwd_gflops = 2.5 * flops /
                       median_seconds(
                           [&] {
                             flexcp::backward(dout.view, q.view, k.view, v.view, out.view, lse.view,
                                              mask, dq.view, dk.view, dv.view);
                           },
                           kWarmup, repeat) /
                       1e9;
      if (have_torch && (name == "full" || name == "causal")) {
        std::ostringstream cmd;
        cmd << "python3 " << script << " --seqlen " << t << " --heads " << heads << " --heads-kv "
            << heads_kv << " --head-dim " << head_dim << " --dtype " << dtype_name << " --repeat "
            << repeat << (name == "causal" ? " --causal" : "") << (backward ? " --backward" : "");
        const std::string line = shell(cmd.str());
        if (field(line, "fwd_us") > 0) r.torch_fwd_gflops = flops / field(line, "fwd_us") / 1e3;
        if (field(line, "bwd_us") > 0)
          r.torch_bwd_gflops = 2.5 * flops / field(line, "bwd_us") / 1e3;
      }
      std::printf(
          "[case] mask=%s T=%lld H=%lld HK=%lld D=%lld dtype=%s [result] fwd_GFLOPS=%.1f "
          "bwd_GFLOPS=%.1f "
          "fwd/sgemm=%.2f torch_fwd_GFLOPS=%.1f torch_bwd_GFLOPS=%.1f\n",
          name.c_str(), (long long)t, (long long)heads, (long long)heads_kv, (long long)head_dim,
          dtype_name.c_str(), r.fwd_gflops, r.bwd_gflops, r.fwd_gflops / sgemm_attn,
          r.torch_fwd_gflops, r.torch_bwd_gflops);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (out_path.empty()) return 0;
  std::ofstream md(out_path);
  md << "# CPU attention benchmark\n\n"
     << "- date: " << shell("date -u +%Y-%m-%dT%H:%MZ") << "\n"
     << "- machine: " << shell("lscpu | sed -n 's/^Model name: *//p'") << ", " << shell("nproc")
     << " cores\n"
     << "- commit: " << shell("git rev-parse --short HEAD 2>/dev/null") << "\n"
     << "- flexcp " << flexcp::version() << ", " << dtype_name << ", H=" << heads
     << " HK=" << heads_kv << " D=" << head_dim << ", median of " << repeat << "\n"
     << "- OpenBLAS sgemm (all cores): " << t4k << "x" << t4k << "x" << d << " " << sgemm_qk
     << " GFLOPS; " << t4k << "x" << d << "x" << t4k << " " << sgemm_pv
     << " GFLOPS; attention-shaped (harmonic mean) " << sgemm_attn << " GFLOPS; 2048^3 "
     << sgemm_square << " GFLOPS\n"
     << "- torch CPU SDPA: "
     << (have_torch ? shell("python3 -c 'import torch; print(torch.__version__)'")
                    : "not importable here")
     << "\n"
     << "- GFLOPS count attended pairs only: forward 4*area*D*H, backward 2.5x that\n\n"
     << "| T | mask | area | fwd GFLOPS | fwd / sgemm | fwd per pair vs full | bwd GFLOPS | torch "
        "fwd | flexcp/torch fwd | torch bwd | flexcp/torch bwd |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const Row& r : rows) {
    double full_rate = r.fwd_gflops;
    for (const Row& f : rows)
      if (f.seqlen == r.seqlen && f.mask == "full") full_rate = f.fwd_gflops;
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::snprintf(buf, sizeof buf,
                  "| %lld | %s | %lld | %.1f | %.2f | %.2f | %.1f | %.1f | %.2f | %.1f | %.2f |\n",
                  (long long)r.seqlen, r.mask.c_str(), (long long)r.area, r.fwd_gflops,
                  r.fwd_gflops / sgemm_attn, r.fwd_gflops / full_rate, r.bwd_gflops,
                  r.torch_fwd_gflops, ratio(r.fwd_gflops, r.torch_fwd_gflops), r.torch_bwd_gflops,
                  ratio(r.bwd_gflops, r.torch_bwd_gflops));
    md << buf;
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
