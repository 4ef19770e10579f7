// airlockd's config file parser and its Prometheus rendering (no daemon, no sandbox).

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>

#include "daemon/server/config.h"
#include "daemon/server/metrics.h"

namespace {

using airlock::daemon::Config;
using airlock::daemon::Metrics;
using airlock::daemon::OnShutdown;
using airlock::daemon::PoolStats;
using airlock::daemon::RenderPoolMetrics;
using airlock::daemon::RenderProcessWatchMetrics;
using airlock::daemon::RenderSecretMetrics;
using airlock::daemon::RenderVerdictMetrics;

TEST(ConfigTest, DefaultsAreTheDocumentedOnes) {
  Config c;
  EXPECT_EQ(c.listen, "127.0.0.1:7878");
  EXPECT_EQ(c.state_dir, "/var/lib/airlock");
  EXPECT_FALSE(c.no_auth);
  EXPECT_EQ(c.on_shutdown, OnShutdown::kKeep);
  EXPECT_FALSE(c.engines.contains("jail")) << "the host's /usr/local is shown only when asked for";
  EXPECT_EQ(c.default_engine, "jail");
}

TEST(ConfigTest, FileSetsEveryKey) {
  Config c;
  ASSERT_TRUE(c.ApplyFile(R"(# comment

listen = "0.0.0.0:9000"   # trailing comment
state-dir = "/srv/airlock \"q\" \\ x"
no_auth = true
agent = "/opt/a"
launcher = "/opt/l"
log_level = "debug"
on_shutdown = "destroy"
workers = 12
base-usr-local = true
)"));
  EXPECT_EQ(c.listen, "0.0.0.0:9000");
  EXPECT_EQ(c.state_dir, "/srv/airlock \"q\" \\ x");
  EXPECT_TRUE(c.no_auth);
  EXPECT_EQ(c.agent, "/opt/a");
  EXPECT_EQ(c.engines["jail"]["launcher"], "/opt/l");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.on_shutdown, OnShutdown::kDestroy);
  EXPECT_EQ(c.workers, 12);
  EXPECT_EQ(c.engines["jail"]["base_usr_local"], "true");
}

TEST(ConfigTest, BadFilesNameTheLineAndChangeNothingAfterIt) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"bogus = 1\n", "line 1: unknown setting 'bogus'"},
      {"\nlisten\n", "line 2: expected key = value"},
      {"listen = \"a\"\nlisten = \"b\"\n", "line 2: listen is set twice"},
      {"listen = \"a\nx\"\n", "line 1: listen: unterminated string"},
      {"listen = 127.0.0.1 7878\n", "line 1: listen: strings must be double-quoted"},
      {"no_auth = yes\n", "line 1: no_auth must be true or false"},
      {"base_usr_local = 1\n", "line 1: base_usr_local must be true or false"},
      {"workers = 0\n", "line 1: workers must be a number from 1 to 1024"},
      {"workers = 12x\n", "line 1: workers must be a number"},
      {"on_shutdown = \"pause\"\n", "line 1: on_shutdown must be keep or destroy"},
      {"log_level = \"loud\"\n", "line 1: log_level must be"},
      {"[server]\n", "line 1: the only tables are [engine.<name>]"},
      {"[engine.Jail]\n", "line 1: the only tables are [engine.<name>]"},
      {"[engine.jail] x\n", "line 1: the only tables are [engine.<name>]"},
      {"[engine.jail]\nenabled = maybe\n", "line 2: engine.jail.enabled must be true or false"},
      {"[engine.jail]\nx = 1\n[engine.jail]\nx = 2\n", "line 4: engine.jail.x is set twice"},
      {"engine.jail = 1\n", "line 1: engine.jail: want engine.<name>.<option>"},
      {"default_engine = \"A B\"\n", "line 1: default_engine must be an engine's name"},
      {"state_dir = \"\"\n", "line 1: state_dir must not be empty"},
      {"listen = \"a\" junk\n", "line 1: listen: unexpected text after the value"},
      {"agent = \"a\\nb\"\n", "line 1: agent: only"},
  };
  for (const Case& c : cases) {
    Config config;
    auto st = config.ApplyFile(c.text);
    ASSERT_FALSE(st) << c.text;
    EXPECT_NE(st.error().message().find(c.error), std::string::npos)
        << c.text << " -> " << st.error().message();
  }
}

TEST(ConfigTest, EngineTablesGiveEachEngineItsOptions) {
  Config c;
  ASSERT_TRUE(c.ApplyFile(R"(listen = "127.0.0.1:1"
default_engine = "gvisor"

[engine.jail]
enabled = false
uid-first = 65536   # dashes or underscores, as everywhere

[engine.gvisor]
platform = "systrap"
)"));
  EXPECT_EQ(c.listen, "127.0.0.1:1") << "keys before the first table stay top-level";
  EXPECT_EQ(c.default_engine, "gvisor");
  EXPECT_EQ(c.engines["jail"]["enabled"], "false");
  EXPECT_EQ(c.engines["jail"]["uid_first"], "65536");
  EXPECT_EQ(c.engines["gvisor"]["platform"], "systrap");
  // The same as a dotted key, and as a flag.
  Config f;
  EXPECT_TRUE(f.Set("engine.jail.cgroup-root", "/sys/fs/cgroup"));
  EXPECT_EQ(f.engines["jail"]["cgroup_root"], "/sys/fs/cgroup");
  EXPECT_FALSE(f.Set("engine..x", "1"));
  EXPECT_FALSE(f.Set("engine.jail.", "1"));
}

TEST(ConfigTest, FlagsUseDashesAndTheSameRules) {
  Config c;
  EXPECT_TRUE(c.Set("on-shutdown", "destroy"));
  EXPECT_EQ(c.on_shutdown, OnShutdown::kDestroy);
  EXPECT_FALSE(c.Set("on-shutdown", "later"));
  EXPECT_FALSE(c.Set("nope", "1"));
}

TEST(ConfigTest, NetworkEventsKeepIsACountFromOne) {
  Config c;
  EXPECT_EQ(c.network_events_keep, 10000);
  EXPECT_TRUE(c.Set("network-events-keep", "250"));
  EXPECT_EQ(c.network_events_keep, 250);
  for (const char* bad : {"0", "-1", "1000001", "many"}) {
    auto st = c.Set("network_events_keep", bad);
    ASSERT_FALSE(st) << bad;
    EXPECT_NE(st.error().message().find("network_events_keep must be a number"), std::string::npos)
        << st.error().message();
  }
  EXPECT_EQ(c.network_events_keep, 250);
  EXPECT_TRUE(c.Set("network_events_flush_ms", "60000"));
  EXPECT_EQ(c.network_events_flush_ms, 60000);
  EXPECT_FALSE(c.Set("network_events_flush_ms", "5"));
}

TEST(ConfigTest, DestroyedKeepIsADurationWithAUnit) {
  Config c;
  EXPECT_EQ(c.destroyed_keep_seconds, 7 * 86400);
  const std::pair<const char*, int64_t> good[] = {{"0", 0},           {"90s", 90},
                                                  {"15m", 900},       {"12h", 43200},
                                                  {"30d", 2'592'000}, {"3650d", 315'360'000}};
  for (const auto& [text, seconds] : good) {
    auto st = c.Set("destroyed-keep", text);
    ASSERT_TRUE(st) << text << ": " << st.error().message();
    EXPECT_EQ(c.destroyed_keep_seconds, seconds) << text;
  }
  for (const char* bad : {"", "7", "d", "-1d", "1.5h", "7w", "3651d", "7 d", "99999999999999s"}) {
    auto st = c.Set("destroyed_keep", bad);
    ASSERT_FALSE(st) << bad;
    EXPECT_NE(st.error().message().find("destroyed_keep must be 0 or a number followed by"),
              std::string::npos)
        << st.error().message();
  }
  EXPECT_EQ(c.destroyed_keep_seconds, 315'360'000) << "a refused value changes nothing";
}

TEST(ConfigTest, PoolSizesAreDottedKeysPerTemplate) {
  Config c;
  EXPECT_TRUE(c.pools.empty());
  auto st = c.ApplyFile("pool.base = 4\npool.py-3.11 = 0  # off\n");
  ASSERT_TRUE(st) << st.error().message();
  // The dashes of a template's name are kept (only a key's own dashes become underscores).
  EXPECT_EQ(c.pools, (std::map<std::string, int>{{"base", 4}, {"py-3.11", 0}}));
  // A flag (--pool.base 2) uses the same rule and overrides the file.
  EXPECT_TRUE(c.Set("pool.base", "2"));
  EXPECT_EQ(c.pools.at("base"), 2);
  EXPECT_TRUE(c.Set("pool.base", "256"));

  const std::pair<const char*, const char*> bad[] = {
      {"pool.base", "-1"},   {"pool.base", "257"},   {"pool.base", "4x"},
      {"pool.base", "\"4\""}, {"pool.", "1"},       {"pool.Base", "1"},
      {"pool.a/b", "1"},     {"pool.base", ""},
  };
  for (const auto& [key, value] : bad) {
    Config fresh;
    EXPECT_FALSE(fresh.Set(key, value)) << key << " = " << value;
    EXPECT_TRUE(fresh.pools.empty()) << key << " = " << value;
  }
  Config twice;
  auto repeated = twice.ApplyFile("pool.base = 1\npool.base = 2\n");
  ASSERT_FALSE(repeated);
  EXPECT_NE(repeated.error().message().find("line 2: pool.base is set twice"), std::string::npos);
}

TEST(MetricsTest, PoolSeriesPerTemplate) {
  PoolStats p;
  p.template_name = "base";
  p.size = 4;
  p.ready = 3;
  p.hits = 7;
  p.misses = {{"empty", 2}, {"disk", 1}};
  const std::string text = "\n" + RenderPoolMetrics({p});
  EXPECT_NE(text.find("\nairlock_pool_size{template=\"base\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairlock_pool_ready{template=\"base\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("\nairlock_pool_claims_total{template=\"base\",result=\"hit\"} 7\n"),
            std::string::npos);
  EXPECT_NE(text.find("\nairlock_pool_claims_total{template=\"base\",result=\"miss\","
                      "reason=\"empty\"} 2\n"),
            std::string::npos);
  EXPECT_EQ(p.miss_total(), 3u);
}

// The value of the sample line that starts with `series` (-1 when absent).
double Sample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(MetricsTest, VerdictSeries) {
  const std::string t =
      "\n" + RenderVerdictMetrics({.allowed = 3, .denied = 2, .closed = 1, .dropped = 9});
  EXPECT_EQ(Sample(t, R"(airlock_network_verdicts_total{verdict="allowed"})"), 3);
  EXPECT_EQ(Sample(t, R"(airlock_network_verdicts_total{verdict="denied"})"), 2);
  EXPECT_EQ(Sample(t, R"(airlock_network_verdicts_total{verdict="closed"})"), 1);
  EXPECT_EQ(Sample(t, "airlock_network_verdicts_dropped_total"), 9);
}

TEST(MetricsTest, ProcessWatchCountsArePerEngineAndOutcome) {
  const std::string t = "\n" + RenderProcessWatchMetrics({{"gvisor", {.reported = 7, .dropped = 2}},
                                                          {"jail", {.reported = 5, .lost = 3}}});
  EXPECT_NE(t.find("# TYPE airlock_process_events_total counter\n"), std::string::npos) << t;
  EXPECT_EQ(Sample(t, R"(airlock_process_events_total{engine="gvisor",outcome="reported"})"), 7);
  EXPECT_EQ(Sample(t, R"(airlock_process_events_total{engine="gvisor",outcome="dropped"})"), 2);
  EXPECT_EQ(Sample(t, R"(airlock_process_events_total{engine="gvisor",outcome="lost"})"), 0);
  EXPECT_EQ(Sample(t, R"(airlock_process_events_total{engine="jail",outcome="reported"})"), 5);
  EXPECT_EQ(Sample(t, R"(airlock_process_events_total{engine="jail",outcome="lost"})"), 3);
  // No engine with a watch: the family alone.
  EXPECT_EQ(RenderProcessWatchMetrics({}).find("airlock_process_events_total{"), std::string::npos);
}

TEST(MetricsTest, SecretsAreOneGauge) {
  const std::string t = "\n" + RenderSecretMetrics(7);
  EXPECT_NE(t.find("# TYPE airlock_secrets gauge\n"), std::string::npos) << t;
  EXPECT_EQ(Sample(t, "airlock_secrets"), 7);
}

TEST(MetricsTest, CountsAndCumulativeBuckets) {
  Metrics m;
  using std::chrono::milliseconds;
  m.Observe(Metrics::Op::kCreate, true, milliseconds(3));    // le 0.005
  m.Observe(Metrics::Op::kCreate, true, milliseconds(40));   // le 0.05
  m.Observe(Metrics::Op::kCreate, true, milliseconds(120000));  // only +Inf
  m.Observe(Metrics::Op::kExec, false, milliseconds(1));
  m.CountReply(201, "");
  m.CountReply(404, "not_found");
  m.CountReply(404, "not_found");
  m.SetRecovery(2, 1, 0, 3);
  const std::string t = m.Render({{"running", 4}, {"paused", 1}}, 7, 5);

  EXPECT_EQ(Sample(t, R"(airlock_sandboxes{state="running"})"), 4);
  EXPECT_EQ(Sample(t, R"(airlock_sandboxes{state="paused"})"), 1);
  EXPECT_EQ(Sample(t, R"(airlock_operations_total{op="create",result="ok"})"), 3);
  EXPECT_EQ(Sample(t, R"(airlock_operations_total{op="exec",result="error"})"), 1);
  const std::string b = R"(airlock_operation_seconds_bucket{op="create",result="ok",le=")";
  EXPECT_EQ(Sample(t, b + "0.001\"}"), 0);
  EXPECT_EQ(Sample(t, b + "0.005\"}"), 1);
  EXPECT_EQ(Sample(t, b + "0.05\"}"), 2);
  EXPECT_EQ(Sample(t, b + "60\"}"), 2);
  EXPECT_EQ(Sample(t, b + "+Inf\"}"), 3);
  EXPECT_EQ(Sample(t, R"(airlock_operation_seconds_count{op="create",result="ok"})"), 3);
  EXPECT_NEAR(Sample(t, R"(airlock_operation_seconds_sum{op="create",result="ok"})"), 120.043,
              1e-6);
  EXPECT_EQ(Sample(t, R"(airlock_http_responses_total{status="404"})"), 2);
  EXPECT_EQ(Sample(t, R"(airlock_api_errors_total{code="not_found"})"), 2);
  EXPECT_EQ(Sample(t, "airlock_ttl_expired_total"), 7);
  EXPECT_EQ(Sample(t, "airlock_records_purged_total"), 5);
  EXPECT_EQ(Sample(t, R"(airlock_recovery_sandboxes{outcome="orphan_removed"})"), 3);
  // Each metric family is declared once, before its samples.
  EXPECT_EQ(t.find("# TYPE airlock_operation_seconds histogram"),
            t.rfind("# TYPE airlock_operation_seconds histogram"));
}

}  // namespace
