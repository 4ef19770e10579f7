// airlock logs: a sandbox's flight recorder (docs/design/recorder.md), one line per event, or
// the events as JSON Lines; -f follows the log as it is written.

#include <string>

#include "cli/commands.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// A field as text: strings as they are, anything else as JSON; "" when absent.
std::string Text(const json& data, const char* key) {
  if (!data.is_object() || !data.contains(key) || data[key].is_null()) return "";
  const json& v = data[key];
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// An argv (or a shell line) as one would type it (CmdLogs blanks control characters).
std::string CommandLine(const json& data) {
  std::string line;
  if (data.contains("argv") && data["argv"].is_array()) {
    for (const json& arg : data["argv"]) {
      std::string a = arg.is_string() ? arg.get<std::string>() : arg.dump();
      const bool plain = !a.empty() && a.find_first_of(" \t'\"\\$`") == std::string::npos;
      line += (line.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
    }
  } else {
    line = Text(data, "cmd");
  }
  if (data.value("truncated", false) || data.value("argv_truncated", false)) line += " …";
  return line;
}

std::string Exit(const json& data) {
  if (data.contains("error")) return "error: " + Text(data, "error");
  std::string out = data.contains("signal") ? "signal " + Text(data, "signal")
                                            : "exit " + Text(data, "exit_code");
  if (data.value("timed_out", false)) out += ", timed out";
  if (data.value("oom_killed", false)) out += ", out of memory";
  return out;
}

// What one event says, after its time, seq and type.
std::string Describe(const std::string& type, const json& data) {
  if (type == "exec.start") {
    std::string out = "[" + Text(data, "command") + "] " + CommandLine(data);
    if (data.contains("pid")) out += " (pid " + Text(data, "pid") + ")";
    if (data.contains("user")) out += " as " + Text(data, "user");
    return out;
  }
  if (type == "exec.end") {
    std::string out = "[" + Text(data, "command") + "] " + Exit(data);
    if (data.contains("duration_ms")) out += " after " + Text(data, "duration_ms") + " ms";
    if (data.contains("stdout_bytes")) {
      out += ", " + Text(data, "stdout_bytes") + " B out, " + Text(data, "stderr_bytes") + " B err";
    }
    return out;
  }
  // A pid or uid the engine could not tell is absent: "?".
  const auto known = [&](const char* key) {
    const std::string text = Text(data, key);
    return text.empty() ? std::string("?") : text;
  };
  if (type == "proc.exec") {
    return "pid " + known("pid") + " (parent " + Text(data, "ppid") + ", uid " + known("uid") +
           "): " +
           (data.value("argv_lost", false) ? std::string("(gone before it was read)")
                                           : CommandLine(data));
  }
  if (type == "proc.exit") return "pid " + known("pid") + ": " + Exit(data);
  if (type.starts_with("file.") || type.starts_with("tar.")) {
    std::string out = Text(data, "path");
    if (data.contains("size")) out += " " + Text(data, "size") + " B";
    if (data.contains("sha256")) out += " sha256:" + Text(data, "sha256").substr(0, 12);
    if (data.contains("error")) out += " error: " + Text(data, "error");
    return out;
  }
  if (type.starts_with("net.")) {
    std::string out = Text(data, "name");
    if (data.contains("port")) out += ":" + Text(data, "port");
    out += " " + Text(data, "verdict");
    if (data.contains("reason")) out += " (" + Text(data, "reason") + ")";
    return out;
  }
  if (type == "process.signal") return "pid " + Text(data, "pid") + " signal " + Text(data, "signal");
  // Lifecycle and the rest: the fields as key=value.
  std::string out;
  if (data.is_object()) {
    for (const auto& [key, value] : data.items()) {
      if (key == "by") continue;
      out += (out.empty() ? "" : " ") + key + "=" +
             (value.is_string() ? value.get<std::string>()
                                : value.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    if (data.contains("by") && data["by"].is_object()) {
      out += (out.empty() ? "by key " : " by key ") + Text(data["by"], "key");
    }
  }
  return out;
}

}  // namespace

Outcome<int> CmdLogs(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kSpecs[] = {
      {"follow", false, 'f'}, {"type", true}, {"after", true}};
  auto args = Parse("logs", in, kSpecs, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("logs");
  if (args->positional.size() != 1) {
    return UsageError("logs", args->positional.empty() ? "missing the sandbox ID"
                                                       : "takes exactly one sandbox ID");
  }
  std::string query = "?format=jsonl";
  if (args->Has("follow")) query += "&follow=1";
  if (auto types = args->Last("type")) query += "&type=" + client::UrlEncode(*types);
  if (auto after = args->Last("after")) {
    auto n = ParseInteger("logs", "after", *after);
    if (!n) return std::unexpected(n.error());
    query += "&after=" + std::to_string(*n);
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  if (args->Has("follow")) api->AllowAtLeast(std::chrono::hours(24 * 365));
  std::string bad;
  auto streamed = api->CallStreamed(
      "GET", SandboxTarget(args->positional[0], "/events" + query), nullptr,
      [&](std::string_view line) {
        if (line.empty()) return true;
        if (globals.json) {
          PrintText(std::string(line) + "\n");
          return true;
        }
        const json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!event.is_object()) {
          bad = "the daemon sent an event that is not JSON";
          return false;
        }
        const std::string type = Text(event, "type");
        std::string text = Text(event, "time") + " " + Text(event, "seq") + " " + type + " " +
                           Describe(type, event.value("data", json::object()));
        // What a sandbox chose (a path, a Host header, an argv) must not drive the terminal.
        for (char& c : text) {
          const auto u = static_cast<unsigned char>(c);
          if (u < 0x20 || u == 0x7f) c = '?';
        }
        PrintText(text + "\n");
        return true;
      });
  if (!streamed) return std::unexpected(streamed.error());
  if (!bad.empty()) return CommandError(bad);
  return 0;
}

}  // namespace airlock::cli
