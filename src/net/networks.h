#pragma once
// Sandbox networking on the host (docs/design/network.md): for each sandbox whose network mode
// is not "none", a /30 from the configured subnet, a network namespace with a veth to the host
// (made here; the jail joins it), the host side of the veth in the firewall's set for its mode,
// and a DNS stub on its gateway address. One egress proxy serves every sandbox; the client's
// address says whose policy applies. Verdicts of the proxy and the stubs go to on_event, with
// the sandbox they concern.
//
// Names come from the slot, so that recovery finds them: namespace airlock-<id>-<slot>
// (/run/netns), host veth al<id>-<slot>, table inet airlock_<id>; <id> is this daemon's
// network id (two daemons on one host need two ids and two subnets).

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address_v6.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "net/firewall.h"
#include "net/policy.h"
#include "net/uplink.h"

namespace airlock::net {

class EgressProxy;
class NetnsThread;
namespace dns {
class DnsStub;
}

// One verdict: of the proxy (kind connect, http, tls) or of the DNS stub (kind dns). A
// connection's end comes as a second event of its kind with allowed set and the byte counts.
struct NetworkEvent {
  int64_t at_ms = 0;  // Unix time
  std::string kind;
  std::string name;  // what was asked for: a name, or an address as text
  std::string sni, host;
  std::string dest;  // the address dialled or answered, if any
  uint16_t port = 0;
  bool allowed = false;
  bool closed = false;  // the end of an allowed connection (bytes final)
  std::string rule, reason;
  uint64_t bytes_up = 0, bytes_down = 0;
};

struct NetworksConfig {
  std::string id = "a";                  // [a-z0-9]{1,4}
  std::string subnet = "10.213.0.0/16";  // IPv4, /16../28: a /30 per sandbox
  // Where "open" sandboxes go out ("": no open mode): an interface, or a network namespace
  // ("netns:NAME" or a path; uplink.h), through which the proxy and DNS then go out too.
  std::string uplink;
  // "": the host's resolv.conf (with uplink netns:NAME, /etc/netns/NAME/resolv.conf if any).
  std::vector<boost::asio::ip::udp::endpoint> dns_upstream;
  std::vector<Cidr> host_denied;  // ranges no sandbox reaches (the host's own addresses, ...)
  // Links (namespace, veth, addresses) made ahead of time, so that a create takes one instead
  // of starting `ip` twice. 0: every link is made at its create.
  size_t warm_links = 4;
  // IPv6 for sandboxes: "auto" (when the uplink interface has an IPv6 address of global scope),
  // "on" or "off"; their addresses come from subnet6, a /126 per slot. A namespace uplink has
  // no IPv6 yet (auto: off).
  std::string ipv6 = "auto";
  std::string subnet6 = "fd0a:213::/64";
  // Per-sandbox caps (docs/design/network.md, "Fair share"): bandwidth in Mbit/s in each
  // direction (0: none) and connections open at once through the host (forwarded, and through
  // the proxy). A create may ask for less, never for more.
  uint32_t bandwidth_mbps = 1000;
  uint32_t max_connections = 256;
  // The egress proxy's port; 0: any. Sandboxes have it in their HTTP_PROXY, so a restarted
  // daemon asks for the port it had (adopted sandboxes keep working).
  uint16_t proxy_port = 0;
  // Every verdict of the proxy and the stubs, with its sandbox's id. Called on their thread,
  // so it must not block (the daemon queues it for the store); empty: verdicts are not kept.
  std::function<void(const std::string& sandbox, const NetworkEvent& event)> on_event;
  // Secrets (docs/design/credentials.md): the daemon's egress CA, PEM, which sandboxes with
  // secrets bound trust; the proxy's TLS contexts (ProxyHooks::server_tls, upstream_tls); a
  // secret's value for a sandbox. Unset: sandboxes cannot have secrets bound.
  std::string egress_ca_pem;
  std::function<Result<std::shared_ptr<boost::asio::ssl::context>>(const std::string& host)>
      server_tls;
  std::shared_ptr<boost::asio::ssl::context> upstream_tls;
  std::function<Result<std::string>(const std::string& sandbox, const std::string& secret)>
      secret_value;
};

struct Attachment {
  uint32_t slot = 0;
  std::string netns_path;        // for the engine to join
  std::string gateway;           // the host side: DNS stub and proxy
  std::string address;           // the sandbox's
  std::string address6;          // its IPv6 address, "" without IPv6
  std::vector<std::string> env;  // HTTP_PROXY and friends (allowlist mode), KEY=VALUE
};

class Networks {
 public:
  // Starts the egress proxy, installs the firewall table. Needs root (CAP_NET_ADMIN), nftables
  // and iproute2.
  [[nodiscard]] static Result<std::unique_ptr<Networks>> Open(NetworksConfig config);
  // Stops the proxy and the stubs and removes the table. Namespaces stay (their sandboxes may
  // be adopted by the next start; RemoveUnclaimed then clears the rest).
  ~Networks();
  Networks(const Networks&) = delete;
  Networks& operator=(const Networks&) = delete;

  // Gives `sandbox` a network for `policy` (whose mode is not none). On failure nothing is left.
  [[nodiscard]] Result<Attachment> Attach(const std::string& sandbox, const NetworkPolicy& policy);
  // After a restart: takes back the namespace a previous run made for `sandbox` at `slot`.
  [[nodiscard]] Result<Attachment> Adopt(const std::string& sandbox, uint32_t slot,
                                         const NetworkPolicy& policy);
  // A live policy change: from now on every verdict uses `policy`; the proxy closes the
  // sandbox's connections it no longer allows, and the firewall moves it to its mode's set.
  [[nodiscard]] Status Update(const std::string& sandbox, const NetworkPolicy& policy);
  // Checks `policy`'s caps against the config's (kInvalidArgument naming the setting); Attach and
  // Update check too, this is for callers that must refuse before they change anything.
  [[nodiscard]] Status CheckLimits(const NetworkPolicy& policy) const;
  // Takes the sandbox's network apart. Detaching one that has none succeeds.
  [[nodiscard]] Status Detach(const std::string& sandbox);
  // HTTP_PROXY and friends naming the proxy on the sandbox's gateway, KEY=VALUE: what an
  // allowlist sandbox's commands get (Attachment::env). Empty when it has no network here.
  std::vector<std::string> ProxyEnv(const std::string& sandbox) const;
  // Bytes through the sandbox's veth since its link was made: {received by the sandbox, sent
  // by it} (the host end's counters, two small reads); nullopt when it has no network here.
  std::optional<std::pair<uint64_t, uint64_t>> Traffic(const std::string& sandbox) const;
  // Deletes this daemon's namespaces that no attached sandbox holds (after recovery); how many.
  int RemoveUnclaimed();
  // Starts the thread that makes links ahead (config.warm_links) and takes detached ones
  // apart. Call after recovery (RemoveUnclaimed), so that it never races it.
  void StartMaintainer();

  uint16_t proxy_port() const;
  const NetworksConfig& config() const { return config_; }
  bool ipv6() const { return ipv6_; }

  // With a network namespace as the uplink, what links the host to it (docs/design/network.md,
  // "A network namespace as the uplink"): the host's end of the transit veth, the namespace's
  // end, and the routing table of the daemon's policy rule. Names from the network id, so that
  // a restart finds what a killed run left.
  static std::string TransitName(const std::string& id) { return "al" + id + "up"; }
  static std::string TransitPeerName(const std::string& id) { return "al" + id + "host"; }
  static uint32_t RouteTable(const std::string& id);

  struct Attached;

 private:
  explicit Networks(NetworksConfig config);
  Result<Attachment> Join(const std::string& sandbox, uint32_t slot, const NetworkPolicy& policy,
                          bool make_link);
  // Gives the sandbox's veth the firewall's filter for its policy and denied addresses as they
  // are now (its set and its own chain), and shapes its link to the policy's bandwidth. Mode
  // none: in no set, no chain.
  Status ApplyPolicy(Attached& attached);
  // The addresses the exact names among `policy`'s deny rules resolve to now, each with its
  // rule's port, within `budget` in all; `due`: when to look again (their shortest TTL, within
  // bounds; soon for names not resolved in time).
  std::vector<PacketRule> ResolveDenied(const NetworkPolicy& policy,
                                        std::chrono::milliseconds budget,
                                        std::chrono::steady_clock::time_point* due);
  // Looks up the denied names of every attached sandbox whose lookup is due again, and
  // reapplies the filters that changed (the maintainer, every kDeniedRefresh).
  void RefreshDenied();
  // tc on both ends of a slot's link: `mbps` each way, 0: no shaping.
  Status Shape(uint32_t slot, uint32_t mbps);
  Status SetUpUplinkNetns();   // the transit veth, route, rule and the namespace's own table
  void RemoveTransit();        // what SetUpUplinkNetns made on the host (also a killed run's)
  void TearDownUplinkNetns();  // all of it, and the namespace's forwarding put back
  std::string UplinkForwardFile() const;  // the namespace's ip_forward before the first run
  Status MakeLink(uint32_t slot);         // the namespace and the veth of a slot, configured
  Status DeleteLink(uint32_t slot);       // both gone; one that is not there is not an error
  bool TakeSlotLocked(uint32_t& slot);
  void Maintain();
  std::optional<NetworkPolicy> PolicyFor(const IpAddress& client) const;
  void Record(const IpAddress& client, NetworkEvent event);
  NetworkPolicy WithHostDenied(NetworkPolicy policy) const;
  // What the proxy and the stub judge a sandbox by: its policy, the host's ranges, and the
  // addresses its denied names resolved to.
  NetworkPolicy Compose(const NetworkPolicy& given, const std::vector<PacketRule>& denied) const;
  std::string NetnsName(uint32_t slot) const;
  std::string VethName(uint32_t slot) const;
  IpAddress Gateway(uint32_t slot) const;
  IpAddress Address(uint32_t slot) const;
  IpAddress Gateway6(uint32_t slot) const;
  IpAddress Address6(uint32_t slot) const;
  Status EnableIpv6Forwarding();  // the host's, with accept_ra kept working where it was on
  void RestoreIpv6Forwarding();

  NetworksConfig config_;
  UniqueFd lock_;                  // flock on /run/airlock/network-<id>.lock, held while open
  std::string ip_forward_before_;  // net.ipv4.ip_forward as found, when an uplink needed it
  uint32_t base_ = 0;              // the subnet's first address, host order
  bool ipv6_ = false;              // sandboxes have IPv6 addresses, forwarded in open mode
  boost::asio::ip::address_v6::bytes_type base6_{};  // subnet6's first address
  // The host's IPv6 settings as found, put back at stop: all.forwarding, and the accept_ra of
  // interfaces raised from 1 to 2 so that they keep taking router advertisements.
  std::string ipv6_forwarding_before_;
  std::vector<std::string> accept_ra_raised_;
  uint32_t slots_ = 0;  // how many /30s sandboxes may have (a namespace uplink takes the last)
  Uplink uplink_;
  std::unique_ptr<NetnsThread> uplink_ns_;  // a thread inside a namespace uplink
  std::string uplink_forward_before_;       // its net.ipv4.ip_forward before the first run
  boost::asio::io_context io_;
  std::unique_ptr<Firewall> firewall_;
  std::unique_ptr<EgressProxy> proxy_;
  std::thread io_thread_;

  mutable std::mutex mu_;
  std::vector<bool> used_;        // by slot
  std::vector<uint32_t> shaped_;  // by slot: the Mbit/s its link is shaped to (0: none)
  std::chrono::steady_clock::time_point next_refresh_{};  // of the denied names' addresses
  uint32_t next_slot_ = 0;                                // where the search for a free slot starts
  std::deque<uint32_t> ready_;   // slots with a link made ahead, not attached
  std::deque<uint32_t> doomed_;  // slots whose link the maintainer takes apart
  bool stopping_ = false;
  std::condition_variable cv_;
  std::thread maintainer_;
  std::map<std::string, std::shared_ptr<Attached>> by_sandbox_;
  std::map<IpAddress, std::shared_ptr<Attached>> by_address_;
};

}  // namespace airlock::net
