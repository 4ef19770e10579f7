// FakeHttpsSites (support/fake_https.h) on 127.0.0.1, talked to by a real TLS client set up the
// way the proxy's upstream side is (UpstreamContext trusting ca_file(), PrepareUpstream; HTTP
// read back by Boost.Beast, so the sites' framing is checked by a parser that is not theirs):
// each behaviour, both framings each way, keep-alive, SNI, the records, the clean-up; and the
// same sites in a network namespace of the test's own (root).

#include "support/fake_https.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/unique_fd.h"

namespace airlock::testing {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Response = http::response<http::string_body>;
using Sites = FakeHttpsSites;

// One TLS connection to the sites, sending SNI `name` and verifying the certificate against
// `verify_as` (default: the same name).
class Client {
 public:
  Client(const Sites& sites, const std::string& name, const std::string& verify_as = "",
         std::shared_ptr<asio::ssl::context> context = nullptr)
      : context_(context ? context : *net::UpstreamContext(sites.ca_file())),
        stream_(io_, *context_) {
    error_code ec;
    stream_.next_layer().connect(
        tcp::endpoint(asio::ip::make_address(sites.address()), sites.port()), ec);
    if (ec) {
      error_ = ec;
      return;
    }
    AIRLOCK_CHECK(
        net::PrepareUpstream(stream_.native_handle(), verify_as.empty() ? name : verify_as)
            .has_value());
    if (!verify_as.empty()) SSL_set_tlsext_host_name(stream_.native_handle(), name.c_str());
    stream_.handshake(asio::ssl::stream_base::client, error_);
  }
  // The connect or handshake's error (none: connected and the certificate verified).
  error_code error() const { return error_; }

  // Sends `raw` as it is and reads one response (error() says when none came).
  Response Send(std::string_view raw) {
    asio::write(stream_, asio::buffer(raw.data(), raw.size()), error_);
    // Interim responses (100 Continue) are read past, as clients do.
    while (!error_) {
      http::response_parser<http::string_body> parser;
      parser.body_limit(64 << 20);
      http::read(stream_, buffer_, parser, error_);
      if (error_ || parser.get().result_int() >= 200) return parser.release();
    }
    return {};
  }
  Response Get(const std::string& target, const std::string& headers = "") {
    return Send("GET " + target + " HTTP/1.1\r\nHost: " + host_ + "\r\n" + headers + "\r\n");
  }
  void set_host(const std::string& host) { host_ = host; }
  asio::ssl::stream<tcp::socket>& stream() { return stream_; }
  // Whether the server closed the connection (read to its end) with nothing more sent.
  bool ClosedByServer() {
    char byte;
    error_code ec;
    stream_.read_some(asio::buffer(&byte, 1), ec);
    return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
  }

 private:
  asio::io_context io_;
  std::shared_ptr<asio::ssl::context> context_;
  asio::ssl::stream<tcp::socket> stream_;
  boost::beast::flat_buffer buffer_;
  std::string host_ = "example.test";
  error_code error_;
};

// Whether `done` becomes true within two seconds: the sites count a handshake on their own thread,
// which may finish after the client's.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 200 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

std::map<std::string, Sites::Behaviour> ThreeSites() {
  return {{"api.test", Sites::Api{"tok-123"}},
          {"echo.test", Sites::Echo{}},
          {"go.test", Sites::Redirect{"https://echo.test/landed"}}};
}

TEST(FakeHttpsSitesTest, ApiWantsTheTokenEveryWay) {
  Sites sites("", "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();
  Client c(sites, "api.test");
  ASSERT_FALSE(c.error()) << c.error().message();
  c.set_host("api.test");
  struct Case {
    std::string headers;
    int status;
    std::string body;
  };
  // "user:tok-123" and "user:wrong" in base64.
  for (const Case& k : std::vector<Case>{
           {"Authorization: Bearer tok-123\r\n", 200, "ok api.test"},
           {"authorization: bearer tok-123\r\n", 200, "ok api.test"},
           {"Authorization: Basic dXNlcjp0b2stMTIz\r\n", 200, "ok api.test"},
           {"X-Api-Key: tok-123\r\n", 200, "ok api.test"},
           {"", 401, "bad token"},
           {"Authorization: Bearer tok-1234\r\n", 401, "bad token"},
           {"Authorization: Bearer\r\n", 401, "bad token"},
           {"Authorization: Basic dXNlcjp3cm9uZw==\r\n", 401, "bad token"},
           {"Authorization: tok-123\r\n", 401, "bad token"},
           {"X-Api-Key: tok-12\r\n", 401, "bad token"},
       }) {
    Response r = c.Get("/v1/thing", k.headers);
    ASSERT_FALSE(c.error()) << k.headers;
    EXPECT_EQ(r.result_int(), k.status) << k.headers;
    EXPECT_EQ(r.body(), k.body) << k.headers;
    EXPECT_EQ(r["X-Fake-Site"], "api.test");
  }
  // All on one connection, each recorded under its SNI.
  EXPECT_EQ(sites.connections(), 1);
  EXPECT_EQ(sites.Requests("api.test"), 10);
  EXPECT_EQ(sites.Requests("echo.test"), 0);
  EXPECT_TRUE(sites.Seen("api.test", "Bearer tok-1234"));
  EXPECT_TRUE(sites.Seen("api.test", "dXNlcjp3cm9uZw=="));
  EXPECT_FALSE(sites.Seen("echo.test", "tok-123"));
  EXPECT_TRUE(sites.SeenAnywhere("tok-123"));
  EXPECT_FALSE(sites.SeenAnywhere("tok-999"));
  const auto recorded = sites.Recorded("api.test");
  ASSERT_EQ(recorded.size(), 10u);
  EXPECT_EQ(recorded[0].method, "GET");
  EXPECT_EQ(recorded[0].target, "/v1/thing");
  EXPECT_EQ(recorded[0].host, "api.test");
  EXPECT_EQ(recorded[0].header_lines,
            (std::vector<std::string>{"Host: api.test", "Authorization: Bearer tok-123"}));
}

TEST(FakeHttpsSitesTest, EchoSendsTheRequestBack) {
  Sites sites("", "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();
  Client c(sites, "echo.test");
  ASSERT_FALSE(c.error()) << c.error().message();

  // A Content-Length body.
  const std::string head =
      "POST /submit?x=1 HTTP/1.1\r\nHost: echo.test\r\nX-Custom:  spaced value \r\n"
      "Content-Length: 11\r\nX-Twice: one\r\nX-Twice: two\r\n\r\n";
  Response r = c.Send(head + "hello world");
  ASSERT_FALSE(c.error()) << c.error().message();
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_EQ(r.body(), head + "hello world");
  EXPECT_TRUE(r.has_content_length());
  EXPECT_EQ(r["X-Echo-Host"], "echo.test");
  EXPECT_EQ(r["X-Echo-X-Custom"], "spaced value");
  EXPECT_EQ(r["X-Echo-Content-Length"], "11");
  std::vector<std::string> twice;
  for (auto it = r.find("X-Echo-X-Twice"); it != r.end() && it->name_string() == "X-Echo-X-Twice";
       ++it) {
    twice.emplace_back(it->value());
  }
  EXPECT_EQ(twice, (std::vector<std::string>{"one", "two"}));

  // A chunked body (an extension, several chunks, a trailer), de-chunked; the response chunked.
  const std::string chunked_head =
      "PUT /up?a=b&chunked=1 HTTP/1.1\r\nHost: echo.test\r\nTransfer-Encoding: chunked\r\n\r\n";
  r = c.Send(chunked_head + "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n");
  ASSERT_FALSE(c.error()) << c.error().message();
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_TRUE(r.chunked());
  EXPECT_FALSE(r.has_content_length());
  EXPECT_EQ(r.body(), chunked_head + "hello 0123456789");
  auto recorded = sites.Recorded("echo.test");
  ASSERT_EQ(recorded.size(), 2u);
  EXPECT_EQ(recorded[1].body, "hello 0123456789");
  EXPECT_EQ(recorded[1].method, "PUT");

  // Expect: 100-continue: the interim answer first, then the response.
  const std::string expect_head =
      "POST /e HTTP/1.1\r\nHost: echo.test\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
  r = c.Send(expect_head + "abc");
  ASSERT_FALSE(c.error()) << c.error().message();
  EXPECT_EQ(r.body(), expect_head + "abc");

  // `chunked=0`, or `xchunked=1`, is no chunked response.
  for (const std::string target : {"/?chunked=0", "/?xchunked=1", "/chunked=1"}) {
    r = c.Get(target);
    EXPECT_FALSE(r.chunked()) << target;
    EXPECT_TRUE(r.has_content_length()) << target;
  }
  r = c.Get("/?q=1&chunked=1");
  EXPECT_TRUE(r.chunked());
  EXPECT_EQ(sites.connections(), 1);

  // A body whose framing is broken: 400, and the connection ends.
  r = c.Send("POST / HTTP/1.1\r\nHost: echo.test\r\nContent-Length: x\r\n\r\n");
  EXPECT_EQ(r.result_int(), 400);
  EXPECT_TRUE(c.ClosedByServer());
}

TEST(FakeHttpsSitesTest, RedirectAndBytes) {
  Sites sites("", "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();
  Client go(sites, "go.test");
  ASSERT_FALSE(go.error()) << go.error().message();
  Response r = go.Get("/anything");
  EXPECT_EQ(r.result_int(), 302);
  EXPECT_EQ(r[http::field::location], "https://echo.test/landed");
  EXPECT_EQ(go.Get("/bytes/10").result_int(), 302);

  Client echo(sites, "echo.test");
  ASSERT_FALSE(echo.error());
  for (const std::string query : {"", "?chunked=1"}) {
    r = echo.Get("/bytes/3000000" + query);
    ASSERT_FALSE(echo.error()) << echo.error().message();
    EXPECT_EQ(r.result_int(), 200);
    EXPECT_EQ(r.chunked(), !query.empty());
    EXPECT_EQ(r.body(), std::string(3000000, '\0'));
  }
  EXPECT_EQ(echo.Get("/bytes/0").body(), "");
  // /bytes/ that is not a number is echoed.
  EXPECT_NE(echo.Get("/bytes/12x").body().find("GET /bytes/12x HTTP/1.1"), std::string::npos);

  // An Api site gives bytes only with the token.
  Client api(sites, "api.test");
  ASSERT_FALSE(api.error());
  EXPECT_EQ(api.Get("/bytes/5").result_int(), 401);
  EXPECT_EQ(api.Get("/bytes/5", "X-Api-Key: tok-123\r\n").body(), std::string(5, '\0'));
}

TEST(FakeHttpsSitesTest, KeepAliveUntilTheClientSaysClose) {
  Sites sites("", "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();
  Client c(sites, "echo.test");
  ASSERT_FALSE(c.error());
  for (int i = 0; i < 5; ++i) {
    Response r = c.Get("/n/" + std::to_string(i) + (i % 2 ? "?chunked=1" : ""));
    ASSERT_FALSE(c.error());
    EXPECT_TRUE(r.keep_alive());
  }
  Response last = c.Get("/last", "Connection: close\r\n");
  EXPECT_FALSE(last.keep_alive());
  EXPECT_TRUE(c.ClosedByServer());
  EXPECT_EQ(sites.connections(), 1);
  EXPECT_EQ(sites.Requests("echo.test"), 6);

  // HTTP/1.0 is closed after its one response.
  Client old(sites, "echo.test");
  ASSERT_FALSE(old.error());
  Response r = old.Send("GET /old HTTP/1.0\r\nHost: echo.test\r\n\r\n");
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_TRUE(old.ClosedByServer());
}

TEST(FakeHttpsSitesTest, EachNameHasItsOwnLeafChosenBySni) {
  Sites sites("", "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();
  // SNI api.test, checked as echo.test: api.test's leaf does not name it.
  Client mismatched(sites, "api.test", "echo.test");
  EXPECT_TRUE(mismatched.error());
  // A name the sites do not serve, or no SNI at all: no handshake.
  Client unknown(sites, "other.test");
  EXPECT_TRUE(unknown.error());
  Client addressed(sites, "127.0.0.1");
  EXPECT_TRUE(addressed.error());
  // A client that trusts only the system's store: the sites' CA is their own.
  Client untrusting(sites, "api.test", "", *net::UpstreamContext(""));
  EXPECT_TRUE(untrusting.error());
  // Each name with its own leaf (the controls).
  for (const std::string name : {"api.test", "echo.test", "go.test"}) {
    Client c(sites, name);
    EXPECT_FALSE(c.error()) << name << ": " << c.error().message();
  }
  EXPECT_EQ(sites.connections(), 7);
  EXPECT_TRUE(Eventually([&] { return sites.handshakes() == 3; })) << sites.handshakes();
  EXPECT_EQ(sites.Recorded().size(), 0u);
}

TEST(FakeHttpsSitesTest, TheDestructorCleansUp) {
  std::string ca_file;
  uint16_t port = 0;
  std::optional<Client> open;
  {
    Sites sites("", "127.0.0.1", 0, ThreeSites());
    ASSERT_TRUE(sites.ok()) << sites.error();
    ca_file = sites.ca_file();
    port = sites.port();
    EXPECT_TRUE(std::filesystem::exists(ca_file));
    // A connection left open mid-request does not hold the destructor up.
    open.emplace(sites, "echo.test");
    ASSERT_FALSE(open->error());
    const std::string partial =
        "POST / HTTP/1.1\r\nHost: echo.test\r\nContent-Length: 100\r\n\r\nabc";
    asio::write(open->stream(), asio::buffer(partial));
    ASSERT_TRUE(Eventually([&] { return sites.handshakes() == 1; }));
  }
  EXPECT_TRUE(open->ClosedByServer());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(ca_file).parent_path()));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
}

TEST(FakeHttpsSitesTest, BadSettingsSayWhy) {
  Sites bad_address("", "not-an-address", 0, ThreeSites());
  EXPECT_FALSE(bad_address.ok());
  EXPECT_NE(bad_address.error().find("is not an address"), std::string::npos);
  Sites bad_name("", "127.0.0.1", 0, {{"*.wild.test", Sites::Echo{}}});
  EXPECT_FALSE(bad_name.ok());
  Sites bad_namespace("/nonexistent/ns", "127.0.0.1", 0, ThreeSites());
  EXPECT_FALSE(bad_namespace.ok());
  EXPECT_NE(bad_namespace.error().find("/nonexistent/ns"), std::string::npos);
}

TEST(FakeHttpsSitesTest, OnIpv6Loopback) {
  Sites sites("", "::1", 0, ThreeSites());
  if (!sites.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << sites.error();
  Client c(sites, "api.test");
  ASSERT_FALSE(c.error()) << c.error().message();
  EXPECT_EQ(c.Get("/", "X-Api-Key: tok-123\r\n").body(), "ok api.test");
}

TEST(FakeHttpsSitesTest, InANetworkNamespace) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace)";
  if (::access("/usr/sbin/ip", X_OK) != 0 && ::access("/sbin/ip", X_OK) != 0) {
    GTEST_SKIP() << "ip (iproute2) is not installed";
  }
  const std::string ns = "airlock-fake-https-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("ip netns add " + ns + " && ip -n " + ns + " link set lo up").c_str()), 0);
  ScopeExit remove([&] { (void)std::system(("ip netns del " + ns).c_str()); });
  Sites sites("/run/netns/" + ns, "127.0.0.1", 0, ThreeSites());
  ASSERT_TRUE(sites.ok()) << sites.error();

  // From this namespace the port is nobody's (or someone else's): the sites see nothing.
  Client outside(sites, "api.test");
  EXPECT_TRUE(outside.error());
  EXPECT_EQ(sites.connections(), 0);

  // From a thread in the namespace, they answer.
  std::string body, error;
  std::thread([&] {
    UniqueFd fd(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd || ::setns(fd.get(), CLONE_NEWNET) != 0) {
      error = "setns failed";
      return;
    }
    Client inside(sites, "api.test");
    if (inside.error()) {
      error = inside.error().message();
      return;
    }
    body = inside.Get("/", "Authorization: Bearer tok-123\r\n").body();
  }).join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(body, "ok api.test");
  EXPECT_EQ(sites.connections(), 1);
  EXPECT_TRUE(sites.Seen("api.test", "Bearer tok-123"));
}

}  // namespace
}  // namespace airlock::testing
