// airlock: the command-line client for airlockd. See docs/cli.md.
//
// main reads the global flags, finds the command and turns its outcome into an exit code: a
// Failure is printed as one line, "airlock: <message>", never more.

#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/api.h"
#include "cli/commands.h"
#include "cli/outcome.h"

namespace {

using namespace airlock::cli;

Outcome<int> Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  Globals globals;
  size_t i = 0;
  // Global flags come before the command (they are also accepted after it).
  for (; i < args.size() && args[i].starts_with("-"); ++i) {
    std::string flag = args[i];
    std::optional<std::string> value;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    }
    if (flag == "-h" || flag == "--help") {
      std::fputs(TopLevelHelp().c_str(), stdout);
      return 0;
    }
    if (flag == "--version") return FindCommand("version")->run({}, globals);
    if (flag == "--json" && !value) {
      globals.json = true;
      continue;
    }
    if (flag != "--url" && flag != "--api-key") return UsageError("", "unknown flag " + flag);
    if (!value) {
      if (i + 1 >= args.size()) return UsageError("", flag + " needs a value");
      value = args[++i];
    }
    (flag == "--url" ? globals.url : globals.api_key) = *value;
  }
  if (i >= args.size()) return UsageError("", "missing a command");
  const Command* command = FindCommand(args[i]);
  if (command == nullptr) return UsageError("", "unknown command '" + args[i] + "'");
  return command->run(CommandArgs(args.begin() + static_cast<ptrdiff_t>(i) + 1, args.end()),
                      globals);
}

}  // namespace

int main(int argc, char** argv) {
  // A closed stdout (airlock ls | head) ends the output, not the process with a signal.
  ::signal(SIGPIPE, SIG_IGN);
  Outcome<int> code = 0;
  try {
    code = Main(argc, argv);
  } catch (const std::exception& e) {
    code = std::unexpected(Failure{kExitFailure, std::string("internal error: ") + e.what()});
  }
  std::fflush(stdout);
  if (!code) {
    std::fprintf(stderr, "airlock: %s\n", code.error().message.c_str());
    return code.error().exit_code;
  }
  return *code;
}
