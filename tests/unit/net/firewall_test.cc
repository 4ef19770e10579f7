// The daemon's nftables table (src/net/firewall.h), installed in a network namespace of the
// test's own (so the host's firewall is never touched), read back with `nft`. Needs root.

#include "net/firewall.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace airlock::net {
namespace {

std::string Nft(const std::string& args) {
  std::string out;
  FILE* p = ::popen(("nft " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  ::pclose(p);
  return out;
}

class FirewallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace and nftables)";
    if (::access("/usr/sbin/nft", X_OK) != 0) GTEST_SKIP() << "nft (nftables) is not installed";
    // This thread (gtest runs tests on one) and what it starts live in a fresh namespace.
    ASSERT_EQ(::unshare(CLONE_NEWNET), 0);
  }
  FirewallConfig Config() {
    FirewallConfig c;
    c.table = "airlock_test";
    c.subnet = "10.213.0.0/16";
    c.proxy_port = 3128;
    c.uplink = "up0";
    return c;
  }
};

SandboxFilter Open() {
  SandboxFilter f;
  f.mode = FirewallMode::kOpen;
  return f;
}

PacketRule Rule(const char* cidr, uint16_t port = 0, const char* rule = "") {
  return {*Cidr::Parse(cidr), port, rule};
}

// The rules of one chain in `nft list` output.
std::string Chain(const std::string& table, const std::string& name) {
  const size_t at = table.find("chain " + name + " {");
  if (at == std::string::npos) return "";
  return table.substr(at, table.find('}', table.find('\n', at)) - at);
}

TEST_F(FirewallTest, InstallApplyRemoveAndUninstall) {
  {
    auto fw = Firewall::Install(Config());
    ASSERT_TRUE(fw) << fw.error().message();
    const std::string table = Nft("list table inet airlock_test");
    for (const char* want :
         {"chain sandbox_in", "chain sandbox_out", "redirect to :3128", "masquerade",
          "169.254.0.0/16", "10.0.0.0/8", "map filters", "iifname vmap @filters"}) {
      EXPECT_NE(table.find(want), std::string::npos) << want << " in\n" << table;
    }
    SandboxFilter allowlist;
    ASSERT_TRUE((*fw)->Apply("alh-one", allowlist));
    ASSERT_TRUE((*fw)->Apply("alh-two", Open()));
    EXPECT_NE(Nft("list set inet airlock_test allowlist").find("\"alh-one\""), std::string::npos);
    EXPECT_EQ(Nft("list set inet airlock_test allowlist").find("alh-two"), std::string::npos);
    EXPECT_NE(Nft("list map inet airlock_test filters").find("\"alh-one\" : goto sbx_alh_one"),
              std::string::npos);
    // A mode change moves the interface from one set to the other and replaces its chain.
    ASSERT_TRUE((*fw)->Apply("alh-one", Open()));
    EXPECT_EQ(Nft("list set inet airlock_test allowlist").find("alh-one"), std::string::npos);
    EXPECT_NE(Nft("list set inet airlock_test open").find("\"alh-one\""), std::string::npos);
    const std::string chain = Nft("list chain inet airlock_test sbx_alh_one");
    EXPECT_NE(chain.find("accept"), std::string::npos) << chain;
    EXPECT_EQ(chain.find("reject with icmpx admin-prohibited\n\t}"), std::string::npos)
        << "an open chain ends in accept, not in the allowlist's reject:\n"
        << chain;
    ASSERT_TRUE((*fw)->Remove("alh-one"));
    ASSERT_TRUE((*fw)->Remove("alh-one")) << "removing twice is not an error";
    EXPECT_EQ(Nft("list set inet airlock_test open").find("alh-one"), std::string::npos);
    EXPECT_EQ(Nft("list map inet airlock_test filters").find("alh-one"), std::string::npos);
    EXPECT_EQ(Nft("list table inet airlock_test").find("sbx_alh_one"), std::string::npos);
    EXPECT_NE(Nft("list table inet airlock_test").find("sbx_alh_two"), std::string::npos)
        << "the other sandbox keeps its chain (positive control)";
    // Installing again (a restarted daemon) replaces the table: the sets start empty.
    auto again = Firewall::Install(Config());
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(Nft("list set inet airlock_test open").find("alh-two"), std::string::npos);
    again->reset();
  }
  EXPECT_NE(Nft("list table inet airlock_test").find("No such file"), std::string::npos)
      << "the table goes with the firewall";
}

TEST_F(FirewallTest, ASandboxsRulesBecomeItsChainInOrder) {
  FirewallConfig c = Config();
  c.subnet6 = "fd0a:213::/64";
  auto fw = Firewall::Install(c);
  ASSERT_TRUE(fw) << fw.error().message();
  SandboxFilter f = Open();
  f.deny = {Rule("198.51.100.0/24"), Rule("203.0.113.7", 8080), Rule("2001:db8:5::/48"),
            Rule("203.0.113.9", 8080)};
  f.open = {Rule("10.1.0.0/16", 5432)};
  f.names = true;
  f.max_connections = 64;
  ASSERT_TRUE((*fw)->Apply("alh-one", f));
  const std::string chain = Nft("list chain inet airlock_test sbx_alh_one");
  const char* order[] = {
      "ct state new ct count over 64 reject",
      "ip daddr 198.51.100.0/24 reject with icmpx admin-prohibited",
      ("ip daddr { 203.0.113.7, 203.0.113.9 } meta l4proto { tcp, udp, dccp, sctp, udplite } th "
       "dport 8080 reject"),
      "ip6 daddr 2001:db8:5::/48 reject",
      "udp dport 443 reject",
      "ip daddr 10.1.0.0/16 meta l4proto { tcp, udp, dccp, sctp, udplite } th dport 5432 accept",
      "ip daddr @private4 reject",
      "ip6 daddr @private6 reject",
  };
  size_t at = 0;
  for (const char* want : order) {
    const size_t found = chain.find(want);
    ASSERT_NE(found, std::string::npos) << want << " in\n" << chain;
    EXPECT_GT(found, at) << want << " out of order in\n" << chain;
    at = found;
  }
  EXPECT_NE(Nft("list set inet airlock_test named").find("\"alh-one\""), std::string::npos);
  // Allowlist: the allow ranges are accepted, then everything else is rejected.
  SandboxFilter a;
  a.allow = {Rule("203.0.113.0/24", 22)};
  ASSERT_TRUE((*fw)->Apply("alh-one", a));
  const std::string allow = Nft("list chain inet airlock_test sbx_alh_one");
  EXPECT_NE(allow.find("ip daddr 203.0.113.0/24 meta l4proto { tcp, udp, dccp, sctp, udplite } "
                       "th dport 22 accept"),
            std::string::npos)
      << allow;
  EXPECT_EQ(allow.find("198.51.100.0/24"), std::string::npos) << "replaced whole:\n" << allow;
  EXPECT_LT(allow.find("dport 22 accept"), allow.rfind("reject with icmpx admin-prohibited"));
  EXPECT_EQ(Nft("list set inet airlock_test named").find("alh-one"), std::string::npos);
  // IPv6 is forwarded (no blanket drop) and masqueraded when the config has a subnet for it;
  // without one (the positive control) it is dropped.
  const std::string table = Nft("list table inet airlock_test");
  EXPECT_NE(table.find("ip6 saddr fd0a:213::/64 oifname \"up0\" masquerade"), std::string::npos);
  EXPECT_EQ(Chain(table, "sandbox_out").find("meta nfproto ipv6 drop"), std::string::npos);
  EXPECT_NE(Chain(Firewall::Script(Config()), "sandbox_out").find("meta nfproto ipv6 drop"),
            std::string::npos);
  // The never-sets hold the metadata endpoints and the subnets, the private sets what opens.
  const std::string never6 = Nft("list set inet airlock_test never6");
  EXPECT_NE(never6.find("fd00:ec2::254"), std::string::npos) << never6;
  EXPECT_NE(never6.find("fd0a:213::/64"), std::string::npos) << never6;
  const std::string never4 = Nft("list set inet airlock_test never4");
  EXPECT_NE(never4.find("168.63.129.16"), std::string::npos) << never4;
  EXPECT_NE(never4.find("100.100.100.200"), std::string::npos) << never4;
  EXPECT_NE(never4.find("10.213.0.0/16"), std::string::npos) << never4;
  EXPECT_NE(Nft("list set inet airlock_test private4").find("10.0.0.0/8"), std::string::npos);
}

// "range:port" of each rule, for comparing filters without the rule texts.
std::vector<std::string> Ranges(const std::vector<PacketRule>& rules) {
  std::vector<std::string> out;
  for (const PacketRule& r : rules)
    out.push_back(r.range.ToString() + ":" + std::to_string(r.port));
  return out;
}

TEST(SandboxFilterFor, SplitsAPolicyIntoWhatHoldsPerPacket) {
  auto policy = [](const char* text) {
    auto p = NetworkPolicy::FromJson(nlohmann::json::parse(text));
    EXPECT_TRUE(p) << text;
    return *p;
  };
  const std::vector<PacketRule> resolved = {Rule("198.18.0.9", 0, "evil.test"),
                                            Rule("2001:db8::9", 0, "evil.test")};
  SandboxFilter open = SandboxFilter::For(
      policy(R"({"mode":"open","deny":["198.51.100.0/24","203.0.113.7:8080","evil.test"],
                 "allow":["10.1.0.0/16:5432","203.0.113.0/24","x.test"]})"),
      resolved, 32);
  EXPECT_EQ(open.mode, FirewallMode::kOpen);
  EXPECT_EQ(Ranges(open.deny), (std::vector<std::string>{"198.51.100.0/24:0", "203.0.113.7/32:8080",
                                                         "198.18.0.9/32:0", "2001:db8::9/128:0"}));
  EXPECT_EQ(open.deny[2].rule, "evil.test") << "a resolved address keeps its name's rule";
  EXPECT_EQ(Ranges(open.open), (std::vector<std::string>{"10.1.0.0/16:5432"}));
  EXPECT_TRUE(open.allow.empty()) << "open mode accepts what is public anyway";
  EXPECT_TRUE(open.names);
  EXPECT_EQ(open.max_connections, 32u);
  SandboxFilter allowlist =
      SandboxFilter::For(policy(R"({"mode":"allowlist","allow":["0.0.0.0/0","10.1.0.0/16","x.test"],
                 "deny":["*.evil.test"]})"),
                         {}, 0);
  EXPECT_EQ(allowlist.mode, FirewallMode::kAllowlist);
  // 0.0.0.0/0 covers the private ranges without lying inside one: it does not open them.
  EXPECT_EQ(Ranges(allowlist.allow), (std::vector<std::string>{"0.0.0.0/0:0"}));
  EXPECT_EQ(Ranges(allowlist.open), (std::vector<std::string>{"10.1.0.0/16:0"}));
  EXPECT_FALSE(allowlist.names) << "allowlist web traffic goes to the proxy anyway";
  EXPECT_FALSE(
      SandboxFilter::For(policy(R"({"mode":"open","deny":["198.51.100.0/24"]})"), {}, 0).names);
}

TEST_F(FirewallTest, HostileNamesAreRefused) {
  FirewallConfig bad = Config();
  bad.uplink = "eth0\"; flush ruleset; \"";
  auto refused = Firewall::Install(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  auto fw = Firewall::Install(Config());
  ASSERT_TRUE(fw) << fw.error().message();
  EXPECT_FALSE((*fw)->Apply("x\" }; flush ruleset; {\"", Open()));
  EXPECT_FALSE((*fw)->Apply("much-too-long-interface", Open()));
  // Without an uplink there is no open mode.
  fw->reset();
  FirewallConfig closed = Config();
  closed.uplink = "";
  auto no_uplink = Firewall::Install(closed);
  ASSERT_TRUE(no_uplink) << no_uplink.error().message();
  auto open = (*no_uplink)->Apply("alh-x", Open());
  ASSERT_FALSE(open);
  EXPECT_EQ(open.error().code(), ErrorCode::kFailedPrecondition);
}

TEST_F(FirewallTest, NamespaceUplinkGoesOutTheTransitUnmasqueraded) {
  FirewallConfig c = Config();
  c.uplink = "";
  c.transit = "alaup";
  auto fw = Firewall::Install(c);
  ASSERT_TRUE(fw) << fw.error().message();
  const std::string table = Nft("list table inet airlock_test");
  // Open sandboxes leave only through the transit veth, still past the denied ranges and the
  // host's own addresses, and the host does not masquerade (the namespace does).
  const size_t out = table.find("chain sandbox_out");
  ASSERT_NE(out, std::string::npos) << table;
  const std::string chain = table.substr(out, table.find('}', out) - out);
  for (const char* want : {"ip daddr @never4 drop", "fib daddr type local drop",
                           "oifname != \"alaup\" drop", "iifname vmap @filters"}) {
    EXPECT_NE(chain.find(want), std::string::npos) << want << " in\n" << chain;
  }
  EXPECT_LT(chain.find("@never4"), chain.find("iifname vmap @filters"));
  EXPECT_EQ(table.find("masquerade"), std::string::npos) << table;
  EXPECT_EQ(table.find("up0"), std::string::npos) << table;
  // Nothing from the uplink namespace reaches the host or is routed by it, but replies.
  EXPECT_NE(table.find("iifname \"alaup\" ct state established,related accept"), std::string::npos)
      << table;
  EXPECT_NE(table.find("iifname \"alaup\" drop"), std::string::npos) << table;
  // Open mode exists with a transit and no uplink interface.
  EXPECT_TRUE((*fw)->Apply("alh-x", Open()));
  // The interface uplink's script is the positive control for the masquerade.
  EXPECT_NE(Firewall::Script(Config()).find("oifname \"up0\" masquerade"), std::string::npos);
  FirewallConfig hostile = c;
  hostile.transit = "x\"; flush ruleset; \"";
  EXPECT_FALSE(Firewall::Install(hostile));
}

TEST_F(FirewallTest, UplinkNamespaceTableInstallsAndGoes) {
  ASSERT_TRUE(
      Firewall::RunScript(Firewall::UplinkScript("airlock_test", "10.213.0.0/16", "alahost")));
  std::string table = Nft("list table inet airlock_test");
  for (const char* want :
       {"ip saddr 10.213.0.0/16 oifname != \"alahost\" masquerade",
        "oifname \"alahost\" ct state established,related accept", "oifname \"alahost\" drop",
        "ip saddr != 10.213.0.0/16 drop", "iifname \"alahost\" drop"}) {
    EXPECT_NE(table.find(want), std::string::npos) << want << " in\n" << table;
  }
  // Again (a restart): replaced, not doubled.
  ASSERT_TRUE(
      Firewall::RunScript(Firewall::UplinkScript("airlock_test", "10.213.0.0/16", "alahost")));
  table = Nft("list table inet airlock_test");
  const std::string rule = "masquerade";
  EXPECT_EQ(table.find(rule), table.rfind(rule)) << table;
  ASSERT_TRUE(Firewall::RunScript(Firewall::DeleteScript("airlock_test")));
  EXPECT_NE(Nft("list table inet airlock_test").find("No such file"), std::string::npos);
  ASSERT_TRUE(Firewall::RunScript(Firewall::DeleteScript("airlock_test"))) << "when gone too";
  EXPECT_FALSE(Firewall::RunScript("this is not nftables"));
}

}  // namespace
}  // namespace airlock::net
