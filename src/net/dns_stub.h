#pragma once
// DnsStub: the DNS server a sandbox with network.mode = "allowlist" talks to (its resolv.conf
// names the stub's address on the sandbox's gateway). It answers only names the policy allows
// for that client; everything else gets NXDOMAIN without a single packet going upstream, so a
// sandbox cannot use DNS to carry data out (docs/design/network.md, "DNS stub").
//
// One stub serves one UDP endpoint. The daemon runs one per gateway address (a stub bound to a
// wildcard address would answer from whatever source address routing picks, and clients drop
// answers from an address they did not ask). The client is the datagram's source address; that
// it cannot be spoofed is the job of the veth and nftables rules, not of the stub.
//
// Answers to a sandbox: A and AAAA records owned by the question name itself (CNAME chains are
// followed upstream and flattened, so the sandbox never learns the intermediate names), TTL
// capped at max_ttl; addresses the address_ok hook rejects are dropped (DNS rebinding defence)
// and when none is left the answer is NOERROR with no records (NODATA: the name exists, it has
// nothing the sandbox may use; NXDOMAIN would also wrongly deny the other address family). Any
// other type of an allowed name gets NODATA without asking upstream. No TCP listener: answers
// are kept within 512 bytes, so TC is never set.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/dns_message.h"
#include "net/socket_factory.h"

namespace airlock::net::dns {

enum class DnsVerdict {
  kAllowed,      // the policy allows the name; answered (from the cache or upstream)
  kDenied,       // not allowed, or not a host name at all: NXDOMAIN, nothing sent upstream
  kRefused,      // the client is not a known sandbox: REFUSED
  kRateLimited,  // the client is over its rate: dropped (reported once per burst of drops)
  kMalformed,    // unparsable (FORMERR or dropped), or an opcode or class not served (NOTIMP)
  kError,        // allowed, but upstream failed or a limit was hit: SERVFAIL
};
const char* DnsVerdictName(DnsVerdict verdict);

struct DnsEvent {
  boost::asio::ip::address client;
  std::string name;  // normalised; empty when the query had no name the stub could read
  uint16_t qtype = 0;
  DnsVerdict verdict = DnsVerdict::kDenied;
  Rcode rcode = Rcode::kNoError;  // what the client was sent (meaningless for kRateLimited)
  std::vector<boost::asio::ip::address> answers;  // the records sent
  bool cached = false;                            // answered from the cache
};

struct DnsHooks {
  // Whether the client (a sandbox's address) may resolve `name` (lowercased, no trailing dot).
  // nullopt: the client is unknown -> REFUSED.
  std::function<std::optional<bool>(const boost::asio::ip::address& client,
                                    const std::string& name)>
      allowed;
  // Whether an address from upstream may be given to a sandbox. Unset: every address may.
  std::function<bool(const boost::asio::ip::address&)> address_ok;
  std::vector<boost::asio::ip::udp::endpoint> upstream;
  // Makes the sockets that ask upstream (unset: socket(2), in this network namespace).
  SocketFactory open_socket;
  // An audit record per answered (or dropped) query. Unset: none.
  std::function<void(const DnsEvent&)> on_event;
};

struct DnsStubOptions {
  boost::asio::ip::udp::endpoint listen;  // port 0: the kernel picks (see local_endpoint())
  std::chrono::milliseconds upstream_timeout{2000};
  uint32_t max_ttl = 30;               // seconds: answers and cache entries live at most this long
  uint32_t negative_ttl = 5;           // seconds an upstream NXDOMAIN or NODATA is cached
  size_t cache_entries = 4096;         // (name, type) pairs
  double client_qps = 200;             // token bucket per client address...
  double client_burst = 200;           // ...and its depth
  size_t max_clients = 4096;           // rate buckets kept; a new client past this is dropped
  size_t max_upstream_inflight = 128;  // distinct (name, type) resolutions at once
  size_t max_waiters = 64;             // clients waiting on one resolution; more get SERVFAIL
};

class DnsStub {
 public:
  // Binds the UDP socket (synchronously, so a bind error is returned here) and starts serving on
  // `io`. Any thread. The hooks are called on a strand of `io`, one call at a time, and must not
  // block; they may be called until Stop() has taken effect.
  [[nodiscard]] static Result<std::unique_ptr<DnsStub>> Start(boost::asio::io_context& io,
                                                              DnsStubOptions options,
                                                              DnsHooks hooks);
  ~DnsStub();  // Stop()

  boost::asio::ip::udp::endpoint local_endpoint() const { return local_; }

  // Closes the socket (through the strand). Any thread; resolutions in flight finish unanswered.
  void Stop();

  // Monotonic counters, readable from any thread.
  struct Counters {
    std::atomic<uint64_t> queries{0};           // datagrams received
    std::atomic<uint64_t> upstream_queries{0};  // resolutions started upstream
    std::atomic<uint64_t> cache_hits{0};
    std::atomic<uint64_t> coalesced{0};  // queries that joined a resolution in flight
    std::atomic<uint64_t> denied{0};
    std::atomic<uint64_t> rate_limited{0};
    std::atomic<uint64_t> malformed{0};
  };
  const Counters& counters() const;

  struct Impl;

 private:
  explicit DnsStub(std::shared_ptr<Impl> impl, boost::asio::ip::udp::endpoint local);
  std::shared_ptr<Impl> impl_;
  boost::asio::ip::udp::endpoint local_;
};

}  // namespace airlock::net::dns
