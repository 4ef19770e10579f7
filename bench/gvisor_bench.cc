// The gVisor engine through a real airlockd (issue 20), beside runsc's own commands measured in
// the same run:
//
//   cold create      POST /v1/sandboxes {"engine": "gvisor"}      beside `runsc run` of `true`
//   exec             POST .../exec of `true` in a gVisor sandbox  beside `runsc exec ... true`
//   hibernate        POST .../pause {"memory": true}              beside `runsc checkpoint`
//   resume           POST .../resume of a hibernated sandbox      beside `runsc restore`
//   fork with memory POST .../fork {"count": 1 or 8, "memory": true} beside runsc's checkpoint
//                    plus restore
//   template creates a template whose start_cmd is a Python interpreter with modules imported:
//                    booted, restored from its memory snapshot (snapshot_after), claimed from a
//                    warm pool of restored sandboxes; beside `runsc run` of `true`
//   host memory      of an idle gVisor sandbox (the PSS of every process in its cgroups, and
//                    its writable layer's tmpfs) and of a hibernated one (the same: no process
//                    is left, so the tmpfs is what it holds), and its memory image on disk
//
// The sandbox that hibernates runs a background process, so that what is saved is a sandbox
// with work in it, not an empty one. Prints a table with percentiles, the baselines' p50,
// ratios and the targets (resume p50 <= 150 ms; a hibernated sandbox < 1 MiB of host RAM), and
// writes JSON. Timings are reported, never asserted; the exit status is 1 if any call failed.
// Needs root and runsc (without runsc it says so and exits 0).
//
//   airlock-bench-gvisor [--quick] [--json FILE]

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "api_lifecycle.h"
#include "baselines.h"
#include "client/http_client.h"
#include "common/error.h"
#include "daemon_process.h"
#include "stats.h"

namespace {

namespace b = airlock::bench;
namespace fs = std::filesystem;
using airlock::ErrorCode;
using airlock::Result;
using airlock::Status;
using airlock::client::HttpClient;
using b::Clock;
using b::Us;
using nlohmann::json;

constexpr char kTag[] = "airlock-bench-gvisor";

// The host memory of a gVisor sandbox's processes: the sum of their PSS, found through its
// cgroups (v1: the memory hierarchy's; v2: the unified one), in bytes; and how many there are.
std::pair<uint64_t, int> ProcessMemory(const std::string& id) {
  uint64_t pss_kb = 0;
  int processes = 0;
  for (const std::string& dir : {"/sys/fs/cgroup/memory/airlock-gvisor/" + id,
                                 "/sys/fs/cgroup/airlock-gvisor/" + id}) {
    std::ifstream procs(dir + "/cgroup.procs");
    for (pid_t pid; procs >> pid;) {
      ++processes;
      std::ifstream rollup("/proc/" + std::to_string(pid) + "/smaps_rollup");
      for (std::string key; rollup >> key;) {
        uint64_t kb = 0;
        if (key == "Pss:" && rollup >> kb) pss_kb += kb;
      }
    }
    if (processes > 0) break;
  }
  return {pss_kb * 1024, processes};
}

// What the sandbox's writable layer (a tmpfs: host RAM) holds, in bytes.
uint64_t DiskTmpfsBytes(const std::string& state_dir, const std::string& id) {
  struct statvfs st{};
  const std::string disk = state_dir + "/gvisor/sandboxes/" + id + "/disk";
  if (::statvfs(disk.c_str(), &st) != 0) return 0;
  return (st.f_blocks - st.f_bfree) * st.f_frsize;
}

Status Expect(const Result<airlock::client::HttpResponse>& r, int status, const char* what) {
  if (!r) return std::unexpected(r.error().Wrap(what));
  if (r->status != status) return Fail(ErrorCode::kInternal, std::string(what) + ": " + b::Describe(*r));
  return {};
}

// runsc's own: a bundle running `sleep`, started detached, checkpointed, restored, removed.
struct RunscRounds {
  std::vector<double> checkpoint, restore;
};
Result<RunscRounds> RunscCheckpointRounds(const std::string& work, int rounds) {
  RunscRounds out;
  const std::string bundle = work + "/sleeper";
  if (auto st = b::MakeRunscBundle(bundle, {"sleep", "100000"}); !st) {
    return std::unexpected(st.error());
  }
  const std::string root = work + "/runsc-ckpt";
  for (int i = 0; i < rounds && !b::g_interrupted; ++i) {
    const std::string id = "bench-ckpt-" + std::to_string(i);
    const std::string image = work + "/image-" + std::to_string(i);
    auto ran = b::TimeCommand(b::RunscArgs(root, {"run", "--detach", "--bundle", bundle, id}),
                              /*quiet=*/true);
    if (!ran) return std::unexpected(ran.error());
    auto saved = b::TimeCommand(b::RunscArgs(root, {"checkpoint", "--image-path", image, id}),
                                /*quiet=*/true);
    if (!saved) return std::unexpected(saved.error());
    (void)b::TimeCommand(b::RunscArgs(root, {"delete", "--force", id}), true);
    // Restored under the same id; its stdio is /dev/null (a pipe would be held by the sandbox).
    auto restored = b::TimeCommand(
        b::RunscArgs(root, {"restore", "--image-path", image, "--bundle", bundle, "--detach", id}),
        /*quiet=*/true);
    if (!restored) return std::unexpected(restored.error());
    (void)b::TimeCommand(b::RunscArgs(root, {"kill", id, "KILL"}), true);
    (void)b::TimeCommand(b::RunscArgs(root, {"delete", "--force", id}), true);
    std::error_code ec;
    fs::remove_all(image, ec);
    out.checkpoint.push_back(*saved);
    out.restore.push_back(*restored);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--json FILE]\n", kTag);
      return 2;
    }
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "%s: needs root (airlockd and runsc do)\n", kTag);
    return 1;
  }
  if (!b::Have("runsc")) {
    std::printf("%s: runsc is not installed: nothing to measure (apt-get install runsc)\n", kTag);
    return 0;
  }
  b::InstallSignalHandlers(kTag);
  const int creates = quick ? 5 : 20, execs = quick ? 20 : 100, rounds = quick ? 5 : 15;
  const int idle = quick ? 2 : 5;

  b::ScratchDir scratch(kTag);
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  const std::string state = scratch.path() + "/state";
  b::DaemonProcess daemon(kTag, b::g_interrupted);
  if (auto st = daemon.Start(state, scratch.path() + "/airlockd.log",
                             {"--engine.gvisor.enabled", "true"});
      !st) {
    std::fprintf(stderr, "%s: %s\n%s\n", kTag, st.error().message().c_str(),
                 daemon.LogTail().c_str());
    return 1;
  }
  auto opened = HttpClient::Open(daemon.url());
  if (!opened) {
    std::fprintf(stderr, "%s: %s\n", kTag, opened.error().message().c_str());
    return 1;
  }
  HttpClient& http = *opened;
  int failures = 0;
  auto fail = [&](const std::string& what, const airlock::Error& e) {
    ++failures;
    std::fprintf(stderr, "%s: %s: %s\n", kTag, what.c_str(), e.message().c_str());
  };
  const std::string gvisor = R"({"engine": "gvisor"})";

  // Cold creates (each deleted after), and runsc run of `true` between them.
  std::vector<double> create_us, runsc_run_us;
  const std::string work = scratch.path();
  const std::string true_bundle = work + "/true";
  if (auto st = b::MakeRunscBundle(true_bundle, {"true"}); !st) fail("runsc bundle", st.error());
  for (int i = 0; i < creates && !b::g_interrupted; ++i) {
    const auto t0 = Clock::now();
    auto id = b::CreateSandbox(http, gvisor);
    const auto t1 = Clock::now();
    if (!id) {
      fail("create", id.error());
      continue;
    }
    create_us.push_back(Us(t0, t1));
    if (auto st = b::DeleteSandbox(http, *id); !st) fail("delete", st.error());
    auto run = b::TimeCommand(b::RunscArgs(work + "/runsc-run",
                                           {"run", "--bundle", true_bundle,
                                            "bench-run-" + std::to_string(i)}),
                              /*quiet=*/true);
    if (run) {
      runsc_run_us.push_back(*run);
    } else {
      fail("runsc run", run.error());
    }
  }

  // Creates of a template whose start_cmd is a Python interpreter that imported a few modules:
  // booted (start_cmd and ready_cmd run in each create), restored from its memory snapshot
  // (snapshot_after), and claimed from a warm pool of restored sandboxes (the pool refilled
  // between claims). Each sandbox deleted after.
  std::vector<double> boot_template_us, memory_template_us, pool_us;
  int pool_hits = 0;
  {
    const std::string interpreter =
        "exec python3 -c \"import json, sqlite3, decimal, email.parser, http.client, "
        "xml.dom.minidom; open('/tmp/ready', 'w').close(); import time; time.sleep(1e9)\"";
    json boot = {{"name", "bench-boot"},
                 {"engine", "gvisor"},
                 {"start_cmd", interpreter},
                 {"ready_cmd", "test -e /tmp/ready"}};
    json snap = boot;
    snap["name"] = "bench-memory";
    snap["snapshot_after"] = "true";
    for (const json& t : {boot, snap}) {
      auto built = http.Request("POST", "/v1/templates", t.dump());
      if (auto st = Expect(built, 201, "template build"); !st) fail("template build", st.error());
    }
    auto time_creates = [&](const std::string& body, std::vector<double>& out, int n) {
      for (int i = 0; i < n && !b::g_interrupted; ++i) {
        const auto t0 = Clock::now();
        auto id = b::CreateSandbox(http, body);
        const auto t1 = Clock::now();
        if (!id) {
          fail("create", id.error());
          continue;
        }
        out.push_back(Us(t0, t1));
        if (auto st = b::DeleteSandbox(http, *id); !st) fail("delete", st.error());
      }
    };
    time_creates(R"({"template": "bench-boot"})", boot_template_us, creates);
    time_creates(R"({"template": "bench-memory"})", memory_template_us, creates);
    auto pool = [&] {
      auto got = http.Request("GET", "/v1/pools");
      json doc = got ? json::parse(got->body, nullptr, false) : json();
      for (const json& p : doc.is_object() ? doc.value("pools", json::array()) : json::array()) {
        if (p.value("template", "") == "bench-memory") return p;
      }
      return json::object();
    };
    auto sized = http.Request("PUT", "/v1/pools/bench-memory", R"({"size": 1})");
    if (auto st = Expect(sized, 200, "pool size"); !st) fail("pool", st.error());
    for (int i = 0; i < creates && !b::g_interrupted; ++i) {
      for (int w = 0; w < 600 && pool().value("ready", 0) < 1; ++w) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      time_creates(R"({"template": "bench-memory"})", pool_us, 1);
    }
    pool_hits = pool().value("hits", 0);
    (void)http.Request("PUT", "/v1/pools/bench-memory", R"({"size": 0})");
    auto deleted = [&](const std::string& name) {
      auto r = http.Request("DELETE", "/v1/templates/" + name);
      return r && r->status == 204;
    };
    for (int w = 0; w < 200 && !deleted("bench-memory"); ++w) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the pool's sandbox goes
    }
    if (!deleted("bench-boot")) {
      fail("template delete", airlock::Error(ErrorCode::kInternal, "bench-boot stayed"));
    }
  }

  // Exec round trips, and hibernate / resume rounds of one sandbox with a background process.
  std::vector<double> exec_us, hibernate_us, resume_us;
  uint64_t image_bytes = 0;
  auto box = b::CreateSandbox(http, gvisor);
  if (!box) fail("create", box.error());
  if (box) {
    for (int i = 0; i < execs && !b::g_interrupted; ++i) {
      const auto t0 = Clock::now();
      auto st = b::ExecTrue(http, *box);
      if (!st) {
        fail("exec", st.error());
        continue;
      }
      exec_us.push_back(Us(t0, Clock::now()));
    }
    auto bg = http.Request("POST", "/v1/sandboxes/" + *box + "/exec",
                           R"({"cmd": "while :; do date > /tmp/now; sleep 1; done", "background": true})");
    if (auto st = Expect(bg, 200, "background process"); !st) fail("exec", st.error());
    for (int i = 0; i < rounds && !b::g_interrupted; ++i) {
      const auto t0 = Clock::now();
      auto saved = http.Request("POST", "/v1/sandboxes/" + *box + "/pause", R"({"memory": true})");
      const auto t1 = Clock::now();
      if (auto st = Expect(saved, 200, "hibernate"); !st) {
        fail("hibernate", st.error());
        break;
      }
      hibernate_us.push_back(Us(t0, t1));
      json doc = json::parse(saved->body, nullptr, false);
      if (doc.is_object()) image_bytes = doc.value("memory_image_bytes", uint64_t{0});
      const auto t2 = Clock::now();
      auto woke = http.Request("POST", "/v1/sandboxes/" + *box + "/resume");
      const auto t3 = Clock::now();
      if (auto st = Expect(woke, 200, "resume"); !st) {
        fail("resume", st.error());
        break;
      }
      resume_us.push_back(Us(t2, t3));
    }
  }
  // Forks with memory of the same sandbox (its background process carried), x1 and x8, each
  // fork deleted after its round.
  std::vector<double> fork1_us, fork8_us;
  if (box) {
    for (int n : {1, 8}) {
      const int fork_rounds = n == 1 ? rounds : std::max(1, rounds / 5);
      for (int i = 0; i < fork_rounds && !b::g_interrupted; ++i) {
        const auto t0 = Clock::now();
        auto forked = http.Request("POST", "/v1/sandboxes/" + *box + "/fork",
                                   json{{"count", n}, {"memory", true}}.dump());
        const auto t1 = Clock::now();
        if (auto st = Expect(forked, 201, "fork with memory"); !st) {
          fail("fork", st.error());
          break;
        }
        (n == 1 ? fork1_us : fork8_us).push_back(Us(t0, t1));
        json doc = json::parse(forked->body, nullptr, false);
        for (const json& f : doc.value("sandboxes", json::array())) {
          if (auto st = b::DeleteSandbox(http, f.value("id", "")); !st) fail("delete", st.error());
        }
      }
    }
  }
  // runsc exec of `true` into an idle runsc sandbox, and runsc's checkpoint / restore.
  std::vector<double> runsc_exec_us;
  {
    const std::string idle_bundle = work + "/idle";
    const std::string root = work + "/runsc-exec";
    if (auto st = b::MakeRunscBundle(idle_bundle, {"sleep", "100000"}); !st) {
      fail("runsc bundle", st.error());
    } else if (auto ran = b::TimeCommand(
                   b::RunscArgs(root, {"run", "--detach", "--bundle", idle_bundle, "bench-idle"}),
                   true);
               !ran) {
      fail("runsc run --detach", ran.error());
    } else {
      for (int i = 0; i < execs / 4 && !b::g_interrupted; ++i) {
        auto t = b::TimeCommand(b::RunscArgs(root, {"exec", "bench-idle", "true"}), true);
        if (t) {
          runsc_exec_us.push_back(*t);
        } else {
          fail("runsc exec", t.error());
          break;
        }
      }
      (void)b::TimeCommand(b::RunscArgs(root, {"kill", "bench-idle", "KILL"}), true);
      (void)b::TimeCommand(b::RunscArgs(root, {"delete", "--force", "bench-idle"}), true);
    }
  }
  RunscRounds runsc_rounds;
  if (auto r = RunscCheckpointRounds(work, rounds); r) {
    runsc_rounds = std::move(*r);
  } else {
    fail("runsc checkpoint/restore", r.error());
  }

  // Host memory: idle sandboxes, then the same hibernated.
  std::vector<std::string> idle_ids;
  for (int i = 0; i < idle; ++i) {
    auto id = b::CreateSandbox(http, gvisor);
    if (id) {
      idle_ids.push_back(*id);
    } else {
      fail("create", id.error());
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  double idle_pss = 0, idle_disk = 0, hib_pss = 0, hib_disk = 0;
  int hib_processes = 0;
  for (const std::string& id : idle_ids) {
    idle_pss += static_cast<double>(ProcessMemory(id).first);
    idle_disk += static_cast<double>(DiskTmpfsBytes(state, id));
  }
  for (const std::string& id : idle_ids) {
    auto saved = http.Request("POST", "/v1/sandboxes/" + id + "/pause", R"({"memory": true})");
    if (auto st = Expect(saved, 200, "hibernate"); !st) fail("hibernate", st.error());
    auto [pss, processes] = ProcessMemory(id);
    hib_pss += static_cast<double>(pss);
    hib_processes += processes;
    hib_disk += static_cast<double>(DiskTmpfsBytes(state, id));
  }
  const double n_idle = std::max<size_t>(idle_ids.size(), 1);
  for (const std::string& id : idle_ids) (void)b::DeleteSandbox(http, id);
  if (box) (void)b::DeleteSandbox(http, *box);

  std::vector<b::Summary> all = {
      b::Summarize("gvisor cold create", create_us),
      b::Summarize("baseline runsc run (true)", runsc_run_us),
      b::Summarize("gvisor exec round trip", exec_us),
      b::Summarize("baseline runsc exec (true)", runsc_exec_us),
      b::Summarize("gvisor hibernate", hibernate_us),
      b::Summarize("baseline runsc checkpoint", runsc_rounds.checkpoint),
      b::Summarize("gvisor resume (from hibernated)", resume_us),
      b::Summarize("baseline runsc restore", runsc_rounds.restore),
      b::Summarize("gvisor fork with memory x1", fork1_us),
      b::Summarize("gvisor fork with memory x8", fork8_us),
      b::Summarize("gvisor create, template booted", boot_template_us),
      b::Summarize("gvisor create, memory-snapshot template", memory_template_us),
      b::Summarize("gvisor create, warm pool (restored)", pool_us),
  };
  b::PrintHeader();
  for (const auto& s : all) b::Print(s);
  auto ratio = [&](size_t a, size_t base) {
    return all[base].p50 > 0 ? all[a].p50 / all[base].p50 : 0.0;
  };
  std::printf("\nratios (p50): create / runsc run %.2fx; exec / runsc exec %.2fx; hibernate / "
              "runsc checkpoint %.2fx; resume / runsc restore %.2fx\n",
              ratio(0, 1), ratio(2, 3), ratio(4, 5), ratio(6, 7));
  const double save_and_restore = all[5].p50 + all[7].p50;
  std::printf("fork with memory x1 p50 / (runsc checkpoint + restore p50) %.2fx; x8 %.2fx\n",
              save_and_restore > 0 ? all[8].p50 / save_and_restore : 0.0,
              save_and_restore > 0 ? all[9].p50 / save_and_restore : 0.0);
  std::printf("create from a memory snapshot p50 / runsc run p50 %.2fx; / the same template "
              "booted %.2fx; warm pool claims that hit: %d of %zu\n",
              ratio(11, 1), ratio(11, 10), pool_hits, pool_us.size());
  std::printf("memory image of the hibernating sandbox: %.1f KiB\n",
              static_cast<double>(image_bytes) / 1024);
  std::printf("host RAM per idle sandbox: %.1f MiB (processes' PSS %.1f MiB + writable layer %.1f "
              "KiB)\n",
              (idle_pss + idle_disk) / n_idle / 1048576, idle_pss / n_idle / 1048576,
              idle_disk / n_idle / 1024);
  std::printf("host RAM per hibernated sandbox: %.1f KiB (%d processes left, PSS %.1f KiB; "
              "writable layer %.1f KiB)\n",
              (hib_pss + hib_disk) / n_idle / 1024, hib_processes, hib_pss / n_idle / 1024,
              hib_disk / n_idle / 1024);
  std::printf("targets: resume p50 <= 150 ms (measured %.1f ms); fork with memory x1 <= 200 ms "
              "(measured %.1f ms); create from a memory snapshot <= 0.5x runsc run (measured "
              "%.2fx); hibernated < 1 MiB of host RAM (measured %.1f KiB)\n",
              all[6].p50 / 1000, all[8].p50 / 1000, ratio(11, 1),
              (hib_pss + hib_disk) / n_idle / 1024);
  if (!json_path.empty()) {
    std::ostringstream out;
    out << "{\"benchmarks\":[";
    for (size_t i = 0; i < all.size(); ++i) out << (i ? "," : "") << b::Json(all[i]);
    out << "],\"image_bytes\":" << image_bytes
        << ",\"idle_host_bytes\":" << static_cast<uint64_t>((idle_pss + idle_disk) / n_idle)
        << ",\"hibernated_host_bytes\":" << static_cast<uint64_t>((hib_pss + hib_disk) / n_idle)
        << ",\"failures\":" << failures << "}\n";
    if (!b::WriteResults(kTag, json_path, out.str())) return 1;
  }
  if (auto st = daemon.Stop(); !st) fail("stopping airlockd", st.error());
  return failures > 0 ? 1 : 0;
}
