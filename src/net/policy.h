#pragma once
// A sandbox's network policy: the API's `network` object and the verdicts the egress proxy asks
// of it. Pure functions of their inputs: no I/O, no clock, safe from any thread.
//
//   {"mode": "none" | "allowlist" | "open", "allow": [rule...], "deny": [rule...]}
//
// A rule is a name (`pypi.org`, exact), a wildcard (`*.githubusercontent.com`: any subdomain,
// not the apex) or a CIDR (`203.0.113.0/24`, `2001:db8::/32`), each with an optional port
// (`pypi.org:443`, `203.0.113.0/24:22`, `[2001:db8::/32]:443`). docs/design/network.md has the
// matching rules and the always-deny list.

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "net/credentials.h"

namespace airlock::net {

using IpAddress = boost::asio::ip::address;

inline constexpr size_t kMaxRulesPerList = 256;
inline constexpr size_t kMaxNameBytes = 253;
inline constexpr size_t kMaxLabelBytes = 63;
// Bounds of the per-sandbox limits in the `network` object.
inline constexpr uint32_t kMaxBandwidthMbps = 100'000;
inline constexpr uint32_t kMaxConnectionsLimit = 65'536;

// An address range; the address has no bits set past the prefix.
struct Cidr {
  IpAddress network;
  int prefix = 0;

  // "10.0.0.0/8", "2001:db8::/32": an address, '/', a prefix length; host bits must be zero.
  // A bare address is its own /32 or /128.
  [[nodiscard]] static Result<Cidr> Parse(std::string_view text);
  // False for an address of the other family.
  bool Contains(const IpAddress& ip) const;
  // True when every address of `other` is in this range.
  bool Covers(const Cidr& other) const;
  std::string ToString() const;
  bool operator==(const Cidr&) const = default;
};

enum class NetworkMode { kNone, kAllowlist, kOpen };
std::string_view ModeName(NetworkMode mode);

struct Rule {
  enum class Kind { kExact, kWildcard, kCidr };
  Kind kind = Kind::kExact;
  std::string name;  // normalised; for a wildcard the suffix after "*."
  Cidr cidr;         // kCidr only
  uint16_t port = 0;  // 0: any port
  std::string text;  // the canonical form, as ToJson writes it and verdicts name it

  // One rule as the API spells it; messages do not name the field (the caller adds it).
  [[nodiscard]] static Result<Rule> Parse(std::string_view text);
  bool MatchesName(std::string_view normalised_name, uint16_t dest_port) const;
  bool MatchesAddress(const IpAddress& ip, uint16_t dest_port) const;
};

struct Verdict {
  bool allowed = false;
  std::string rule;    // the matching rule's text, or a built-in rule's name ("metadata", ...)
  std::string reason;  // one sentence for a 403 body or an audit event
};

class NetworkPolicy {
 public:
  NetworkPolicy() = default;  // mode none: no egress at all

  // The API's `network` object. Every failure is kInvalidArgument and names the field and the
  // rule's index: `network.allow[3]: "*.": ...`.
  [[nodiscard]] static Result<NetworkPolicy> FromJson(const nlohmann::json& value);
  // The API fields only (mode, allow, deny), rules in canonical form: FromJson(ToJson()) gives an
  // equal policy. Host-side additions below are not part of it.
  nlohmann::json ToJson() const;

  NetworkMode mode() const { return mode_; }
  const std::vector<Rule>& allow() const { return allow_; }
  const std::vector<Rule>& deny() const { return deny_; }
  // The sandbox's own caps (`bandwidth_mbps`: each direction; `max_connections`: at once), 0 when
  // the request left them to the daemon's defaults (docs/design/network.md, "Fair share").
  uint32_t bandwidth_mbps() const { return bandwidth_mbps_; }
  uint32_t max_connections() const { return max_connections_; }
  // Whether a deny rule names hosts (exact or wildcard): in open mode such a policy has its web
  // traffic judged by the proxy and its DNS answered by the stub, so the name holds.
  bool DeniesNames() const;

  // Host-side additions, never from the API: ranges no sandbox may reach whatever its rules say
  // (the host's own addresses, other sandboxes' subnets, the daemon's networks).
  void AddHostDenied(const Cidr& range) { host_denied_.push_back(range); }
  // The addresses a denied name of this policy resolved to (`rule`: that name's rule, `port` its
  // port or 0), set by the daemon: a client that dials one as an address (CheckAddress) is
  // refused as the name would be. A name the policy allows that resolves to one is not
  // (CheckResolved): addresses are shared, names are what the rules speak of.
  void AddDeniedAddress(const IpAddress& ip, uint16_t port, const std::string& rule) {
    denied_addresses_.push_back({ip, port, rule});
  }
  // The secrets bound to the sandbox (its `secrets`, docs/design/credentials.md): the proxy
  // terminates TLS to their hosts to put the values in, and refuses placeholders elsewhere.
  void SetSecrets(std::vector<SecretBinding> secrets) { secrets_ = std::move(secrets); }
  const std::vector<SecretBinding>& secrets() const { return secrets_; }
  // Whether a secret is bound to `name` (normalised): the proxy terminates TLS to it.
  bool HasSecretsFor(std::string_view name) const {
    for (const SecretBinding& b : secrets_) {
      if (b.BoundTo(name)) return true;
    }
    return false;
  }
  // Tests only: 127.0.0.0/8 and ::1 count as public addresses, so loopback servers can stand in
  // for the internet. Never set in production (FromJson leaves it off).
  void TreatLoopbackAsPublicForTests() { loopback_is_public_ = true; }

  // A destination given by name (CONNECT host, Host header, SNI). Deny rules first, then allow
  // rules; mode open allows what no rule denies, mode none denies all. The name is normalised
  // (lowercase, one trailing dot dropped); invalid names and IP literals in any encoding are
  // denied here: the caller checks those with CheckAddress.
  Verdict CheckName(std::string_view name, uint16_t port) const;
  // Whether the DNS stub answers for `name` (normalised): some port of it is allowed. A deny
  // rule for every port of it wins; a deny rule for one port does not hide the name.
  bool MayResolve(std::string_view name) const;
  // A destination given as an address (CONNECT to an IP literal, a Host of digits). The
  // metadata endpoints and host-denied ranges are never allowed; deny CIDR rules next; then the
  // always-deny ranges, some of which an allow CIDR rule inside them can open (the design doc
  // says which); in allowlist mode an allow CIDR rule must cover a public address too.
  Verdict CheckAddress(const IpAddress& ip, uint16_t port) const;
  // An address a name allowed by CheckName resolved to: everything CheckAddress denies for
  // every mode (metadata, host-denied, deny rules, always-deny) is still denied, but no allow
  // CIDR is needed. Passes a denied `name_verdict` through.
  Verdict CheckResolved(const Verdict& name_verdict, const IpAddress& ip, uint16_t port) const;

 private:
  // The checks every address passes whatever the mode and the name: nullopt when none denies.
  std::optional<Verdict> DenyAddress(const IpAddress& ip, uint16_t port) const;

  NetworkMode mode_ = NetworkMode::kNone;
  std::vector<Rule> allow_;
  std::vector<Rule> deny_;
  uint32_t bandwidth_mbps_ = 0;
  uint32_t max_connections_ = 0;
  std::vector<Cidr> host_denied_;
  struct DeniedAddress {
    IpAddress ip;
    uint16_t port;
    std::string rule;
  };
  std::vector<DeniedAddress> denied_addresses_;
  std::vector<SecretBinding> secrets_;
  bool loopback_is_public_ = false;
};

// The always-deny ranges of CheckAddress's step 4, which the firewall enforces on forwarded packets
// too: the `openable` ones (private and tunnel ranges) open to an allow CIDR rule inside them,
// the others to nothing.
std::vector<Cidr> ReservedRanges(bool openable);
// The cloud metadata endpoints: never reachable, whatever the rules.
const std::vector<IpAddress>& MetadataAddresses();
// True when `range` lies inside an openable reserved range: an allow rule for it opens it.
bool InsideOpenableRange(const Cidr& range);

// Lowercases and drops one trailing dot; nullopt for something that is not a valid DNS name of
// ASCII labels ([a-z0-9_-], 1-63 bytes, no leading or trailing '-'; at most 253 bytes).
std::optional<std::string> NormaliseName(std::string_view name);

// Every textual form a client could use for an address: IPv6 with or without brackets, dotted
// IPv4 in the forms inet_aton accepts (1-4 parts, each decimal, 0x hex or 0-led octal:
// "2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518"), a trailing dot allowed.
// nullopt when it is not an address.
std::optional<IpAddress> ParseIpLiteral(std::string_view text);
// True for text a browser or resolver would take for an IPv4 address even when it does not
// parse as one ("1.2.3.999", "0x1g"): the last label is all digits or 0x-hex. Such a "name" is
// never looked up.
bool LooksLikeIpv4(std::string_view text);

// "host:port", with brackets around an IPv6 address.
std::string HostPort(std::string_view host, uint16_t port);
std::string HostPort(const IpAddress& ip, uint16_t port);

}  // namespace airlock::net
