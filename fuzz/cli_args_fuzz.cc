// libFuzzer target: the tool's command line. The input, split at newlines, is the argument list
// (at most 32 arguments) given to the same CLI11 app as `flexcp` builds (every subcommand, option
// and validator), stopped before any command runs.
// Parsing must succeed or throw CLI::ParseError (what the tool reports as an argument error,
// exit code 2); any other exception, a crash or a sanitizer report fails.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kMaxArgs = 32;
  std::vector<std::string> args{"flexcp"};
  std::string arg;
  for (std::size_t i = 0; i < size && args.size() <= kMaxArgs; ++i) {
    if (data[i] == '\n') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg.push_back(static_cast<char>(data[i]));
    }
  }
  if (!arg.empty() && args.size() <= kMaxArgs) args.push_back(arg);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());

  CLI::App app{"flexcp"};
  flexcp::tools::add_commands(app);
  // A subcommand's parse-complete callback runs once its options are converted, validated and
  // their requirements checked, before its action: thrown from there, it stops the action. (The
  // actions themselves must stay: they own the variables the options write to.)
  struct Parsed {};
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    sub->parse_complete_callback([] { throw Parsed{}; });
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
  } catch (const Parsed&) {
  }
  return 0;
}
