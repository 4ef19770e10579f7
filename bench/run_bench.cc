// The one benchmark that shows the speed (issue 7), run by bench/run: through a real airlockd,
//
//   warm create      POST /v1/sandboxes claimed from a full warm pool (the 201 means the agent
//                    is up: ready for exec); and the same with an allowlist network, which
//                    the claim applies to the pooled sandbox's parked link
//   cold create      the same with no pool
//   exec             POST .../exec of `true` in a running sandbox
//   lifecycles       create, exec `true`, delete at concurrency 1, 8 and 32 (lifecycles/s)
//   fork             POST .../fork {"count": N} (reported as not available if the route is not)
//   density          N idle sandboxes: how many were made and answer, and the host memory each
//                    one costs (the fall of MemAvailable, and the rise of the kernel's memory
//                    plus the sandboxes' PSS, over N; judged on the larger)
//
// each beside the nearest bubblewrap and runsc (gVisor) equivalent measured in the same run:
// a cold start of `true` (for creates and lifecycles; neither has a warm pool), nsenter into an
// idle bwrap sandbox or `runsc exec` (for exec), N sandboxes started at once (for fork: neither
// copies a running sandbox's filesystem), and idle `sleep` sandboxes (for density). A tool that
// is not installed is reported as absent and the run goes on. Prints a table with percentiles,
// throughput, the baselines' p50, ratios and the targets, and writes JSON. Needs root.
//
//   airlock-bench-run [--quick] [--density N] [--json FILE]
//
// --quick: fewer iterations and 50 idle sandboxes (under a minute). Timings are reported, never
// asserted; the exit status is 1 if any call failed, 130 on SIGINT / SIGTERM. Every sandbox
// (airlock, bwrap, runsc), airlockd and the scratch directory are removed on every path.

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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
using b::g_interrupted;
using b::Us;
using nlohmann::json;

constexpr char kTag[] = "airlock-bench-run";

struct Flags {
  bool quick = false;
  int density = -1;  // -1: 1000, or 50 with --quick
  std::string json_path;
};

// How much of each thing one run measures.
struct Plan {
  int pool = 8;          // warm pool size
  int warm = 200;        // warm creates
  int cold = 100;        // cold creates (and bwrap cold starts, interleaved)
  int exec = 300;        // exec round trips (and nsenter, interleaved)
  int lifecycles = 200;  // per concurrency level
  std::vector<int> levels = {1, 8, 32};
  int fork_calls = 20;  // fork calls of each count
  std::vector<int> fork_counts = {1, 8};
  int density = 1000;          // idle airlock sandboxes, and idle bwrap sandboxes
  int runsc = 20;              // runsc cold starts and execs
  int runsc_lifecycles = 32;   // per level (at least the level's concurrency)
  int runsc_density = 20;      // idle runsc sandboxes
  int runsc_fork_samples = 3;  // runsc "N at once" samples per fork count
};

Plan MakePlan(const Flags& flags) {
  Plan plan;
  if (flags.quick) {
    plan.warm = 40;
    plan.cold = 20;
    plan.exec = 100;
    plan.lifecycles = 64;
    plan.fork_calls = 5;
    plan.density = 50;
    plan.runsc = 5;
    plan.runsc_lifecycles = 8;
    plan.runsc_density = 3;
    plan.runsc_fork_samples = 1;
  }
  if (flags.density > 0) plan.density = flags.density;
  return plan;
}

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      flags.quick = true;
      continue;
    }
    if (i + 1 >= argc) return airlock::Fail(ErrorCode::kInvalidArgument, arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--density") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 10000) {
        return airlock::Fail(ErrorCode::kInvalidArgument, "--density is 1-10000, got " + value);
      }
      flags.density = static_cast<int>(n);
    } else if (arg == "--json") {
      flags.json_path = value;
    } else {
      return airlock::Fail(ErrorCode::kInvalidArgument, "unknown argument " + arg);
    }
  }
  return flags;
}

// One side of a row: airlock's measurement or a baseline's.
struct Side {
  // "ok"; "absent" (the tool is not installed); "not available" (the daemon has no such route);
  // "n/a" (no equivalent); "failed" (every attempt failed).
  std::string status = "ok";
  std::string what;        // what was measured, for the JSON and the docs
  std::vector<double> us;  // samples, microseconds
  double per_s = 0;        // throughput, where the row has one
  b::Summary summary() const { return b::Summarize(what, us); }
  bool measured() const { return status == "ok" && !us.empty(); }
};

Side Absent(const std::string& tool) {
  Side side;
  side.status = "absent";
  side.what = tool + " is not installed";
  return side;
}

struct Row {
  std::string op;
  Side airlock, bwrap, runsc;
  std::string target;       // "" when the issue sets none
  std::optional<bool> met;  // set when there is a target and a measurement
  json steps;               // lifecycle rows: p50 ms of airlock's create, exec and delete
};

// Everything one run found.
struct Report {
  std::vector<Row> rows;
  std::vector<json> density;
  std::vector<b::Failure> failures;
  void Fail(std::string op, std::string message) {
    std::fprintf(stderr, "%s: %s: %s\n", kTag, op.c_str(), message.c_str());
    failures.push_back({std::move(op), std::move(message)});
  }
};

// Measures one baseline command `n` times into `side`; stops at the first failure (recorded).
void TimeBaseline(Side& side, Report& report, const std::vector<std::string>& args, int n) {
  for (int i = 0; i < n && !g_interrupted.load(); ++i) {
    auto us = b::TimeCommand(args);
    if (!us) {
      report.Fail(side.what, us.error().message());
      if (side.us.empty()) side.status = "failed";
      return;
    }
    side.us.push_back(*us);
  }
}

// ---- the host's memory ----

// A field of /proc/meminfo in KiB (0 if missing).
int64_t MeminfoKiB(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name == field + ":") return kib;
  }
  return 0;
}

// The host's memory as two numbers: what MemAvailable says (everything, but it moves with
// whatever else runs on the machine), and the kernel memory that sandboxes cost and compilers
// barely move (slab, kernel stacks, page tables, per-cpu data, and shmem, which holds tmpfs
// files and memfds).
struct MemorySnapshot {
  int64_t available_kib = 0;
  int64_t kernel_kib = 0;
};

// The median of five reads 100 ms apart, each field on its own.
MemorySnapshot SettledMemory() {
  std::vector<int64_t> available, kernel;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    available.push_back(MeminfoKiB("MemAvailable"));
    kernel.push_back(MeminfoKiB("Slab") + MeminfoKiB("KernelStack") + MeminfoKiB("PageTables") +
                     MeminfoKiB("Percpu") + MeminfoKiB("Shmem"));
  }
  std::sort(available.begin(), available.end());
  std::sort(kernel.begin(), kernel.end());
  return {available[2], kernel[2]};
}

// Waits (up to 30 s) until the kernel's memory stops moving: namespaces and mounts of sandboxes
// just destroyed are freed by the kernel in the background, and must not be counted against
// the next ones.
void WaitForQuietKernelMemory() {
  int64_t last = SettledMemory().kernel_kib;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && !g_interrupted.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t now = SettledMemory().kernel_kib;
    if (std::abs(now - last) < 2048) return;
    last = now;
  }
}

// A /proc/<pid>/<file> field (e.g. "VmRSS:" of status) in KiB.
int64_t ProcKiB(pid_t pid, const char* file, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field)) return std::atoll(line.c_str() + field.size());
  }
  return 0;
}

// A process's proportional set size without its shmem pages (counted with the kernel's).
int64_t PssKiB(pid_t pid) {
  return ProcKiB(pid, "smaps_rollup", "Pss_Anon:") + ProcKiB(pid, "smaps_rollup", "Pss_File:");
}

// `root` and all its descendants.
std::vector<pid_t> ProcessTree(pid_t root) {
  std::vector<pid_t> tree = {root};
  for (size_t i = 0; i < tree.size(); ++i) {
    const std::string dir = "/proc/" + std::to_string(tree[i]) + "/task";
    std::error_code ec;
    for (const auto& task : fs::directory_iterator(dir, ec)) {
      std::ifstream children(task.path() / "children");
      pid_t child = 0;
      while (children >> child) tree.push_back(child);
    }
  }
  return tree;
}

// Processes whose command line holds `needle` (runsc's sandbox and gofer name their --root).
std::vector<pid_t> ProcessesMentioning(const std::string& needle) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    if (cmdline.find(needle) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// Per-sandbox memory from snapshots before and after `count` sandboxes were made, plus the PSS
// of their processes (and, for airlock, airlockd's RSS growth): the JSON fields of a density
// row. The target is judged on the larger of the two totals, MemAvailable's and the accounted.
json MemoryPerSandbox(const MemorySnapshot& before, const MemorySnapshot& after, double count,
                      int64_t pss_kib, int64_t daemon_kib) {
  const double host = static_cast<double>(before.available_kib - after.available_kib) / 1024;
  const double kernel = static_cast<double>(after.kernel_kib - before.kernel_kib) / 1024;
  const double pss = static_cast<double>(pss_kib) / 1024;
  const double daemon = static_cast<double>(daemon_kib) / 1024;
  const double accounted = kernel + pss + daemon;
  const double judged = std::max(host, accounted) / count;
  return {{"host_mib_each", host / count},
          {"kernel_mib_each", kernel / count},
          {"pss_mib_each", pss / count},
          {"daemon_rss_mib_each", daemon / count},
          {"accounted_mib_each", accounted / count},
          {"judged_mib_each", judged},
          {"mem_available_before_mib", before.available_kib / 1024},
          {"est_fit",
           judged > 0 ? static_cast<int64_t>(before.available_kib / 1024 / judged) : int64_t{0}}};
}

// What the sandboxes' own cgroups say: memory charged to them, and the PSS of their processes.
struct CgroupMemory {
  int found = 0;  // sandboxes whose memory cgroup was found
  int64_t usage_bytes = 0;
  int64_t pss_kib = 0;
};

CgroupMemory SandboxCgroupMemory(const std::set<std::string>& ids) {
  const bool v1 = fs::is_directory("/sys/fs/cgroup/memory");
  const fs::path root = v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
  const char* usage_file = v1 ? "memory.usage_in_bytes" : "memory.current";
  CgroupMemory total;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_directory(ec) || !ids.contains(it->path().filename().string())) continue;
    ++total.found;
    std::ifstream usage(it->path() / usage_file);
    int64_t bytes = 0;
    if (usage >> bytes) total.usage_bytes += bytes;
    std::ifstream procs(it->path() / "cgroup.procs");
    pid_t pid = 0;
    while (procs >> pid) total.pss_kib += PssKiB(pid);
    it.disable_recursion_pending();
  }
  return total;
}

// ---- many calls at once ----

// Runs fn(http, i) for i in [0, n) on `concurrency` threads, each with its own HttpClient.
// Stops handing out work after 20 failures or on SIGINT. Returns the failures and the wall time.
struct Sweep {
  std::vector<b::Failure> failures;
  double wall_s = 0;
  int done = 0;  // calls that succeeded
};

Sweep ParallelCalls(const std::string& url, int concurrency, int n, const std::string& op,
                    const std::function<Status(HttpClient&, int)>& fn) {
  Sweep sweep;
  std::mutex mu;
  std::atomic<int> next{0}, failed{0}, done{0};
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int w = 0; w < concurrency; ++w) {
    threads.emplace_back([&] {
      auto http = HttpClient::Open(url);
      if (!http) {
        std::lock_guard lock(mu);
        sweep.failures.push_back({op, http.error().message()});
        ++failed;
        return;
      }
      http->set_timeout(std::chrono::minutes(2));
      while (!g_interrupted.load() && failed.load() < 20) {
        const int i = next.fetch_add(1);
        if (i >= n) break;
        if (auto st = fn(*http, i); !st) {
          std::lock_guard lock(mu);
          sweep.failures.push_back({op, st.error().message()});
          ++failed;
        } else {
          ++done;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  sweep.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  sweep.done = done.load();
  return sweep;
}

// Sandboxes made through the API that must be deleted whatever happens: what a phase makes is
// added here, and Cleanup (also run by the destructor) deletes them all.
class SandboxSet {
 public:
  explicit SandboxSet(std::string url) : url_(std::move(url)) {}
  SandboxSet(const SandboxSet&) = delete;
  SandboxSet& operator=(const SandboxSet&) = delete;
  ~SandboxSet() { (void)Cleanup(8); }

  void Add(const std::string& id) {
    std::lock_guard lock(mu_);
    ids_.push_back(id);
  }
  std::vector<std::string> ids() const {
    std::lock_guard lock(mu_);
    return ids_;
  }
  // Deletes every sandbox added so far (`concurrency` at a time); a 404 counts as deleted.
  Sweep Cleanup(int concurrency) {
    std::vector<std::string> ids;
    {
      std::lock_guard lock(mu_);
      ids.swap(ids_);
    }
    if (ids.empty()) return {};
    // The deletes go on after a Ctrl-C: this is the cleanup.
    const bool was_interrupted = g_interrupted.exchange(false);
    Sweep sweep = ParallelCalls(url_, concurrency, static_cast<int>(ids.size()), "delete",
                                [&](HttpClient& http, int i) -> Status {
                                  auto r = http.Request("DELETE", "/v1/sandboxes/" + ids[i]);
                                  if (!r) return std::unexpected(r.error());
                                  if (r->status != 204 && r->status != 404) {
                                    return airlock::Fail(ErrorCode::kInternal, b::Describe(*r));
                                  }
                                  return {};
                                });
    if (was_interrupted) g_interrupted.store(true);
    return sweep;
  }

 private:
  std::string url_;
  mutable std::mutex mu_;
  std::vector<std::string> ids_;
};

// "idle-000007": runsc takes an id prefix for a whole id, so no id may be another's prefix.
std::string RunscId(const char* prefix, int n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s-%06d", prefix, n);
  return buf;
}

// runsc sandboxes started detached under one state root, deleted (forced) when this goes out
// of scope.
class RunscSandboxes {
 public:
  explicit RunscSandboxes(std::string root) : root_(std::move(root)) {}
  RunscSandboxes(const RunscSandboxes&) = delete;
  RunscSandboxes& operator=(const RunscSandboxes&) = delete;
  ~RunscSandboxes() { DeleteAll(); }

  // `runsc run -detach` of the bundle in `bundle` as `id`; its wall time.
  Result<double> Start(const std::string& bundle, const std::string& id) {
    auto us = b::TimeCommand(b::RunscArgs(root_, {"run", "-detach", "--bundle", bundle, id}));
    // Remembered even on failure: a half-made container is deleted too.
    ids_.push_back(id);
    return us;
  }
  // Deletes them 8 at a time (each `runsc delete -force` takes a second or two).
  void DeleteAll() {
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (size_t i = next.fetch_add(1); i < ids_.size(); i = next.fetch_add(1)) {
          auto st = b::TimeCommand(b::RunscArgs(root_, {"delete", "-force", ids_[i]}));
          if (!st) {
            std::fprintf(stderr, "%s: runsc delete %s: %s\n", kTag, ids_[i].c_str(),
                         st.error().message().c_str());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    ids_.clear();
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  std::vector<std::string> ids_;
};

// What the run needs beside the daemon.
struct Env {
  std::string url;
  std::string scratch;
  bool have_bwrap = false, have_runsc = false;
  std::string runsc_true_bundle, runsc_sleep_bundle;
  pid_t daemon_pid = -1;
};

// `bwrap ... true` as a Lifecycle (its whole run: create, exec and destroy in one).
b::WorkerFactory CommandWorker(std::vector<std::string> args, std::string op) {
  return [args = std::move(args), op = std::move(op)]() -> Result<b::LifecycleFn> {
    return b::LifecycleFn([args, op] {
      b::Lifecycle life;
      auto us = b::TimeCommand(args);
      if (!us) {
        life.Fail(op, us.error().message());
      } else {
        life.total_us = *us;
      }
      return life;
    });
  };
}

std::vector<std::string> BwrapTrue() { return b::BwrapArgs({}, {"/usr/bin/true"}); }

// A runsc `run` of the true bundle with a fresh container id each time.
std::vector<std::string> RunscTrue(const Env& env) {
  static std::atomic<int> serial{0};
  return b::RunscArgs(env.scratch + "/runsc", {"run", "--bundle", env.runsc_true_bundle,
                                               RunscId("true", serial.fetch_add(1))});
}

b::WorkerFactory RunscWorker(const Env& env) {
  return [&env]() -> Result<b::LifecycleFn> {
    return b::LifecycleFn([&env] {
      b::Lifecycle life;
      auto us = b::TimeCommand(RunscTrue(env));
      if (!us) {
        life.Fail("runsc run", us.error().message());
      } else {
        life.total_us = *us;
      }
      return life;
    });
  };
}

// ---- the phases ----

// Warm creates: before each create the base pool is full (the harness waits for the refill), so
// each create is a claim; the claimed sandbox is deleted, untimed. A create without a network
// and one with an allowlist (the claim gives the pooled sandbox's parked link the policy)
// alternate, so that both see the same host.
void MeasureWarmCreate(const Env& env, const Plan& plan, Report& report, Side& plain,
                       Side& networked, json& pool_counts) {
  plain.what = "POST /v1/sandboxes claimed from a full warm pool of " + std::to_string(plan.pool);
  networked.what = "the same with network allowlist (the claim applies the policy)";
  auto http = HttpClient::Open(env.url);
  if (!http) {
    report.Fail("warm create", http.error().message());
    plain.status = networked.status = "failed";
    return;
  }
  http->set_timeout(std::chrono::minutes(2));
  auto before = b::BasePool(*http);
  const std::pair<Side*, std::string> kinds[] = {
      {&plain, "{}"},
      {&networked, R"({"network": {"mode": "allowlist", "allow": ["example.invalid"]}})"}};
  for (int i = 0; i < plan.warm && !g_interrupted.load(); ++i) {
    for (const auto& [side, body] : kinds) {
      if (auto st = b::FillPool(*http, plan.pool); !st) {
        report.Fail("warm create: filling the pool", st.error().message());
        break;
      }
      const auto t0 = Clock::now();
      auto id = b::CreateSandbox(*http, body);
      const auto t1 = Clock::now();
      if (!id) {
        report.Fail("warm create", id.error().message());
        continue;
      }
      side->us.push_back(Us(t0, t1));
      if (auto st = b::DeleteSandbox(*http, *id); !st)
        report.Fail("warm delete", st.error().message());
    }
  }
  auto after = b::BasePool(*http);
  // Before the first fill there is no pool yet (null): its counts are zeros.
  if (before && after && after->is_object()) {
    const json start = before->is_object() ? *before : json::object();
    pool_counts = {
        {"pool", plan.pool},
        {"hits", after->value("hits", int64_t{0}) - start.value("hits", int64_t{0})},
        {"misses", after->value("misses", int64_t{0}) - start.value("misses", int64_t{0})}};
  }
  if (auto st = b::FillPool(*http, 0); !st) report.Fail("emptying the pool", st.error().message());
  if (plain.us.empty()) plain.status = "failed";
  if (networked.us.empty()) networked.status = "failed";
}

// Cold create (no pool), interleaved with bwrap cold starts; then as many creates that ask for
// a network (allowlist: a namespace, a veth, firewall set, DNS stub); then runsc cold starts.
void MeasureCreate(const Env& env, const Plan& plan, Report& report, Row& warm, Row& cold,
                   Row& networked) {
  networked.airlock.what =
      "POST /v1/sandboxes with network allowlist (namespace, veth, firewall, DNS stub)";
  networked.bwrap = Side{.status = "absent", .what = "no equivalent: compare with cold create"};
  networked.runsc = networked.bwrap;
  cold.airlock.what = "POST /v1/sandboxes, no warm pool (201: the agent answers)";
  cold.bwrap = env.have_bwrap ? Side{} : Absent("bwrap");
  if (env.have_bwrap) cold.bwrap.what = "bwrap --unshare-all ... true, whole run";
  cold.runsc = env.have_runsc ? Side{} : Absent("runsc");
  if (env.have_runsc) cold.runsc.what = "runsc run of a bundle running true, whole run";
  auto http = HttpClient::Open(env.url);
  if (!http) {
    report.Fail("cold create", http.error().message());
    return;
  }
  http->set_timeout(std::chrono::minutes(2));
  for (int i = 0; i < plan.cold && !g_interrupted.load(); ++i) {
    const auto t0 = Clock::now();
    auto id = b::CreateSandbox(*http);
    const auto t1 = Clock::now();
    if (!id) {
      report.Fail("cold create", id.error().message());
    } else {
      cold.airlock.us.push_back(Us(t0, t1));
      if (auto st = b::DeleteSandbox(*http, *id); !st)
        report.Fail("cold delete", st.error().message());
    }
    if (env.have_bwrap && cold.bwrap.status == "ok")
      TimeBaseline(cold.bwrap, report, BwrapTrue(), 1);
  }
  // Networked creates in a loop of their own: a destroyed sandbox's network namespace is torn
  // down by the kernel afterwards, which would slow the cold creates interleaved with it.
  for (int i = 0; i < plan.cold && !g_interrupted.load() && networked.airlock.status == "ok";
       ++i) {
    const auto n0 = Clock::now();
    auto net_id = b::CreateSandbox(
        *http, R"({"network": {"mode": "allowlist", "allow": ["example.invalid"]}})");
    const auto n1 = Clock::now();
    if (!net_id) {
      report.Fail("networked create", net_id.error().message());
      networked.airlock.status = "failed";
    } else {
      networked.airlock.us.push_back(Us(n0, n1));
      if (auto st = b::DeleteSandbox(*http, *net_id); !st)
        report.Fail("networked delete", st.error().message());
    }
  }
  if (env.have_runsc) {
    for (int i = 0; i < plan.runsc && !g_interrupted.load() && cold.runsc.status == "ok"; ++i) {
      TimeBaseline(cold.runsc, report, RunscTrue(env), 1);
    }
  }
  if (cold.airlock.us.empty()) cold.airlock.status = "failed";
  // Neither bwrap nor runsc keeps sandboxes ready: their nearest equivalent of a warm create is
  // the same cold start.
  warm.bwrap = cold.bwrap;
  warm.runsc = cold.runsc;
}

// Exec round trip of `true` in one running sandbox, interleaved with nsenter into an idle bwrap
// sandbox; then `runsc exec` into an idle runsc sandbox.
void MeasureExec(const Env& env, const Plan& plan, Report& report, SandboxSet& sandboxes,
                 Row& row) {
  row.airlock.what = "POST /v1/sandboxes/{id}/exec of true in a running sandbox";
  row.bwrap = env.have_bwrap ? Side{} : Absent("bwrap");
  if (env.have_bwrap) row.bwrap.what = "nsenter into an idle bwrap sandbox, then true";
  row.runsc = env.have_runsc ? Side{} : Absent("runsc");
  if (env.have_runsc) row.runsc.what = "runsc exec of true in an idle runsc sandbox";
  auto http = HttpClient::Open(env.url);
  if (!http) {
    report.Fail("exec", http.error().message());
    row.airlock.status = "failed";
    return;
  }
  http->set_timeout(std::chrono::minutes(2));
  auto id = b::CreateSandbox(*http);
  if (!id) {
    report.Fail("exec: create", id.error().message());
    row.airlock.status = "failed";
    return;
  }
  sandboxes.Add(*id);
  b::IdleBwrap idle_bwrap;
  if (env.have_bwrap) {
    if (auto st = idle_bwrap.Start(); !st) {
      report.Fail("exec: idle bwrap", st.error().message());
      row.bwrap.status = "failed";
    }
  }
  for (int i = 0; i < 10 && !g_interrupted.load(); ++i) (void)b::ExecTrue(*http, *id);  // warm-up
  for (int i = 0; i < plan.exec && !g_interrupted.load(); ++i) {
    const auto t0 = Clock::now();
    auto st = b::ExecTrue(*http, *id);
    const auto t1 = Clock::now();
    if (!st) {
      report.Fail("exec", st.error().message());
    } else {
      row.airlock.us.push_back(Us(t0, t1));
    }
    if (row.bwrap.status == "ok" && env.have_bwrap) {
      TimeBaseline(row.bwrap, report, b::NsenterTrueArgs(idle_bwrap.child_pid()), 1);
    }
  }
  idle_bwrap.Kill();
  if (env.have_runsc && !g_interrupted.load()) {
    RunscSandboxes runsc(env.scratch + "/runsc");
    if (auto started = runsc.Start(env.runsc_sleep_bundle, "exec-target"); !started) {
      report.Fail("exec: runsc run -detach", started.error().message());
      row.runsc.status = "failed";
    } else {
      const auto args = b::RunscArgs(runsc.root(), {"exec", "exec-target", "/usr/bin/true"});
      TimeBaseline(row.runsc, report, args, 1);  // warm-up, then dropped
      row.runsc.us.clear();
      TimeBaseline(row.runsc, report, args, plan.runsc);
    }
  }
  if (row.airlock.us.empty()) row.airlock.status = "failed";
}

// Lifecycles at each level: airlock (create, exec, delete through the API), bwrap and runsc
// (a whole run of `true`) at the same concurrency.
void MeasureLifecycles(const Env& env, const Plan& plan, Report& report, std::vector<Row>& rows) {
  for (int level : plan.levels) {
    if (g_interrupted.load()) break;
    Row row;
    row.op = "lifecycle c" + std::to_string(level);
    std::fprintf(stderr, "%s: lifecycles at concurrency %d...\n", kTag, level);
    b::LevelResult api = b::RunLevel("api", level, plan.lifecycles, b::ApiWorker(env.url));
    b::PrintFailures(kTag, api);
    for (const auto& f : api.failures) report.failures.push_back({row.op + " " + f.op, f.message});
    row.airlock.what =
        "create, exec true, delete through the API; " + std::to_string(level) + " clients";
    row.airlock.us = api.total;
    row.airlock.per_s = api.throughput();
    row.steps = {{"create_p50_ms", b::Summarize("", api.create).p50 / 1000},
                 {"exec_p50_ms", b::Summarize("", api.exec).p50 / 1000},
                 {"delete_p50_ms", b::Summarize("", api.destroy).p50 / 1000}};
    if (row.airlock.us.empty()) row.airlock.status = "failed";

    auto baseline = [&](Side& side, const std::string& name, const b::WorkerFactory& worker,
                        int n) {
      b::LevelResult r = b::RunLevel(name, level, n, worker);
      b::PrintFailures(kTag, r);
      for (const auto& f : r.failures) report.failures.push_back({row.op + " " + f.op, f.message});
      side.us = r.total;
      side.per_s = r.throughput();
      if (side.us.empty()) side.status = "failed";
    };
    if (env.have_bwrap) {
      row.bwrap.what = "bwrap ... true runs, " + std::to_string(level) + " at a time";
      baseline(row.bwrap, "bwrap", CommandWorker(BwrapTrue(), "bwrap"), plan.lifecycles);
    } else {
      row.bwrap = Absent("bwrap");
    }
    if (env.have_runsc && !g_interrupted.load()) {
      row.runsc.what = "runsc run of true, " + std::to_string(level) + " at a time";
      baseline(row.runsc, "runsc", RunscWorker(env), std::max(plan.runsc_lifecycles, level));
    } else if (!env.have_runsc) {
      row.runsc = Absent("runsc");
    }
    row.target = ">= 100/s";
    if (row.airlock.measured()) row.met = row.airlock.per_s >= 100;
    rows.push_back(std::move(row));
  }
}

// Fork of one running sandbox into N; "not available" if the daemon does not have the route.
// Beside it: N bwrap / runsc sandboxes started at once (neither can copy a running sandbox).
void MeasureFork(const Env& env, const Plan& plan, Report& report, SandboxSet& sandboxes,
                 std::vector<Row>& rows) {
  auto http = HttpClient::Open(env.url);
  if (!http) {
    report.Fail("fork", http.error().message());
    return;
  }
  http->set_timeout(std::chrono::minutes(2));
  auto source = b::CreateSandbox(*http);
  if (!source) {
    report.Fail("fork: create", source.error().message());
    return;
  }
  sandboxes.Add(*source);
  // Something in the writable layer for the forks to carry.
  (void)http->Request("POST", "/v1/sandboxes/" + *source + "/exec",
                      R"({"argv":["sh","-c","echo forked > $HOME/marker"]})");
  const std::string target = "/v1/sandboxes/" + *source + "/fork";
  std::optional<std::string> unavailable;

  for (int count : plan.fork_counts) {
    Row row;
    row.op = "fork x" + std::to_string(count);
    row.airlock.what = "POST /v1/sandboxes/{id}/fork {\"count\": " + std::to_string(count) + "}";
    for (int i = 0; i < plan.fork_calls && !g_interrupted.load() && !unavailable; ++i) {
      const auto t0 = Clock::now();
      auto r = http->Request("POST", target, json{{"count", count}}.dump());
      const auto t1 = Clock::now();
      if (!r) {
        report.Fail(row.op, r.error().message());
        continue;
      }
      if (r->status == 404 || r->status == 405 || r->status == 501) {
        unavailable = "HTTP " + std::to_string(r->status);
        break;
      }
      json doc = json::parse(r->body, nullptr, false);
      std::vector<std::string> forks;
      if (doc.is_object() && doc["sandboxes"].is_array()) {
        for (const json& s : doc["sandboxes"]) {
          if (s.is_object() && s["id"].is_string()) forks.push_back(s["id"].get<std::string>());
        }
      }
      for (const auto& id : forks) sandboxes.Add(id);
      if ((r->status != 200 && r->status != 201) || static_cast<int>(forks.size()) != count) {
        report.Fail(row.op,
                    "expected " + std::to_string(count) + " sandboxes, got " + b::Describe(*r));
        continue;
      }
      row.airlock.us.push_back(Us(t0, t1));
      // The first fork must answer and carry the file.
      if (i == 0) {
        auto check = http->Request("POST", "/v1/sandboxes/" + forks[0] + "/exec",
                                   R"({"argv":["sh","-c","cat $HOME/marker"]})");
        json result = check ? json::parse(check->body, nullptr, false) : json();
        if (!check || check->status != 200 || !result.is_object() ||
            result.value("stdout", "") != "forked\n") {
          report.Fail(row.op, "the fork does not hold its source's file: " +
                                  (check ? b::Describe(*check) : check.error().message()));
        }
      }
      for (const auto& id : forks) (void)b::DeleteSandbox(*http, id);
    }
    if (unavailable) {
      row.airlock.status = "not available";
      row.airlock.what += " (" + *unavailable + ")";
    } else if (row.airlock.us.empty()) {
      row.airlock.status = "failed";
    }
    // Baselines: N sandboxes started at once, timed as a whole.
    auto at_once = [&](Side& side, const b::WorkerFactory& worker, int samples) {
      for (int s = 0; s < samples && !g_interrupted.load(); ++s) {
        b::LevelResult r = b::RunLevel("at once", count, count, worker);
        if (!r.failures.empty()) {
          report.Fail(row.op + " baseline", r.failures.front().message);
          if (side.us.empty()) side.status = "failed";
          return;
        }
        side.us.push_back(r.wall_s * 1e6);
      }
    };
    if (env.have_bwrap) {
      row.bwrap.what = std::to_string(count) + " bwrap ... true started at once (no fork)";
      at_once(row.bwrap, CommandWorker(BwrapTrue(), "bwrap"), plan.fork_calls);
    } else {
      row.bwrap = Absent("bwrap");
    }
    if (env.have_runsc) {
      row.runsc.what = std::to_string(count) +
                       " runsc run of true started at once (checkpoint/restore not measured)";
      at_once(row.runsc, RunscWorker(env), plan.runsc_fork_samples);
    } else {
      row.runsc = Absent("runsc");
    }
    rows.push_back(std::move(row));
  }
}

// Idle airlock sandboxes: N made through the API (8 at a time), the host memory they cost, a
// check that each answers an exec, then all deleted.
json MeasureAirlockDensity(const Env& env, const Plan& plan, Report& report,
                           SandboxSet& sandboxes) {
  const int n = plan.density;
  std::fprintf(stderr, "%s: density: %d idle sandboxes...\n", kTag, n);
  WaitForQuietKernelMemory();
  const MemorySnapshot before = SettledMemory();
  const int64_t daemon_before = ProcKiB(env.daemon_pid, "status", "VmRSS:");
  std::vector<std::string> ids(static_cast<size_t>(n));
  Sweep created = ParallelCalls(env.url, 8, n, "density create", [&](HttpClient& http, int i) {
    auto id = b::CreateSandbox(http);
    if (!id) return Status(std::unexpected(id.error()));
    ids[static_cast<size_t>(i)] = *id;
    sandboxes.Add(*id);
    return Status{};
  });
  for (const auto& f : created.failures) report.failures.push_back(f);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const MemorySnapshot after = SettledMemory();
  const int64_t daemon_after = ProcKiB(env.daemon_pid, "status", "VmRSS:");
  std::set<std::string> made;
  for (const auto& id : ids) {
    if (!id.empty()) made.insert(id);
  }
  const CgroupMemory cgroups = SandboxCgroupMemory(made);
  // Every sandbox still answers.
  std::vector<std::string> made_list(made.begin(), made.end());
  Sweep alive = ParallelCalls(env.url, 8, static_cast<int>(made_list.size()), "density exec",
                              [&](HttpClient& http, int i) {
                                return b::ExecTrue(http, made_list[static_cast<size_t>(i)]);
                              });
  for (const auto& f : alive.failures) report.failures.push_back(f);
  Sweep deleted = sandboxes.Cleanup(8);
  for (const auto& f : deleted.failures) report.failures.push_back(f);

  const double count = std::max<double>(1, static_cast<double>(made.size()));
  json doc = MemoryPerSandbox(before, after, count, cgroups.pss_kib, daemon_after - daemon_before);
  doc.update(json{{"engine", "airlock"},
                  {"what", "idle sandboxes made through POST /v1/sandboxes (default limits)"},
                  {"requested", n},
                  {"created", made.size()},
                  {"alive", alive.done},
                  {"cgroup_mib_each", static_cast<double>(cgroups.usage_bytes) / (1 << 20) / count},
                  {"cgroups_found", cgroups.found},
                  {"create_s", created.wall_s},
                  {"delete_s", deleted.wall_s}});
  return doc;
}

// Idle bwrap sandboxes (`sleep infinity`), started one after another.
json MeasureBwrapDensity(const Plan& plan, Report& report) {
  const int n = plan.density;
  WaitForQuietKernelMemory();
  const MemorySnapshot before = SettledMemory();
  const auto t0 = Clock::now();
  std::vector<b::IdleBwrap> idle;
  idle.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n && !g_interrupted.load(); ++i) {
    b::IdleBwrap one;
    if (auto st = one.Start(); !st) {
      report.Fail("bwrap density", st.error().message());
      break;
    }
    idle.push_back(std::move(one));
  }
  const double create_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const MemorySnapshot after = SettledMemory();
  int64_t pss_kib = 0;  // bwrap outside, its init inside, and sleep
  for (const auto& one : idle) {
    for (pid_t pid : ProcessTree(one.pid())) pss_kib += PssKiB(pid);
  }
  const auto t1 = Clock::now();
  const size_t made = idle.size();
  idle.clear();  // kills and reaps every one
  const double delete_s = std::chrono::duration<double>(Clock::now() - t1).count();
  json doc =
      MemoryPerSandbox(before, after, std::max<double>(1, static_cast<double>(made)), pss_kib, 0);
  doc.update(json{{"engine", "bwrap"},
                  {"what", "idle bwrap --unshare-all ... sleep infinity"},
                  {"requested", n},
                  {"created", made},
                  {"create_s", create_s},
                  {"delete_s", delete_s}});
  return doc;
}

// Idle runsc sandboxes (`sleep infinity`, detached); fewer of them: each is a Sentry and a Gofer.
json MeasureRunscDensity(const Env& env, const Plan& plan, Report& report) {
  const int n = plan.runsc_density;
  WaitForQuietKernelMemory();
  const MemorySnapshot before = SettledMemory();
  const auto t0 = Clock::now();
  int made = 0;
  RunscSandboxes runsc(env.scratch + "/runsc");
  for (int i = 0; i < n && !g_interrupted.load(); ++i) {
    if (auto st = runsc.Start(env.runsc_sleep_bundle, RunscId("idle", i)); !st) {
      report.Fail("runsc density", st.error().message());
      break;
    }
    ++made;
  }
  const double create_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const MemorySnapshot after = SettledMemory();
  int64_t pss_kib = 0;  // every runsc process of this run: sandboxes (Sentry) and gofers
  for (pid_t pid : ProcessesMentioning(runsc.root())) pss_kib += PssKiB(pid);
  const auto t1 = Clock::now();
  runsc.DeleteAll();
  const double delete_s = std::chrono::duration<double>(Clock::now() - t1).count();
  json doc = MemoryPerSandbox(before, after, std::max(1, made), pss_kib, 0);
  doc.update(json{{"engine", "runsc"},
                  {"what", "idle runsc run -detach of sleep infinity"},
                  {"requested", n},
                  {"created", made},
                  {"create_s", create_s},
                  {"delete_s", delete_s}});
  return doc;
}

// ---- the report ----

std::string Ms(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, us >= 100000 ? "%.0f" : us >= 10000 ? "%.1f" : "%.2f", us / 1000);
  return buf;
}

std::string SideP50(const Side& side) {
  if (side.status == "absent") return "absent";
  if (side.status == "n/a") return "n/a";
  if (!side.measured()) return side.status;
  return Ms(side.summary().p50);
}

std::optional<double> RatioP50(const Side& airlock, const Side& baseline) {
  if (!airlock.measured() || !baseline.measured()) return std::nullopt;
  return airlock.summary().p50 / baseline.summary().p50;
}

std::string RatioText(std::optional<double> r) {
  if (!r) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, *r < 0.01 ? "%.4fx" : *r < 0.1 ? "%.3fx" : "%.2fx", *r);
  return buf;
}

std::string MetText(std::optional<bool> met) {
  if (!met) return "-";
  return *met ? "met" : "NOT met";
}

void PrintRows(const std::vector<Row>& rows) {
  std::printf("%-18s %5s %8s %8s %8s %9s %10s %10s %9s %9s  %-22s %s\n", "operation", "n", "p50 ms",
              "p90 ms", "p99 ms", "per s", "bwrap p50", "runsc p50", "vs bwrap", "vs runsc",
              "target", "");
  for (const Row& row : rows) {
    const b::Summary s = row.airlock.summary();
    std::string p50 = row.airlock.measured() ? Ms(s.p50) : row.airlock.status;
    std::string p90 = row.airlock.measured() ? Ms(s.p90) : "";
    std::string p99 = row.airlock.measured() ? Ms(s.p99) : "";
    std::string per_s = "";
    if (row.airlock.per_s > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", row.airlock.per_s);
      per_s = buf;
    }
    std::printf("%-18s %5zu %8s %8s %8s %9s %10s %10s %9s %9s  %-22s %s\n", row.op.c_str(), s.n,
                p50.c_str(), p90.c_str(), p99.c_str(), per_s.c_str(), SideP50(row.bwrap).c_str(),
                SideP50(row.runsc).c_str(), RatioText(RatioP50(row.airlock, row.bwrap)).c_str(),
                RatioText(RatioP50(row.airlock, row.runsc)).c_str(), row.target.c_str(),
                MetText(row.met).c_str());
  }
}

void PrintThroughput(const std::vector<Row>& rows) {
  std::printf("\n%-18s %12s %12s %12s %14s %14s   %s\n", "lifecycles/s", "airlock", "bwrap",
              "runsc", "airlock/bwrap", "airlock/runsc", "airlock p50 ms: create exec delete");
  for (const Row& row : rows) {
    if (!row.op.starts_with("lifecycle")) continue;
    auto per_s = [](const Side& side) -> std::string {
      if (!side.measured()) return SideP50(side);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", side.per_s);
      return buf;
    };
    auto ratio = [&](const Side& baseline) -> std::string {
      if (!row.airlock.measured() || !baseline.measured() || baseline.per_s <= 0) return "-";
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2fx", row.airlock.per_s / baseline.per_s);
      return buf;
    };
    std::string steps;
    if (row.steps.is_object()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", row.steps["create_p50_ms"].get<double>(),
                    row.steps["exec_p50_ms"].get<double>(),
                    row.steps["delete_p50_ms"].get<double>());
      steps = buf;
    }
    std::printf("%-18s %12s %12s %12s %14s %14s   %s\n", row.op.c_str(), per_s(row.airlock).c_str(),
                per_s(row.bwrap).c_str(), per_s(row.runsc).c_str(), ratio(row.bwrap).c_str(),
                ratio(row.runsc).c_str(), steps.c_str());
  }
}

void PrintDensity(const std::vector<json>& density) {
  std::printf("\n%-8s %5s %7s %6s %9s %8s %7s %8s %9s %8s %8s %8s %8s %9s\n", "density", "asked",
              "created", "alive", "avail MiB", "kern MiB", "PSS MiB", "daemon", "acct MiB",
              "MiB each", "cgroup", "create s", "delete s", "est. fit");
  for (const json& d : density) {
    auto num = [&](const char* key, const char* format) -> std::string {
      if (!d.contains(key)) return "-";
      char buf[32];
      std::snprintf(buf, sizeof buf, format, d[key].get<double>());
      return buf;
    };
    std::printf("%-8s %5d %7d %6s %9s %8s %7s %8s %9s %8s %8s %8s %8s %9s\n",
                d["engine"].get<std::string>().c_str(), d["requested"].get<int>(),
                d["created"].get<int>(),
                d.contains("alive") ? std::to_string(d["alive"].get<int>()).c_str() : "-",
                num("host_mib_each", "%.2f").c_str(), num("kernel_mib_each", "%.2f").c_str(),
                num("pss_mib_each", "%.2f").c_str(), num("daemon_rss_mib_each", "%.3f").c_str(),
                num("accounted_mib_each", "%.2f").c_str(), num("judged_mib_each", "%.2f").c_str(),
                num("cgroup_mib_each", "%.2f").c_str(), num("create_s", "%.1f").c_str(),
                num("delete_s", "%.1f").c_str(), num("est_fit", "%.0f").c_str());
  }
  std::printf(
      "(MiB per idle sandbox. avail: the fall of MemAvailable (everything, but moved by whatever "
      "else runs); kern: the rise of slab + kernel stacks + page tables + per-cpu + shmem; PSS: "
      "the sandboxes' processes, shmem left out; daemon: airlockd's RSS growth; acct = kern + "
      "PSS + daemon; MiB each = the larger of avail and acct, what the target is judged on; "
      "cgroup: the sandboxes' memory cgroups' usage. est. fit = MemAvailable before / MiB each)\n");
}

json SideJson(const Side& side) {
  json doc = {{"status", side.status}, {"what", side.what}};
  if (side.measured()) {
    // Built here, not parsed from b::Json: a name may hold quotes (the fork row's request).
    const b::Summary sum = side.summary();
    doc["summary"] = {{"name", sum.name},     {"n", sum.n},       {"p50_us", sum.p50},
                      {"p90_us", sum.p90},    {"p99_us", sum.p99}, {"mean_us", sum.mean},
                      {"min_us", sum.min},    {"max_us", sum.max}};
  }
  if (side.per_s > 0) doc["per_s"] = side.per_s;
  return doc;
}

json RowJson(const Row& row) {
  json doc = {{"op", row.op},
              {"airlock", SideJson(row.airlock)},
              {"bwrap", SideJson(row.bwrap)},
              {"runsc", SideJson(row.runsc)}};
  if (auto r = RatioP50(row.airlock, row.bwrap)) doc["ratio_p50_vs_bwrap"] = *r;
  if (auto r = RatioP50(row.airlock, row.runsc)) doc["ratio_p50_vs_runsc"] = *r;
  if (!row.target.empty()) doc["target"] = row.target;
  if (row.met) doc["met"] = *row.met;
  if (!row.steps.is_null()) doc["airlock_steps"] = row.steps;
  return doc;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0, fifteen = 0;
  in >> one >> five >> fifteen;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", one, five, fifteen);
  return buf;
}

int Run(const Flags& flags) {
  const Plan plan = MakePlan(flags);
  const std::string load_before = LoadAverage();
  b::ScratchDir scratch(kTag);  // declared first: removed after everything in it is gone
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  Env env;
  env.scratch = scratch.path();
  env.have_bwrap = b::Have("bwrap");
  env.have_runsc = b::Have("runsc");
  if (env.have_runsc) {
    env.runsc_true_bundle = env.scratch + "/bundle-true";
    env.runsc_sleep_bundle = env.scratch + "/bundle-sleep";
    for (auto [dir, args] :
         {std::pair{env.runsc_true_bundle, std::vector<std::string>{"true"}},
          std::pair{env.runsc_sleep_bundle, std::vector<std::string>{"sleep", "infinity"}}}) {
      if (auto st = b::MakeRunscBundle(dir, args); !st) {
        std::fprintf(stderr, "%s: %s; runsc left out\n", kTag, st.error().message().c_str());
        env.have_runsc = false;
      }
    }
  }
  if (!env.have_bwrap) std::fprintf(stderr, "%s: bwrap is not installed: no bwrap column\n", kTag);
  if (!env.have_runsc) std::fprintf(stderr, "%s: runsc is not installed: no runsc column\n", kTag);

  Report report;
  json pool_counts;
  b::DaemonProcess daemon(kTag, g_interrupted);
  if (auto st = daemon.Start(env.scratch + "/daemon", env.scratch + "/airlockd.log"); !st) {
    std::fprintf(stderr, "%s: starting airlockd: %s\n--- airlockd log ---\n%s", kTag,
                 st.error().message().c_str(), daemon.LogTail().c_str());
    return g_interrupted.load() ? 130 : 1;
  }
  env.url = daemon.url();
  env.daemon_pid = daemon.pid();
  {
    SandboxSet sandboxes(env.url);  // deleted (also on Ctrl-C) before the daemon stops
    Row warm{.op = "warm create"}, cold{.op = "cold create"}, exec{.op = "exec true"};
    Row warm_networked{.op = "warm create, allowlist"};
    Row networked{.op = "cold create, allowlist"};
    std::vector<Row> lifecycle_rows, fork_rows;
    // A few lifecycles first, so that the first measured create does not pay for cold caches.
    (void)b::RunLevel("warm-up", 1, 10, b::ApiWorker(env.url));

    std::fprintf(stderr, "%s: warm create...\n", kTag);
    MeasureWarmCreate(env, plan, report, warm.airlock, warm_networked.airlock, pool_counts);
    warm_networked.bwrap =
        Side{.status = "absent", .what = "no equivalent: compare with warm create"};
    warm_networked.runsc = warm_networked.bwrap;
    if (!g_interrupted.load()) {
      std::fprintf(stderr, "%s: cold create...\n", kTag);
      MeasureCreate(env, plan, report, warm, cold, networked);
    }
    if (!g_interrupted.load()) {
      std::fprintf(stderr, "%s: exec...\n", kTag);
      MeasureExec(env, plan, report, sandboxes, exec);
      for (const auto& f : sandboxes.Cleanup(1).failures) report.failures.push_back(f);
    }
    if (!g_interrupted.load()) MeasureLifecycles(env, plan, report, lifecycle_rows);
    if (!g_interrupted.load()) {
      std::fprintf(stderr, "%s: fork...\n", kTag);
      MeasureFork(env, plan, report, sandboxes, fork_rows);
      for (const auto& f : sandboxes.Cleanup(1).failures) report.failures.push_back(f);
    }
    if (!g_interrupted.load()) {
      report.density.push_back(MeasureAirlockDensity(env, plan, report, sandboxes));
    }
    if (!g_interrupted.load() && env.have_bwrap) {
      std::fprintf(stderr, "%s: density: %d idle bwrap sandboxes...\n", kTag, plan.density);
      report.density.push_back(MeasureBwrapDensity(plan, report));
    }
    if (!g_interrupted.load() && env.have_runsc) {
      std::fprintf(stderr, "%s: density: %d idle runsc sandboxes...\n", kTag, plan.runsc_density);
      report.density.push_back(MeasureRunscDensity(env, plan, report));
    }
    for (const auto& f : sandboxes.Cleanup(8).failures) report.failures.push_back(f);

    warm.target = "p50 <= 3, p99 <= 15 ms";
    if (warm.airlock.measured()) {
      const b::Summary s = warm.airlock.summary();
      warm.met = s.p50 <= 3000 && s.p99 <= 15000;
    }
    warm_networked.target = "p50 <= 1.5 x warm create p50";
    if (warm_networked.airlock.measured() && warm.airlock.measured()) {
      warm_networked.met = warm_networked.airlock.summary().p50 <= 1.5 * warm.airlock.summary().p50;
    }
    exec.target = "p50 <= 2 ms";
    if (exec.airlock.measured()) exec.met = exec.airlock.summary().p50 <= 2000;
    networked.target = "p50 <= cold create p50 + 2 ms";
    if (networked.airlock.measured() && cold.airlock.measured()) {
      networked.met = networked.airlock.summary().p50 <= cold.airlock.summary().p50 + 2000;
    }
    report.rows.push_back(std::move(warm));
    report.rows.push_back(std::move(warm_networked));
    report.rows.push_back(std::move(cold));
    report.rows.push_back(std::move(networked));
    report.rows.push_back(std::move(exec));
    for (auto& r : lifecycle_rows) report.rows.push_back(std::move(r));
    for (auto& r : fork_rows) report.rows.push_back(std::move(r));
  }
  const bool failed_before_stop = !report.failures.empty();
  if (auto st = daemon.Stop(); !st) report.Fail("stop airlockd", st.error().message());
  if (failed_before_stop || !report.failures.empty()) {
    std::fprintf(stderr, "--- end of airlockd log ---\n%s---\n", daemon.LogTail().c_str());
  }
  if (g_interrupted.load()) return 130;

  const std::string load_after = LoadAverage();
  struct utsname uts {};
  ::uname(&uts);
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("%s%s: %ld cpus, Linux %s, load average %s before, %s after\n\n", kTag,
              flags.quick ? " --quick" : "", cpus, uts.release, load_before.c_str(),
              load_after.c_str());
  PrintRows(report.rows);
  if (pool_counts.is_object()) {
    std::printf(
        "(warm creates, both rows: pool of %d full before each create; %lld hits, %lld "
        "misses)\n",
        pool_counts["pool"].get<int>(), pool_counts["hits"].get<long long>(),
        pool_counts["misses"].get<long long>());
  }
  std::printf(
      "(ms; ratios are airlock p50 / baseline p50, below 1x is faster than the baseline. "
      "Baselines: creates = a cold start of true; exec = nsenter into an idle bwrap sandbox / "
      "runsc exec; fork xN = N sandboxes started at once)\n");
  PrintThroughput(report.rows);
  PrintDensity(report.density);

  // The issue's targets, each with what was measured.
  json targets = json::array();
  auto target = [&](const std::string& name, const std::string& measured, json met) {
    std::printf("  %-46s %14s  %s\n", name.c_str(), measured.c_str(),
                met.is_null()     ? "not judged"
                : met.get<bool>() ? "met"
                                  : "NOT met");
    targets.push_back({{"target", name}, {"measured", measured}, {"met", met}});
  };
  std::printf("\ntargets (this machine)\n");
  for (const Row& row : report.rows) {
    if (row.op != "warm create" && row.op != "warm create, allowlist" && row.op != "exec true") {
      continue;
    }
    const b::Summary s = row.airlock.summary();
    std::string measured = row.airlock.measured() ? "p50 " + Ms(s.p50) : row.airlock.status;
    if (row.airlock.measured() && row.op == "warm create") measured += ", p99 " + Ms(s.p99);
    target(row.op + " " + row.target, measured, row.met ? json(*row.met) : json());
  }
  double best_per_s = 0;
  for (const Row& row : report.rows) {
    if (row.op.starts_with("lifecycle")) best_per_s = std::max(best_per_s, row.airlock.per_s);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f/s", best_per_s);
  target("lifecycles >= 100/s (best level)", buf,
         best_per_s > 0 ? json(best_per_s >= 100) : json());
  for (const json& d : report.density) {
    if (d["engine"] != "airlock") continue;
    const int alive = d["alive"].get<int>();
    const double mib = d["judged_mib_each"].get<double>();
    // One target: 1,000 at once at <= 2 MiB each. With fewer, MemAvailable's noise (other
    // processes) is larger than what is measured, so neither half is judged.
    const bool judged = plan.density >= 1000;
    target(">= 1000 idle sandboxes (made and answering)",
           std::to_string(alive) + " of " + std::to_string(plan.density),
           judged ? json(alive >= 1000) : json());
    std::snprintf(buf, sizeof buf, "%.2f MiB", mib);
    target("<= 2 MiB host memory per idle sandbox", buf, judged ? json(mib <= 2.0) : json());
  }

  if (!flags.json_path.empty()) {
    json rows = json::array();
    for (const Row& row : report.rows) rows.push_back(RowJson(row));
    json failures = json::array();
    for (const auto& f : report.failures)
      failures.push_back({{"op", f.op}, {"message", f.message}});
    json doc = {{"benchmark", "run"},
                {"quick", flags.quick},
                {"machine",
                 {{"cpus", cpus},
                  {"kernel", uts.release},
                  {"mem_total_mib", MeminfoKiB("MemTotal") / 1024},
                  {"load_before", load_before},
                  {"load_after", load_after}}},
                {"plan",
                 {{"pool", plan.pool},
                  {"warm", plan.warm},
                  {"cold", plan.cold},
                  {"exec", plan.exec},
                  {"lifecycles", plan.lifecycles},
                  {"levels", plan.levels},
                  {"fork_calls", plan.fork_calls},
                  {"density", plan.density},
                  {"runsc", plan.runsc},
                  {"runsc_density", plan.runsc_density}}},
                {"warm_pool", pool_counts},
                {"rows", std::move(rows)},
                {"density", report.density},
                {"targets", std::move(targets)},
                {"failures", std::move(failures)}};
    if (!b::WriteResults(kTag, flags.json_path, doc.dump(1))) return 1;
  }
  if (!report.failures.empty()) {
    std::fprintf(stderr, "%s: %zu failures (see above)\n", kTag, report.failures.size());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags) {
    std::fprintf(stderr, "%s: %s\nusage: %s [--quick] [--density N] [--json FILE]\n", kTag,
                 flags.error().message().c_str(), kTag);
    return 2;
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "%s: needs root (airlockd and the jail engine do)\n", kTag);
    return 1;
  }
  b::InstallSignalHandlers(kTag);
  return Run(*flags);
}
