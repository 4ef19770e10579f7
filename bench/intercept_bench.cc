// Intercepted TLS through the egress proxy (docs/design/credentials.md), beside the two ways it
// is judged against, measured in one run on loopback: the proxy and the HTTPS sites of the
// intercept tests (tests/support/fake_https.h) in this process, on 127.0.0.1, and a client of
// its own (OpenSSL, a blocking socket) that opens one connection per mode:
//
//   direct        TLS straight to the site (free.test), trusting the sites' CA: the baseline
//   pass-through  CONNECT free.test (no secret bound) through the proxy, which tunnels the
//                 bytes; TLS inside trusting the sites' CA (so it cannot have been intercepted)
//   intercepted   CONNECT bound.test (a secret bound) through the proxy, which terminates TLS
//                 with a leaf of its CA, puts the value in for the placeholder the client sends
//                 in `Authorization: Bearer`, re-originates TLS to the site (verified), and
//                 scrubs the value out of the response; TLS trusting the proxy's CA only
//
// Both sites are Api sites that want the value: direct and pass-through send it themselves, the
// intercepted client sends only the placeholder, so its 200 means the proxy put the value in.
// Any reply that is not a 200 of the expected size ends the run with status 1; the proxy's own
// count of injections must match the intercepted requests.
//
// Latency: GET /user (the body "ok <site>", 12-13 bytes) on a kept-alive connection per mode,
// from the first byte written to the last byte read, the modes interleaved request by request
// (the order rotated), after a warm-up; p50/p90/p99, and intercepted over pass-through and over
// direct (p50 difference in ms, ratios). The target (issue 21): intercepted - pass-through p50
// <= 2 ms. First request: a fresh connection per sample (TCP connect, CONNECT, TLS handshake,
// GET /user), each phase timed, interleaved. Throughput: GET /bytes/N (--mib) on the kept-alive
// connections, interleaved, MB/s (10^6 bytes/s). Timings are reported, never asserted.
//
//   airlock-bench-intercept [--quick] [--requests N] [--warmup N] [--connections N]
//                           [--mib N] [--repetitions N] [--json FILE]
//
// Defaults: 5000 requests a mode after 200 to warm up, 100 fresh connections, 5 runs of 64 MiB
// (about 5 s here). --quick: 1000 after 100, 20 connections, 2 runs of 32 MiB (about 1 s).
// No root, no daemon: everything is in this process and a temporary directory.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/unique_fd.h"
#include "flags.h"
#include "net/egress_proxy.h"
#include "net/tls_authority.h"
#include "stats.h"
#include "support/fake_https.h"

namespace {

namespace asio = boost::asio;
namespace b = airlock::bench;
namespace fs = std::filesystem;
using airlock::ErrorCode;
using airlock::Result;
using airlock::Status;
using airlock::UniqueFd;
using airlock::testing::FakeHttpsSites;
using nlohmann::json;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr char kTag[] = "airlock-bench-intercept";
constexpr std::string_view kValue = "ghp_BENCH-REAL-VALUE-0123456789abcdefABCD";  // 40 bytes
constexpr char kBound[] = "bound.test";  // a secret bound: intercepted
constexpr char kFree[] = "free.test";    // none: tunnelled
constexpr uint64_t kMiB = 1 << 20;
constexpr double kTargetMs = 2.0;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

std::string SslErrors() {
  std::string out;
  for (unsigned long e; (e = ERR_get_error()) != 0;) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "no OpenSSL error" : out;
}

struct Flags {
  bool quick = false;
  int requests = 5000;    // kept-alive GET /user per mode
  int warmup = 200;       // the same, discarded
  int connections = 100;  // fresh connections per mode
  int mib = 64;           // GET /bytes/N
  int repetitions = 5;    // of it per mode
  std::string json_path;
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  std::optional<int> requests, warmup, connections, mib, repetitions;
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
      st = number(1, 1000000, requests);
    } else if (arg == "--warmup") {
      st = number(0, 100000, warmup);
    } else if (arg == "--connections") {
      st = number(1, 100000, connections);
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
    flags.requests = 1000;
    flags.warmup = 100;
    flags.connections = 20;
    flags.mib = 32;
    flags.repetitions = 2;
  }
  flags.requests = requests.value_or(flags.requests);
  flags.warmup = warmup.value_or(flags.warmup);
  flags.connections = connections.value_or(flags.connections);
  flags.mib = mib.value_or(flags.mib);
  flags.repetitions = repetitions.value_or(flags.repetitions);
  return flags;
}

// A client TLS context that trusts the CA certificates in `ca_file` only.
using SslCtx = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;
Result<SslCtx> ClientContext(const std::string& ca_file) {
  SslCtx ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) return airlock::Fail(ErrorCode::kInternal, "SSL_CTX_new: " + SslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_load_verify_locations(ctx.get(), ca_file.c_str(), nullptr) != 1) {
    return airlock::Fail(ErrorCode::kInternal, "loading " + ca_file + ": " + SslErrors());
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  static const unsigned char kAlpn[] = "\x08http/1.1";
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof kAlpn - 1);
  return ctx;
}

// How a client gets to the site: straight, or through the proxy with CONNECT.
struct Route {
  std::string name;
  SSL_CTX* ctx;        // whom it trusts
  uint16_t dial_port;  // the site's, or the proxy's
  bool connect;        // CONNECT host:site_port first
  std::string host;    // SNI, the certificate's name, Host
  uint16_t site_port;
  std::string authorization;  // "Bearer <value or placeholder>"
};

// Where a fresh connection's time went, microseconds.
struct Phases {
  double connect = 0;    // TCP connect, and CONNECT's 200 through the proxy
  double handshake = 0;  // TLS
};

// One HTTPS client connection (blocking, one thread): GET requests on it, kept alive, each reply
// read by its framing (Content-Length, or chunked as the proxy re-frames intercepted bodies).
class Client {
 public:
  static Result<std::unique_ptr<Client>> Open(const Route& route, Phases* phases = nullptr) {
    auto c = std::unique_ptr<Client>(new Client(route));
    const auto t0 = Clock::now();
    if (auto st = c->Dial(); !st) return std::unexpected(st.error());
    const auto t1 = Clock::now();
    if (auto st = c->Handshake(); !st) return std::unexpected(st.error());
    if (phases) {
      phases->connect = Us(t0, t1);
      phases->handshake = Us(t1, Clock::now());
    }
    return c;
  }
  ~Client() {
    if (ssl_) {
      SSL_shutdown(ssl_.get());  // close_notify, not waiting for the peer's
    }
  }

  struct Reply {
    int status = 0;
    uint64_t body = 0;  // bytes
  };
  // GET `path`; the reply's status and its body's size (the body itself is read and dropped).
  Result<Reply> Get(const std::string& path) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + route_.host + ":" +
                                std::to_string(route_.site_port) +
                                "\r\nUser-Agent: airlock-bench-intercept\r\nAccept: */*\r\n"
                                "Authorization: " +
                                route_.authorization + "\r\n\r\n";
    if (SSL_write(ssl_.get(), request.data(), static_cast<int>(request.size())) !=
        static_cast<int>(request.size())) {
      return Broken("sending the request");
    }
    Reply reply;
    std::string line;
    if (!Line(line)) return Broken("reading the status line");
    if (line.size() < 12 || !line.starts_with("HTTP/1.1 ")) {
      return airlock::Fail(ErrorCode::kInternal, route_.name + ": not an HTTP/1.1 reply: " + line);
    }
    reply.status = std::atoi(line.c_str() + 9);
    std::optional<uint64_t> length;
    bool chunked = false;
    while (true) {
      if (!Line(line)) return Broken("reading the reply's head");
      if (line.empty()) break;
      const size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      if (name == "content-length") length = std::strtoull(value.c_str(), nullptr, 10);
      if (name == "transfer-encoding") chunked = value == "chunked";
      if (name == "connection" && value == "close") {
        return airlock::Fail(ErrorCode::kInternal, route_.name + ": the connection is not kept");
      }
    }
    if (chunked) {
      while (true) {
        if (!Line(line)) return Broken("reading a chunk's size");
        const uint64_t size = std::strtoull(line.c_str(), nullptr, 16);
        if (size == 0) break;
        if (!Skip(size) || !Line(line) || !line.empty()) return Broken("reading a chunk");
        reply.body += size;
      }
      while (true) {  // trailers, up to the empty line
        if (!Line(line)) return Broken("reading the trailers");
        if (line.empty()) break;
      }
    } else if (length) {
      if (!Skip(*length)) return Broken("reading the body");
      reply.body = *length;
    } else {
      return airlock::Fail(ErrorCode::kInternal, route_.name + ": a reply without framing");
    }
    return reply;
  }

 private:
  explicit Client(Route route) : route_(std::move(route)), ssl_(nullptr, SSL_free) {}

  Status Dial() {
    fd_.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_) return airlock::FailErrno("socket", errno);
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval limit{30, 0};  // a stuck run fails instead of hanging
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(route_.dial_port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return airlock::FailErrno(route_.name + ": connect", errno);
    }
    if (!route_.connect) return {};
    const std::string authority = route_.host + ":" + std::to_string(route_.site_port);
    const std::string connect =
        "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n";
    if (::send(fd_.get(), connect.data(), connect.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(connect.size())) {
      return airlock::FailErrno(route_.name + ": sending CONNECT", errno);
    }
    // Nothing follows the proxy's answer until the ClientHello goes: read it whole.
    std::string head;
    char buf[1024];
    while (head.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n <= 0) {
        return airlock::Fail(ErrorCode::kInternal,
                             route_.name + ": the proxy closed after CONNECT: " + head);
      }
      head.append(buf, static_cast<size_t>(n));
    }
    if (!head.starts_with("HTTP/1.1 200 ") || head.find("\r\n\r\n") + 4 != head.size()) {
      return airlock::Fail(ErrorCode::kInternal, route_.name + ": CONNECT answered " + head);
    }
    return {};
  }

  Status Handshake() {
    ssl_.reset(SSL_new(route_.ctx));
    if (!ssl_ || SSL_set_fd(ssl_.get(), fd_.get()) != 1 ||
        SSL_set_tlsext_host_name(ssl_.get(), route_.host.c_str()) != 1 ||
        SSL_set1_host(ssl_.get(), route_.host.c_str()) != 1) {
      return airlock::Fail(ErrorCode::kInternal, route_.name + ": SSL setup: " + SslErrors());
    }
    if (SSL_connect(ssl_.get()) != 1) {
      const long verify = SSL_get_verify_result(ssl_.get());
      return airlock::Fail(
          ErrorCode::kInternal,
          route_.name + ": TLS handshake: " +
              (verify != X509_V_OK ? X509_verify_cert_error_string(verify) : SslErrors()));
    }
    return {};
  }

  std::unexpected<airlock::Error> Broken(const std::string& what) {
    return airlock::Fail(ErrorCode::kInternal, route_.name + ": " + what +
                                                   ": the connection broke (" + SslErrors() + ")");
  }

  // Reads more into in_; false at the end of the connection or an error.
  bool Fill() {
    if (pos_ > 0 && pos_ == in_.size()) {
      in_.clear();
      pos_ = 0;
    } else if (pos_ > 64 * 1024) {
      in_.erase(0, pos_);
      pos_ = 0;
    }
    const int n = SSL_read(ssl_.get(), buf_, sizeof buf_);
    if (n <= 0) return false;
    in_.append(buf_, static_cast<size_t>(n));
    return true;
  }
  // The next line, without its CRLF.
  bool Line(std::string& line) {
    size_t end;
    while ((end = in_.find("\r\n", pos_)) == std::string::npos) {
      if (in_.size() - pos_ > 64 * 1024 || !Fill()) return false;
    }
    line.assign(in_, pos_, end - pos_);
    pos_ = end + 2;
    return true;
  }
  // Reads and drops `n` bytes: what is buffered first, then straight from the connection.
  bool Skip(uint64_t n) {
    const uint64_t buffered = std::min<uint64_t>(n, in_.size() - pos_);
    pos_ += buffered;
    n -= buffered;
    while (n > 0) {
      const int got =
          SSL_read(ssl_.get(), buf_, static_cast<int>(std::min<uint64_t>(n, sizeof buf_)));
      if (got <= 0) return false;
      n -= static_cast<uint64_t>(got);
    }
    return true;
  }

  Route route_;
  UniqueFd fd_;
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl_;
  std::string in_;
  size_t pos_ = 0;
  char buf_[64 * 1024];
};

// A GET that must be a 200 with a body of `body` bytes.
Status Expect200(Client& client, const Route& route, const std::string& path, uint64_t body) {
  auto reply = client.Get(path);
  if (!reply) return std::unexpected(reply.error());
  if (reply->status != 200 || reply->body != body) {
    return airlock::Fail(ErrorCode::kInternal, route.name + ": GET " + path + " answered " +
                                                   std::to_string(reply->status) + " with " +
                                                   std::to_string(reply->body) +
                                                   " bytes (expected 200 with " +
                                                   std::to_string(body) + ")");
  }
  return {};
}

int Run(const Flags& flags) {
  const std::string load_before = LoadAverage();
  auto fail = [](const std::string& what, const airlock::Error& e) {
    std::fprintf(stderr, "%s: %s: %s\n", kTag, what.c_str(), e.message().c_str());
    return 1;
  };
  // The internet: two Api sites that want the same value.
  FakeHttpsSites sites("", "127.0.0.1", 0,
                       std::map<std::string, FakeHttpsSites::Behaviour>{
                           {kBound, FakeHttpsSites::Api{std::string(kValue)}},
                           {kFree, FakeHttpsSites::Api{std::string(kValue)}}});
  if (!sites.ok()) {
    std::fprintf(stderr, "%s: the HTTPS sites: %s\n", kTag, sites.error().c_str());
    return 1;
  }
  std::string tmpl = (fs::temp_directory_path() / "airlock-bench-intercept-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "%s: mkdtemp failed\n", kTag);
    return 1;
  }
  const fs::path dir = tmpl;
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } remove_dir{dir};

  // The daemon's side: its CA, the upstream context (trusting the sites' CA, as the system's
  // bundle would the internet's), a policy with one secret bound to bound.test.
  auto ca = airlock::net::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  if (!ca) return fail("the CA", ca.error());
  const std::string daemon_ca_file = (dir / "daemon-ca.pem").string();
  std::ofstream(daemon_ca_file) << (*ca)->certificate_pem();
  auto upstream = airlock::net::UpstreamContext(sites.ca_file());
  if (!upstream) return fail("the upstream context", upstream.error());
  auto policy = airlock::net::NetworkPolicy::FromJson(
      json::parse(R"({"mode": "allowlist", "allow": ["bound.test", "free.test"]})"));
  if (!policy) return fail("the policy", policy.error());
  policy->TreatLoopbackAsPublicForTests();
  auto bindings = airlock::net::ParseSecretBindings(
      json::parse(R"([{"name": "TOKEN", "hosts": ["bound.test"], "env": "TOKEN"}])"), {},
      airlock::net::NewPlaceholder);
  if (!bindings) return fail("the bindings", bindings.error());
  const std::string placeholder = bindings->front().placeholder;
  policy->SetSecrets(std::move(*bindings));

  std::atomic<uint64_t> injections{0};
  airlock::net::ProxyHooks hooks;
  hooks.policy_for = [&policy](const airlock::net::IpAddress&) { return *policy; };
  hooks.resolve = [](const std::string& name) -> Result<std::vector<airlock::net::IpAddress>> {
    if (name == kBound || name == kFree) {
      return std::vector<airlock::net::IpAddress>{asio::ip::make_address("127.0.0.1")};
    }
    return airlock::Fail(ErrorCode::kNotFound, "NXDOMAIN");
  };
  hooks.on_event = [&injections](const airlock::net::EgressEvent& e) {
    if (e.allowed && e.secrets == "TOKEN") ++injections;
  };
  airlock::net::CertificateAuthority* authority = ca->get();
  hooks.server_tls = [authority](const std::string& host) {
    return authority->ServerContext(host);
  };
  hooks.upstream_tls = *upstream;
  hooks.secret_value = [](const airlock::net::IpAddress&,
                          const std::string& name) -> Result<std::string> {
    if (name != "TOKEN") return airlock::Fail(ErrorCode::kNotFound, "no secret " + name);
    return std::string(kValue);
  };
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  auto proxy = airlock::net::EgressProxy::Start(
      io, {tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)}, std::move(hooks));
  if (!proxy) return fail("starting the proxy", proxy.error());
  std::thread io_thread([&io] { io.run(); });
  struct StopProxy {
    airlock::net::EgressProxy& proxy;
    asio::io_context& io;
    decltype(work)& guard;
    std::thread& thread;
    ~StopProxy() {
      proxy.Stop();
      guard.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      io.stop();
      thread.join();
    }
  } stop_proxy{**proxy, io, work, io_thread};

  auto sites_ctx = ClientContext(sites.ca_file());
  if (!sites_ctx) return fail("the client context", sites_ctx.error());
  auto daemon_ctx = ClientContext(daemon_ca_file);
  if (!daemon_ctx) return fail("the client context", daemon_ctx.error());
  const std::string bearer_value = "Bearer " + std::string(kValue);
  enum { kDirect, kPass, kIntercepted, kModes };
  const std::vector<Route> routes = {
      {"direct", sites_ctx->get(), sites.port(), false, kFree, sites.port(), bearer_value},
      {"pass-through", sites_ctx->get(), (*proxy)->port(), true, kFree, sites.port(), bearer_value},
      {"intercepted", daemon_ctx->get(), (*proxy)->port(), true, kBound, sites.port(),
       "Bearer " + placeholder},
  };
  const std::string small_path = "/user";
  // An Api site answers "ok <its name>".
  auto small_body = [&](int m) -> uint64_t { return 3 + routes[m].host.size(); };
  uint64_t intercepted_requests = 0;

  // Latency: one kept-alive connection per mode, the modes interleaved request by request.
  std::fprintf(stderr, "%s: latency, %d requests a mode after %d to warm up...\n", kTag,
               flags.requests, flags.warmup);
  std::vector<std::unique_ptr<Client>> clients;
  for (const Route& route : routes) {
    auto client = Client::Open(route);
    if (!client) return fail("opening a connection", client.error());
    clients.push_back(std::move(*client));
  }
  std::vector<std::vector<double>> latency(kModes);
  for (int i = 0; i < flags.warmup + flags.requests; ++i) {
    for (int k = 0; k < kModes; ++k) {
      const int m = (k + i) % kModes;
      const auto t0 = Clock::now();
      if (auto st = Expect200(*clients[m], routes[m], small_path, small_body(m)); !st) {
        return fail("latency", st.error());
      }
      const double us = Us(t0, Clock::now());
      if (i >= flags.warmup) latency[m].push_back(us);
      if (m == kIntercepted) ++intercepted_requests;
    }
  }

  // Throughput: GET /bytes/N on the same connections, interleaved.
  std::fprintf(stderr, "%s: throughput, %d runs of %d MiB a mode...\n", kTag, flags.repetitions,
               flags.mib);
  const uint64_t big = static_cast<uint64_t>(flags.mib) * kMiB;
  const std::string big_path = "/bytes/" + std::to_string(big);
  std::vector<std::vector<double>> mb_per_s(kModes);
  for (int rep = 0; rep < flags.repetitions; ++rep) {
    for (int k = 0; k < kModes; ++k) {
      const int m = (k + rep) % kModes;
      const auto t0 = Clock::now();
      if (auto st = Expect200(*clients[m], routes[m], big_path, big); !st) {
        return fail("throughput", st.error());
      }
      mb_per_s[m].push_back(static_cast<double>(big) / Us(t0, Clock::now()));
      if (m == kIntercepted) ++intercepted_requests;
    }
  }
  clients.clear();

  // First request: a fresh connection each, interleaved.
  std::fprintf(stderr, "%s: first requests, %d fresh connections a mode...\n", kTag,
               flags.connections);
  std::vector<std::vector<double>> first(kModes), first_connect(kModes), first_handshake(kModes),
      first_get(kModes);
  for (int i = 0; i < flags.connections; ++i) {
    for (int k = 0; k < kModes; ++k) {
      const int m = (k + i) % kModes;
      Phases phases;
      const auto t0 = Clock::now();
      auto client = Client::Open(routes[m], &phases);
      if (!client) return fail("first request", client.error());
      const auto t1 = Clock::now();
      if (auto st = Expect200(**client, routes[m], small_path, small_body(m)); !st) {
        return fail("first request", st.error());
      }
      const auto t2 = Clock::now();
      first[m].push_back(Us(t0, t2));
      first_connect[m].push_back(phases.connect);
      first_handshake[m].push_back(phases.handshake);
      first_get[m].push_back(Us(t1, t2));
      if (m == kIntercepted) ++intercepted_requests;
    }
  }
  // The proxy's events come from its thread: give the last one a moment.
  for (int i = 0; i < 100 && injections.load() < intercepted_requests; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (injections.load() != intercepted_requests) {
    std::fprintf(stderr, "%s: the proxy injected the value %llu times for %llu requests\n", kTag,
                 static_cast<unsigned long long>(injections.load()),
                 static_cast<unsigned long long>(intercepted_requests));
    return 1;
  }
  if (sites.Seen(kBound, placeholder) || sites.Seen(kFree, placeholder)) {
    std::fprintf(stderr, "%s: a site saw the placeholder: it was not replaced\n", kTag);
    return 1;
  }
  const std::string load_after = LoadAverage();

  // The report.
  const char* kLabels[] = {"direct (TLS to the site)", "pass-through (CONNECT, tunnel)",
                           "intercepted (CONNECT, TLS x2)"};
  std::printf("%s: %u cpus, load average %s before, %s after\n\n", kTag,
              std::thread::hardware_concurrency(), load_before.c_str(), load_after.c_str());
  std::printf(
      "GET %s on a kept-alive connection (body \"ok <site>\"), first byte sent to last "
      "read:\n",
      small_path.c_str());
  b::PrintHeader();
  std::vector<b::Summary> lat;
  for (int m = 0; m < kModes; ++m) {
    lat.push_back(b::Summarize(kLabels[m], latency[m]));
    b::Print(lat.back());
  }
  auto compare = [&](const std::vector<b::Summary>& s, int i, int base) {
    return json{{"what", routes[i].name + " vs " + routes[base].name},
                {"p50_delta_ms", (s[i].p50 - s[base].p50) / 1000},
                {"p50_ratio", s[i].p50 / s[base].p50},
                {"p90_ratio", s[i].p90 / s[base].p90},
                {"p99_ratio", s[i].p99 / s[base].p99}};
  };
  auto print_comparisons = [&](const std::vector<b::Summary>& s, json& into) {
    std::printf("\n%-34s %10s %9s %9s %9s\n", "overhead", "p50 +ms", "p50", "p90", "p99");
    for (auto [i, base] : {std::pair{kIntercepted, kPass}, std::pair{kIntercepted, kDirect},
                           std::pair{kPass, kDirect}}) {
      const json c = compare(s, i, base);
      std::printf("  %-32s %+10.3f %8.2fx %8.2fx %8.2fx\n", c["what"].get<std::string>().c_str(),
                  c["p50_delta_ms"].get<double>(), c["p50_ratio"].get<double>(),
                  c["p90_ratio"].get<double>(), c["p99_ratio"].get<double>());
      into.push_back(c);
    }
  };
  json latency_comparisons = json::array();
  print_comparisons(lat, latency_comparisons);
  const double overhead_ms = (lat[kIntercepted].p50 - lat[kPass].p50) / 1000;
  const bool met = overhead_ms <= kTargetMs;
  std::printf(
      "\ntarget: intercepted - pass-through p50 <= %.0f ms a request on a kept-alive "
      "connection: %s (%.3f ms)\n",
      kTargetMs, met ? "met" : "MISSED", overhead_ms);

  std::printf(
      "\nfirst request on a fresh connection (connect, CONNECT, TLS handshake, GET %s), "
      "%d a mode:\n",
      small_path.c_str(), flags.connections);
  b::PrintHeader();
  std::vector<b::Summary> fresh;
  for (int m = 0; m < kModes; ++m) {
    fresh.push_back(b::Summarize(kLabels[m], first[m]));
    b::Print(fresh.back());
  }
  json first_comparisons = json::array();
  print_comparisons(fresh, first_comparisons);
  std::printf("\n%-34s %12s %12s %12s\n", "p50 of each phase, us", "connect", "handshake",
              "first GET");
  json phases_doc = json::array();
  for (int m = 0; m < kModes; ++m) {
    const double c = b::Summarize("", first_connect[m]).p50;
    const double h = b::Summarize("", first_handshake[m]).p50;
    const double g = b::Summarize("", first_get[m]).p50;
    std::printf("  %-32s %12.1f %12.1f %12.1f\n", routes[m].name.c_str(), c, h, g);
    phases_doc.push_back({{"name", routes[m].name},
                          {"connect_p50_us", c},
                          {"handshake_p50_us", h},
                          {"first_get_p50_us", g}});
  }

  std::printf(
      "\nGET /bytes/%llu (%d MiB) on the kept-alive connection, MB/s (10^6 bytes/s) over "
      "%d runs:\n",
      static_cast<unsigned long long>(big), flags.mib, flags.repetitions);
  std::printf("%-34s %9s %9s %9s %9s\n", "mode", "p50", "min", "max", "vs direct");
  std::vector<b::Summary> tput;
  for (int m = 0; m < kModes; ++m) tput.push_back(b::Summarize(kLabels[m], mb_per_s[m]));
  for (int m = 0; m < kModes; ++m) {
    std::printf("%-34s %9.1f %9.1f %9.1f %8.2fx\n", kLabels[m], tput[m].p50, tput[m].min,
                tput[m].max, tput[m].p50 / tput[kDirect].p50);
  }
  std::printf("  intercepted / pass-through: %.2fx\n", tput[kIntercepted].p50 / tput[kPass].p50);

  if (!flags.json_path.empty()) {
    json modes = json::array();
    for (int m = 0; m < kModes; ++m) {
      modes.push_back({{"name", routes[m].name},
                       {"latency", json::parse(b::Json(lat[m]))},
                       {"first_request", json::parse(b::Json(fresh[m]))},
                       {"mb_per_s_p50", tput[m].p50},
                       {"mb_per_s_min", tput[m].min},
                       {"mb_per_s_max", tput[m].max}});
    }
    json doc = {{"benchmark", "intercept"},
                {"quick", flags.quick},
                {"requests", flags.requests},
                {"warmup", flags.warmup},
                {"connections", flags.connections},
                {"small_path", small_path},
                {"large_body_bytes", big},
                {"repetitions", flags.repetitions},
                {"cpus", std::thread::hardware_concurrency()},
                {"load_average_before", load_before},
                {"load_average_after", load_after},
                {"modes", std::move(modes)},
                {"latency_comparisons", std::move(latency_comparisons)},
                {"first_request_comparisons", std::move(first_comparisons)},
                {"first_request_phases", std::move(phases_doc)},
                {"target_ms", kTargetMs},
                {"overhead_ms", overhead_ms},
                {"target_met", met}};
    std::ofstream out(flags.json_path);
    out << doc.dump() << "\n";
    if (!out) {
      std::fprintf(stderr, "%s: cannot write %s\n", kTag, flags.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s [--quick] [--requests N] [--warmup N] [--connections N] "
                 "[--mib N] [--repetitions N] [--json FILE]\n",
                 kTag, flags.error().message().c_str(), kTag);
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  ::signal(SIGPIPE, SIG_IGN);  // a peer that went away is an error from write, not a signal
  return Run(*flags);
}
