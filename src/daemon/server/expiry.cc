#include "daemon/server/expiry.h"

#include <algorithm>
#include <optional>

#include "common/clock.h"
#include "common/log.h"

namespace airlock::daemon {

void Expiry::Start(std::chrono::milliseconds period) {
  thread_ = std::thread([this, period] {
    std::optional<std::chrono::steady_clock::time_point> purged;
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      // A pass that destroyed some took time (many expiring at once, as after a restart):
      // others may have expired meanwhile, so the next pass comes at once.
      while (ReapExpired() > 0 && !Stopping()) {
      }
      if (sweep_ && !Stopping()) sweep_();
      const auto now = std::chrono::steady_clock::now();
      const auto purge_every = std::min<std::chrono::steady_clock::duration>(
          destroyed_keep(), std::chrono::minutes(1));
      if (destroyed_keep().count() > 0 && (!purged || now - *purged >= purge_every)) {
        PurgeDestroyed();
        purged = now;
      }
      lock.lock();
      cv_.wait_for(lock, period, [this] { return stop_; });
    }
  });
}

bool Expiry::Stopping() {
  std::lock_guard lock(mu_);
  return stop_;
}

void Expiry::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int Expiry::ReapExpired() {
  auto ids = store_.Expired(UnixNowMs());
  if (!ids) {
    spdlog::error("ttl: {}", ids.error().message());
    return 0;
  }
  int destroyed = 0;
  for (const std::string& id : *ids) {
    auto record = store_.Get(id);
    // A create in progress is left to finish; its deadline is checked again on the next pass.
    if (!record || record->state == store::SandboxState::kCreating) continue;
    if (auto st = destroy_(id); !st) {
      // A delete that won the race is not an error.
      if (st.error().code() != ErrorCode::kNotFound &&
          st.error().code() != ErrorCode::kFailedPrecondition) {
        spdlog::error("ttl: {}", st.error().message());
      }
      continue;
    }
    spdlog::info("ttl: {} expired and was destroyed", id);
    ++destroyed;
    ++expired_total_;
  }
  return destroyed;
}

int64_t Expiry::PurgeDestroyed() {
  const std::chrono::seconds keep = destroyed_keep();
  if (keep.count() <= 0) return 0;
  auto purged = store_.PurgeDestroyed(
      UnixNowMs() - std::chrono::duration_cast<std::chrono::milliseconds>(keep).count());
  if (!purged) {
    spdlog::error("purging destroyed records: {}", purged.error().message());
    return 0;
  }
  if (*purged > 0) {
    spdlog::info("purged {} destroyed sandbox record(s) older than {} s", *purged,
                 keep.count());
    purged_total_ += static_cast<uint64_t>(*purged);
  }
  return *purged;
}

}  // namespace airlock::daemon
