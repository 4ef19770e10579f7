#include "daemon/server/sampler.h"

#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

using store::SandboxState;

// A counter's growth since the previous reading; a reading below it means the counter started
// again (a sandbox woken from hibernation has new cgroups): all of it is new.
template <typename T>
T Growth(T now, T before) {
  return now >= before ? now - before : now;
}

}  // namespace

void Sampler::Start(std::chrono::milliseconds interval, int64_t keep) {
  interval_ = interval;
  keep_ = std::max<int64_t>(1, keep);
  if (interval.count() <= 0) return;
  thread_ = std::thread([this, interval] {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      Sample();
      lock.lock();
      cv_.wait_for(lock, interval, [this] { return stop_; });
    }
  });
}

void Sampler::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int Sampler::Sample() {
  std::lock_guard pass(pass_mu_);
  const auto began = std::chrono::steady_clock::now();
  store::ListFilter filter;
  filter.states = {SandboxState::kRunning, SandboxState::kPaused, SandboxState::kHibernated};
  filter.pooled = false;
  auto records = store_.List(filter);
  if (!records) {
    spdlog::error("metrics: {}", records.error().message());
    return 0;
  }
  std::map<std::string, UsageGroup> by_engine, by_tenant;
  std::vector<std::pair<std::string, store::MetricSample>> samples;
  std::map<std::string, Previous> seen;
  const int64_t at_ms = UnixNowMs();
  for (const store::SandboxRecord& r : *records) {
    UsageGroup* groups[] = {&by_engine[r.engine], &by_tenant[r.tenant]};
    for (UsageGroup* g : groups) ++g->sandboxes[std::string(store::SandboxStateName(r.state))];
    if (r.state == SandboxState::kHibernated) continue;  // nothing of it runs
    std::shared_ptr<HeldSandbox> held = table_.Find(r.id);
    if (!held) continue;  // its engine is unavailable, or another daemon's
    auto stats = held->engine->Stats(r.id);
    if (!stats) continue;  // destroyed or hibernated meanwhile
    const int64_t now = SteadyNowMs();
    store::MetricSample m;
    m.at_ms = at_ms;
    m.cpu_seconds = stats->cpu_seconds;
    m.memory_bytes = static_cast<int64_t>(stats->memory_bytes);
    m.memory_peak_bytes = static_cast<int64_t>(stats->memory_peak_bytes);
    m.pids = static_cast<int64_t>(stats->pids);
    m.disk_bytes = static_cast<int64_t>(stats->disk_bytes);
    NetBytes net;
    if (net_) {
      if (auto bytes = net_(r.id)) net = *bytes;
    }
    m.net_rx_bytes = static_cast<int64_t>(net.rx);
    m.net_tx_bytes = static_cast<int64_t>(net.tx);
    double cpu_growth = 0;
    NetBytes net_growth;
    if (auto before = previous_.find(r.id); before != previous_.end()) {
      cpu_growth = Growth(m.cpu_seconds, before->second.cpu_seconds);
      net_growth = {Growth(net.rx, before->second.net.rx), Growth(net.tx, before->second.net.tx)};
      const int64_t elapsed = now - before->second.steady_ms;
      if (elapsed > 0) m.cpu_cores = cpu_growth * 1000.0 / static_cast<double>(elapsed);
    }
    seen[r.id] = {m.cpu_seconds, now, net};
    for (UsageGroup* g : groups) {
      g->cpu_seconds_total += cpu_growth;
      g->cpu_cores += m.cpu_cores;
      g->memory_bytes += m.memory_bytes;
      g->pids += m.pids;
      g->disk_bytes += m.disk_bytes;
      g->net_rx_bytes_total += net_growth.rx;
      g->net_tx_bytes_total += net_growth.tx;
    }
    samples.emplace_back(r.id, m);
  }
  previous_ = std::move(seen);  // sandboxes gone since are forgotten
  if (!samples.empty()) {
    if (auto st = store_.AppendMetrics(samples, keep_); !st) {
      spdlog::error("metrics: {}", st.error().message());
      samples.clear();
    }
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::lock_guard lock(totals_mu_);
  // Counters carry on across passes (a group with no sandbox now keeps its total); gauges are
  // this pass's.
  auto merge = [](std::map<std::string, UsageGroup>& total, std::map<std::string, UsageGroup>& now) {
    for (auto& [name, g] : total) {
      g.sandboxes.clear();
      g.cpu_cores = 0;
      g.memory_bytes = g.pids = g.disk_bytes = 0;
    }
    for (auto& [name, g] : now) {
      UsageGroup& t = total[name];
      const double cpu = t.cpu_seconds_total + g.cpu_seconds_total;
      const uint64_t rx = t.net_rx_bytes_total + g.net_rx_bytes_total;
      const uint64_t tx = t.net_tx_bytes_total + g.net_tx_bytes_total;
      t = std::move(g);
      t.cpu_seconds_total = cpu;
      t.net_rx_bytes_total = rx;
      t.net_tx_bytes_total = tx;
    }
  };
  merge(totals_.by_engine, by_engine);
  merge(totals_.by_tenant, by_tenant);
  ++totals_.passes;
  totals_.pass_seconds_total += took;
  totals_.samples_total += samples.size();
  return static_cast<int>(samples.size());
}

UsageTotals Sampler::Totals() const {
  std::lock_guard lock(totals_mu_);
  return totals_;
}

}  // namespace airlock::daemon
