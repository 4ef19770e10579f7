#include "net/dns_stub.h"

#include <algorithm>
#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <map>
#include <utility>

#include "net/dns_resolver.h"

namespace airlock::net::dns {

namespace asio = boost::asio;
using asio::ip::address;
using asio::ip::udp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

// A client's query can be no larger than this and be one the stub answers (one question, one
// OPT record); a longer datagram is truncated by the kernel and then fails to parse.
constexpr size_t kMaxQueryBytes = 1024;

using CacheKey = std::pair<std::string, uint16_t>;  // (name, qtype)

struct CacheEntry {
  Rcode rcode = Rcode::kNoError;
  std::vector<address> addresses;  // already filtered by address_ok
  Clock::time_point expires;
};

struct Waiter {
  udp::endpoint client;
  Query query;
};

struct Bucket {
  double tokens = 0;
  Clock::time_point last;
  bool limited = false;  // in a run of drops: report the first only
};

}  // namespace

const char* DnsVerdictName(DnsVerdict verdict) {
  switch (verdict) {
    case DnsVerdict::kAllowed:
      return "allowed";
    case DnsVerdict::kDenied:
      return "denied";
    case DnsVerdict::kRefused:
      return "refused";
    case DnsVerdict::kRateLimited:
      return "rate_limited";
    case DnsVerdict::kMalformed:
      return "malformed";
    case DnsVerdict::kError:
      return "error";
  }
  return "unknown";
}

// All state below is touched only on `strand`.
struct DnsStub::Impl : std::enable_shared_from_this<DnsStub::Impl> {
  Impl(asio::io_context& io, DnsStubOptions opts, DnsHooks h)
      : strand(asio::make_strand(io)),
        options(std::move(opts)),
        hooks(std::move(h)),
        socket(strand) {}

  asio::strand<asio::io_context::executor_type> strand;
  DnsStubOptions options;
  DnsHooks hooks;
  udp::socket socket;
  bool closed = false;
  std::array<uint8_t, kMaxQueryBytes> buffer{};
  udp::endpoint sender;
  Counters counters;
  std::map<CacheKey, CacheEntry> cache;
  std::map<CacheKey, std::vector<Waiter>> pending;
  std::map<address, Bucket> buckets;

  void Receive() {
    if (closed) return;
    socket.async_receive_from(asio::buffer(buffer), sender,
                              [self = shared_from_this()](error_code ec, size_t n) {
                                if (self->closed) return;
                                // Errors on a UDP socket (ICMP reports of earlier sends) do not
                                // stop the stub; only closing does.
                                if (!ec) self->OnDatagram(n);
                                self->Receive();
                              });
  }

  void Close() {
    closed = true;
    error_code ignored;
    socket.close(ignored);
  }

  void Send(const udp::endpoint& to, std::vector<uint8_t> bytes) {
    if (closed) return;
    auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    socket.async_send_to(asio::buffer(*buf), to, [buf](error_code, size_t) {});
  }

  void Emit(DnsEvent event) {
    if (hooks.on_event) hooks.on_event(event);
  }

  void Answer(const udp::endpoint& client, const Query& query, const std::string& name,
              DnsVerdict verdict, Rcode rcode, const std::vector<address>& addresses, uint32_t ttl,
              bool cached) {
    DnsEvent event;
    event.client = client.address();
    event.name = name;
    event.qtype = query.question.qtype;
    event.verdict = verdict;
    event.rcode = rcode;
    if (rcode == Rcode::kNoError) {
      for (const auto& a : addresses) {
        if ((query.question.qtype == kTypeA) == a.is_v4()) event.answers.push_back(a);
      }
    }
    event.cached = cached;
    // The audit record first: once the client has its answer, the record exists.
    Emit(std::move(event));
    Send(client, BuildResponse(query, rcode, addresses, ttl));
  }

  bool TakeToken(const address& client) {
    auto now = Clock::now();
    auto it = buckets.find(client);
    if (it == buckets.end()) {
      if (buckets.size() >= options.max_clients) {
        // A full bucket says nothing a missing one does not: forget those.
        std::erase_if(buckets, [&](const auto& kv) {
          std::chrono::duration<double> idle = now - kv.second.last;
          return kv.second.tokens + idle.count() * options.client_qps >= options.client_burst;
        });
        if (buckets.size() >= options.max_clients) return false;
      }
      it = buckets.emplace(client, Bucket{options.client_burst, now, false}).first;
    }
    Bucket& b = it->second;
    std::chrono::duration<double> elapsed = now - b.last;
    b.tokens = std::min(options.client_burst, b.tokens + elapsed.count() * options.client_qps);
    b.last = now;
    if (b.tokens >= 1) {
      b.tokens -= 1;
      b.limited = false;
      return true;
    }
    if (!b.limited) {
      b.limited = true;
      DnsEvent event;
      event.client = client;
      event.verdict = DnsVerdict::kRateLimited;
      Emit(std::move(event));
    }
    return false;
  }

  void OnDatagram(size_t n) {
    counters.queries++;
    const udp::endpoint client = sender;
    if (!TakeToken(client.address())) {
      counters.rate_limited++;
      return;
    }
    std::span<const uint8_t> packet(buffer.data(), n);
    auto parsed = ParseQuery(packet);
    if (!parsed) {
      counters.malformed++;
      DnsEvent event;
      event.client = client.address();
      event.verdict = DnsVerdict::kMalformed;
      event.rcode = Rcode::kFormErr;
      Emit(std::move(event));
      if (auto id = QueryIdForError(packet)) Send(client, BuildErrorResponse(*id, Rcode::kFormErr));
      return;
    }
    const Query& query = *parsed;
    if (query.opcode != 0 || query.question.qclass != kClassIn) {
      counters.malformed++;
      Answer(client, query, "", DnsVerdict::kMalformed, Rcode::kNotImp, {}, 0, false);
      return;
    }
    auto name = NormalizedName(query.question.labels);
    if (!name) {
      // No policy can list it, so there is nothing to ask anyone.
      counters.denied++;
      Answer(client, query, "", DnsVerdict::kDenied, Rcode::kNxDomain, {}, 0, false);
      return;
    }
    std::optional<bool> allowed =
        hooks.allowed ? hooks.allowed(client.address(), *name) : std::nullopt;
    if (!allowed) {
      Answer(client, query, *name, DnsVerdict::kRefused, Rcode::kRefused, {}, 0, false);
      return;
    }
    if (!*allowed) {
      counters.denied++;
      Answer(client, query, *name, DnsVerdict::kDenied, Rcode::kNxDomain, {}, 0, false);
      return;
    }
    const uint16_t qtype = query.question.qtype;
    if (qtype != kTypeA && qtype != kTypeAaaa) {
      Answer(client, query, *name, DnsVerdict::kAllowed, Rcode::kNoError, {}, 0, false);
      return;
    }
    CacheKey key{*name, qtype};
    auto now = Clock::now();
    if (auto it = cache.find(key); it != cache.end()) {
      if (it->second.expires > now) {
        // Rounded up: an entry with 0.4 s left is still answered, with TTL 1.
        auto left = std::chrono::ceil<std::chrono::seconds>(it->second.expires - now);
        counters.cache_hits++;
        Answer(client, query, *name, DnsVerdict::kAllowed, it->second.rcode, it->second.addresses,
               static_cast<uint32_t>(left.count()), true);
        return;
      }
      cache.erase(it);
    }
    if (auto it = pending.find(key); it != pending.end()) {
      if (it->second.size() >= options.max_waiters) {
        Answer(client, query, *name, DnsVerdict::kError, Rcode::kServFail, {}, 0, false);
        return;
      }
      counters.coalesced++;
      it->second.push_back(Waiter{client, query});
      return;
    }
    if (pending.size() >= options.max_upstream_inflight) {
      Answer(client, query, *name, DnsVerdict::kError, Rcode::kServFail, {}, 0, false);
      return;
    }
    pending[key].push_back(Waiter{client, query});
    counters.upstream_queries++;
    AsyncResolve(
        strand, *name, qtype, hooks.upstream, options.upstream_timeout,
        [self = shared_from_this(), key](Result<ResolveResult> result) {
          self->OnResolved(key, std::move(result));
        },
        hooks.open_socket);
  }

  void OnResolved(const CacheKey& key, Result<ResolveResult> result) {
    auto node = pending.extract(key);
    if (node.empty()) return;
    std::vector<Waiter> waiters = std::move(node.mapped());
    if (!result) {
      for (const auto& w : waiters) {
        Answer(w.client, w.query, key.first, DnsVerdict::kError, Rcode::kServFail, {}, 0, false);
      }
      return;
    }
    std::vector<address> kept;
    for (const auto& a : result->addresses) {
      if (!hooks.address_ok || hooks.address_ok(a)) kept.push_back(a);
    }
    uint32_t ttl = result->addresses.empty() ? options.negative_ttl : result->ttl;
    ttl = std::min(ttl, options.max_ttl);
    if (ttl > 0)
      Store(key, CacheEntry{result->rcode, kept, Clock::now() + std::chrono::seconds(ttl)});
    for (const auto& w : waiters) {
      Answer(w.client, w.query, key.first, DnsVerdict::kAllowed, result->rcode, kept, ttl, false);
    }
  }

  void Store(const CacheKey& key, CacheEntry entry) {
    if (options.cache_entries == 0) return;
    if (cache.size() >= options.cache_entries && !cache.contains(key)) {
      auto now = Clock::now();
      std::erase_if(cache, [&](const auto& kv) { return kv.second.expires <= now; });
      if (cache.size() >= options.cache_entries) {
        // Still full: drop the entry that would have expired first.
        auto soonest = std::min_element(
            cache.begin(), cache.end(),
            [](const auto& a, const auto& b) { return a.second.expires < b.second.expires; });
        cache.erase(soonest);
      }
    }
    cache[key] = std::move(entry);
  }
};

Result<std::unique_ptr<DnsStub>> DnsStub::Start(asio::io_context& io, DnsStubOptions options,
                                                DnsHooks hooks) {
  udp::endpoint listen = options.listen;
  auto impl = std::make_shared<Impl>(io, std::move(options), std::move(hooks));
  error_code ec;
  impl->socket.open(listen.protocol(), ec);
  if (!ec) impl->socket.bind(listen, ec);
  if (ec) {
    return std::unexpected(Error(ErrorCode::kUnavailable,
                                 "binding the DNS stub to " + listen.address().to_string() + ":" +
                                     std::to_string(listen.port()) + ": " + ec.message(),
                                 ec.value()));
  }
  udp::endpoint local = impl->socket.local_endpoint(ec);
  if (ec) return FailErrno("reading the DNS stub's address", ec.value());
  asio::post(impl->strand, [impl] { impl->Receive(); });
  return std::unique_ptr<DnsStub>(new DnsStub(std::move(impl), local));
}

DnsStub::DnsStub(std::shared_ptr<Impl> impl, udp::endpoint local)
    : impl_(std::move(impl)), local_(local) {}

DnsStub::~DnsStub() { Stop(); }

void DnsStub::Stop() {
  asio::post(impl_->strand, [impl = impl_] { impl->Close(); });
}

const DnsStub::Counters& DnsStub::counters() const { return impl_->counters; }

}  // namespace airlock::net::dns
