#pragma once
// AddressCache: the egress proxy's short memory of what names resolved to, so that a proxied
// request does not pay an upstream DNS round trip each time (docs/design/network.md, "Egress
// proxy"). It holds addresses, never verdicts: the proxy still judges every connection and
// re-checks every address it is given (CheckResolved), cached or not.
//
//   - an answer lives min(its TTL, max_ttl); a TTL of 0 is not kept;
//   - NXDOMAIN and NODATA (no address) live negative_ttl; failures (timeouts, SERVFAIL) are not
//     kept, so the next caller asks again;
//   - at most max_entries names: expired ones go first, then the one closest to expiry;
//   - callers that ask for a name while a lookup of it is under way wait for that lookup and share
//     its answer (one upstream query, however many connections open at once).
//
// Thread-safe: Resolve blocks (the lookup runs on the calling thread) and may be called from any
// number of threads at once; one mutex guards the map and is never held during a lookup.

#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/dns_resolver.h"

namespace airlock::net::dns {

struct AddressCacheOptions {
  std::chrono::seconds max_ttl{30};
  std::chrono::seconds negative_ttl{5};
  size_t max_entries = 4096;
  // The clock entries expire by; tests set one they can move. Unset: steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> now;
};

class AddressCache {
 public:
  // name -> its addresses (ResolveAddresses, or a test's map). May block.
  using Lookup = std::function<Result<ResolveResult>(const std::string& name)>;

  explicit AddressCache(Lookup lookup, AddressCacheOptions options = {});
  AddressCache(const AddressCache&) = delete;
  AddressCache& operator=(const AddressCache&) = delete;

  // The addresses of `name` (as the proxy normalised it), from the cache while the entry lives,
  // else from the lookup. NXDOMAIN and NODATA are kNotFound; a failed lookup passes its error on.
  [[nodiscard]] Result<std::vector<boost::asio::ip::address>> Resolve(const std::string& name);

  struct Stats {
    uint64_t hits = 0;       // answered from an entry
    uint64_t lookups = 0;    // lookups run
    uint64_t coalesced = 0;  // callers that waited for a lookup another caller ran
  };
  Stats stats() const;
  size_t size() const;  // entries held, live or expired

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Entry {
    ResolveResult answer;  // never a failure: those are not kept
    TimePoint expires;
  };
  struct Pending {
    bool done = false;
    std::optional<Result<ResolveResult>> answer;
  };

  TimePoint Now() const;
  // Keeps `answer` if it may be kept; mu_ held.
  void StoreLocked(const std::string& name, const ResolveResult& answer);
  static Result<std::vector<boost::asio::ip::address>> Addresses(const std::string& name,
                                                                 const Result<ResolveResult>& a);

  Lookup lookup_;
  AddressCacheOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a pending lookup finished
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::shared_ptr<Pending>> pending_;
  Stats stats_;
};

}  // namespace airlock::net::dns
