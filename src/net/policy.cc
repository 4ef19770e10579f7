#include "net/policy.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <utility>

namespace airlock::net {
namespace {

using boost::asio::ip::address_v4;
using boost::asio::ip::address_v6;
using nlohmann::json;

std::unexpected<Error> Invalid(std::string message) {
  return Fail(ErrorCode::kInvalidArgument, std::move(message));
}

// A user's text in a message: quoted, non-printable and non-ASCII bytes escaped, cut short.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  size_t shown = 0;
  for (unsigned char c : text) {
    if (++shown > 80) {
      out += "...";
      break;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) { return IsDigit(c) || (Lower(c) >= 'a' && Lower(c) <= 'f'); }

// The address as 16 bytes for bit tests: IPv4 in the first 4.
std::array<uint8_t, 16> Bytes(const IpAddress& ip) {
  std::array<uint8_t, 16> out{};
  if (ip.is_v4()) {
    auto b = ip.to_v4().to_bytes();
    std::memcpy(out.data(), b.data(), 4);
  } else {
    out = ip.to_v6().to_bytes();
  }
  return out;
}

bool PrefixEqual(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, int bits) {
  int full = bits / 8;
  if (std::memcmp(a.data(), b.data(), static_cast<size_t>(full)) != 0) return false;
  int rest = bits % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

// One numeric part of an inet_aton address: decimal, 0x hex or 0-led octal.
std::optional<uint64_t> ParseIpv4Part(std::string_view part) {
  if (part.empty()) return std::nullopt;
  int base = 10;
  if (part.size() >= 2 && part[0] == '0' && Lower(part[1]) == 'x') {
    base = 16;
    part.remove_prefix(2);
    if (part.empty()) return 0;  // "0x" is 0 to inet_aton
  } else if (part.size() >= 2 && part[0] == '0') {
    base = 8;
    part.remove_prefix(1);
  }
  uint64_t value = 0;
  for (char c : part) {
    int digit;
    if (IsDigit(c)) {
      digit = c - '0';
    } else if (base == 16 && IsHexDigit(c)) {
      digit = Lower(c) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (digit >= base) return std::nullopt;
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
    if (value > 0xffffffffu) return std::nullopt;
  }
  return value;
}

std::optional<address_v4> ParseIpv4AnyForm(std::string_view text) {
  std::vector<uint64_t> parts;
  size_t start = 0;
  while (true) {
    size_t dot = text.find('.', start);
    auto part =
        ParseIpv4Part(text.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (!part) return std::nullopt;
    parts.push_back(*part);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
    if (parts.size() == 4) return std::nullopt;
  }
  // a.b.c.d; a.b.c16; a.b24; a32: the last part fills the bytes the others leave.
  uint32_t value = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] > 255) return std::nullopt;
    value |= static_cast<uint32_t>(parts[i]) << (24 - 8 * i);
  }
  const int last_bits = 32 - 8 * static_cast<int>(parts.size() - 1);
  if (last_bits < 32 && parts.back() >= (uint64_t{1} << last_bits)) return std::nullopt;
  value |= static_cast<uint32_t>(parts.back());
  return address_v4(value);
}

// The IPv4 addresses an IPv6 address carries for a translator or tunnel to dial: NAT64
// (64:ff9b::/96), 6to4 (2002::/16), Teredo (2001::/32: server, and the client obfuscated), the
// deprecated IPv4-compatible form (::/96). IPv4-mapped addresses are converted, not listed here.
std::vector<address_v4> EmbeddedIpv4(const address_v6& v6) {
  auto b = v6.to_bytes();
  auto v4_at = [&b](size_t i, uint8_t x) {
    return address_v4(address_v4::bytes_type{
        static_cast<uint8_t>(b[i] ^ x), static_cast<uint8_t>(b[i + 1] ^ x),
        static_cast<uint8_t>(b[i + 2] ^ x), static_cast<uint8_t>(b[i + 3] ^ x)});
  };
  static const std::array<uint8_t, 16> kNat64 = {0, 0x64, 0xff, 0x9b};
  static const std::array<uint8_t, 16> kZero = {};
  if (PrefixEqual(b, kNat64, 96)) return {v4_at(12, 0)};
  if (b[0] == 0x20 && b[1] == 0x02) return {v4_at(2, 0)};
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) return {v4_at(4, 0), v4_at(12, 0xff)};
  if (PrefixEqual(b, kZero, 96) && !v6.is_unspecified() && !v6.is_loopback()) return {v4_at(12, 0)};
  return {};
}

// The ranges no sandbox reaches by default. `opens_with_rule`: an allow CIDR rule that lies
// inside the range (at least as specific) opens that part of it, for a sandbox that must reach a
// private service. The others are the proxy host's own (loopback, link-local, "this network")
// or cannot be a TCP destination (multicast, reserved): no rule opens them, because the proxy
// dials from the host and would reach the host's own services.
struct ReservedRange {
  const char* cidr;
  const char* what;
  bool opens_with_rule;
  bool loopback;  // public under TreatLoopbackAsPublicForTests
};
constexpr ReservedRange kReserved[] = {
    {"0.0.0.0/8", "\"this network\" (dials the host itself)", false, false},
    {"10.0.0.0/8", "a private network (RFC 1918)", true, false},
    {"100.64.0.0/10", "carrier-grade NAT space (RFC 6598)", true, false},
    {"127.0.0.0/8", "loopback (the proxy host itself)", false, true},
    {"169.254.0.0/16", "link-local (the host's links, cloud metadata)", false, false},
    {"172.16.0.0/12", "a private network (RFC 1918)", true, false},
    {"192.168.0.0/16", "a private network (RFC 1918)", true, false},
    {"192.0.0.0/24", "IETF protocol assignments (RFC 6890)", false, false},
    {"224.0.0.0/4", "multicast", false, false},
    {"255.255.255.255/32", "broadcast", false, false},
    {"240.0.0.0/4", "reserved (class E)", false, false},
    {"::/128", "the unspecified address", false, false},
    {"::1/128", "loopback (the proxy host itself)", false, true},
    {"::/96", "IPv4-compatible IPv6 (deprecated)", false, false},
    {"64:ff9b::/96", "NAT64 (RFC 6052)", true, false},
    {"64:ff9b:1::/48", "local-use NAT64 (RFC 8215)", true, false},
    {"2001::/32", "Teredo", true, false},
    {"2002::/16", "6to4", true, false},
    {"fc00::/7", "unique local IPv6 (ULA)", true, false},
    {"fe80::/10", "link-local IPv6", false, false},
    {"fec0::/10", "site-local IPv6 (deprecated)", true, false},
    {"ff00::/8", "multicast", false, false},
};

// Cloud metadata and host-agent endpoints: credentials live there. Never allowed, whatever the
// rules, in any encoding (IPv4-mapped, NAT64, 6to4 forms are unwrapped first).
constexpr const char* kMetadata[] = {
    "169.254.169.254",  // AWS, GCP, Azure, OpenStack, DigitalOcean, ...
    "169.254.170.2",    // AWS ECS task metadata and credentials
    "169.254.170.23",   // AWS EKS Pod Identity agent
    "100.100.100.200",  // Alibaba Cloud
    "192.0.0.192",      // Oracle Cloud
    "168.63.129.16",    // Azure WireServer (a public address the host answers)
    "fd00:ec2::254",    // AWS IMDS over IPv6
    "fd00:ec2::23",     // AWS EKS Pod Identity agent over IPv6
};

struct ParsedReserved {
  Cidr cidr;
  const ReservedRange* range;
};

const std::vector<ParsedReserved>& Reserved() {
  static const std::vector<ParsedReserved> table = [] {
    std::vector<ParsedReserved> out;
    for (const auto& r : kReserved) {
      auto cidr = Cidr::Parse(r.cidr);
      AIRLOCK_CHECK(cidr.has_value());
      out.push_back({*cidr, &r});
    }
    return out;
  }();
  return table;
}

}  // namespace

const std::vector<IpAddress>& MetadataAddresses() {
  static const std::vector<IpAddress> table = [] {
    std::vector<IpAddress> out;
    for (const char* text : kMetadata) {
      boost::system::error_code ec;
      out.push_back(boost::asio::ip::make_address(text, ec));
      AIRLOCK_CHECK(!ec);
    }
    return out;
  }();
  return table;
}

std::vector<Cidr> ReservedRanges(bool openable) {
  std::vector<Cidr> out;
  for (const auto& r : Reserved()) {
    if (r.range->opens_with_rule == openable) out.push_back(r.cidr);
  }
  return out;
}

bool InsideOpenableRange(const Cidr& range) {
  for (const auto& r : Reserved()) {
    if (r.range->opens_with_rule && r.cidr.Covers(range)) return true;
  }
  return false;
}

namespace {

// An IPv4-mapped IPv6 address is dialled as the IPv4 address: judge it as one.
IpAddress Unmap(const IpAddress& ip) {
  if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, ip.to_v6());
  }
  return ip;
}

Verdict Deny(std::string rule, std::string reason) {
  return Verdict{false, std::move(rule), std::move(reason)};
}

Result<uint16_t> ParsePort(std::string_view text) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value == 0 ||
      value > 65535 || text[0] == '0') {
    return Invalid("port must be a number in 1-65535, got " + Quote(text));
  }
  return static_cast<uint16_t>(value);
}

Result<std::vector<Rule>> ParseRules(const json& value, std::string_view field) {
  if (!value.is_array()) {
    return Invalid(std::string(field) + " must be an array of strings, got a " + value.type_name());
  }
  if (value.size() > kMaxRulesPerList) {
    return Invalid(std::string(field) + " may hold at most " + std::to_string(kMaxRulesPerList) +
                   " rules, got " + std::to_string(value.size()));
  }
  std::vector<Rule> rules;
  for (size_t i = 0; i < value.size(); ++i) {
    std::string where = std::string(field) + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) {
      return Invalid(where + " must be a string, got a " + value[i].type_name());
    }
    auto rule = Rule::Parse(value[i].get_ref<const std::string&>());
    if (!rule) return std::unexpected(std::move(rule.error()).Wrap(where));
    rules.push_back(std::move(*rule));
  }
  return rules;
}

}  // namespace

// --- Addresses and names ---

Result<Cidr> Cidr::Parse(std::string_view text) {
  size_t slash = text.find('/');
  std::string addr_text(text.substr(0, slash));
  boost::system::error_code ec;
  IpAddress ip = boost::asio::ip::make_address(addr_text, ec);
  if (ec || (ip.is_v6() && ip.to_v6().scope_id() != 0)) {
    return Invalid(Quote(text) +
                   " is not an IPv4 or IPv6 address range (like 203.0.113.0/24 "
                   "or 2001:db8::/32)");
  }
  const int max_bits = ip.is_v4() ? 32 : 128;
  int prefix = max_bits;
  if (slash != std::string_view::npos) {
    std::string_view bits = text.substr(slash + 1);
    auto [end, perr] = std::from_chars(bits.data(), bits.data() + bits.size(), prefix);
    if (bits.empty() || perr != std::errc() || end != bits.data() + bits.size() || prefix < 0 ||
        prefix > max_bits || (bits.size() > 1 && bits[0] == '0')) {
      return Invalid(Quote(text) + " has a bad prefix length: expected 0-" +
                     std::to_string(max_bits));
    }
  }
  std::array<uint8_t, 16> bytes = Bytes(ip);
  std::array<uint8_t, 16> masked{};
  for (int i = 0; i < prefix; ++i) masked[i / 8] |= bytes[i / 8] & (0x80 >> (i % 8));
  if (masked != bytes) {
    Cidr suggestion{ip, prefix};
    if (ip.is_v4()) {
      suggestion.network =
          address_v4(address_v4::bytes_type{masked[0], masked[1], masked[2], masked[3]});
    } else {
      suggestion.network = address_v6(masked);
    }
    return Invalid(Quote(text) + " has bits set past the prefix; did you mean " +
                   suggestion.ToString() + "?");
  }
  return Cidr{ip, prefix};
}

bool Cidr::Contains(const IpAddress& ip) const {
  if (ip.is_v4() != network.is_v4()) return false;
  return PrefixEqual(Bytes(network), Bytes(ip), prefix);
}

bool Cidr::Covers(const Cidr& other) const {
  return other.prefix >= prefix && Contains(other.network);
}

std::string Cidr::ToString() const { return network.to_string() + "/" + std::to_string(prefix); }

std::optional<std::string> NormaliseName(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  if (name.empty() || name.size() > kMaxNameBytes) return std::nullopt;
  std::string out;
  out.reserve(name.size());
  size_t label = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = Lower(name[i]);
    if (c == '.') {
      if (label == 0 || out.back() == '-') return std::nullopt;
      label = 0;
    } else {
      bool ok = (c >= 'a' && c <= 'z') || IsDigit(c) || c == '_' || c == '-';
      if (!ok || (c == '-' && label == 0) || ++label > kMaxLabelBytes) return std::nullopt;
    }
    out += c;
  }
  if (label == 0 || out.back() == '-') return std::nullopt;
  return out;
}

bool LooksLikeIpv4(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  size_t dot = text.rfind('.');
  std::string_view last = dot == std::string_view::npos ? text : text.substr(dot + 1);
  if (last.empty()) return false;
  if (last.size() >= 2 && last[0] == '0' && Lower(last[1]) == 'x') {
    for (char c : last.substr(2)) {
      if (!IsHexDigit(c)) return false;
    }
    return true;
  }
  for (char c : last) {
    if (!IsDigit(c)) return false;
  }
  return true;
}

std::optional<IpAddress> ParseIpLiteral(std::string_view text) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
    if (text.find(':') == std::string_view::npos) return std::nullopt;
  }
  if (text.empty() || text.size() > 64) return std::nullopt;
  if (text.find(':') != std::string_view::npos) {
    boost::system::error_code ec;
    address_v6 v6 = boost::asio::ip::make_address_v6(std::string(text), ec);
    if (ec) return std::nullopt;
    return IpAddress(v6);
  }
  if (text.back() == '.') text.remove_suffix(1);
  auto v4 = ParseIpv4AnyForm(text);
  if (!v4) return std::nullopt;
  return IpAddress(*v4);
}

std::string HostPort(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out = "[" + std::string(host) + "]";
  } else {
    out = std::string(host);
  }
  return out + ":" + std::to_string(port);
}

std::string HostPort(const IpAddress& ip, uint16_t port) { return HostPort(ip.to_string(), port); }

std::string_view ModeName(NetworkMode mode) {
  switch (mode) {
    case NetworkMode::kNone:
      return "none";
    case NetworkMode::kAllowlist:
      return "allowlist";
    case NetworkMode::kOpen:
      return "open";
  }
  return "none";
}

// --- Rules ---

Result<Rule> Rule::Parse(std::string_view text) {
  if (text.empty()) return Invalid("a rule may not be empty");
  if (text.size() > kMaxNameBytes + 2 + 6) {  // "*." + name + ":65535"
    return Invalid("a rule may be at most " + std::to_string(kMaxNameBytes + 8) + " bytes, got " +
                   std::to_string(text.size()));
  }
  for (unsigned char c : text) {
    if (c >= 0x80) {
      return Invalid(Quote(text) +
                     " is not ASCII: write internationalised names in their IDNA "
                     "form (xn--...)");
    }
  }
  Rule rule;
  std::string_view body = text;
  std::optional<std::string_view> port_text;
  if (text.front() == '[') {
    // [v6] or [v6/len], then an optional :port.
    size_t close = text.find(']');
    if (close == std::string_view::npos) return Invalid(Quote(text) + " has '[' without ']'");
    body = text.substr(1, close - 1);
    std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Invalid(Quote(text) + ": expected ':port' after ']'");
      port_text = after.substr(1);
    }
    if (body.find(':') == std::string_view::npos) {
      return Invalid(Quote(text) + ": brackets are for IPv6 ranges only");
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    size_t colon = text.find(':');
    body = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (port_text) {
    auto port = ParsePort(*port_text);
    if (!port) return std::unexpected(std::move(port.error()).Wrap(Quote(text)));
    rule.port = *port;
  }

  const bool v6 = body.find(':') != std::string_view::npos;
  const bool has_slash = body.find('/') != std::string_view::npos;
  boost::system::error_code strict_ec;
  boost::asio::ip::make_address(std::string(body), strict_ec);
  if (v6 || has_slash || !strict_ec) {
    size_t slash = body.find('/');
    if (v6 && text.front() != '[' &&
        (port_text || (slash != std::string_view::npos &&
                       body.substr(slash).find(':') != std::string_view::npos))) {
      return Invalid(Quote(text) +
                     ": put an IPv6 range in brackets to give a port, like "
                     "[2001:db8::/32]:443");
    }
    auto cidr = Cidr::Parse(body);
    if (!cidr) return std::unexpected(std::move(cidr.error()));
    rule.kind = Kind::kCidr;
    rule.cidr = *cidr;
    std::string range = cidr->ToString();
    rule.text = (rule.port != 0 && cidr->network.is_v6()) ? "[" + range + "]" : range;
  } else {
    if (LooksLikeIpv4(body)) {
      return Invalid(Quote(text) +
                     " looks like an IPv4 address in an unusual form; write "
                     "addresses as a dotted-quad CIDR like 203.0.113.7/32");
    }
    if (body.starts_with("*.")) {
      rule.kind = Kind::kWildcard;
      body.remove_prefix(2);
    } else if (body.find('*') != std::string_view::npos) {
      return Invalid(Quote(text) +
                     ": '*' is allowed only as the whole first label (*.example.com)");
    }
    auto name = NormaliseName(body);
    if (!name || name->find('*') != std::string::npos) {
      return Invalid(Quote(text) +
                     " is not a valid domain name: labels of 1-63 letters, digits, "
                     "'-' or '_' (no '-' at either end), at most 253 bytes in all");
    }
    if (rule.kind == Kind::kWildcard && name->find('.') == std::string::npos) {
      return Invalid(Quote(text) + ": a wildcard needs at least two labels after '*.' (*." + *name +
                     " would match a whole top-level domain)");
    }
    rule.name = *name;
    rule.text = (rule.kind == Kind::kWildcard ? "*." : "") + *name;
  }
  if (rule.port != 0) rule.text += ":" + std::to_string(rule.port);
  return rule;
}

bool Rule::MatchesName(std::string_view normalised_name, uint16_t dest_port) const {
  if (port != 0 && port != dest_port) return false;
  switch (kind) {
    case Kind::kExact:
      return normalised_name == name;
    case Kind::kWildcard:
      // Any subdomain, never the apex: "a.example.com" and "a.b.example.com", not "example.com"
      // and not "badexample.com".
      return normalised_name.size() > name.size() + 1 && normalised_name.ends_with(name) &&
             normalised_name[normalised_name.size() - name.size() - 1] == '.';
    case Kind::kCidr:
      return false;
  }
  return false;
}

bool Rule::MatchesAddress(const IpAddress& ip, uint16_t dest_port) const {
  if (port != 0 && port != dest_port) return false;
  return kind == Kind::kCidr && cidr.Contains(ip);
}

// --- The policy ---

Result<NetworkPolicy> NetworkPolicy::FromJson(const json& value) {
  if (!value.is_object()) {
    return Invalid(std::string("network must be an object, got a ") + value.type_name());
  }
  for (const auto& [key, item] : value.items()) {
    if (key != "mode" && key != "allow" && key != "deny" && key != "bandwidth_mbps" &&
        key != "max_connections") {
      return Invalid("unknown field " + Quote(key) +
                     " in network; allowed: mode, allow, deny, bandwidth_mbps, max_connections");
    }
  }
  NetworkPolicy policy;
  auto mode = value.find("mode");
  if (mode == value.end() || !mode->is_string()) {
    return Invalid("network.mode must be one of \"none\", \"allowlist\", \"open\"");
  }
  const auto& mode_text = mode->get_ref<const std::string&>();
  if (mode_text == "none") {
    policy.mode_ = NetworkMode::kNone;
  } else if (mode_text == "allowlist") {
    policy.mode_ = NetworkMode::kAllowlist;
  } else if (mode_text == "open") {
    policy.mode_ = NetworkMode::kOpen;
  } else {
    return Invalid("network.mode must be one of \"none\", \"allowlist\", \"open\", got " +
                   Quote(mode_text));
  }
  if (auto allow = value.find("allow"); allow != value.end()) {
    auto rules = ParseRules(*allow, "network.allow");
    if (!rules) return std::unexpected(std::move(rules.error()));
    policy.allow_ = std::move(*rules);
  }
  if (auto deny = value.find("deny"); deny != value.end()) {
    auto rules = ParseRules(*deny, "network.deny");
    if (!rules) return std::unexpected(std::move(rules.error()));
    policy.deny_ = std::move(*rules);
  }
  auto limit = [&](const char* key, uint32_t max, uint32_t& into) -> Status {
    auto it = value.find(key);
    if (it == value.end()) return {};
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > max) {
      return Invalid(std::string("network.") + key + " must be an integer from 1 to " +
                     std::to_string(max) + ", got " + it->dump());
    }
    into = static_cast<uint32_t>(it->get<int64_t>());
    return {};
  };
  if (auto st = limit("bandwidth_mbps", kMaxBandwidthMbps, policy.bandwidth_mbps_); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = limit("max_connections", kMaxConnectionsLimit, policy.max_connections_); !st) {
    return std::unexpected(st.error());
  }
  if (policy.mode_ == NetworkMode::kNone &&
      (!policy.allow_.empty() || !policy.deny_.empty() || policy.bandwidth_mbps_ != 0 ||
       policy.max_connections_ != 0)) {
    return Invalid(
        "network.allow, network.deny and the limits must be absent or empty when "
        "network.mode is \"none\" (no egress at all); use \"allowlist\"");
  }
  return policy;
}

json NetworkPolicy::ToJson() const {
  json out = json::object();
  out["mode"] = std::string(ModeName(mode_));
  json allow = json::array();
  for (const auto& r : allow_) allow.push_back(r.text);
  json deny = json::array();
  for (const auto& r : deny_) deny.push_back(r.text);
  out["allow"] = std::move(allow);
  out["deny"] = std::move(deny);
  if (bandwidth_mbps_ != 0) out["bandwidth_mbps"] = bandwidth_mbps_;
  if (max_connections_ != 0) out["max_connections"] = max_connections_;
  return out;
}

bool NetworkPolicy::DeniesNames() const {
  return std::any_of(deny_.begin(), deny_.end(),
                     [](const Rule& r) { return r.kind != Rule::Kind::kCidr; });
}

Verdict NetworkPolicy::CheckName(std::string_view name, uint16_t port) const {
  if (mode_ == NetworkMode::kNone) {
    return Deny("mode:none", "this sandbox has no network access (network mode \"none\")");
  }
  if (ParseIpLiteral(name) || LooksLikeIpv4(name)) {
    return Deny("ip-literal", Quote(name) +
                                  " is an IP address, not a name; addresses are "
                                  "checked as addresses");
  }
  auto normal = NormaliseName(name);
  if (!normal) return Deny("invalid-name", Quote(name) + " is not a valid domain name");
  const std::string target = HostPort(*normal, port);
  for (const auto& rule : deny_) {
    if (rule.MatchesName(*normal, port)) {
      return Deny(rule.text, target + " is denied by this sandbox's rule \"" + rule.text + "\"");
    }
  }
  for (const auto& rule : allow_) {
    if (rule.MatchesName(*normal, port)) {
      return Verdict{true, rule.text, target + " is allowed by rule \"" + rule.text + "\""};
    }
  }
  if (mode_ == NetworkMode::kOpen) {
    return Verdict{true, "mode:open", target + " is allowed (network mode \"open\")"};
  }
  return Deny("allowlist", target + " is not in this sandbox's allowlist");
}

bool NetworkPolicy::MayResolve(std::string_view name) const {
  if (mode_ == NetworkMode::kNone || ParseIpLiteral(name) || LooksLikeIpv4(name)) return false;
  auto normal = NormaliseName(name);
  if (!normal) return false;
  auto names = [&](const Rule& rule) {
    Rule any_port = rule;
    any_port.port = 0;
    return any_port.MatchesName(*normal, 0);
  };
  for (const auto& rule : deny_) {
    if (rule.port == 0 && names(rule)) return false;
  }
  if (mode_ == NetworkMode::kOpen) return true;
  return std::any_of(allow_.begin(), allow_.end(), names);
}

std::optional<Verdict> NetworkPolicy::DenyAddress(const IpAddress& raw, uint16_t port) const {
  if (mode_ == NetworkMode::kNone) {
    return Deny("mode:none", "this sandbox has no network access (network mode \"none\")");
  }
  const IpAddress ip = Unmap(raw);
  const std::string target = HostPort(raw, port);
  std::vector<IpAddress> forms = {ip};
  if (ip.is_v6()) {
    for (const auto& v4 : EmbeddedIpv4(ip.to_v6())) forms.emplace_back(v4);
  }
  // Each check over every form before the next check, so the reason names the worst finding
  // (a metadata endpoint inside a NAT64 address is reported as metadata).
  for (const auto& form : forms) {
    for (const auto& meta : MetadataAddresses()) {
      if (form == meta) {
        return Deny("metadata", target + " is a cloud metadata endpoint (" + meta.to_string() +
                                    "), which no sandbox may reach");
      }
    }
  }
  for (const auto& form : forms) {
    for (const auto& range : host_denied_) {
      if (range.Contains(form)) {
        return Deny("host-denied", target + " is in " + range.ToString() +
                                       ", an address range of the host that no sandbox may reach");
      }
    }
  }
  for (const auto& form : forms) {
    for (const auto& rule : deny_) {
      if (rule.MatchesAddress(form, port)) {
        return Deny(rule.text, target + " is denied by this sandbox's rule \"" + rule.text + "\"");
      }
    }
  }
  for (const auto& form : forms) {
    for (const auto& reserved : Reserved()) {
      if (!reserved.cidr.Contains(form)) continue;
      if (reserved.range->loopback && loopback_is_public_) break;
      bool opened = false;
      if (reserved.range->opens_with_rule) {
        for (const auto& rule : allow_) {
          opened = opened || (rule.MatchesAddress(form, port) && reserved.cidr.Covers(rule.cidr));
        }
      }
      if (!opened) {
        std::string why = target + " is in " + reserved.cidr.ToString() + ", " +
                          reserved.range->what + ", which sandboxes may not reach";
        if (reserved.range->opens_with_rule) {
          why += " unless an allow rule names a range inside it";
        }
        return Deny("always-deny:" + reserved.cidr.ToString(), why);
      }
      break;  // the first listed range that contains the address decides
    }
  }
  return std::nullopt;
}

Verdict NetworkPolicy::CheckAddress(const IpAddress& raw, uint16_t port) const {
  if (auto denied = DenyAddress(raw, port)) return std::move(*denied);
  const IpAddress ip = Unmap(raw);
  const std::string target = HostPort(raw, port);
  for (const auto& d : denied_addresses_) {
    if (d.ip == ip && (d.port == 0 || d.port == port)) {
      return Deny(d.rule, target + " is an address of \"" + d.rule +
                              "\", which this sandbox's rule denies");
    }
  }
  for (const auto& rule : allow_) {
    if (rule.MatchesAddress(ip, port)) {
      return Verdict{true, rule.text, target + " is allowed by rule \"" + rule.text + "\""};
    }
  }
  if (mode_ == NetworkMode::kOpen) {
    return Verdict{true, "mode:open", target + " is allowed (network mode \"open\")"};
  }
  return Deny("allowlist", target + " is not in this sandbox's allowlist");
}

Verdict NetworkPolicy::CheckResolved(const Verdict& name_verdict, const IpAddress& ip,
                                     uint16_t port) const {
  if (!name_verdict.allowed) return name_verdict;
  if (auto denied = DenyAddress(ip, port)) {
    denied->reason = "the name resolved to a forbidden address: " + denied->reason;
    return std::move(*denied);
  }
  return name_verdict;
}

}  // namespace airlock::net
