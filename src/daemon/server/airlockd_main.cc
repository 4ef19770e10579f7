// airlockd: the Airlock daemon. Serves the REST API (docs/api/openapi.yaml) over HTTP/1.1 and
// runs sandboxes with the jail engine.
//
//   airlockd [--listen HOST:PORT] [--state-dir DIR] [--no-auth] [--agent PATH]
//            [--launcher PATH] [--log-level LEVEL]
//
// The first line on stdout is "listening on HOST:PORT" (with the real port when PORT is 0).
// SIGTERM / SIGINT: stop accepting, answer the requests in flight, destroy the sandboxes this
// process created, exit 0.

#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "common/log.h"
#include "daemon/server/controller.h"
#include "daemon/server/http_server.h"
#include "daemon/server/router.h"
#include "daemon/store/store.h"
#include "runtime/jail/jail_runtime.h"

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: airlockd [--listen HOST:PORT] [--state-dir DIR] [--no-auth] [--agent PATH]\n"
    "                [--launcher PATH] [--log-level trace|debug|info|warn|error]\n";

struct Flags {
  std::string listen = "127.0.0.1:7878";
  std::string state_dir = "/var/lib/airlock";
  bool no_auth = false;
  std::string agent_path;
  std::string launcher_path;
  std::string log_level = "info";
};

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::fprintf(stderr, "airlockd: %s\n", message.c_str());
  std::exit(code);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(arg + " needs a value\n" + kUsage, 2);
      return argv[++i];
    };
    if (arg == "--listen") {
      flags.listen = value();
    } else if (arg == "--state-dir") {
      flags.state_dir = value();
    } else if (arg == "--no-auth") {
      flags.no_auth = true;
    } else if (arg == "--agent") {
      flags.agent_path = value();
    } else if (arg == "--launcher") {
      flags.launcher_path = value();
    } else if (arg == "--log-level") {
      flags.log_level = value();
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      Die("unknown option " + arg + "\n" + kUsage, 2);
    }
  }
  return flags;
}

// "127.0.0.1:7878", "[::1]:0", "localhost:7878".
void ParseListen(const std::string& listen, airlock::daemon::HttpServerOptions& options) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) Die("--listen wants HOST:PORT, got " + listen, 2);
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  options.address = boost::asio::ip::make_address(host, ec);
  if (ec) Die("--listen: " + host + " is not an IP address", 2);
  char* end = nullptr;
  const unsigned long n = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || n > 65535) Die("--listen: bad port " + port, 2);
  options.port = static_cast<uint16_t>(n);
}

// `explicit_path` if given, else `name` next to this executable.
std::string FindHelper(const std::string& explicit_path, const char* name, const char* flag) {
  if (!explicit_path.empty()) return explicit_path;
  std::error_code ec;
  const fs::path self = fs::canonical("/proc/self/exe", ec);
  fs::path candidate = self.parent_path() / name;
  if (ec || !fs::exists(candidate)) {
    Die(std::string(name) + " not found next to airlockd; give its path with " + flag);
  }
  return candidate.string();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace airlock;
  const Flags flags = ParseFlags(argc, argv);
  InitLogging("airlockd", flags.log_level);
  std::signal(SIGPIPE, SIG_IGN);

  daemon::HttpServerOptions server_options;
  ParseListen(flags.listen, server_options);
  if (flags.no_auth && !server_options.address.is_loopback()) {
    Die("--no-auth is refused unless --listen is a loopback address", 2);
  }
  if (flags.no_auth) spdlog::warn("--no-auth: every API call is accepted without a key");

  std::error_code ec;
  fs::create_directories(flags.state_dir, ec);
  if (ec) Die("creating " + flags.state_dir + ": " + ec.message());

  auto store = store::Store::Open(flags.state_dir + "/airlock.db");
  if (!store) Die(store.error().message());
  auto admin = (*store)->EnsureAdminKey(flags.state_dir);
  if (!admin) Die(admin.error().message());
  switch (*admin) {
    case store::AdminKeyState::kCreated:
      spdlog::info("created the admin key in {}/admin.key", flags.state_dir);
      break;
    case store::AdminKeyState::kAdopted:
      spdlog::info("stored the admin key found in {}/admin.key", flags.state_dir);
      break;
    case store::AdminKeyState::kPresent:
      break;
    case store::AdminKeyState::kFileMissing:
      spdlog::warn("{}/admin.key is missing; the admin key in the database still works",
                   flags.state_dir);
      break;
  }

  jail::JailOptions jail_options;
  jail_options.state_dir = flags.state_dir;
  jail_options.agent_path = FindHelper(flags.agent_path, "airlock-agent", "--agent");
  jail_options.launcher_path = FindHelper(flags.launcher_path, "airlock-jail", "--launcher");
  auto runtime = jail::JailRuntime::Open(jail_options);
  if (!runtime) Die("opening the jail engine: " + runtime.error().message());

  daemon::Controller controller(**store, **runtime);
  if (auto st = controller.CleanUpPreviousRun(); !st) Die(st.error().message());
  daemon::Router router(controller, **store, /*auth_required=*/!flags.no_auth);
  auto server = daemon::HttpServer::Listen(server_options, router);
  if (!server) Die(server.error().message());

  const std::string host = server_options.address.is_v6()
                               ? "[" + server_options.address.to_string() + "]"
                               : server_options.address.to_string();
  std::printf("listening on %s:%u\n", host.c_str(), static_cast<unsigned>((*server)->local_port()));
  std::fflush(stdout);
  spdlog::info("listening on {}:{}, state in {}", host, (*server)->local_port(), flags.state_dir);

  (*server)->Run();
  server->reset();
  controller.DestroyAll();
  spdlog::info("stopped");
  return 0;
}
