// The subcommands of the `flexcp` tool (DESIGN §4). Each registers itself on the app and runs
// from its callback; errors surface as flexcp::Error and become exit code 2 in main.
#pragma once

#include <CLI/CLI.hpp>

#include "flexcp/plan.h"

namespace flexcp::tools {

void add_attn_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_mask_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_plan_command(CLI::App& app);

// --world, --chunk, head sizes and the cost model, shared by `plan` and `mask --world`.
void add_plan_options(CLI::App& cmd, PlanOptions& options);

}  // namespace flexcp::tools
