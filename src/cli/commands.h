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
// templates.cc
Outcome<int> CmdTemplate(const CommandArgs& args, Globals& globals);
Outcome<int> CmdSnapshot(const CommandArgs& args, Globals& globals);
Outcome<int> CmdFork(const CommandArgs& args, Globals& globals);
Outcome<int> CmdKeys(const CommandArgs& args, Globals& globals);  // keys.cc
Outcome<int> CmdTenants(const CommandArgs& args, Globals& globals);  // tenants.cc
Outcome<int> CmdSecrets(const CommandArgs& args, Globals& globals);  // secrets.cc
Outcome<int> CmdEngines(const CommandArgs& args, Globals& globals);  // engines.cc
Outcome<int> CmdDoctor(const CommandArgs& args, Globals& globals);   // doctor.cc
Outcome<int> CmdAdmin(const CommandArgs& args, Globals& globals);    // admin.cc
Outcome<int> CmdLogs(const CommandArgs& args, Globals& globals);  // logs.cc
// top.cc
Outcome<int> CmdTop(const CommandArgs& args, Globals& globals);
Outcome<int> CmdMetrics(const CommandArgs& args, Globals& globals);

// Processes (processes.cc): the ps, attach and kill commands, and exec's -d and -i / -t, which
// take the exec request CmdExec built from its flags.
Outcome<int> CmdPs(const CommandArgs& args, Globals& globals);
Outcome<int> CmdAttach(const CommandArgs& args, Globals& globals);
Outcome<int> CmdKill(const CommandArgs& args, Globals& globals);
// -d: with `stdin_open` (-i) its stdin stays open, with `tty` (-t) it gets a terminal.
Outcome<int> BackgroundExec(const std::string& id, nlohmann::json request, bool stdin_open,
                            bool tty, Globals& globals);
Outcome<int> InteractiveExec(const std::string& id, nlohmann::json request, bool interactive,
                             bool tty, Globals& globals);

// Writes all of `bytes` to `fd` (retrying short writes); false if that failed.
bool WriteAll(int fd, std::string_view bytes);
void PrintText(const std::string& text);
// The one way --json output is printed: the document, pretty with 2-space indent, then "\n".
Outcome<int> PrintJson(const nlohmann::json& doc);
// A finished command's exit code from its result (or exit event): its own, 128+N for signal N,
// 124 when it timed out (as timeout(1) does). Warns on stderr when it was truncated or OOM.
Outcome<int> ExitCodeOf(const nlohmann::json& result);

}  // namespace airlock::cli
