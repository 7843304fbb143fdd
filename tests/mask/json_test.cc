#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace flexcp {
namespace {

std::string json_error(const std::string& text) {
  try {
    Mask::from_json(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(MaskJson, RoundTripsRandomMasks) {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 100; ++iter) {
    const Mask m = test::random_mask(rng, 37, 53);
    const Mask back = Mask::from_json(m.to_json());
    EXPECT_EQ(back.seqlen_q(), 37);
    EXPECT_EQ(back.seqlen_k(), 53);
    EXPECT_EQ(back.slices(), m.slices());
  }
}

TEST(MaskJson, ReadsTheDesignExample) {
  const Mask m = Mask::from_json(R"({"version": 1, "seqlen_q": 65536, "seqlen_k": 65536,
    "slices": [{"q": [0, 4096], "k": [0, 4096], "type": "causal"},
               {"q": [4096, 8192], "k": [0, 8192], "type": "full"}]})");
  EXPECT_EQ(m.area(), 4096LL * 4097 / 2 + 4096LL * 8192);
}

TEST(MaskJson, RejectsBadSpecsWithPreciseMessages) {
  const std::string head = R"({"version": 1, "seqlen_q": 16, "seqlen_k": 16, "slices": )";
  EXPECT_EQ(json_error(head + R"([{"q": [0, 4], "k": [0, 4], "type": "causal", "color": 1}]})"),
            "mask spec: slice 0: unknown key \"color\"");
  EXPECT_EQ(json_error(head + R"([{"q": [0, 4], "k": [0, 4]}]})"),
            "mask spec: slice 0: missing key \"type\"");
  // Found by the fuzzer: a number past a double's range is an error like any other, not an
  // exception of the JSON library's that ended the process.
  EXPECT_NE(json_error(R"({"version": 1e999, "seqlen_q": 16, "seqlen_k": 16, "slices": []})")
                .find("mask spec: not valid JSON: "),
            std::string::npos);
  EXPECT_EQ(
      json_error(
          head +
          R"([{"q": [0, 4], "k": [0, 4], "type": "full"}, {"q": [0, "4"], "k": [0, 4], "type": "full"}]})"),
      "mask spec: slice 1: q[1] is \"4\", expected an integer");
  EXPECT_EQ(json_error(head + R"([{"q": [0, 4, 5], "k": [0, 4], "type": "full"}]})"),
            "mask spec: slice 0: q is [0,4,5], expected [begin, end]");
  EXPECT_EQ(json_error(head + R"([{"q": [0, 4], "k": [0, 4], "type": "sideways"}]})"),
            "mask spec: slice 0: mask type 'sideways' is unknown; expected full, causal, "
            "inv_causal or bi_causal");
  EXPECT_EQ(json_error(head + R"([{"q": [0, 4], "k": [0, 17], "type": "full"}]})"),
            "mask spec: slice 0: k_range [0, 17) ends past seqlen_k 16");
  EXPECT_EQ(
      json_error(
          head +
          R"([{"q": [0, 4], "k": [0, 4], "type": "full"}, {"q": [3, 5], "k": [3, 5], "type": "full"}]})"),
      "mask spec: slices 0 and 1 both cover the pair (q=3, k=3); a mask's slices must not overlap");
  EXPECT_EQ(json_error(R"({"version": 2, "seqlen_q": 1, "seqlen_k": 1, "slices": []})"),
            "mask spec: version is 2, expected 1");
  EXPECT_EQ(json_error(R"({"version": 1, "seqlen_q": 1, "slices": []})"),
            "mask spec: missing key \"seqlen_k\"");
  EXPECT_EQ(json_error("[1, 2]"), "mask spec: top level is array, expected an object");
  EXPECT_NE(json_error("{\"version\": "), "");
  EXPECT_EQ(json_error("{\"version\": ").rfind("mask spec: not valid JSON", 0), 0u);
}

TEST(MaskJson, FileErrorsNameThePath) {
  try {
    Mask::from_json_file("/nonexistent/mask.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mask file '/nonexistent/mask.json' cannot be read");
  }
}

}  // namespace
}  // namespace flexcp
