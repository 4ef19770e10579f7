#pragma once
// The egress proxy: the only way out for a sandbox in network mode "allowlist", and the judge of
// name rules for an "open" one whose ports 80 and 443 the firewall redirects here. One listener
// (IPv4, and IPv6 on the same port) serves every sandbox; the client's address says whose policy
// applies.
//
// A connection is one of:
//   - explicit CONNECT host:port (a tunnel; a TLS ClientHello inside must name the same host),
//   - explicit absolute-form HTTP (`GET http://host/path`), forwarded in origin-form; keep-alive:
//     each request on the connection is judged on its own, an upstream connection is reused for
//     the next request to the same host and port,
//   - transparent (nftables redirected the sandbox's port 80/443 here): TLS judged by its SNI,
//     plain HTTP by its Host header, both with the port the client dialled. In allowlist mode the
//     proxy resolves the name and never dials the address the client chose; in open mode it
//     judges the name (if any) and the address the client chose, and dials that address.
// The proxy resolves names itself, re-checks every address (DNS rebinding, metadata). Request
// bodies are framed strictly (Content-Length or chunked, never both) and forwarded in the
// framing the proxy understood. docs/design/network.md has the details.
//
// Threading: the proxy runs on the io_context it is given, which one thread must run. Start,
// Recheck and Stop may be called from any thread. The hooks are called on that thread, except
// `policy_for`, which Recheck also calls on its caller's thread, and `resolve`, which runs on the
// proxy's own small thread pool (it may block).

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "net/policy.h"
#include "net/socket_factory.h"

namespace airlock::net {

// One per decision: a CONNECT, each HTTP request (keep-alive follow-ups too), a transparent TLS
// connection, a refusal of any kind (rule "malformed", "too-large", "resolve", "connect",
// "upstream" for those that are not the policy's), a Recheck. A refusal's `reason` is the text the
// client was sent. kClosed ends each upstream connection that was opened.
struct EgressEvent {
  enum class Kind { kConnect, kHttp, kTls };
  // kVerdict: a decision (also a Recheck's); kClosed: an upstream connection ended, with the
  // bytes through it.
  enum class Phase { kVerdict, kClosed };
  Phase phase = Phase::kVerdict;
  Kind kind = Kind::kConnect;
  IpAddress client;
  std::string name;               // what was checked: the CONNECT host, the request's host, the SNI
  std::string sni;                // the TLS server name seen, if any
  std::string host;               // the HTTP Host header seen, if any
  std::optional<IpAddress> dest;  // the address dialled (or refused)
  uint16_t port = 0;
  bool allowed = false;
  std::string rule;
  std::string reason;
  uint64_t bytes_up = 0;    // sandbox -> destination, as forwarded
  uint64_t bytes_down = 0;  // destination -> sandbox
  // An intercepted request (a host with secrets bound): the secrets whose value went in, comma
  // separated (never a value). Its `reason` says method, path and status.
  std::string secrets;
};
std::string_view KindName(EgressEvent::Kind kind);

// Every refusal an HTTP client gets carries the rule that refused it in this header, and the reason
// (the event's `reason`, word for word) as its one-line text/plain body.
inline constexpr std::string_view kDenyRuleHeader = "X-Airlock-Deny-Rule";

struct ProxyLimits {
  size_t max_header_bytes = 16 * 1024;  // HTTP request head, or TLS ClientHello
  size_t max_response_header_bytes = 64 * 1024;
  std::chrono::milliseconds first_request_timeout{10'000};  // accept -> whole head read
  // A kept-alive client connection: the end of a response -> the next whole request head.
  std::chrono::milliseconds keep_alive_timeout{60'000};
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds idle_timeout{300'000};  // no byte either way
  size_t max_connections_per_client = 256;  // unless the client's policy sets max_connections
  size_t max_connections = 4096;
};

struct ProxyHooks {
  // The policy for a client address (a sandbox's veth address; IPv4-mapped forms are unmapped
  // first). nullopt: not a sandbox, the connection is closed unanswered.
  std::function<std::optional<NetworkPolicy>(const IpAddress& client)> policy_for;
  // Name -> addresses. The daemon passes its resolver; tests pass a map. May block.
  std::function<Result<std::vector<IpAddress>>(const std::string& name)> resolve;
  // Every verdict, and each connection's end with its byte counts. Optional.
  std::function<void(const EgressEvent&)> on_event;
  // Where a redirected connection was going; nullopt: not redirected (an explicit proxy client).
  // Unset: OriginalDestination below. Tests inject one.
  std::function<std::optional<boost::asio::ip::tcp::endpoint>(boost::asio::ip::tcp::socket&)>
      original_destination;
  // Makes the sockets dialled upstream. Unset: socket(2) on the proxy's thread (the daemon's
  // network namespace); a network namespace as the uplink sets it.
  SocketFactory open_socket;
  // Intercepted TLS, for the hosts a sandbox has secrets bound to (docs/design/credentials.md):
  // the context that presents a certificate for `host` to the sandbox, the one that verifies
  // upstream servers, and a secret's value for a client. Unset: such connections are refused.
  std::function<Result<std::shared_ptr<boost::asio::ssl::context>>(const std::string& host)>
      server_tls;
  std::shared_ptr<boost::asio::ssl::context> upstream_tls;
  std::function<Result<std::string>(const IpAddress& client, const std::string& secret)>
      secret_value;
};

class EgressProxy {
 public:
  // Binds and listens on every endpoint of `listen`, all on one port: the first's (0: the kernel
  // picks one, and the others take the same), then accepts on `io`. IPv6 endpoints are IPv6-only
  // (IPv4 clients come through an IPv4 endpoint, unmapped). policy_for and resolve must be set.
  [[nodiscard]] static Result<std::unique_ptr<EgressProxy>> Start(
      boost::asio::io_context& io, const std::vector<boost::asio::ip::tcp::endpoint>& listen,
      ProxyHooks hooks, ProxyLimits limits = {});
  // Stops (as Stop) if still running. Connections end once the io_context runs again or is
  // destroyed.
  ~EgressProxy();
  EgressProxy(const EgressProxy&) = delete;
  EgressProxy& operator=(const EgressProxy&) = delete;

  uint16_t port() const;
  // Closes every open connection of `client` that its current policy (policy_for, asked now) no
  // longer allows, for a live policy change; returns how many. Each gets a kVerdict event.
  size_t Recheck(const IpAddress& client);
  // Closes the listener and every connection. Any thread; takes effect on the io thread.
  void Stop();
  // Connections accepted and not yet closed.
  size_t open_connections() const;

  struct State;

 private:
  explicit EgressProxy(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6): where a connection nftables redirected
// to this socket was going. nullopt when it was not redirected (or the answer is this socket's
// own address: conntrack knows the connection but did not rewrite it).
std::optional<boost::asio::ip::tcp::endpoint> OriginalDestination(
    boost::asio::ip::tcp::socket& socket);

}  // namespace airlock::net
