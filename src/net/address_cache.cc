#include "net/address_cache.h"

#include <algorithm>
#include <utility>

namespace airlock::net::dns {

AddressCache::AddressCache(Lookup lookup, AddressCacheOptions options)
    : lookup_(std::move(lookup)), options_(std::move(options)) {}

AddressCache::TimePoint AddressCache::Now() const {
  return options_.now ? options_.now() : std::chrono::steady_clock::now();
}

Result<std::vector<boost::asio::ip::address>> AddressCache::Addresses(
    const std::string& name, const Result<ResolveResult>& answer) {
  if (!answer) return std::unexpected(answer.error());
  if (answer->rcode == Rcode::kNxDomain) return Fail(ErrorCode::kNotFound, name + ": NXDOMAIN");
  if (answer->addresses.empty()) return Fail(ErrorCode::kNotFound, name + " has no address");
  return answer->addresses;
}

Result<std::vector<boost::asio::ip::address>> AddressCache::Resolve(const std::string& name) {
  std::unique_lock lock(mu_);
  if (auto it = entries_.find(name); it != entries_.end()) {
    if (it->second.expires > Now()) {
      ++stats_.hits;
      return Addresses(name, Result<ResolveResult>(it->second.answer));
    }
    entries_.erase(it);
  }
  if (auto it = pending_.find(name); it != pending_.end()) {
    std::shared_ptr<Pending> pending = it->second;
    ++stats_.coalesced;
    cv_.wait(lock, [&] { return pending->done; });
    return Addresses(name, *pending->answer);
  }
  auto pending = std::make_shared<Pending>();
  pending_[name] = pending;
  ++stats_.lookups;
  lock.unlock();
  Result<ResolveResult> answer = lookup_(name);
  lock.lock();
  if (answer) StoreLocked(name, *answer);
  pending->answer = answer;
  pending->done = true;
  pending_.erase(name);
  cv_.notify_all();
  return Addresses(name, answer);
}

void AddressCache::StoreLocked(const std::string& name, const ResolveResult& answer) {
  if (options_.max_entries == 0) return;
  std::chrono::seconds ttl = options_.negative_ttl;
  if (answer.rcode == Rcode::kNoError && !answer.addresses.empty()) {
    ttl = std::min<std::chrono::seconds>(std::chrono::seconds(answer.ttl), options_.max_ttl);
  }
  if (ttl.count() <= 0) return;
  const TimePoint now = Now();
  if (entries_.size() >= options_.max_entries && !entries_.contains(name)) {
    std::erase_if(entries_, [&](const auto& kv) { return kv.second.expires <= now; });
    if (entries_.size() >= options_.max_entries) {
      entries_.erase(std::min_element(
          entries_.begin(), entries_.end(),
          [](const auto& a, const auto& b) { return a.second.expires < b.second.expires; }));
    }
  }
  entries_.insert_or_assign(name, Entry{answer, now + ttl});
}

AddressCache::Stats AddressCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t AddressCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace airlock::net::dns
