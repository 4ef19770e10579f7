// The process commands (docs/design/processes.md): exec -d, exec -i / -t, ps, attach, kill.

#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "cli/commands.h"
#include "cli/interactive.h"
#include "cli/table.h"
#include "daemon/api/base64.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// ID and PID, or a usage error. The pid is checked for digits only; the daemon knows the rest.
Outcome<std::pair<std::string, std::string>> IdAndPid(std::string_view command, const Args& args) {
  const std::string cmd(command);
  if (args.positional.size() != 2) {
    return UsageError(cmd, args.positional.size() < 2 ? "wants a sandbox ID and a PID"
                                                      : "takes exactly a sandbox ID and a PID");
  }
  const std::string& pid = args.positional[1];
  const bool digits = !pid.empty() && pid.size() <= 10 &&
                      std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return UsageError(cmd, "PID must be a process id (digits), got '" + pid + "'");
  return std::pair(args.positional[0], pid);
}

std::string ProcessTarget(const std::string& id, const std::string& pid, std::string_view rest) {
  return SandboxTarget(id, "/processes/" + pid + std::string(rest));
}

// A field for the table: "-" when absent or null.
std::string Cell(const json& doc, const char* key) {
  if (!doc.is_object() || !doc.contains(key) || doc[key].is_null()) return "-";
  const json& v = doc[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The command line as one table cell: control characters (a shell line's newlines, escapes)
// would break the table or the terminal. One that is not UTF-8 comes base64-encoded.
std::string CommandCell(const json& process) {
  std::string command = Cell(process, "command");
  if (process.value("command_encoding", "utf-8") == "base64") {
    auto decoded = api::Base64Decode(command);
    command = decoded ? std::move(*decoded) : "?";
  }
  for (char& c : command) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = (c == '\n' || c == '\t' || c == '\r') ? ' ' : '?';
  }
  return command;
}

std::string ExitCell(const json& process) {
  if (Cell(process, "state") != "exited") return "-";
  std::string exit = process.value("signal", json()).is_number_integer()
                         ? "signal " + Cell(process, "signal")
                         : Cell(process, "exit_code");
  if (process.value("timed_out", false)) exit += " (timed out)";
  return exit;
}

}  // namespace

Outcome<int> BackgroundExec(const std::string& id, json request, bool stdin_open, bool tty,
                            Globals& globals) {
  request["background"] = true;
  if (stdin_open) request["stdin_open"] = true;
  if (tty) {
    const WindowSize size = LocalWindowSize().value_or(WindowSize{});
    request["pty"] = {{"cols", size.cols}, {"rows", size.rows}};
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto process = api->CallJson("POST", SandboxTarget(id, "/exec"), &request);
  if (!process) return std::unexpected(process.error());
  if (globals.json) return PrintJson(*process);
  if (!process->is_object() || !(*process)["pid"].is_number_integer()) {
    return CommandError("the daemon's reply has no pid");
  }
  PrintText(std::to_string((*process)["pid"].get<int64_t>()) + "\n");
  return 0;
}

Outcome<int> InteractiveExec(const std::string& id, json request, bool interactive, bool tty,
                             Globals& globals) {
  if (tty) {
    const WindowSize size = LocalWindowSize().value_or(WindowSize{});
    request["pty"] = {{"cols", size.cols}, {"rows", size.rows}};
  }
  auto text = DumpJson(request);
  if (!text) return std::unexpected(text.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto ws = api->OpenWebSocket(SandboxTarget(id, "/exec/ws"));
  if (!ws) return std::unexpected(ws.error());
  if (auto sent = (*ws)->SendText(*text); !sent) return CommandError(sent.error().message());
  InteractiveOptions options;
  options.read_stdin = options.send_stdin = interactive;
  options.raw = interactive && tty && ::isatty(STDIN_FILENO);
  options.resize = tty;
  options.close_stdin_at_eof = true;
  auto end = RunInteractive(**ws, options);
  if (!end) return std::unexpected(end.error());
  if (end->local_signal != 0) return 128 + end->local_signal;
  if (!end->exit) return CommandError("the session ended without the command's exit");
  return ExitCodeOf(*end->exit);
}

Outcome<int> CmdPs(const CommandArgs& in, Globals& globals) {
  auto args = Parse("ps", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("ps");
  if (args->positional.size() != 1) {
    return UsageError("ps", args->positional.empty() ? "missing the sandbox ID"
                                                     : "takes exactly one sandbox ID");
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", SandboxTarget(args->positional[0], "/processes"));
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["processes"].is_array()) {
    return CommandError("the daemon's reply has no processes array");
  }
  const json& list = (*doc)["processes"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const json& p : list) {
    rows.push_back(
        {Cell(p, "pid"), Cell(p, "state"), Cell(p, "started_at"), ExitCell(p), CommandCell(p)});
  }
  PrintText(FormatTable({"PID", "STATE", "STARTED", "EXIT", "COMMAND"}, rows));
  return 0;
}

Outcome<int> CmdKill(const CommandArgs& in, Globals& globals) {
  static const std::vector<FlagSpec> kFlags = {{"signal", true, 's'}};
  auto args = Parse("kill", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("kill");
  auto where = IdAndPid("kill", *args);
  if (!where) return std::unexpected(where.error());
  const std::string signal = args->Last("signal").value_or("TERM");
  json request;
  int number = 0;
  auto [end, ec] = std::from_chars(signal.data(), signal.data() + signal.size(), number);
  if (!signal.empty() && ec == std::errc() && end == signal.data() + signal.size()) {
    request["signal"] = number;  // the daemon checks the range
  } else {
    request["signal"] = signal;
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto process =
      api->CallJson("POST", ProcessTarget(where->first, where->second, "/signal"), &request);
  if (!process) return std::unexpected(process.error());
  if (globals.json) return PrintJson(*process);
  return 0;
}

Outcome<int> CmdAttach(const CommandArgs& in, Globals& globals) {
  static const std::vector<FlagSpec> kFlags = {{"no-replay", false}};
  auto args = Parse("attach", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("attach");
  if (globals.json) return UsageError("attach", "--json does not apply to attach");
  auto where = IdAndPid("attach", *args);
  if (!where) return std::unexpected(where.error());
  const auto& [id, pid] = *where;
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  // Whether it has a terminal and takes input decides how this one is set up.
  auto process = api->CallJson("GET", ProcessTarget(id, pid, ""));
  if (!process) return std::unexpected(process.error());
  const bool pty = process->value("pty", false);
  const bool stdin_open = process->value("stdin_open", false);
  auto ws = api->OpenWebSocket(
      ProcessTarget(id, pid, args->Has("no-replay") ? "/ws?replay=false" : "/ws"));
  if (!ws) return std::unexpected(ws.error());
  InteractiveOptions options;
  options.read_stdin = true;  // for the detach key, even when the process takes no input
  options.send_stdin = stdin_open;
  options.raw = pty && ::isatty(STDIN_FILENO);
  options.resize = pty && LocalWindowSize().has_value();
  options.resize_at_start = options.resize;
  options.detach_key = true;
  options.signals_detach = true;
  auto end = RunInteractive(**ws, options);
  if (!end) return std::unexpected(end.error());
  if (end->exit) return ExitCodeOf(*end->exit);
  // Detached: the process runs on.
  return end->local_signal != 0 ? 128 + end->local_signal : 0;
}

}  // namespace airlock::cli
