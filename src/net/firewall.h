#pragma once
// The daemon's nftables table: what a sandbox's veth may send (docs/design/network.md,
// "Firewall"). One table per daemon (its name from the config, so that two daemons on one host
// keep out of each other's way). A sandbox joins it by its host-side interface name: the set of
// its mode, and a chain of its own (SandboxFilter) that the forward path jumps to through a
// verdict map, so that its own rules hold for every packet it sends.
//
//   allowlist: TCP 80/443 is redirected to the egress proxy; the proxy's port and DNS (53) on
//              the gateway are open to it; what its allow CIDR rules name is forwarded to the
//              uplink (where there is one), nothing else.
//   open:      forwarded to the uplink (masqueraded; or to the transit veth of a namespace
//              uplink, which masquerades) unless its own deny rules, the private ranges (but
//              what its allow CIDR rules open) or the never-ranges say otherwise. With name
//              rules, TCP 80/443 goes to the proxy and DNS to the stub, so that a name holds.
//              The proxy's port and DNS on the gateway are open to it too.
//   (none:     the sandbox has no veth at all; a veth in no set can send nothing.)
//
// IPv6 is forwarded only when the config enables it (an uplink with IPv6), by the same rules.
// The rules go through libnftables in process (libnftables-dev): a policy change is one netlink
// transaction, no process start.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/policy.h"

struct nft_ctx;

namespace airlock::net {

struct FirewallConfig {
  std::string table = "airlock";    // an nftables table in family inet
  std::string veth_prefix = "alh";  // the host side of every sandbox veth starts with it
  std::string subnet;               // where the sandbox addresses come from ("10.213.0.0/16")
  std::string subnet6;              // their IPv6 addresses ("": sandboxes have no IPv6)
  uint16_t proxy_port = 0;          // the egress proxy, on every gateway address
  std::string uplink;               // where open sandboxes go out; "": no open mode
  // With a network namespace as the uplink: the host's end of the transit veth to it. Open
  // sandboxes go out through it (instead of `uplink`), unmasqueraded (the namespace masquerades,
  // UplinkScript), and nothing that comes in through it is let in or forwarded but replies.
  std::string transit;
  // Destinations no sandbox reaches, on top of the reserved never-ranges and the metadata
  // endpoints (policy.h): the host's own addresses, its uplink namespace's.
  std::vector<Cidr> host_denied;
};

enum class FirewallMode { kAllowlist, kOpen };

// An address rule on a sandbox's packets: a range, and a port (0: every packet to the range;
// else TCP, UDP, SCTP, DCCP and UDP-Lite to that port).
struct PacketRule {
  Cidr range;
  uint16_t port = 0;
  std::string rule;  // for an address a denied name resolved to: that name's rule
  bool operator==(const PacketRule&) const = default;
};

// What the firewall enforces on every packet one sandbox sends through the host, in this order
// (after the never-ranges, the host's own addresses and the other sandboxes, which no rule
// opens): the connection cap, `deny` (rejected), `open` (accepted although inside a private
// range), the private ranges (rejected), then the mode: open accepts the rest, allowlist
// accepts `allow` and rejects the rest.
struct SandboxFilter {
  FirewallMode mode = FirewallMode::kAllowlist;
  std::vector<PacketRule> deny;
  std::vector<PacketRule> open;
  std::vector<PacketRule> allow;
  // Open mode with name rules: TCP 80/443 to the proxy, DNS to the stub, UDP 443 (QUIC, which the
  // proxy cannot judge) rejected.
  bool names = false;
  uint32_t max_connections = 0;  // new forwarded connections past this many open: rejected; 0: none
  bool operator==(const SandboxFilter&) const = default;

  // The filter of `policy` (mode allowlist or open): its CIDR rules, and `denied_addresses` (the
  // addresses its exact deny names resolved to, each with its rule's port).
  static SandboxFilter For(const NetworkPolicy& policy,
                           const std::vector<PacketRule>& denied_addresses,
                           uint32_t max_connections);
};

class Firewall {
 public:
  // Replaces any table of the same name with a fresh one (a restarted daemon's sandboxes join
  // again through Apply). Needs CAP_NET_ADMIN.
  [[nodiscard]] static Result<std::unique_ptr<Firewall>> Install(const FirewallConfig& config);
  // Removes the table.
  ~Firewall();
  Firewall(const Firewall&) = delete;
  Firewall& operator=(const Firewall&) = delete;

  // Gives the interface `filter`: its mode's set (out of the others) and its chain, replaced
  // whole, in one transaction (a packet sees the old rules or the new ones, never a mix).
  [[nodiscard]] Status Apply(const std::string& ifname, const SandboxFilter& filter);
  // Takes the interface out of every set and removes its chain. Removing one that is in none
  // succeeds.
  [[nodiscard]] Status Remove(const std::string& ifname);

  // The script Install runs (for tests and `nft -f` debugging).
  static std::string Script(const FirewallConfig& config);
  // The commands Apply runs for `ifname` (for tests).
  static std::string ApplyScript(const std::string& table, const std::string& ifname,
                                 const SandboxFilter& filter);
  // The name of the interface's chain in the table.
  static std::string ChainName(const std::string& ifname);
  // The table the daemon puts in a network namespace that is its uplink (run there with
  // RunScript): forwarding from `peer` (the namespace's end of the transit veth) only for
  // `subnet`, into it only replies, nothing from it to the namespace itself, and `subnet`
  // masqueraded out of every other interface.
  static std::string UplinkScript(const std::string& table, const std::string& subnet,
                                  const std::string& peer);
  // Deletes `table` (family inet) if it is there.
  static std::string DeleteScript(const std::string& table);
  // Runs nftables commands with a context of their own, in the calling thread's network
  // namespace (NetnsThread::Run).
  [[nodiscard]] static Status RunScript(const std::string& commands);

 private:
  Firewall(FirewallConfig config, nft_ctx* ctx) : config_(std::move(config)), ctx_(ctx) {}
  Status Run(const std::string& commands);

  FirewallConfig config_;
  nft_ctx* ctx_;
};

}  // namespace airlock::net
