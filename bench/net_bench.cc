// Egress through a real airlockd's network, in a fake internet (tests/support/fake_internet.h:
// a namespace behind a veth that the daemon takes as its uplink, web sites on 198.18.N.2/.3, a
// DNS authority on the host side), beside a baseline measured in the same run:
//
//   host netns             a plain network namespace on the host (veth, routed, no NAT, no jail)
//   open sandbox           a sandbox in mode open: straight out through the uplink (NAT)
//   allowlist, transparent an allowlist sandbox dialling the site's address on port 80, which
//                          nftables redirects to the egress proxy (judged by Host)
//   allowlist, HTTP_PROXY  the same sandbox sending absolute-form requests to the proxy, as
//                          curl and pip do with HTTP_PROXY set (a name the proxy has cached)
//   ..., uncached name     the same with a name whose TTL is 0: every request pays the proxy's
//                          DNS lookup, as the first request for a name does
//   ..., keep-alive        N requests on one connection (host netns direct; HTTP_PROXY, where
//                          the proxy reuses its upstream connection too)
//
// Latency: a small GET (1 KiB body, a new connection each, Connection: close; on one connection
// in the keep-alive rows), p50/p90/p99, and each row's ratio to its direct baseline in the same
// run. Throughput: one GET of a large body (--mib), MB/s. Every row runs the same client, a short
// python3 script (/usr/bin/python3, which sandboxes have from the host's /usr) that times each
// request itself from connect to the last byte: the client's cost, the exec round trip and the
// interpreter's start are the same in every row or outside the timing. The rows run
// interleaved in batches, the order rotated, so machine noise falls on every side alike.
// Timings are reported, never asserted; a reply that is not 200 with the expected size ends the
// run with status 1. Needs root (namespaces, veths, nftables, airlockd).
//
//   airlock-bench-net [--quick] [--requests N] [--mib N] [--repetitions N] [--json FILE]
//
// --quick: 200 requests a row, 32 MiB, 3 repetitions. airlockd, its sandboxes, the namespaces
// and veths are removed on every path; 130 on SIGINT.

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/http_client.h"
#include "common/error.h"
#include "daemon_process.h"
#include "flags.h"
#include "stats.h"
#include "support/fake_internet.h"

namespace {

using airlock::bench::g_interrupted;
namespace b = airlock::bench;
using airlock::ErrorCode;
using airlock::Result;
using airlock::Status;
using airlock::client::HttpClient;
using nlohmann::json;

constexpr char kTag[] = "airlock-bench-net";
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSmallBody = 1024;
constexpr int kBatch = 50;  // requests per row per turn

// The client, the same in every row. argv: MODE ADDRESS PORT HOST PATH COUNT [keep], MODE
// "direct" (origin-form to ADDRESS) or "proxy" (absolute-form, ADDRESS is the proxy); "keep": all
// COUNT requests on one connection, each reply read by its Content-Length (the first request's
// time includes the connect). Prints "MICROSECONDS:BYTES" per request, the bytes being the whole
// reply; exits 1 on a reply that is not 200.
constexpr char kClient[] = R"PY(
import socket, sys, time
mode, address, port, host, path, count = sys.argv[1:7]
keep = sys.argv[7:8] == ["keep"]
target = "http://" + host + path if mode == "proxy" else path
request = ("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n"
           % (target, host, "" if keep else "Connection: close\r\n")).encode()
buf = bytearray(1 << 20)
out = []
s = None
for _ in range(int(count)):
    t0 = time.perf_counter()
    if s is None:
        s = socket.create_connection((address, int(port)))
    s.sendall(request)
    got, head = 0, b""
    if keep:
        while b"\r\n\r\n" not in head:
            n = s.recv_into(buf)
            if n == 0:
                sys.exit("the connection closed")
            head += bytes(buf[:n])
        head, _, rest = head.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        got = len(rest)
        while got < length:
            n = s.recv_into(buf)
            if n == 0:
                sys.exit("the connection closed")
            got += n
        got += len(head) + 4
    else:
        while True:
            n = s.recv_into(buf)
            if n == 0:
                break
            if len(head) < 16:
                head += bytes(buf[:16])
            got += n
        s.close()
        s = None
    t1 = time.perf_counter()
    if not head.startswith(b"HTTP/1.1 200 "):
        sys.exit("not a 200: %r" % head[:40])
    out.append("%.1f:%d" % ((t1 - t0) * 1e6, got))
if s is not None:
    s.close()
print(" ".join(out))
)PY";

struct Flags {
  bool quick = false;
  int requests = 1000;  // small GETs per row
  int mib = 128;        // the large body
  int repetitions = 5;  // large GETs per row
  std::string json_path;
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  std::optional<int> requests, mib, repetitions;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      flags.quick = true;
      continue;
    }
    if (i + 1 >= argc) return airlock::Fail(ErrorCode::kInvalidArgument, arg + " needs a value");
    const std::string value = argv[++i];
    auto number = [&](int min, int max, std::optional<int>& into) {
      return b::ParseIntFlag(arg, value, min, max, into);
    };
    Status st;
    if (arg == "--requests") {
      st = number(kBatch, 1000000, requests);
    } else if (arg == "--mib") {
      st = number(1, 4096, mib);
    } else if (arg == "--repetitions") {
      st = number(1, 1000, repetitions);
    } else if (arg == "--json") {
      flags.json_path = value;
    } else {
      return airlock::Fail(ErrorCode::kInvalidArgument, "unknown argument " + arg);
    }
    if (!st) return std::unexpected(st.error());
  }
  if (flags.quick) {
    flags.requests = 200;
    flags.mib = 32;
    flags.repetitions = 3;
  }
  flags.requests = requests.value_or(flags.requests);
  flags.mib = mib.value_or(flags.mib);
  flags.repetitions = repetitions.value_or(flags.repetitions);
  return flags;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

// A plain network namespace on the host, routed to the fake internet through a veth (no NAT,
// no firewall of ours, no jail): the baseline. Removed when this goes out of scope.
class HostNetns {
 public:
  explicit HostNetns(const std::string& n)
      : n_(n), ns_("airlock-benchhost-" + n), veth_("nbh" + n), gateway_("198.19." + n + ".1") {}
  HostNetns(const HostNetns&) = delete;
  ~HostNetns() { Remove(); }

  [[nodiscard]] Status Make(const std::string& script_path) {
    Remove();
    made_ = true;
    const std::string inside = "198.19." + n_ + ".2";
    if (Sh("ip netns add " + ns_ + " && ip link add " + veth_ + " type veth peer name eth0 netns " +
           ns_ + " && ip addr add " + gateway_ + "/30 dev " + veth_ + " && ip link set " + veth_ +
           " up && ip -n " + ns_ + " link set lo up && ip -n " + ns_ + " addr add " + inside +
           "/30 dev eth0 && ip -n " + ns_ + " link set eth0 up && ip -n " + ns_ +
           " route add default via " + gateway_) != 0) {
      return airlock::Fail(ErrorCode::kInternal, "making namespace " + ns_ + " failed");
    }
    script_ = script_path;
    return {};
  }

  // Runs the client in the namespace with `args`; its stdout.
  Result<std::string> Client(const std::string& args) const {
    const std::string cmd = "ip netns exec " + ns_ + " /usr/bin/python3 " + script_ + " " + args;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return airlock::FailErrno("popen", errno);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    if (status != 0) {
      return airlock::Fail(ErrorCode::kInternal, "the client in " + ns_ + " failed (status " +
                                                     std::to_string(status) + "): " + out);
    }
    return out;
  }

 private:
  void Remove() const {
    if (made_) Sh("ip link del " + veth_ + " 2>/dev/null; ip netns del " + ns_ + " 2>/dev/null; true");
  }

  std::string n_, ns_, veth_, gateway_, script_;
  bool made_ = false;
};

// Sandboxes made through the API, deleted when this goes out of scope.
class Sandboxes {
 public:
  explicit Sandboxes(HttpClient& http) : http_(http) {}
  Sandboxes(const Sandboxes&) = delete;
  ~Sandboxes() {
    for (const std::string& id : ids_) {
      auto deleted = http_.Request("DELETE", "/v1/sandboxes/" + id);
      if (!deleted || deleted->status != 204)
        std::fprintf(stderr, "%s: deleting %s failed\n", kTag, id.c_str());
    }
  }

  // Creates one with `network` and puts the client in its /tmp; its id.
  Result<std::string> Create(const json& network) {
    auto created = http_.Request("POST", "/v1/sandboxes", json{{"network", network}}.dump());
    if (!created) return std::unexpected(created.error());
    const json doc = json::parse(created->body, nullptr, false);
    if (created->status != 201 || !doc.is_object() || !doc.contains("id")) {
      return airlock::Fail(ErrorCode::kInternal, "creating a sandbox: " +
                                                     std::to_string(created->status) + " " +
                                                     created->body);
    }
    ids_.push_back(doc["id"].get<std::string>());
    auto put = Exec(ids_.back(), "cat > /tmp/netbench.py <<'EOF'\n" + std::string(kClient) + "EOF\n");
    if (!put) return std::unexpected(put.error());
    return ids_.back();
  }

  // Runs `cmd` (sh) in the sandbox; its stdout, or an error unless it exits 0.
  Result<std::string> Exec(const std::string& id, const std::string& cmd) {
    auto r = http_.Request("POST", "/v1/sandboxes/" + id + "/exec",
                           json{{"cmd", cmd}, {"timeout_seconds", 600}}.dump());
    if (!r) return std::unexpected(r.error());
    const json doc = json::parse(r->body, nullptr, false);
    if (r->status != 200 || !doc.is_object() || doc.value("exit_code", -1) != 0) {
      return airlock::Fail(ErrorCode::kInternal, "exec in " + id + ": " + std::to_string(r->status) +
                                                     " " + r->body.substr(0, 2000));
    }
    return doc.value("stdout", "");
  }

 private:
  HttpClient& http_;
  std::vector<std::string> ids_;
};

// One way out: where the client runs and how it asks.
struct Row {
  std::string name;
  std::string sandbox;  // empty: the host netns
  std::string mode;     // direct | proxy
  std::string address;
  std::string port;
  std::string host = "allowed.test";  // the name asked for
  bool keep = false;                  // all of a batch on one connection
  size_t baseline = 0;                // the row its latency is compared with
  bool throughput = true;             // also in the large-body runs
  std::vector<double> latency_us;
  std::vector<double> mb_per_s;
};

// Parses the client's "US:BYTES ..." and checks each reply's size against the body's.
Status Collect(const std::string& out, uint64_t body, std::vector<double>* us,
               std::vector<double>* mbps) {
  std::istringstream in(out);
  size_t n = 0;
  for (std::string item; in >> item; ++n) {
    const size_t colon = item.find(':');
    const double t = std::strtod(item.c_str(), nullptr);
    const uint64_t bytes = colon == std::string::npos ? 0 : std::strtoull(item.c_str() + colon + 1, nullptr, 10);
    if (bytes < body || bytes > body + 512) {
      return airlock::Fail(ErrorCode::kInternal, "a reply of " + std::to_string(bytes) +
                                                     " bytes for a body of " + std::to_string(body));
    }
    if (us) us->push_back(t);
    if (mbps) mbps->push_back(static_cast<double>(body) / t);
  }
  if (n == 0) return airlock::Fail(ErrorCode::kInternal, "the client printed nothing: " + out);
  return {};
}

int Run(const Flags& flags) {
  const std::string load_before = LoadAverage();
  const std::string n = std::to_string(240 + ::getpid() % 10);  // the tests take 20-219
  airlock::testing::FakeInternet internet(std::stoi(n), /*with_ipv6=*/false);
  if (std::string err = internet.Start(); !err.empty()) {
    std::fprintf(stderr, "%s: the fake internet: %s\n", kTag, err.c_str());
    return 1;
  }
  internet.dns().Set("allowed.test", {.a = {internet.site}});
  internet.dns().Set("nocache.test", {.a = {internet.site}, .ttl = 0});
  b::ScratchDir scratch(kTag);  // removed after the daemon is gone
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  const std::string script = scratch.path() + "/netbench.py";
  {
    std::ofstream out(script);
    out << kClient;
  }
  HostNetns host(n);
  if (auto st = host.Make(script); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  b::DaemonProcess daemon(kTag, g_interrupted);
  std::vector<std::string> args = internet.DaemonArgs();
  // No bandwidth cap: the rows measure the path, not the daemon's default share (1000 Mbit/s).
  args.insert(args.end(), {"--network-id", "nb", "--network-subnet", "10.218." + n + ".0/24",
                           "--network-bandwidth-mbps", "0"});
  if (auto st = daemon.Start(scratch.path() + "/daemon", scratch.path() + "/airlockd.log", args);
      !st) {
    std::fprintf(stderr, "%s: starting airlockd: %s\n--- airlockd log ---\n%s", kTag,
                 st.error().message().c_str(), daemon.LogTail().c_str());
    return g_interrupted.load() ? 130 : 1;
  }
  auto http = HttpClient::Open(daemon.url());
  if (!http) {
    std::fprintf(stderr, "%s: %s\n", kTag, http.error().message().c_str());
    return 1;
  }
  http->set_timeout(std::chrono::minutes(10));
  auto fail = [&](const std::string& what, const airlock::Error& error) {
    std::fprintf(stderr, "%s: %s: %s\n--- end of airlockd log ---\n%s---\n", kTag, what.c_str(),
                 error.message().c_str(), daemon.LogTail().c_str());
    return 1;
  };
  Sandboxes sandboxes(*http);  // deleted before the daemon stops
  auto open = sandboxes.Create({{"mode", "open"}});
  if (!open) return fail("creating the open sandbox", open.error());
  auto allow =
      sandboxes.Create({{"mode", "allowlist"}, {"allow", {"allowed.test", "nocache.test"}}});
  if (!allow) return fail("creating the allowlist sandbox", allow.error());
  auto proxy_env = sandboxes.Exec(*allow, "echo $HTTP_PROXY");
  if (!proxy_env) return fail("reading HTTP_PROXY", proxy_env.error());
  // "http://GATEWAY:PORT\n"
  const std::string proxy = proxy_env->substr(7, proxy_env->find_last_not_of("/\n") - 6);
  const std::string site = internet.site;
  const std::string proxy_address = proxy.substr(0, proxy.find(':'));
  const std::string proxy_port = proxy.substr(proxy.find(':') + 1);
  auto make_row = [](std::string name, std::string sandbox, std::string mode, std::string address,
                     std::string port) {
    Row r;
    r.name = std::move(name);
    r.sandbox = std::move(sandbox);
    r.mode = std::move(mode);
    r.address = std::move(address);
    r.port = std::move(port);
    return r;
  };
  enum { kHost, kOpen, kTransparent, kProxy, kProxyUncached, kHostKeep, kProxyKeep };
  std::vector<Row> rows = {
      make_row("host netns (routed)", "", "direct", site, "80"),
      make_row("open sandbox (NAT)", *open, "direct", site, "80"),
      make_row("allowlist, transparent proxy", *allow, "direct", site, "80"),
      make_row("allowlist, HTTP_PROXY", *allow, "proxy", proxy_address, proxy_port),
      make_row("HTTP_PROXY, uncached name", *allow, "proxy", proxy_address, proxy_port),
      make_row("host netns, keep-alive", "", "direct", site, "80"),
      make_row("HTTP_PROXY, keep-alive", *allow, "proxy", proxy_address, proxy_port),
  };
  rows[kProxyUncached].host = "nocache.test";
  rows[kHostKeep].keep = rows[kProxyKeep].keep = true;
  rows[kHostKeep].baseline = rows[kProxyKeep].baseline = kHostKeep;
  for (size_t i = kProxyUncached; i < rows.size(); ++i) rows[i].throughput = false;
  auto run = [&](Row& row, uint64_t body, int count, bool keep_latency,
                 bool keep_throughput) -> Status {
    const std::string client_args = row.mode + " " + row.address + " " + row.port + " " + row.host +
                                    (row.keep ? " /keep" : " ") + "/bytes/" + std::to_string(body) +
                                    " " + std::to_string(count) + (row.keep ? " keep" : "");
    auto out = row.sandbox.empty()
                   ? host.Client(client_args)
                   : sandboxes.Exec(row.sandbox, "/usr/bin/python3 /tmp/netbench.py " + client_args);
    if (!out) return std::unexpected(out.error().Wrap(row.name));
    Status collected = Collect(*out, body, keep_latency ? &row.latency_us : nullptr,
                               keep_throughput ? &row.mb_per_s : nullptr);
    if (!collected) return std::unexpected(collected.error().Wrap(row.name));
    return {};
  };

  // A warm-up batch of each (discarded), then the batches, the order rotated each turn.
  const uint64_t big = static_cast<uint64_t>(flags.mib) * kMiB;
  std::fprintf(stderr, "%s: latency, %d requests a row in batches of %d...\n", kTag,
               flags.requests, kBatch);
  for (Row& row : rows) {
    if (auto st = run(row, kSmallBody, 10, false, false); !st) return fail("warm-up", st.error());
  }
  for (int turn = 0; turn * kBatch < flags.requests; ++turn) {
    for (size_t k = 0; k < rows.size(); ++k) {
      if (g_interrupted.load()) return 130;
      Row& row = rows[(k + static_cast<size_t>(turn)) % rows.size()];
      if (auto st = run(row, kSmallBody, kBatch, true, false); !st) return fail("latency", st.error());
    }
  }
  std::fprintf(stderr, "%s: throughput, %d repetitions of %d MiB a row...\n", kTag,
               flags.repetitions, flags.mib);
  for (int rep = 0; rep < flags.repetitions; ++rep) {
    for (size_t k = 0; k < rows.size(); ++k) {
      if (g_interrupted.load()) return 130;
      Row& row = rows[(k + static_cast<size_t>(rep)) % rows.size()];
      if (!row.throughput) continue;
      if (auto st = run(row, big, 1, false, true); !st) return fail("throughput", st.error());
    }
  }
  const std::string load_after = LoadAverage();

  std::printf("%s: %u cpus, load average %s before, %s after\n\n", kTag,
              std::thread::hardware_concurrency(), load_before.c_str(), load_after.c_str());
  std::printf("GET of a %llu-byte body, connect (keep-alive: send) to last byte:\n",
              static_cast<unsigned long long>(kSmallBody));
  b::PrintHeader();
  std::vector<b::Summary> latency;
  for (const Row& row : rows) {
    latency.push_back(b::Summarize(row.name, row.latency_us));
    b::Print(latency.back());
  }
  // Each row against its direct baseline (a new connection each: the host netns; keep-alive:
  // the host netns on one connection), then the comparisons the proxy's work is judged by.
  auto ratios = [&](size_t i, size_t base) {
    return json{{"p50", latency[i].p50 / latency[base].p50},
                {"p90", latency[i].p90 / latency[base].p90},
                {"p99", latency[i].p99 / latency[base].p99}};
  };
  auto print_ratio = [&](const std::string& what, size_t i, size_t base) {
    const json r = ratios(i, base);
    std::printf("  %-46s %6.2fx %6.2fx %6.2fx %+9.1f\n", what.c_str(), r["p50"].get<double>(),
                r["p90"].get<double>(), r["p99"].get<double>(), latency[i].p50 - latency[base].p50);
  };
  std::printf(
      "\nratio to the direct baseline:                        p50     p90     p99  p50 +us\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i != rows[i].baseline) print_ratio(rows[i].name, i, rows[i].baseline);
  }
  const std::vector<std::tuple<std::string, size_t, size_t>> comparisons = {
      {"HTTP_PROXY: uncached name / cached", kProxyUncached, kProxy},
      {"HTTP_PROXY: keep-alive / new connections", kProxyKeep, kProxy},
      {"host netns: keep-alive / new connections", kHostKeep, kHost},
  };
  std::printf("\n");
  json doc_comparisons = json::array();
  for (const auto& [what, i, base] : comparisons) {
    print_ratio(what, i, base);
    doc_comparisons.push_back({{"what", what},
                               {"ratio", ratios(i, base)},
                               {"p50_delta_us", latency[i].p50 - latency[base].p50}});
  }
  std::printf("\nGET of %d MiB, MB/s (10^6 bytes/s) over %d runs:\n", flags.mib, flags.repetitions);
  std::printf("%-38s %9s %9s %9s %9s\n", "row", "p50", "min", "max", "vs host");
  json doc_rows = json::array();
  const double host_mb_per_s = b::Summarize(rows[kHost].name, rows[kHost].mb_per_s).p50;
  for (size_t i = 0; i < rows.size(); ++i) {
    json doc_row = {{"name", rows[i].name},
                    {"latency", json::parse(b::Json(latency[i]))},
                    {"baseline", rows[rows[i].baseline].name},
                    {"latency_vs_baseline", ratios(i, rows[i].baseline)}};
    if (rows[i].throughput) {
      const b::Summary t = b::Summarize(rows[i].name, rows[i].mb_per_s);
      std::printf("%-38s %9.1f %9.1f %9.1f %8.2fx\n", rows[i].name.c_str(), t.p50, t.min, t.max,
                  t.p50 / host_mb_per_s);
      doc_row["mb_per_s_p50"] = t.p50;
      doc_row["mb_per_s_min"] = t.min;
      doc_row["mb_per_s_max"] = t.max;
      doc_row["mb_per_s_p50_vs_host"] = t.p50 / host_mb_per_s;
    }
    doc_rows.push_back(std::move(doc_row));
  }
  if (!flags.json_path.empty()) {
    json doc = {{"benchmark", "net"},
                {"quick", flags.quick},
                {"requests", flags.requests},
                {"small_body_bytes", kSmallBody},
                {"large_body_bytes", big},
                {"repetitions", flags.repetitions},
                {"cpus", std::thread::hardware_concurrency()},
                {"load_average_before", load_before},
                {"load_average_after", load_after},
                {"rows", std::move(doc_rows)},
                {"comparisons", std::move(doc_comparisons)}};
    if (!b::WriteResults(kTag, flags.json_path, doc.dump())) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s [--quick] [--requests N] [--mib N] [--repetitions N] "
                 "[--json FILE]\n",
                 kTag, flags.error().message().c_str(), kTag);
    return 2;
  }
  if (std::string missing = airlock::testing::FakeInternet::Missing(); !missing.empty()) {
    std::fprintf(stderr,
                 "%s: %s (it builds network namespaces and veths and runs airlockd with "
                 "nftables)\n",
                 kTag, missing.c_str());
    return 1;
  }
  b::InstallSignalHandlers(kTag);
  return Run(*flags);
}
