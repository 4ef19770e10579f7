#include "daemon/server/metrics.h"

#include <cstdio>

namespace airlock::daemon {
namespace {

constexpr std::string_view kOpNames[] = {"create", "exec", "destroy", "files"};

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string Labels(std::string_view base, std::string_view extra) {
  if (base.empty()) return "{" + std::string(extra) + "}";
  if (extra.empty()) return "{" + std::string(base) + "}";
  return "{" + std::string(base) + "," + std::string(extra) + "}";
}

}  // namespace

std::string RenderPoolMetrics(const std::vector<PoolStats>& pools) {
  std::string out;
  out += "# HELP airlock_pool_size Warm pool target size per template.\n";
  out += "# TYPE airlock_pool_size gauge\n";
  for (const PoolStats& p : pools) {
    out += "airlock_pool_size{template=\"" + p.template_name + "\"} " + std::to_string(p.size) +
           "\n";
  }
  out += "# HELP airlock_pool_ready Pooled sandboxes ready to be claimed, per template.\n";
  out += "# TYPE airlock_pool_ready gauge\n";
  for (const PoolStats& p : pools) {
    out += "airlock_pool_ready{template=\"" + p.template_name + "\"} " +
           std::to_string(p.ready) + "\n";
  }
  out += "# HELP airlock_pool_claims_total Creates for a pooled template: served from the pool "
         "(hit) or not (miss, with the reason).\n";
  out += "# TYPE airlock_pool_claims_total counter\n";
  for (const PoolStats& p : pools) {
    const std::string t = "template=\"" + p.template_name + "\"";
    out += "airlock_pool_claims_total{" + t + ",result=\"hit\"} " + std::to_string(p.hits) +
           "\n";
    for (const auto& [reason, n] : p.misses) {
      out += "airlock_pool_claims_total{" + t + ",result=\"miss\",reason=\"" + reason + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  return out;
}

std::string RenderVerdictMetrics(const VerdictCounts& counts) {
  std::string out;
  out += "# HELP airlock_network_verdicts_total Network verdicts of the egress proxy and the DNS "
         "stubs (closed: a connection ended), by verdict.\n";
  out += "# TYPE airlock_network_verdicts_total counter\n";
  const std::pair<const char*, uint64_t> by_verdict[] = {
      {"allowed", counts.allowed}, {"denied", counts.denied}, {"closed", counts.closed}};
  for (const auto& [verdict, n] : by_verdict) {
    out += "airlock_network_verdicts_total{verdict=\"" + std::string(verdict) + "\"} " +
           std::to_string(n) + "\n";
  }
  out += "# HELP airlock_network_verdicts_dropped_total Network verdicts that never reached the "
         "store (too many at once, or a failed write); each sandbox's count is in its events.\n";
  out += "# TYPE airlock_network_verdicts_dropped_total counter\n";
  out += "airlock_network_verdicts_dropped_total " + std::to_string(counts.dropped) + "\n";
  return out;
}

std::string RenderRecorderMetrics(uint64_t recorded, uint64_t dropped) {
  return "# HELP airlock_events_recorded_total Flight recorder events queued for the store.\n"
         "# TYPE airlock_events_recorded_total counter\n"
         "airlock_events_recorded_total " + std::to_string(recorded) + "\n" +
         "# HELP airlock_events_dropped_total Flight recorder events that never reached the "
         "store (over a sandbox's rate, a full queue, a failed write).\n"
         "# TYPE airlock_events_dropped_total counter\n"
         "airlock_events_dropped_total " + std::to_string(dropped) + "\n";
}

std::string RenderProcessWatchMetrics(
    const std::map<std::string, ProcessWatchCounts>& by_engine) {
  std::string out =
      "# HELP airlock_process_events_total Events of processes started inside sandboxes, per "
      "engine: given to the flight recorder (reported), seen but let go at a bound (dropped), or "
      "lost before the engine saw them (lost).\n"
      "# TYPE airlock_process_events_total counter\n";
  for (const auto& [engine, c] : by_engine) {
    const std::pair<const char*, uint64_t> by_outcome[] = {
        {"reported", c.reported}, {"dropped", c.dropped}, {"lost", c.lost}};
    for (const auto& [outcome, n] : by_outcome) {
      out += "airlock_process_events_total{engine=\"" + engine + "\",outcome=\"" + outcome +
             "\"} " + std::to_string(n) + "\n";
    }
  }
  return out;
}

std::string RenderSecretMetrics(int64_t stored) {
  return "# HELP airlock_secrets Secrets stored, every tenant's.\n"
         "# TYPE airlock_secrets gauge\n"
         "airlock_secrets " +
         std::to_string(stored) + "\n";
}

std::string RenderUsageMetrics(const UsageTotals& totals) {
  std::string out;
  const std::pair<const char*, const std::map<std::string, UsageGroup>*> groups[] = {
      {"engine", &totals.by_engine}, {"tenant", &totals.by_tenant}};
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out += std::string("# HELP ") + name + " " + help + "\n";
    out += std::string("# TYPE ") + name + " " + type + "\n";
    for (const auto& [label, by] : groups) {
      for (const auto& [key, g] : *by) value(std::string(label) + "=\"" + key + "\"", g);
    }
  };
  auto line = [&](const char* name, const std::string& labels, const std::string& v) {
    out += std::string(name) + "{" + labels + "} " + v + "\n";
  };
  family("airlock_usage_sandboxes", "gauge",
         "Live sandboxes by state at the last sampling pass, per engine and per tenant.",
         [&](const std::string& l, const UsageGroup& g) {
           for (const auto& [state, n] : g.sandboxes) {
             line("airlock_usage_sandboxes", l + ",state=\"" + state + "\"", std::to_string(n));
           }
         });
  family("airlock_usage_cpu_seconds_total", "counter",
         "CPU time sandboxes used while sampled since the daemon started.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_cpu_seconds_total", l, Number(g.cpu_seconds_total));
         });
  family("airlock_usage_cpu_cores", "gauge", "Cores sandboxes used at the last sampling pass.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_cpu_cores", l, Number(g.cpu_cores));
         });
  family("airlock_usage_memory_bytes", "gauge", "Memory charged to live sandboxes.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_memory_bytes", l, std::to_string(g.memory_bytes));
         });
  family("airlock_usage_pids", "gauge", "Processes and threads in live sandboxes.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_pids", l, std::to_string(g.pids));
         });
  family("airlock_usage_disk_bytes", "gauge", "Bytes used in live sandboxes' writable layers.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_disk_bytes", l, std::to_string(g.disk_bytes));
         });
  family("airlock_usage_network_bytes_total", "counter",
         "Bytes sandboxes received (rx) and sent (tx) through their networks while sampled.",
         [&](const std::string& l, const UsageGroup& g) {
           line("airlock_usage_network_bytes_total", l + ",direction=\"rx\"",
                std::to_string(g.net_rx_bytes_total));
           line("airlock_usage_network_bytes_total", l + ",direction=\"tx\"",
                std::to_string(g.net_tx_bytes_total));
         });
  out += "# HELP airlock_metrics_sampling_passes_total Sampling passes over the live sandboxes.\n";
  out += "# TYPE airlock_metrics_sampling_passes_total counter\n";
  out += "airlock_metrics_sampling_passes_total " + std::to_string(totals.passes) + "\n";
  out += "# HELP airlock_metrics_sampling_seconds_total Time spent in sampling passes.\n";
  out += "# TYPE airlock_metrics_sampling_seconds_total counter\n";
  out += "airlock_metrics_sampling_seconds_total " + Number(totals.pass_seconds_total) + "\n";
  out += "# HELP airlock_metrics_samples_total Samples written to the store.\n";
  out += "# TYPE airlock_metrics_samples_total counter\n";
  out += "airlock_metrics_samples_total " + std::to_string(totals.samples_total) + "\n";
  return out;
}

void Histogram::Observe(std::chrono::nanoseconds elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, elapsed.count())),
                    std::memory_order_relaxed);
}

void Histogram::Render(std::string& out, std::string_view name, std::string_view labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < kBounds.size() ? Number(kBounds[i]) : "+Inf";
    out += std::string(name) + "_bucket" + Labels(labels, "le=\"" + le + "\"") + " " +
           std::to_string(cumulative) + "\n";
  }
  const std::string l = labels.empty() ? "" : Labels(labels, "");
  out += std::string(name) + "_sum" + l + " " +
         Number(static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9) + "\n";
  out += std::string(name) + "_count" + l + " " +
         std::to_string(count_.load(std::memory_order_relaxed)) + "\n";
}

void Metrics::Observe(Op op, bool ok, std::chrono::nanoseconds elapsed) {
  OpStats& s = Stats(op);
  (ok ? s.ok : s.errors).fetch_add(1, std::memory_order_relaxed);
  (ok ? s.ok_latency : s.error_latency).Observe(elapsed);
}

void Metrics::CountReply(unsigned status, std::string_view error_code) {
  std::lock_guard lock(mu_);
  ++replies_by_status_[status];
  if (!error_code.empty()) ++errors_by_code_[std::string(error_code)];
}

void Metrics::SetRecovery(int adopted, int failed, int finished, int orphans) {
  recovery_[0] = adopted;
  recovery_[1] = failed;
  recovery_[2] = finished;
  recovery_[3] = orphans;
}

std::string Metrics::Render(const std::map<std::string, int64_t>& sandboxes_by_state,
                            uint64_t expired_total, uint64_t purged_total) const {
  std::string out;
  out += "# HELP airlock_sandboxes Sandboxes by state (destroyed ones are records only).\n";
  out += "# TYPE airlock_sandboxes gauge\n";
  for (const auto& [state, n] : sandboxes_by_state) {
    out += "airlock_sandboxes{state=\"" + state + "\"} " + std::to_string(n) + "\n";
  }

  out += "# HELP airlock_operations_total API operations by kind and result.\n";
  out += "# TYPE airlock_operations_total counter\n";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const std::string op = "op=\"" + std::string(kOpNames[i]) + "\"";
    out += "airlock_operations_total{" + op + ",result=\"ok\"} " + std::to_string(ops_[i].ok) + "\n";
    out += "airlock_operations_total{" + op + ",result=\"error\"} " +
           std::to_string(ops_[i].errors) + "\n";
  }
  out += "# HELP airlock_operation_seconds Latency of API operations, in seconds.\n";
  out += "# TYPE airlock_operation_seconds histogram\n";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const std::string op = "op=\"" + std::string(kOpNames[i]) + "\"";
    ops_[i].ok_latency.Render(out, "airlock_operation_seconds", op + ",result=\"ok\"");
    ops_[i].error_latency.Render(out, "airlock_operation_seconds", op + ",result=\"error\"");
  }

  {
    std::lock_guard lock(mu_);
    out += "# HELP airlock_http_responses_total HTTP responses by status code.\n";
    out += "# TYPE airlock_http_responses_total counter\n";
    for (const auto& [status, n] : replies_by_status_) {
      out += "airlock_http_responses_total{status=\"" + std::to_string(status) + "\"} " +
             std::to_string(n) + "\n";
    }
    out += "# HELP airlock_api_errors_total API errors by error code.\n";
    out += "# TYPE airlock_api_errors_total counter\n";
    for (const auto& [code, n] : errors_by_code_) {
      out += "airlock_api_errors_total{code=\"" + code + "\"} " + std::to_string(n) + "\n";
    }
  }

  out += "# HELP airlock_ttl_expired_total Sandboxes destroyed at the end of their TTL.\n";
  out += "# TYPE airlock_ttl_expired_total counter\n";
  out += "airlock_ttl_expired_total " + std::to_string(expired_total) + "\n";
  out += "# HELP airlock_records_purged_total Destroyed sandboxes' records removed after "
         "destroyed_keep.\n";
  out += "# TYPE airlock_records_purged_total counter\n";
  out += "airlock_records_purged_total " + std::to_string(purged_total) + "\n";
  out += "# HELP airlock_recovery_sandboxes What the last start found, by outcome.\n";
  out += "# TYPE airlock_recovery_sandboxes gauge\n";
  constexpr std::string_view kOutcomes[] = {"adopted", "failed", "finished", "orphan_removed"};
  for (size_t i = 0; i < 4; ++i) {
    out += "airlock_recovery_sandboxes{outcome=\"" + std::string(kOutcomes[i]) + "\"} " +
           std::to_string(recovery_[i].load()) + "\n";
  }
  return out;
}

}  // namespace airlock::daemon
