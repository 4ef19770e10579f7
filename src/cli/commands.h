#pragma once
// The CLI's commands. Each takes the arguments after its name and the global flags, and returns
// the process's exit code, or a Failure that main prints as one line.

#include <string>
#include <string_view>
#include <vector>

#include "cli/api.h"
#include "cli/args.h"
#include "cli/outcome.h"

namespace airlock::cli {

using CommandArgs = std::vector<std::string>;

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `airlock help`
  std::string_view usage;    // the full text for `airlock COMMAND --help`
  Outcome<int> (*run)(const CommandArgs& args, Globals& globals);
};

// Every command, in the order `airlock help` lists them.
const std::vector<Command>& Commands();
const Command* FindCommand(std::string_view name);
// The top-level help: usage, global flags, the commands, exit codes.
std::string TopLevelHelp();

// Parses `args` for `command` (see ParseArgs) and applies the global flags found among them.
[[nodiscard]] Outcome<Args> Parse(std::string_view command, const CommandArgs& args,
                                  std::span<const FlagSpec> specs, Globals& globals,
                                  std::optional<size_t> tail_after = std::nullopt);
// Prints `command`'s usage text on stdout; returns 0.
int PrintUsage(std::string_view command);

Outcome<int> CmdCp(const CommandArgs& args, Globals& globals);  // in cp.cc

// Writes all of `bytes` to `fd` (retrying short writes); false if that failed.
bool WriteAll(int fd, std::string_view bytes);

}  // namespace airlock::cli
