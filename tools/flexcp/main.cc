// flexcp: the command-line tool. `flexcp --help` lists the subcommands.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>

#include "app.h"
#include "commands.h"
#include "flexcp/flexcp.h"

int main(int argc, char** argv) {
  CLI::App app{"flexcp: exact attention over ultra-long sequences with arbitrary masks"};
  flexcp::tools::add_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Argument errors read like every other error and exit like them (2), so that scripts and
    // mpirun see one convention.
    std::cerr << "flexcp: error (invalid argument): " << e.what()
              << " (run with --help for the options)\n";
    flexcp::tools::fail_arguments_of_mpi_rank(argc, argv);
    return 2;
  } catch (const flexcp::Error& e) {
    std::cerr << "flexcp: error (" << flexcp::status_string(e.status()) << "): " << e.what()
              << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    // What asked for the memory is in the arguments; the sizes they imply are what to lower.
    std::cerr << "flexcp: error (out of memory): the allocation for this command's data failed "
                 "(std::bad_alloc); lower --seqlen, --heads or --head-dim\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "flexcp: error (internal): " << e.what() << "\n";
    return 2;
  }
  return 0;
}
