// The `flexcp` tool's command line: every subcommand on one CLI11 app. main() parses and runs it;
// the argument-parsing fuzzer (fuzz/cli_args_fuzz.cc) builds the same app and only parses.
#pragma once

#include <CLI/CLI.hpp>

namespace flexcp::tools {

void add_commands(CLI::App& app);

}  // namespace flexcp::tools
