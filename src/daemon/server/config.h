#pragma once
// airlockd's settings: defaults, then an optional config file, then command-line flags (each
// later source overrides the earlier). The file is a small TOML subset, one `key = value` per
// line, with the same names as the flags (dashes or underscores):
//
//   # /etc/airlock/airlockd.toml
//   listen = "127.0.0.1:7878"
//   state_dir = "/var/lib/airlock"
//   on_shutdown = "keep"        # or "destroy"
//   workers = 64
//   no_auth = false
//   pool.base = 4               # warm pool of 4 sandboxes of template "base"
//   image_dir = "/var/lib/airlock/images"   # OCI image archives templates may start from
//   debian_mirror = "http://deb.debian.org/debian"   # for "debian:<suite>" bases
//   network_subnet = "10.213.0.0/16"   # sandbox addresses, a /30 each
//   network_uplink = "eth0"            # what "open" sandboxes go out through, or a network
//                                      # namespace: "netns:NAME", "/proc/PID/ns/net"
//   network_ipv6 = "auto"              # IPv6 for sandboxes when the uplink has it; on, off
//   network_bandwidth_mbps = 1000      # per sandbox, each way; 0: no cap
//   network_max_connections = 256      # per sandbox, open at once
//   destroyed_keep = "7d"              # records of destroyed sandboxes; "0": for ever
//   metrics_interval_ms = 5000         # how often live sandboxes' use is sampled; 0: never
//   metrics_keep = 720                 # samples kept per sandbox, the newest
//   default_engine = "jail"            # the engine of a create that names none
//
//   [engine.jail]                      # one table per engine: its options (docs/airlockd.md)
//   enabled = true                     # false: not built, not offered
//   base_usr_local = false             # true: base sandboxes see the host's /usr/local
//
// `launcher` and `base_usr_local` at the top level are older names of the jail's options.
// Flags name an engine's options as --engine.NAME.OPTION.
// Strings are double-quoted (\" and \\ escapes), booleans true / false, numbers decimal.
// Unknown keys, repeated keys and malformed lines are errors naming the line.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::daemon {

enum class OnShutdown { kKeep, kDestroy };

struct Config {
  std::string listen = "127.0.0.1:7878";
  std::string state_dir = "/var/lib/airlock";
  bool no_auth = false;
  std::string agent;  // "" : airlock-agent next to airlockd
  std::string log_level = "info";
  std::string log_format = "text";  // or "json": one JSON object per line
  bool log_requests = true;         // a line per API request (method, route, status, ...)
  // On SIGTERM: keep the sandboxes running for the next start to adopt, or destroy them.
  OnShutdown on_shutdown = OnShutdown::kKeep;
  int workers = 64;  // threads for blocking calls (creates, execs, files)
  // How long a destroyed sandbox's record (and its network verdicts) stays in the store, in
  // seconds; 0 keeps them for ever. Written "N" + s, m, h or d ("7d").
  int64_t destroyed_keep_seconds = 7 * 24 * 3600;
  // Template bases: OCI image archives are read from below image_dir only ("": <state_dir>/
  // images); Debian suites are made with mmdebstrap from debian_mirror.
  std::string image_dir;
  std::string debian_mirror = "http://deb.debian.org/debian";
  // Engines (docs/design/engines.md): the one a create gets when neither it nor its template
  // names one, and each engine's options by name ([engine.<name>] tables, engine.<name>.<option>
  // keys and flags), as written: the registry gives them to the engine, which checks them.
  std::string default_engine = "jail";
  std::map<std::string, std::map<std::string, std::string>> engines;
  // Sandbox networking (docs/design/network.md): this daemon's network id (names its nftables
  // table, namespaces and veths), the IPv4 range sandbox addresses come from (a /30 each), the
  // interface or network namespace "open" sandboxes go out through ("": no open mode; a
  // namespace carries the proxy's and DNS's traffic too, net/uplink.h), and the DNS servers the
  // stubs and the proxy ask ("": the host's resolv.conf), "IP[:PORT],...".
  std::string network_id = "a";
  std::string network_subnet = "10.213.0.0/16";
  std::string network_uplink;
  std::string network_dns;
  // A file of extra CA certificates the egress proxy trusts, besides the host's store, when it
  // verifies the hosts secrets go to (docs/design/credentials.md); "": the host's store only.
  std::string network_upstream_ca;
  // IPv6 for sandboxes: "auto" (when the uplink interface has a global IPv6 address), "on" or
  // "off", and the range their IPv6 addresses come from (a /126 each).
  std::string network_ipv6 = "auto";
  std::string network_subnet6 = "fd0a:213::/64";
  // Per-sandbox caps, the default and the most a create may ask: bandwidth each way in Mbit/s
  // (0: none) and connections open at once (docs/design/network.md, "Fair share").
  int network_bandwidth_mbps = 1000;
  int network_max_connections = 256;
  int network_warm_links = 4;  // links made ahead, so a networked create starts no process
  int network_events_keep = 10000;  // stored network verdicts per sandbox, the newest
  int network_events_flush_ms = 250;  // how often queued events and verdicts are written at most
  // The flight recorder (docs/design/recorder.md): stored events per sandbox, the newest; and
  // how many a second one sandbox may record on average, and at once.
  bool events = true;  // "events = off": no flight recorder (to measure its cost)
  int events_keep = 100000;
  int events_rate = 1000;
  int events_burst = 5000;
  // Per-sandbox metrics (docs/design/metrics.md): how often every live sandbox's use is sampled
  // (0: never), and how many samples of each are kept (the newest; 720 = an hour at 5 s).
  int metrics_interval_ms = 5000;
  int metrics_keep = 720;
  // Warm pool size per template ("pool.<template> = N", 0..api::kMaxPoolSize). A size set through
  // PUT /v1/pools/{template} is kept in the store and wins over this one.
  std::map<std::string, int> pools;

  // Applies one setting; `key` uses underscores or dashes. kInvalidArgument for an unknown key
  // or a bad value.
  [[nodiscard]] Status Set(std::string_view key, std::string_view value);
  // Applies every line of a config file's text; errors say "line N: ...".
  [[nodiscard]] Status ApplyFile(std::string_view text);
};

// The default config file, read when it exists and no --config is given.
inline constexpr const char* kDefaultConfigPath = "/etc/airlock/airlockd.toml";

}  // namespace airlock::daemon
