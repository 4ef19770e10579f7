#pragma once
// The fake internet of the egress tests and the network benchmark (SECURITY.md, "Egress tests"):
// a network namespace behind a veth that a test daemon takes as its uplink, with web sites on
// 198.18.N.2 and .3 and an authoritative DNS server on the host side of that veth
// (198.18.N.1) that counts every query. Nothing sent to it leaves this machine. Needs root and
// iproute2; everything it made is removed in its destructor.
//
// Used by tests/integration (network_test.cc, cli_test.cc) and bench/net_bench.cc; no gtest.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/slot.h"
#include "unit/net/fake_authority.h"

namespace airlock::testing {

// Web sites inside the fake internet: listeners on ports 80, 8080 and 443 of each address (IPv4
// or IPv6), in the fake namespace, counting connections, each answered on a thread of its own.
// On 80 and 8080 they speak HTTP and answer "site <address> host <Host>", or N zero bytes for
// GET /bytes/N, then close; GET /keep/bytes/N (without Connection: close) keeps the connection
// for the next request. On 443 they speak no TLS: they read the first bytes (a ClientHello) and
// answer "site <address> tls <first byte>" in text, which is enough to show whether the proxy
// let a ClientHello through, and to where. UDP port 8080 answers each datagram with
// "udp <address>" and counts them (udp_hits).
class FakeSites {
 public:
  FakeSites(const std::string& netns_path, const std::vector<std::string>& addresses) {
    std::promise<bool> ready;
    auto started = ready.get_future();
    thread_ = std::thread([this, netns_path, addresses, &ready] {
      int ns = ::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      // This thread lives in the fake internet: its sockets are that namespace's.
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
        ready.set_value(false);
        return;
      }
      ::close(ns);
      for (const std::string& a : addresses) {
        const bool v6 = a.find(':') != std::string::npos;
        for (int i = 0; i < 4; ++i) {
          const bool udp = i == 3;
          const uint16_t port = udp ? kUdpPort : std::array<uint16_t, 3>{80, 8080, 443}[i];
          int s =
              ::socket(v6 ? AF_INET6 : AF_INET, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
          int one = 1;
          ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
          sockaddr_storage addr{};
          socklen_t size = 0;
          if (v6) {
            auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons(port);
            ::inet_pton(AF_INET6, a.c_str(), &in6->sin6_addr);
            size = sizeof *in6;
          } else {
            auto* in = reinterpret_cast<sockaddr_in*>(&addr);
            in->sin_family = AF_INET;
            in->sin_port = htons(port);
            ::inet_pton(AF_INET, a.c_str(), &in->sin_addr);
            size = sizeof *in;
          }
          if (::bind(s, reinterpret_cast<sockaddr*>(&addr), size) != 0 ||
              (!udp && ::listen(s, 64) != 0)) {
            ready.set_value(false);
            return;
          }
          listeners_.push_back({s, port, Key(a, port), udp, a});
        }
      }
      ready.set_value(true);
      Serve();
    });
    ok_ = started.get();
  }
  ~FakeSites() {
    stop_ = true;
    thread_.join();
    // The connections' threads see stop_ within a poll interval or a send timeout.
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return active_ == 0; });
    lock.unlock();
    for (const Listener& l : listeners_) ::close(l.fd);
  }
  bool ok() const { return ok_; }
  static constexpr uint16_t kUdpPort = 8080;
  // How hits() and the others name a port of an address: "ADDRESS" for port 80, "ADDRESS:PORT"
  // for the others ("[ADDRESS]:PORT" for IPv6).
  static std::string Key(const std::string& address, uint16_t port) {
    if (port == 80) return address;
    const bool v6 = address.find(':') != std::string::npos;
    return (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
  }
  // Datagrams to the UDP port of `address`.
  int udp_hits(const std::string& address) {
    std::lock_guard lock(mu_);
    return udp_hits_[address];
  }
  // Connections to port 80 of `address` ("ADDRESS:8080", "ADDRESS:443" for the other ports;
  // Key).
  int hits(const std::string& address) {
    std::lock_guard lock(mu_);
    return hits_[address];
  }
  // Of those, the ones that sent at least one byte (a proxy may connect, then close unused).
  int received(const std::string& address) {
    std::lock_guard lock(mu_);
    return received_[address];
  }
  // The source address of the last connection there ("" if none came): who the site saw.
  std::string last_client(const std::string& address) {
    std::lock_guard lock(mu_);
    return last_client_[address];
  }

 private:
  struct Listener {
    int fd;
    uint16_t port;
    std::string name;  // as hits() takes it
    bool udp;
    std::string address;
  };

  // Writes all of `data`; false when the client went away.
  static bool WriteAll(int fd, const char* data, size_t size) {
    while (size > 0) {
      ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);  // a client gone is no SIGPIPE
      if (n <= 0) return false;
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  // Counts a connection that sent something, before it is answered (a client that has the
  // answer finds the count moved).
  void Received(const Listener& l) {
    std::lock_guard lock(mu_);
    ++received_[l.name];
  }

  void Answer(int c, const Listener& l) {
    std::string request;
    char buf[4096];
    pollfd p{c, POLLIN, 0};
    const std::string& address = l.address;
    timeval send_timeout{5, 0};  // a client that stops reading does not hold the thread for ever
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    if (l.port == 443) {
      ssize_t n = ::poll(&p, 1, 2000) > 0 ? ::read(c, buf, sizeof buf) : 0;
      if (n > 0) Received(l);
      const std::string reply = "site " + address + " tls " +
                                (n > 0 ? std::to_string(static_cast<uint8_t>(buf[0])) : "none") +
                                "\n";
      (void)WriteAll(c, reply.data(), reply.size());
      return;
    }
    for (bool first = true;; first = false) {
      size_t end;
      while ((end = request.find("\r\n\r\n")) == std::string::npos && ::poll(&p, 1, 2000) > 0) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      if (first && !request.empty()) Received(l);
      if (!first && end == std::string::npos) return;  // a kept connection went quiet or away
      // A client that sent no request line (it only connected) gets the site's answer anyway,
      // as before, but nothing is parsed out of a head shorter than a method.
      if (request.size() < 4) request = "GET / HTTP/1.0\r\n\r\n";
      const std::string head_in = request.substr(0, end == std::string::npos ? end : end + 4);
      request.erase(0, end == std::string::npos ? end : end + 4);
      std::string host;
      if (size_t at = head_in.find("\r\nHost: "); at != std::string::npos) {
        host = head_in.substr(at + 8, head_in.find("\r\n", at + 8) - at - 8);
      }
      const bool keep = head_in.starts_with("GET /keep/") &&
                        head_in.find("\r\nConnection: close\r\n") == std::string::npos;
      const std::string path = head_in.substr(keep ? 9 : 4);
      size_t body_bytes = 0;
      std::string body;
      if (path.starts_with("/bytes/")) {
        body_bytes = std::strtoull(path.c_str() + 7, nullptr, 10);
      } else {
        body = "site " + address + " host " + host + "\n";
        body_bytes = body.size();
      }
      const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body_bytes) +
                               "\r\n" + (keep ? "" : "Connection: close\r\n") + "\r\n";
      if (!body.empty()) {
        if (!WriteAll(c, (head + body).data(), head.size() + body.size())) return;
      } else {
        if (!WriteAll(c, head.data(), head.size())) return;
        static const std::string kZeros(256 * 1024, '\0');
        for (size_t left = body_bytes; left > 0 && !stop_;) {
          const size_t n = std::min(left, kZeros.size());
          if (!WriteAll(c, kZeros.data(), n)) return;
          left -= n;
        }
      }
      if (!keep) return;
    }
  }

  // Counts a connection or a datagram, and who sent it.
  void Count(const Listener& l, const sockaddr_storage& peer) {
    char text[INET6_ADDRSTRLEN] = "";
    if (peer.ss_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr, text,
                  sizeof text);
    } else {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text,
                  sizeof text);
    }
    std::lock_guard lock(mu_);
    ++(l.udp ? udp_hits_[l.address] : hits_[l.name]);
    last_client_[l.udp ? "udp " + l.address : l.name] = text;
  }

  void Serve() {
    while (!stop_) {
      std::vector<pollfd> fds;
      for (const Listener& l : listeners_) fds.push_back({l.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        const Listener& l = listeners_[i];
        sockaddr_storage peer{};
        socklen_t peer_size = sizeof peer;
        if (l.udp) {
          char buf[2048];
          if (::recvfrom(l.fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer), &peer_size) <
              0) {
            continue;
          }
          Count(l, peer);
          const std::string reply = "udp " + l.address + "\n";
          ::sendto(l.fd, reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&peer),
                   peer_size);
          continue;
        }
        int c = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&peer), &peer_size, SOCK_CLOEXEC);
        if (c < 0) continue;
        // A head and a body are two writes: without this, a kept connection's second reply
        // waits on the client's delayed ACK (Nagle).
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Count(l, peer);
        {
          std::lock_guard lock(mu_);
          ++active_;
        }
        std::thread([this, c, &l] {
          Answer(c, l);
          ::close(c);
          std::lock_guard lock(mu_);
          if (--active_ == 0) done_.notify_all();
        }).detach();
      }
    }
  }

  std::vector<Listener> listeners_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool ok_ = false;
  std::mutex mu_;
  int active_ = 0;  // connections being answered
  std::condition_variable done_;
  std::map<std::string, int> hits_;
  std::map<std::string, int> udp_hits_;
  std::map<std::string, int> received_;
  std::map<std::string, std::string> last_client_;
};

// The topology: namespace airlock-fake-N with eth0 (198.18.N.2, .3 and .200, default route via
// .1), its peer alupN (198.18.N.1) on the host, the sites above and the DNS authority on the host
// side. With IPv6 also 2001:db8:N::2 and ::3 (a route via ::1, alupN's), so that the uplink has a
// global IPv6 address. N is 20 + the test process's slot (support/slot.h): two processes'
// fake internets never meet.
// Start() once; the destructor removes it all (the veth first: a namespace's teardown in the
// kernel comes later, with its names).
class FakeInternet {
 public:
  explicit FakeInternet(bool with_ipv6 = false) : FakeInternet(TestSlot() + 20, with_ipv6) {}
  // N chosen by the caller (the benchmarks take 240-249, clear of the tests' 20-219).
  FakeInternet(int n, bool with_ipv6)
      : net(std::to_string(n)),
        ns("airlock-fake-" + net),
        uplink("alup" + net),
        host_ip("198.18." + net + ".1"),
        site("198.18." + net + ".2"),
        other_site("198.18." + net + ".3"),
        far_site("198.18." + net + ".200"),
        ipv6(with_ipv6),
        host_ip6("2001:db8:" + net + "::1"),
        site6("2001:db8:" + net + "::2"),
        other_site6("2001:db8:" + net + "::3") {}
  FakeInternet(const FakeInternet&) = delete;
  ~FakeInternet() {
    sites_.reset();
    dns_.reset();
    if (made_) Remove();
  }

  // Why this machine cannot have one ("" when it can): not root, or no iproute2.
  static std::string Missing() {
    if (::geteuid() != 0) return "needs root";
    if (::access("/usr/sbin/ip", X_OK) != 0 && ::access("/sbin/ip", X_OK) != 0) {
      return "ip (iproute2) is not installed";
    }
    return "";
  }

  // Builds the namespace, the veth, the sites and the DNS authority ("" or what failed).
  std::string Start() {
    Remove();  // what a killed run with the same N left
    made_ = true;
    if (Sh("ip netns add " + ns + " && ip link add " + uplink + " type veth peer name eth0 netns " +
           ns + " && ip addr add " + host_ip + "/24 dev " + uplink + " && ip link set " + uplink +
           " up && ip -n " + ns + " link set lo up && ip -n " + ns + " addr add " + site +
           "/24 dev eth0 && ip -n " + ns + " addr add " + other_site + "/24 dev eth0 && ip -n " +
           ns + " addr add " + far_site + "/24 dev eth0 && ip -n " + ns +
           " link set eth0 up && ip -n " + ns + " route add default via " + host_ip) != 0) {
      return "making namespace " + ns + " and veth " + uplink + " failed";
    }
    std::vector<std::string> addresses = {site, other_site, far_site};
    if (ipv6) {
      if (Sh("ip addr add " + host_ip6 + "/64 dev " + uplink + " nodad && ip -n " + ns +
             " addr add " + site6 + "/64 dev eth0 nodad && ip -n " + ns + " addr add " +
             other_site6 + "/64 dev eth0 nodad && ip -n " + ns + " -6 route add default via " +
             host_ip6) != 0) {
        return "giving the fake internet IPv6 failed";
      }
      addresses.insert(addresses.end(), {site6, other_site6});
    }
    sites_.emplace("/run/netns/" + ns, addresses);
    if (!sites_->ok()) return "the fake sites did not start";
    in_addr host{};
    ::inet_pton(AF_INET, host_ip.c_str(), &host);
    dns_.emplace(host.s_addr);
    return "";
  }

  // airlockd's flags that make this its uplink and its DNS upstream.
  std::vector<std::string> DaemonArgs() const {
    return {"--network-uplink", uplink, "--network-dns",
            host_ip + ":" + std::to_string(dns_->port())};
  }

  FakeSites& sites() { return *sites_; }
  net::testing::FakeAuthority& dns() { return *dns_; }

  const std::string net;         // N
  const std::string ns;          // the namespace's name (/run/netns/NAME)
  const std::string uplink;      // the host's end of the veth
  const std::string host_ip;     // that end's address; the DNS authority listens there
  const std::string site;        // a web site (198.18.N.2)
  const std::string other_site;  // another (198.18.N.3)
  const std::string far_site;    // one in another /25 (198.18.N.200)
  const bool ipv6;               // the sites below exist, and the uplink has IPv6
  const std::string host_ip6;    // alupN's IPv6 address (2001:db8:N::1)
  const std::string site6;       // the sites' IPv6 addresses (2001:db8:N::2, ::3)
  const std::string other_site6;

 private:
  static int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }
  void Remove() const {
    Sh("ip link del " + uplink + " 2>/dev/null; ip netns del " + ns + " 2>/dev/null; true");
  }

  bool made_ = false;
  std::optional<FakeSites> sites_;
  std::optional<net::testing::FakeAuthority> dns_;
};

}  // namespace airlock::testing
