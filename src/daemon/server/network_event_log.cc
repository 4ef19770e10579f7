#include "daemon/server/network_event_log.h"

#include <spdlog/spdlog.h>

#include <vector>

namespace airlock::daemon {
namespace {

store::NetworkEventRecord ToRecord(const net::NetworkEvent& e) {
  store::NetworkEventRecord r;
  r.at_ms = e.at_ms;
  r.kind = e.kind;
  r.name = e.name;
  r.sni = e.sni;
  r.host = e.host;
  r.dest = e.dest;
  r.port = e.port;
  r.verdict = e.closed ? "closed" : e.allowed ? "allowed" : "denied";
  r.rule = e.rule;
  r.reason = e.reason;
  if (e.closed) {
    r.bytes_up = static_cast<int64_t>(e.bytes_up);
    r.bytes_down = static_cast<int64_t>(e.bytes_down);
  }
  return r;
}

}  // namespace

NetworkEventLog::NetworkEventLog(store::Store& store, NetworkEventLogOptions options)
    : store_(store), options_(options) {
  AIRLOCK_CHECK(options_.keep >= 1 && options_.batch >= 1);
  writer_ = std::thread([this] { Run(); });
}

NetworkEventLog::~NetworkEventLog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (auto st = Flush(); !st) {
    spdlog::error("network verdicts not stored at shutdown: {}", st.error().message());
  }
}

void NetworkEventLog::Add(const std::string& sandbox, const net::NetworkEvent& event) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    size_t& mine = queued_[sandbox];
    if (queue_.size() >= options_.max_queued || mine >= options_.max_queued_per_sandbox) {
      ++dropped_[sandbox];
      ++counts_.dropped;
      if (mine == 0) queued_.erase(sandbox);
      return;
    }
    ++mine;
    queue_.emplace_back(sandbox, ToRecord(event));
    ++(event.closed ? counts_.closed : event.allowed ? counts_.allowed : counts_.denied);
    wake = queue_.size() == options_.batch;
  }
  if (wake) cv_.notify_all();
}

Status NetworkEventLog::Flush() {
  std::lock_guard write(write_mu_);
  std::deque<std::pair<std::string, store::NetworkEventRecord>> queue;
  std::map<std::string, int64_t> dropped;
  {
    std::lock_guard lock(mu_);
    queue.swap(queue_);
    queued_.clear();
    dropped.swap(dropped_);
  }
  if (queue.empty() && dropped.empty()) return {};
  // One batch per sandbox, its verdicts in the order they came.
  std::map<std::string, store::NetworkEventBatch> by_sandbox;
  for (auto& [sandbox, event] : queue) {
    store::NetworkEventBatch& batch = by_sandbox[sandbox];
    batch.sandbox = sandbox;
    batch.events.push_back(std::move(event));
  }
  for (const auto& [sandbox, count] : dropped) {
    by_sandbox[sandbox].sandbox = sandbox;
    by_sandbox[sandbox].dropped = count;
  }
  std::vector<store::NetworkEventBatch> batches;
  batches.reserve(by_sandbox.size());
  for (auto& [sandbox, batch] : by_sandbox) batches.push_back(std::move(batch));
  auto written = store_.AppendNetworkEvents(batches, options_.keep);
  if (!written) {
    // Lost, but not silently: they count as dropped, stored with a later write.
    std::lock_guard lock(mu_);
    for (const auto& b : batches) {
      dropped_[b.sandbox] += b.dropped + static_cast<int64_t>(b.events.size());
      counts_.dropped += b.events.size();
    }
  }
  return written;
}

VerdictCounts NetworkEventLog::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

void NetworkEventLog::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.interval,
                 [this] { return stopping_ || queue_.size() >= options_.batch; });
    if (stopping_) break;
    if (queue_.empty() && dropped_.empty()) continue;
    lock.unlock();
    if (auto st = Flush(); !st) {
      spdlog::error("storing network verdicts: {}", st.error().message());
    }
    lock.lock();
  }
}

}  // namespace airlock::daemon
