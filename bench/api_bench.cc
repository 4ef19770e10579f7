// The whole sandbox lifecycle (create, exec `true`, delete) through a real airlockd's REST API at
// several concurrencies, beside the same lifecycle driven directly on the jail engine in the same
// run, so the ratio shows what the daemon (HTTP, SQLite, the controller) adds on top of the
// engine. The two phases run one after the other, never at the same time. Between them, a warm
// phase runs the same lifecycle through the API with a warm pool of base sandboxes (the create is
// then a claim), and reports its create latency against the cold create's. Needs root.
//
//   airlock-bench-api [--iterations N] [--warmup N] [--concurrency 1,8,32]
//                     [--engine-concurrency 1,8] [--pool N] [--warm-concurrency 1]
//                     [--json FILE]
//
// --pool 0 skips the warm phase.
//
// --iterations is the number of lifecycles per concurrency level (shared by its threads). Every
// failed call is counted and printed; the exit status is 1 if there was any, 130 on SIGINT.
// airlockd, every sandbox and the temporary directory are cleaned up on every path.

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/http_client.h"
#include "common/error.h"
#include "common/ids.h"
#include "api_lifecycle.h"
#include "daemon_process.h"
#include "protocol/client.h"
#include "runtime/jail/jail_engine.h"
#include "stats.h"

namespace {

using airlock::bench::BasePool;
using airlock::bench::Failure;
using airlock::bench::FillPool;
using airlock::bench::g_interrupted;
using airlock::bench::InstallSignalHandlers;
using airlock::bench::LevelResult;
using airlock::bench::Lifecycle;
using airlock::bench::LifecycleFn;
using airlock::bench::PrintFailures;
using airlock::bench::RunLevel;
using airlock::bench::Us;
using airlock::bench::WorkerFactory;
using airlock::bench::WriteResults;

constexpr char kTag[] = "airlock-bench-api";

namespace fs = std::filesystem;
using airlock::Error;
using airlock::ErrorCode;
using airlock::Result;
using airlock::Status;
using nlohmann::json;
using airlock::bench::Clock;

struct Flags {
  int iterations = 100;
  int warmup = 5;
  std::vector<int> concurrency = {1, 8, 32};
  std::vector<int> engine_concurrency = {1, 8};
  // The warm phase: creates claim from a pool of `pool` base sandboxes (0 skips it), at these
  // concurrencies; the pool is full again at the start of each level.
  int pool = 8;
  std::vector<int> warm_concurrency = {1};
  std::string json_path;
};

Result<std::vector<int>> ParseLevels(const std::string& text) {
  std::vector<int> levels;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    char* end = nullptr;
    long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 1 || n > 256) {
      return airlock::Fail(ErrorCode::kInvalidArgument,
                           "a concurrency list is 1-256 separated by commas, got '" + text + "'");
    }
    levels.push_back(static_cast<int>(n));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return levels;
}

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return airlock::Fail(ErrorCode::kInvalidArgument, arg + " needs a value");
    const std::string value = argv[++i];
    auto number = [&](int min) -> Result<int> {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < min || n > 1000000) {
        return airlock::Fail(ErrorCode::kInvalidArgument, arg + ": bad number '" + value + "'");
      }
      return static_cast<int>(n);
    };
    Result<int> n = 0;
    Result<std::vector<int>> levels = std::vector<int>{};
    if (arg == "--iterations") {
      n = number(1);
      if (n) flags.iterations = *n;
    } else if (arg == "--warmup") {
      n = number(0);
      if (n) flags.warmup = *n;
    } else if (arg == "--concurrency") {
      levels = ParseLevels(value);
      if (levels) flags.concurrency = *levels;
    } else if (arg == "--engine-concurrency") {
      levels = ParseLevels(value);
      if (levels) flags.engine_concurrency = *levels;
    } else if (arg == "--pool") {
      n = number(0);
      if (n && *n > 256) n = airlock::Fail(ErrorCode::kInvalidArgument, "--pool is at most 256");
      if (n) flags.pool = *n;
    } else if (arg == "--warm-concurrency") {
      levels = ParseLevels(value);
      if (levels) flags.warm_concurrency = *levels;
    } else if (arg == "--json") {
      flags.json_path = value;
    } else {
      return airlock::Fail(ErrorCode::kInvalidArgument, "unknown argument " + arg);
    }
    if (!n) return std::unexpected(n.error());
    if (!levels) return std::unexpected(levels.error());
  }
  return flags;
}

using airlock::bench::DaemonProcess;
using airlock::bench::ScratchDir;

// The only code that knows the engine's interface (adapt it here when the agent channel moves
// to Engine::ConnectAgent(id)). "create" includes the agent's hello, as the daemon's create
// does; exec runs `true` as the API's exec does (default user, 300 s timeout).
Lifecycle EngineLifecycle(airlock::runtime::Engine& runtime) {
  Lifecycle life;
  airlock::runtime::SandboxSpec spec;
  spec.id = airlock::NewSandboxId();
  const auto t0 = Clock::now();
  auto sandbox = runtime.Create(spec);
  if (!sandbox) {
    life.Fail("create", sandbox.error().message());
    return life;
  }
  life.id = spec.id;
  auto client = airlock::protocol::BlockingClient::Connect((*sandbox)->TakeAgentChannel(),
                                                           "airlock-bench-api");
  const auto t1 = Clock::now();
  if (!client) {
    life.Fail("create", "connecting to the agent: " + client.error().message());
  } else {
    life.create_us = Us(t0, t1);
    airlock::protocol::Exec exec;
    exec.argv = {"true"};
    exec.timeout_ms = 300000;
    const auto t2 = Clock::now();
    auto result = client->Exec(exec);
    const auto t3 = Clock::now();
    if (!result) {
      life.Fail("exec", result.error().message());
    } else if (result->exit.exit_code != 0 || result->exit.term_signal != 0) {
      life.Fail("exec", "true exited " + std::to_string(result->exit.exit_code) + ", signal " +
                            std::to_string(result->exit.term_signal));
    } else {
      life.exec_us = Us(t2, t3);
    }
  }
  const auto t4 = Clock::now();
  auto destroyed = runtime.Destroy(spec.id);
  const auto t5 = Clock::now();
  if (!destroyed) {
    life.Fail("delete", destroyed.error().message());
    life.undeleted = true;
  } else {
    life.delete_us = Us(t4, t5);
  }
  if (life.failures.empty()) life.total_us = Us(t0, t5);
  return life;
}

// Runs the warm-up (counted nowhere but in `warmup`'s failures) and then each level.
void RunPhase(const std::string& phase, const std::vector<int>& levels, const Flags& flags,
              const WorkerFactory& factory, std::vector<LevelResult>& results,
              LevelResult& warmup) {
  if (flags.warmup > 0) {
    warmup = RunLevel(phase + " warm-up", 1, flags.warmup, factory);
    PrintFailures(kTag, warmup);
  }
  for (int concurrency : levels) {
    if (g_interrupted.load()) return;
    std::fprintf(stderr, "airlock-bench-api: %s, concurrency %d, %d lifecycles...\n", phase.c_str(),
                 concurrency, flags.iterations);
    results.push_back(RunLevel(phase, concurrency, flags.iterations, factory));
    PrintFailures(kTag, results.back());
  }
}

// Cgroup directories whose name holds one of `ids`: what a sandbox would leave behind.
std::vector<std::string> LeftoverCgroups(const std::set<std::string>& ids) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           "/sys/fs/cgroup", fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    const std::string name = it->path().filename().string();
    for (const auto& id : ids) {
      if (name.find(id) != std::string::npos) {
        found.push_back(it->path().string());
        break;
      }
    }
  }
  return found;
}

namespace b = airlock::bench;

const LevelResult* Find(const std::vector<LevelResult>& results, const std::string& phase,
                        int concurrency) {
  for (const auto& r : results) {
    if (r.phase == phase && r.concurrency == concurrency) return &r;
  }
  return nullptr;
}

// API p50 lifecycle over engine p50 lifecycle at the same concurrency, when both were measured.
std::optional<double> Ratio(const std::vector<LevelResult>& results, int concurrency) {
  const LevelResult* api = Find(results, "api", concurrency);
  const LevelResult* engine = Find(results, "engine", concurrency);
  if (!api || !engine || api->total.empty() || engine->total.empty()) return std::nullopt;
  return b::Summarize("", api->total).p50 / b::Summarize("", engine->total).p50;
}

void PrintTable(const std::vector<LevelResult>& results) {
  std::printf("%-7s %5s %-10s %5s %5s %10s %10s %10s %13s %10s\n", "phase", "conc", "operation",
              "n", "fail", "p50 ms", "p90 ms", "p99 ms", "lifecycles/s", "api/engine");
  for (const auto& level : results) {
    std::map<std::string, int> fails;
    for (const auto& f : level.failures) ++fails[f.op];
    const std::pair<const char*, const std::vector<double>*> ops[] = {{"create", &level.create},
                                                                      {"exec", &level.exec},
                                                                      {"delete", &level.destroy},
                                                                      {"lifecycle", &level.total}};
    for (const auto& [op, samples] : ops) {
      const b::Summary s = b::Summarize(op, *samples);
      const bool whole = std::string(op) == "lifecycle";
      const int failed = whole ? static_cast<int>(level.attempted - level.succeeded()) : fails[op];
      std::string throughput, ratio;
      if (whole) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", level.throughput());
        throughput = buf;
        if (auto r = Ratio(results, level.concurrency); r && level.phase == "api") {
          std::snprintf(buf, sizeof buf, "%.2fx", *r);
          ratio = buf;
        }
      }
      std::printf("%-7s %5d %-10s %5zu %5d %10.2f %10.2f %10.2f %13s %10s\n", level.phase.c_str(),
                  level.concurrency, op, s.n, failed, s.p50 / 1000, s.p90 / 1000, s.p99 / 1000,
                  throughput.c_str(), ratio.c_str());
    }
  }
}

json LevelJson(const LevelResult& level) {
  json doc = {{"phase", level.phase},         {"concurrency", level.concurrency},
              {"attempted", level.attempted}, {"succeeded", level.succeeded()},
              {"wall_s", level.wall_s},       {"lifecycles_per_s", level.throughput()}};
  const std::string prefix = level.phase + " c" + std::to_string(level.concurrency) + " ";
  doc["create"] = json::parse(b::Json(b::Summarize(prefix + "create", level.create)));
  doc["exec"] = json::parse(b::Json(b::Summarize(prefix + "exec", level.exec)));
  doc["delete"] = json::parse(b::Json(b::Summarize(prefix + "delete", level.destroy)));
  doc["lifecycle"] = json::parse(b::Json(b::Summarize(prefix + "lifecycle", level.total)));
  json failures = json::array();
  for (const auto& f : level.failures) failures.push_back({{"op", f.op}, {"message", f.message}});
  doc["failures"] = std::move(failures);
  return doc;
}

// What the pool said of one warm level: claims served from it and not.
struct PoolCounts {
  int64_t hits = 0, misses = 0;
};

// The warm phase: before each level the pool is filled to `flags.pool`; the level's creates
// claim from it while the daemon refills it in the background, as in production.
void RunWarmPhase(const std::string& url, const Flags& flags, const WorkerFactory& factory,
                  std::vector<LevelResult>& results, std::map<int, PoolCounts>& counts,
                  std::vector<Failure>& failures) {
  auto http = airlock::client::HttpClient::Open(url);
  if (!http) {
    failures.push_back({"warm setup", http.error().message()});
    return;
  }
  http->set_timeout(std::chrono::minutes(2));
  for (int concurrency : flags.warm_concurrency) {
    if (g_interrupted.load()) break;
    if (auto st = FillPool(*http, flags.pool); !st) {
      failures.push_back({"warm setup", st.error().message()});
      break;
    }
    auto before = BasePool(*http);
    std::fprintf(stderr, "airlock-bench-api: warm (pool of %d), concurrency %d, %d lifecycles...\n",
                 flags.pool, concurrency, flags.iterations);
    results.push_back(RunLevel("warm", concurrency, flags.iterations, factory));
    PrintFailures(kTag, results.back());
    auto after = BasePool(*http);
    if (before && after && before->is_object() && after->is_object()) {
      counts[concurrency] = {after->value("hits", int64_t{0}) - before->value("hits", int64_t{0}),
                             after->value("misses", int64_t{0}) -
                                 before->value("misses", int64_t{0})};
    }
  }
  // Empty the pool, so that the daemon's stop has nothing of it to destroy.
  if (auto st = FillPool(*http, 0); !st) {
    failures.push_back({"warm teardown", st.error().message()});
  }
}

// Warm create p50 over cold (api) create p50 at the same concurrency.
std::optional<double> WarmRatio(const std::vector<LevelResult>& results, int concurrency) {
  const LevelResult* warm = Find(results, "warm", concurrency);
  const LevelResult* cold = Find(results, "api", concurrency);
  if (!warm || !cold || warm->create.empty() || cold->create.empty()) return std::nullopt;
  return b::Summarize("", warm->create).p50 / b::Summarize("", cold->create).p50;
}

int Run(const Flags& flags) {
  // Declared first: removed after the daemon and the engine are gone.
  ScratchDir scratch("airlock-bench-api");
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "airlock-bench-api: %s\n", st.error().message().c_str());
    return 1;
  }
  std::vector<LevelResult> results;
  LevelResult api_warmup, engine_warmup;
  std::vector<Failure> other_failures;  // stopping the daemon, leftovers
  std::map<int, PoolCounts> pool_counts;  // warm level's concurrency -> its claims

  // API phase: a real airlockd, one HttpClient per worker thread.
  {
    DaemonProcess daemon("airlock-bench-api", g_interrupted);
    if (auto st = daemon.Start(scratch.path() + "/daemon", scratch.path() + "/airlockd.log"); !st) {
      std::fprintf(stderr, "airlock-bench-api: starting airlockd: %s\n--- airlockd log ---\n%s",
                   st.error().message().c_str(), daemon.LogTail().c_str());
      return g_interrupted.load() ? 130 : 1;
    }
    const std::string url = daemon.url();
    const WorkerFactory api_worker = airlock::bench::ApiWorker(url);
    RunPhase("api", flags.concurrency, flags, api_worker, results, api_warmup);
    if (flags.pool > 0 && !g_interrupted.load()) {
      RunWarmPhase(url, flags, api_worker, results, pool_counts, other_failures);
    }
    const bool api_failed = !api_warmup.failures.empty() || !other_failures.empty() ||
                            std::any_of(results.begin(), results.end(),
                                        [](const LevelResult& r) { return !r.failures.empty(); });
    if (auto st = daemon.Stop(); !st)
      other_failures.push_back({"stop airlockd", st.error().message()});
    if (api_failed || !other_failures.empty()) {
      std::fprintf(stderr, "--- end of airlockd log ---\n%s---\n", daemon.LogTail().c_str());
    }
  }

  // Engine phase, after the daemon is gone: the same lifecycle on a JailEngine of our own,
  // with its own state dir and a uid range apart from the daemon's.
  if (!g_interrupted.load() && !flags.engine_concurrency.empty()) {
    airlock::runtime::LayerStore layers(scratch.path() + "/engine/layers",
                                        scratch.path() + "/engine/staging");
    if (auto st = layers.Prepare(); !st) other_failures.push_back({"layers", st.error().message()});
    airlock::jail::JailOptions options;
    options.layers = &layers;
    options.state_dir = scratch.path() + "/engine";
    options.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
    options.agent_path = AIRLOCK_AGENT_PATH;
    options.uid_first = (1u << 30) + (1u << 28);
    options.uid_slots = 1024;
    auto runtime = airlock::jail::JailEngine::Open(options);
    if (!runtime) {
      other_failures.push_back({"open engine", runtime.error().message()});
    } else {
      airlock::jail::JailEngine* rt = runtime->get();
      WorkerFactory engine_worker = [rt]() -> Result<LifecycleFn> {
        return LifecycleFn([rt] { return EngineLifecycle(*rt); });
      };
      RunPhase("engine", flags.engine_concurrency, flags, engine_worker, results, engine_warmup);
      // Destroy is idempotent: once more for a sandbox whose Destroy failed.
      std::vector<std::string> undeleted = engine_warmup.undeleted;
      for (const auto& level : results) {
        undeleted.insert(undeleted.end(), level.undeleted.begin(), level.undeleted.end());
      }
      for (const auto& id : undeleted) {
        if (auto st = (*runtime)->Destroy(id); !st) {
          other_failures.push_back({"destroy again", st.error().message()});
        }
      }
      runtime->reset();  // removes the engine's cgroup parents once empty
    }
  }

  std::set<std::string> ids;
  for (const LevelResult* level : {&api_warmup, &engine_warmup})
    ids.insert(level->ids.begin(), level->ids.end());
  for (const auto& level : results) ids.insert(level.ids.begin(), level.ids.end());
  for (const auto& path : LeftoverCgroups(ids)) other_failures.push_back({"left behind", path});
  for (const auto& f : other_failures) {
    std::fprintf(stderr, "airlock-bench-api: %s: %s\n", f.op.c_str(), f.message.c_str());
  }
  if (g_interrupted.load()) return 130;

  std::printf(
      "airlock-bench-api: per level %d lifecycles of create, exec `true`, delete "
      "(after %d warm-up lifecycles per phase); latencies of the calls that succeeded\n\n",
      flags.iterations, flags.warmup);
  PrintTable(results);
  std::printf(
      "\napi/engine: p50 of the whole lifecycle through airlockd's REST API over p50 of "
      "the same lifecycle on the jail engine directly, at the same concurrency\n");
  for (const auto& [concurrency, c] : pool_counts) {
    const LevelResult* warm = Find(results, "warm", concurrency);
    if (!warm) continue;
    const b::Summary s = b::Summarize("", warm->create);
    std::printf(
        "warm create (pool of %d), concurrency %d: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms; "
        "%lld hits, %lld misses",
        flags.pool, concurrency, s.p50 / 1000, s.p90 / 1000, s.p99 / 1000,
        static_cast<long long>(c.hits), static_cast<long long>(c.misses));
    if (auto r = WarmRatio(results, concurrency)) {
      std::printf("; warm/cold create p50 %.2fx", *r);
    }
    std::printf("\n");
  }

  size_t failures =
      other_failures.size() + api_warmup.failures.size() + engine_warmup.failures.size();
  for (const auto& level : results) failures += level.failures.size();
  if (!flags.json_path.empty()) {
    json doc = {{"benchmark", "api"},
                {"iterations", flags.iterations},
                {"warmup", flags.warmup},
                {"failures", failures}};
    json levels = json::array(), flat = json::array(), ratios = json::array();
    for (const auto& level : results) {
      json l = LevelJson(level);
      for (const char* op : {"create", "exec", "delete", "lifecycle"}) flat.push_back(l[op]);
      levels.push_back(std::move(l));
      if (auto r = Ratio(results, level.concurrency); r && level.phase == "api") {
        ratios.push_back(
            {{"concurrency", level.concurrency}, {"ratio_p50_lifecycle_api_vs_engine", *r}});
      }
      if (auto r = WarmRatio(results, level.concurrency); r && level.phase == "warm") {
        const PoolCounts c = pool_counts[level.concurrency];
        ratios.push_back({{"concurrency", level.concurrency},
                          {"ratio_p50_create_warm_vs_cold", *r},
                          {"pool", flags.pool},
                          {"hits", c.hits},
                          {"misses", c.misses}});
      }
    }
    doc["results"] = std::move(flat);
    doc["levels"] = std::move(levels);
    doc["ratios"] = std::move(ratios);
    json other = json::array();
    for (const LevelResult* w : {&api_warmup, &engine_warmup}) {
      for (const auto& f : w->failures)
        other.push_back({{"op", w->phase + " " + f.op}, {"message", f.message}});
    }
    for (const auto& f : other_failures) other.push_back({{"op", f.op}, {"message", f.message}});
    doc["other_failures"] = std::move(other);
    if (!WriteResults("airlock-bench-api", flags.json_path, doc.dump())) return 1;
  }
  if (failures > 0) {
    std::fprintf(stderr, "airlock-bench-api: %zu failures (see above)\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags) {
    std::fprintf(stderr,
                 "airlock-bench-api: %s\nusage: airlock-bench-api [--iterations N] [--warmup N] "
                 "[--concurrency 1,8,32] [--engine-concurrency 1,8] [--pool N] "
                 "[--warm-concurrency 1] [--json FILE]\n",
                 flags.error().message().c_str());
    return 2;
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "airlock-bench-api: needs root (airlockd and the jail engine do)\n");
    return 1;
  }
  InstallSignalHandlers("airlock-bench-api");
  return Run(*flags);
}
