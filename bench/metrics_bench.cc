// The cost of the daemon's metrics sampling (docs/design/metrics.md): with N jail sandboxes
// live (50 by default), one pass of what the sampler does per sandbox (Engine::Stats: its
// cgroup files and a statfs of its writable layer) and the pass's store write (every sample in
// one transaction, the newest 720 kept), timed separately and together, beside the same pass
// over no sandbox (the fixed cost) in the same run.
//
//   airlock-bench-metrics [--sandboxes N] [--passes N] [--json FILE]

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"
#include "common/log.h"
#include "daemon/store/store.h"
#include "runtime/jail/jail_engine.h"
#include "runtime/layer_store.h"
#include "stats.h"

namespace {

namespace fs = std::filesystem;
namespace b = airlock::bench;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-bench-metrics: %s\n", what.c_str());
  std::exit(1);
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  int sandboxes = 50, passes = 200;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--sandboxes") {
      sandboxes = std::stoi(next());
    } else if (a == "--passes") {
      passes = std::stoi(next());
    } else if (a == "--json") {
      json_path = next();
    } else {
      Die("unknown argument " + a);
    }
  }
  if (geteuid() != 0) Die("needs root (the jail engine)");
  const std::string work =
      fs::temp_directory_path() / ("airlock-bench-metrics-" + std::to_string(getpid()));
  fs::create_directories(work);
  fs::permissions(work, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);

  airlock::runtime::LayerStore layers(work + "/state/layers", work + "/state/staging");
  if (auto st = layers.Prepare(); !st) Die(st.error().message());
  airlock::jail::JailOptions options;
  options.layers = &layers;
  options.state_dir = work + "/state";
  options.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
  options.agent_path = AIRLOCK_AGENT_PATH;
  auto engine = airlock::jail::JailEngine::Open(options);
  if (!engine) Die(engine.error().message());
  auto store = airlock::store::Store::Open(work + "/store.db");
  if (!store) Die(store.error().message());

  std::vector<std::string> ids;
  auto cleanup = [&] {
    for (const std::string& id : ids) (void)(*engine)->Destroy(id);
    engine->reset();
    std::error_code ec;
    fs::remove_all(work, ec);
  };
  for (int i = 0; i < sandboxes; ++i) {
    airlock::runtime::SandboxSpec spec;
    spec.id = airlock::NewSandboxId();
    auto made = (*engine)->Create(spec);
    if (!made) {
      cleanup();
      Die(made.error().message());
    }
    ids.push_back(spec.id);
    airlock::store::SandboxRecord record;
    record.id = spec.id;
    record.engine = "jail";
    record.template_name = "base";
    if (auto inserted = (*store)->Insert(record); !inserted) {
      cleanup();
      Die(inserted.error().message());
    }
  }

  // Each pass: Stats of every sandbox, then one store write of the samples (as the sampler).
  std::vector<double> stats_us, write_us, pass_us, empty_us, per_sandbox_us;
  auto pass = [&](const std::vector<std::string>& which, bool record) {
    const auto t0 = Clock::now();
    std::vector<std::pair<std::string, airlock::store::MetricSample>> samples;
    const int64_t at = airlock::UnixNowMs();
    for (const std::string& id : which) {
      auto s = (*engine)->Stats(id);
      if (!s) Die(s.error().message());
      airlock::store::MetricSample m;
      m.at_ms = at;
      m.cpu_seconds = s->cpu_seconds;
      m.memory_bytes = static_cast<int64_t>(s->memory_bytes);
      m.pids = static_cast<int64_t>(s->pids);
      m.disk_bytes = static_cast<int64_t>(s->disk_bytes);
      samples.emplace_back(id, m);
    }
    const auto t1 = Clock::now();
    if (!samples.empty()) {
      if (auto st = (*store)->AppendMetrics(samples, 720); !st) Die(st.error().message());
    }
    const auto t2 = Clock::now();
    if (!record) return;
    if (which.empty()) {
      empty_us.push_back(Us(t0, t2));
      return;
    }
    stats_us.push_back(Us(t0, t1));
    write_us.push_back(Us(t1, t2));
    pass_us.push_back(Us(t0, t2));
    per_sandbox_us.push_back(Us(t0, t1) / static_cast<double>(which.size()));
  };
  for (int i = 0; i < 5; ++i) pass(ids, false);  // warm up
  for (int i = 0; i < passes; ++i) {
    pass(ids, true);
    pass({}, true);
    // Distinct at_ms for the next pass (the key is per sandbox and ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::string n = std::to_string(sandboxes);
  std::vector<b::Summary> all = {
      b::Summarize("sampling pass, " + n + " sandboxes (stats + store write)", pass_us),
      b::Summarize("  Engine::Stats of all " + n, stats_us),
      b::Summarize("  Engine::Stats per sandbox", per_sandbox_us),
      b::Summarize("  store write of " + n + " samples (one transaction)", write_us),
      b::Summarize("baseline: a pass over no sandbox", empty_us)};
  cleanup();
  b::PrintHeader();
  for (const b::Summary& s : all) b::Print(s);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[";
    for (size_t i = 0; i < all.size(); ++i) out << (i ? "," : "") << b::Json(all[i]);
    out << "]\n";
  }
  return 0;
}
