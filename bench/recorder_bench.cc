// What the flight recorder costs (docs/design/recorder.md): two airlockds in one run, one
// recording (the default) and one with `--events off`, measured in alternating rounds so that
// the machine's drift falls on both alike: the exec round trip of `true` in one sandbox, and the
// create+exec+delete lifecycle rate at concurrency 1 and 8. Target: the recorder makes neither
// more than 10% slower. Needs root.
//
//   airlock-bench-recorder [--rounds N] [--execs N] [--lifecycles N] [--json FILE]

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api_lifecycle.h"
#include "daemon_process.h"
#include "flags.h"
#include "stats.h"

namespace {

using namespace airlock;
using namespace airlock::bench;

constexpr const char* kTag = "airlock-bench-recorder";

struct Side {
  const char* name;
  std::vector<std::string> args;
  std::unique_ptr<DaemonProcess> daemon;
  std::vector<double> exec_us;
  std::vector<double> rate[2];  // lifecycles/s per round, at concurrency 1 and 8
};

int Run(int rounds, int execs, int lifecycles, const std::string& json_path) {
  ScratchDir scratch(kTag);
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  Side sides[2] = {{"recorder on", {}, nullptr, {}, {}},
                   {"recorder off",
                    {"--events", "off", "--network-id", "bo", "--network-subnet", "10.217.16.0/20"},
                    nullptr, {}, {}}};
  for (Side& side : sides) {
    side.daemon = std::make_unique<DaemonProcess>(kTag, g_interrupted);
    const std::string dir = scratch.path() + "/" + (side.args.empty() ? "on" : "off");
    if (auto st = side.daemon->Start(dir, dir + ".log", side.args); !st) {
      std::fprintf(stderr, "%s: %s: %s\n", kTag, side.name, st.error().message().c_str());
      return 1;
    }
  }
  int failures = 0;
  for (int round = 0; round < rounds && !g_interrupted.load(); ++round) {
    for (Side& side : sides) {
      auto http = client::HttpClient::Open(side.daemon->url());
      if (!http) return 1;
      http->set_timeout(std::chrono::minutes(2));
      auto id = CreateSandbox(*http);
      if (!id) {
        std::fprintf(stderr, "%s: %s\n", kTag, id.error().message().c_str());
        return 1;
      }
      (void)ExecTrue(*http, *id);  // the first exec of a fresh sandbox is not the one measured
      for (int i = 0; i < execs; ++i) {
        const auto t0 = Clock::now();
        auto ran = ExecTrue(*http, *id);
        const auto t1 = Clock::now();
        if (ran) {
          side.exec_us.push_back(Us(t0, t1));
        } else {
          ++failures;
        }
      }
      (void)DeleteSandbox(*http, *id);
      const int levels[2] = {1, 8};
      for (int l = 0; l < 2; ++l) {
        LevelResult level = RunLevel(side.name, levels[l], lifecycles, ApiWorker(side.daemon->url()));
        failures += static_cast<int>(level.failures.size());
        PrintFailures(kTag, level);
        side.rate[l].push_back(level.throughput());
      }
    }
  }
  PrintHeader();
  for (Side& side : sides) Print(Summarize(std::string("exec true, ") + side.name, side.exec_us));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const Summary on = Summarize("on", sides[0].exec_us), off = Summarize("off", sides[1].exec_us);
  std::printf("\nexec round trip p50: on %.1f us, off %.1f us: %.3fx (target <= 1.10)\n", on.p50,
              off.p50, off.p50 > 0 ? on.p50 / off.p50 : 0);
  nlohmann::json results = {{"exec_on", nlohmann::json::parse(Json(on))},
                            {"exec_off", nlohmann::json::parse(Json(off))}};
  const char* names[2] = {"lifecycles_c1", "lifecycles_c8"};
  for (int l = 0; l < 2; ++l) {
    const double r_on = median(sides[0].rate[l]), r_off = median(sides[1].rate[l]);
    std::printf("lifecycles/s at concurrency %d (median of %d rounds): on %.1f, off %.1f: %.3fx "
                "of off (target >= 0.90)\n",
                l == 0 ? 1 : 8, rounds, r_on, r_off, r_off > 0 ? r_on / r_off : 0);
    results[names[l]] = {{"on", r_on}, {"off", r_off}};
  }
  results["failures"] = failures;
  for (Side& side : sides) {
    if (auto st = side.daemon->Stop(); !st) {
      std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
      ++failures;
    }
  }
  if (!json_path.empty() && !WriteResults(kTag, json_path, results.dump(2) + "\n")) return 1;
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  InstallSignalHandlers(kTag);
  std::optional<int> rounds = 5, execs = 200, lifecycles = 100;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    Status st;
    if (flag == "--rounds") {
      st = ParseIntFlag(flag, value, 1, 1000, rounds);
    } else if (flag == "--execs") {
      st = ParseIntFlag(flag, value, 1, 1'000'000, execs);
    } else if (flag == "--lifecycles") {
      st = ParseIntFlag(flag, value, 1, 1'000'000, lifecycles);
    } else if (flag == "--json") {
      json_path = value;
    } else if (flag == "--quick") {
      rounds = 2, execs = 50, lifecycles = 20;
      continue;
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--execs N] [--lifecycles N] [--quick] "
                           "[--json FILE]\n", kTag);
      return 2;
    }
    if (!st) {
      std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
      return 2;
    }
    ++i;
  }
  return Run(*rounds, *execs, *lifecycles, json_path);
}
