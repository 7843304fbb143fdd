#include "cli_options.h"

#include <cmath>

#include "default_documents.h"
#include "flexcp/masks.h"
#include "flexcp/status.h"

namespace flexcp::tools {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, message);
}

masks::Lengths documents(const MaskArgs& a) {
  const std::int64_t cap =
      a.max_doc_len > 0 ? a.max_doc_len : std::max<std::int64_t>(1, a.seqlen / 4);
  if (!a.doc_lens_file.empty())
    return masks::pack_lengths(masks::read_lengths_file(a.doc_lens_file), a.seqlen, cap);
  if (a.doc_len > 0) return masks::pack_lengths({a.doc_len}, a.seqlen, cap);
  return masks::pack_lengths(default_document_lengths(), a.seqlen, cap);
}

}  // namespace

CLI::Validator token_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // Decimal digits only (CLI11 would read "0100" as octal, "0x10" as hex), no leading zero,
        // and the value within the length limit (an overflowing one must not wrap).
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || (text.size() > 1 && text[0] == '0'))
          return "'" + text + "' is not a token count (decimal digits, no leading zero)";
        if (text.size() > 10 || std::stoll(text) > kMaxSeqlen)
          return text + " tokens is more than flexcp takes (at most " + std::to_string(kMaxSeqlen) +
                 ", 2^31)";
        return "";
      },
      "TOKENS");
}

CLI::Validator whole_number(std::int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        const std::size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
        const std::string digits = text.substr(sign);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
            (digits.size() > 1 && digits[0] == '0') || digits.size() > 18)
          return "'" + text + "' is not a whole number (decimal digits, no leading zero)";
        if (std::stoll(text) < min)
          return text + " is below " + std::to_string(min) +
                 ", expected a whole number >= " + std::to_string(min);
        return "";
      },
      "INT>=" + std::to_string(min));
}

const std::vector<std::string>& mask_generator_names() {
  static const std::vector<std::string> names = {
      "full",          "causal",         "varlen-full",
      "varlen-causal", "sliding-window", "sliding-window-symmetric",
      "block-causal",  "prefix-lm",      "shared-question"};
  return names;
}

void add_mask_options(CLI::App& cmd, MaskArgs& a) {
  auto* file = cmd.add_option("--mask-file", a.file, "Mask spec (JSON, docs/masks.md)")
                   ->check(CLI::ExistingFile);
  auto* kind = cmd.add_option("--mask", a.kind, "Mask generator")
                   ->check(CLI::IsMember(mask_generator_names()));
  file->excludes(kind);
  kind->excludes(file);
  cmd.add_option("--seqlen", a.seqlen, "Tokens (q; and k unless --seqlen-k) for --mask")
      ->check(token_count());
  cmd.add_option("--seqlen-k", a.seqlen_k, "Key tokens for --mask full|causal (cross-attention)")
      ->check(token_count());
  cmd.add_option("--doc-lens", a.doc_lens_file,
                 "Document lengths, one per line, packed cyclically (default: the real lengths "
                 "that ship with flexcp)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--doc-len", a.doc_len,
                 "Equal documents of this many tokens (instead of --doc-lens)")
      ->check(whole_number(1));
  cmd.add_option("--max-doc-len", a.max_doc_len, "Cap on a document's length (default: seqlen / 4)")
      ->check(whole_number(1));
  cmd.add_option("--window", a.window, "Sliding-window size")->capture_default_str();
  cmd.add_option("--block", a.block, "Block size for block-causal")->capture_default_str();
  cmd.add_option("--prefix-frac", a.prefix_frac, "Prefix share of each document for prefix-lm")
      ->capture_default_str();
  cmd.add_option("--question", a.question, "Question length for shared-question")
      ->capture_default_str();
}

Mask build_mask(const MaskArgs& a) {
  if (!a.file.empty()) return Mask::from_json_file(a.file);
  if (a.kind.empty()) fail("give a mask: --mask-file M.json or --mask NAME --seqlen L");
  if (a.seqlen <= 0) fail("--seqlen is " + std::to_string(a.seqlen) + ", expected > 0 with --mask");
  const std::int64_t tk = a.seqlen_k > 0 ? a.seqlen_k : a.seqlen;
  if (a.kind == "full") return masks::full(a.seqlen, tk);
  if (a.kind == "causal") return masks::causal(a.seqlen, tk);
  if (a.seqlen_k > 0 && a.seqlen_k != a.seqlen)
    fail("--seqlen-k applies to --mask full and causal only");
  if (a.kind == "varlen-full") return masks::varlen_full(documents(a));
  if (a.kind == "varlen-causal") return masks::varlen_causal(documents(a));
  if (a.kind == "sliding-window")
    return masks::sliding_window(documents(a), a.window, masks::WindowKind::kCausal);
  if (a.kind == "sliding-window-symmetric")
    return masks::sliding_window(documents(a), a.window, masks::WindowKind::kSymmetric);
  if (a.kind == "block-causal") return masks::block_causal(documents(a), a.block);
  if (a.kind == "prefix-lm") {
    if (!(a.prefix_frac >= 0 && a.prefix_frac <= 1))
      fail("--prefix-frac is " + std::to_string(a.prefix_frac) + ", expected a fraction in [0, 1]");
    const masks::Lengths docs = documents(a);
    masks::Lengths prefix;
    for (std::int64_t n : docs)
      prefix.push_back(static_cast<std::int64_t>(std::floor(n * a.prefix_frac)));
    return masks::prefix_lm(docs, prefix);
  }
  if (a.kind == "shared-question") {
    if (a.question < 0 || a.question >= a.seqlen)
      fail("--question is " + std::to_string(a.question) + ", expected in [0, seqlen)");
    MaskArgs answers = a;
    answers.seqlen = a.seqlen - a.question;
    return masks::shared_question(a.question, documents(answers));
  }
  fail("--mask " + a.kind + " is unknown");
}

std::string describe_mask(const MaskArgs& a) {
  if (!a.file.empty()) return a.file;
  std::string d = a.kind + " T=" + std::to_string(a.seqlen);
  if (a.kind.rfind("sliding", 0) == 0) d += " w=" + std::to_string(a.window);
  if (a.kind == "block-causal") d += " block=" + std::to_string(a.block);
  return d;
}

void add_shape_options(CLI::App& cmd, ShapeArgs& s) {
  cmd.add_option("--heads", s.heads, "Query heads")->capture_default_str();
  cmd.add_option("--heads-kv", s.heads_kv, "Key/value heads")->capture_default_str();
  cmd.add_option("--head-dim", s.head_dim, "Head dimension")->capture_default_str();
  cmd.add_option("--dtype", s.dtype, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
}

}  // namespace flexcp::tools
