#include "cli/commands.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/args.h"
#include "cli/table.h"
#include "common/build_id.h"
#include "daemon/api/base64.h"
#include "daemon/api/utf8.h"

namespace airlock::cli {

using nlohmann::json;

bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

Outcome<Args> Parse(std::string_view command, const CommandArgs& args,
                    std::span<const FlagSpec> specs, Globals& globals,
                    std::optional<size_t> tail_after) {
  auto parsed = ParseArgs(command, args, specs, tail_after);
  if (!parsed) return parsed;
  if (auto url = parsed->Last("url")) globals.url = *url;
  if (auto key = parsed->Last("api-key")) globals.api_key = *key;
  if (parsed->Has("json")) globals.json = true;
  return parsed;
}

int PrintUsage(std::string_view command) {
  const Command* cmd = FindCommand(command);
  std::fputs(std::string(cmd->usage).c_str(), stdout);
  return 0;
}

void PrintText(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

Outcome<int> PrintJson(const json& doc) {
  auto text = DumpJson(doc, 2);
  if (!text) return std::unexpected(text.error());
  PrintText(*text + "\n");
  return 0;
}

Outcome<int> ExitCodeOf(const json& result) {
  if (!result.is_object()) return CommandError("the daemon's exec reply is not an object");
  auto flag = [&](const char* key) {
    return result.value(key, json()).is_boolean() && result[key];
  };
  if (flag("truncated")) {
    std::fprintf(stderr, "airlock: warning: the output was truncated at the daemon's cap\n");
  }
  if (flag("oom_killed")) std::fprintf(stderr, "airlock: the command was killed for memory\n");
  if (flag("timed_out")) return 124;
  if (result.contains("signal") && result["signal"].is_number_integer()) {
    return 128 + result["signal"].get<int>();
  }
  if (result.contains("exit_code") && result["exit_code"].is_number_integer()) {
    return result["exit_code"].get<int>();
  }
  return CommandError("the daemon's exec reply has neither exit_code nor signal");
}

namespace {

// ---- shared helpers -------------------------------------------------------------------------

Outcome<std::string> SandboxIdOf(const json& sandbox) {
  std::string id = Text(sandbox, "id");
  if (id.empty()) return CommandError("the daemon's reply has no sandbox id");
  return id;
}

Outcome<std::string> ReadAllStdin() {
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return CommandError("reading stdin: " + std::string(strerror(errno)));
    if (n == 0) return data;
    data.append(buf, static_cast<size_t>(n));
  }
}

// ---- create / run: the sandbox request -------------------------------------------------------

const std::vector<FlagSpec> kCreateFlags = {
    {"template", true}, {"ttl", true},  {"cpus", true}, {"memory", true},
    {"pids", true},     {"disk", true}, {"env", true},  {"meta", true},
    {"network", true},  {"allow", true}, {"deny", true}, {"engine", true},
    {"auto-hibernate", true}, {"auto-pause", true}, {"secret", true},
};

const std::vector<FlagSpec> kExecFlags = {
    {"timeout", true}, {"cwd", true}, {"env", true}, {"user", true}, {"stdin", false},
};
// exec only (run has no use for them).
const std::vector<FlagSpec> kExecOnlyFlags = {
    {"interactive", false, 'i'},
    {"tty", false, 't'},
    {"detach", false, 'd'},
};

// The CreateSandboxRequest for the create flags in `args`; run sends --env with the exec instead.
Outcome<json> CreateRequest(std::string_view command, const Args& args, bool with_env) {
  json req = json::object();
  if (auto v = args.Last("template")) req["template"] = *v;
  if (auto v = args.Last("engine")) req["engine"] = *v;
  struct IntFlag {
    const char* flag;
    const char* field;
  };
  for (const IntFlag& f : {IntFlag{"ttl", "ttl_seconds"}, IntFlag{"memory", "memory_mb"},
                           IntFlag{"pids", "pids_max"}, IntFlag{"disk", "disk_mb"},
                           IntFlag{"auto-hibernate", "auto_hibernate_seconds"}}) {
    if (auto v = args.Last(f.flag)) {
      auto n = ParseInteger(command, f.flag, *v);
      if (!n) return std::unexpected(n.error());
      req[f.field] = *n;
    }
  }
  if (auto v = args.Last("auto-pause")) {
    auto n = ParseInteger(command, "auto-pause", *v);
    if (!n) return std::unexpected(n.error());
    req["auto_pause"] = {{"idle_seconds", *n}};
  }
  if (auto v = args.Last("cpus")) {
    auto n = ParseNumber(command, "cpus", *v);
    if (!n) return std::unexpected(n.error());
    req["cpus"] = *n;
  }
  for (const char* flag : {"env", "meta"}) {
    if (std::string_view(flag) == "env" && !with_env) continue;
    json map = json::object();
    for (const auto& kv : args.All(flag)) {
      auto pair = ParseKeyValue(command, flag, kv);
      if (!pair) return std::unexpected(pair.error());
      map[pair->first] = pair->second;
    }
    if (!map.empty()) req[std::string_view(flag) == "env" ? "env" : "metadata"] = map;
  }
  // --network MODE [--allow RULE]... [--deny RULE]...; rules alone mean allowlist.
  const auto allow = args.All("allow"), deny = args.All("deny");
  if (auto mode = args.Last("network"); mode || !allow.empty() || !deny.empty()) {
    req["network"] = {{"mode", mode ? *mode : "allowlist"}, {"allow", allow}, {"deny", deny}};
  }
  // --secret NAME@HOST[,HOST]...: the secret bound to those hosts, its placeholder in $NAME.
  for (const std::string& binding : args.All("secret")) {
    const size_t at = binding.find('@');
    if (at == 0 || at == std::string::npos || at + 1 == binding.size()) {
      return UsageError(std::string(command), "--secret wants NAME@HOST[,HOST]..., got \"" +
                                                  binding + "\"");
    }
    json hosts = json::array();
    std::istringstream list(binding.substr(at + 1));
    for (std::string host; std::getline(list, host, ',');) hosts.push_back(host);
    const std::string name = binding.substr(0, at);
    req["secrets"].push_back({{"name", name}, {"hosts", hosts}, {"env", name}});
  }
  return req;
}

// The ExecRequest for the exec flags in `args` and the command `argv`. Reads stdin for --stdin.
Outcome<json> ExecRequest(std::string_view command, const Args& args,
                          const std::vector<std::string>& argv) {
  if (argv.empty()) return UsageError(std::string(command), "no command to run");
  json req = {{"argv", argv}};
  if (auto v = args.Last("cwd")) req["cwd"] = *v;
  if (auto v = args.Last("user")) req["user"] = *v;
  if (auto v = args.Last("timeout")) {
    auto n = ParseNumber(command, "timeout", *v);
    if (!n) return std::unexpected(n.error());
    req["timeout_seconds"] = *n;
  }
  json env = json::object();
  for (const auto& kv : args.All("env")) {
    auto pair = ParseKeyValue(command, "env", kv);
    if (!pair) return std::unexpected(pair.error());
    env[pair->first] = pair->second;
  }
  if (!env.empty()) req["env"] = env;
  if (args.Has("stdin")) {
    auto data = ReadAllStdin();
    if (!data) return std::unexpected(data.error());
    if (api::IsValidUtf8(*data)) {
      req["stdin"] = *data;
    } else {
      req["stdin"] = api::Base64Encode(*data);
      req["stdin_encoding"] = "base64";
    }
  }
  return req;
}

// The daemon's HTTP deadline for an exec: the command's own timeout and a minute to spare.
std::chrono::milliseconds ExecDeadline(const json& req) {
  const double seconds =
      req.contains("timeout_seconds") ? req["timeout_seconds"].get<double>() : 300.0;
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)) + std::chrono::minutes(1);
}

Outcome<std::string> DecodeOutput(const json& result, const char* field) {
  std::string data = Text(result, field);
  if (Text(result, (std::string(field) + "_encoding").c_str()) != "base64") return data;
  auto decoded = api::Base64Decode(data);
  if (!decoded) return CommandError(std::string("the daemon sent bad base64 in ") + field);
  return *decoded;
}

// Writes the command's output (or the result document with --json) and returns its exit code
// (ExitCodeOf).
Outcome<int> EmitExecResult(const json& result, bool json_mode) {
  if (!result.is_object()) return CommandError("the daemon's exec reply is not an object");
  if (json_mode) {
    if (auto printed = PrintJson(result); !printed) return printed;
  } else {
    auto out = DecodeOutput(result, "stdout");
    if (!out) return std::unexpected(out.error());
    auto err = DecodeOutput(result, "stderr");
    if (!err) return std::unexpected(err.error());
    std::fflush(stdout);
    WriteAll(STDOUT_FILENO, *out);
    WriteAll(STDERR_FILENO, *err);
  }
  return ExitCodeOf(result);
}

// Runs the exec request with "stream": true, writing the command's output to our stdout and
// stderr as it arrives. Returns the "exit" event (the result without its output), ready for
// EmitExecResult; an "error" event is a Failure like a refused plain exec.
Outcome<json> StreamExec(Api& api, const std::string& target, json req) {
  req["stream"] = true;
  std::optional<json> exit;
  std::optional<Failure> failure;
  auto streamed = api.CallStreamed("POST", target, &req, [&](std::string_view line) {
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string type = Text(event, "type");
    if (type == "stdout" || type == "stderr") {
      auto data = DecodeOutput(event, "data");
      if (!data) {
        failure = data.error();
        return false;
      }
      if (type == "stdout") {
        std::fflush(stdout);
        WriteAll(STDOUT_FILENO, *data);
      } else {
        WriteAll(STDERR_FILENO, *data);
      }
    } else if (type == "exit") {
      exit = std::move(event);
      return false;
    } else if (type == "error") {
      const json& err = event.value("error", json::object());
      failure = Failure{kExitFailure, Text(err, "code") + ": " + Text(err, "message")};
      return false;
    } else if (event.is_discarded()) {
      failure = Failure{kExitFailure, "the daemon sent a stream line that is not JSON"};
      return false;
    }
    return true;  // "start", and event types this CLI does not know yet
  });
  if (!streamed) return std::unexpected(streamed.error());
  if (failure) return std::unexpected(*failure);
  if (!exit) return CommandError("the daemon's exec stream ended without an exit event");
  return *exit;
}

// A command's result: streamed to the terminal for people, one document for --json.
Outcome<json> RunExec(Api& api, const std::string& target, const json& req, bool json_mode) {
  if (json_mode) return api.CallJson("POST", target, &req);
  return StreamExec(api, target, req);
}

// ---- the commands ------------------------------------------------------------------------------

Outcome<int> CmdCreate(const CommandArgs& in, Globals& globals) {
  auto args = Parse("create", in, kCreateFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("create");
  if (!args->positional.empty()) {
    return UsageError("create", "unexpected argument '" + args->positional[0] + "'");
  }
  auto req = CreateRequest("create", *args, /*with_env=*/true);
  if (!req) return std::unexpected(req.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto sandbox = api->CallJson("POST", "/v1/sandboxes", &*req);
  if (!sandbox) return std::unexpected(sandbox.error());
  if (globals.json) return PrintJson(*sandbox);
  auto id = SandboxIdOf(*sandbox);
  if (!id) return std::unexpected(id.error());
  PrintText(*id + "\n");
  return 0;
}

Outcome<int> CmdLs(const CommandArgs& in, Globals& globals) {
  static const std::vector<FlagSpec> kFlags = {{"state", true}, {"meta", true}};
  auto args = Parse("ls", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("ls");
  if (!args->positional.empty()) {
    return UsageError("ls", "unexpected argument '" + args->positional[0] + "'");
  }
  std::string query;
  auto add = [&](const std::string& key, const std::string& value) {
    query += (query.empty() ? "?" : "&") + key + "=" + client::UrlEncode(value);
  };
  if (auto state = args->Last("state")) add("state", *state);
  for (const auto& kv : args->All("meta")) {
    auto pair = ParseKeyValue("ls", "meta", kv);
    if (!pair) return std::unexpected(pair.error());
    add("metadata." + client::UrlEncode(pair->first), pair->second);
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/sandboxes" + query);
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["sandboxes"].is_array()) {
    return CommandError("the daemon's list reply has no sandboxes array");
  }
  const json& list = (*doc)["sandboxes"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : list) {
    rows.push_back({Text(s, "id"), Text(s, "state"), Text(s, "template"), Text(s, "created_at"),
                    Text(s, "expires_at")});
  }
  PrintText(FormatTable({"ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES"}, rows));
  return 0;
}

// One "key: value" pair per leaf; nested objects as "limits.cpus".
void Flatten(const std::string& prefix, const json& doc,
             std::vector<std::pair<std::string, std::string>>* out) {
  for (const auto& [key, value] : doc.items()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      Flatten(name, value, out);
    } else {
      out->emplace_back(name, value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
}

// The one sandbox id a command takes, or a usage error.
Outcome<std::string> OneId(std::string_view command, const Args& args) {
  if (args.positional.size() != 1) {
    return UsageError(std::string(command), args.positional.empty()
                                                ? "missing the sandbox ID"
                                                : "takes exactly one sandbox ID");
  }
  return args.positional[0];
}

Outcome<int> CmdInspect(const CommandArgs& in, Globals& globals) {
  auto args = Parse("inspect", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("inspect");
  auto id = OneId("inspect", *args);
  if (!id) return std::unexpected(id.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto sandbox = api->CallJson("GET", SandboxTarget(*id));
  if (!sandbox) return std::unexpected(sandbox.error());
  if (globals.json) return PrintJson(*sandbox);
  // The identity first, then the rest as the daemon named it.
  std::vector<std::pair<std::string, std::string>> pairs;
  json rest = *sandbox;
  for (const char* key : {"id", "state", "template", "engine", "created_at", "expires_at"}) {
    if (!rest.contains(key)) continue;
    Flatten("", json{{key, rest[key]}}, &pairs);
    rest.erase(key);
  }
  Flatten("", rest, &pairs);
  PrintText(FormatKeyValues(pairs));
  return 0;
}

Outcome<int> CmdExec(const CommandArgs& in, Globals& globals) {
  std::vector<FlagSpec> flags = kExecFlags;
  flags.insert(flags.end(), kExecOnlyFlags.begin(), kExecOnlyFlags.end());
  auto args = Parse("exec", in, flags, globals, /*tail_after=*/1);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("exec");
  auto id = OneId("exec", *args);
  if (!id) return std::unexpected(id.error());
  const bool interactive = args->Has("interactive"), tty = args->Has("tty");
  const bool detach = args->Has("detach");
  if (!detach && (interactive || tty) && args->Has("stdin")) {
    return UsageError("exec", "--stdin sends stdin all at once: not with -i or -t");
  }
  if (!detach && (interactive || tty) && globals.json) {
    return UsageError("exec", "--json does not apply to an interactive session (-i, -t)");
  }
  auto req = ExecRequest("exec", *args, args->tail);
  if (!req) return std::unexpected(req.error());
  if (detach) return BackgroundExec(*id, *req, interactive, tty, globals);
  if (interactive || tty) return InteractiveExec(*id, *req, interactive, tty, globals);
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  api->AllowAtLeast(ExecDeadline(*req));
  auto result = RunExec(*api, SandboxTarget(*id, "/exec"), *req, globals.json);
  if (!result) return std::unexpected(result.error());
  return EmitExecResult(*result, globals.json);
}

// run's sandbox and who deletes it: the main thread when the command ends, or the signal thread
// on SIGINT / SIGTERM / SIGHUP. Shared with a detached thread, so never freed.
struct RunState {
  std::mutex mu;
  std::string id;         // set once the create came back
  bool deleting = false;  // someone has taken the delete
  int signo = 0;          // the first signal seen
  Globals globals;
};

void DeleteOnSignal(std::shared_ptr<RunState> state, sigset_t set) {
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    std::string victim;
    {
      std::lock_guard lock(state->mu);
      if (state->signo == 0) state->signo = sig;
      if (!state->id.empty() && !state->deleting) {
        state->deleting = true;
        victim = state->id;
      }
    }
    // With no id yet, the create is in flight and the main thread deletes when it returns.
    if (victim.empty()) continue;
    auto api = Api::Connect(state->globals);
    Outcome<Reply> deleted =
        api ? api->Call("DELETE", SandboxTarget(victim)) : std::unexpected(api.error());
    if (deleted) {
      std::fprintf(stderr, "airlock: interrupted; deleted sandbox %s\n", victim.c_str());
    } else {
      std::fprintf(stderr, "airlock: interrupted; deleting sandbox %s: %s\n", victim.c_str(),
                   deleted.error().message.c_str());
    }
    std::fflush(stdout);
    ::_exit(128 + sig);
  }
}

Outcome<int> CmdRun(const CommandArgs& in, Globals& globals) {
  std::vector<FlagSpec> flags = kCreateFlags;
  for (const auto& f : kExecFlags) {
    if (f.name != "env") flags.push_back(f);
  }
  auto args = Parse("run", in, flags, globals, /*tail_after=*/0);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("run");
  auto create = CreateRequest("run", *args, /*with_env=*/false);
  if (!create) return std::unexpected(create.error());
  auto exec = ExecRequest("run", *args, args->tail);
  if (!exec) return std::unexpected(exec.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  api->AllowAtLeast(ExecDeadline(*exec));

  // From here the signals that end a terminal session go to one thread, which deletes.
  auto state = std::make_shared<RunState>();
  state->globals = globals;
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(DeleteOnSignal, state, set).detach();

  auto sandbox = api->CallJson("POST", "/v1/sandboxes", &*create);
  if (!sandbox) return std::unexpected(sandbox.error());
  auto id = SandboxIdOf(*sandbox);
  if (!id) return std::unexpected(id.error());
  int interrupted = 0;
  {
    std::lock_guard lock(state->mu);
    state->id = *id;
    if (state->signo != 0) {
      state->deleting = true;
      interrupted = state->signo;
    }
  }
  auto delete_sandbox = [&]() -> bool {
    auto deleted = api->Call("DELETE", SandboxTarget(*id));
    if (!deleted) {
      std::fprintf(stderr, "airlock: deleting sandbox %s: %s\n", id->c_str(),
                   deleted.error().message.c_str());
    }
    return static_cast<bool>(deleted);
  };
  if (interrupted != 0) {
    delete_sandbox();
    std::fprintf(stderr, "airlock: interrupted; deleted sandbox %s\n", id->c_str());
    return 128 + interrupted;
  }

  auto result = RunExec(*api, SandboxTarget(*id, "/exec"), *exec, globals.json);
  {
    std::unique_lock lock(state->mu);
    if (state->deleting) {  // the signal thread is deleting the sandbox and will exit
      lock.unlock();
      for (;;) ::pause();
    }
    state->deleting = true;
  }
  Outcome<int> code =
      result ? EmitExecResult(*result, globals.json) : std::unexpected(result.error());
  std::fflush(stdout);
  if (!delete_sandbox() && code) return kExitFailure;
  return code;
}

Outcome<int> CmdRm(const CommandArgs& in, Globals& globals) {
  auto args = Parse("rm", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("rm");
  if (args->positional.empty()) return UsageError("rm", "missing the sandbox ID");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  json deleted = json::array();
  bool failed = false;
  for (const auto& id : args->positional) {
    auto reply = api->Call("DELETE", SandboxTarget(id));
    if (!reply) {
      std::fprintf(stderr, "airlock: %s\n", reply.error().message.c_str());
      failed = true;
      continue;
    }
    deleted.push_back(id);
    if (!globals.json) PrintText(id + "\n");
  }
  if (globals.json) {
    if (auto printed = PrintJson(deleted); !printed) return printed;
  }
  return failed ? kExitFailure : 0;
}

Outcome<int> PauseOrResume(std::string_view command, const CommandArgs& in, Globals& globals) {
  const bool pause = command == "pause";
  auto args = Parse(command, in,
                    pause ? std::vector<FlagSpec>{{"memory", false}} : std::vector<FlagSpec>{},
                    globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage(command);
  auto id = OneId(command, *args);
  if (!id) return std::unexpected(id.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  const json body = {{"memory", true}};
  auto sandbox = api->CallJson("POST", SandboxTarget(*id, "/" + std::string(command)),
                               pause && args->Has("memory") ? &body : nullptr);
  if (!sandbox) return std::unexpected(sandbox.error());
  if (globals.json) return PrintJson(*sandbox);
  PrintText(*id + " " + Text(*sandbox, "state") + "\n");
  return 0;
}

Outcome<int> CmdPause(const CommandArgs& in, Globals& globals) {
  return PauseOrResume("pause", in, globals);
}
Outcome<int> CmdResume(const CommandArgs& in, Globals& globals) {
  return PauseOrResume("resume", in, globals);
}

Outcome<int> CmdVersion(const CommandArgs& in, Globals& globals) {
  auto args = Parse("version", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("version");
  if (globals.json) return PrintJson({{"version", kBuildId}});
  PrintText(std::string("airlock ") + kBuildId + "\n");
  return 0;
}

Outcome<int> CmdHelp(const CommandArgs& in, Globals& globals) {
  auto args = Parse("help", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->positional.empty() || args->help) {
    PrintText(TopLevelHelp());
    return 0;
  }
  if (FindCommand(args->positional[0]) == nullptr) {
    return UsageError("", "unknown command '" + args->positional[0] + "'");
  }
  return PrintUsage(args->positional[0]);
}

// ---- help texts ----------------------------------------------------------------------------

constexpr std::string_view kCreateUsage = R"(usage: airlock create [flags]

Creates a sandbox and prints its id (with --json, the sandbox object).

  --template T      the template (default: base)
  --engine E        the isolation engine (default: the template's, else the daemon's; see
                    airlock engines)
  --ttl SECONDS     destroy it this long after creation (default: 3600)
  --cpus N          CPU quota in cores, fractions allowed (default: 1)
  --memory MB       memory cap in MiB (default: 512)
  --pids N          processes and threads (default: 256)
  --disk MB         writable layer in MiB (default: 1024)
  --env K=V         an environment variable for every command (repeatable)
  --meta K=V        a metadata label (repeatable)
  --network MODE    none (default), allowlist or open
  --allow RULE      a name, *.suffix or CIDR it may reach, with :port if you like
                    (repeatable; alone, it means --network allowlist)
  --deny RULE       a name or CIDR it may never reach (repeatable)
  --auto-hibernate SECONDS
                    hibernate it after this long without a call that uses it (engines with
                    memory_checkpoint)
  --auto-pause SECONDS
                    freeze it after this long without a call that uses it and with no
                    command running (engines with pause); the next exec, file or process
                    call resumes it
  --secret NAME@HOST[,HOST]...
                    bind secret NAME (airlock secrets create) to those hosts: $NAME holds a
                    placeholder, the egress proxy puts the value in on HTTPS requests to them
                    (repeatable; needs --allow for each host)
)";

constexpr std::string_view kLsUsage = R"(usage: airlock ls [--state S] [--meta K=V]...

Lists sandboxes: ID STATE TEMPLATE CREATED EXPIRES (with --json, the array of sandbox objects).

  --state S         only sandboxes in state S (creating, running, paused, ...)
  --meta K=V        only sandboxes labelled K=V (repeatable; every label must match)
)";

constexpr std::string_view kInspectUsage = R"(usage: airlock inspect ID

Prints one sandbox as "key: value" lines (with --json, the sandbox object).
)";

constexpr std::string_view kExecUsage = R"(usage: airlock exec [flags] ID [--] CMD [ARG...]

Runs CMD in sandbox ID, writes its stdout and stderr as they are, and exits with its exit code
(128+N if signal N killed it, 124 if it timed out). With --json, prints the result object.

  --timeout S       kill the command and everything it started after S seconds (default: 300;
                    with -i or -t, a day; with -d, none)
  --cwd DIR         working directory inside the sandbox
  --env K=V         an environment variable (repeatable)
  --user U          run as user U (a name or uid from the sandbox's /etc/passwd)
  --stdin           send all of this program's stdin to the command
  -i, --interactive send this program's stdin to the command as it comes (over a WebSocket);
                    at its end the command's stdin is closed; Ctrl-C sends it SIGINT
  -t, --tty         run the command on a terminal the size of this one (following resizes);
                    with -i and a terminal here, this one is in raw mode until the command ends
  -d, --detach      start the command in the background and print its pid (with --json, the
                    process object); with -i its stdin stays open, with -t it runs on a
                    terminal, for airlock attach later (see also airlock ps, kill)
)";

constexpr std::string_view kRunUsage =
    R"(usage: airlock run [create flags] [exec flags] [--] CMD [ARG...]

Creates a sandbox, runs CMD in it as exec does, and deletes the sandbox: when the command ends,
when something fails, and on SIGINT, SIGTERM or SIGHUP. Exits with the command's exit code.

create flags: --template --engine --ttl --cpus --memory --pids --disk --meta --network --allow
              --deny --secret (see airlock create --help)
exec flags:   --timeout --cwd --env --user --stdin (see airlock exec --help)
)";

constexpr std::string_view kCpUsage = R"(usage: airlock cp SRC DST

Copies a file or a directory tree between this machine and a sandbox. Exactly one of SRC and
DST is ID:PATH (a local path with a ':' in it can be written ./a:b).

  airlock cp ./notes.txt sbx-abc:/tmp/notes.txt     upload a file
  airlock cp ./src sbx-abc:/work/src                upload a directory tree
  airlock cp sbx-abc:/work/out ./out                download a directory tree

As with cp -r: if DST is an existing directory, SRC is copied into it under its own name;
otherwise DST becomes the copy. Directories travel as tar streams made and unpacked by the
system tar.
)";

constexpr std::string_view kPsUsage = R"(usage: airlock ps ID

Lists the processes of sandbox ID: the running ones, then the background ones that ended
(the last 64). Columns: PID STATE STARTED EXIT COMMAND. With --json, the array of process
objects.
)";

constexpr std::string_view kLogsUsage = R"(usage: airlock logs [-f] [--type TYPES] [--after SEQ] ID

Shows the flight recorder of sandbox ID, oldest first, one line per event: its time, its
number, its type and what happened (docs/design/recorder.md). A destroyed sandbox's log stays
readable until the daemon purges its record (destroyed_keep).

  -f, --follow     keep showing events as they are recorded, until the sandbox is destroyed
  --type TYPES     only these types, comma-separated; a prefix before a dot takes them all
                   (exec = exec.start,exec.end; sandbox, exec, process, file, tar, net, proc)
  --after SEQ      only events numbered after SEQ

With --json, each event is printed as one JSON object per line (JSON Lines):
{"seq", "time", "type", "data"}.
)";

constexpr std::string_view kAttachUsage = R"(usage: airlock attach [--no-replay] ID PID

Attaches to process PID of sandbox ID (see airlock ps): shows the output it still holds, then
its output as it comes, and exits with its exit code when it ends (128+N for signal N, 124 if
it timed out). Input goes to the process when its stdin is open; a process on a terminal gets
this terminal in raw mode.

Ctrl-] detaches, and so does Ctrl-C when the process has no terminal: the process runs on and
this exits 0 (128+N after signal N: SIGTERM and SIGHUP detach too). When this program's stdin
ends, input just stops; the process's stdin stays open.

  --no-replay       skip the output from before the attach
)";

constexpr std::string_view kKillUsage = R"(usage: airlock kill [-s SIG] ID PID

Sends signal SIG to process PID of sandbox ID (its process group). Prints nothing; with --json,
the process object after.

  -s, --signal SIG  a name (TERM, SIGKILL, int) or a number 1-64 (default: TERM)
)";

constexpr std::string_view kRmUsage = R"(usage: airlock rm ID...

Deletes each sandbox and prints its id (with --json, the array of deleted ids). Each failure is
reported on its own line; the exit code is 1 if any failed.
)";

constexpr std::string_view kPauseUsage = R"(usage: airlock pause [--memory] ID

Freezes every process in the sandbox (memory is kept in place).

  --memory          hibernate it instead: its processes and memory are saved to disk and
                    nothing of it runs until resume (engines with memory_checkpoint: gVisor)
)";

constexpr std::string_view kResumeUsage = R"(usage: airlock resume ID

Thaws a paused sandbox, or restores a hibernated one where it was.
)";

constexpr std::string_view kVersionUsage = R"(usage: airlock version

Prints the CLI's version and build.
)";

constexpr std::string_view kHelpUsage = R"(usage: airlock help [COMMAND]
)";

constexpr std::string_view kTemplateUsage = R"(usage: airlock template build [-f FILE] [--name NAME]
       airlock template ls
       airlock template rm NAME...

build: builds the template FILE describes (default airlock.toml), showing each step and its
output as it runs, and prints its name. The file has the fields of POST /v1/templates:

    name = "app"
    base = "base"                  # or another template
    workdir = "/opt/app"
    start_cmd = "python3 -m http.server 8000"
    ready_cmd = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000\")'"
    memory_mb = 1024
    [env]
    MODE = "production"
    [network]                      # the build's own network, not the template's
    mode = "allowlist"
    allow = ["pypi.org", "files.pythonhosted.org"]
    [[steps]]
    run = "mkdir -p /opt/app"
    [[steps]]
    copy = { src = "app/", path = "/opt/app" }   # a file or a directory, relative to FILE

Steps run as root unless they say user = "user". ls lists the templates; rm deletes them (a
template in use by a sandbox is refused).
)";

constexpr std::string_view kSnapshotUsage = R"(usage: airlock snapshot ID NAME

Makes template NAME from what sandbox ID wrote to its file system (not /tmp, not its
processes); the sandbox goes on. Prints NAME.
)";

constexpr std::string_view kKeysUsage = R"(usage: airlock keys create NAME --tenant TENANT [--admin]
       airlock keys list
       airlock keys revoke ID...

API keys; an admin key is needed for all three. create makes a key for TENANT (with --admin
it acts on every tenant's sandboxes and may manage keys and pools) and prints the key, which
is not shown again. list shows every key (never the key itself). revoke makes each key ID
refuse from its next call on; the last admin key cannot be revoked.
)";

constexpr std::string_view kTenantsUsage = R"(usage: airlock tenants quota NAME [--sandboxes N] [--cpus X] [--memory MB] [--disk MB]
                              [--creates-per-minute N]
       airlock tenants quota NAME --remove
       airlock tenants show NAME

Tenant quotas (docs/design/tenancy.md). quota sets tenant NAME's whole quota (admin key): a
flag not given, or 0, is unlimited; --remove takes it away. A create, fork or pool claim over it,
or a live limit increase, is refused (429) with what is used and what is allowed. show prints
the quota beside what the tenant's sandboxes use (an admin key for any tenant, another key for
its own).
)";

constexpr std::string_view kSecretsUsage = R"(usage: airlock secrets create NAME < value
       airlock secrets update NAME < value
       airlock secrets ls
       airlock secrets rm NAME...

Secrets: named values (tokens, passwords) the daemon keeps sealed for your tenant, for the
egress proxy to put into the requests sandboxes make; a value never enters a sandbox and is
never shown again. create stores NAME (letters, digits and '_'; 409 if it exists); update
rotates it (its version goes up by one). Both read the value from stdin, never from the
command line (which other users can see): piped, without its trailing newline; from a
terminal, typed at a prompt without echo. ls lists NAME VERSION CREATED UPDATED; rm deletes.
--tenant TENANT, with any of them: an admin key acting on another tenant's secrets.
)";

constexpr std::string_view kEnginesUsage = R"(usage: airlock engines

Lists the daemon's isolation engines: NAME AVAILABLE DEFAULT and what each can do, or why it
cannot run here (with --json, the engines array as GET /v1/engines gives it).
)";

constexpr std::string_view kAdminUsage = R"(usage: airlock admin backup FILE

backup FILE   an online, consistent copy of the daemon's store (GET /v1/admin/backup, an admin
              key only), written to FILE (mode 0600) whole or not at all; "-" is stdout. The
              daemon serves on meanwhile. It holds the records, templates' entries, API keys
              (hashed), tenants and quotas, and the secrets sealed: keep the state dir's
              secrets.key apart from it, safely. How to restore: docs/install.md, "Backups".
)";

constexpr std::string_view kDoctorUsage =
    R"(usage: airlock doctor [--config FILE] [--state-dir DIR] [--airlockd PATH]

Checks this host as airlockd sees it at start, by running `airlockd --doctor` (found beside
airlock, in ../libexec/airlock/, or given with --airlockd): the kernel, cgroups and their
delegation, user namespaces (and AppArmor or SELinux on them), overlayfs, seccomp, nftables,
iproute2, ip_forward for open mode, runsc, /dev/kvm, the state dir's free space and inodes, and
every engine built and probed. Then asks the daemon (--url) whether it is up, its version, and
whether GET /v1/engines agrees. Each finding is ok, info, warn or fail, with what to do.

  --config FILE     the daemon's config (default /etc/airlock/airlockd.toml when it exists)
  --state-dir DIR   the daemon's state dir, when not the config's

Exits 0 when airlockd can run its default engine here, 1 when a check fails. With --json, the
findings as a document: {"ready", "default_engine", "findings": [{check, verdict, detail, fix}],
"engines"}. See docs/doctor.md.
)";

constexpr std::string_view kTopUsage = R"(usage: airlock top [--once] [--interval SECONDS]

Shows what every sandbox the key can see uses, from the daemon's newest sample of each (taken
every metrics_interval_ms, 5 s by default): ID STATE ENGINE, CPU% (of one core, since the
sample before), CPU-S (CPU seconds used), MEM and PEAK (memory), PIDS, DISK (its writable
layer), NET-IN and NET-OUT (bytes through its network). Redraws every --interval seconds (2 by
default) until interrupted; --once (or output that is not a terminal) prints one table and exits.
)";

constexpr std::string_view kMetricsUsage =
    R"(usage: airlock metrics [--start MS] [--end MS] [--limit N] ID

Prints sandbox ID's samples, oldest first: AT_MS and the columns of airlock top. --start and
--end bound them (unix milliseconds); --limit N keeps the newest N (default 1000). With --json,
the daemon's reply (GET /v1/sandboxes/{id}/metrics). A destroyed sandbox's stay readable until
its record is purged (destroyed_keep).
)";

constexpr std::string_view kForkUsage = R"(usage: airlock fork [-n COUNT] [--memory] ID

Makes COUNT (default 1, at most 32) new sandboxes that start with a copy of sandbox ID's file
system, and prints their ids, one per line. Processes and memory are not carried, unless:

  --memory          each fork goes on from ID's processes and memory as well (engines with
                    memory_fork: gVisor, for a sandbox without a network); ID runs on
)";

}  // namespace

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"create", "create a sandbox and print its id", kCreateUsage, CmdCreate},
      {"ls", "list sandboxes", kLsUsage, CmdLs},
      {"inspect", "show one sandbox", kInspectUsage, CmdInspect},
      {"exec", "run a command in a sandbox", kExecUsage, CmdExec},
      {"run", "create a sandbox, run a command in it, delete it", kRunUsage, CmdRun},
      {"cp", "copy files and directories to or from a sandbox", kCpUsage, CmdCp},
      {"ps", "list the processes in a sandbox", kPsUsage, CmdPs},
      {"attach", "attach to a process: its output, and input to it", kAttachUsage, CmdAttach},
      {"kill", "send a signal to a process", kKillUsage, CmdKill},
      {"logs", "show what a sandbox did: its flight recorder (-f follows)", kLogsUsage, CmdLogs},
      {"rm", "delete sandboxes", kRmUsage, CmdRm},
      {"pause", "freeze a sandbox, or hibernate it (--memory)", kPauseUsage, CmdPause},
      {"template", "build, list and delete templates", kTemplateUsage, CmdTemplate},
      {"snapshot", "make a template from a sandbox's file system", kSnapshotUsage, CmdSnapshot},
      {"fork", "copy a sandbox (files; with --memory, processes too) into new ones", kForkUsage,
       CmdFork},
      {"resume", "thaw a paused sandbox, wake a hibernated one", kResumeUsage, CmdResume},
      {"keys", "create, list and revoke API keys (admin)", kKeysUsage, CmdKeys},
      {"tenants", "set a tenant's quota (admin), show its quota and use", kTenantsUsage,
       CmdTenants},
      {"secrets", "create, rotate, list and delete secrets (values from stdin)", kSecretsUsage,
       CmdSecrets},
      {"engines", "list the isolation engines and what each can do", kEnginesUsage, CmdEngines},
      {"doctor", "check that this host can run airlockd, and what to do if not", kDoctorUsage,
       CmdDoctor},
      {"admin", "operate the daemon: backup of its store (admin)", kAdminUsage, CmdAdmin},
      {"top", "show what every sandbox uses, refreshed", kTopUsage, CmdTop},
      {"metrics", "print a sandbox's usage samples", kMetricsUsage, CmdMetrics},
      {"version", "print the version", kVersionUsage, CmdVersion},
      {"help", "show help for the CLI or a command", kHelpUsage, CmdHelp},
  };
  return kCommands;
}

const Command* FindCommand(std::string_view name) {
  for (const auto& cmd : Commands()) {
    if (cmd.name == name) return &cmd;
  }
  return nullptr;
}

std::string TopLevelHelp() {
  std::string out =
      "usage: airlock [--url URL] [--api-key KEY] [--json] COMMAND [ARGS]\n"
      "\n"
      "Drives airlockd, which runs commands in disposable, isolated sandboxes.\n"
      "\n"
      "  --url URL       the daemon (default: $AIRLOCK_URL, else http://127.0.0.1:7878)\n"
      "  --api-key KEY   the API key (default: $AIRLOCK_API_KEY, else the first line of\n"
      "                  $AIRLOCK_STATE_DIR/admin.key, state dir /var/lib/airlock)\n"
      "  --json          print JSON documents for scripts instead of text for people\n"
      "\n"
      "commands:\n";
  for (const auto& cmd : Commands()) {
    out += "  " + std::string(cmd.name) + std::string(10 - cmd.name.size(), ' ') +
           std::string(cmd.summary) + "\n";
  }
  out +=
      "\n"
      "'airlock COMMAND --help' describes a command. Exit codes: 0 success, 1 an API or\n"
      "connection error, 2 a usage error; exec, run and attach exit with the command's own\n"
      "code.\n";
  return out;
}

}  // namespace airlock::cli
