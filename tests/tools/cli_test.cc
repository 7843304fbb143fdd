// The `flexcp` tool as users run it: a real process, real files, exit codes and messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>

#include "npy.h"
#include "test_util.h"
#include "timing.h"

namespace flexcp {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string output;
};

// NOTE: `run` starts MPI; in the sanitizer build leak checking is off for it (see
// tests/CMakeLists.txt).
constexpr const char* kMpiEnv = "env ASAN_OPTIONS=detect_leaks=0 ";

// A shell command's exit code (-1 if it did not exit) and its output, stderr included.
Result run_shell(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Result run_cli(const std::string& args) {
  const std::string prefix = args.rfind("run ", 0) == 0 ? kMpiEnv : "";
  return run_shell(prefix + FLEXCP_CLI_PATH + " " + args);
}

// `flexcp run ARGS` on `ranks` processes under mpirun, with `env` exported to them.
Result run_under_mpirun(int ranks, const std::string& env, const std::string& args) {
  return run_shell(std::string(kMpiEnv) + "mpirun --allow-run-as-root --oversubscribe -np " +
                   std::to_string(ranks) + " -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS " + env + " " +
                   FLEXCP_CLI_PATH + " run " + args);
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flexcp_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void save(const std::string& path, const test::Tensor& t) {
  std::vector<float> v(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<float>(t.get(i));
  std::vector<std::int64_t> shape(t.view.shape, t.view.shape + t.view.ndim);
  tools::write_npy(path, shape, v.data());
}

TEST_F(Cli, AttnForwardAndBackwardMatchTheReference) {
  std::mt19937_64 rng(71);
  const std::int64_t tq = 150, tk = 170, hq = 4, hk = 2, d = 32;
  // Random slices over rows [0, 100) and [120, 150); rows 100..119 attend nothing.
  std::vector<Slice> slices = test::random_mask(rng, 100, tk).slices();
  const Mask tail = test::random_mask(rng, 30, tk);
  for (Slice s : tail.slices()) {
    s.q = {s.q.begin + 120, s.q.end + 120};
    slices.push_back(s);
  }
  const Mask mask(tq, tk, slices);
  // The tool poisons its outputs: rows that attend nothing must still be written (0 and -inf).
  std::int64_t empty_rows = 0;
  for (std::int64_t x = 0; x < tq; ++x) empty_rows += mask.area({x, x + 1}, {0, tk}) == 0;
  ASSERT_GT(empty_rows, 0) << "the test needs a mask with rows that attend nothing";
  mask.write_json_file(path("mask.json"));
  test::Tensor q = test::random_tensor(rng, DType::kFloat32, {tq, hq, d}),
               k = test::random_tensor(rng, DType::kFloat32, {tk, hk, d}),
               v = test::random_tensor(rng, DType::kFloat32, {tk, hk, d}),
               dout = test::random_tensor(rng, DType::kFloat32, {tq, hq, d});
  save(path("q.npy"), q);
  save(path("k.npy"), k);
  save(path("v.npy"), v);
  save(path("do.npy"), dout);
  const Result r =
      run_cli("attn --mask-file " + path("mask.json") + " --q " + path("q.npy") + " --k " +
              path("k.npy") + " --v " + path("v.npy") + " --out " + path("out.npy") + " --lse " +
              path("lse.npy") + " --dout " + path("do.npy") + " --dq " + path("dq.npy") + " --dk " +
              path("dk.npy") + " --dv " + path("dv.npy") + " --softcap 4");
  ASSERT_EQ(r.code, 0) << r.output;
  AttentionOptions o;
  o.softcap = 4;
  test::Tensor ref(DType::kFloat64, {tq, hq, d}), ref_lse(DType::kFloat64, {tq, hq}),
      dq(DType::kFloat64, {tq, hq, d}), dk(DType::kFloat64, {tk, hk, d}),
      dv(DType::kFloat64, {tk, hk, d});
  reference_forward(q.view, k.view, v.view, mask, ref.view, ref_lse.view, o);
  reference_backward(dout.view, q.view, k.view, v.view, mask, dq.view, dk.view, dv.view, o);
  for (auto [file, want] : {std::pair{"out.npy", &ref},
                            {"lse.npy", &ref_lse},
                            {"dq.npy", &dq},
                            {"dk.npy", &dk},
                            {"dv.npy", &dv}}) {
    const tools::NpyArray got = tools::read_npy(path(file));
    ASSERT_EQ(static_cast<std::int64_t>(got.data.size()), want->numel()) << file;
    for (std::size_t i = 0; i < got.data.size(); ++i) {
      const double w = want->get(i);
      if (std::isinf(w)) {
        ASSERT_EQ(got.data[i], w) << file << " " << i;
      } else {
        ASSERT_NEAR(got.data[i], w, 2e-5) << file << " " << i;
      }
    }
  }
}

TEST_F(Cli, BadInputsFailWithMessages) {
  std::ofstream(path("overlap.json")) << R"({"version": 1, "seqlen_q": 8, "seqlen_k": 8, "slices": [
      {"q": [0, 8], "k": [0, 8], "type": "causal"}, {"q": [0, 8], "k": [0, 8], "type": "full"}]})";
  std::mt19937_64 rng(72);
  save(path("q.npy"), test::random_tensor(rng, DType::kFloat32, {8, 2, 16}));
  save(path("k.npy"), test::random_tensor(rng, DType::kFloat32, {8, 1, 16}));
  save(path("k2d.npy"), test::random_tensor(rng, DType::kFloat32, {8, 16}));
  {
    const std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n";
    std::ofstream f64(path("f64.npy"), std::ios::binary);
    f64 << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size()) << '\0' << header
        << std::string(16, '\0');
  }
  const std::string io = " --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                         path("k.npy") + " --out " + path("o.npy") + " --lse " + path("l.npy");
  Result r = run_cli("attn --mask-file " + path("overlap.json") + io);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("slices 0 and 1 both cover the pair (q=0, k=0)"), std::string::npos)
      << r.output;
  r = run_cli("attn --mask causal --seqlen 9" + io);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("flexcp::forward: q has 8 tokens but the mask has seqlen_q 9"),
            std::string::npos)
      << r.output;
  r = run_cli("attn --mask causal --seqlen 8 --q " + path("q.npy") + " --k " + path("k2d.npy") +
              " --v " + path("k.npy") + " --out " + path("o.npy") + " --lse " + path("l.npy"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("k2d.npy has 2 dims, expected 3"), std::string::npos) << r.output;
  r = run_cli("attn --mask causal --seqlen 8 --q " + path("f64.npy") + " --k " + path("k.npy") +
              " --v " + path("k.npy") + " --out " + path("o.npy") + " --lse " + path("l.npy"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("dtype is <f8, expected float32"), std::string::npos) << r.output;
  // fp32 has no CUDA kernel; without a GPU (or without CUDA in the build) the error says so first.
  r = run_cli("attn --mask causal --seqlen 8 --device cuda" + io);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(r.output.find("not compiled") != std::string::npos ||
              r.output.find("no usable CUDA device") != std::string::npos)
      << r.output;
  r = run_cli("attn --mask varlen-causal --seqlen 8 --doc-len 0 --q " + path("q.npy") + " --k " +
              path("k.npy") + " --v " + path("k.npy") + " --out " + path("o.npy") + " --lse " +
              path("l.npy"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--doc-len"), std::string::npos) << r.output;
  r = run_cli("bench --mask nonsense --seqlen 8");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--mask"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("o.npy")));  // nothing was written by the failed runs
}

// Lengths past the limit (kMaxSeqlen, 2^31) and numbers that do not read as written are errors
// that say so, never a crash or a quietly different mask; so is what cannot be drawn or allocated.
TEST_F(Cli, LengthsAndEdgeInputsFailWithMessages) {
  for (const char* seqlen : {"9223372036854775807", "99999999999999999999", "2147483649"}) {
    const Result r = run_cli(std::string("plan --mask full --seqlen ") + seqlen + " --world 2");
    EXPECT_NE(r.code, 0) << seqlen;
    EXPECT_NE(r.output.find("more than flexcp takes (at most 2147483648"), std::string::npos)
        << r.output;
  }
  for (const char* seqlen : {"0100", "0x40", "-5", "1e3"}) {
    const Result r = run_cli(std::string("plan --mask causal --seqlen ") + seqlen + " --world 2");
    EXPECT_NE(r.code, 0) << seqlen;
    EXPECT_NE(r.output.find("is not a token count"), std::string::npos) << r.output;
  }
  Result r = run_cli("plan --mask full --seqlen 64 --seqlen-k 0064 --world 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("'0064' is not a token count"), std::string::npos) << r.output;

  std::ofstream(path("empty.json")) << R"({"version":1,"seqlen_q":0,"seqlen_k":0,"slices":[]})";
  r = run_cli("mask --mask-file " + path("empty.json") + " --out " + path("z.svg"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the mask is 0 x 0 tokens: there is nothing to draw"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(path("z.svg")));
  std::ofstream(path("huge.json"))
      << R"({"version":1,"seqlen_q":18446744073709551615,"seqlen_k":8,"slices":[]})";
  r = run_cli("mask --mask-file " + path("huge.json") + " --out " + path("z.svg"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("seqlen_q is 18446744073709551615, expected at most 2147483648"),
            std::string::npos)
      << r.output;
  std::ofstream(path("long.json"))
      << R"({"version":1,"seqlen_q":4611686018427387904,"seqlen_k":8,"slices":[]})";
  r = run_cli("plan --mask-file " + path("long.json") + " --world 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("seqlen_q is 4611686018427387904, expected at most 2147483648"),
            std::string::npos)
      << r.output;
  // At the limit the mask is valid, and the 4 TiB of q are not: an error saying how much, not an
  // abort in the allocator.
  r = run_cli("bench --mask causal --seqlen 2147483648 --heads 8 --head-dim 128");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("a bf16 tensor [2147483648, 8, 128] needs 4096.0"), std::string::npos)
      << r.output;
}

// Inputs that used to be read in part (or forever), each an error naming the argument and value.
TEST_F(Cli, PartlyReadInputsFailWithMessages) {
  for (const char* line : {"1.5", "100 200", "100x", "0x10", "1e3"}) {
    std::ofstream(path("lens.txt")) << "300\n" << line << "\n";
    const Result r = run_cli("plan --mask varlen-causal --seqlen 1024 --doc-lens " +
                             path("lens.txt") + " --world 2");
    EXPECT_EQ(r.code, 2) << line << ": " << r.output;
    EXPECT_NE(r.output.find("lens.txt:2: '" + std::string(line) +
                            "' is not one integer, expected one length per line"),
              std::string::npos)
        << r.output;
  }
  std::ofstream(path("dup.json"))
      << R"({"version":1,"seqlen_q":8,"seqlen_k":8,"seqlen_q":4,"slices":[]})";
  Result r = run_cli("plan --mask-file " + path("dup.json") + " --world 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("duplicate key \"seqlen_q\""), std::string::npos) << r.output;
  std::ofstream(path("dup-slice.json"))
      << R"({"version":1,"seqlen_q":8,"seqlen_k":8,"slices":[{"q":[0,8],"k":[0,8],"q":[0,4],)"
      << R"("type":"full"}]})";
  r = run_cli("plan --mask-file " + path("dup-slice.json") + " --world 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("duplicate key \"q\""), std::string::npos) << r.output;
  // A device that never ends, and a binary file: refused at their first bytes, not read forever.
  for (const std::string& file : {std::string("/dev/zero"), path("binary.json")}) {
    std::ofstream(path("binary.json"), std::ios::binary) << std::string("{\0\0}", 4);
    r = run_cli("plan --mask-file " + file + " --world 1");
    EXPECT_EQ(r.code, 2) << file << ": " << r.output;
    EXPECT_NE(r.output.find("holds a NUL byte at offset"), std::string::npos) << r.output;
  }
  r = run_cli("plan --mask varlen-causal --seqlen 1024 --max-doc-len -3 --world 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--max-doc-len"), std::string::npos) << r.output;
  // .npy shapes read in full or refused: the value count must be the file's.
  auto raw_npy = [&](const std::string& file, const std::string& shape, std::size_t values) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
    header.append(63 - (10 + header.size()) % 64, ' ');
    header += '\n';
    std::ofstream out(path(file), std::ios::binary);
    out << "\x93NUMPY" << char(1) << char(0) << char(header.size() & 0xff)
        << char(header.size() >> 8) << header << std::string(values * sizeof(float), '\0');
  };
  const std::pair<const char*, const char*> shapes[] = {
      {"(6x,4,16)", "has the dimension '6x'"},
      {"(-64,4,16)", "has the dimension '-64'"},
      {"(99999999999,4,16)", "has the dimension '99999999999'"},
      {"(6,4,17)", "is 408 float32 values (1632 bytes), but the file holds 1536 bytes"}};
  for (const auto& [shape, message] : shapes) {
    raw_npy("bad.npy", shape, 6 * 4 * 16);
    r = run_cli("attn --mask causal --seqlen 6 --q " + path("bad.npy") + " --k " + path("bad.npy") +
                " --v " + path("bad.npy") + " --out " + path("o.npy") + " --lse " + path("l.npy"));
    EXPECT_EQ(r.code, 2) << shape << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  // Output paths are checked before the inputs are read or anything is computed.
  r = run_cli("attn --mask causal --seqlen 6 --q " + path("bad.npy") + " --k " + path("bad.npy") +
              " --v " + path("bad.npy") + " --out " + path("no-such-folder/o.npy") + " --lse " +
              path("l.npy"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out " + path("no-such-folder/o.npy") + ": the folder"),
            std::string::npos)
      << r.output;
  // Heads that do not group: an error from the planner's check, not an abort inside its threads.
  r = run_cli("plan --mask causal --seqlen 1024 --heads 8 --heads-kv 3 --world 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("heads_q 8 and heads_kv 3, expected heads_q a multiple of heads_kv"),
            std::string::npos)
      << r.output;
}

TEST_F(Cli, MaskDrawsSvg) {
  const Result r = run_cli(
      "mask --mask sliding-window-symmetric --seqlen 3000 --doc-len 700 --window 100 --out " +
      path("m.svg"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(path("m.svg"));
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("fill-opacity"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  const Result png = run_cli("mask --mask causal --seqlen 64 --out " + path("m.png"));
  EXPECT_EQ(png.code, 2);
  EXPECT_NE(png.output.find("expected a .svg picture or a .json mask spec"), std::string::npos)
      << png.output;
  // The same generator as a JSON spec: identical to the library's mask.
  ASSERT_EQ(
      run_cli(
          "mask --mask sliding-window-symmetric --seqlen 3000 --doc-len 700 --window 100 --out " +
          path("m.json"))
          .code,
      0);
  const Mask spec = Mask::from_json_file(path("m.json"));
  const Mask want = masks::sliding_window(masks::pack_lengths({700}, 3000, 750), 100,
                                          masks::WindowKind::kSymmetric);
  EXPECT_EQ(spec.slices(), want.slices());
}

TEST_F(Cli, BenchPrintsJsonAndRunChecksItself) {
  const double before_s = flexcp::tools::monotonic_seconds();
  Result r = run_cli(
      "bench --mask causal --seqlen 300 --heads 2 --heads-kv 1 --head-dim 64 --dtype fp32 "
      "--backward --json --repeat 1");
  const double after_s = flexcp::tools::monotonic_seconds();
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["direction"], "fwd");
  EXPECT_EQ(j[1]["direction"], "bwd");
  EXPECT_EQ(j[2]["direction"], "fwd+bwd");
  // Each direction's timed runs on this process's monotonic clock (what a clock sampler beside
  // the tool averages over): inside the tool's run, in order, the warm-up before each left out.
  double last_s = before_s;
  for (const auto& dir : j) {
    const double from_s = dir["window_s"][0].get<double>(), to_s = dir["window_s"][1].get<double>();
    EXPECT_LE(last_s, from_s) << dir.dump();
    EXPECT_LT(from_s, to_s) << dir.dump();
    last_s = to_s;
  }
  EXPECT_LE(last_s, after_s);
  EXPECT_EQ(j[0]["area"], 300 * 301 / 2);
  // fwd+bwd counts both directions' flops: 3.5x the forward's.
  const double work_fwd = j[0]["tflops"].get<double>() * j[0]["time_us"].get<double>();
  EXPECT_NEAR(j[2]["tflops"].get<double>() * j[2]["time_us"].get<double>(), 3.5 * work_fwd,
              1e-9 * work_fwd);
  EXPECT_GT(j[0]["tflops"].get<double>(), 0.0);
  std::ofstream(path("docs.txt")) << "# document lengths\n700\n\n1500\n90\n";
  r = run_cli("run --seqlen 2048 --heads 2 --heads-kv 1 --head-dim 64 --doc-lens " +
              path("docs.txt"));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line : {"layer 0 against one rank", "layer 1 against one rank"})
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("): ok"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MISMATCH"), std::string::npos) << r.output;
  // With no document file the generators pack the real lengths that ship with flexcp.
  r = run_cli("plan --mask varlen-causal --seqlen 65536 --world 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("imbalance"), std::string::npos) << r.output;
}

// --only times one direction and reports only it; bwd implies --backward.
TEST_F(Cli, BenchTimesOnlyTheDirectionAsked) {
  const std::string bench =
      "bench --mask causal --seqlen 200 --heads 2 --heads-kv 1 --head-dim 64 --dtype fp32 --json "
      "--repeat 1 --only ";
  for (const char* dir : {"fwd", "bwd", "fwd+bwd"}) {
    const Result r = run_cli(bench + dir);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    ASSERT_EQ(j.size(), 1u) << r.output;
    EXPECT_EQ(j[0]["direction"], dir);
    EXPECT_GT(j[0]["tflops"].get<double>(), 0.0);
  }
  const Result bad = run_cli(bench + "backward");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--only"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("backward"), std::string::npos) << bad.output;
}

// --warmup-ms keeps running untimed for that long before the timed runs (so that a GPU has met
// its power limit): the same bench takes at least that much longer with it.
TEST_F(Cli, BenchWarmsUpForTheTimeAsked) {
  const std::string bench =
      "bench --mask causal --seqlen 64 --heads 1 --heads-kv 1 --head-dim 64 --dtype fp32 --warmup "
      "0 "
      "--repeat 1";
  std::string output;  // of the last run
  auto seconds = [&output](const std::string& args) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 0) << r.output;
    output = r.output;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double plain = seconds(bench);
  const double start_s = flexcp::tools::monotonic_seconds();
  const double warmed = seconds(bench + " --warmup-ms 1500");
  EXPECT_GE(warmed - plain, 1.0) << "plain " << plain << " s, --warmup-ms 1500: " << warmed << " s";
  // The timed window it prints opens after the warm-up, and closes before the tool returns.
  std::smatch window;
  ASSERT_TRUE(std::regex_search(output, window, std::regex(R"(window_s=([0-9.]+):([0-9.]+))")))
      << output;
  EXPECT_GE(std::stod(window[1]) - start_s, 1.5) << output;
  EXPECT_LE(std::stod(window[2]), start_s + warmed) << output;
  const Result r = run_cli(bench + " --warmup-ms -5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--warmup-ms: -5 is below 0"), std::string::npos) << r.output;
}

TEST_F(Cli, HelpOnEverySubcommand) {
  const Result env = run_cli("env");
  EXPECT_EQ(env.code, 0);
  EXPECT_NE(env.output.find("FLEXCP_COMM_TIMEOUT_S=120"), std::string::npos) << env.output;
  for (const char* sub : {"", "run", "plan", "attn", "bench", "mask", "env"}) {
    const Result r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << sub;
  }
}

}  // namespace
}  // namespace flexcp

namespace flexcp {
namespace {

TEST_F(Cli, PlanJsonHasTheContractKeysAndAgreesWithTheLibrary) {
  std::ofstream(path("docs.txt")) << "300\n1200\n80\n2500\n";
  const std::string mask = "--mask varlen-causal --seqlen 8192 --doc-lens " + path("docs.txt");
  const Result r = run_cli("plan " + mask + " --world 4 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  for (const char* key : {"imbalance", "comm_bytes_fwd", "plan_ms", "baselines"})
    EXPECT_TRUE(j.contains(key)) << key;
  for (const char* b : {"ring", "ulysses", "allgather", "magi"})
    EXPECT_TRUE(j["baselines"][b].contains("comm_bytes_fwd")) << b;
  PlanOptions o;
  o.world_size = 4;
  const PlanReport plan = make_plan_report(
      masks::varlen_causal(masks::pack_lengths({300, 1200, 80, 2500}, 8192, 2048)), o);
  EXPECT_EQ(j["comm_bytes_fwd"].get<std::int64_t>(), plan.comm_bytes_fwd);
  EXPECT_EQ(j["baselines"]["ring"]["comm_bytes_fwd"].get<std::int64_t>(), plan.ring.comm_bytes_fwd);
  EXPECT_EQ(j["baselines"]["magi"]["comm_bytes_fwd"].get<std::int64_t>(), plan.magi.comm_bytes_fwd);
  EXPECT_DOUBLE_EQ(j["imbalance"].get<double>(), plan.dispatch.imbalance);
  const Result text = run_cli("plan " + mask + " --world 4");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("imbalance"), std::string::npos);
  EXPECT_NE(text.output.find("ring"), std::string::npos);
  const Result bad = run_cli("plan " + mask + " --world 4 --chunk 9000");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("chunk_size 9000 is larger than the sequence (8192 tokens)"),
            std::string::npos)
      << bad.output;
}

TEST_F(Cli, MaskWithWorldColoursByRank) {
  const Result r = run_cli("mask --mask causal --seqlen 4096 --world 4 --out " + path("w.svg"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(path("w.svg"));
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(svg.find("hsl(0,"), std::string::npos);
  EXPECT_NE(svg.find("hsl(270,"), std::string::npos);  // rank 3 of 4
  EXPECT_NE(svg.find("url(#moved)"), std::string::npos);
}

}  // namespace
}  // namespace flexcp

namespace flexcp {
namespace {

TEST_F(Cli, RunUnderMpirunMovesWhatThePlanPredictsAndMatchesOneRank) {
  if (!FLEXCP_TEST_WITH_MPI) GTEST_SKIP() << "built without MPI (-DFLEXCP_WITH_MPI=OFF)";
  const auto [code, out] = run_under_mpirun(
      3, "", "--seqlen 3000 --doc-len 700 --heads 4 --heads-kv 2 --head-dim 32 --dtype fp32");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("3 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("plan predicted"), std::string::npos) << out;
  EXPECT_NE(out.find(": equal"), std::string::npos) << out;
  EXPECT_NE(out.find("): ok"), std::string::npos) << out;
}

// --timing: medians of timed passes and each rank's kernel on its own work, with the weak-scaling
// efficiency per direction; nothing is checked against one rank (no rank holds the whole inputs).
TEST_F(Cli, RunTimingReportsWeakScalingAgainstTheRanksOwnKernels) {
  if (!FLEXCP_TEST_WITH_MPI) GTEST_SKIP() << "built without MPI (-DFLEXCP_WITH_MPI=OFF)";
  const auto [code, out] = run_under_mpirun(
      3, "", "--seqlen 3000 --doc-len 700 --heads 4 --heads-kv 2 --head-dim 32 --timing 2");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(": equal"), std::string::npos) << out;
  EXPECT_EQ(out.find("against one rank"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex("median of 2 passes\\): forward ([0-9.]+) ms on the slowest rank, the ranks' "
                 "kernels on their own work ([0-9.]+) ms on average: efficiency ([0-9.]+).*"
                 "backward ([0-9.]+) ms, kernels ([0-9.]+) ms: efficiency ([0-9.]+)")))
      << out;
  for (int i = 1; i <= 6; ++i) EXPECT_GT(std::stod(m[i].str()), 0) << m[i] << "\n" << out;
  // The efficiency is the kernels' mean over the slowest rank's time, as printed (3 decimals).
  EXPECT_NEAR(std::stod(m[3].str()), std::stod(m[2].str()) / std::stod(m[1].str()), 2e-3) << out;
  EXPECT_NEAR(std::stod(m[6].str()), std::stod(m[5].str()) / std::stod(m[4].str()), 2e-3) << out;
}

// --device cuda: two ranks sharing the GPU through the staged backend (NCCL refuses two ranks on
// one GPU), two layers, against one GPU; skips where no GPU (or no CUDA build) is present. --comm
// without --device cuda is an argument error.
TEST_F(Cli, RunOnGpusMovesWhatThePlanPredictsAndMatchesOneGpu) {
  if (!FLEXCP_TEST_WITH_MPI) GTEST_SKIP() << "built without MPI (-DFLEXCP_WITH_MPI=OFF)";
  const Result bad = run_cli("run --comm staged --seqlen 1024");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--comm: staged needs --device cuda"), std::string::npos) << bad.output;
  const auto [code, out] = run_under_mpirun(
      2, "-x NCCL_NVLS_ENABLE=0",
      "--device cuda --comm staged --seqlen 4096 --doc-len 700 --heads 8 --heads-kv 2 "
      "--head-dim 128 --dtype bf16 --layers 2");
  for (const char* no_gpu : {"no usable CUDA device", "this build has no CUDA kernels"})
    if (out.find(no_gpu) != std::string::npos) GTEST_SKIP() << no_gpu;
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("2 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find(": equal"), std::string::npos) << out;
  for (const char* line : {"layer 0 against one GPU", "layer 1 against one GPU"})
    EXPECT_NE(out.find(line), std::string::npos) << out;
  EXPECT_EQ(out.find("MISMATCH"), std::string::npos) << out;
}

// Argument errors exit 2 with the tool's error prefix, like every other error; under mpirun a
// rank that stops on one ends the job (the others never reach a collective it is missing from),
// every time: a loop, since the hang this guards against was 1 run in 12.
TEST_F(Cli, ArgumentErrorsExit2AndEndAnMpiJob) {
  Result r = run_cli("plan --mask causal --seqlen 64 --world 2 --bogus");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("flexcp: error (invalid argument): The following argument was not "
                          "expected: --bogus (run with --help for the options)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(run_cli("plan --help").code, 0);
  EXPECT_EQ(run_cli("--version").code, 0);
  // Counts say what they expect (not CLI11's range up to the largest double).
  r = run_cli("plan --mask causal --seqlen 64 --world 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--world: 0 is below 1, expected a whole number >= 1"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("179769313486231570814527423731704356798070567525844996598917"),
            std::string::npos)
      << r.output;
  r = run_cli("bench --mask causal --seqlen 64 --warmup -1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--warmup: -1 is below 0"), std::string::npos) << r.output;
  // One rank moves no bytes: the baselines' ratio to flexcp's is not 0.00x.
  r = run_cli("plan --mask full --seqlen 1024 --world 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("0.00x flexcp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(     -  flexcp)"), std::string::npos) << r.output;
  const std::string run =
      std::string(FLEXCP_CLI_PATH) + " run --seqlen 8192 --doc-len 2048 --heads 2 --heads-kv 2";
  if (!FLEXCP_TEST_WITH_MPI) {
    // Without MPI the main job says what it needs, like any other error.
    r = run_cli("run --seqlen 8192 --doc-len 2048 --heads 2 --heads-kv 2");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("this build has no MPI (configured with -DFLEXCP_WITH_MPI=OFF)"),
              std::string::npos)
        << r.output;
    return;
  }
  const std::string cmd =
      std::string(kMpiEnv) +
      "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS "
      "-np 1 " +
      run + " : -np 2 " + run + " --bogus";
  for (int i = 0; i < 12; ++i) {
    const auto [code, out] = run_shell(cmd);
    ASSERT_NE(code, -1) << out;
    ASSERT_NE(code, 124) << "run " << i << " hung:\n" << out;
    ASSERT_NE(code, 0) << out;
    EXPECT_NE(out.find("flexcp: error (invalid argument): The following argument was not "
                       "expected: --bogus"),
              std::string::npos)
        << out;
    // The rank with valid arguments was told, and stopped without MPI_Abort.
    EXPECT_NE(out.find("arguments were invalid (its message says why); every rank stops"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("MPI_ABORT"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace flexcp
