#pragma once
// FakeAuthority: an authoritative DNS server for tests, on 127.0.0.1 (UDP and TCP, same port
// picked by the kernel). It answers from a map and counts every datagram and TCP query it
// receives, names it does not know included: the exfiltration tests assert that count.
//
// Written with plain sockets and its own encoder on purpose, so the library's codec is checked
// against something it did not produce. One thread, poll() with a short tick; stopped in the
// destructor.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace airlock::net::testing {

class FakeAuthority {
 public:
  struct Entry {
    std::vector<std::string> a;     // dotted quads
    std::vector<std::string> aaaa;  // IPv6 text
    std::optional<std::string> cname;
    uint32_t ttl = 300;
  };

  // What the server does with each query.
  std::atomic<bool> silent{false};          // count, never answer
  std::atomic<bool> wrong_id_first{false};  // send a reply with a wrong id, then the right one
  std::atomic<bool> only_wrong_id{false};   // send only the reply with the wrong id
  std::atomic<bool> truncate_udp{false};    // UDP replies have TC set and no answers
  std::atomic<bool> servfail{false};

  // `address` (network byte order) is where it listens: loopback unless a test gives another.
  explicit FakeAuthority(uint32_t address = htonl(INADDR_LOOPBACK)) {
    // UDP on a port the kernel picks, then TCP on the same number; another process may hold that
    // number on TCP, so try a few ports before giving up on TCP (the TCP test then skips).
    for (int attempt = 0; attempt < 20 && tcp_ < 0; ++attempt) {
      if (udp_ >= 0) close(udp_);
      udp_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = address;
      if (udp_ < 0 || bind(udp_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) abort();
      socklen_t len = sizeof(addr);
      getsockname(udp_, reinterpret_cast<sockaddr*>(&addr), &len);
      port_ = ntohs(addr.sin_port);
      int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      setsockopt(tcp, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(tcp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
          listen(tcp, 16) == 0) {
        tcp_ = tcp;
      } else {
        close(tcp);
      }
    }
    thread_ = std::thread([this] { Serve(); });
  }

  ~FakeAuthority() {
    stop_ = true;
    thread_.join();
    close(udp_);
    if (tcp_ >= 0) close(tcp_);
  }

  uint16_t port() const { return port_; }
  bool has_tcp() const { return tcp_ >= 0; }

  void Set(const std::string& name, Entry entry) {
    std::lock_guard lock(mu_);
    zone_[name] = std::move(entry);
  }

  uint64_t queries() const { return queries_.load(); }
  uint64_t tcp_queries() const { return tcp_queries_.load(); }
  uint64_t queries_for(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = per_name_.find(name);
    return it == per_name_.end() ? 0 : it->second;
  }

 private:
  static void Put16(std::vector<uint8_t>& out, uint16_t v) {
    out.push_back(static_cast<uint8_t>(v >> 8));
    out.push_back(static_cast<uint8_t>(v));
  }
  static void PutName(std::vector<uint8_t>& out, const std::string& name) {
    size_t start = 0;
    while (start < name.size()) {
      size_t dot = name.find('.', start);
      if (dot == std::string::npos) dot = name.size();
      out.push_back(static_cast<uint8_t>(dot - start));
      out.insert(out.end(), name.begin() + start, name.begin() + dot);
      start = dot + 1;
    }
    out.push_back(0);
  }
  static void PutRecord(std::vector<uint8_t>& out, const std::string& owner, bool owner_is_qname,
                        uint16_t type, uint32_t ttl, const std::vector<uint8_t>& rdata) {
    if (owner_is_qname) {
      Put16(out, 0xC00C);
    } else {
      PutName(out, owner);
    }
    Put16(out, type);
    Put16(out, 1);
    Put16(out, static_cast<uint16_t>(ttl >> 16));
    Put16(out, static_cast<uint16_t>(ttl));
    Put16(out, static_cast<uint16_t>(rdata.size()));
    out.insert(out.end(), rdata.begin(), rdata.end());
  }

  // The reply to `q`, or nothing for a packet that is not a plain query.
  std::optional<std::vector<uint8_t>> Reply(const std::vector<uint8_t>& q, bool over_tcp) {
    if (q.size() < 12) return std::nullopt;
    size_t pos = 12;
    std::string name;
    while (pos < q.size() && q[pos] != 0) {
      size_t len = q[pos];
      if (len > 63 || pos + 1 + len > q.size()) return std::nullopt;
      if (!name.empty()) name += '.';
      for (size_t i = 0; i < len; ++i) {
        name += static_cast<char>(std::tolower(q[pos + 1 + i]));
      }
      pos += 1 + len;
    }
    if (pos + 5 > q.size()) return std::nullopt;
    size_t question_end = pos + 5;
    uint16_t qtype = static_cast<uint16_t>(q[pos + 1] << 8 | q[pos + 2]);
    {
      std::lock_guard lock(mu_);
      per_name_[name]++;
    }
    std::vector<uint8_t> out(q.begin(), q.begin() + 12);
    out.insert(out.end(), q.begin() + 12, q.begin() + static_cast<long>(question_end));
    uint16_t flags = 0x8400 | (q[2] & 0x01) << 8;  // QR, AA, RD copied
    uint16_t ancount = 0;
    std::map<std::string, Entry> zone;
    {
      std::lock_guard lock(mu_);
      zone = zone_;
    }
    if (servfail) {
      flags |= 2;
    } else if (!zone.contains(name)) {
      flags |= 3;
    } else if (truncate_udp && !over_tcp) {
      flags |= 0x0200;
    } else {
      std::string current = name;
      for (int hop = 0; hop < 12 && zone.contains(current); ++hop) {
        const Entry& e = zone[current];
        if (e.cname) {
          std::vector<uint8_t> rdata;
          PutName(rdata, *e.cname);
          PutRecord(out, current, current == name, 5, e.ttl, rdata);
          ++ancount;
          current = *e.cname;
          continue;
        }
        if (qtype == 1) {
          for (const auto& a : e.a) {
            std::vector<uint8_t> rdata(4);
            inet_pton(AF_INET, a.c_str(), rdata.data());
            PutRecord(out, current, current == name, 1, e.ttl, rdata);
            ++ancount;
          }
        } else if (qtype == 28) {
          for (const auto& a : e.aaaa) {
            std::vector<uint8_t> rdata(16);
            inet_pton(AF_INET6, a.c_str(), rdata.data());
            PutRecord(out, current, current == name, 28, e.ttl, rdata);
            ++ancount;
          }
        }
        break;
      }
    }
    out[2] = static_cast<uint8_t>(flags >> 8);
    out[3] = static_cast<uint8_t>(flags);
    out[4] = 0;
    out[5] = 1;
    out[6] = static_cast<uint8_t>(ancount >> 8);
    out[7] = static_cast<uint8_t>(ancount);
    for (int i = 8; i < 12; ++i) out[i] = 0;
    return out;
  }

  void ServeTcp() {
    int conn = accept4(tcp_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return;
    timeval tv{2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    uint8_t prefix[2];
    if (recv(conn, prefix, 2, MSG_WAITALL) == 2) {
      size_t len = static_cast<size_t>(prefix[0]) << 8 | prefix[1];
      std::vector<uint8_t> q(len);
      if (len > 0 && recv(conn, q.data(), len, MSG_WAITALL) == static_cast<ssize_t>(len)) {
        queries_++;
        tcp_queries_++;
        if (auto reply = Reply(q, true); reply && !silent) {
          std::vector<uint8_t> framed{static_cast<uint8_t>(reply->size() >> 8),
                                      static_cast<uint8_t>(reply->size())};
          framed.insert(framed.end(), reply->begin(), reply->end());
          (void)!send(conn, framed.data(), framed.size(), MSG_NOSIGNAL);
        }
      }
    }
    close(conn);
  }

  void Serve() {
    std::vector<uint8_t> buf(65536);
    while (!stop_) {
      pollfd fds[2] = {{udp_, POLLIN, 0}, {tcp_, POLLIN, 0}};
      int n = poll(fds, tcp_ >= 0 ? 2 : 1, 20);
      if (n <= 0) continue;
      if (tcp_ >= 0 && (fds[1].revents & POLLIN)) ServeTcp();
      if (!(fds[0].revents & POLLIN)) continue;
      sockaddr_storage from{};
      socklen_t from_len = sizeof(from);
      ssize_t got =
          recvfrom(udp_, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (got < 0) continue;
      queries_++;
      if (silent) continue;
      auto reply = Reply(std::vector<uint8_t>(buf.begin(), buf.begin() + got), false);
      if (!reply) continue;
      if (wrong_id_first || only_wrong_id) {
        std::vector<uint8_t> wrong = *reply;
        wrong[1] ^= 0x5A;
        sendto(udp_, wrong.data(), wrong.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
        if (only_wrong_id) continue;
      }
      sendto(udp_, reply->data(), reply->size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
  }

  int udp_ = -1;
  int tcp_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> queries_{0};
  std::atomic<uint64_t> tcp_queries_{0};
  mutable std::mutex mu_;
  std::map<std::string, Entry> zone_;
  std::map<std::string, uint64_t> per_name_;
  std::thread thread_;
};

}  // namespace airlock::net::testing
