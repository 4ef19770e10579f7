// Secrets (docs/secrets.md): secrets create / update / ls / rm. A value is read from stdin,
// never from the command line, which every user of the host can read in ps: piped, without its
// trailing newline; from a terminal, typed at a prompt without echo.

#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iterator>

#include "cli/commands.h"
#include "cli/table.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// The daemon's limit (api::kMaxSecretValueBytes); a longer stdin is refused before it is sent.
constexpr size_t kMaxValueBytes = 65536;

// The terminal's settings while a value is typed with echo off, for the signal handler that puts
// them back if the prompt is interrupted (tcsetattr is async-signal-safe).
termios g_saved_terminal{};
volatile sig_atomic_t g_echo_off = 0;

void RestoreEchoAndReraise(int sig) {
  if (g_echo_off) ::tcsetattr(STDIN_FILENO, TCSANOW, &g_saved_terminal);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Echo off on stdin (a terminal) while this lives, and back on however the prompt ends: at
// the end of the scope, or on a signal that would end the process.
class EchoOff {
 public:
  EchoOff() {
    if (::tcgetattr(STDIN_FILENO, &g_saved_terminal) != 0) return;
    struct sigaction action = {};
    action.sa_handler = RestoreEchoAndReraise;
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &action, &old_[i]);
    termios quiet = g_saved_terminal;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    quiet.c_lflag |= ECHONL;  // the newline the user types still moves the cursor on
    g_echo_off = ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet) == 0;
  }
  EchoOff(const EchoOff&) = delete;
  ~EchoOff() {
    if (g_echo_off) ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &g_saved_terminal);
    g_echo_off = 0;
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  struct sigaction old_[std::size(kSignals)] = {};
};

// Reads up to `max` bytes of fd, and at most one line when `one_line`.
Outcome<std::string> ReadInput(int fd, size_t max, bool one_line) {
  std::string out;
  char buf[4096];
  while (out.size() <= max) {
    ssize_t n = ::read(fd, buf, one_line ? 1 : sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return CommandError(std::string("reading the value from stdin: ") + strerror(errno));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (one_line && out.back() == '\n') break;
  }
  return out;
}

// The value for `name`: stdin, less one trailing newline ("\n" or "\r\n"); on a terminal, one
// line typed at a prompt on stderr with echo off.
Outcome<std::string> ReadValue(const std::string& name) {
  std::string value;
  if (::isatty(STDIN_FILENO)) {
    EchoOff quiet;  // before the prompt: nothing typed after it is echoed
    std::fprintf(stderr, "value for %s (not echoed): ", name.c_str());
    std::fflush(stderr);
    auto line = ReadInput(STDIN_FILENO, kMaxValueBytes + 2, /*one_line=*/true);
    if (!line) return std::unexpected(line.error());
    value = std::move(*line);
  } else {
    auto all = ReadInput(STDIN_FILENO, kMaxValueBytes + 2, /*one_line=*/false);
    if (!all) return std::unexpected(all.error());
    value = std::move(*all);
  }
  if (value.ends_with('\n')) value.pop_back();
  if (value.ends_with('\r')) value.pop_back();
  if (value.empty()) return CommandError("no value on stdin for secret " + name);
  if (value.size() > kMaxValueBytes) {
    return CommandError("the value on stdin is over " + std::to_string(kMaxValueBytes) + " bytes");
  }
  return value;
}

// "?tenant=T" for --tenant (an admin's), else "".
std::string TenantQuery(const Args& args) {
  auto tenant = args.Last("tenant");
  return tenant ? "?tenant=" + client::UrlEncode(*tenant) : "";
}

// "/v1/secrets/NAME?tenant=T".
std::string SecretTarget(const std::string& name, const Args& args) {
  return "/v1/secrets/" + client::UrlEncode(name) + TenantQuery(args);
}

// The daemon's rule for a name ([A-Za-z_][A-Za-z0-9_]*, at most 128), checked here too so that
// nobody types a value for a name that will be refused.
bool IsSecretName(std::string_view name) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  bool ok = !name.empty() && name.size() <= 128 && letter(name[0]);
  for (char c : name) ok = ok && (letter(c) || (c >= '0' && c <= '9'));
  return ok;
}

// `secret` as the table and the create/update lines show it.
std::vector<std::string> Row(const json& secret) {
  return {Text(secret, "name"), std::to_string(secret.value("version", int64_t{0})),
          Text(secret, "created_at"), Text(secret, "updated_at")};
}

// create and update: the name from the command line, the value from stdin.
Outcome<int> Write(const Args& args, Globals& globals, bool create) {
  const std::string sub = create ? "create" : "update";
  if (args.positional.size() != 2) return UsageError("secrets", sub + " wants one NAME");
  const std::string& name = args.positional[1];
  auto value = ReadValue(name);
  if (!value) return std::unexpected(value.error());
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  const json request = create ? json{{"name", name}, {"value", *value}} : json{{"value", *value}};
  auto doc = create ? api->CallJson("POST", "/v1/secrets" + TenantQuery(args), &request)
                    : api->CallJson("PUT", SecretTarget(name, args), &request);
  if (!doc) return std::unexpected(doc.error());
  if (globals.json) return PrintJson(*doc);
  std::fprintf(stderr, "secret %s: version %lld\n", Text(*doc, "name").c_str(),
               static_cast<long long>(doc->value("version", int64_t{0})));
  return 0;
}

Outcome<int> List(const Args& args, Globals& globals) {
  if (args.positional.size() != 1) return UsageError("secrets", "ls takes no arguments");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/secrets" + TenantQuery(args));
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["secrets"].is_array()) {
    return CommandError("the daemon's reply has no secrets array");
  }
  const json& list = (*doc)["secrets"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const json& s : list) rows.push_back(Row(s));
  PrintText(FormatTable({"NAME", "VERSION", "CREATED", "UPDATED"}, rows));
  return 0;
}

Outcome<int> Remove(const Args& args, Globals& globals) {
  if (args.positional.size() < 2) return UsageError("secrets", "rm wants secret names");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  for (size_t i = 1; i < args.positional.size(); ++i) {
    auto gone = api->Call("DELETE", SecretTarget(args.positional[i], args));
    if (!gone) return std::unexpected(gone.error());
  }
  return 0;
}

}  // namespace

Outcome<int> CmdSecrets(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {{"tenant", true}};
  auto args = Parse("secrets", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help || args->positional.empty()) return PrintUsage("secrets");
  const std::string sub = args->positional[0];
  for (size_t i = 1; i < args->positional.size(); ++i) {
    if (!IsSecretName(args->positional[i])) {
      return UsageError("secrets",
                        "a secret name is 1-128 letters, digits and '_', not starting with a "
                        "digit (it is also an environment variable's name), got '" +
                            args->positional[i] + "'");
    }
  }
  if (sub == "create") return Write(*args, globals, /*create=*/true);
  if (sub == "update") return Write(*args, globals, /*create=*/false);
  if (sub == "ls" || sub == "list") return List(*args, globals);
  if (sub == "rm") return Remove(*args, globals);
  return UsageError("secrets", "unknown subcommand '" + sub + "' (create, update, ls, rm)");
}

}  // namespace airlock::cli
