#include "net/firewall.h"

#include <nftables/libnftables.h>

#include <mutex>

namespace airlock::net {
namespace {

// libnftables keeps state in its context and is not thread-safe; one lock for every context of
// the process keeps the calls one at a time.
std::mutex& NftMutex() {
  static std::mutex mu;
  return mu;
}

// Interface names come from the daemon (prefix + part of a sandbox id) but are quoted anyway.
bool SafeIfname(const std::string& name) {
  if (name.empty() || name.size() > 15) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string Firewall::Script(const FirewallConfig& c) {
  const std::string t = "inet " + c.table, veth = "\"" + c.veth_prefix + "*\"";
  const std::string proxy = std::to_string(c.proxy_port);
  // Where open sandboxes go out: the uplink interface, or the transit veth to a namespace uplink.
  const std::string transit = c.transit.empty() ? "" : "\"" + c.transit + "\"";
  std::string out = transit;
  if (out.empty() && !c.uplink.empty()) out = "\"" + c.uplink + "\"";
  std::string deny = "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, "
                     "172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, 224.0.0.0/3";
  for (const std::string& cidr : c.deny) deny += ", " + cidr;
  if (!c.subnet.empty()) deny += ", " + c.subnet;  // other sandboxes
  std::string s;
  // "add" then "delete" makes the delete succeed whether or not the table was there.
  s += "add table " + t + "\n";
  s += "delete table " + t + "\n";
  s += "table " + t + " {\n";
  s += "  set allowlist { type ifname; }\n";
  s += "  set open { type ifname; }\n";
  s += "  set deny4 { type ipv4_addr; flags interval; auto-merge; elements = { " + deny + " } }\n";
  // To the host itself: the proxy (allowlist) and DNS (both modes), nothing else.
  s += "  chain input {\n";
  s += "    type filter hook input priority filter; policy accept;\n";
  s += "    iifname " + veth + " goto sandbox_in\n";
  if (!transit.empty()) {  // the uplink namespace reaches nothing on the host
    s += "    iifname " + transit + " ct state established,related accept\n";
    s += "    iifname " + transit + " drop\n";
  }
  s += "  }\n";
  s += "  chain sandbox_in {\n";
  s += "    meta nfproto ipv6 drop\n";
  s += "    ct state established,related accept\n";
  s += "    iifname @allowlist tcp dport " + proxy + " accept\n";
  s += "    iifname @allowlist udp dport 53 accept\n";
  s += "    iifname @open udp dport 53 accept\n";
  s += "    drop\n";
  s += "  }\n";
  // Through the host: only open sandboxes, only to the uplink, never to the denied ranges.
  s += "  chain forward {\n";
  s += "    type filter hook forward priority filter; policy accept;\n";
  s += "    iifname " + veth + " goto sandbox_out\n";
  s += "    oifname " + veth + " ct state established,related accept\n";
  s += "    oifname " + veth + " drop\n";
  if (!transit.empty()) s += "    iifname " + transit + " drop\n";  // not a router for it
  s += "  }\n";
  s += "  chain sandbox_out {\n";
  s += "    meta nfproto ipv6 drop\n";
  if (!out.empty()) {
    s += "    iifname != @open drop\n";
    s += "    ip daddr @deny4 drop\n";
    s += "    fib daddr type local drop\n";
    s += "    oifname " + out + " accept\n";
  }
  s += "    drop\n";
  s += "  }\n";
  // Allowlist sandboxes' web traffic goes to the proxy whatever address they dial.
  s += "  chain prerouting {\n";
  s += "    type nat hook prerouting priority dstnat; policy accept;\n";
  s += "    iifname @allowlist tcp dport { 80, 443 } redirect to :" + proxy + "\n";
  s += "  }\n";
  if (transit.empty() && !c.uplink.empty() && !c.subnet.empty()) {
    s += "  chain postrouting {\n";
    s += "    type nat hook postrouting priority srcnat; policy accept;\n";
    s += "    ip saddr " + c.subnet + " oifname \"" + c.uplink + "\" masquerade\n";
    s += "  }\n";
  }
  s += "}\n";
  return s;
}

std::string Firewall::UplinkScript(const std::string& table, const std::string& subnet,
                                   const std::string& peer) {
  const std::string t = "inet " + table, p = "\"" + peer + "\"";
  std::string s;
  s += "add table " + t + "\n";
  s += "delete table " + t + "\n";
  s += "table " + t + " {\n";
  // The sandboxes' traffic from the host: out anywhere (the host's table has judged it), and
  // only replies back to them.
  s += "  chain forward {\n";
  s += "    type filter hook forward priority filter; policy accept;\n";
  s += "    oifname " + p + " ct state established,related accept\n";
  s += "    oifname " + p + " drop\n";
  s += "    iifname " + p + " meta nfproto ipv6 drop\n";
  s += "    iifname " + p + " ip saddr != " + subnet + " drop\n";
  s += "  }\n";
  // Nothing of the namespace itself is a sandbox's to reach.
  s += "  chain input {\n";
  s += "    type filter hook input priority filter; policy accept;\n";
  s += "    iifname " + p + " ct state established,related accept\n";
  s += "    iifname " + p + " drop\n";
  s += "  }\n";
  s += "  chain postrouting {\n";
  s += "    type nat hook postrouting priority srcnat; policy accept;\n";
  s += "    ip saddr " + subnet + " oifname != " + p + " masquerade\n";
  s += "  }\n";
  s += "}\n";
  return s;
}

std::string Firewall::DeleteScript(const std::string& table) {
  return "add table inet " + table + "\ndelete table inet " + table + "\n";
}

Status Firewall::RunScript(const std::string& commands) {
  std::lock_guard lock(NftMutex());
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return Fail(ErrorCode::kInternal, "libnftables: nft_ctx_new failed");
  nft_ctx_buffer_error(ctx);
  int rc = nft_run_cmd_from_buffer(ctx, commands.c_str());
  std::string err = nft_ctx_get_error_buffer(ctx);
  nft_ctx_free(ctx);
  if (rc != 0) {
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    return Fail(ErrorCode::kInternal, "nftables: " + (err.empty() ? "failed" : err));
  }
  return {};
}

Result<std::unique_ptr<Firewall>> Firewall::Install(const FirewallConfig& config) {
  if (!SafeIfname(config.table) || !SafeIfname(config.veth_prefix) ||
      (!config.uplink.empty() && !SafeIfname(config.uplink)) ||
      (!config.transit.empty() && !SafeIfname(config.transit))) {
    return Fail(ErrorCode::kInvalidArgument,
                "the firewall's table, veth prefix and uplink must be interface-like names");
  }
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return Fail(ErrorCode::kInternal, "libnftables: nft_ctx_new failed");
  std::unique_ptr<Firewall> fw(new Firewall(config, ctx));
  if (auto st = fw->Run(Script(config)); !st) {
    return std::unexpected(st.error().Wrap("installing the nftables table " + config.table));
  }
  return fw;
}

Firewall::~Firewall() {
  (void)Run(DeleteScript(config_.table));
  std::lock_guard lock(NftMutex());
  nft_ctx_free(ctx_);
}

Status Firewall::Run(const std::string& commands) {
  std::lock_guard lock(NftMutex());
  nft_ctx_buffer_error(ctx_);
  int rc = nft_run_cmd_from_buffer(ctx_, commands.c_str());
  std::string err = nft_ctx_get_error_buffer(ctx_);
  nft_ctx_unbuffer_error(ctx_);
  if (rc != 0) {
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    return Fail(ErrorCode::kInternal, "nftables: " + (err.empty() ? "failed" : err));
  }
  return {};
}

Status Firewall::SetMode(const std::string& ifname, FirewallMode mode) {
  if (!SafeIfname(ifname)) return Fail(ErrorCode::kInvalidArgument, "bad interface name " + ifname);
  const std::string t = "inet " + config_.table, e = " { \"" + ifname + "\" }\n";
  const char* to = mode == FirewallMode::kOpen ? "open" : "allowlist";
  const char* from = mode == FirewallMode::kOpen ? "allowlist" : "open";
  if (mode == FirewallMode::kOpen && config_.uplink.empty() && config_.transit.empty()) {
    return Fail(ErrorCode::kFailedPrecondition,
                "network mode open needs an uplink (network_uplink in airlockd.toml)");
  }
  // add + delete + add: the delete cannot fail on a missing element, and the end state is one.
  return Run("add element " + t + " " + from + e + "delete element " + t + " " + from + e +
             "add element " + t + " " + to + e);
}

Status Firewall::Remove(const std::string& ifname) {
  if (!SafeIfname(ifname)) return Fail(ErrorCode::kInvalidArgument, "bad interface name " + ifname);
  const std::string t = "inet " + config_.table, e = " { \"" + ifname + "\" }\n";
  std::string cmds;
  for (const char* set : {"allowlist", "open"}) {
    cmds += "add element " + t + " " + set + e + "delete element " + t + " " + set + e;
  }
  return Run(cmds);
}

}  // namespace airlock::net
