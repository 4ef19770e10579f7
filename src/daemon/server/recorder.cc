#include "daemon/server/recorder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "common/clock.h"
#include "daemon/api/render.h"
#include "daemon/server/actor.h"

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

thread_local std::optional<Actor> current_actor;

}  // namespace

nlohmann::json VerdictJson(const store::NetworkEventRecord& r) {
  nlohmann::json data = {{"name", r.name}, {"port", r.port}, {"verdict", r.verdict},
                         {"rule", r.rule}, {"reason", r.reason}};
  if (!r.sni.empty()) data["sni"] = r.sni;
  if (!r.host.empty()) data["host"] = r.host;
  if (!r.dest.empty()) data["dest"] = r.dest;
  if (r.verdict == "closed") {
    data["bytes_up"] = r.bytes_up;
    data["bytes_down"] = r.bytes_down;
  }
  return data;
}

const std::optional<Actor>& CurrentActor() { return current_actor; }

ScopedActor::ScopedActor(Actor actor) : previous_(std::move(current_actor)) {
  current_actor = std::move(actor);
}

ScopedActor::~ScopedActor() { current_actor = std::move(previous_); }

Recorder::Recorder(store::Store& store, RecorderOptions options)
    : store_(store), options_(options) {
  AIRLOCK_CHECK(options_.keep >= 1 && options_.verdicts_keep >= 1 && options_.batch >= 1);
  writer_ = std::thread([this] { Run(); });
}

Recorder::~Recorder() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (auto st = Flush(); !st) {
    spdlog::error("events not stored at shutdown: {}", st.error().message());
  }
}

bool Recorder::Admit(const std::string& sandbox, bool essential, bool verdict) {
  size_t& mine = queued_[sandbox];
  bool admitted = essential;
  if (!admitted && queue_.size() < options_.max_queued &&
      mine < options_.max_queued_per_sandbox) {
    const int64_t now = SteadyNowMs();
    auto [it, fresh] = buckets_.try_emplace(sandbox, Bucket{options_.burst, now});
    Bucket& b = it->second;
    b.tokens = std::min(options_.burst,
                        b.tokens + static_cast<double>(now - b.at_ms) * options_.rate / 1000.0);
    b.at_ms = now;
    if (b.tokens >= 1) {
      b.tokens -= 1;
      admitted = true;
    }
  }
  if (admitted) {
    ++mine;
    ++counts_.recorded;
    return true;
  }
  if (mine == 0) queued_.erase(sandbox);
  ++dropped_[sandbox];
  ++counts_.dropped;
  if (verdict) {
    ++verdicts_dropped_[sandbox];
    ++verdicts_.dropped;
  }
  return false;
}

void Recorder::Push(Queued queued) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    const bool essential = queued.event.type.starts_with("sandbox.");
    if (!Admit(queued.sandbox, essential, queued.verdict.has_value())) return;
    if (queued.verdict) {
      const std::string& v = queued.verdict->verdict;
      ++(v == "closed" ? verdicts_.closed : v == "allowed" ? verdicts_.allowed : verdicts_.denied);
    }
    queue_.push_back(std::move(queued));
    wake = queue_.size() == options_.batch;
  }
  if (wake) cv_.notify_all();
}

void Recorder::Record(const std::string& sandbox, std::string type, nlohmann::json data) {
  if (!options_.enabled) return;
  if (const std::optional<Actor>& actor = CurrentActor(); actor && type.starts_with("sandbox.")) {
    data["by"] = {{"key_id", actor->key_id}, {"key", actor->key}};
  }
  Push({sandbox, {.at_ms = UnixNowMs(), .type = std::move(type), .data = api::DumpJson(data)}, {}});
}

void Recorder::Verdict(const std::string& sandbox, const net::NetworkEvent& event) {
  store::NetworkEventRecord r = ToRecord(event);
  Queued q{sandbox, {.at_ms = r.at_ms, .type = "net." + r.kind, .data = api::DumpJson(VerdictJson(r))},
           std::move(r)};
  Push(std::move(q));
}

Status Recorder::Flush() {
  std::lock_guard write(write_mu_);
  std::deque<Queued> queue;
  std::map<std::string, int64_t> dropped, verdicts_dropped;
  {
    std::lock_guard lock(mu_);
    queue.swap(queue_);
    queued_.clear();
    dropped.swap(dropped_);
    verdicts_dropped.swap(verdicts_dropped_);
    // A bucket that has filled up again is as good as none: forgetting it bounds the map.
    const int64_t now = SteadyNowMs();
    std::erase_if(buckets_, [&](const auto& entry) {
      const Bucket& b = entry.second;
      return b.tokens + static_cast<double>(now - b.at_ms) * options_.rate / 1000.0 >=
             options_.burst;
    });
  }
  if (queue.empty() && dropped.empty()) return {};
  // One batch per sandbox, its events in the order they came.
  std::map<std::string, store::EventBatch> by_sandbox;
  for (Queued& q : queue) {
    store::EventBatch& batch = by_sandbox[q.sandbox];
    batch.sandbox = q.sandbox;
    batch.events.push_back(std::move(q.event));
    if (q.verdict) batch.verdicts.push_back(std::move(*q.verdict));
  }
  for (const auto& [sandbox, count] : dropped) {
    by_sandbox[sandbox].sandbox = sandbox;
    by_sandbox[sandbox].dropped = count;
  }
  for (const auto& [sandbox, count] : verdicts_dropped) {
    by_sandbox[sandbox].verdicts_dropped = count;
  }
  std::vector<store::EventBatch> batches;
  batches.reserve(by_sandbox.size());
  for (auto& [sandbox, batch] : by_sandbox) batches.push_back(std::move(batch));
  auto written = store_.AppendEvents(batches, options_.keep, options_.verdicts_keep);
  std::lock_guard lock(mu_);
  if (!written) {
    // Lost, but not silently: they count as dropped, stored with a later write.
    for (const store::EventBatch& b : batches) {
      dropped_[b.sandbox] += b.dropped + static_cast<int64_t>(b.events.size());
      verdicts_dropped_[b.sandbox] += b.verdicts_dropped + static_cast<int64_t>(b.verdicts.size());
      counts_.dropped += b.events.size();
      verdicts_.dropped += b.verdicts.size();
    }
    return written;
  }
  ++writes_;
  written_.notify_all();
  return written;
}

VerdictCounts Recorder::verdicts() const {
  std::lock_guard lock(mu_);
  return verdicts_;
}

RecorderCounts Recorder::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

uint64_t Recorder::writes() const {
  std::lock_guard lock(mu_);
  return writes_;
}

uint64_t Recorder::WaitForWrite(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  written_.wait_for(lock, timeout, [&] { return writes_ > seen || stopping_; });
  return writes_;
}

void Recorder::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.interval,
                 [this] { return stopping_ || queue_.size() >= options_.batch; });
    if (stopping_) break;
    if (queue_.empty() && dropped_.empty()) continue;
    lock.unlock();
    if (auto st = Flush(); !st) spdlog::error("storing events: {}", st.error().message());
    lock.lock();
  }
}

void RecordProcess(Recorder& recorder, const std::string& sandbox,
                   const runtime::ProcessEvent& event) {
  // What the engine could not tell (a process gone before it was looked at) is left out.
  nlohmann::json data = nlohmann::json::object();
  if (event.pid > 0) data["pid"] = event.pid;
  if (event.kind == runtime::ProcessEvent::Kind::kExit) {
    if (event.signal != 0) {
      data["signal"] = event.signal;
    } else {
      data["exit_code"] = event.exit_code;
    }
    recorder.Record(sandbox, "proc.exit", std::move(data));
    return;
  }
  data["ppid"] = event.ppid;
  if (event.uid >= 0) data["uid"] = event.uid;
  data["argv"] = event.argv;
  if (event.argv_truncated) data["argv_truncated"] = true;
  if (event.argv_lost) data["argv_lost"] = true;
  recorder.Record(sandbox, "proc.exec", std::move(data));
}

}  // namespace airlock::daemon
