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

// Called by main on an argument error: when this process is a rank of an mpirun job of `flexcp
// run`, it tells the other ranks (which then stop with exit code 2 too) and returns true.
bool fail_arguments_of_mpi_rank(int argc, const char* const* argv);

// --world, --chunk, head sizes and the cost model, shared by `plan` and `mask --world`.
void add_plan_options(CLI::App& cmd, PlanOptions& options);

}  // namespace flexcp::tools
