// airlockd: the Airlock daemon. Serves the REST API (docs/api/openapi.yaml) over HTTP/1.1 and
// runs sandboxes with the engines of the registry (runtime/registry.h): the jail by default.
//
//   airlockd [--config FILE] [--listen HOST:PORT] [--state-dir DIR] [--no-auth]
//            [--on-shutdown keep|destroy] [--workers N] [--agent PATH] [--launcher PATH]
//            [--log-level LEVEL] [--image-dir DIR] [--debian-mirror URL] [--base-usr-local]
//            [--network-id ID] [--network-subnet CIDR] [--network-uplink IF|netns:NAME|PATH]
//            [--network-dns LIST] [--network-warm-links N] [--network-ipv6 auto|on|off]
//            [--network-subnet6 CIDR] [--network-bandwidth-mbps N] [--network-max-connections N]
//            [--network-upstream-ca FILE]
//
// The first line on stdout is "listening on HOST:PORT" (with the real port when PORT is 0).
// At start it reconciles its records with what the engine has (adopting live sandboxes).
// SIGTERM / SIGINT: stop accepting, answer the requests in flight, then keep the sandboxes for
// the next start (on_shutdown = keep, the default) or destroy them; exit 0. SIGHUP: reload what
// can change without a restart. --check-config: judge the settings, start nothing.
// --destroy-all: take back what the last daemon kept, destroy every sandbox, exit (no serving).
// --doctor: judge the host as a start would (daemon/server/doctor.h), print the findings (--json:
// as a document), exit 0 when the default engine can run, 1 when it cannot.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/udp.hpp>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "common/build_id.h"
#include "common/helpers.h"
#include "common/log.h"
#include "common/syscall.h"
#include "daemon/server/config.h"
#include "daemon/server/controller.h"
#include "daemon/server/doctor.h"
#include "daemon/server/http_server.h"
#include "daemon/server/metrics.h"
#include "daemon/server/recorder.h"
#include "daemon/server/router.h"
#include "daemon/server/secret_store.h"
#include "daemon/store/store.h"
#include "net/tls_authority.h"
#include "net/uplink.h"
#include "runtime/registry.h"

namespace {

namespace fs = std::filesystem;
using airlock::daemon::Config;

constexpr const char* kUsage =
    "usage: airlockd [--version] [--config FILE] [--listen HOST:PORT] [--state-dir DIR]\n"
    "                [--no-auth] [--on-shutdown keep|destroy] [--workers N] [--agent PATH]\n"
    "                [--launcher PATH] [--log-level trace|debug|info|warn|error]\n"
    "                [--log-format text|json] [--log-requests true|false]\n"
    "                [--default-engine NAME] [--engine.NAME.OPTION VALUE]\n"
    "                [--pool.TEMPLATE N] [--image-dir DIR] [--debian-mirror URL]\n"
    "                [--base-usr-local]\n"
    "                [--network-id ID] [--network-subnet CIDR]\n"
    "                [--network-uplink IF|netns:NAME|PATH] [--network-dns IP[:PORT],...]\n"
    "                [--network-ipv6 auto|on|off] [--network-subnet6 CIDR]\n"
    "                [--network-bandwidth-mbps N] [--network-max-connections N]\n"
    "                [--network-warm-links N] [--network-upstream-ca FILE]\n"
    "                [--network-events-keep N] [--network-events-flush-ms MS]\n"
    "                [--events on|off] [--events-keep N] [--events-rate N] [--events-burst N]\n"
    "                [--destroyed-keep 0|Ns|Nm|Nh|Nd]\n"
    "                [--metrics-interval-ms MS] [--metrics-keep N]\n"
    "                [--check-config | --destroy-all | --doctor [--json]]\n"
    "Settings come from the defaults, then the config file (--config, else\n"
    "/etc/airlock/airlockd.toml if it exists), then the flags. See docs/airlockd.md.\n";

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::fprintf(stderr, "airlockd: %s\n", message.c_str());
  std::exit(code);
}

// "IP[:PORT],..." (IPv6 as [IP]:PORT); "" is none.
airlock::Result<std::vector<boost::asio::ip::udp::endpoint>> ParseDnsServers(
    const std::string& list) {
  std::vector<boost::asio::ip::udp::endpoint> out;
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    std::string one = list.substr(at, comma - at);
    at = comma + 1;
    if (one.empty()) continue;
    std::string host = one, port = "53";
    if (one.front() == '[') {
      size_t close = one.find(']');
      if (close == std::string::npos)
        return airlock::Fail(airlock::ErrorCode::kInvalidArgument, "bad server " + one);
      host = one.substr(1, close - 1);
      if (close + 1 < one.size() && one[close + 1] == ':') port = one.substr(close + 2);
    } else if (size_t colon = one.find(':'); colon != std::string::npos) {
      host = one.substr(0, colon);
      port = one.substr(colon + 1);
    }
    boost::system::error_code ec;
    auto ip = boost::asio::ip::make_address(host, ec);
    int n = 0;
    auto [end, perr] = std::from_chars(port.data(), port.data() + port.size(), n);
    if (ec || perr != std::errc() || end != port.data() + port.size() || n < 1 || n > 65535) {
      return airlock::Fail(airlock::ErrorCode::kInvalidArgument,
                           "bad DNS server '" + one + "' (want IP[:PORT])");
    }
    out.emplace_back(ip, static_cast<uint16_t>(n));
  }
  return out;
}

// The settings: the defaults, then the config file (wherever --config is on the line, else the
// default file if it exists), then the flags. kInvalidArgument naming the file's line or the flag.
airlock::Result<Config> ReadConfig(int argc, char** argv) {
  using airlock::ErrorCode;
  using airlock::Fail;
  std::string path;
  bool explicit_path = false;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--config") {
      path = argv[i + 1];
      explicit_path = true;
    }
  }
  if (!explicit_path && fs::exists(airlock::daemon::kDefaultConfigPath)) {
    path = airlock::daemon::kDefaultConfigPath;
  }
  Config config;
  if (!path.empty()) {
    auto text = airlock::ReadFileToString(path, 1 << 20);
    if (!text) return Fail(ErrorCode::kInvalidArgument, "reading " + path + ": " + text.error().message());
    if (auto st = config.ApplyFile(*text); !st) {
      return Fail(ErrorCode::kInvalidArgument, path + ": " + st.error().message());
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--check-config" || arg == "--destroy-all" ||
        arg == "--doctor" || arg == "--json") {
      continue;
    }
    if (!arg.starts_with("--")) return Fail(ErrorCode::kInvalidArgument, "unexpected argument " + arg);
    const std::string key = arg.substr(2);
    if (key == "no-auth" || key == "base-usr-local") {
      (void)config.Set(key, "true");
      continue;
    }
    if (i + 1 >= argc) return Fail(ErrorCode::kInvalidArgument, arg + " needs a value");
    const std::string value = argv[++i];
    if (key == "config") continue;
    if (auto st = config.Set(key, value); !st) {
      return Fail(ErrorCode::kInvalidArgument, "--" + key + ": " + st.error().message());
    }
  }
  return config;
}

bool HasFlag(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == flag) return true;
  }
  return false;
}

Config LoadConfig(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--version") {
      std::printf("airlockd %s\n", airlock::kBuildId);
      std::exit(0);
    }
  }
  auto config = ReadConfig(argc, argv);
  if (!config) Die(config.error().message() + "\n" + kUsage, 2);
  return *config;
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
// A helper's path: the flag's, else where common/helpers.h finds it.
std::string HelperPath(const std::string& explicit_path, const char* name, const char* flag) {
  if (!explicit_path.empty()) return explicit_path;
  std::string found = airlock::FindHelper(name);
  if (found.empty()) {
    Die(std::string(name) + " not found beside airlockd, in ../libexec/airlock/ or in its build "
        "tree; give its path with " + flag);
  }
  return found;
}

// The [engine.NAME] sections as the registry takes them.
std::map<std::string, airlock::runtime::EngineConfig> EngineConfigs(const Config& flags) {
  std::map<std::string, airlock::runtime::EngineConfig> out;
  for (const auto& [name, options] : flags.engines) {
    airlock::runtime::EngineConfig& config = out[name];
    for (const auto& [key, value] : options) {
      if (key == "enabled") {
        config.enabled = value == "true";
      } else {
        config.options[key] = value;
      }
    }
  }
  return out;
}

// --doctor: the host checks, then every engine built and probed as at start, in a scratch state
// dir beside the real one (on the same file system; removed after), so that a daemon running
// on the real one is not disturbed.
int Doctor(const Config& flags, bool as_json) {
  using namespace airlock;
  spdlog::set_level(spdlog::level::err);  // the findings say it; not the engines' start-up lines
  daemon::HostCheckInput input;
  const char* path_env = std::getenv("PATH");
  input.host.path_env =
      path_env != nullptr ? path_env : "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  input.state_dir = flags.state_dir;
  input.open_mode = !flags.network_uplink.empty();
  for (const auto& [name, options] : flags.engines) {
    if (auto runsc = options.find("runsc"); runsc != options.end()) input.runsc = runsc->second;
  }
  input.probe = true;
  input.running_as_root = ::geteuid() == 0;
  std::vector<daemon::Finding> findings = daemon::CheckHost(input);

  std::vector<runtime::EngineStatus> engines;
  const std::string agent = flags.agent.empty() ? FindHelper("airlock-agent") : flags.agent;
  const std::string scratch = flags.state_dir + "/doctor." + std::to_string(::getpid());
  std::error_code ec;
  fs::path first_made;  // the highest directory of the state dir's path that does not exist yet
  for (fs::path p = flags.state_dir; !p.empty() && p != p.root_path() && !fs::exists(p, ec);
       p = p.parent_path()) {
    first_made = p;
  }
  if (agent.empty()) {
    findings.push_back({"airlock-agent", daemon::Verdict::kFail,
                        "not found beside airlockd, in ../libexec/airlock/ or in its build tree",
                        "reinstall the package, or give its path with --agent"});
  } else if (fs::create_directories(scratch, ec); ec) {
    findings.push_back({"state dir", daemon::Verdict::kFail,
                        "cannot make " + scratch + " to try the engines in: " + ec.message(),
                        "check the state dir's file system and permissions"});
  } else {
    {  // the engines are gone before their scratch dir is
      runtime::EngineContext context{.state_dir = scratch, .agent_path = agent};
      auto registry =
          runtime::EngineRegistry::Open(context, EngineConfigs(flags), flags.default_engine);
      if (!registry) {
        findings.push_back({"config", daemon::Verdict::kFail, registry.error().message(),
                            "mend the setting it names (airlockd --check-config)"});
      } else {
        engines = (*registry)->List();
        for (daemon::Finding& f : daemon::CheckEngines(engines, flags.default_engine)) {
          findings.push_back(std::move(f));
        }
      }
    }
    fs::remove_all(scratch, ec);
    // What it made of the state dir's path goes too (fs::remove takes only an empty one).
    for (fs::path p = flags.state_dir; !first_made.empty(); p = p.parent_path()) {
      if (!fs::remove(p, ec) || p == first_made) break;
    }
  }
  if (as_json) {
    const auto doc = daemon::DoctorJson(findings, engines, flags.default_engine);
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::fputs(daemon::DoctorText(findings).c_str(), stdout);
    const std::string verdict =
        daemon::Ready(findings)
            ? "ready: airlockd can run its default engine (" + flags.default_engine + ") here"
            : "not ready: airlockd cannot run its default engine here (see the failures above)";
    std::printf("%s\n", verdict.c_str());
  }
  return daemon::Ready(findings) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace airlock;
  const Config flags = LoadConfig(argc, argv);
  InitLogging("airlockd", flags.log_level,
              flags.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);  // until the server reloads on it

  daemon::HttpServerOptions server_options;
  ParseListen(flags.listen, server_options);
  server_options.workers = flags.workers;
  if (flags.no_auth && !server_options.address.is_loopback()) {
    Die("--no-auth is refused unless --listen is a loopback address", 2);
  }
  if (HasFlag(argc, argv, "--check-config")) {
    // What can be judged without starting: every key and value, the listen address, the DNS
    // servers. (Engines check their own options when they are built, at start.)
    if (auto dns = ParseDnsServers(flags.network_dns); !dns) {
      Die("network_dns: " + dns.error().message(), 2);
    }
    std::printf("airlockd: the settings are valid\n");
    return 0;
  }
  if (HasFlag(argc, argv, "--doctor")) return Doctor(flags, HasFlag(argc, argv, "--json"));
  if (flags.no_auth) spdlog::warn("--no-auth: every API call is accepted without a key");

  std::error_code ec;
  fs::create_directories(flags.state_dir, ec);
  if (ec) Die("creating " + flags.state_dir + ": " + ec.message());
  // One daemon per state dir: a second one would adopt (and fight over) the first one's
  // sandboxes. The lock lives as long as this process (the fd is never closed).
  const std::string lock_path = flags.state_dir + "/airlockd.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) Die("opening " + lock_path + ": " + std::strerror(errno));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) < 0) {
    Die("another airlockd is running with the state dir " + flags.state_dir);
  }

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

  // The secrets' key (docs/design/secrets-store.md): made at first start; a start that cannot
  // open the stored secrets stops here rather than serve without them.
  auto secrets = daemon::SecretStore::Open(**store, flags.state_dir);
  if (!secrets) Die(secrets.error().message());
  if ((*secrets)->made_key()) {
    spdlog::info("created the secrets key in {}/{}", flags.state_dir,
                 daemon::SecretStore::kKeyFile);
  }

  // The engines: each built and probed; one that fails is listed unavailable, and the daemon
  // starts with the others. Only a bad configuration stops it here.
  runtime::EngineContext engine_context;
  engine_context.state_dir = flags.state_dir;
  engine_context.agent_path = HelperPath(flags.agent, "airlock-agent", "--agent");
  // The flight recorder: every sandbox's events, the networks' verdicts among them, on their
  // way to the store. Declared before the engines and the networks, so that it is destroyed (and
  // flushed) after their process watches, proxy and stubs have stopped.
  daemon::Recorder recorder(
      **store, {.enabled = flags.events,
                .keep = static_cast<int64_t>(flags.events_keep),
                .verdicts_keep = static_cast<int64_t>(flags.network_events_keep),
                .rate = static_cast<double>(flags.events_rate),
                .burst = static_cast<double>(flags.events_burst),
                .interval = std::chrono::milliseconds(flags.network_events_flush_ms)});
  auto engines =
      runtime::EngineRegistry::Open(engine_context, EngineConfigs(flags), flags.default_engine);
  if (!engines) Die(engines.error().message(), 2);
  for (const runtime::EngineStatus& e : (*engines)->List()) {
    if (e.available) {
      spdlog::info("engine {}: available{}", e.name,
                   e.name == flags.default_engine ? " (the default)" : "");
    } else {
      spdlog::warn("engine {}: unavailable: {}", e.name, e.reason);
    }
  }

  // Sandbox networking: without it (no nftables, no iproute2) sandboxes get network mode
  // "none" only, and a create that asks for more is refused, saying so.
  std::unique_ptr<net::Networks> networks;
  {
    net::NetworksConfig nc;
    nc.on_event = [&recorder](const std::string& sandbox, const net::NetworkEvent& event) {
      recorder.Verdict(sandbox, event);
    };
    nc.id = flags.network_id;
    nc.subnet = flags.network_subnet;
    // A namespace uplink that is not there is a configuration error, not a host without
    // networking: the daemon stops here, saying what is wrong.
    if (auto uplink = net::ParseUplink(flags.network_uplink); !uplink) {
      Die(uplink.error().message(), 2);
    }
    nc.uplink = flags.network_uplink;
    nc.warm_links = static_cast<size_t>(flags.network_warm_links);
    nc.ipv6 = flags.network_ipv6;
    nc.subnet6 = flags.network_subnet6;
    nc.bandwidth_mbps = static_cast<uint32_t>(flags.network_bandwidth_mbps);
    nc.max_connections = static_cast<uint32_t>(flags.network_max_connections);
    auto upstream = ParseDnsServers(flags.network_dns);
    if (!upstream) Die("network_dns: " + upstream.error().message(), 2);
    nc.dns_upstream = std::move(*upstream);
    // Secrets (docs/design/credentials.md): the proxy terminates TLS to the hosts they are bound
    // to with certificates of the daemon's own CA, made at first start and kept, and verifies
    // those hosts against the host's trust store and network_upstream_ca.
    auto authority = net::CertificateAuthority::LoadOrCreate(flags.state_dir + "/egress-ca");
    if (!authority) Die("the egress CA: " + authority.error().message());
    auto upstream_tls = net::UpstreamContext(flags.network_upstream_ca);
    if (!upstream_tls) Die("network_upstream_ca: " + upstream_tls.error().message(), 2);
    std::shared_ptr<net::CertificateAuthority> ca = std::move(*authority);
    nc.egress_ca_pem = ca->certificate_pem();
    nc.server_tls = [ca](const std::string& host) { return ca->ServerContext(host); };
    nc.upstream_tls = std::move(*upstream_tls);
    nc.secret_value = [&records = **store, &values = **secrets](
                          const std::string& sandbox, const std::string& name) -> Result<std::string> {
      auto record = records.Get(sandbox);
      if (!record) return std::unexpected(record.error());
      return values.Value(record->tenant, name);
    };
    // The proxy's port is in every networked sandbox's HTTP_PROXY: kept across restarts.
    const std::string port_file = flags.state_dir + "/network-proxy-port";
    if (auto text = ReadFileToString(port_file, 16)) {
      int port = 0;
      std::from_chars(text->data(), text->data() + text->size(), port);
      if (port > 0 && port < 65536) nc.proxy_port = static_cast<uint16_t>(port);
    }
    auto opened = net::Networks::Open(std::move(nc));
    if (opened) {
      networks = std::move(*opened);
      std::ofstream(port_file + ".tmp") << networks->proxy_port() << "\n";
      std::error_code renamed;
      fs::rename(port_file + ".tmp", port_file, renamed);
      if (renamed) spdlog::warn("recording the proxy's port: {}", renamed.message());
      spdlog::info(
          "sandbox networking: subnet {}{}, egress proxy on port {}{}", flags.network_subnet,
          networks->ipv6() ? " and " + flags.network_subnet6 : " (no IPv6)", networks->proxy_port(),
          flags.network_uplink.empty() ? ", no uplink (no open mode)"
                                       : ", uplink " + flags.network_uplink);
    } else {
      spdlog::warn("sandbox networking is off: {}", opened.error().message());
    }
  }
  daemon::Controller controller(**store, **engines, recorder);
  // The processes started inside sandboxes, on the engines that can tell (process_events).
  for (const runtime::EngineStatus& e : (*engines)->List()) {
    if (!e.available || !e.capabilities.process_events) continue;
    auto engine = (*engines)->Get(e.name);
    if (!engine) continue;
    auto watched = (*engine)->WatchProcesses(
        [&recorder](const std::string& sandbox, const runtime::ProcessEvent& event) {
          daemon::RecordProcess(recorder, sandbox, event);
        });
    if (!watched) spdlog::warn("engine {}: {}", e.name, watched.error().message());
  }
  controller.SetNetworks(networks.get());
  controller.SetSecretValues([&values = **secrets](const std::string& tenant,
                                                   const std::string& name) {
    return values.Value(tenant, name);
  });
  controller.SetImageSources(
      {flags.image_dir.empty() ? flags.state_dir + "/images" : flags.image_dir,
       flags.debian_mirror});
  daemon::Metrics metrics;
  auto recovered = controller.Recover();
  if (!recovered) Die(recovered.error().message());
  if (networks) networks->StartMaintainer();  // after recovery took back what it adopts
  metrics.SetRecovery(recovered->adopted, recovered->failed, recovered->finished,
                      recovered->orphans_removed);
  if (HasFlag(argc, argv, "--destroy-all")) {
    // The package's removal (packaging/debian/prerm): every sandbox the last daemon kept ends.
    controller.DestroyAll();
    spdlog::info("destroyed every sandbox of {}", flags.state_dir);
    return 0;
  }
  controller.expiry().SetDestroyedRetention(std::chrono::seconds(flags.destroyed_keep_seconds));
  controller.expiry().Start(std::chrono::seconds(1));
  controller.sampler().Start(std::chrono::milliseconds(flags.metrics_interval_ms),
                             flags.metrics_keep);
  if (auto st = controller.pools().Configure(flags.pools); !st) Die(st.error().message(), 2);
  controller.pools().StartFiller();
  daemon::Router router(controller, **store, **secrets, metrics,
                        /*auth_required=*/!flags.no_auth, flags.log_requests);
  // SIGHUP: the config file and the flags read again; what can change without a restart is
  // applied (docs/airlockd.md, "Reload"), a bad file changes nothing.
  server_options.on_reload = [&controller, argc, argv] {
    auto next = ReadConfig(argc, argv);
    if (!next) {
      spdlog::error("reload refused, nothing changed: {}", next.error().message());
      return;
    }
    spdlog::set_level(spdlog::level::from_str(next->log_level));
    controller.expiry().SetDestroyedRetention(std::chrono::seconds(next->destroyed_keep_seconds));
    if (auto st = controller.pools().Configure(next->pools); !st) {
      spdlog::error("reload: pools not changed: {}", st.error().message());
    }
    spdlog::info("reloaded: log_level {}, destroyed_keep {} s, {} configured pool(s); other "
                 "settings take effect at the next start",
                 next->log_level, next->destroyed_keep_seconds, next->pools.size());
  };
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
  std::signal(SIGHUP, SIG_IGN);  // no reload while stopping
  controller.pools().StopFiller();
  controller.expiry().Stop();
  controller.sampler().Stop();
  if (flags.on_shutdown == daemon::OnShutdown::kDestroy) {
    controller.DestroyAll();
  } else {
    spdlog::info("keeping the sandboxes for the next start to adopt");
  }
  spdlog::info("stopped");
  return 0;
}
