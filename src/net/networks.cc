#include "net/networks.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/subprocess.h"
#include "common/syscall.h"
#include "net/address_cache.h"
#include "net/dns.h"
#include "net/egress_proxy.h"
#include "net/firewall.h"
#include "net/uplink.h"

namespace airlock::net {
namespace {

namespace asio = boost::asio;
using asio::ip::address_v4;

constexpr uint32_t kMaxSlots = 16384;
constexpr auto kResolveTimeout = std::chrono::seconds(3);
// How long a create or a policy change waits for the addresses of its denied names, in all; and
// how often the maintainer looks for lookups that are due. A lookup is due again when its TTL
// runs out, within these bounds (a name that did not resolve is asked again at the shortest).
constexpr auto kDeniedBudget = std::chrono::milliseconds(2000);
constexpr auto kDeniedRefresh = std::chrono::seconds(30);
constexpr uint32_t kDeniedMinTtl = 30, kDeniedMaxTtl = 3600;
// The priority of the policy rule that sends sandboxes' traffic to a namespace uplink: before the
// main table (32766).
constexpr int kUplinkRulePriority = 32000;

// The nameservers of a resolv.conf (the host's unless told), port 53.
std::vector<asio::ip::udp::endpoint> HostNameservers(const std::string& path = "/etc/resolv.conf") {
  std::vector<asio::ip::udp::endpoint> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    if (!(words >> key >> value) || key != "nameserver") continue;
    boost::system::error_code ec;
    auto ip = asio::ip::make_address(value, ec);
    if (!ec) out.emplace_back(ip, 53);
  }
  return out;
}

// Every address of the host's interfaces, each as its own /32 or /128: no sandbox reaches the
// host's services through the proxy or by name.
std::vector<Cidr> HostAddresses() {
  std::vector<Cidr> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      out.push_back(Cidr{address_v4(ntohl(in->sin_addr.s_addr)), 32});
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      asio::ip::address_v6::bytes_type bytes;
      std::memcpy(bytes.data(), &in6->sin6_addr, bytes.size());
      out.push_back(Cidr{asio::ip::address_v6(bytes), 128});
    }
  }
  ::freeifaddrs(list);
  return out;
}

// Writes each {file, value} of `settings` (paths below /proc/sys/net/), as seen from the
// network namespace at `netns_path` (empty: the daemon's own). /proc/sys/net shows the
// namespace of the thread that opens it, so a thread of its own joins the namespace and the
// daemon's other threads stay where they are. A missing file (no IPv6 in the kernel) is skipped.
Status WriteNetSysctls(const std::string& netns_path,
                       const std::vector<std::pair<std::string, std::string>>& settings) {
  Status status;
  auto write_all = [&] {
    if (!netns_path.empty()) {
      UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) {
        status = FailErrno("joining " + netns_path, errno);
        return;
      }
    }
    for (const auto& [name, value] : settings) {
      const std::string path = "/proc/sys/net/" + name;
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd && errno == ENOENT) continue;
      if (!fd || ::write(fd.get(), value.data(), value.size()) != ssize_t(value.size())) {
        status = FailErrno("writing " + path, errno);
        return;
      }
    }
  };
  if (netns_path.empty()) {
    write_all();
  } else {
    std::thread(write_all).join();
  }
  return status;
}

// True when an interface of the current network namespace (`uplink`, or any but loopback when
// empty) has an IPv6 address of global scope.
bool HasGlobalIpv6(const std::string& uplink) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET6) continue;
    if (!uplink.empty() && uplink != i->ifa_name) continue;
    asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                bytes.size());
    const asio::ip::address_v6 ip(bytes);
    found = !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() &&
            !ip.is_multicast() && !ip.is_v4_mapped();
  }
  ::freeifaddrs(list);
  return found;
}

std::string ReadSysctl(const std::string& path) {
  std::string value;
  std::ifstream(path) >> value;
  return value;
}

// An allowlist sandbox's env: the proxy on its gateway, for clients that ask for one.
std::vector<std::string> ProxyEnvOf(const std::string& gateway, uint16_t port) {
  std::vector<std::string> env;
  const std::string proxy = "http://" + gateway + ":" + std::to_string(port);
  for (const char* key : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}) {
    env.push_back(std::string(key) + "=" + proxy);
  }
  env.push_back("NO_PROXY=localhost,127.0.0.1,::1");
  env.push_back("no_proxy=localhost,127.0.0.1,::1");
  return env;
}

}  // namespace

struct Networks::Attached {
  std::string sandbox;
  uint32_t slot = 0;
  IpAddress address;
  std::optional<IpAddress> address6;
  // Guarded by Networks::mu_: the policy as the API gave it, the addresses its denied names
  // resolved to, and what the proxy and the stub judge by (Compose: both, and the host's ranges).
  NetworkPolicy given;
  std::vector<PacketRule> denied;
  std::chrono::steady_clock::time_point denied_due;  // when its names are looked up again
  NetworkPolicy policy;
  std::unique_ptr<dns::DnsStub> stub;
  std::mutex apply_mu;  // one ApplyPolicy at a time, so the last state read is the one applied
};

Networks::Networks(NetworksConfig config) : config_(std::move(config)) {}

Result<std::unique_ptr<Networks>> Networks::Open(NetworksConfig config) {
  bool id_ok = !config.id.empty() && config.id.size() <= 4;
  for (char c : config.id) id_ok = id_ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'));
  if (!id_ok) return Fail(ErrorCode::kInvalidArgument, "network_id must be 1-4 of [a-z0-9]");
  auto subnet = Cidr::Parse(config.subnet);
  if (!subnet || !subnet->network.is_v4() || subnet->prefix < 16 || subnet->prefix > 28) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_subnet must be an IPv4 range from /16 to /28, got " + config.subnet);
  }
  auto uplink = ParseUplink(config.uplink);
  if (!uplink) return std::unexpected(uplink.error());
  if (config.ipv6 != "auto" && config.ipv6 != "on" && config.ipv6 != "off") {
    return Fail(ErrorCode::kInvalidArgument,
                "network_ipv6 must be auto, on or off, got " + config.ipv6);
  }
  // IPv6 goes out through an interface uplink that has it; "on" insists.
  bool ipv6 = config.ipv6 == "on" || (config.ipv6 == "auto" && !uplink->interface.empty() &&
                                      HasGlobalIpv6(uplink->interface));
  if (ipv6 && uplink->interface.empty()) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_ipv6 = on needs an interface as network_uplink (a network namespace "
                "uplink has no IPv6 yet)");
  }
  auto subnet6 = Cidr::Parse(config.subnet6);
  if (ipv6 && (!subnet6 || !subnet6->network.is_v6() || subnet6->prefix > 112)) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_subnet6 must be an IPv6 range of /112 or wider, got " + config.subnet6);
  }
  if (config.dns_upstream.empty() && !uplink->netns_name.empty() &&
      ::access(("/etc/netns/" + uplink->netns_name + "/resolv.conf").c_str(), R_OK) == 0) {
    config.dns_upstream = HostNameservers("/etc/netns/" + uplink->netns_name + "/resolv.conf");
  }
  if (config.dns_upstream.empty()) config.dns_upstream = HostNameservers();
  for (const Cidr& c : HostAddresses()) config.host_denied.push_back(c);
  // A namespace uplink: a thread of ours lives in it. Its own addresses are as out of reach as
  // the host's (the proxy dials from there).
  std::unique_ptr<NetnsThread> uplink_ns;
  if (uplink->is_netns()) {
    auto thread = NetnsThread::Start(uplink->netns_path);
    if (!thread) return std::unexpected(thread.error().Wrap("network_uplink"));
    uplink_ns = std::move(*thread);
    std::vector<Cidr> inside;
    uplink_ns->Run([&inside] { inside = HostAddresses(); });
    for (const Cidr& c : inside) config.host_denied.push_back(c);
  }
  // One daemon per network id: a second one would replace the first's table and take its
  // namespaces for leftovers.
  ::mkdir("/run/airlock", 0755);
  const std::string lock_path = "/run/airlock/network-" + config.id + ".lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return FailErrno("opening " + lock_path, errno);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) < 0) {
    return Fail(ErrorCode::kAlreadyExists, "another airlockd uses network id '" + config.id +
                                               "' (network_id in airlockd.toml)");
  }
  std::unique_ptr<Networks> n(new Networks(std::move(config)));
  n->lock_ = std::move(lock);
  n->base_ = subnet->network.to_v4().to_uint();
  n->slots_ = std::min<uint32_t>(kMaxSlots, 1u << (30 - subnet->prefix));
  n->uplink_ = *uplink;
  n->uplink_ns_ = std::move(uplink_ns);
  if (n->uplink_ns_) --n->slots_;  // the subnet's last /30 is the transit link's
  n->used_.assign(n->slots_, false);
  n->shaped_.assign(n->slots_, 0);
  n->ipv6_ = ipv6;
  if (ipv6) n->base6_ = subnet6->network.to_v6().to_bytes();

  ProxyHooks hooks;
  Networks* self = n.get();
  hooks.policy_for = [self](const IpAddress& client) { return self->PolicyFor(client); };
  // With a namespace uplink, every upstream socket (the proxy's, its resolver's, the stubs')
  // is made in that namespace; else the default, here.
  SocketFactory open_socket;
  if (n->uplink_ns_) open_socket = n->uplink_ns_->Factory();
  hooks.open_socket = open_socket;
  // The proxy's names go through a cache of addresses (TTL honoured, at most 30 s); the proxy
  // still judges every address it is given.
  auto cache = std::make_shared<dns::AddressCache>([self, open_socket](const std::string& name) {
    return dns::ResolveAddresses(name, self->config_.dns_upstream, kResolveTimeout, open_socket);
  });
  hooks.resolve = [cache](const std::string& name) { return cache->Resolve(name); };
  hooks.server_tls = n->config_.server_tls;
  hooks.upstream_tls = n->config_.upstream_tls;
  if (n->config_.secret_value) {
    hooks.secret_value = [self](const IpAddress& client,
                                const std::string& secret) -> Result<std::string> {
      std::string sandbox;
      {
        std::lock_guard held(self->mu_);
        auto it = self->by_address_.find(client);
        if (it == self->by_address_.end()) {
          return Fail(ErrorCode::kNotFound, "the client is no sandbox");
        }
        sandbox = it->second->sandbox;
      }
      return self->config_.secret_value(sandbox, secret);
    };
  }
  hooks.on_event = [self](const EgressEvent& e) {
    NetworkEvent event;
    event.kind = std::string(KindName(e.kind));
    event.name = e.name;
    event.sni = e.sni;
    event.host = e.host;
    if (e.dest) event.dest = e.dest->to_string();
    event.port = e.port;
    event.allowed = e.allowed;
    event.closed = e.phase == EgressEvent::Phase::kClosed;
    event.rule = e.rule;
    event.reason = e.reason;
    event.bytes_up = e.bytes_up;
    event.bytes_down = e.bytes_down;
    self->Record(e.client, std::move(event));
  };
  // IPv4 and, where the kernel has it, IPv6 (for IPv6 sandboxes), on one port.
  auto listen = [&](uint16_t port) {
    std::vector<asio::ip::tcp::endpoint> endpoints = {{address_v4::any(), port}};
    if (UniqueFd probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0)); probe) {
      endpoints.emplace_back(asio::ip::address_v6::any(), port);
    }
    ProxyLimits limits;
    limits.max_connections_per_client = n->config_.max_connections;
    return EgressProxy::Start(n->io_, endpoints, hooks, limits);
  };
  auto proxy = listen(n->config_.proxy_port);
  if (!proxy && n->config_.proxy_port != 0) {  // taken meanwhile: any port is better than none
    proxy = listen(0);
  }
  if (!proxy) return std::unexpected(proxy.error().Wrap("starting the egress proxy"));
  n->proxy_ = std::move(*proxy);

  FirewallConfig fw;
  fw.table = "airlock_" + n->config_.id;
  fw.veth_prefix = "al" + n->config_.id + "-";
  fw.subnet = n->config_.subnet;
  fw.proxy_port = n->proxy_->port();
  if (n->uplink_ns_) {
    fw.transit = TransitName(n->config_.id);
  } else {
    fw.uplink = n->uplink_.interface;
  }
  fw.host_denied = n->config_.host_denied;
  if (ipv6) fw.subnet6 = n->config_.subnet6;
  auto firewall = Firewall::Install(fw);
  if (!firewall) return std::unexpected(firewall.error());
  n->firewall_ = std::move(*firewall);
  if (!n->config_.uplink.empty()) {
    // Open sandboxes are routed through the host; the setting is put back at stop.
    std::ifstream("/proc/sys/net/ipv4/ip_forward") >> n->ip_forward_before_;
    if (n->ip_forward_before_ != "1") {
      std::ofstream forward("/proc/sys/net/ipv4/ip_forward");
      forward << "1\n";
      if (!forward.flush()) return Fail(ErrorCode::kInternal, "enabling IPv4 forwarding failed");
    }
    if (ipv6) {
      if (auto st = n->EnableIpv6Forwarding(); !st) return std::unexpected(st.error());
    }
  }
  // What a killed run linked to a namespace uplink goes first, whatever the uplink is now.
  n->RemoveTransit();
  if (n->uplink_ns_) {
    if (auto st = n->SetUpUplinkNetns(); !st) {
      return std::unexpected(st.error().Wrap("linking to the uplink " + n->config_.uplink));
    }
  }
  n->io_thread_ = std::thread([self] {
    auto work = asio::make_work_guard(self->io_);
    self->io_.run();
  });
  return n;
}

void Networks::StartMaintainer() {
  std::lock_guard lock(mu_);
  if (!maintainer_.joinable()) maintainer_ = std::thread([this] { Maintain(); });
}

Networks::~Networks() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (maintainer_.joinable()) maintainer_.join();
  // Links made ahead and not given to a sandbox, and those being taken apart, go now; those of
  // live sandboxes stay for the next start to adopt.
  for (uint32_t slot : ready_) (void)DeleteLink(slot);
  for (uint32_t slot : doomed_) (void)DeleteLink(slot);
  if (proxy_) proxy_->Stop();
  {
    std::lock_guard lock(mu_);
    for (auto& [id, a] : by_sandbox_) {
      if (a->stub) a->stub->Stop();
    }
  }
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  by_address_.clear();
  by_sandbox_.clear();
  proxy_.reset();
  firewall_.reset();
  if (!ip_forward_before_.empty() && ip_forward_before_ != "1") {
    std::ofstream("/proc/sys/net/ipv4/ip_forward") << ip_forward_before_ << "\n";
  }
  RestoreIpv6Forwarding();
  if (uplink_ns_) TearDownUplinkNetns();
  uplink_ns_.reset();
}

Status Networks::EnableIpv6Forwarding() {
  ipv6_forwarding_before_ = ReadSysctl("/proc/sys/net/ipv6/conf/all/forwarding");
  if (ipv6_forwarding_before_ == "1") return {};
  // A forwarding host ignores router advertisements where accept_ra is 1; 2 takes them anyway,
  // so that the host's own IPv6 (SLAAC, its default route) stays as it was.
  if (DIR* dir = ::opendir("/proc/sys/net/ipv6/conf")) {
    while (dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == ".." || name == "all" || name == "lo") continue;
      const std::string path = "/proc/sys/net/ipv6/conf/" + name + "/accept_ra";
      if (ReadSysctl(path) != "1") continue;
      std::ofstream(path) << "2\n";
      accept_ra_raised_.push_back(name);
    }
    ::closedir(dir);
  }
  std::ofstream forward("/proc/sys/net/ipv6/conf/all/forwarding");
  forward << "1\n";
  if (!forward.flush()) return Fail(ErrorCode::kInternal, "enabling IPv6 forwarding failed");
  return {};
}

void Networks::RestoreIpv6Forwarding() {
  if (!ipv6_forwarding_before_.empty() && ipv6_forwarding_before_ != "1") {
    std::ofstream("/proc/sys/net/ipv6/conf/all/forwarding") << ipv6_forwarding_before_ << "\n";
  }
  for (const std::string& name : accept_ra_raised_) {
    std::ofstream("/proc/sys/net/ipv6/conf/" + name + "/accept_ra") << "1\n";
  }
  accept_ra_raised_.clear();
}

uint32_t Networks::RouteTable(const std::string& id) {
  // A number of its own per network id ([a-z0-9]{1,4}, read in base 37), well clear of the
  // usual small table numbers and of 253-255.
  uint32_t code = 0;
  for (char c : id) {
    code = code * 37 + 1 + static_cast<uint32_t>(c >= 'a' ? c - 'a' + 10 : c - '0');
  }
  return 0x0A170000u + code;
}

std::string Networks::UplinkForwardFile() const {
  return "/run/airlock/network-" + config_.id + ".uplink-ip-forward";
}

Status Networks::SetUpUplinkNetns() {
  const std::string transit = TransitName(config_.id), peer = TransitPeerName(config_.id);
  const std::string table = std::to_string(RouteTable(config_.id));
  const std::string near = address_v4(base_ + 4 * slots_ + 1).to_string();  // the host's end
  const std::string far = address_v4(base_ + 4 * slots_ + 2).to_string();   // the namespace's
  // The pair is made from inside the namespace, its host end sent to the daemon's own namespace
  // (that of its main thread, which never leaves it): a namespace given by a path has no name
  // `ip` could use from here.
  Status made;
  uplink_ns_->Run([&] {
    made = RunProgramOk({"ip", "link", "add", peer, "type", "veth", "peer", "name", transit,
                         "netns", std::to_string(::getpid())});
    if (made) {
      made = RunProgramOk({"ip", "-b", "-"},
                          "link set dev " + peer + " addrgenmode none\naddr add " + far +
                              "/30 dev " + peer + "\nlink set " + peer + " up\nroute add " +
                              config_.subnet + " via " + near + " dev " + peer + "\n");
    }
  });
  if (!made) return made;
  // Sandboxes' traffic (from the subnet) takes the daemon's table: to the subnet itself as
  // before (throw: back to the main table), everything else into the namespace.
  made = RunProgramOk({"ip", "-b", "-"},
                      "link set dev " + transit + " addrgenmode none\naddr add " + near +
                          "/30 dev " + transit + "\nlink set " + transit + " up\nroute add throw " +
                          config_.subnet + " table " + table + "\nroute add default via " + far +
                          " dev " + transit + " onlink table " + table + "\nrule add from " +
                          config_.subnet + " lookup " + table + " priority " +
                          std::to_string(kUplinkRulePriority) + "\n");
  if (made) {
    made = WriteNetSysctls("", {{"ipv6/conf/" + transit + "/accept_ra", "0"},
                                {"ipv6/conf/" + transit + "/disable_ipv6", "1"}});
  }
  if (made) {
    made = WriteNetSysctls(uplink_.netns_path, {{"ipv6/conf/" + peer + "/accept_ra", "0"},
                                                {"ipv6/conf/" + peer + "/disable_ipv6", "1"}});
  }
  if (!made) return made;
  // The namespace forwards and masquerades. Its ip_forward as the first run found it is kept in
  // a file, so that the stop after a killed run still puts it back.
  std::string current;
  uplink_ns_->Run([&] { std::ifstream("/proc/sys/net/ipv4/ip_forward") >> current; });
  if (!(std::ifstream(UplinkForwardFile()) >> uplink_forward_before_)) {
    uplink_forward_before_ = current;
    std::ofstream(UplinkForwardFile()) << current << "\n";
  }
  if (current != "1") {
    made = WriteNetSysctls(uplink_.netns_path, {{"ipv4/ip_forward", "1"}});
    if (!made) return made;
  }
  const std::string script = Firewall::UplinkScript("airlock_" + config_.id, config_.subnet, peer);
  uplink_ns_->Run([&] { made = Firewall::RunScript(script); });
  if (!made) return std::unexpected(made.error().Wrap("the uplink namespace's nftables table"));
  return {};
}

void Networks::RemoveTransit() {
  const std::string transit = TransitName(config_.id);
  const std::string table = std::to_string(RouteTable(config_.id));
  // The veth takes its peer and the routes through it; the rule and the throw route stay.
  if (::access(("/sys/class/net/" + transit).c_str(), F_OK) == 0) {
    (void)RunProgram({"ip", "link", "del", transit});
  }
  for (int i = 0; i < 8 && RunProgramOk({"ip", "rule", "del", "lookup", table}); ++i) {
  }
  (void)RunProgram({"ip", "route", "flush", "table", table});
}

void Networks::TearDownUplinkNetns() {
  RemoveTransit();
  const std::string script = Firewall::DeleteScript("airlock_" + config_.id);
  uplink_ns_->Run([&] { (void)Firewall::RunScript(script); });
  if (!uplink_forward_before_.empty() && uplink_forward_before_ != "1") {
    (void)WriteNetSysctls(uplink_.netns_path, {{"ipv4/ip_forward", uplink_forward_before_}});
  }
  // The file goes only with the setting put back (a start that failed before reading it
  // leaves it for the next one).
  if (!uplink_forward_before_.empty()) ::unlink(UplinkForwardFile().c_str());
}

std::string Networks::NetnsName(uint32_t slot) const {
  return "airlock-" + config_.id + "-" + std::to_string(slot);
}
std::string Networks::VethName(uint32_t slot) const {
  return "al" + config_.id + "-" + std::to_string(slot);
}
IpAddress Networks::Gateway(uint32_t slot) const { return address_v4(base_ + 4 * slot + 1); }
IpAddress Networks::Address(uint32_t slot) const { return address_v4(base_ + 4 * slot + 2); }
// subnet6 is /112 or wider and slots are fewer than 2^14: the offset fits its last 32 bits.
IpAddress Networks::Gateway6(uint32_t slot) const {
  auto bytes = base6_;
  const uint32_t low = (uint32_t(bytes[12]) << 24 | uint32_t(bytes[13]) << 16 |
                        uint32_t(bytes[14]) << 8 | bytes[15]) +
                       4 * slot + 1;
  for (int i = 0; i < 4; ++i) bytes[15 - i] = static_cast<uint8_t>(low >> (8 * i));
  return asio::ip::address_v6(bytes);
}
IpAddress Networks::Address6(uint32_t slot) const {
  auto bytes = Gateway6(slot).to_v6().to_bytes();
  ++bytes[15];  // .1 -> .2 inside the /126: never carries
  return asio::ip::address_v6(bytes);
}

uint16_t Networks::proxy_port() const { return proxy_->port(); }

NetworkPolicy Networks::WithHostDenied(NetworkPolicy policy) const {
  for (const Cidr& c : config_.host_denied) policy.AddHostDenied(c);
  for (const std::string& subnet : {config_.subnet, config_.subnet6}) {
    if (auto range = Cidr::Parse(subnet)) policy.AddHostDenied(*range);
  }
  return policy;
}

NetworkPolicy Networks::Compose(const NetworkPolicy& given,
                                const std::vector<PacketRule>& denied) const {
  NetworkPolicy policy = WithHostDenied(given);
  for (const PacketRule& r : denied) policy.AddDeniedAddress(r.range.network, r.port, r.rule);
  return policy;
}

std::optional<NetworkPolicy> Networks::PolicyFor(const IpAddress& client) const {
  std::lock_guard lock(mu_);
  auto it = by_address_.find(client);
  if (it == by_address_.end()) return std::nullopt;
  return it->second->policy;
}

void Networks::Record(const IpAddress& client, NetworkEvent event) {
  if (!config_.on_event) return;
  event.at_ms = UnixNowMs();
  std::string sandbox;
  {
    std::lock_guard lock(mu_);
    auto it = by_address_.find(client);
    if (it == by_address_.end()) return;
    sandbox = it->second->sandbox;
  }
  config_.on_event(sandbox, event);
}

Status Networks::CheckLimits(const NetworkPolicy& policy) const {
  if (config_.bandwidth_mbps != 0 && policy.bandwidth_mbps() > config_.bandwidth_mbps) {
    return Fail(ErrorCode::kInvalidArgument, "network.bandwidth_mbps may be at most " +
                                                 std::to_string(config_.bandwidth_mbps) +
                                                 " on this daemon (network_bandwidth_mbps), got " +
                                                 std::to_string(policy.bandwidth_mbps()));
  }
  if (policy.max_connections() > config_.max_connections) {
    return Fail(ErrorCode::kInvalidArgument, "network.max_connections may be at most " +
                                                 std::to_string(config_.max_connections) +
                                                 " on this daemon (network_max_connections), got " +
                                                 std::to_string(policy.max_connections()));
  }
  return {};
}

std::vector<PacketRule> Networks::ResolveDenied(const NetworkPolicy& policy,
                                                std::chrono::milliseconds budget,
                                                std::chrono::steady_clock::time_point* due) {
  std::vector<PacketRule> out;
  uint32_t ttl = kDeniedMaxTtl;
  auto finish = [&] {
    *due = std::chrono::steady_clock::now() +
           std::chrono::seconds(std::clamp(ttl, kDeniedMinTtl, kDeniedMaxTtl));
    return out;
  };
  if (policy.mode() == NetworkMode::kNone) return finish();
  const auto deadline = std::chrono::steady_clock::now() + budget;
  SocketFactory open_socket;
  if (uplink_ns_) open_socket = uplink_ns_->Factory();
  for (const Rule& rule : policy.deny()) {
    if (rule.kind != Rule::Kind::kExact) continue;
    for (uint16_t type : {dns::kTypeA, dns::kTypeAaaa}) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ttl = 0;  // the rest are asked again soon
        return finish();
      }
      auto answer =
          dns::Resolve(rule.name, type, config_.dns_upstream,
                       std::min<std::chrono::milliseconds>(left, kResolveTimeout), open_socket);
      if (!answer) {
        ttl = 0;
        continue;
      }
      if (!answer->addresses.empty()) ttl = std::min(ttl, answer->ttl);
      for (const IpAddress& ip : answer->addresses) {
        PacketRule r{Cidr{ip, ip.is_v4() ? 32 : 128}, rule.port, rule.text};
        if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
      }
    }
  }
  return finish();
}

Status Networks::ApplyPolicy(Attached& attached) {
  std::lock_guard apply(attached.apply_mu);
  const std::string veth = VethName(attached.slot);
  NetworkPolicy policy;
  std::vector<PacketRule> denied;
  {
    std::lock_guard lock(mu_);
    policy = attached.policy;
    denied = attached.denied;
  }
  if (policy.mode() == NetworkMode::kNone) return firewall_->Remove(veth);  // it sends nothing
  const uint32_t connections =
      policy.max_connections() != 0 ? policy.max_connections() : config_.max_connections;
  if (auto st = firewall_->Apply(veth, SandboxFilter::For(policy, denied, connections)); !st) {
    return st;
  }
  const uint32_t mbps =
      policy.bandwidth_mbps() != 0 ? policy.bandwidth_mbps() : config_.bandwidth_mbps;
  uint32_t shaped = 0;
  {
    std::lock_guard lock(mu_);
    shaped = shaped_[attached.slot];
  }
  if (mbps == shaped) return {};
  if (auto st = Shape(attached.slot, mbps); !st) return st;
  std::lock_guard lock(mu_);
  shaped_[attached.slot] = mbps;
  return {};
}

Status Networks::Shape(uint32_t slot, uint32_t mbps) {
  // A token bucket on each end: the host's veth sends what the sandbox receives, the sandbox's
  // eth0 what it sends. Its burst holds 10 ms at the rate (at least 64 KiB, and more than one
  // timer tick's worth at HZ 1000).
  const std::string veth = VethName(slot), ns = NetnsName(slot);
  if (mbps == 0) {
    (void)RunProgram({"tc", "qdisc", "del", "dev", veth, "root"});
    (void)RunProgram({"tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"});
    return {};
  }
  const uint64_t bytes_per_s = uint64_t{mbps} * 1'000'000 / 8;
  const std::string rate = std::to_string(mbps) + "mbit";
  const std::string burst = std::to_string(std::max<uint64_t>(64 * 1024, bytes_per_s / 100));
  const std::vector<std::string> tbf = {"root",  "tbf", "rate",    rate,
                                        "burst", burst, "latency", "50ms"};
  std::vector<std::string> host = {"tc", "qdisc", "replace", "dev", veth};
  std::vector<std::string> inside = {"tc", "-n", ns, "qdisc", "replace", "dev", "eth0"};
  host.insert(host.end(), tbf.begin(), tbf.end());
  inside.insert(inside.end(), tbf.begin(), tbf.end());
  if (auto st = RunProgramOk(host); !st) return st;
  return RunProgramOk(inside);
}

void Networks::RefreshDenied() {
  std::vector<std::shared_ptr<Attached>> all;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, a] : by_sandbox_) all.push_back(a);
  }
  for (const auto& a : all) {
    NetworkPolicy policy;
    std::vector<PacketRule> before;
    {
      std::lock_guard lock(mu_);
      if (a->denied_due > std::chrono::steady_clock::now()) continue;
      policy = a->given;
      before = a->denied;
    }
    if (!policy.DeniesNames()) continue;
    std::chrono::steady_clock::time_point due;
    std::vector<PacketRule> now = ResolveDenied(policy, kDeniedBudget, &due);
    // Addresses only grow between policy changes: one that a name stopped resolving to may
    // still be cached by whoever learnt it.
    for (const PacketRule& r : before) {
      if (std::find(now.begin(), now.end(), r) == now.end()) now.push_back(r);
    }
    {
      std::lock_guard lock(mu_);
      // Detached, or its policy changed meanwhile (Update looked its names up itself).
      if (!by_sandbox_.contains(a->sandbox) || by_sandbox_[a->sandbox] != a ||
          a->given.ToJson() != policy.ToJson()) {
        continue;
      }
      a->denied_due = due;
      if (now == before) continue;
      a->denied = now;
      a->policy = Compose(a->given, a->denied);
    }
    if (auto st = ApplyPolicy(*a); !st) {
      std::fprintf(stderr, "airlock networks: %s\n", st.error().message().c_str());
    }
  }
}

Status Networks::MakeLink(uint32_t slot) {
  const std::string ns = NetnsName(slot), veth = VethName(slot);
  const std::string gw = Gateway(slot).to_string(), addr = Address(slot).to_string();
  // What an interrupted run left at this slot goes first.
  if (::access(("/sys/class/net/" + veth).c_str(), F_OK) == 0 ||
      ::access(("/run/netns/" + ns).c_str(), F_OK) == 0) {
    (void)DeleteLink(slot);
  }
  // A fresh namespace, a veth with no IPv6 addresses at either end, the /30, loopback up, a
  // default route via the host.
  // With IPv6, a /126 of subnet6 too: static addresses only (no link-local, no duplicate
  // detection to wait for; neighbour discovery works with the global ones).
  std::string host = "netns add " + ns + "\nlink add " + veth + " type veth peer name eth0 netns " +
                     ns + "\nlink set dev " + veth + " addrgenmode none\naddr add " + gw +
                     "/30 dev " + veth + "\n";
  std::string inside =
      "link set lo up\nlink set dev eth0 addrgenmode none\naddr add " + addr + "/30 dev eth0\n";
  if (ipv6_) {
    host += "addr add " + Gateway6(slot).to_string() + "/126 dev " + veth + " nodad\n";
    inside += "addr add " + Address6(slot).to_string() + "/126 dev eth0 nodad\n";
  }
  host += "link set " + veth + " up\n";
  inside += "link set eth0 up\nroute add default via " + gw + "\n";
  if (ipv6_) inside += "route add default via " + Gateway6(slot).to_string() + "\n";
  auto made = RunProgramOk({"ip", "-b", "-"}, host);
  if (made) made = RunProgramOk({"ip", "-n", ns, "-b", "-"}, inside);
  // No router advertisement is heard at either end: whatever a sandbox sends, the host's routes
  // and addresses stay as they are. Without IPv6, the link has none at all (and the firewall
  // drops a sandbox's IPv6 too).
  const std::string off = ipv6_ ? "0" : "1";
  if (made) {
    made = WriteNetSysctls("", {{"ipv6/conf/" + veth + "/accept_ra", "0"},
                                {"ipv6/conf/" + veth + "/disable_ipv6", off}});
  }
  if (made) {
    made = WriteNetSysctls("/run/netns/" + ns, {{"ipv6/conf/default/accept_ra", "0"},
                                                {"ipv6/conf/all/accept_ra", "0"},
                                                {"ipv6/conf/eth0/accept_ra", "0"},
                                                {"ipv6/conf/eth0/disable_ipv6", off}});
  }
  // Links are made shaped to the default rate, so that a create at that rate runs no tc.
  if (made && config_.bandwidth_mbps != 0) made = Shape(slot, config_.bandwidth_mbps);
  if (!made) {
    (void)DeleteLink(slot);
    return made;
  }
  std::lock_guard lock(mu_);
  shaped_[slot] = config_.bandwidth_mbps;
  return made;
}

Status Networks::DeleteLink(uint32_t slot) {
  // The veth first: deleting one end takes both away at once, while a namespace's own teardown
  // runs later in the kernel (and would hold the names a new link in this slot needs).
  if (::access(("/sys/class/net/" + VethName(slot)).c_str(), F_OK) == 0) {
    (void)RunProgram({"ip", "link", "del", VethName(slot)});
  }
  if (::access(("/run/netns/" + NetnsName(slot)).c_str(), F_OK) != 0) return {};
  return RunProgramOk({"ip", "netns", "del", NetnsName(slot)});
}

void Networks::Maintain() {
  std::unique_lock lock(mu_);
  next_refresh_ = std::chrono::steady_clock::now() + kDeniedRefresh;
  while (!stopping_) {
    if (std::chrono::steady_clock::now() >= next_refresh_) {
      next_refresh_ = std::chrono::steady_clock::now() + kDeniedRefresh;
      lock.unlock();
      RefreshDenied();
      lock.lock();
      continue;
    }
    // Links for the next creates first (a create waits for them), then the teardowns.
    if (ready_.size() < config_.warm_links) {
      uint32_t slot = 0;
      if (TakeSlotLocked(slot)) {
        lock.unlock();
        auto made = MakeLink(slot);
        lock.lock();
        if (made) {
          ready_.push_back(slot);
          continue;
        }
        used_[slot] = false;
        std::fprintf(stderr, "airlock networks: %s\n", made.error().message().c_str());
        if (doomed_.empty()) cv_.wait_for(lock, std::chrono::seconds(1));  // no busy loop
      }
    }
    if (!doomed_.empty()) {
      const uint32_t slot = doomed_.front();
      doomed_.pop_front();
      lock.unlock();
      auto deleted = DeleteLink(slot);
      lock.lock();
      if (deleted) {
        used_[slot] = false;
      } else {  // the slot stays taken: better a lost /30 than two sandboxes on one
        std::fprintf(stderr, "airlock networks: %s\n", deleted.error().message().c_str());
      }
      continue;
    }
    if (ready_.size() < config_.warm_links) {
      cv_.wait_until(lock, std::min(next_refresh_,
                                    std::chrono::steady_clock::now() + std::chrono::seconds(1)));
    } else {
      cv_.wait_until(lock, next_refresh_);
    }
  }
}

bool Networks::TakeSlotLocked(uint32_t& slot) {
  // Round robin from the last one taken: a slot just given back rests the longest.
  uint32_t tried = 0;
  for (slot = next_slot_; tried < slots_ && used_[slot]; slot = (slot + 1) % slots_) ++tried;
  if (tried == slots_) return false;
  used_[slot] = true;
  next_slot_ = (slot + 1) % slots_;
  return true;
}

Result<Attachment> Networks::Attach(const std::string& sandbox, const NetworkPolicy& policy) {
  uint32_t slot = 0;
  bool prebuilt = false;
  {
    std::lock_guard lock(mu_);
    if (by_sandbox_.contains(sandbox)) {
      return Fail(ErrorCode::kAlreadyExists, sandbox + " has a network already");
    }
    // A link made ahead of time if there is one (the create then costs no process start),
    // else one made now.
    if (!ready_.empty()) {
      slot = ready_.front();
      ready_.pop_front();
      prebuilt = true;
    } else if (!TakeSlotLocked(slot)) {
      return Fail(ErrorCode::kResourceExhausted,
                  "every address of " + config_.subnet + " is in use (network_subnet)");
    }
  }
  cv_.notify_all();  // the maintainer makes another
  auto joined = Join(sandbox, slot, policy, /*make_link=*/!prebuilt);
  if (!joined) {
    std::lock_guard lock(mu_);
    used_[slot] = false;  // Join removed the link
  }
  return joined;
}

Result<Attachment> Networks::Adopt(const std::string& sandbox, uint32_t slot,
                                   const NetworkPolicy& policy) {
  struct stat st;
  if (slot >= slots_ || ::stat(("/run/netns/" + NetnsName(slot)).c_str(), &st) != 0) {
    return Fail(ErrorCode::kNotFound, "the network namespace of " + sandbox + " is gone");
  }
  {
    std::lock_guard lock(mu_);
    if (used_[slot])
      return Fail(ErrorCode::kAlreadyExists, "slot " + std::to_string(slot) + " is taken");
    used_[slot] = true;
  }
  auto joined = Join(sandbox, slot, policy, /*make_link=*/false);
  if (!joined) {
    std::lock_guard lock(mu_);
    used_[slot] = false;
  }
  return joined;
}

Result<Attachment> Networks::Join(const std::string& sandbox, uint32_t slot,
                                  const NetworkPolicy& given, bool make_link) {
  const std::string veth = VethName(slot);
  const std::string gw = Gateway(slot).to_string(), addr = Address(slot).to_string();
  auto undo = [&](Error e) -> Result<Attachment> {
    (void)firewall_->Remove(veth);
    (void)DeleteLink(slot);
    return std::unexpected(std::move(e).Wrap("giving " + sandbox + " a network"));
  };
  if (auto st = CheckLimits(given); !st) return undo(st.error());
  if (make_link) {
    if (auto st = MakeLink(slot); !st) return undo(st.error());
  }
  auto attached = std::make_shared<Attached>();
  attached->sandbox = sandbox;
  attached->slot = slot;
  attached->address = Address(slot);
  if (ipv6_) attached->address6 = Address6(slot);
  attached->given = given;
  attached->denied = ResolveDenied(given, kDeniedBudget, &attached->denied_due);
  attached->policy = Compose(given, attached->denied);
  if (auto st = ApplyPolicy(*attached); !st) return undo(st.error());
  dns::DnsStubOptions options;
  options.listen = asio::ip::udp::endpoint(Gateway(slot), 53);
  dns::DnsHooks hooks;
  hooks.upstream = config_.dns_upstream;
  if (uplink_ns_) hooks.open_socket = uplink_ns_->Factory();
  hooks.allowed = [this](const IpAddress& client, const std::string& name) -> std::optional<bool> {
    auto p = PolicyFor(client);
    if (!p) return std::nullopt;
    return p->MayResolve(name);
  };
  // No sandbox learns an address it may never reach (DNS rebinding to the host, metadata).
  auto open = NetworkPolicy::FromJson(nlohmann::json{{"mode", "open"}});
  NetworkPolicy any = WithHostDenied(open ? *open : NetworkPolicy());
  hooks.address_ok = [any](const IpAddress& ip) {
    return any.CheckResolved(Verdict{true, "", ""}, ip, 0).allowed;
  };
  hooks.on_event = [this](const dns::DnsEvent& e) {
    NetworkEvent event;
    event.kind = "dns";
    event.name = e.name;
    for (const auto& a : e.answers) event.dest += (event.dest.empty() ? "" : ",") + a.to_string();
    event.port = 53;
    event.allowed = e.verdict == dns::DnsVerdict::kAllowed;
    event.rule = dns::DnsVerdictName(e.verdict);
    Record(e.client, std::move(event));
  };
  auto stub = dns::DnsStub::Start(io_, options, hooks);
  if (!stub) return undo(stub.error().Wrap("starting its DNS stub on " + gw));
  attached->stub = std::move(*stub);
  {
    std::lock_guard lock(mu_);
    by_sandbox_[sandbox] = attached;
    by_address_[attached->address] = attached;
    if (attached->address6) by_address_[*attached->address6] = attached;
  }
  Attachment a;
  a.slot = slot;
  a.netns_path = "/run/netns/" + NetnsName(slot);
  a.gateway = gw;
  a.address = addr;
  if (attached->address6) a.address6 = attached->address6->to_string();
  if (attached->policy.mode() == NetworkMode::kAllowlist) a.env = ProxyEnvOf(gw, proxy_->port());
  return a;
}

std::vector<std::string> Networks::ProxyEnv(const std::string& sandbox) const {
  std::lock_guard lock(mu_);
  auto it = by_sandbox_.find(sandbox);
  if (it == by_sandbox_.end()) return {};
  return ProxyEnvOf(Gateway(it->second->slot).to_string(), proxy_->port());
}

std::optional<std::pair<uint64_t, uint64_t>> Networks::Traffic(const std::string& sandbox) const {
  std::string veth;
  {
    std::lock_guard lock(mu_);
    auto it = by_sandbox_.find(sandbox);
    if (it == by_sandbox_.end()) return std::nullopt;
    veth = VethName(it->second->slot);
  }
  // The host's end: what it received the sandbox sent, and the other way round.
  auto read = [&](const char* counter) -> uint64_t {
    auto text = ReadFileToString("/sys/class/net/" + veth + "/statistics/" + counter);
    return text ? std::strtoull(text->c_str(), nullptr, 10) : 0;
  };
  const uint64_t host_rx = read("rx_bytes");
  const uint64_t host_tx = read("tx_bytes");
  return std::pair{host_tx, host_rx};
}

Status Networks::Update(const std::string& sandbox, const NetworkPolicy& given) {
  if (auto st = CheckLimits(given); !st) return st;
  std::shared_ptr<Attached> attached;
  {
    std::lock_guard lock(mu_);
    auto it = by_sandbox_.find(sandbox);
    if (it == by_sandbox_.end()) {
      return Fail(ErrorCode::kFailedPrecondition,
                  sandbox + " was created without a network; its mode cannot change");
    }
    attached = it->second;
  }
  std::chrono::steady_clock::time_point due;
  std::vector<PacketRule> denied = ResolveDenied(given, kDeniedBudget, &due);
  {
    std::lock_guard lock(mu_);
    attached->given = given;
    attached->denied = std::move(denied);
    attached->denied_due = due;
    attached->policy = Compose(given, attached->denied);
  }
  if (auto st = ApplyPolicy(*attached); !st) return st;
  proxy_->Recheck(attached->address);
  if (attached->address6) proxy_->Recheck(*attached->address6);
  return {};
}

Status Networks::Detach(const std::string& sandbox) {
  std::shared_ptr<Attached> attached;
  {
    std::lock_guard lock(mu_);
    auto it = by_sandbox_.find(sandbox);
    if (it == by_sandbox_.end()) return {};
    attached = it->second;
    by_sandbox_.erase(it);
    by_address_.erase(attached->address);
    if (attached->address6) by_address_.erase(*attached->address6);
    shaped_[attached->slot] = 0;  // the link goes; a new one in this slot starts unshaped
  }
  if (attached->stub) attached->stub->Stop();
  proxy_->Recheck(attached->address);  // no policy now: every connection of it closes
  if (attached->address6) proxy_->Recheck(*attached->address6);
  if (auto st = firewall_->Remove(VethName(attached->slot)); !st) {
    return std::unexpected(st.error().Wrap("removing the network of " + sandbox));
  }
  // Nothing of it can send now; the link goes in the background (the slot stays taken until
  // it is gone).
  {
    std::lock_guard lock(mu_);
    doomed_.push_back(attached->slot);
  }
  cv_.notify_all();
  return {};
}

int Networks::RemoveUnclaimed() {
  const std::string prefix = "airlock-" + config_.id + "-";
  std::vector<uint32_t> doomed;
  if (DIR* dir = ::opendir("/run/netns")) {
    while (dirent* e = ::readdir(dir)) {
      std::string_view name = e->d_name;
      if (!name.starts_with(prefix)) continue;
      uint32_t slot = 0;
      auto digits = name.substr(prefix.size());
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), slot);
      if (ec != std::errc() || end != digits.data() + digits.size()) continue;
      std::lock_guard lock(mu_);
      if (slot >= slots_ || !used_[slot]) doomed.push_back(slot);
    }
    ::closedir(dir);
  }
  int removed = 0;
  // The veth too: a namespace that a live process still holds (a claimed pooled sandbox whose
  // link was being taken away when the daemon died) outlives its name, and its veth with it.
  for (uint32_t slot : doomed) {
    if (DeleteLink(slot)) ++removed;
  }
  return removed;
}

}  // namespace airlock::net
