// The network policy: parsing the API's `network` object, and the verdicts on names and
// addresses. Every denial in the tables sits next to an allowed positive control, so a policy
// that denied everything would fail as surely as one that allowed everything.

#include "net/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace airlock::net {
namespace {

using nlohmann::json;

NetworkPolicy Policy(const std::string& text) {
  auto policy = NetworkPolicy::FromJson(json::parse(text));
  EXPECT_TRUE(policy.has_value()) << text << ": " << policy.error().message();
  return policy.value_or(NetworkPolicy());
}

IpAddress Ip(const std::string& text) {
  auto ip = ParseIpLiteral(text);
  EXPECT_TRUE(ip.has_value()) << text;
  return ip.value_or(IpAddress());
}

const char* const kDefault = R"({"mode": "allowlist",
  "allow": ["pypi.org", "*.githubusercontent.com", "api.example.com:443", "files.example.com:8080",
            "203.0.113.0/24", "198.51.100.7/32:22", "[2001:db8::/32]:443", "10.1.2.0/24",
            "*.internal.example.net"],
  "deny": ["evil.githubusercontent.com", "bad.internal.example.net:443", "203.0.113.66/32"]})";

// --- Parsing ---

TEST(PolicyParse, GoodPolicyRoundTrips) {
  NetworkPolicy p = Policy(kDefault);
  EXPECT_EQ(p.mode(), NetworkMode::kAllowlist);
  ASSERT_EQ(p.allow().size(), 9u);
  EXPECT_EQ(p.allow()[1].kind, Rule::Kind::kWildcard);
  EXPECT_EQ(p.allow()[1].name, "githubusercontent.com");
  EXPECT_EQ(p.allow()[2].port, 443);
  EXPECT_EQ(p.allow()[6].text, "[2001:db8::/32]:443");
  json out = p.ToJson();
  auto again = NetworkPolicy::FromJson(out);
  ASSERT_TRUE(again.has_value()) << again.error().message();
  EXPECT_EQ(again->ToJson(), out);
}

TEST(PolicyParse, NormalisesRules) {
  NetworkPolicy p = Policy(
      R"({"mode":"allowlist","allow":["PyPI.ORG.","*.Example.COM:443","2001:DB8::/32",
          "192.0.2.7","[2001:db8::1]","xn--bcher-kva.example"]})");
  ASSERT_EQ(p.allow().size(), 6u);
  EXPECT_EQ(p.allow()[0].text, "pypi.org");
  EXPECT_EQ(p.allow()[1].text, "*.example.com:443");
  EXPECT_EQ(p.allow()[2].text, "2001:db8::/32");
  EXPECT_EQ(p.allow()[3].text, "192.0.2.7/32");
  EXPECT_EQ(p.allow()[4].text, "2001:db8::1/128");
  EXPECT_EQ(p.allow()[5].text, "xn--bcher-kva.example");
}

TEST(PolicyParse, ModesAndDefaults) {
  EXPECT_EQ(Policy(R"({"mode":"none"})").mode(), NetworkMode::kNone);
  EXPECT_EQ(Policy(R"({"mode":"open"})").mode(), NetworkMode::kOpen);
  EXPECT_EQ(Policy(R"({"mode":"allowlist"})").allow().size(), 0u);
  EXPECT_EQ(NetworkPolicy().mode(), NetworkMode::kNone);
}

struct BadCase {
  const char* json;
  const char* message_part;
};

class PolicyParseBad : public testing::TestWithParam<BadCase> {};

TEST_P(PolicyParseBad, RefusedWithMessage) {
  auto p = NetworkPolicy::FromJson(json::parse(GetParam().json));
  ASSERT_FALSE(p.has_value()) << GetParam().json;
  EXPECT_EQ(p.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(p.error().message().find(GetParam().message_part), std::string::npos)
      << p.error().message();
}

INSTANTIATE_TEST_SUITE_P(
    Rules, PolicyParseBad,
    testing::Values(
        BadCase{R"([])", "network must be an object"},
        BadCase{R"({"allow":[]})", "network.mode must be one of"},
        BadCase{R"({"mode":"closed"})", "got \"closed\""},
        BadCase{R"({"mode":"allowlist","extra":1})", "unknown field \"extra\""},
        BadCase{R"({"mode":"none","allow":["pypi.org"]})",
                "must be absent or empty when network.mode"},
        BadCase{R"({"mode":"allowlist","allow":"pypi.org"})", "network.allow must be an array"},
        BadCase{R"({"mode":"allowlist","allow":["a.org", 7]})", "network.allow[1] must be a string"},
        BadCase{R"({"mode":"allowlist","allow":[""]})", "network.allow[0]: a rule may not be empty"},
        BadCase{R"({"mode":"allowlist","deny":["ok.org","bad..org"]})",
                "network.deny[1]: \"bad..org\" is not a valid domain name"},
        BadCase{R"({"mode":"allowlist","allow":["-a.org"]})", "not a valid domain name"},
        BadCase{R"({"mode":"allowlist","allow":["a-.org"]})", "not a valid domain name"},
        BadCase{R"({"mode":"allowlist","allow":["a b.org"]})", "not a valid domain name"},
        BadCase{R"({"mode":"allowlist","allow":["bücher.example"]})", "IDNA form (xn--"},
        BadCase{R"({"mode":"allowlist","allow":["*"]})", "'*' is allowed only"},
        BadCase{R"({"mode":"allowlist","allow":["*.com"]})", "whole top-level domain"},
        BadCase{R"({"mode":"allowlist","allow":["a.*.com"]})", "'*' is allowed only"},
        BadCase{R"({"mode":"allowlist","allow":["pypi.org:0"]})", "port must be a number"},
        BadCase{R"({"mode":"allowlist","allow":["pypi.org:65536"]})", "port must be a number"},
        BadCase{R"({"mode":"allowlist","allow":["pypi.org:http"]})", "port must be a number"},
        BadCase{R"({"mode":"allowlist","allow":["10.0.0.1/8"]})", "did you mean 10.0.0.0/8?"},
        BadCase{R"({"mode":"allowlist","allow":["10.0.0.0/33"]})", "bad prefix length"},
        BadCase{R"({"mode":"allowlist","allow":["2001:db8::/32:443"]})", "in brackets"},
        BadCase{R"({"mode":"allowlist","allow":["[10.0.0.0/8]:443"]})", "IPv6 ranges only"},
        BadCase{R"({"mode":"allowlist","allow":["0x7f000001"]})", "unusual form"},
        BadCase{R"({"mode":"allowlist","allow":["1.2.3"]})", "unusual form"},
        BadCase{R"({"mode":"allowlist","allow":["10.0.0.0/8x"]})", "bad prefix length"},
        BadCase{R"({"mode":"allowlist","allow":["pypi.org:443:1"]})", "not an IPv4 or IPv6"},
        BadCase{R"({"mode":"allowlist","allow":["[2001:db8::/32"]})", "without ']'"},
        BadCase{R"({"mode":"open","bandwidth_mbps":0})",
                "network.bandwidth_mbps must be an integer from 1 to 100000, got 0"},
        BadCase{R"({"mode":"open","bandwidth_mbps":100001})", "got 100001"},
        BadCase{R"({"mode":"open","bandwidth_mbps":1.5})",
                "network.bandwidth_mbps must be an integer"},
        BadCase{R"({"mode":"open","bandwidth_mbps":"10"})",
                "network.bandwidth_mbps must be an integer"},
        BadCase{R"({"mode":"open","max_connections":-1})",
                "network.max_connections must be an integer from 1 to 65536"},
        BadCase{R"({"mode":"open","max_connections":65537})", "got 65537"},
        BadCase{R"({"mode":"none","max_connections":5})",
                "must be absent or empty when network.mode"}));

TEST(PolicyParse, LimitsRoundTripAndStayOutWhenUnset) {
  const NetworkPolicy p = Policy(R"({"mode":"open","bandwidth_mbps":20,"max_connections":64})");
  EXPECT_EQ(p.bandwidth_mbps(), 20u);
  EXPECT_EQ(p.max_connections(), 64u);
  const NetworkPolicy again = Policy(p.ToJson().dump());
  EXPECT_EQ(again.bandwidth_mbps(), 20u);
  EXPECT_EQ(again.max_connections(), 64u);
  // Unset: 0 (the daemon's default), and not written.
  const NetworkPolicy plain = Policy(R"({"mode":"open"})");
  EXPECT_EQ(plain.bandwidth_mbps(), 0u);
  EXPECT_FALSE(plain.ToJson().contains("bandwidth_mbps"));
  EXPECT_FALSE(plain.ToJson().contains("max_connections"));
}

TEST(PolicyRanges, TheFirewallsListsAreThePolicys) {
  auto has = [](const std::vector<Cidr>& list, const char* text) {
    auto c = Cidr::Parse(text);
    return c && std::find(list.begin(), list.end(), *c) != list.end();
  };
  const std::vector<Cidr> never = ReservedRanges(false), openable = ReservedRanges(true);
  for (const char* r : {"127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8", "192.0.0.0/24", "fe80::/10",
                        "::1/128", "ff00::/8"}) {
    EXPECT_TRUE(has(never, r)) << r;
    EXPECT_FALSE(has(openable, r)) << r;
  }
  for (const char* r : {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                        "fc00::/7", "64:ff9b::/96"}) {
    EXPECT_TRUE(has(openable, r)) << r;
    EXPECT_FALSE(has(never, r)) << r;
  }
  EXPECT_TRUE(InsideOpenableRange(*Cidr::Parse("10.1.0.0/16")));
  EXPECT_TRUE(InsideOpenableRange(*Cidr::Parse("fd12::/64")));
  EXPECT_FALSE(InsideOpenableRange(*Cidr::Parse("0.0.0.0/0"))) << "covers 10/8, is not inside";
  EXPECT_FALSE(InsideOpenableRange(*Cidr::Parse("203.0.113.0/24")));
  EXPECT_FALSE(InsideOpenableRange(*Cidr::Parse("169.254.169.254/32"))) << "never opens";
  EXPECT_EQ(MetadataAddresses().size(), 8u);
}

TEST(PolicyVerdicts, ADeniedNamesAddressesAreDeniedAsAddressesOnly) {
  NetworkPolicy p = Policy(R"({"mode":"open","deny":["evil.test","web.test:443"]})");
  const auto ip = boost::asio::ip::make_address("203.0.113.9");
  const auto web = boost::asio::ip::make_address("203.0.113.10");
  EXPECT_TRUE(p.CheckAddress(ip, 80).allowed) << "positive control: not yet known";
  p.AddDeniedAddress(ip, 0, "evil.test");
  p.AddDeniedAddress(web, 443, "web.test:443");
  const Verdict v = p.CheckAddress(ip, 8080);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.rule, "evil.test");
  EXPECT_NE(v.reason.find("is an address of \"evil.test\""), std::string::npos) << v.reason;
  // IPv4-mapped, the same address.
  EXPECT_FALSE(p.CheckAddress(boost::asio::ip::make_address("::ffff:203.0.113.9"), 80).allowed);
  // The port of the name's rule only.
  EXPECT_FALSE(p.CheckAddress(web, 443).allowed);
  EXPECT_TRUE(p.CheckAddress(web, 80).allowed);
  // An allowed name that shares the address is judged by its name.
  EXPECT_TRUE(p.CheckResolved(p.CheckName("good.test", 80), ip, 80).allowed);
}

TEST(PolicyRules, DeniesNames) {
  EXPECT_TRUE(Policy(R"({"mode":"open","deny":["evil.test"]})").DeniesNames());
  EXPECT_TRUE(Policy(R"({"mode":"open","deny":["*.evil.test:443"]})").DeniesNames());
  EXPECT_FALSE(Policy(R"({"mode":"open","deny":["198.51.100.0/24"]})").DeniesNames());
  EXPECT_FALSE(Policy(R"({"mode":"allowlist","allow":["evil.test"]})").DeniesNames());
}

TEST(PolicyParse, Limits) {
  json rules = json::array();
  for (int i = 0; i < 256; ++i) rules.push_back("h" + std::to_string(i) + ".example.com");
  json doc = {{"mode", "allowlist"}, {"allow", rules}};
  EXPECT_TRUE(NetworkPolicy::FromJson(doc).has_value());  // positive control: 256 is fine
  doc["allow"].push_back("one-more.example.com");
  auto over = NetworkPolicy::FromJson(doc);
  ASSERT_FALSE(over.has_value());
  EXPECT_NE(over.error().message().find("at most 256 rules, got 257"), std::string::npos);

  std::string label63(63, 'a');
  std::string name253 = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(name253.size(), 253u);
  EXPECT_TRUE(NetworkPolicy::FromJson({{"mode", "allowlist"}, {"allow", {name253}}}).has_value());
  EXPECT_FALSE(
      NetworkPolicy::FromJson({{"mode", "allowlist"}, {"allow", {name253 + "b"}}}).has_value());
  EXPECT_TRUE(
      NetworkPolicy::FromJson({{"mode", "allowlist"}, {"allow", {label63 + ".org"}}}).has_value());
  EXPECT_FALSE(NetworkPolicy::FromJson({{"mode", "allowlist"}, {"allow", {label63 + "a.org"}}})
                   .has_value());
}

// --- Names ---

struct NameCase {
  const char* policy;  // nullptr: kDefault
  const char* name;
  uint16_t port;
  bool allowed;
  const char* rule;
};

class NameVerdicts : public testing::TestWithParam<NameCase> {};

TEST_P(NameVerdicts, Match) {
  const NameCase& c = GetParam();
  NetworkPolicy p = Policy(c.policy ? c.policy : kDefault);
  Verdict v = p.CheckName(c.name, c.port);
  EXPECT_EQ(v.allowed, c.allowed) << c.name << ":" << c.port << " -> " << v.reason;
  EXPECT_EQ(v.rule, c.rule) << v.reason;
  EXPECT_FALSE(v.reason.empty());
}

const char* const kOpenWithDeny = R"({"mode":"open","deny":["*.evil.example","tracker.example:80"]})";

INSTANTIATE_TEST_SUITE_P(
    Table, NameVerdicts,
    testing::Values(
        // exact names: any port unless the rule names one
        NameCase{nullptr, "pypi.org", 443, true, "pypi.org"},
        NameCase{nullptr, "pypi.org", 80, true, "pypi.org"},
        NameCase{nullptr, "www.pypi.org", 443, false, "allowlist"},
        NameCase{nullptr, "pypi.org.evil.com", 443, false, "allowlist"},
        NameCase{nullptr, "xpypi.org", 443, false, "allowlist"},
        // case and one trailing dot are normalised; two dots are not a name
        NameCase{nullptr, "PyPI.Org", 443, true, "pypi.org"},
        NameCase{nullptr, "pypi.org.", 443, true, "pypi.org"},
        NameCase{nullptr, "pypi.org..", 443, false, "invalid-name"},
        NameCase{nullptr, "pypi.org%00", 443, false, "invalid-name"},
        // wildcards: subdomains at any depth, never the apex or a look-alike
        NameCase{nullptr, "raw.githubusercontent.com", 443, true, "*.githubusercontent.com"},
        NameCase{nullptr, "a.b.githubusercontent.com", 443, true, "*.githubusercontent.com"},
        NameCase{nullptr, "githubusercontent.com", 443, false, "allowlist"},
        NameCase{nullptr, "evilgithubusercontent.com", 443, false, "allowlist"},
        NameCase{nullptr, "raw.githubusercontent.com.evil.io", 443, false, "allowlist"},
        // ports
        NameCase{nullptr, "api.example.com", 443, true, "api.example.com:443"},
        NameCase{nullptr, "api.example.com", 8443, false, "allowlist"},
        NameCase{nullptr, "files.example.com", 8080, true, "files.example.com:8080"},
        NameCase{nullptr, "files.example.com", 80, false, "allowlist"},
        // deny over allow, port-specific denials
        NameCase{nullptr, "evil.githubusercontent.com", 443, false, "evil.githubusercontent.com"},
        NameCase{nullptr, "EVIL.githubusercontent.com.", 443, false, "evil.githubusercontent.com"},
        NameCase{nullptr, "good.githubusercontent.com", 443, true, "*.githubusercontent.com"},
        NameCase{nullptr, "bad.internal.example.net", 443, false, "bad.internal.example.net:443"},
        NameCase{nullptr, "bad.internal.example.net", 80, true, "*.internal.example.net"},
        // IP literals are never names, in any form
        NameCase{nullptr, "203.0.113.5", 443, false, "ip-literal"},
        NameCase{nullptr, "2852039166", 80, false, "ip-literal"},
        NameCase{nullptr, "0xa9fea9fe", 80, false, "ip-literal"},
        NameCase{nullptr, "0251.0376.0251.0376", 80, false, "ip-literal"},
        NameCase{nullptr, "169.254.43518", 80, false, "ip-literal"},
        NameCase{nullptr, "::ffff:169.254.169.254", 80, false, "ip-literal"},
        NameCase{nullptr, "[::1]", 80, false, "ip-literal"},
        NameCase{nullptr, "1.2.3.999", 80, false, "ip-literal"},
        NameCase{nullptr, "pypi.org.1", 80, false, "ip-literal"},
        // modes
        NameCase{R"({"mode":"none"})", "pypi.org", 443, false, "mode:none"},
        NameCase{R"({"mode":"allowlist"})", "pypi.org", 443, false, "allowlist"},
        NameCase{R"({"mode":"open"})", "pypi.org", 443, true, "mode:open"},
        NameCase{kOpenWithDeny, "x.evil.example", 443, false, "*.evil.example"},
        NameCase{kOpenWithDeny, "evil.example", 443, true, "mode:open"},
        NameCase{kOpenWithDeny, "tracker.example", 80, false, "tracker.example:80"},
        NameCase{kOpenWithDeny, "tracker.example", 443, true, "mode:open"}));

TEST(NameVerdict, ReasonNamesTheTarget) {
  Verdict v = Policy(kDefault).CheckName("Evil.Example.com", 443);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason, "evil.example.com:443 is not in this sandbox's allowlist");
  Verdict ok = Policy(kDefault).CheckName("pypi.org", 443);
  EXPECT_TRUE(ok.allowed);
  EXPECT_EQ(ok.reason, "pypi.org:443 is allowed by rule \"pypi.org\"");
}

// --- IP literals in every encoding ---

struct LiteralCase {
  const char* text;
  const char* address;  // nullptr: not an address
};

class IpLiterals : public testing::TestWithParam<LiteralCase> {};

TEST_P(IpLiterals, Parse) {
  auto ip = ParseIpLiteral(GetParam().text);
  if (GetParam().address == nullptr) {
    EXPECT_FALSE(ip.has_value()) << GetParam().text << " -> " << ip->to_string();
  } else {
    ASSERT_TRUE(ip.has_value()) << GetParam().text;
    EXPECT_EQ(ip->to_string(), GetParam().address);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Encodings, IpLiterals,
    testing::Values(LiteralCase{"169.254.169.254", "169.254.169.254"},
                    LiteralCase{"2852039166", "169.254.169.254"},
                    LiteralCase{"0xa9fea9fe", "169.254.169.254"},
                    LiteralCase{"0XA9FEA9FE", "169.254.169.254"},
                    LiteralCase{"0251.0376.0251.0376", "169.254.169.254"},
                    LiteralCase{"0xa9.0xfe.0xa9.0xfe", "169.254.169.254"},
                    LiteralCase{"169.254.43518", "169.254.169.254"},
                    LiteralCase{"169.16689662", "169.254.169.254"},
                    LiteralCase{"169.254.169.254.", "169.254.169.254"},
                    LiteralCase{"127.1", "127.0.0.1"}, LiteralCase{"0", "0.0.0.0"},
                    LiteralCase{"017700000001", "127.0.0.1"},
                    LiteralCase{"::ffff:169.254.169.254", "::ffff:169.254.169.254"},
                    LiteralCase{"[::ffff:a9fe:a9fe]", "::ffff:169.254.169.254"},
                    LiteralCase{"[fd00:ec2::254]", "fd00:ec2::254"},
                    LiteralCase{"4294967296", nullptr}, LiteralCase{"1.2.3.256", nullptr},
                    LiteralCase{"1.2.65536", nullptr}, LiteralCase{"08.1.1.1", nullptr},
                    LiteralCase{"1.2.3.4.5", nullptr}, LiteralCase{"1..2.3", nullptr},
                    LiteralCase{"pypi.org", nullptr}, LiteralCase{"[1.2.3.4]", nullptr},
                    LiteralCase{"", nullptr}, LiteralCase{"::g", nullptr}));

// --- Addresses ---

struct AddressCase {
  const char* policy;  // nullptr: kDefault
  const char* address;
  uint16_t port;
  bool allowed;
  const char* rule;
};

class AddressVerdicts : public testing::TestWithParam<AddressCase> {};

TEST_P(AddressVerdicts, Match) {
  const AddressCase& c = GetParam();
  NetworkPolicy p = Policy(c.policy ? c.policy : kDefault);
  Verdict v = p.CheckAddress(Ip(c.address), c.port);
  EXPECT_EQ(v.allowed, c.allowed) << c.address << ":" << c.port << " -> " << v.reason;
  EXPECT_EQ(v.rule, c.rule) << v.reason;
}

const char* const kOpen = R"({"mode":"open"})";
// An explicit allow for every reserved range and the metadata endpoints themselves.
const char* const kOpenEverything = R"({"mode":"open","allow":["0.0.0.0/0","::/0",
  "169.254.169.254/32","10.0.0.0/8","127.0.0.0/8","169.254.0.0/16","[fd00:ec2::254/128]",
  "100.100.100.200/32","192.0.0.192/32","fc00::/7"]})";

INSTANTIATE_TEST_SUITE_P(
    Table, AddressVerdicts,
    testing::Values(
        // allowlist: an allow CIDR must cover a public address, with its port
        AddressCase{nullptr, "203.0.113.5", 443, true, "203.0.113.0/24"},
        AddressCase{nullptr, "203.0.114.5", 443, false, "allowlist"},
        AddressCase{nullptr, "203.0.113.66", 443, false, "203.0.113.66/32"},
        AddressCase{nullptr, "198.51.100.7", 22, true, "198.51.100.7/32:22"},
        AddressCase{nullptr, "198.51.100.7", 23, false, "allowlist"},
        AddressCase{nullptr, "2001:db8::5", 443, true, "[2001:db8::/32]:443"},
        AddressCase{nullptr, "2001:db8::5", 80, false, "allowlist"},
        AddressCase{nullptr, "::ffff:203.0.113.5", 443, true, "203.0.113.0/24"},
        // open mode: public addresses pass, the always-deny list still applies
        AddressCase{kOpen, "8.8.8.8", 53, true, "mode:open"},
        AddressCase{kOpen, "2606:4700::1111", 443, true, "mode:open"},
        AddressCase{kOpen, "0.1.2.3", 80, false, "always-deny:0.0.0.0/8"},
        AddressCase{kOpen, "127.0.0.1", 80, false, "always-deny:127.0.0.0/8"},
        AddressCase{kOpen, "127.255.0.1", 80, false, "always-deny:127.0.0.0/8"},
        AddressCase{kOpen, "10.9.8.7", 80, false, "always-deny:10.0.0.0/8"},
        AddressCase{kOpen, "172.16.0.1", 80, false, "always-deny:172.16.0.0/12"},
        AddressCase{kOpen, "172.31.255.255", 80, false, "always-deny:172.16.0.0/12"},
        AddressCase{kOpen, "172.32.0.1", 80, true, "mode:open"},
        AddressCase{kOpen, "192.168.1.1", 80, false, "always-deny:192.168.0.0/16"},
        AddressCase{kOpen, "100.64.0.1", 80, false, "always-deny:100.64.0.0/10"},
        AddressCase{kOpen, "100.128.0.1", 80, true, "mode:open"},
        AddressCase{kOpen, "169.254.1.1", 80, false, "always-deny:169.254.0.0/16"},
        AddressCase{kOpen, "224.0.0.1", 80, false, "always-deny:224.0.0.0/4"},
        AddressCase{kOpen, "240.0.0.1", 80, false, "always-deny:240.0.0.0/4"},
        AddressCase{kOpen, "255.255.255.255", 80, false, "always-deny:255.255.255.255/32"},
        AddressCase{kOpen, "::", 80, false, "always-deny:::/128"},
        AddressCase{kOpen, "::1", 80, false, "always-deny:::1/128"},
        AddressCase{kOpen, "fe80::1", 80, false, "always-deny:fe80::/10"},
        AddressCase{kOpen, "fd12:3456::1", 80, false, "always-deny:fc00::/7"},
        AddressCase{kOpen, "ff02::1", 80, false, "always-deny:ff00::/8"},
        // the metadata endpoints, in every encoding
        AddressCase{kOpen, "169.254.169.254", 80, false, "metadata"},
        AddressCase{kOpen, "2852039166", 80, false, "metadata"},
        AddressCase{kOpen, "0xa9fea9fe", 80, false, "metadata"},
        AddressCase{kOpen, "0251.0376.0251.0376", 80, false, "metadata"},
        AddressCase{kOpen, "169.254.43518", 80, false, "metadata"},
        AddressCase{kOpen, "::ffff:169.254.169.254", 80, false, "metadata"},
        AddressCase{kOpen, "[::ffff:a9fe:a9fe]", 80, false, "metadata"},
        AddressCase{kOpen, "64:ff9b::a9fe:a9fe", 80, false, "metadata"},
        AddressCase{kOpen, "2002:a9fe:a9fe::1", 80, false, "metadata"},
        AddressCase{kOpen, "::a9fe:a9fe", 80, false, "metadata"},
        AddressCase{kOpen, "169.254.170.2", 80, false, "metadata"},
        AddressCase{kOpen, "100.100.100.200", 80, false, "metadata"},
        AddressCase{kOpen, "192.0.0.192", 80, false, "metadata"},
        AddressCase{kOpen, "fd00:ec2::254", 80, false, "metadata"},
        AddressCase{kOpen, "192.0.0.193", 80, false, "always-deny:192.0.0.0/24"},
        AddressCase{kOpen, "192.0.1.193", 80, true, "mode:open"},  // control: past 192.0.0.0/24
        // the embedded IPv4 of mapped, NAT64, 6to4 and Teredo addresses
        AddressCase{kOpen, "::ffff:127.0.0.1", 80, false, "always-deny:127.0.0.0/8"},
        AddressCase{kOpen, "::ffff:10.0.0.1", 80, false, "always-deny:10.0.0.0/8"},
        AddressCase{kOpen, "::ffff:8.8.8.8", 80, true, "mode:open"},
        AddressCase{kOpen, "64:ff9b::8.8.8.8", 80, false, "always-deny:64:ff9b::/96"},
        AddressCase{kOpen, "2002:0808:0808::1", 80, false, "always-deny:2002::/16"},
        AddressCase{kOpen, "2001:0:4136:e378:8000:63bf:3fff:fdd2", 80, false,
                    "always-deny:2001::/32"},
        AddressCase{R"({"mode":"open","allow":["64:ff9b::/96"]})", "64:ff9b::8.8.8.8", 80, true,
                    "64:ff9b::/96"},
        AddressCase{R"({"mode":"open","allow":["64:ff9b::/96"]})", "64:ff9b::10.0.0.1", 80,
                    false, "always-deny:10.0.0.0/8"},
        AddressCase{R"({"mode":"open","allow":["2002::/16"]})", "2002:7f00:1::", 80, false,
                    "always-deny:127.0.0.0/8"},
        // an allow CIDR inside an openable range opens it; a wider one does not
        AddressCase{nullptr, "10.1.2.3", 443, true, "10.1.2.0/24"},
        AddressCase{nullptr, "10.1.3.3", 443, false, "always-deny:10.0.0.0/8"},
        AddressCase{kOpenEverything, "10.200.0.1", 80, true, "0.0.0.0/0"},
        AddressCase{R"({"mode":"open","allow":["0.0.0.0/0"]})", "10.200.0.1", 80, false,
                    "always-deny:10.0.0.0/8"},
        AddressCase{R"({"mode":"allowlist","allow":["fd00:1::/32"]})", "fd00:1::5", 80, true,
                    "fd00:1::/32"},
        // loopback, link-local and metadata: no rule opens them
        AddressCase{kOpenEverything, "127.0.0.1", 80, false, "always-deny:127.0.0.0/8"},
        AddressCase{kOpenEverything, "169.254.1.1", 80, false, "always-deny:169.254.0.0/16"},
        AddressCase{kOpenEverything, "169.254.169.254", 80, false, "metadata"},
        AddressCase{kOpenEverything, "fd00:ec2::254", 80, false, "metadata"},
        AddressCase{kOpenEverything, "100.100.100.200", 80, false, "metadata"},
        AddressCase{kOpenEverything, "192.0.0.192", 80, false, "metadata"},
        AddressCase{kOpenEverything, "fd00:ec2::253", 80, true, "::/0"},
        // mode none: nothing
        AddressCase{R"({"mode":"none"})", "8.8.8.8", 443, false, "mode:none"}));

TEST(AddressVerdict, HostDeniedRangesBeatEveryRule) {
  NetworkPolicy p = Policy(R"({"mode":"open","allow":["198.51.100.0/24","10.0.0.0/8"]})");
  EXPECT_TRUE(p.CheckAddress(Ip("198.51.100.9"), 443).allowed);  // control
  EXPECT_TRUE(p.CheckAddress(Ip("10.77.0.1"), 443).allowed);     // control
  p.AddHostDenied(*Cidr::Parse("198.51.100.9/32"));
  p.AddHostDenied(*Cidr::Parse("10.77.0.0/16"));
  Verdict v = p.CheckAddress(Ip("198.51.100.9"), 443);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.rule, "host-denied");
  EXPECT_FALSE(p.CheckAddress(Ip("::ffff:10.77.3.4"), 443).allowed);
  EXPECT_TRUE(p.CheckAddress(Ip("198.51.100.10"), 443).allowed);
  EXPECT_TRUE(p.CheckAddress(Ip("10.78.0.1"), 443).allowed);
}

TEST(AddressVerdict, LoopbackOnlyForTests) {
  NetworkPolicy p = Policy(R"({"mode":"allowlist","allow":["pypi.org"]})");
  Verdict name = p.CheckName("pypi.org", 443);
  ASSERT_TRUE(name.allowed);
  EXPECT_FALSE(p.CheckResolved(name, Ip("127.0.0.1"), 443).allowed);
  p.TreatLoopbackAsPublicForTests();
  EXPECT_TRUE(p.CheckResolved(name, Ip("127.0.0.1"), 443).allowed);
  // Still no direct connection to a loopback literal in allowlist mode, and metadata stays shut.
  EXPECT_FALSE(p.CheckAddress(Ip("127.0.0.1"), 443).allowed);
  EXPECT_FALSE(p.CheckResolved(name, Ip("169.254.169.254"), 443).allowed);
}

// --- Resolved addresses of allowed names ---

TEST(ResolvedVerdict, RebindingToForbiddenAddressesDenied) {
  NetworkPolicy p = Policy(kDefault);
  Verdict name = p.CheckName("pypi.org", 443);
  ASSERT_TRUE(name.allowed);
  EXPECT_TRUE(p.CheckResolved(name, Ip("151.101.0.223"), 443).allowed);  // control
  EXPECT_EQ(p.CheckResolved(name, Ip("151.101.0.223"), 443).rule, "pypi.org");
  for (const char* bad : {"169.254.169.254", "::ffff:169.254.169.254", "127.0.0.1", "10.9.9.9",
                          "192.168.0.1", "fd00:ec2::254", "::1", "0.0.0.0", "203.0.113.66"}) {
    Verdict v = p.CheckResolved(name, Ip(bad), 443);
    EXPECT_FALSE(v.allowed) << bad;
    EXPECT_NE(v.reason.find("resolved to a forbidden address"), std::string::npos) << v.reason;
  }
  // An allowed name may resolve into an opened private range.
  EXPECT_TRUE(p.CheckResolved(name, Ip("10.1.2.9"), 443).allowed);
}

TEST(ResolvedVerdict, DeniedNamePassesThrough) {
  NetworkPolicy p = Policy(kDefault);
  Verdict name = p.CheckName("evil.example.com", 443);
  Verdict v = p.CheckResolved(name, Ip("151.101.0.223"), 443);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.rule, "allowlist");
}

TEST(Names, Normalise) {
  EXPECT_EQ(NormaliseName("A.B.C."), "a.b.c");
  EXPECT_EQ(NormaliseName("_dmarc.example.com"), "_dmarc.example.com");
  EXPECT_FALSE(NormaliseName("."));
  EXPECT_FALSE(NormaliseName(""));
  EXPECT_FALSE(NormaliseName("a..b"));
  EXPECT_FALSE(NormaliseName("caf\xc3\xa9.example"));
  EXPECT_EQ(HostPort("2001:db8::1", 443), "[2001:db8::1]:443");
  EXPECT_EQ(HostPort("pypi.org", 443), "pypi.org:443");
}

}  // namespace
}  // namespace airlock::net

namespace airlock::net {
namespace {

// What the DNS stub answers for: a name some port of which is allowed.
TEST(MayResolve, ANameWithAnyAllowedPortResolvesAndAWholeNameDenyWins) {
  const NetworkPolicy p = Policy(
      R"({"mode": "allowlist", "allow": ["pypi.org:443", "*.example.com", "203.0.113.0/24"],
          "deny": ["bad.example.com", "half.example.com:80"]})");
  EXPECT_TRUE(p.MayResolve("pypi.org"));
  EXPECT_TRUE(p.MayResolve("PyPI.org."));
  EXPECT_TRUE(p.MayResolve("a.example.com"));
  EXPECT_TRUE(p.MayResolve("half.example.com")) << "only its port 80 is denied";
  EXPECT_FALSE(p.MayResolve("bad.example.com"));
  EXPECT_FALSE(p.MayResolve("example.com")) << "a wildcard is not its apex";
  EXPECT_FALSE(p.MayResolve("other.org"));
  EXPECT_FALSE(p.MayResolve("203.0.113.5")) << "addresses are not names";
  EXPECT_FALSE(p.MayResolve("bad name"));
  const NetworkPolicy open = Policy(R"({"mode": "open", "deny": ["evil.test"]})");
  EXPECT_TRUE(open.MayResolve("anything.test"));
  EXPECT_FALSE(open.MayResolve("evil.test"));
  EXPECT_FALSE(Policy(R"({"mode": "none"})").MayResolve("pypi.org"));
}

}  // namespace
}  // namespace airlock::net
