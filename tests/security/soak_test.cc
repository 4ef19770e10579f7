// Resource bombs, churn and crash consistency against a real airlockd (shared/SECURITY.md:
// "resource bombs", "leaks under churn", "crash consistency"). Every payload's verdict and every
// figure goes to the suite's report (report.h).
//
// Short by default (for ctest); scripts/soak runs the same binary long through the environment:
//   AIRLOCK_SOAK_SECONDS      churn duration, and the crash test's (default 15)
//   AIRLOCK_SOAK_CONCURRENCY  churn and crash-test workers (default 4)
//   AIRLOCK_SOAK_KILLS        SIGKILLs of the daemon in the crash test (default 3)
//   AIRLOCK_SOAK_BOMB_SECONDS how long each bomb runs while it is measured (default 3)
//   AIRLOCK_SOAK_STRICT=1     fail on the timing targets (API p99 < 1 s, neighbour >= 50 % of
//                             its baseline, daemon RSS growth < 10 %); without it they are only
//                             reported (no timed assertions in the test suite).
// Needs root: each test skips with the reason otherwise.

#include <signal.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "client/http_client.h"
#include "common/syscall.h"
#include "security/inventory.h"
#include "security/report.h"
#include "support/airlockd.h"

namespace airlock::security {
namespace {

using namespace airlock::testing;
using client::HttpClient;
using Clock = std::chrono::steady_clock;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

struct Params {
  int seconds = EnvInt("AIRLOCK_SOAK_SECONDS", 15);
  int concurrency = EnvInt("AIRLOCK_SOAK_CONCURRENCY", 4);
  int kills = EnvInt("AIRLOCK_SOAK_KILLS", 3);
  int bomb_seconds = EnvInt("AIRLOCK_SOAK_BOMB_SECONDS", 3);
  bool strict = EnvInt("AIRLOCK_SOAK_STRICT", 0) != 0;
};
const Params& P() {
  static const Params p;
  return p;
}

constexpr double kApiP99TargetMs = 1000;
constexpr double kNeighbourTargetPercent = 50;
constexpr double kRssGrowthTargetPercent = 10;
// How long after its TTL a sandbox may still be listed after a restart: the reaper destroys
// the sandboxes that expired while the daemon was down one after another (a jail destroy takes
// 0.3-1 s on a loaded 2-core CI host), and a fresh-clone run saw one 3.4 s past its TTL.
constexpr int kTtlSlackSeconds = 6;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

std::string Fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string PassMiss(bool ok) { return ok ? "PASS" : "MISS"; }

HttpClient ClientFor(const Daemon& d) {
  auto client = HttpClient::Open("http://127.0.0.1:" + std::to_string(d.port()));
  EXPECT_TRUE(client.has_value());
  client->set_api_key(d.key());
  client->set_timeout(std::chrono::seconds(60));
  return std::move(*client);
}

// "" when it cannot be read. Not an ifstream: reading /proc/<pid>/stat of a process that has
// just ended fails with ESRCH, on which libstdc++'s filebuf throws.
std::string ReadText(const std::string& path) {
  return ReadFileToString(path).value_or("");
}

// "key N" lines (pids.events, memory.events, memory.oom_control): N, or -1.
int64_t KeyedValue(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(key + " ")) return std::atoll(line.c_str() + key.size() + 1);
  }
  return -1;
}

// Sum of user + system CPU time (in seconds) of the processes in `pids`.
double CpuSeconds(const std::vector<pid_t>& pids) {
  double ticks = 0;
  for (pid_t pid : pids) {
    const std::string stat = ReadText("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14 || i == 15) ticks += std::atof(field.c_str());  // utime, stime
    }
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The fixture: a daemon (DaemonTest), warmed up by one plain and one networked sandbox, and the
// host's inventory right after, as the baseline every leak check compares with.
class SoakTest : public DaemonTest {
 protected:
  // A /20 (1024 network slots): churn deletes faster than the kernel takes links down, and the
  // harness's /24 (64 slots) ran out in a fast run.
  std::vector<std::string> DaemonArgs() const override {
    return {"--network-subnet", "10.218." + std::to_string(::getpid() % 16 * 16) + ".0/20"};
  }
  void SetUp() override {
    DaemonTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    target_.emplace(daemon_->pid(), daemon_->state_dir(), daemon_->network_id());
    Report::Global().Note("machine: " + std::to_string(std::thread::hardware_concurrency()) +
                          " cpus; parameters: seconds=" + std::to_string(P().seconds) +
                          " concurrency=" + std::to_string(P().concurrency) +
                          " kills=" + std::to_string(P().kills) +
                          " bomb_seconds=" + std::to_string(P().bomb_seconds) +
                          (P().strict ? " strict" : " (timing targets reported only)"));
    const std::string plain = CreateSandbox();
    ASSERT_FALSE(plain.empty());
    Reply networked = daemon_->Call(http::verb::post, "/v1/sandboxes", NetworkedBody());
    networked_ = networked.status == 201;
    if (!networked_) {
      Report::Global().Note("no networked sandboxes (netns, veths, nftables not exercised): " +
                            networked.body);
    }
    for (const auto& [id, state] : Listed()) Delete(id);
    // The deletes' background work (the network maintainer, the kernel's reaping of a killed
    // sandbox's processes and cgroups) settles first.
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    do {
      baseline_ = target_->Take(daemon_->pid());
      if (baseline_.Count("netns") + baseline_.Count("veth") + baseline_.Count("nft") +
              baseline_.Count("process") + baseline_.Count("cgroup") ==
          0) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (Clock::now() < deadline);
    // Whatever the warm-up left would hide in the baseline: it must hold no sandbox's objects.
    for (const auto& o : baseline_.objects) {
      EXPECT_TRUE(o.kind != "process" && o.kind != "cgroup") << "before the test: " << o.kind
                                                              << " " << o.name;
    }
  }

  static std::string NetworkedBody() {
    return R"({"network": {"mode": "allowlist", "allow": ["allowed.test"]}})";
  }

  // 204, or 404 when it is gone already, or 409 when its TTL's destroy is under way (the leak
  // checks after it wait for that destroy to finish and fail if it leaves anything).
  void Delete(const std::string& id) {
    Reply r = daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id);
    const bool destroying = r.status == 409 && r.body.find("is destroying") != std::string::npos;
    EXPECT_TRUE(r.status == 204 || r.status == 404 || destroying)
        << id << ": " << r.status << " " << r.body;
  }

  // Leaks against the baseline, after waiting for background work to settle; recorded as one
  // verdict per kind of object.
  std::vector<HostObject> CheckNoLeaks(const std::string& klass, const std::string& when,
                                       const std::set<std::string>& live, bool compare_fds) {
    Inventory before = baseline_;
    if (!compare_fds) before.daemon_fds = -1;
    Settled s = WaitUntilNoLeaks(*target_, daemon_->pid(), before, live, std::chrono::seconds(15));
    for (const char* kind : {"process", "cgroup", "mount", "netns", "veth", "nft", "dir",
                             "daemon fds"}) {
      if (!compare_fds && std::string(kind) == "daemon fds") continue;
      std::vector<HostObject> of_kind;
      for (const auto& o : s.leaks) {
        if (o.kind == kind) of_kind.push_back(o);
      }
      Report::Global().Add(Verdict{klass, std::string("no leaked ") + kind + " " + when,
                                   of_kind.empty(),
                                   of_kind.empty() ? std::to_string(s.inventory.Count(kind)) +
                                                         " present, all in the baseline or held "
                                                         "by a live sandbox"
                                                   : Describe(of_kind, 5)});
    }
    EXPECT_TRUE(s.leaks.empty()) << when << ": leaked\n" << Describe(s.leaks);
    return s.leaks;
  }

  // A cgroup file of sandbox `id` (the first hierarchy that has it), "" if none.
  std::string CgroupFile(const std::string& id, const std::string& file) const {
    for (const auto& parent : target_->cgroup_parents()) {
      const std::string path = parent + "/" + id + "/" + file;
      if (fs::exists(path)) return path;
    }
    return "";
  }
  std::vector<pid_t> CgroupPids(const std::string& id) const {
    std::vector<pid_t> pids;
    std::istringstream in(ReadText(CgroupFile(id, "cgroup.procs")));
    for (pid_t p; in >> p;) pids.push_back(p);
    return pids;
  }

  std::optional<InventoryTarget> target_;
  Inventory baseline_;
  bool networked_ = false;
};

// ---- resource bombs ----------------------------------------------------------------------

// API latency (GET of the bomb's sandbox) and a neighbour's exec throughput over `seconds`.
struct Load {
  std::vector<double> api_ms;
  std::vector<double> exec_ms;
  int execs = 0;
  int wrong = 0;  // neighbour execs whose answer was not the expected one
  double seconds = 0;
  std::string problem;
  double rate() const { return seconds > 0 ? execs / seconds : 0; }
};

Load Measure(const Daemon& d, const std::string& bomb, const std::string& neighbour,
             double seconds) {
  Load load;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::thread prober([&] {
    HttpClient http = ClientFor(d);
    while (!stop) {
      const auto t0 = Clock::now();
      auto r = http.Request("GET", "/v1/sandboxes/" + bomb);
      const double ms = Seconds(Clock::now() - t0) * 1000;
      {
        std::lock_guard lock(mu);
        load.api_ms.push_back(ms);
        if (!r || r->status != 200) load.problem = "GET of the bomb's sandbox failed";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  HttpClient http = ClientFor(d);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds));
  for (int i = 0; Clock::now() < end; ++i) {
    const std::string token = "n" + std::to_string(i);
    const auto t0 = Clock::now();
    auto r = http.Request("POST", "/v1/sandboxes/" + neighbour + "/exec",
                          R"({"argv": ["echo", ")" + token + "\"]}");
    load.exec_ms.push_back(Seconds(Clock::now() - t0) * 1000);
    if (!r || r->status != 200 || json::parse(r->body)["stdout"] != token + "\n") {
      ++load.wrong;
    } else {
      ++load.execs;
    }
  }
  load.seconds = Seconds(Clock::now() - start);
  stop = true;
  prober.join();
  return load;
}

struct Bomb {
  std::string name;
  std::string limits;  // the bomb sandbox's create body
  std::string cmd;     // started in the background; runs until the sandbox is deleted
  bool foreground = false;  // run as a plain exec in a thread instead (the stdout flood)
};

std::vector<Bomb> Bombs() {
  return {
      {"fork bomb", R"({"pids_max": 64})",
       // Every process forks two more, forever; the pids limit holds them. A bomb burns out
       // once its forks fail, so it is lit again and again.
       "bomb() { bomb | bomb & }; while :; do bomb; sleep 0.2; done"},
      {"memory bomb", R"({"memory_mb": 128})",
       // A shell variable of 400 MB, again and again (each attempt is OOM-killed).
       "while :; do sh -c 'x=$(head -c 400000000 /dev/zero | tr \"\\0\" a); echo ${#x}'; done"},
      {"disk fill", R"({"disk_mb": 32})",
       "i=0; while :; do dd if=/dev/zero of=/home/user/fill$i bs=1M count=64 2>/dev/null; "
       "i=$((i+1)); sleep 0.05; done"},
      {"inode fill", R"({"disk_mb": 32, "memory_mb": 256})",
       "mkdir -p /home/user/d && cd /home/user/d && "
       "while :; do seq -f f%.0f 1 100000000 | xargs touch 2>/dev/null; sleep 0.05; done"},
      {"fd exhaustion", "{}",
       // Eight processes, each opening files until RLIMIT_NOFILE says no, then holding them.
       "for k in 1 2 3 4 5 6 7 8; do bash -c 'n=0; while exec {f}</dev/null; do n=$((n+1)); "
       "done 2>/dev/null; echo $n > /tmp/fds$0; sleep 1000' $k & done; wait"},
      {"CPU spin", R"({"cpus": 1})",
       "for k in 1 2 3 4; do (while :; do :; done) & done; wait"},
      {"stdout flood", "{}", "yes 'a line of stdout flood'", /*foreground=*/true},
  };
}

// For gtest's test names and failure messages.
void PrintTo(const Bomb& bomb, std::ostream* out) { *out << bomb.name; }

class BombTest : public SoakTest, public ::testing::WithParamInterface<Bomb> {};

TEST_P(BombTest, IsContainedAndTheDaemonAndANeighbourKeepWorking) {
  const Bomb& bomb = GetParam();
  const std::string klass = "resource bombs";
  const std::string id = CreateSandbox(bomb.limits);
  const std::string neighbour = CreateSandbox();
  ASSERT_FALSE(id.empty());
  ASSERT_FALSE(neighbour.empty());
  const double seconds = P().bomb_seconds;

  Load baseline = Measure(*daemon_, id, neighbour, seconds);
  ASSERT_GT(baseline.execs, 0) << "the neighbour ran nothing before the bomb";
  const int64_t rss_before = target_->Take(daemon_->pid()).daemon_rss_kb;

  // The bomb.
  std::optional<Reply> flood;
  std::thread flood_thread;
  if (bomb.foreground) {
    flood_thread = std::thread([&] {
      flood = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", bomb.cmd}, {"timeout_seconds", seconds + 1}}.dump());
    });
  } else {
    Reply started = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                                  json{{"cmd", bomb.cmd}, {"background", true}}.dump());
    ASSERT_EQ(started.status, 200) << started.body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it get going
  const auto cpu_t0 = Clock::now();
  const double cpu0 = CpuSeconds(CgroupPids(id));
  Load during = Measure(*daemon_, id, neighbour, seconds);
  const double cpu_used = CpuSeconds(CgroupPids(id)) - cpu0;
  const double cpu_wall = Seconds(Clock::now() - cpu_t0);
  const int64_t rss_during = target_->Take(daemon_->pid()).daemon_rss_kb;
  if (flood_thread.joinable()) flood_thread.join();

  // Containment, seen from the host (and, where only the inside can tell, from the sandbox).
  bool limit_hit = false;
  std::string detail;
  auto exec_in = [&](const std::string& cmd) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"timeout_seconds", 20}}.dump());
    return r.status == 200 ? r.Json()["stdout"].get<std::string>() : "HTTP " + r.body;
  };
  if (bomb.name == "fork bomb") {
    const int64_t current = std::atoll(ReadText(CgroupFile(id, "pids.current")).c_str());
    const int64_t refused = KeyedValue(ReadText(CgroupFile(id, "pids.events")), "max");
    limit_hit = refused > 0 && current <= 64;
    detail = "pids.current " + std::to_string(current) + " (max 64), forks refused " +
             std::to_string(refused);
  } else if (bomb.name == "memory bomb") {
    const std::string oom = CgroupFile(id, "memory.oom_control");
    auto oom_kills = [&] {
      return oom.empty() ? KeyedValue(ReadText(CgroupFile(id, "memory.events")), "oom_kill")
                         : KeyedValue(ReadText(oom), "oom_kill");
    };
    // On a loaded machine the first 400 MB variable may not have reached the limit within the
    // measured seconds: the bomb goes on in the background, so it is given up to 30 s more.
    int64_t kills = oom_kills();
    for (int i = 0; i < 300 && kills == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      kills = oom_kills();
    }
    const std::string peak_file = CgroupFile(id, "memory.max_usage_in_bytes").empty()
                                      ? CgroupFile(id, "memory.peak")
                                      : CgroupFile(id, "memory.max_usage_in_bytes");
    const int64_t peak = std::atoll(ReadText(peak_file).c_str());
    limit_hit = kills > 0 && peak <= (128ll << 20);
    detail = "OOM kills " + std::to_string(kills) + ", peak " + std::to_string(peak >> 20) +
             " MiB (limit 128)";
  } else if (bomb.name == "disk fill") {
    const std::string out = exec_in(
        "du -sm /home/user | cut -f1; dd if=/dev/zero of=/home/user/probe bs=1M count=1 2>&1");
    const int used = std::atoi(out.c_str());
    limit_hit = out.find("No space left on device") != std::string::npos && used <= 32 &&
                used >= 16;
    detail = "writable layer holds " + std::to_string(used) + " MiB (limit 32); a 1 MiB write: " +
             (out.find("No space") != std::string::npos ? "ENOSPC" : out);
  } else if (bomb.name == "inode fill") {
    const std::string out = exec_in(
        "df -i /home/user | tail -n 1; touch /home/user/d/probe-$$ 2>&1; echo rc=$?");
    const std::string oom = CgroupFile(id, "memory.oom_control");
    const int64_t kills = KeyedValue(ReadText(oom.empty() ? CgroupFile(id, "memory.events") : oom),
                                     "oom_kill");
    const std::string usage_file = CgroupFile(id, "memory.usage_in_bytes").empty()
                                       ? CgroupFile(id, "memory.current")
                                       : CgroupFile(id, "memory.usage_in_bytes");
    const int64_t usage = std::atoll(ReadText(usage_file).c_str());
    // The writable layer's inodes are capped with its size (one per 4 KiB: 8192 for 32 MiB).
    limit_hit = out.find("No space left on device") != std::string::npos;
    detail = "df -i: " + out.substr(0, out.find('\n')) + "; memory use " +
             std::to_string(usage >> 20) + " MiB; OOM kills " + std::to_string(kills) +
             "; a new file: " +
             (out.find("No space left") != std::string::npos ? "ENOSPC" : out.substr(out.find('\n') + 1));
  } else if (bomb.name == "fd exhaustion") {
    // Each process writes its count once RLIMIT_NOFILE stops it. A bash loop of 4096 opens is
    // slow on a loaded machine, so the eight are given up to 30 s more to get there.
    std::string out = exec_in("cat /tmp/fds* 2>/dev/null");
    for (int i = 0; i < 60 && std::count(out.begin(), out.end(), '\n') < 8; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      out = exec_in("cat /tmp/fds* 2>/dev/null");
    }
    std::istringstream counts(out);
    int n = 0, low = 1 << 30, high = 0;
    for (int c; counts >> c; ++n) {
      low = std::min(low, c);
      high = std::max(high, c);
    }
    // Each stops at RLIMIT_NOFILE (4096 by default), less the fds it had open already.
    limit_hit = n == 8 && high <= 4096 && low >= 4000;
    detail = std::to_string(n) + " processes opened " + std::to_string(low) + ".." +
             std::to_string(high) + " fds each (RLIMIT_NOFILE 4096)";
  } else if (bomb.name == "CPU spin") {
    // The quota is what holds the spinners: it must be in force (one CPU's worth per period)
    // and their use must stay under it. How much under depends on the machine's other load (a
    // busy CI host leaves the sandbox's group a small share), so the positive control is only
    // that they ran at all.
    const double cores = cpu_used / cpu_wall;
    double quota_cpus = 0;
    const std::string v1_quota = CgroupFile(id, "cpu.cfs_quota_us");
    if (!v1_quota.empty()) {
      quota_cpus = std::atof(ReadText(v1_quota).c_str()) /
                   std::atof(ReadText(CgroupFile(id, "cpu.cfs_period_us")).c_str());
    } else {
      std::istringstream max(ReadText(CgroupFile(id, "cpu.max")));
      double quota = 0, period = 0;
      if (max >> quota >> period && period > 0) quota_cpus = quota / period;
    }
    const int64_t throttled = KeyedValue(ReadText(CgroupFile(id, "cpu.stat")), "nr_throttled");
    limit_hit = quota_cpus > 0.99 && quota_cpus < 1.01 && cores <= 1.25 && cpu_used > 0;
    detail = "4 spinners used " + Fixed(cores, 2) + " cores (quota " + Fixed(quota_cpus, 2) +
             ") over " + Fixed(cpu_wall) + " s, throttled " + std::to_string(throttled) +
             " periods";
  } else if (bomb.name == "stdout flood") {
    const bool ok = flood && flood->status == 200;
    const json result = ok ? flood->Json() : json();
    const size_t got = ok ? result["stdout"].get<std::string>().size() : 0;
    const int64_t growth_mb = (rss_during - rss_before) / 1024;
    limit_hit = ok && result["truncated"] == true && got <= (16u << 20) && growth_mb < 64;
    detail = std::string("exec answered ") + (flood ? std::to_string(flood->status) : "nothing") +
             ", " + std::to_string(got >> 10) + " KiB kept, truncated " +
             (ok ? result["truncated"].dump() : "?") + "; daemon RSS +" +
             std::to_string(growth_mb) + " MiB";
  }

  // The bomb's sandbox is still deletable, the daemon alive, the neighbour working and right.
  Reply deleted = daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id);
  const bool healthy = Http(daemon_->port(), http::verb::get, "/healthz", "", std::nullopt).status == 200;
  Reply after = daemon_->Call(http::verb::post, "/v1/sandboxes/" + neighbour + "/exec",
                              R"({"argv": ["echo", "after"]})");
  const bool neighbour_ok = after.status == 200 && after.Json()["stdout"] == "after\n";
  const bool contained = limit_hit && deleted.status == 204 && healthy && neighbour_ok &&
                         during.wrong == 0 && during.problem.empty();
  detail += "; delete " + std::to_string(deleted.status) + ", daemon " +
            (healthy ? "healthy" : "NOT healthy") + ", neighbour " +
            (neighbour_ok ? "correct" : "WRONG: " + after.body) + ", neighbour errors during " +
            std::to_string(during.wrong) + (during.problem.empty() ? "" : ", " + during.problem);
  Report::Global().Add(Verdict{klass, bomb.name, contained, detail});
  EXPECT_TRUE(limit_hit) << bomb.name << ": " << detail;
  EXPECT_EQ(deleted.status, 204) << deleted.body;
  EXPECT_TRUE(healthy);
  EXPECT_TRUE(neighbour_ok) << after.body;
  EXPECT_EQ(during.wrong, 0) << "neighbour execs that failed or answered wrong during the bomb";
  EXPECT_TRUE(during.problem.empty()) << during.problem;

  // The figures, against the targets.
  const double p50 = Percentile(during.api_ms, 50), p99 = Percentile(during.api_ms, 99);
  const double exec_p99 = Percentile(during.exec_ms, 99);
  const double share = 100.0 * during.rate() / baseline.rate();
  Report::Global().Add(Figure{"API p50 during " + bomb.name, p50, "ms",
                              std::to_string(during.api_ms.size()) + " GETs of the bomb's sandbox"});
  Report::Global().Add(Figure{"API p99 during " + bomb.name, p99, "ms",
                              "target < 1000 ms: " + PassMiss(p99 < kApiP99TargetMs) +
                                  " (before the bomb: " +
                                  Fixed(Percentile(baseline.api_ms, 99)) + " ms)"});
  Report::Global().Add(Figure{"neighbour exec p99 during " + bomb.name, exec_p99, "ms",
                              "before the bomb: " + Fixed(Percentile(baseline.exec_ms, 99)) + " ms"});
  Report::Global().Add(Figure{"neighbour throughput during " + bomb.name, share, "%",
                              "of its baseline (" + Fixed(baseline.rate()) + " -> " +
                                  Fixed(during.rate()) + " execs/s); target >= 50 %: " +
                                  PassMiss(share >= kNeighbourTargetPercent)});
  if (P().strict) {
    EXPECT_LT(p99, kApiP99TargetMs) << "API p99 during " << bomb.name;
    EXPECT_GE(share, kNeighbourTargetPercent) << "neighbour throughput during " << bomb.name;
  }

  Delete(neighbour);
  CheckNoLeaks(klass, "after " + bomb.name, {}, /*compare_fds=*/true);
}

INSTANTIATE_TEST_SUITE_P(Soak, BombTest, ::testing::ValuesIn(Bombs()),
                         [](const ::testing::TestParamInfo<Bomb>& param_info) {
                           std::string name;
                           for (char c : param_info.param.name) {
                             if (std::isalnum(static_cast<unsigned char>(c))) name += c;
                           }
                           return name;
                         });

// ---- churn and crash consistency -------------------------------------------------------------

// What the clients were told, across daemon restarts.
struct Ledger {
  std::mutex mu;
  struct Created {
    Clock::time_point sent, acked;
    int ttl = 0;  // 0: the default hour
  };
  std::map<std::string, Created> created;  // 201 seen
  std::set<std::string> deleted;           // 204 seen
  std::set<std::string> delete_unanswered;
  std::vector<std::string> problems;
  int cycles = 0;
};

// One worker: create (every third with a network allowlist, every third with a short TTL that
// it leaves to expire), run a command and check its answer, write and read a file, delete.
// Stops when `stop` is set or the daemon is gone.
void Worker(const Daemon& d, int w, bool networked, const std::atomic<bool>& stop,
            Ledger& ledger) {
  HttpClient http = ClientFor(d);
  std::mt19937 rng(static_cast<unsigned>(w * 7919 + ::getpid()));
  for (int i = 0; !stop; ++i) {
    const int kind = static_cast<int>(rng() % 3);
    json body = json::object();
    int ttl = 0;
    if (kind == 1 && networked) {
      body["network"] = {{"mode", "allowlist"}, {"allow", {"allowed.test"}}};
    } else if (kind == 2) {
      ttl = 2 + static_cast<int>(rng() % 3);
      body["ttl_seconds"] = ttl;
    }
    const auto sent = Clock::now();
    auto r = http.Request("POST", "/v1/sandboxes", body.dump());
    if (!r) return;  // the daemon is gone
    if (r->status != 201) {
      std::lock_guard lock(ledger.mu);
      ledger.problems.push_back("create: " + std::to_string(r->status) + " " + r->body);
      continue;
    }
    const std::string id = json::parse(r->body)["id"];
    {
      std::lock_guard lock(ledger.mu);
      ledger.created[id] = {sent, Clock::now(), ttl};
    }
    const std::string base = "/v1/sandboxes/" + id;
    const std::string token = "w" + std::to_string(w) + "-" + std::to_string(i);
    auto exec = http.Request("POST", base + "/exec", R"({"argv": ["echo", ")" + token + "\"]}");
    if (!exec) return;
    auto put = http.Request("PUT", base + "/files?path=t.txt", token, "application/octet-stream");
    if (!put) return;
    auto got = http.Request("GET", base + "/files?path=t.txt");
    if (!got) return;
    // A short TTL may end the sandbox under the worker's feet: then 404 is the right answer.
    const bool expired_ok = ttl > 0 && Seconds(Clock::now() - sent) > ttl - 0.5;
    if (!expired_ok && (exec->status != 200 || json::parse(exec->body)["stdout"] != token + "\n" ||
                        put->status != 200 || got->status != 200 || got->body != token)) {
      std::lock_guard lock(ledger.mu);
      ledger.problems.push_back(id + ": exec " + std::to_string(exec->status) + " " +
                                exec->body.substr(0, 200) + ", file " +
                                std::to_string(got->status));
    }
    if (ttl > 0) {
      std::lock_guard lock(ledger.mu);
      ++ledger.cycles;
      continue;  // left to the reaper
    }
    auto del = http.Request("DELETE", base);
    std::lock_guard lock(ledger.mu);
    if (!del) {
      ledger.delete_unanswered.insert(id);
      return;
    }
    if (del->status == 204) {
      ledger.deleted.insert(id);
      ++ledger.cycles;
    } else {
      ledger.problems.push_back(id + ": delete " + std::to_string(del->status) + " " + del->body);
    }
  }
}

// The churn workers: stopped and joined however the test body ends, so that a failure or an
// exception in it is reported as such (a joinable std::thread destroyed would abort the binary
// and leave its daemon running).
class Workers {
 public:
  Workers(const Daemon& d, int count, bool networked, Ledger& ledger) {
    for (int w = 0; w < count; ++w) {
      threads_.emplace_back([&d, w, networked, &ledger, this] {
        Worker(d, w, networked, stop_, ledger);
      });
    }
  }
  ~Workers() { StopAndJoin(); }
  void StopAndJoin() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

TEST_F(SoakTest, ChurnLeavesNothingBehind) {
  const std::string klass = "leaks under churn";
  Ledger ledger;
  const auto start = Clock::now();
  Workers workers(*daemon_, P().concurrency, networked_, ledger);
  // RSS after a quarter of the run (warm: allocator arenas, caches, thread stacks), and at the end.
  std::this_thread::sleep_for(std::chrono::milliseconds(P().seconds * 250));
  const int64_t rss_warm = target_->Take(daemon_->pid()).daemon_rss_kb;
  int64_t rss_peak = rss_warm;
  // The inventory's positive control: mid-churn it must see the sandboxes' objects.
  std::map<std::string, size_t> seen;
  const char* kKinds[] = {"process", "cgroup", "dir", "netns", "veth", "nft"};
  while (Clock::now() < start + std::chrono::seconds(P().seconds)) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const Inventory now = target_->Take(daemon_->pid());
    rss_peak = std::max(rss_peak, now.daemon_rss_kb);
    for (const char* kind : kKinds) seen[kind] = std::max(seen[kind], now.Count(kind));
  }
  workers.StopAndJoin();
  const double run_seconds = Seconds(Clock::now() - start);
  // The short-TTL sandboxes expire on their own.
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (!Listed().empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(Listed().empty()) << "sandboxes left after every delete and TTL";
  for (const auto& p : ledger.problems) ADD_FAILURE() << p;
  Report::Global().Add(Verdict{klass, "every churn call answered right", ledger.problems.empty(),
                               ledger.problems.empty()
                                   ? std::to_string(ledger.cycles) + " cycles"
                                   : std::to_string(ledger.problems.size()) +
                                         " problems; first: " + ledger.problems.front()});
  CheckNoLeaks(klass, "after churn", {}, /*compare_fds=*/true);
  const int64_t rss_end = target_->Take(daemon_->pid()).daemon_rss_kb;
  const double growth = 100.0 * static_cast<double>(rss_end - rss_warm) /
                        static_cast<double>(rss_warm);
  Report::Global().Add(Figure{"churn cycles", static_cast<double>(ledger.cycles), "count",
                              std::to_string(P().concurrency) + " workers, " +
                                  Fixed(run_seconds) + " s, every third networked, every third "
                                  "with a short TTL"});
  Report::Global().Add(Figure{"churn throughput", ledger.cycles / run_seconds, "cycles/s", ""});
  Report::Global().Add(Figure{"daemon RSS growth after warm-up", growth, "%",
                              std::to_string(rss_warm / 1024) + " -> " +
                                  std::to_string(rss_end / 1024) + " MiB (peak " +
                                  std::to_string(rss_peak / 1024) + "); target < 10 %: " +
                                  PassMiss(growth < kRssGrowthTargetPercent)});
  Report::Global().Add(Figure{"daemon fds after churn",
                              static_cast<double>(target_->Take(daemon_->pid()).daemon_fds),
                              "count",
                              "before: " + std::to_string(baseline_.daemon_fds)});
  std::string seen_text;
  for (const char* kind : kKinds) {
    seen_text += std::string(kind) + " " + std::to_string(seen[kind]) + " ";
    if (networked_ || std::string_view(kind) == "process" || std::string_view(kind) == "cgroup" ||
        std::string_view(kind) == "dir") {
      EXPECT_GT(seen[kind], 0u) << "the inventory never saw a sandbox's " << kind;
    }
  }
  Report::Global().Note("inventory during churn (most seen at once): " + seen_text);
  EXPECT_GT(ledger.cycles, P().concurrency) << "the workers made no progress";
  if (P().strict) {
    EXPECT_LT(growth, kRssGrowthTargetPercent) << "daemon RSS growth";
  }
}

TEST_F(SoakTest, SigkillDuringChurnLosesNothingAndOrphansNothing) {
  const std::string klass = "crash consistency";
  Ledger ledger;
  std::mt19937 rng(std::random_device{}());
  const double interval = std::max(1.0, static_cast<double>(P().seconds) / P().kills);
  int lost = 0, resurrected = 0, ttl_missed = 0, orphan_rounds = 0, checked_ttl = 0;
  std::vector<double> restart_ms;
  for (int round = 0; round < P().kills; ++round) {
    Workers workers(*daemon_, P().concurrency, networked_, ledger);
    // A random moment: anywhere from early in a create to late in the interval.
    std::uniform_real_distribution<double> when(0.3, 2 * interval - 0.3);
    std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
    const int status = daemon_->Stop(SIGKILL);
    workers.StopAndJoin();
    ASSERT_TRUE(WIFSIGNALED(status));
    // Down for a while: short TTLs pass meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 1500));
    const auto t0 = Clock::now();
    ASSERT_TRUE(daemon_->Start()) << "round " << round;
    restart_ms.push_back(Seconds(Clock::now() - t0) * 1000);
    // The reaper's first pass runs at start; a second one a second later.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));

    std::set<std::string> live;
    for (const auto& [id, state] : Listed()) {
      if (state == "running") live.insert(id);
    }
    std::lock_guard lock(ledger.mu);
    for (const auto& [id, c] : ledger.created) {
      // The answer describes a moment between these two: a TTL counts as passed only if it
      // had before the call, and as not yet passed only if it had not after it (checking
      // thousands of records takes seconds, during which short TTLs pass).
      const auto asked = Clock::now();
      Reply r = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id);
      const auto answered = Clock::now();
      const bool present = r.status == 200 && r.Json().value("state", "") == "running";
      // Ended: its record says so until it is purged.
      const bool gone = r.status == 200 && r.Json().value("state", "") == "destroyed";
      if (ledger.deleted.contains(id)) {
        if (!gone) {
          ++resurrected;
          ADD_FAILURE() << id << " was deleted (204) but is back: " << r.body;
        }
      } else if (ledger.delete_unanswered.contains(id)) {
        EXPECT_TRUE(gone || present) << id << ": " << r.body;
      } else if (c.ttl > 0 && asked > c.acked + std::chrono::seconds(c.ttl + kTtlSlackSeconds)) {
        ++checked_ttl;
        if (!gone) {
          ++ttl_missed;
          ADD_FAILURE() << id << ": its TTL of " << c.ttl << " s passed "
                        << Seconds(asked - c.acked) - c.ttl << " s ago, but: " << r.body;
        }
      } else if (c.ttl == 0 || answered < c.sent + std::chrono::seconds(c.ttl) -
                                              std::chrono::milliseconds(500)) {
        if (!present) {
          ++lost;
          ADD_FAILURE() << id << " was acknowledged (201) but is lost: " << r.body;
        }
      }
    }
    // Nothing on the host but what the listed sandboxes hold (the daemon is new: fds differ).
    Inventory before = baseline_;
    before.daemon_fds = -1;
    Settled s = WaitUntilNoLeaks(*target_, daemon_->pid(), before, live, std::chrono::seconds(15));
    if (!s.leaks.empty()) {
      ++orphan_rounds;
      ADD_FAILURE() << "round " << round << ": orphans\n" << Describe(s.leaks);
    }
    if (HasFailure()) break;
  }
  std::lock_guard lock(ledger.mu);
  for (const auto& p : ledger.problems) ADD_FAILURE() << p;
  const std::string totals = std::to_string(ledger.created.size()) + " acknowledged creates, " +
                             std::to_string(ledger.deleted.size()) + " acknowledged deletes, " +
                             std::to_string(restart_ms.size()) + " SIGKILLs";
  Report::Global().Add(Verdict{klass, "no acknowledged create lost", lost == 0,
                               std::to_string(lost) + " lost of " + totals});
  Report::Global().Add(Verdict{klass, "no acknowledged delete undone", resurrected == 0,
                               std::to_string(resurrected) + " back"});
  Report::Global().Add(Verdict{klass, "TTLs honoured across restarts", ttl_missed == 0,
                               std::to_string(ttl_missed) + " of " + std::to_string(checked_ttl) +
                                   " checks (each restart checks every expired sandbox) found "
                                   "one still there"});
  Report::Global().Add(Verdict{klass, "no orphan after each restart", orphan_rounds == 0,
                               std::to_string(orphan_rounds) + " rounds with orphans"});
  Report::Global().Add(Figure{"SIGKILLs", static_cast<double>(restart_ms.size()), "count",
                              totals + " (" + std::to_string(P().kills) + " planned)"});
  Report::Global().Add(Figure{"restart to listening p50", Percentile(restart_ms, 50), "ms",
                              "recovery included"});
  Report::Global().Add(Figure{"restart to listening max",
                              restart_ms.empty() ? NAN
                                                 : *std::max_element(restart_ms.begin(),
                                                                     restart_ms.end()),
                              "ms", ""});
  EXPECT_FALSE(ledger.created.empty()) << "no create was acknowledged";
  EXPECT_FALSE(ledger.deleted.empty()) << "no delete was acknowledged";
  if (HasFailure()) return;
  // Then everything goes, and the host is as it was.
  for (const auto& [id, state] : Listed()) Delete(id);
  CheckNoLeaks(klass, "after the crash rounds and deletes", {}, /*compare_fds=*/false);
}

}  // namespace
}  // namespace airlock::security

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new airlock::security::ReportEnvironment(
      "soak", "Airlock soak: resource bombs, churn, crash consistency"));
  return airlock::security::RunAllTestsForCtest();
}
