#pragma once
// The daemon's nftables table: what a sandbox's veth may send (docs/design/network.md,
// "Firewall"). One table per daemon (its name from the config, so that two daemons on one host
// keep out of each other's way); sandboxes join it by their host-side interface name, which
// goes into the set of their mode.
//
//   allowlist: nothing is forwarded; TCP 80/443 is redirected to the egress proxy; only the
//              proxy's port and DNS (53) on the gateway are open to it.
//   open:      forwarded to the uplink (masqueraded; or to the transit veth of a namespace
//              uplink, which masquerades) unless the destination is in the
//              always-deny ranges or is one of the host's own addresses; DNS on the gateway.
//   (none:     the sandbox has no veth at all.)
//
// IPv6 from a sandbox veth is dropped whatever its mode (sandboxes get IPv4 only).
// The rules go through libnftables in process (libnftables-dev): a mode change is one netlink
// transaction, no process start.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

struct nft_ctx;

namespace airlock::net {

struct FirewallConfig {
  std::string table = "airlock";     // an nftables table in family inet
  std::string veth_prefix = "alh";   // the host side of every sandbox veth starts with it
  std::string subnet;                // where the sandbox addresses come from ("10.213.0.0/16")
  uint16_t proxy_port = 0;           // the egress proxy, on every gateway address
  std::string uplink;                // where open sandboxes go out; "": no open mode
  // With a network namespace as the uplink: the host's end of the transit veth to it. Open
  // sandboxes go out through it (instead of `uplink`), unmasqueraded (the namespace masquerades,
  // UplinkScript), and nothing that comes in through it is let in or forwarded but replies.
  std::string transit;
  // Destinations no open sandbox reaches (CIDRs, IPv4), on top of the host's own addresses.
  std::vector<std::string> deny;
};

enum class FirewallMode { kAllowlist, kOpen };

class Firewall {
 public:
  // Replaces any table of the same name with a fresh one (a restarted daemon's sandboxes join
  // again through SetMode). Needs CAP_NET_ADMIN.
  [[nodiscard]] static Result<std::unique_ptr<Firewall>> Install(const FirewallConfig& config);
  // Removes the table.
  ~Firewall();
  Firewall(const Firewall&) = delete;
  Firewall& operator=(const Firewall&) = delete;

  // Puts the interface in the set of `mode` (and out of the other one), in one transaction.
  [[nodiscard]] Status SetMode(const std::string& ifname, FirewallMode mode);
  // Takes the interface out of both sets. Removing one that is in neither succeeds.
  [[nodiscard]] Status Remove(const std::string& ifname);

  // The script Install runs (for tests and `nft -f` debugging).
  static std::string Script(const FirewallConfig& config);
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
