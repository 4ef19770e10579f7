// The egress proxy with secrets bound (docs/design/credentials.md): TLS to a bound host is
// terminated with the daemon's CA, the value put in for the placeholder, the answer scrubbed.
// Real clients (curl, Python) on this host are the sandbox; HTTPS sites on 127.0.0.1 with a CA
// of their own are the internet (support/fake_https.h); the proxy resolves the test names to
// them. Every rule that refuses is tried beside the request that differs only in what the rule
// is about, and every test counts where the value went: only to the host it is bound to.

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "net/egress_proxy.h"
#include "net/tls_authority.h"
#include "support/fake_https.h"

namespace airlock::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using airlock::testing::FakeHttpsSites;

constexpr std::string_view kGithub = "ghp_THE-REAL-GITHUB-VALUE";
constexpr std::string_view kOther = "other-REAL-VALUE-9f8e";
constexpr std::string_view kEcho = "echo-REAL-VALUE-77aa";
constexpr std::string_view kInjected = "sk-REAL-HEADER-VALUE";

struct Ran {
  int exit = -1;
  std::string out;
};

// A shell command's exit status and its stdout (and stderr, with 2>&1 in `cmd`).
Ran Shell(const std::string& cmd) {
  Ran r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class InterceptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("airlock-intercept-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    sites_ = std::make_unique<FakeHttpsSites>(
        "", "127.0.0.1", 0,
        std::map<std::string, FakeHttpsSites::Behaviour>{
            {"api.test", FakeHttpsSites::Api{std::string(kGithub)}},
            {"header.test", FakeHttpsSites::Api{std::string(kInjected)}},
            {"echo.test", FakeHttpsSites::Echo{}},
            {"other.test", FakeHttpsSites::Echo{}},
            {"free.test", FakeHttpsSites::Echo{}},
            {"redirect.test", FakeHttpsSites::Redirect{"https://other.test:{port}/landed"}}});
    ASSERT_TRUE(sites_->ok()) << sites_->error();
    port_ = std::to_string(sites_->port());
    // A host GH is bound to whose certificate comes from a CA the proxy does not trust: an
    // impostor where the name resolves.
    impostor_ = std::make_unique<FakeHttpsSites>(
        "", "127.0.0.1", 0,
        std::map<std::string, FakeHttpsSites::Behaviour>{{"impostor.test", FakeHttpsSites::Echo{}}});
    ASSERT_TRUE(impostor_->ok()) << impostor_->error();
    auto ca = CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca) << ca.error().message();
    ca_ = std::move(*ca);
    // What a sandbox with secrets trusts: the daemon's CA beside the internet's (here, the
    // sites' own CA stands for the system's bundle).
    ca_file_ = (dir_ / "bundle.pem").string();
    {
      std::ifstream sites_ca(sites_->ca_file());
      std::ofstream(ca_file_) << ca_->certificate_pem() << sites_ca.rdbuf();
    }
    auto upstream = UpstreamContext(sites_->ca_file());
    ASSERT_TRUE(upstream) << upstream.error().message();

    auto policy = NetworkPolicy::FromJson(nlohmann::json::parse(
        R"({"mode": "allowlist", "allow": ["api.test", "header.test", "echo.test",
            "other.test", "free.test", "redirect.test", "plain.test", "impostor.test"]})"));
    ASSERT_TRUE(policy) << policy.error().message();
    policy->TreatLoopbackAsPublicForTests();
    auto bindings = ParseSecretBindings(nlohmann::json::parse(R"([
        {"name": "GH", "hosts": ["api.test", "impostor.test"], "env": "GITHUB_TOKEN"},
        {"name": "HDR", "hosts": ["header.test"],
         "inject": {"header": "Authorization", "format": "Bearer {value}"}},
        {"name": "ECHO", "hosts": ["echo.test"]},
        {"name": "OTHER", "hosts": ["other.test"]}])"),
                                        {}, NewPlaceholder);
    ASSERT_TRUE(bindings) << bindings.error().message();
    for (const SecretBinding& b : *bindings) placeholder_[b.secret] = b.placeholder;
    policy->SetSecrets(std::move(*bindings));
    policy_ = std::move(*policy);
    values_ = {{"GH", std::string(kGithub)},
               {"HDR", std::string(kInjected)},
               {"ECHO", std::string(kEcho)},
               {"OTHER", std::string(kOther)}};

    ProxyHooks hooks;
    hooks.policy_for = [this](const IpAddress&) -> std::optional<NetworkPolicy> {
      std::lock_guard lock(mu_);
      return policy_;
    };
    hooks.resolve = [](const std::string& name) -> Result<std::vector<IpAddress>> {
      if (name.ends_with(".test"))
        return std::vector<IpAddress>{asio::ip::make_address("127.0.0.1")};
      return Fail(ErrorCode::kNotFound, "NXDOMAIN");
    };
    hooks.on_event = [this](const EgressEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
    // Transparent connections: those that come from a port a test registered (curl
    // --local-port), as nftables would have redirected them, going to an address the proxy
    // must never dial in allowlist mode.
    hooks.original_destination = [this](tcp::socket& s) -> std::optional<tcp::endpoint> {
      boost::system::error_code ec;
      const tcp::endpoint peer = s.remote_endpoint(ec);
      if (ec || peer.port() < kTransparentPorts || peer.port() >= kTransparentPorts + 100) {
        return std::nullopt;
      }
      return tcp::endpoint(asio::ip::make_address("203.0.113.9"), sites_->port());
    };
    hooks.server_tls = [this](const std::string& host) { return ca_->ServerContext(host); };
    hooks.upstream_tls = *upstream;
    hooks.secret_value = [this](const IpAddress&, const std::string& name) -> Result<std::string> {
      std::lock_guard lock(mu_);
      auto it = values_.find(name);
      if (it == values_.end()) return Fail(ErrorCode::kNotFound, "no secret " + name);
      return it->second;
    };
    auto proxy = EgressProxy::Start(io_, {tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)},
                                    std::move(hooks));
    ASSERT_TRUE(proxy) << proxy.error().message();
    proxy_ = std::move(*proxy);
    thread_ = std::thread([this] { io_.run(); });
    proxy_url_ = "http://127.0.0.1:" + std::to_string(proxy_->port());
  }

  void TearDown() override {
    if (proxy_) proxy_->Stop();
    work_.reset();
    if (thread_.joinable()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      io_.stop();
      thread_.join();
    }
    proxy_.reset();
    sites_.reset();
    impostor_.reset();
    std::filesystem::remove_all(dir_);
  }

  // curl through the proxy (CONNECT), trusting the daemon's CA and the internet's, or (trust
  // false) the internet's only; the status on the last line.
  Ran Curl(const std::string& args, bool trust = true) {
    return Shell("curl -sS --max-time 10 --noproxy '' -x " + proxy_url_ + " --cacert " +
                 (trust ? ca_file_ : sites_->ca_file()) + " -w '\\n%{http_code}' " + args +
                 " 2>&1");
  }
  // curl as a sandbox that dialled port 443 itself: its connection arrives at the proxy as a
  // redirected one (from a local port registered as transparent).
  Ran CurlTransparent(const std::string& host, const std::string& args) {
    return Shell("curl -sS --max-time 10 --noproxy '*' --cacert " + ca_file_ + " --local-port " +
                 std::to_string(kTransparentPorts) + "-" + std::to_string(kTransparentPorts + 99) +
                 " --connect-to " + host + ":" + port_ + ":127.0.0.1:" +
                 std::to_string(proxy_->port()) + " -w '\\n%{http_code}' " + args + " 2>&1");
  }
  std::string Url(const std::string& host, const std::string& path = "/") {
    return "https://" + host + ":" + port_ + path;
  }
  static std::string Status(const Ran& r) {
    const size_t nl = r.out.rfind('\n');
    return nl == std::string::npos ? r.out : r.out.substr(nl + 1);
  }
  // The events that refused something by `rule`, once there are at least `least` of them or 5 s
  // have passed (a refusal the client did not wait for, a failed handshake, is recorded after
  // the client is gone).
  std::vector<EgressEvent> Refusals(const std::string& rule, size_t least = 1) {
    std::unique_lock lock(mu_);
    std::vector<EgressEvent> out;
    cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      out.clear();
      for (const EgressEvent& e : events_) {
        if (!e.allowed && e.phase == EgressEvent::Phase::kVerdict && e.rule == rule) {
          out.push_back(e);
        }
      }
      return out.size() >= least;
    });
    return out;
  }
  // No event, no answer to a client, nothing any site saw but `allowed_site` holds `value`.
  void ExpectValueOnlyAt(std::string_view value, const std::string& allowed_site,
                         const std::string& client_output) {
    EXPECT_EQ(client_output.find(value), std::string::npos) << client_output;
    for (const std::string site :
         {"api.test", "header.test", "echo.test", "other.test", "free.test", "redirect.test"}) {
      if (site != allowed_site) {
        EXPECT_FALSE(sites_->Seen(site, value)) << site;
      }
    }
    EXPECT_FALSE(impostor_->SeenAnywhere(value));
    std::lock_guard lock(mu_);
    for (const EgressEvent& e : events_) {
      for (const std::string* text : {&e.name, &e.host, &e.reason, &e.secrets}) {
        EXPECT_EQ(text->find(value), std::string::npos) << *text;
      }
    }
  }

  static constexpr uint16_t kTransparentPorts = 47100;
  std::filesystem::path dir_;
  std::unique_ptr<FakeHttpsSites> sites_, impostor_;
  std::string port_;
  std::unique_ptr<CertificateAuthority> ca_;
  std::string ca_file_;
  std::map<std::string, std::string> placeholder_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::unique_ptr<EgressProxy> proxy_;
  std::thread thread_;
  std::string proxy_url_;
  std::mutex mu_;
  std::condition_variable cv_;
  NetworkPolicy policy_;
  std::map<std::string, std::string> values_;
  std::vector<EgressEvent> events_;
};

TEST_F(InterceptTest, ThePlaceholderBecomesTheValueForItsHostOnly) {
  const std::string ph = placeholder_["GH"];
  // Bearer, a custom header, Basic credentials: each reaches the bound host as the value.
  for (const std::string& how : {"-H 'Authorization: Bearer " + ph + "'",
                                 "-H 'X-Api-Key: " + ph + "'", "-u 'x-access-token:" + ph + "'"}) {
    Ran r = Curl(how + " " + Url("api.test", "/user"));
    EXPECT_EQ(Status(r), "200") << how << "\n" << r.out;
    EXPECT_NE(r.out.find("ok api.test"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sites_->Requests("api.test"), 3);
  EXPECT_TRUE(sites_->Seen("api.test", kGithub));
  EXPECT_FALSE(sites_->Seen("api.test", ph));  // replaced, not sent beside
  // The control: without the placeholder the host refuses (the value came from the proxy).
  Ran bare = Curl("-H 'Authorization: Bearer nothing' " + Url("api.test", "/user"));
  EXPECT_EQ(Status(bare), "401") << bare.out;
  // Each injection is on record, by name, with method, path and status, never the value.
  {
    std::lock_guard lock(mu_);
    int injected = 0;
    for (const EgressEvent& e : events_) {
      if (e.secrets == "GH") {
        ++injected;
        EXPECT_TRUE(e.allowed);
        EXPECT_EQ(e.name, "api.test");
        EXPECT_EQ(e.reason, "secret GH injected: GET /user -> 200");
      }
    }
    EXPECT_EQ(injected, 3);
  }
  ExpectValueOnlyAt(kGithub, "api.test", "");
}

TEST_F(InterceptTest, TheBindingsHeaderIsSetWithoutTheClientWritingAnything) {
  Ran r = Curl(Url("header.test", "/v1/models"));
  EXPECT_EQ(Status(r), "200") << r.out;
  // The client's own Authorization is replaced, not kept beside.
  Ran replaced = Curl("-H 'Authorization: Bearer mine' " + Url("header.test", "/v1/models"));
  EXPECT_EQ(Status(replaced), "200") << replaced.out;
  EXPECT_FALSE(sites_->Seen("header.test", "Bearer mine"));
  ExpectValueOnlyAt(kInjected, "header.test", r.out + replaced.out);
}

TEST_F(InterceptTest, TransparentTlsIsInterceptedByItsServerName) {
  // The sandbox dialled the host itself (no proxy variables): SNI api.test, redirected here.
  Ran r = CurlTransparent("api.test", "-H 'Authorization: Bearer " + placeholder_["GH"] + "' " +
                                          Url("api.test", "/user"));
  EXPECT_EQ(Status(r), "200") << r.out;
  EXPECT_TRUE(sites_->Seen("api.test", kGithub));
  // The original destination (203.0.113.9) was never dialled: the proxy resolved the name.
  ExpectValueOnlyAt(kGithub, "api.test", r.out);
}

TEST_F(InterceptTest, AnEchoGivesBackOnlyThePlaceholder) {
  const std::string ph = placeholder_["ECHO"];
  // In headers (X-Echo-*) and the body, Content-Length and chunked framing, Basic credentials.
  for (const char* query : {"/", "/?chunked=1"}) {
    Ran r = Curl("-i -H 'Authorization: Bearer " + ph + "' -u 'me:" + ph + "' -H 'X-Key: " + ph +
                 "' " + Url("echo.test", query));
    EXPECT_EQ(Status(r), "200") << r.out;
    EXPECT_NE(r.out.find(ph), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(kEcho), std::string::npos) << r.out;
  }
  EXPECT_TRUE(sites_->Seen("echo.test", kEcho));  // the site did get the value
  // A big body that repeats the value across every read boundary comes back clean.
  const std::string file = (dir_ / "body").string();
  {
    std::string body;
    for (int i = 0; i < 20000; ++i) body += ph + "-" + std::to_string(i) + "|";
    std::ofstream(file) << body;
  }
  Ran big =
      Curl("-H 'X-Key: " + ph + "' --data-binary @" + file + " " + Url("echo.test", "/?chunked=1"));
  EXPECT_EQ(Status(big), "200") << big.out.substr(0, 300);
  EXPECT_EQ(big.out.find(kEcho), std::string::npos);
  EXPECT_NE(big.out.find(ph + "-19999|"), std::string::npos);
  ExpectValueOnlyAt(kEcho, "echo.test", big.out);
}

TEST_F(InterceptTest, APlaceholderHeadedForAnotherHostIsRefusedBeforeItLeaves) {
  const std::string gh = placeholder_["GH"];
  // other.test is intercepted (OTHER is bound to it): GH's placeholder there is refused in a
  // header, Basic credentials, the target and the body; the site sees nothing of it.
  for (const std::string& how :
       {"-H 'Authorization: Bearer " + gh + "' " + Url("other.test"),
        "-u 'u:" + gh + "' " + Url("other.test"), Url("other.test", "/?t=" + gh),
        "--data-binary 'aaaa" + gh + "bbbb' " + Url("other.test", "/post")}) {
    Ran r = Curl("-i " + how);
    EXPECT_EQ(Status(r), "403") << how << "\n" << r.out;
    EXPECT_NE(r.out.find("X-Airlock-Deny-Rule: secret"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("secret GH"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(sites_->Seen("other.test", gh));
  EXPECT_GE(Refusals("secret", 4).size(), 4u);
  // The control: OTHER's own placeholder to other.test goes, as its value.
  Ran own = Curl("-H 'Authorization: Bearer " + placeholder_["OTHER"] + "' " + Url("other.test"));
  EXPECT_EQ(Status(own), "200") << own.out;
  EXPECT_TRUE(sites_->Seen("other.test", kOther));
  ExpectValueOnlyAt(kGithub, "api.test", "");
}

TEST_F(InterceptTest, ARedirectToAnotherHostDoesNotTakeTheValueAlong) {
  const std::string gh = placeholder_["GH"];
  // curl --location-trusted sends the same Authorization after the redirect: to other.test,
  // which GH is not bound to, it is refused.
  Ran r =
      Curl("-L --location-trusted -H 'Authorization: Bearer " + gh + "' " + Url("redirect.test"));
  EXPECT_EQ(Status(r), "403") << r.out;
  EXPECT_FALSE(sites_->Seen("other.test", gh));
  ExpectValueOnlyAt(kGithub, "api.test", r.out);
}

TEST_F(InterceptTest, AHostHeaderThatDiffersFromTheServerNameIsRefused) {
  const std::string gh = placeholder_["GH"];
  for (const std::string& host :
       std::vector<std::string>{"other.test", "free.test:" + port_, "api.test:1"}) {
    Ran r = Curl("-i -H 'Host: " + host + "' -H 'Authorization: Bearer " + gh + "' " +
                 Url("api.test", "/user"));
    EXPECT_EQ(Status(r), "403") << host << "\n" << r.out;
    EXPECT_NE(r.out.find("X-Airlock-Deny-Rule: host-mismatch"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sites_->Requests("api.test"), 0);
  // The control: the right Host, written out.
  Ran r = Curl("-H 'Host: api.test:" + port_ + "' -H 'Authorization: Bearer " + gh + "' " +
               Url("api.test", "/user"));
  EXPECT_EQ(Status(r), "200") << r.out;
}

TEST_F(InterceptTest, ATunnelToABoundHostMustCarryTlsToThatHost) {
  // CONNECT api.test, then a ClientHello naming other.test (curl --connect-to keeps the
  // CONNECT's name and sends another SNI): refused; then bytes that are not TLS: refused.
  Ran fronted = Shell("curl -sS --max-time 10 -x " + proxy_url_ + " --cacert " + ca_file_ +
                      " --connect-to other.test:" + port_ + ":api.test:" + port_ + " " +
                      Url("other.test") + " 2>&1");
  EXPECT_NE(fronted.exit, 0) << fronted.out;
  EXPECT_EQ(sites_->Requests("other.test"), 0);
  EXPECT_FALSE(Refusals("sni").empty());
  Ran opaque =
      Shell("curl -sS --max-time 10 -p -x " + proxy_url_ + " http://api.test:" + port_ + "/ 2>&1");
  EXPECT_NE(opaque.exit, 0) << opaque.out;
  EXPECT_FALSE(Refusals("secret").empty());
  EXPECT_EQ(sites_->connections(), 0);
  // The control: the same tunnel with TLS to its own name.
  Ran ok = Curl("-H 'Authorization: Bearer " + placeholder_["GH"] + "' " + Url("api.test"));
  EXPECT_EQ(Status(ok), "200") << ok.out;
}

TEST_F(InterceptTest, AClientThatDoesNotTrustTheCaSendsNothing) {
  Ran r = Curl("-H 'Authorization: Bearer " + placeholder_["GH"] + "' " + Url("api.test"),
               /*trust=*/false);
  EXPECT_NE(Status(r), "200") << r.out;
  EXPECT_EQ(sites_->connections(), 0);  // nothing was dialled for it
  ASSERT_FALSE(Refusals("secret").empty());
  EXPECT_NE(Refusals("secret")[0].reason.find("did not accept the proxy's certificate"),
            std::string::npos);
}

TEST_F(InterceptTest, AHostWhoseCertificateIsNotTrustedGetsNothing) {
  // GH is bound to impostor.test, but the server there has no certificate the proxy trusts
  // (neither the host's store nor the extra CAs): 502, and the handshake is all it ever saw.
  Ran r = Curl("-i -H 'Authorization: Bearer " + placeholder_["GH"] + "' https://impostor.test:" +
               std::to_string(impostor_->port()) + "/");
  EXPECT_EQ(Status(r), "502") << r.out;
  EXPECT_NE(r.out.find("X-Airlock-Deny-Rule: upstream-tls"), std::string::npos) << r.out;
  EXPECT_EQ(impostor_->Requests("impostor.test"), 0);
  EXPECT_FALSE(impostor_->SeenAnywhere(kGithub));
  EXPECT_EQ(impostor_->connections(), 1);  // it was dialled: the refusal is the proxy's
  // The control: the same binding to the host that is who it says it is.
  Ran ok = Curl("-H 'Authorization: Bearer " + placeholder_["GH"] + "' " + Url("api.test"));
  EXPECT_EQ(Status(ok), "200") << ok.out;
}

TEST_F(InterceptTest, ACompressedResponseIsRefused) {
  // The request goes out asking for identity; an answer encoded anyway cannot be scrubbed.
  Ran r = Curl("-i -H 'Accept-Encoding: gzip' " + Url("echo.test", "/gzip"));
  EXPECT_EQ(Status(r), "502") << r.out;
  EXPECT_NE(r.out.find("gzip-encoded"), std::string::npos) << r.out;
  ASSERT_EQ(sites_->Recorded("echo.test").size(), 1u);
  EXPECT_TRUE(sites_->Seen("echo.test", "Accept-Encoding: identity"));
  // The control: the same echo, not encoded.
  Ran plain = Curl(Url("echo.test", "/"));
  EXPECT_EQ(Status(plain), "200") << plain.out;
}

TEST_F(InterceptTest, PlainHttpWithAPlaceholderIsRefused) {
  // To any host, bound or not: the value goes only over TLS the proxy terminates.
  for (const char* host : {"api.test", "plain.test"}) {
    Ran r = Curl("-i -H 'Authorization: Bearer " + placeholder_["GH"] + "' http://" + host + ":" +
                 port_ + "/");
    EXPECT_EQ(Status(r), "403") << r.out;
    EXPECT_NE(r.out.find("plain-HTTP"), std::string::npos) << r.out;
  }
  // The control: no placeholder, the request is dialled (the site speaks TLS: a bad answer).
  Ran r = Curl("-i http://plain.test:" + port_ + "/");
  EXPECT_NE(Status(r), "403") << r.out;
}

TEST_F(InterceptTest, AHostWithoutBindingsPassesThroughUnread) {
  Ran r = Shell("curl -sS --max-time 10 -x " + proxy_url_ + " --cacert " + sites_->ca_file() +
                " -w '\\n%{http_code}' -H 'X-Key: " + placeholder_["GH"] + "' " + Url("free.test") +
                " 2>&1");
  // Its own certificate (from the sites' CA), not the daemon's: nothing was intercepted, and
  // what it carried was the placeholder only.
  EXPECT_EQ(Status(r), "200") << r.out;
  EXPECT_TRUE(sites_->Seen("free.test", placeholder_["GH"]));
  ExpectValueOnlyAt(kGithub, "api.test", r.out);
}

TEST_F(InterceptTest, ARotatedValueIsUsedFromTheNextRequest) {
  const std::string how = "-H 'Authorization: Bearer " + placeholder_["ECHO"] + "' ";
  ASSERT_EQ(Status(Curl(how + Url("echo.test"))), "200");
  {
    std::lock_guard lock(mu_);
    values_["ECHO"] = "echo-ROTATED-VALUE";
  }
  Ran r = Curl(how + Url("echo.test"));
  EXPECT_EQ(Status(r), "200") << r.out;
  EXPECT_TRUE(sites_->Seen("echo.test", "echo-ROTATED-VALUE"));
  EXPECT_EQ(r.out.find("echo-ROTATED-VALUE"), std::string::npos) << r.out;
  // A secret that cannot be had (deleted) refuses the request, it does not send the placeholder.
  {
    std::lock_guard lock(mu_);
    values_.erase("ECHO");
  }
  Ran gone = Curl("-i " + how + Url("echo.test"));
  EXPECT_EQ(Status(gone), "403") << gone.out;
  EXPECT_NE(gone.out.find("secret ECHO cannot be used"), std::string::npos) << gone.out;
}

TEST_F(InterceptTest, PythonThroughTheProxyGetsTheSameTreatment) {
  const std::string script =
      "import os, urllib.request\n"
      "req = urllib.request.Request('" +
      Url("api.test", "/user") +
      "',\n"
      "    headers={'Authorization': 'Bearer ' + os.environ['GITHUB_TOKEN']})\n"
      "print(urllib.request.urlopen(req, timeout=10).read().decode())\n";
  std::ofstream(dir_ / "client.py") << script;
  Ran r = Shell("env -i PATH=/usr/bin:/bin HTTPS_PROXY=" + proxy_url_ +
                " SSL_CERT_FILE=" + ca_file_ + " GITHUB_TOKEN=" + placeholder_["GH"] + " python3 " +
                (dir_ / "client.py").string() + " 2>&1");
  EXPECT_EQ(r.exit, 0) << r.out;
  EXPECT_NE(r.out.find("ok api.test"), std::string::npos) << r.out;
  ExpectValueOnlyAt(kGithub, "api.test", r.out);
}

}  // namespace
}  // namespace airlock::net
