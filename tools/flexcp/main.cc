// flexcp: the command-line tool. `flexcp --help` lists the subcommands.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "flexcp/flexcp.h"

int main(int argc, char** argv) {
  CLI::App app{"flexcp: exact attention over ultra-long sequences with arbitrary masks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(flexcp::version()));
  flexcp::tools::add_run_command(app);
  flexcp::tools::add_plan_command(app);
  flexcp::tools::add_attn_command(app);
  flexcp::tools::add_bench_command(app);
  flexcp::tools::add_mask_command(app);
  app.add_subcommand("env", "List the environment variables flexcp reads")->callback([] {
    for (const flexcp::EnvVarInfo& v : flexcp::environment_variables())
      std::cout << v.name << "=" << v.value << "  (default " << v.default_value << ")\n    "
                << v.description << "\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flexcp::Error& e) {
    std::cerr << "flexcp: error (" << flexcp::status_string(e.status()) << "): " << e.what()
              << "\n";
    return 2;
  }
  return 0;
}
