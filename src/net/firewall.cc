#include "net/firewall.h"

#include <nftables/libnftables.h>

#include <algorithm>
#include <mutex>
#include <utility>

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

// "a, b, c": each range of `rules` of one family and port.
std::string Elements(const std::vector<PacketRule>& rules, bool v6, uint16_t port) {
  std::string out;
  for (const PacketRule& r : rules) {
    if (r.range.network.is_v6() != v6 || r.port != port) continue;
    out += (out.empty() ? "" : ", ") + r.range.ToString();
  }
  return out;
}

std::string Elements(const std::vector<Cidr>& ranges, bool v6) {
  std::vector<PacketRule> rules;
  for (const Cidr& c : ranges) rules.push_back({c, 0, ""});
  return Elements(rules, v6, 0);
}

// One rule per family and port of `rules`, each ending in `verdict`: "ip daddr { ... } th dport
// 443 reject ...".
std::string Rules(const std::vector<PacketRule>& rules, const std::string& verdict) {
  std::vector<uint16_t> ports;
  for (const PacketRule& r : rules) {
    if (std::find(ports.begin(), ports.end(), r.port) == ports.end()) ports.push_back(r.port);
  }
  std::sort(ports.begin(), ports.end());
  std::string out;
  for (bool v6 : {false, true}) {
    for (uint16_t port : ports) {
      const std::string set = Elements(rules, v6, port);
      if (set.empty()) continue;
      out += std::string(v6 ? "ip6" : "ip") + " daddr { " + set + " }";
      if (port != 0)
        out += " meta l4proto { tcp, udp, sctp, dccp, udplite } th dport " + std::to_string(port);
      out += " " + verdict + "\n";
    }
  }
  return out;
}

constexpr char kReject[] = "reject with icmpx admin-prohibited";

}  // namespace

SandboxFilter SandboxFilter::For(const NetworkPolicy& policy,
                                 const std::vector<PacketRule>& denied_addresses,
                                 uint32_t max_connections) {
  SandboxFilter f;
  f.mode = policy.mode() == NetworkMode::kOpen ? FirewallMode::kOpen : FirewallMode::kAllowlist;
  f.max_connections = max_connections;
  for (const Rule& r : policy.deny()) {
    if (r.kind == Rule::Kind::kCidr) f.deny.push_back({r.cidr, r.port, r.text});
  }
  f.deny.insert(f.deny.end(), denied_addresses.begin(), denied_addresses.end());
  for (const Rule& r : policy.allow()) {
    if (r.kind != Rule::Kind::kCidr) continue;
    if (InsideOpenableRange(r.cidr)) {
      f.open.push_back({r.cidr, r.port, r.text});
    } else if (f.mode == FirewallMode::kAllowlist) {
      f.allow.push_back({r.cidr, r.port, r.text});
    }
  }
  f.names = f.mode == FirewallMode::kOpen && policy.DeniesNames();
  return f;
}

std::string Firewall::ChainName(const std::string& ifname) {
  std::string out = "sbx_" + ifname;
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

std::string Firewall::Script(const FirewallConfig& c) {
  const std::string t = "inet " + c.table, veth = "\"" + c.veth_prefix + "*\"";
  const std::string proxy = std::to_string(c.proxy_port);
  const bool ipv6 = !c.subnet6.empty();
  // Where sandboxes go out: the uplink interface, or the transit veth to a namespace uplink.
  const std::string transit = c.transit.empty() ? "" : "\"" + c.transit + "\"";
  std::string out = transit;
  if (out.empty() && !c.uplink.empty()) out = "\"" + c.uplink + "\"";
  // Never reached, whatever a sandbox's rules say: the reserved ranges no rule opens, the
  // metadata endpoints, the host's own addresses and the sandboxes' own subnets.
  std::vector<Cidr> never = ReservedRanges(false);
  for (const IpAddress& ip : MetadataAddresses()) never.push_back({ip, ip.is_v4() ? 32 : 128});
  never.insert(never.end(), c.host_denied.begin(), c.host_denied.end());
  for (const std::string& subnet : {c.subnet, c.subnet6}) {
    if (auto range = Cidr::Parse(subnet)) never.push_back(*range);
  }
  // An IPv4-mapped address has no business on the wire.
  never.push_back(*Cidr::Parse("::ffff:0:0/96"));
  const std::vector<Cidr> openable = ReservedRanges(true);
  std::string s;
  // "add" then "delete" makes the delete succeed whether or not the table was there.
  s += "add table " + t + "\n";
  s += "delete table " + t + "\n";
  s += "table " + t + " {\n";
  s += "  set allowlist { type ifname; }\n";
  s += "  set open { type ifname; }\n";
  s += "  set named { type ifname; }\n";
  s += "  set never4 { type ipv4_addr; flags interval; auto-merge; elements = { " +
       Elements(never, false) + " } }\n";
  s += "  set never6 { type ipv6_addr; flags interval; auto-merge; elements = { " +
       Elements(never, true) + " } }\n";
  s += "  set private4 { type ipv4_addr; flags interval; auto-merge; elements = { " +
       Elements(openable, false) + " } }\n";
  s += "  set private6 { type ipv6_addr; flags interval; auto-merge; elements = { " +
       Elements(openable, true) + " } }\n";
  // Each sandbox's own chain, by its interface (Apply).
  s += "  map filters { type ifname : verdict; }\n";
  // To the host itself: the proxy (an explicit client in either mode; redirected web traffic) and
  // DNS, nothing else.
  s += "  chain input {\n";
  s += "    type filter hook input priority filter; policy accept;\n";
  s += "    iifname " + veth + " goto sandbox_in\n";
  if (!transit.empty()) {  // the uplink namespace reaches nothing on the host
    s += "    iifname " + transit + " ct state established,related accept\n";
    s += "    iifname " + transit + " drop\n";
  }
  s += "  }\n";
  s += "  chain sandbox_in {\n";
  if (ipv6) {  // neighbour discovery with the gateway
    s += "    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept\n";
  } else {
    s += "    meta nfproto ipv6 drop\n";
  }
  s += "    ct state established,related accept\n";
  s += "    iifname @allowlist tcp dport " + proxy + " accept\n";
  s += "    iifname @open tcp dport " + proxy + " accept\n";
  s += "    iifname @allowlist udp dport 53 accept\n";
  s += "    iifname @open udp dport 53 accept\n";
  s += "    drop\n";
  s += "  }\n";
  // Through the host: only to the uplink, never to the never-ranges or the host, then each
  // sandbox's own chain. A veth with no chain (a sandbox being made, or parked) sends nothing.
  s += "  chain forward {\n";
  s += "    type filter hook forward priority filter; policy accept;\n";
  s += "    iifname " + veth + " goto sandbox_out\n";
  s += "    oifname " + veth + " ct state established,related accept\n";
  s += "    oifname " + veth + " drop\n";
  if (!transit.empty()) s += "    iifname " + transit + " drop\n";  // not a router for it
  s += "  }\n";
  s += "  chain sandbox_out {\n";
  if (!ipv6) s += "    meta nfproto ipv6 drop\n";
  if (!out.empty()) {
    s += "    ip daddr @never4 drop\n";
    s += "    ip6 daddr @never6 drop\n";
    s += "    fib daddr type local drop\n";
    s += "    oifname != " + out + " drop\n";
    s += "    iifname vmap @filters\n";
  }
  s += "    drop\n";
  s += "  }\n";
  // Web traffic of allowlist sandboxes (and of open ones with name rules) goes to the proxy
  // whatever address they dial; the DNS of the latter goes to their stub whatever server.
  s += "  chain prerouting {\n";
  s += "    type nat hook prerouting priority dstnat; policy accept;\n";
  s += "    iifname @allowlist tcp dport { 80, 443 } redirect to :" + proxy + "\n";
  s += "    iifname @named tcp dport { 80, 443 } redirect to :" + proxy + "\n";
  s += "    iifname @named udp dport 53 redirect to :53\n";
  s += "  }\n";
  if (transit.empty() && !c.uplink.empty() && !c.subnet.empty()) {
    s += "  chain postrouting {\n";
    s += "    type nat hook postrouting priority srcnat; policy accept;\n";
    s += "    ip saddr " + c.subnet + " oifname \"" + c.uplink + "\" masquerade\n";
    if (ipv6) s += "    ip6 saddr " + c.subnet6 + " oifname \"" + c.uplink + "\" masquerade\n";
    s += "  }\n";
  }
  s += "}\n";
  return s;
}

std::string Firewall::ApplyScript(const std::string& table, const std::string& ifname,
                                  const SandboxFilter& f) {
  const std::string t = "inet " + table, chain = t + " " + ChainName(ifname);
  std::string rules;
  if (f.max_connections > 0) {
    rules +=
        "ct state new ct count over " + std::to_string(f.max_connections) + " " + kReject + "\n";
  }
  rules += Rules(f.deny, kReject);
  if (f.names) rules += std::string("udp dport 443 ") + kReject + "\n";  // QUIC
  rules += Rules(f.open, "accept");
  rules += std::string("ip daddr @private4 ") + kReject + "\n";
  rules += std::string("ip6 daddr @private6 ") + kReject + "\n";
  if (f.mode == FirewallMode::kOpen) {
    rules += "accept\n";
  } else {
    rules += Rules(f.allow, "accept");
    rules += std::string(kReject) + "\n";
  }
  std::string s = "add chain " + chain + "\nflush chain " + chain + "\n";
  size_t at = 0;
  while (at < rules.size()) {
    const size_t nl = rules.find('\n', at);
    s += "add rule " + chain + " " + rules.substr(at, nl - at) + "\n";
    at = nl + 1;
  }
  const std::string e = " { \"" + ifname + "\" }\n";
  s += "add element " + t + " filters { \"" + ifname + "\" : goto " + ChainName(ifname) + " }\n";
  // In the sets of its mode, out of the others (add + delete: a delete cannot fail on a missing
  // element).
  const bool open = f.mode == FirewallMode::kOpen;
  for (auto [set, member] : {std::pair{"allowlist", !open}, {"open", open}, {"named", f.names}}) {
    s += "add element " + t + " " + set + e;
    if (!member) s += "delete element " + t + " " + set + e;
  }
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
  for (const std::string& subnet : {config.subnet, config.subnet6}) {
    if (!subnet.empty() && !Cidr::Parse(subnet)) {
      return Fail(ErrorCode::kInvalidArgument,
                  "the firewall's subnet " + subnet + " is not a CIDR");
    }
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

Status Firewall::Apply(const std::string& ifname, const SandboxFilter& filter) {
  if (!SafeIfname(ifname)) return Fail(ErrorCode::kInvalidArgument, "bad interface name " + ifname);
  if (filter.mode == FirewallMode::kOpen && config_.uplink.empty() && config_.transit.empty()) {
    return Fail(ErrorCode::kFailedPrecondition,
                "network mode open needs an uplink (network_uplink in airlockd.toml)");
  }
  return Run(ApplyScript(config_.table, ifname, filter));
}

Status Firewall::Remove(const std::string& ifname) {
  if (!SafeIfname(ifname)) return Fail(ErrorCode::kInvalidArgument, "bad interface name " + ifname);
  const std::string t = "inet " + config_.table, e = " { \"" + ifname + "\" }\n";
  const std::string chain = t + " " + ChainName(ifname);
  // Made first where missing, so that every delete finds what it deletes; the map's element goes
  // before the chain it jumps to.
  std::string cmds = "add chain " + chain + "\nadd element " + t + " filters { \"" + ifname +
                     "\" : goto " + ChainName(ifname) + " }\ndelete element " + t + " filters" + e +
                     "flush chain " + chain + "\ndelete chain " + chain + "\n";
  for (const char* set : {"allowlist", "open", "named"}) {
    cmds += "add element " + t + " " + set + e + "delete element " + t + " " + set + e;
  }
  return Run(cmds);
}

}  // namespace airlock::net
