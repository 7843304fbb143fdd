// Each mask builder against the plain definition of what it should attend.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "test_util.h"

namespace flexcp {
namespace {

using Pred = std::function<bool(std::int64_t q, std::int64_t k)>;

void expect_mask(const Mask& m, std::int64_t tq, std::int64_t tk, const Pred& want) {
  ASSERT_EQ(m.seqlen_q(), tq);
  ASSERT_EQ(m.seqlen_k(), tk);
  const auto pairs = test::enumerate_pairs(m.slices(), tq, tk);
  std::int64_t area = 0;
  for (std::int64_t q = 0; q < tq; ++q)
    for (std::int64_t k = 0; k < tk; ++k) {
      ASSERT_EQ(pairs[q * tk + k], want(q, k) ? 1 : 0) << "q=" << q << " k=" << k;
      area += want(q, k);
    }
  ASSERT_EQ(m.area(), area);
}

// Document index and start of each token.
struct Docs {
  std::vector<std::int64_t> doc, start;
  explicit Docs(const masks::Lengths& lens) {
    std::int64_t o = 0;
    for (std::size_t d = 0; d < lens.size(); ++d) {
      for (std::int64_t i = 0; i < lens[d]; ++i) doc.push_back(d), start.push_back(o);
      o += lens[d];
    }
  }
  bool same(std::int64_t a, std::int64_t b) const { return doc[a] == doc[b]; }
  std::int64_t total() const { return static_cast<std::int64_t>(doc.size()); }
};

masks::Lengths random_lengths(std::mt19937_64& rng) {
  masks::Lengths lens(std::uniform_int_distribution<int>(1, 5)(rng));
  for (auto& n : lens) n = std::uniform_int_distribution<std::int64_t>(0, 13)(rng);
  return lens;
}

TEST(Masks, FullCausalAndCross) {
  expect_mask(masks::full(5, 9), 5, 9, [](auto, auto) { return true; });
  // Bottom-right aligned: row i sees keys j <= i + (sk - sq).
  expect_mask(masks::causal(5, 9), 5, 9, [](auto q, auto k) { return k <= q + 4; });
  expect_mask(masks::causal(9, 5), 9, 5, [](auto q, auto k) { return k <= q - 4; });
  expect_mask(masks::causal(0, 0), 0, 0, [](auto, auto) { return false; });
  expect_mask(masks::batch(3, 4, MaskType::kCausal), 12, 12,
              [](auto q, auto k) { return q / 4 == k / 4 && k <= q; });
  expect_mask(masks::from_cu_seqlens({0, 2, 2, 7}, {0, 3, 5, 6}, MaskType::kFull), 7, 6,
              [](auto q, auto k) { return (q < 2 && k < 3) || (q >= 2 && k == 5); });
}

TEST(Masks, DocumentMasksOnRandomLengths) {
  std::mt19937_64 rng(21);
  for (int iter = 0; iter < 200; ++iter) {
    const masks::Lengths lens = random_lengths(rng);
    const Docs d(lens);
    const std::int64_t t = d.total();
    const std::int64_t w = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
    expect_mask(masks::varlen_full(lens), t, t, [&](auto q, auto k) { return d.same(q, k); });
    expect_mask(masks::varlen_causal(lens), t, t,
                [&](auto q, auto k) { return d.same(q, k) && k <= q; });
    expect_mask(masks::sliding_window(lens, w, masks::WindowKind::kCausal), t, t,
                [&](auto q, auto k) { return d.same(q, k) && k <= q && k > q - w; });
    expect_mask(masks::sliding_window(lens, w, masks::WindowKind::kSymmetric), t, t,
                [&](auto q, auto k) { return d.same(q, k) && k < q + w && k > q - w; });
    expect_mask(masks::block_causal(lens, w), t, t, [&](auto q, auto k) {
      return d.same(q, k) && (k - d.start[k]) / w <= (q - d.start[q]) / w;
    });
    masks::Lengths prefix;
    for (auto n : lens) prefix.push_back(std::uniform_int_distribution<std::int64_t>(0, n)(rng));
    expect_mask(masks::prefix_lm(lens, prefix), t, t, [&](auto q, auto k) {
      const std::int64_t p = d.start[q] + prefix[d.doc[q]];
      return d.same(q, k) && (k < p || k <= q);
    });
    const std::int64_t question = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
    const Docs a(lens);
    expect_mask(masks::shared_question(question, lens), question + t, question + t,
                [&](auto q, auto k) {
                  if (q < question) return k <= q;
                  if (k < question) return true;
                  return a.same(q - question, k - question) && k <= q;
                });
  }
}

TEST(Masks, BadArgumentsAreNamed) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([] { masks::causal(-1, 4); }),
            "flexcp::masks::causal: seqlen_q is -1, expected 0 to 2147483648 (kMaxSeqlen, 2^31 "
            "tokens)");
  EXPECT_EQ(message([] { masks::full(4, kMaxSeqlen + 1); }),
            "flexcp::masks::full: seqlen_k is 2147483649, expected 0 to 2147483648 (kMaxSeqlen, "
            "2^31 tokens)");
  EXPECT_EQ(message([] { masks::causal(kMaxSeqlen, kMaxSeqlen); }), "");  // exactly the most
  EXPECT_EQ(message([] { masks::sliding_window({4}, 0, masks::WindowKind::kCausal); }),
            "flexcp::masks::sliding_window: window is 0, expected >= 1");
  EXPECT_EQ(message([] {
              masks::varlen_causal({3, -1});
            }),
            "flexcp::masks::varlen: doc_lens[1] is -1, expected >= 0");
  // Totals past kMaxSeqlen are named at the length that goes past, before any offset overflows
  // (2^62 twice wrapped int64 and was reported as a negative seqlen).
  constexpr std::int64_t kHuge = std::int64_t{1} << 62;
  EXPECT_EQ(message([] {
              masks::varlen_causal({5, kHuge, kHuge});
            }),
            "flexcp::masks::varlen: doc_lens[1] is 4611686018427387904 after 5 tokens, past the "
            "most a mask holds (2147483648, kMaxSeqlen)");
  EXPECT_EQ(message([] {
              masks::varlen_full({kMaxSeqlen, 1});
            }),
            "flexcp::masks::varlen: doc_lens[1] is 1 after 2147483648 tokens, past the most a mask "
            "holds (2147483648, kMaxSeqlen)");
  EXPECT_EQ(message([] { masks::varlen_full({kMaxSeqlen - 1, 1}); }), "");  // exactly the most
  EXPECT_EQ(message([] { masks::shared_question(kMaxSeqlen, {1}); }),
            "flexcp::masks::shared_question: answer_lens[0] is 1 after 2147483648 tokens, past "
            "the most a mask holds (2147483648, kMaxSeqlen)");
  EXPECT_EQ(message([] { masks::block_causal({kHuge}, 64); }),
            "flexcp::masks::block_causal: doc_lens[0] is 4611686018427387904 after 0 tokens, past "
            "the most a mask holds (2147483648, kMaxSeqlen)");
  // Refused before a list of num_seqs lengths is allocated.
  EXPECT_EQ(message([] { masks::batch(kHuge, 0, MaskType::kFull); }),
            "flexcp::masks::batch: 4611686018427387904 sequences of 0 tokens, past the most a "
            "mask holds (2147483648 tokens and sequences, kMaxSeqlen)");
  EXPECT_EQ(message([] { masks::batch(3, kMaxSeqlen / 2, MaskType::kCausal); }),
            "flexcp::masks::batch: 3 sequences of 1073741824 tokens, past the most a mask holds "
            "(2147483648 tokens and sequences, kMaxSeqlen)");
  EXPECT_EQ(message([] { masks::prefix_lm({3}, {4}); }),
            "flexcp::masks::prefix_lm: prefix_lens[0] is 4, longer than its document (3)");
  EXPECT_EQ(message([] {
              masks::from_cu_seqlens({0, 4, 2}, {0, 1, 2}, MaskType::kFull);
            }),
            "flexcp::masks::from_cu_seqlens: cu_seqlens_q[2] is 2, below the previous entry 4");
}

TEST(Masks, PackLengthsRefusesATotalNoMaskHolds) {
  // The pool may sum past kMaxSeqlen; the packed total may not (it looped 2^62 times before).
  const masks::Lengths pool = {kMaxSeqlen, kMaxSeqlen, 7};
  EXPECT_EQ(masks::pack_lengths(pool, 20, 8), (masks::Lengths{8, 8, 4}));
  try {
    masks::pack_lengths({1}, std::int64_t{1} << 62, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "flexcp::masks::pack_lengths: total is 4611686018427387904, expected 0 to "
              "2147483648 (kMaxSeqlen)");
  }
}

TEST(Masks, PackLengthsCapsAndFillsExactly) {
  const masks::Lengths packed = masks::pack_lengths({100, 5, 3000}, 5000, 1000);
  std::int64_t total = 0;
  for (auto n : packed) {
    EXPECT_GT(n, 0);
    EXPECT_LE(n, 1000);
    total += n;
  }
  EXPECT_EQ(total, 5000);
  EXPECT_EQ(packed[0], 100);
  EXPECT_EQ(packed[2], 1000);
}

// pack: each mask on its own diagonal block, nothing between them.
TEST(Masks, PackLaysMasksEndToEnd) {
  std::mt19937_64 rng(24);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Mask> parts;
    std::vector<std::int64_t> q0 = {0}, k0 = {0};
    for (int i = std::uniform_int_distribution<int>(0, 4)(rng); i > 0; --i) {
      const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
      const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
      parts.push_back(test::random_mask(rng, tq, tk));
      q0.push_back(q0.back() + tq);
      k0.push_back(k0.back() + tk);
    }
    const Mask packed = masks::pack(parts);
    expect_mask(packed, q0.back(), k0.back(), [&](std::int64_t q, std::int64_t k) {
      for (std::size_t i = 0; i < parts.size(); ++i)
        if (q >= q0[i] && q < q0[i + 1])
          return k >= k0[i] && k < k0[i + 1] && parts[i].attends(q - q0[i], k - k0[i]);
      return false;
    });
  }
  try {
    masks::pack({masks::full(kMaxSeqlen - 3, 1), masks::causal(4, 2)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("masks[1] (4 x 2) after 2147483645 x 1 tokens, past the "
                                         "most a mask holds"),
              std::string::npos)
        << e.what();
  }
}

// document_ids against its definition, pair by pair: a document starts at i when no attended
// pair has one end before i and the other at or after it.
TEST(Masks, DocumentIdsFollowTheAttendedPairs) {
  std::mt19937_64 rng(23);
  auto expect_documents = [](const Mask& m) {
    const std::int64_t t = std::max(m.seqlen_q(), m.seqlen_k());
    const auto pairs = test::enumerate_pairs(m.slices(), m.seqlen_q(), m.seqlen_k());
    std::vector<std::int64_t> want(static_cast<std::size_t>(t), 0);
    for (std::int64_t i = 1; i < t; ++i) {
      bool crossed = false;
      for (std::int64_t q = 0; q < m.seqlen_q() && !crossed; ++q)
        for (std::int64_t k = 0; k < m.seqlen_k() && !crossed; ++k)
          crossed = pairs[q * m.seqlen_k() + k] && std::min(q, k) < i && i <= std::max(q, k);
      want[i] = want[i - 1] + (crossed ? 0 : 1);
    }
    EXPECT_EQ(masks::document_ids(m), want);
  };
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 20)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 20)(rng);
    expect_documents(test::random_mask(rng, tq, tk));
  }
  // The same pairs drawn two ways give the same documents: one-token causal documents and a
  // diagonal band.
  const std::vector<std::int64_t> each_its_own = {0, 1, 2, 3, 4};
  EXPECT_EQ(masks::document_ids(masks::varlen_causal({1, 1, 1, 1, 1})), each_its_own);
  EXPECT_EQ(masks::document_ids(Mask(5, 5, {{{0, 5}, {0, 5}, MaskType::kBiCausal}})), each_its_own);
  EXPECT_EQ(masks::document_ids(masks::varlen_causal({3, 1, 2})),
            (std::vector<std::int64_t>{0, 0, 0, 1, 2, 2}));
  EXPECT_EQ(masks::document_ids(masks::full(3, 3)), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(masks::document_ids(masks::full(0, 0)).size(), 0u);
  for (int trial = 0; trial < 50; ++trial) {
    expect_documents(masks::varlen(random_lengths(rng), static_cast<MaskType>(rng() % 4)));
    expect_documents(
        masks::sliding_window(random_lengths(rng), 1 + rng() % 4, masks::WindowKind::kSymmetric));
  }
}

}  // namespace
}  // namespace flexcp
