#include "app.h"

#include <iostream>
#include <string>

#include "commands.h"
#include "flexcp/flexcp.h"

namespace flexcp::tools {

void add_commands(CLI::App& app) {
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(version()));
  add_run_command(app);
  add_plan_command(app);
  add_attn_command(app);
  add_bench_command(app);
  add_mask_command(app);
  app.add_subcommand("env", "List the environment variables flexcp reads")->callback([] {
    for (const EnvVarInfo& v : environment_variables())
      std::cout << v.name << "=" << v.value << "  (default " << v.default_value << ")\n    "
                << v.description << "\n";
  });
}

}  // namespace flexcp::tools
