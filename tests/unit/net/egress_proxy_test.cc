// The egress proxy on loopback. Origin servers on 127.0.0.1 stand in for the internet: the
// test's resolve hook maps test names to them, and its policies call
// TreatLoopbackAsPublicForTests so a resolved 127.0.0.1 passes the re-check (production policies
// never do: loopback is on the always-deny list). Transparent connections get an injected
// original destination in 203.0.113.0/24, an address the proxy must never dial. No traffic
// leaves 127.0.0.1.

#include "net/egress_proxy.h"

#include "net/tls_client_hello.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace airlock::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// --- Origin servers: an echo server that records what it got, and a tiny HTTP server ---

struct Origin {
  explicit Origin(asio::io_context& io, bool http_in) : acceptor(io), http(http_in) {
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor.open(ep.protocol());
    acceptor.bind(ep);
    acceptor.listen();
    port = acceptor.local_endpoint().port();
  }
  std::string Received() {
    std::lock_guard lock(mu);
    return received;
  }

  tcp::acceptor acceptor;
  bool http;
  uint16_t port = 0;
  std::atomic<int> connections{0};
  std::mutex mu;
  std::string received;
};

asio::awaitable<void> OriginSession(Origin* o, tcp::socket socket) {
  error_code ec;
  std::vector<char> chunk(16384);
  std::string head;
  while (true) {
    size_t n = co_await socket.async_read_some(asio::buffer(chunk),
                                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    {
      std::lock_guard lock(o->mu);
      o->received.append(chunk.data(), n);
    }
    if (o->http) {
      head.append(chunk.data(), n);
      if (head.find("\r\n\r\n") == std::string::npos) continue;
      static constexpr std::string_view kReply =
          "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world";
      co_await asio::async_write(socket, asio::buffer(kReply),
                                 asio::redirect_error(asio::use_awaitable, ec));
      break;
    }
    co_await asio::async_write(socket, asio::buffer(chunk.data(), n),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
  }
  socket.shutdown(tcp::socket::shutdown_send, ec);
}

asio::awaitable<void> OriginAccept(Origin* o) {
  while (true) {
    error_code ec;
    tcp::socket socket =
        co_await o->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    ++o->connections;
    asio::co_spawn(o->acceptor.get_executor(), OriginSession(o, std::move(socket)),
                   asio::detached);
  }
}

// --- Blocking client sockets ---

struct Fd {
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& other) noexcept : fd(std::exchange(other.fd, -1)) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  int fd;
};

void SendAll(const Fd& s, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(s.fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads until `stop` says so, EOF, an error or 5 s.
std::string ReadUntil(const Fd& s, const std::function<bool(const std::string&)>& stop) {
  std::string out;
  char buf[4096];
  while (!stop(out)) {
    ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}
std::string ReadAll(const Fd& s) {
  return ReadUntil(s, [](const std::string&) { return false; });
}
std::string ReadHead(const Fd& s) {
  return ReadUntil(s, [](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; });
}
std::string ReadN(const Fd& s, size_t n) {
  return ReadUntil(s, [n](const std::string& b) { return b.size() >= n; });
}

// A TLS 1.3-style ClientHello record; `sni` empty: no server_name extension.
std::string ClientHello(const std::string& sni) {
  auto u16 = [](size_t v) { return std::string{static_cast<char>(v >> 8), static_cast<char>(v)}; };
  std::string ext;
  if (!sni.empty()) {
    std::string entry = std::string(1, '\0') + u16(sni.size()) + sni;
    std::string data = u16(entry.size()) + entry;
    ext += u16(0) + u16(data.size()) + data;
  }
  ext += u16(0x2b) + u16(3) + std::string("\x02\x03\x04", 3);  // supported_versions
  std::string body = std::string("\x03\x03", 2) + std::string(32, 'r') + std::string(1, '\0') +
                     u16(2) + std::string("\x13\x01", 2) + std::string("\x01\x00", 2) +
                     u16(ext.size()) + ext;
  std::string hs = std::string(1, '\x01') + std::string(1, '\0') + u16(body.size()) + body;
  return std::string("\x16\x03\x01", 3) + u16(hs.size()) + hs;
}

class EgressProxyTest : public testing::Test {
 protected:
  void SetUp() override {
    echo_ = std::make_unique<Origin>(io_, false);
    echo2_ = std::make_unique<Origin>(io_, false);
    web_ = std::make_unique<Origin>(io_, true);
    for (Origin* o : {echo_.get(), echo2_.get(), web_.get()}) {
      asio::co_spawn(io_, OriginAccept(o), asio::detached);
    }
    SetPolicy(R"({"mode":"allowlist","allow":["a.test","b.test","web.test","tls.test",
                  "rebind.test","pinned.test:)" + std::to_string(echo_->port) + R"("]})");
    names_ = {{"a.test", {"127.0.0.1"}},       {"b.test", {"127.0.0.1"}},
              {"web.test", {"127.0.0.1"}},     {"tls.test", {"127.0.0.1"}},
              {"evil.test", {"127.0.0.1"}},    {"pinned.test", {"127.0.0.1"}},
              {"rebind.test", {"169.254.169.254"}}};
  }

  void StartProxy(ProxyLimits limits = {}, SocketFactory open_socket = {}) {
    ProxyHooks hooks;
    hooks.open_socket = std::move(open_socket);
    hooks.policy_for = [this](const IpAddress& client) -> std::optional<NetworkPolicy> {
      std::lock_guard lock(mu_);
      if (client != asio::ip::make_address("127.0.0.1")) return std::nullopt;
      return policy_;
    };
    hooks.resolve = [this](const std::string& name) -> Result<std::vector<IpAddress>> {
      auto it = names_.find(name);
      if (it == names_.end()) return Fail(ErrorCode::kNotFound, "NXDOMAIN");
      std::vector<IpAddress> out;
      for (const auto& text : it->second) out.push_back(asio::ip::make_address(text));
      return out;
    };
    hooks.on_event = [this](const EgressEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
    hooks.original_destination = [this](tcp::socket& s) -> std::optional<tcp::endpoint> {
      std::lock_guard lock(mu_);
      auto it = originals_.find(s.remote_endpoint().port());
      if (it == originals_.end()) return std::nullopt;
      return it->second;
    };
    auto proxy = EgressProxy::Start(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0),
                                    std::move(hooks), limits);
    ASSERT_TRUE(proxy.has_value()) << proxy.error().message();
    proxy_ = std::move(*proxy);
    thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    if (proxy_) proxy_->Stop();
    asio::post(io_, [this] {
      for (Origin* o : {echo_.get(), echo2_.get(), web_.get()}) o->acceptor.close();
    });
    work_.reset();
    if (thread_.joinable()) {
      // Let Stop close everything, then stop whatever origin sessions remain.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      io_.stop();
      thread_.join();
    }
    proxy_.reset();
  }

  void SetPolicy(const std::string& json_text) {
    auto p = NetworkPolicy::FromJson(nlohmann::json::parse(json_text));
    ASSERT_TRUE(p.has_value()) << p.error().message();
    p->TreatLoopbackAsPublicForTests();
    std::lock_guard lock(mu_);
    policy_ = std::move(*p);
  }

  Fd Dial(std::optional<tcp::endpoint> original = std::nullopt) {
    Fd s(socket(AF_INET, SOCK_STREAM, 0));
    timeval tv{5, 0};
    setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len);
    if (original) {
      std::lock_guard lock(mu_);
      originals_[ntohs(addr.sin_port)] = *original;
    }
    addr.sin_port = htons(proxy_->port());
    EXPECT_EQ(connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return s;
  }

  // A transparent connection that nftables would have redirected from 203.0.113.10:port.
  Fd DialTransparent(uint16_t port) {
    return Dial(tcp::endpoint(asio::ip::make_address("203.0.113.10"), port));
  }

  Fd Connect(const std::string& target, std::string* reply) {
    Fd s = Dial();
    SendAll(s, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
    *reply = ReadHead(s);
    return s;
  }

  // Waits up to 5 s for an event matching `pred`.
  std::optional<EgressEvent> WaitEvent(const std::function<bool(const EgressEvent&)>& pred) {
    std::unique_lock lock(mu_);
    std::optional<EgressEvent> found;
    cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      for (const auto& e : events_) {
        if (pred(e)) {
          found = e;
          return true;
        }
      }
      return false;
    });
    return found;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::unique_ptr<Origin> echo_, echo2_, web_;
  std::unique_ptr<EgressProxy> proxy_;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  NetworkPolicy policy_;
  std::map<std::string, std::vector<std::string>> names_;
  std::map<uint16_t, tcp::endpoint> originals_;
  std::vector<EgressEvent> events_;
};

std::string Port(const Origin& o) { return std::to_string(o.port); }

// The origin counts a connection when its accept completes, which may be just after the proxy
// has answered the client: wait (up to 5 s) for a count that should be reached.
int WaitConnections(const Origin& o, int want) {
  for (int i = 0; i < 500 && o.connections.load() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return o.connections.load();
}

// --- CONNECT ---

TEST_F(EgressProxyTest, ConnectAllowedSplicesBothWays) {
  StartProxy();
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "HTTP/1.1 200 Connection established\r\n\r\n");
  SendAll(s, "ping");
  EXPECT_EQ(ReadN(s, 4), "ping");
  SendAll(s, std::string(100000, 'x'));
  EXPECT_EQ(ReadN(s, 100000).size(), 100000u);
  shutdown(s.fd, SHUT_WR);
  EXPECT_EQ(ReadAll(s), "");  // the origin's EOF comes back through the tunnel
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);

  auto verdict = WaitEvent([](const EgressEvent& e) {
    return e.phase == EgressEvent::Phase::kVerdict && e.name == "a.test";
  });
  ASSERT_TRUE(verdict);
  EXPECT_TRUE(verdict->allowed);
  EXPECT_EQ(verdict->kind, EgressEvent::Kind::kConnect);
  EXPECT_EQ(verdict->rule, "a.test");
  EXPECT_EQ(verdict->client, asio::ip::make_address("127.0.0.1"));
  ASSERT_TRUE(verdict->dest);
  EXPECT_EQ(verdict->dest->to_string(), "127.0.0.1");
  auto closed = WaitEvent([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; });
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->bytes_up, 100004u);
  EXPECT_EQ(closed->bytes_down, 100004u);
}

// With a namespace uplink the daemon hands the proxy a socket factory: every upstream socket
// comes from it, and when it fails nothing is dialled.
TEST_F(EgressProxyTest, UpstreamSocketsComeFromTheFactory) {
  std::atomic<int> made{0};
  StartProxy({}, [&made](int domain, int type) -> Result<UniqueFd> {
    ++made;
    return UniqueFd(socket(domain, type | SOCK_CLOEXEC, 0));
  });
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "HTTP/1.1 200 Connection established\r\n\r\n");
  SendAll(s, "ping");
  EXPECT_EQ(ReadN(s, 4), "ping");
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, AFailingSocketFactoryIs502AndDialsNothing) {
  StartProxy(
      {}, [](int, int) -> Result<UniqueFd> { return Fail(ErrorCode::kUnavailable, "no uplink"); });
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 502")) << reply;
  EXPECT_EQ(echo_->connections.load(), 0);
}

TEST_F(EgressProxyTest, ConnectDeniedAnswers403WithTheReason) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "CONNECT evil.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403 Forbidden\r\n")) << reply;
  EXPECT_NE(reply.find("airlock egress: evil.test:" + Port(*echo_) +
                       " is not in this sandbox's allowlist"),
            std::string::npos)
      << reply;
  EXPECT_EQ(echo_->connections.load(), 0);
  auto denied = WaitEvent([](const EgressEvent& e) { return !e.allowed; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->rule, "allowlist");
  EXPECT_EQ(denied->name, "evil.test");
  // Positive control on the same proxy.
  std::string ok;
  Fd s2 = Connect("A.Test.:" + Port(*echo_), &ok);
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, ConnectToIpLiteralsDenied) {
  StartProxy();
  for (std::string host : {"127.0.0.1", "2130706433", "0x7f000001", "017700000001", "127.1",
                           "[::ffff:127.0.0.1]", "0x7f.1"}) {
    std::string reply;
    Fd s = Connect(host + ":" + Port(*echo_), &reply);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << host << ": " << reply;
  }
  for (std::string host : {"2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518",
                           "[::ffff:a9fe:a9fe]"}) {
    Fd s = Dial();
    SendAll(s, "CONNECT " + host + ":80 HTTP/1.1\r\n\r\n");
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << host << ": " << reply;
    EXPECT_NE(reply.find("metadata endpoint"), std::string::npos) << host << ": " << reply;
  }
  EXPECT_EQ(echo_->connections.load(), 0);
  std::string ok;  // control: the same origin by an allowed name
  Fd s = Connect("a.test:" + Port(*echo_), &ok);
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
}

TEST_F(EgressProxyTest, ConnectToAllowedNameOnAnotherPortDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("pinned.test:" + Port(*echo2_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
  EXPECT_EQ(echo2_->connections.load(), 0);
  Fd s2 = Connect("pinned.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, DnsRebindingToMetadataDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("rebind.test:80", &reply);
  std::string rest = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
  EXPECT_NE((reply + rest).find("resolved to a forbidden address"), std::string::npos)
      << reply << rest;
  auto denied = WaitEvent([](const EgressEvent& e) { return e.name == "rebind.test"; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->rule, "metadata");
  Fd s2 = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
}

TEST_F(EgressProxyTest, UnresolvableNameIs502) {
  StartProxy();
  SetPolicy(R"({"mode":"allowlist","allow":["nowhere.test","a.test"]})");
  std::string reply;
  Fd s = Connect("nowhere.test:443", &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 502")) << reply;
}

TEST_F(EgressProxyTest, ConnectTunnelWithDifferentSniDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("tls.test:" + Port(*echo_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
  SendAll(s, ClientHello("evil.test"));
  EXPECT_EQ(ReadAll(s), "");
  EXPECT_EQ(echo_->Received(), "");
  auto denied = WaitEvent([](const EgressEvent& e) { return !e.allowed && e.rule == "sni"; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->sni, "evil.test");
  // Control: the matching name (in another case) passes and reaches the origin byte for byte.
  Fd s2 = Connect("tls.test:" + Port(*echo_), &reply);
  std::string hello = ClientHello("TLS.test");
  SendAll(s2, hello);
  EXPECT_EQ(ReadN(s2, hello.size()), hello);
}

// --- Absolute-form HTTP ---

TEST_F(EgressProxyTest, AbsoluteFormGetForwardedInOriginForm) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) +
                 "/hello?x=1 HTTP/1.1\r\nHost: web.test:" + Port(*web_) +
                 "\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200 OK")) << reply;
  EXPECT_TRUE(reply.ends_with("hello world"));
  std::string got = web_->Received();
  EXPECT_TRUE(got.starts_with("GET /hello?x=1 HTTP/1.1\r\nHost: web.test:" + Port(*web_) + "\r\n"))
      << got;
  EXPECT_NE(got.find("Accept: */*\r\n"), std::string::npos);
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(got.find("Proxy-Connection"), std::string::npos);
  auto closed = WaitEvent([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; });
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->kind, EgressEvent::Kind::kHttp);
  EXPECT_EQ(closed->bytes_up, got.size());
  EXPECT_EQ(closed->bytes_down, reply.size());
}

TEST_F(EgressProxyTest, AbsoluteFormPostBodyForwarded) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "POST http://web.test:" + Port(*web_) +
                 "/up HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde");
  EXPECT_TRUE(ReadAll(s).starts_with("HTTP/1.1 200 OK"));
  EXPECT_TRUE(web_->Received().ends_with("\r\n\r\nabcde")) << web_->Received();
}

TEST_F(EgressProxyTest, AbsoluteFormDenied) {
  StartProxy();
  for (std::string request :
       {"GET http://evil.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n",
        "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "GET http://web.test@evil.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n",
        "GET http://127.0.0.1:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n"}) {
    Fd s = Dial();
    SendAll(s, request);
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403") || reply.starts_with("HTTP/1.1 400"))
        << request << " -> " << reply;
  }
  EXPECT_EQ(web_->connections.load(), 0);
}

// --- Transparent ---

TEST_F(EgressProxyTest, TransparentHttpByHost) {
  StartProxy();
  Fd s = DialTransparent(web_->port);
  SendAll(s, "GET /x HTTP/1.1\r\nHost: WEB.test\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200 OK")) << reply;
  EXPECT_TRUE(web_->Received().starts_with("GET /x HTTP/1.1\r\nHost: WEB.test\r\n"))
      << web_->Received();

  Fd d = DialTransparent(web_->port);
  SendAll(d, "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n");
  reply = ReadAll(d);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
  // A Host whose port is not the one dialled.
  Fd p = DialTransparent(web_->port);
  SendAll(p, "GET /x HTTP/1.1\r\nHost: web.test:1\r\n\r\n");
  EXPECT_TRUE(ReadAll(p).starts_with("HTTP/1.1 403"));
  // Two Host headers.
  Fd h = DialTransparent(web_->port);
  SendAll(h, "GET /x HTTP/1.1\r\nHost: web.test\r\nHost: evil.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(h).starts_with("HTTP/1.1 400"));
  EXPECT_EQ(WaitConnections(*web_, 1), 1);
}

TEST_F(EgressProxyTest, TransparentTlsBySni) {
  StartProxy();
  Fd s = DialTransparent(echo_->port);
  std::string hello = ClientHello("tls.test");
  SendAll(s, hello);
  EXPECT_EQ(ReadN(s, hello.size()), hello);
  EXPECT_EQ(echo_->Received(), hello);
  auto verdict = WaitEvent([](const EgressEvent& e) { return e.kind == EgressEvent::Kind::kTls; });
  ASSERT_TRUE(verdict);
  EXPECT_TRUE(verdict->allowed);
  EXPECT_EQ(verdict->sni, "tls.test");
  EXPECT_EQ(verdict->dest->to_string(), "127.0.0.1");  // never 203.0.113.10
}

TEST_F(EgressProxyTest, TransparentTlsDeniedSniAndMissingSniClosed) {
  StartProxy();
  for (std::string hello : {ClientHello("evil.test"), ClientHello(""), ClientHello("127.0.0.1"),
                            std::string("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00", 10)}) {
    Fd s = DialTransparent(echo_->port);
    SendAll(s, hello);
    EXPECT_EQ(ReadAll(s), "");
  }
  EXPECT_EQ(echo_->connections.load(), 0);
  Fd ok = DialTransparent(echo_->port);  // control
  std::string hello = ClientHello("tls.test");
  SendAll(ok, hello);
  EXPECT_EQ(ReadN(ok, hello.size()), hello);
}

TEST_F(EgressProxyTest, TransparentTlsSplitAcrossWrites) {
  StartProxy();
  Fd s = DialTransparent(echo_->port);
  std::string hello = ClientHello("tls.test");
  for (char c : hello) {
    SendAll(s, std::string(1, c));
  }
  EXPECT_EQ(ReadN(s, hello.size()), hello);
}

// --- Malformed input and limits ---

TEST_F(EgressProxyTest, GarbageAndOversizedHeadersClosedCleanly) {
  StartProxy();
  Fd g = Dial();
  SendAll(g, std::string("\x01\x02garbage\r\n\r\n", 13));
  EXPECT_TRUE(ReadAll(g).starts_with("HTTP/1.1 400"));
  Fd o = Dial();
  SendAll(o, "GET http://web.test/ HTTP/1.1\r\nX: " + std::string(20000, 'a'));
  EXPECT_TRUE(ReadAll(o).starts_with("HTTP/1.1 431"));
  Fd origin_form = Dial();
  SendAll(origin_form, "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(origin_form).starts_with("HTTP/1.1 400"));
  Fd smuggle = Dial();
  SendAll(smuggle, "GET http://web.test:" + Port(*web_) +
                       "/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  EXPECT_TRUE(ReadAll(smuggle).starts_with("HTTP/1.1 501"));
  Fd bare_lf = Dial();
  SendAll(bare_lf, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\nHost: x\r\n\r\n");
  EXPECT_TRUE(ReadAll(bare_lf).starts_with("HTTP/1.1 400"));
  Fd tls_junk = DialTransparent(echo_->port);
  SendAll(tls_junk, std::string("\x16\x03\x01\xff\xff", 5) + std::string(20000, 'z'));
  EXPECT_EQ(ReadAll(tls_junk), "");
  EXPECT_EQ(web_->connections.load(), 0);
  EXPECT_EQ(echo_->connections.load(), 0);
  // Still serving.
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200"));
}

TEST_F(EgressProxyTest, SilentClientClosedAfterFirstRequestTimeout) {
  ProxyLimits limits;
  limits.first_request_timeout = std::chrono::milliseconds(300);
  StartProxy(limits);
  auto start = std::chrono::steady_clock::now();
  Fd s = Dial();
  EXPECT_EQ(ReadAll(s), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST_F(EgressProxyTest, PerClientConnectionLimit) {
  ProxyLimits limits;
  limits.max_connections_per_client = 3;
  StartProxy(limits);
  std::vector<Fd> tunnels;
  for (int i = 0; i < 3; ++i) {
    std::string reply;
    tunnels.push_back(Connect("a.test:" + Port(*echo_), &reply));
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << i;
  }
  std::string reply;
  Fd over = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "");
  EXPECT_EQ(WaitConnections(*echo_, 3), 3);
}

TEST_F(EgressProxyTest, ModeNoneDeniesEverything) {
  StartProxy();
  {
    std::lock_guard lock(mu_);
    policy_ = NetworkPolicy();  // mode none: everything denied
  }
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
}

// --- Live policy change ---

TEST_F(EgressProxyTest, RecheckClosesTunnelsThePolicyNoLongerAllows) {
  StartProxy();
  std::string reply;
  Fd a = Connect("a.test:" + Port(*echo_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200"));
  Fd b = Connect("b.test:" + Port(*echo2_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200"));
  SendAll(a, "1");
  SendAll(b, "2");
  EXPECT_EQ(ReadN(a, 1), "1");
  EXPECT_EQ(ReadN(b, 1), "2");
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 0u);  // nothing changed

  SetPolicy(R"({"mode":"allowlist","allow":["b.test"]})");
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 1u);
  EXPECT_EQ(ReadAll(a), "");  // closed
  SendAll(b, "still here");
  EXPECT_EQ(ReadN(b, 10), "still here");
  auto event = WaitEvent([](const EgressEvent& e) {
    return !e.allowed && e.name == "a.test" && e.phase == EgressEvent::Phase::kVerdict;
  });
  ASSERT_TRUE(event);
  EXPECT_NE(event->reason.find("policy changed"), std::string::npos);
}

// --- Load ---

TEST_F(EgressProxyTest, TwoHundredConcurrentTunnels) {
  StartProxy();
  std::vector<Fd> tunnels;
  for (int i = 0; i < 200; ++i) {
    Fd s = Dial();
    SendAll(s, "CONNECT a.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
    tunnels.push_back(std::move(s));
  }
  for (auto& s : tunnels) ASSERT_EQ(ReadHead(s), "HTTP/1.1 200 Connection established\r\n\r\n");
  EXPECT_EQ(proxy_->open_connections(), 200u);
  for (size_t i = 0; i < tunnels.size(); ++i) SendAll(tunnels[i], "msg" + std::to_string(i) + ";");
  for (size_t i = 0; i < tunnels.size(); ++i) {
    std::string want = "msg" + std::to_string(i) + ";";
    EXPECT_EQ(ReadN(tunnels[i], want.size()), want);
  }
  EXPECT_EQ(WaitConnections(*echo_, 200), 200);
}

// --- The ClientHello parser on its own ---

TEST(ClientHelloScanTest, PrefixesNeedMoreAndCorruptionIsInvalid) {
  std::string hello = ClientHello("tls.test");
  for (size_t n = 1; n < hello.size(); ++n) {
    ASSERT_EQ(ScanClientHello(hello.substr(0, n)).state, ClientHelloScan::State::kNeedMore) << n;
  }
  auto full = ScanClientHello(hello);
  EXPECT_EQ(full.state, ClientHelloScan::State::kComplete);
  EXPECT_EQ(full.sni, "tls.test");
  // Every single-byte corruption is either caught or still parses; none reads out of bounds.
  for (size_t i = 0; i < hello.size(); ++i) {
    std::string bad = hello;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    (void)ScanClientHello(bad);
  }
  EXPECT_EQ(ScanClientHello("GET / HTTP/1.1").state, ClientHelloScan::State::kInvalid);
}

}  // namespace
}  // namespace airlock::net
