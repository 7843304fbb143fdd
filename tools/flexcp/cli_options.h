// Options shared by the subcommands. Masks: a JSON spec (--mask-file) or a generator (--mask NAME
// with sizes), so that no one has to write JSON for common cases. Shapes: heads, dim, dtype.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "flexcp/mask.h"

namespace flexcp::tools {

struct MaskArgs {
  std::string file;
  std::string kind;  // generator name
  std::int64_t seqlen = 0;
  std::int64_t seqlen_k = 0;  // full/causal cross-attention; 0 means seqlen
  std::string doc_lens_file;
  std::int64_t doc_len = 0;      // equal documents of this length instead of a file
  std::int64_t max_doc_len = 0;  // 0: a quarter of seqlen (DESIGN §6)
  std::int64_t window = 1024;
  std::int64_t block = 2048;
  double prefix_frac = 0.5;
  std::int64_t question = 1024;
};

// A token count on the command line: decimal, at most kMaxSeqlen.
CLI::Validator token_count();
// A whole number (decimal, no leading zero) of at least `min`, with a message that says so (CLI11's
// PositiveNumber prints its range up to the largest double).
CLI::Validator whole_number(std::int64_t min);

// The generators --mask accepts.
const std::vector<std::string>& mask_generator_names();

// Adds the options to `cmd`; `required` makes one of --mask-file/--mask mandatory.
void add_mask_options(CLI::App& cmd, MaskArgs& args);

// Builds the mask; throws flexcp::Error naming the option at fault.
Mask build_mask(const MaskArgs& args);

// "varlen-causal T=16384" or the file name, for report lines.
std::string describe_mask(const MaskArgs& args);

struct ShapeArgs {
  std::int64_t heads = 8;
  std::int64_t heads_kv = 8;
  std::int64_t head_dim = 128;
  std::string dtype = "bf16";
};

// --heads, --heads-kv, --head-dim and --dtype (fp32, bf16 or fp16).
void add_shape_options(CLI::App& cmd, ShapeArgs& shape);

}  // namespace flexcp::tools
