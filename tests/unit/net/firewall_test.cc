// The daemon's nftables table (src/net/firewall.h), installed in a network namespace of the
// test's own (so the host's firewall is never touched), read back with `nft`. Needs root.

#include "net/firewall.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

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

TEST_F(FirewallTest, InstallSetModeRemoveAndUninstall) {
  {
    auto fw = Firewall::Install(Config());
    ASSERT_TRUE(fw) << fw.error().message();
    const std::string table = Nft("list table inet airlock_test");
    for (const char* want : {"chain sandbox_in", "chain sandbox_out", "redirect to :3128",
                             "masquerade", "169.254.0.0/16", "10.0.0.0/8"}) {
      EXPECT_NE(table.find(want), std::string::npos) << want << " in\n" << table;
    }
    ASSERT_TRUE((*fw)->SetMode("alh-one", FirewallMode::kAllowlist));
    ASSERT_TRUE((*fw)->SetMode("alh-two", FirewallMode::kOpen));
    EXPECT_NE(Nft("list set inet airlock_test allowlist").find("\"alh-one\""), std::string::npos);
    EXPECT_EQ(Nft("list set inet airlock_test allowlist").find("alh-two"), std::string::npos);
    // A mode change moves the interface from one set to the other.
    ASSERT_TRUE((*fw)->SetMode("alh-one", FirewallMode::kOpen));
    EXPECT_EQ(Nft("list set inet airlock_test allowlist").find("alh-one"), std::string::npos);
    EXPECT_NE(Nft("list set inet airlock_test open").find("\"alh-one\""), std::string::npos);
    ASSERT_TRUE((*fw)->Remove("alh-one"));
    ASSERT_TRUE((*fw)->Remove("alh-one")) << "removing twice is not an error";
    EXPECT_EQ(Nft("list set inet airlock_test open").find("alh-one"), std::string::npos);
    // Installing again (a restarted daemon) replaces the table: the sets start empty.
    auto again = Firewall::Install(Config());
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(Nft("list set inet airlock_test open").find("alh-two"), std::string::npos);
    again->reset();
  }
  EXPECT_NE(Nft("list table inet airlock_test").find("No such file"), std::string::npos)
      << "the table goes with the firewall";
}

TEST_F(FirewallTest, HostileNamesAreRefused) {
  FirewallConfig bad = Config();
  bad.uplink = "eth0\"; flush ruleset; \"";
  auto refused = Firewall::Install(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  auto fw = Firewall::Install(Config());
  ASSERT_TRUE(fw) << fw.error().message();
  EXPECT_FALSE((*fw)->SetMode("x\" }; flush ruleset; {\"", FirewallMode::kOpen));
  EXPECT_FALSE((*fw)->SetMode("much-too-long-interface", FirewallMode::kOpen));
  // Without an uplink there is no open mode.
  fw->reset();
  FirewallConfig closed = Config();
  closed.uplink = "";
  auto no_uplink = Firewall::Install(closed);
  ASSERT_TRUE(no_uplink) << no_uplink.error().message();
  auto open = (*no_uplink)->SetMode("alh-x", FirewallMode::kOpen);
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
  for (const char* want :
       {"ip daddr @deny4 drop", "fib daddr type local drop", "oifname \"alaup\" accept"}) {
    EXPECT_NE(chain.find(want), std::string::npos) << want << " in\n" << chain;
  }
  EXPECT_LT(chain.find("@deny4"), chain.find("oifname \"alaup\" accept"));
  EXPECT_EQ(table.find("masquerade"), std::string::npos) << table;
  EXPECT_EQ(table.find("up0"), std::string::npos) << table;
  // Nothing from the uplink namespace reaches the host or is routed by it, but replies.
  EXPECT_NE(table.find("iifname \"alaup\" ct state established,related accept"), std::string::npos)
      << table;
  EXPECT_NE(table.find("iifname \"alaup\" drop"), std::string::npos) << table;
  // Open mode exists with a transit and no uplink interface.
  EXPECT_TRUE((*fw)->SetMode("alh-x", FirewallMode::kOpen));
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
