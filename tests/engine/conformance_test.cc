// The engine conformance suite (docs/design/engines.md, "Conformance"): one black-box suite run
// over every engine this machine can build (the jail when root; the FakeEngine of
// tests/support/fake_engine.h always). Each test names the capabilities it needs: an engine
// that lacks one skips the test, saying which; an engine that claims one must pass it, since the
// check is made on the effect (from inside the sandbox, or through its agent), never on what
// the engine says.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "protocol/client.h"
#include "runtime/engine.h"
#include "runtime/gvisor/gvisor_engine.h"
#include "runtime/jail/jail_engine.h"
#include "runtime/layer_store.h"
#include "support/fake_engine.h"
#include "support/slot.h"

namespace airlock {
namespace {

namespace fs = std::filesystem;

// Skips the test unless the engine claims the capability (a Capabilities field).
#define NEEDS(capability)  \
  if (!can().capability) \
  GTEST_SKIP() << "the " << GetParam().name << " engine lacks the capability " #capability
// Skips the test unless the engine's commands run in a sandbox of their own: the test's commands
// work as root on system paths, which on an engine without isolation would change the host.
#define NEEDS_ISOLATION()   \
  if (!GetParam().isolated) \
  GTEST_SKIP() << "the " << GetParam().name                                        \
               << " engine runs commands on the host: this test's would change it"
namespace p = protocol;
using runtime::Capabilities;
using runtime::Engine;

// How a test makes its engine: a fresh instance on a state dir (a second instance on the same
// dir stands for a restarted daemon). `missing` says why this machine cannot have it.
struct EngineMaker {
  std::string name;
  bool isolated = true;  // its commands run in a sandbox, not on the host
  // Create-and-destroy cycles of the leak test: fewer where a cycle costs more (gVisor's is a
  // quarter of a second against the jail's 15 ms); a leak of one cycle shows in any number.
  int leak_cycles = 200;
  std::function<std::string()> missing;
  std::function<Result<std::unique_ptr<Engine>>(const std::string& state_dir,
                                                const runtime::LayerStore* layers)>
      make;
};

// gtest prints a parameter in the test's listing (and ctest in its names): the engine's name,
// not the object's bytes.
void PrintTo(const EngineMaker& maker, std::ostream* out) { *out << maker.name; }

std::vector<EngineMaker> Makers() {
  return {
      {"jail", /*isolated=*/true, /*leak_cycles=*/200,
       [] { return ::geteuid() == 0 ? std::string() : std::string("the jail needs root"); },
       [](const std::string& dir, const runtime::LayerStore* layers)
           -> Result<std::unique_ptr<Engine>> {
         jail::JailOptions o;
         o.state_dir = dir;
         // Host uid ranges of this test process's own, below the daemons' (which start at 2^30):
         // 32 per slot, so that the suite runs beside the end-to-end tests and other
         // processes of itself without two sandboxes sharing a range.
         o.uid_first = (1u << 29) + static_cast<uid_t>(testing::TestSlot()) * 32 * 65536;
         o.uid_slots = 32;
         o.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
         o.agent_path = AIRLOCK_AGENT_PATH;
         o.layers = layers;
         auto engine = jail::JailEngine::Open(o);
         if (!engine) return std::unexpected(engine.error());
         return std::unique_ptr<Engine>(std::move(*engine));
       }},
      {"gvisor", /*isolated=*/true, /*leak_cycles=*/40,
       [] {
         if (::geteuid() != 0) return std::string("gVisor needs root");
         if (::access("/usr/bin/runsc", X_OK) != 0 && ::access("/usr/sbin/runsc", X_OK) != 0) {
           return std::string("runsc (gVisor) is not installed");
         }
         return std::string();
       },
       [](const std::string& dir, const runtime::LayerStore* layers)
           -> Result<std::unique_ptr<Engine>> {
         gvisor::GvisorOptions o;
         o.state_dir = dir;
         o.agent_path = AIRLOCK_AGENT_PATH;
         o.layers = layers;
         auto engine = gvisor::GvisorEngine::Open(o);
         if (!engine) return std::unexpected(engine.error());
         return std::unique_ptr<Engine>(std::move(*engine));
       }},
      {"fake", /*isolated=*/false, /*leak_cycles=*/200, [] { return std::string(); },
       [](const std::string& dir, const runtime::LayerStore* layers)
           -> Result<std::unique_ptr<Engine>> {
         return std::unique_ptr<Engine>(
             std::make_unique<testing::FakeEngine>(dir, AIRLOCK_AGENT_PATH, layers));
       }},
  };
}

class EngineConformance : public ::testing::TestWithParam<EngineMaker> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().missing(); !why.empty()) GTEST_SKIP() << why;
    char tmpl[] = "/tmp/airlock-conformance-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    layers_ = std::make_unique<runtime::LayerStore>(dir_ + "/layers", dir_ + "/staging");
    ASSERT_TRUE(layers_->Prepare());
    auto made = GetParam().make(dir_, layers_.get());
    ASSERT_TRUE(made) << made.error().message();
    engine_ = std::move(*made);
    auto probed = engine_->Probe();
    ASSERT_TRUE(probed) << "its probe fails here: " << probed.error().message();
  }
  void TearDown() override {
    if (engine_) {
      for (const std::string& id : made_) EXPECT_TRUE(engine_->Destroy(id)) << id;
      auto left = engine_->ListSandboxes();
      EXPECT_TRUE(left && left->empty()) << "a sandbox outlived its test";
    }
    engine_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  const Capabilities& can() const { return engine_->capabilities(); }

  struct Box {
    std::string id;
    std::string engine_state;
    std::optional<p::BlockingClient> client;
  };
  Box Make(runtime::SandboxSpec spec = {}) {
    spec.id = NewSandboxId();
    auto sandbox = engine_->Create(spec);
    EXPECT_TRUE(sandbox) << (sandbox ? "" : sandbox.error().message());
    Box box{spec.id, ""};
    if (!sandbox) return box;
    made_.push_back(spec.id);
    box.engine_state = (*sandbox)->info().engine_state;
    auto client = p::BlockingClient::Connect((*sandbox)->TakeAgentChannel());
    EXPECT_TRUE(client) << (client ? "" : client.error().message());
    if (client) box.client.emplace(std::move(*client));
    return box;
  }
  void Destroy(const std::string& id) {
    EXPECT_TRUE(engine_->Destroy(id));
    std::erase(made_, id);
  }
  static p::ExecResult Run(p::BlockingClient& client, const std::string& shell,
                           const std::string& user = "") {
    p::Exec e;
    e.shell = shell;
    e.user = user;
    e.timeout_ms = 30000;
    auto r = client.Exec(e);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? std::move(*r) : p::ExecResult{};
  }
  static p::ExecResult Run(Box& box, const std::string& shell, const std::string& user = "") {
    if (!box.client) {
      ADD_FAILURE() << "no agent";
      return {};
    }
    return Run(*box.client, shell, user);
  }

  // What the host holds of sandbox `id`, found without asking the engine: mounts that name it
  // (in this process's mount namespace, the host's), cgroups named after it, paths under the
  // state dir named after it, and processes in a cgroup named after it.
  struct Traces {
    std::vector<std::string> mounts, cgroups, paths, processes;
    bool empty() const {
      return mounts.empty() && cgroups.empty() && paths.empty() && processes.empty();
    }
    std::string Describe() const {
      std::string out;
      for (const auto& [kind, list] : {std::pair{"mount", &mounts}, {"cgroup", &cgroups},
                                       {"path", &paths}, {"process", &processes}}) {
        for (const std::string& item : *list) out += std::string(kind) + " " + item + "\n";
      }
      return out;
    }
  };
  Traces HostTraces(const std::string& id) const {
    Traces t;
    std::ifstream mountinfo("/proc/self/mountinfo");
    for (std::string line; std::getline(mountinfo, line);) {
      if (line.find(id) != std::string::npos) t.mounts.push_back(line);
    }
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(
             "/sys/fs/cgroup", fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && it->path().filename().string().find(id) != std::string::npos) {
        t.cgroups.push_back(it->path());
      }
    }
    ec.clear();
    for (auto it = fs::recursive_directory_iterator(dir_, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename().string().find(id) != std::string::npos) {
        t.paths.push_back(it->path());
        if (it->is_directory(ec)) it.disable_recursion_pending();
      }
    }
    ec.clear();
    for (const auto& entry : fs::directory_iterator("/proc", ec)) {
      const std::string pid = entry.path().filename();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream cgroup(entry.path() / "cgroup");
      std::stringstream text;
      text << cgroup.rdbuf();
      if (text.str().find(id) != std::string::npos) t.processes.push_back(pid);
    }
    return t;
  }

  std::string dir_;
  std::unique_ptr<runtime::LayerStore> layers_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::string> made_;
};

TEST_P(EngineConformance, ASandboxRunsCommandsThroughItsAgentAndGoesWhole) {
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto r = Run(box, "echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.stdout_data, "out\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  EXPECT_EQ(r.exit.exit_code, 3);
  // More channels, at once, to the same agent.
  auto second = engine_->ConnectAgent(box.id);
  ASSERT_TRUE(second) << second.error().message();
  auto other = p::BlockingClient::Connect(std::move(*second));
  ASSERT_TRUE(other) << other.error().message();
  EXPECT_EQ(Run(*other, "echo two").stdout_data, "two\n");
  // Files through the agent, relative to nothing: absolute paths in the sandbox.
  ASSERT_TRUE(box.client->WriteFile("/tmp/f", "data"));
  EXPECT_EQ(box.client->ReadFile("/tmp/f").value_or(""), "data");

  auto listed = engine_->ListSandboxes();
  ASSERT_TRUE(listed);
  EXPECT_NE(std::ranges::find(*listed, box.id), listed->end());
  Destroy(box.id);
  listed = engine_->ListSandboxes();
  ASSERT_TRUE(listed);
  EXPECT_EQ(std::ranges::find(*listed, box.id), listed->end()) << "listed after its destroy";
  EXPECT_FALSE(engine_->ConnectAgent(box.id)) << "an agent reached after its destroy";
  EXPECT_TRUE(engine_->Destroy(box.id)) << "a second destroy succeeds";
}

TEST_P(EngineConformance, ASecondCreateOfTheSameIdIsRefusedAndHarmsNothing) {
  Box box = Make();
  runtime::SandboxSpec spec;
  spec.id = box.id;
  auto again = engine_->Create(spec);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(Run(box, "echo still here").stdout_data, "still here\n");
  // Bad ids never become paths.
  for (const char* bad : {"../../etc", "", "sbx-/x", "sbx-a b"}) {
    spec.id = bad;
    auto refused = engine_->Create(spec);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/etc")) << "a path made from a bad id";
}

// Destroy ends every process, unmounts, removes the cgroups and the files, as seen from the host
// without asking the engine; a second destroy succeeds.
TEST_P(EngineConformance, ADestroyLeavesNothingOnTheHost) {
  Box box = Make();
  EXPECT_EQ(Run(box, "sleep 100 & sleep 100 & echo started").stdout_data, "started\n");
  // The control: the search finds the live sandbox (on an engine with limits, processes by
  // their cgroup: the jail's agent and sleeps, gVisor's Sentry and gofer).
  const Traces live = HostTraces(box.id);
  EXPECT_FALSE(live.paths.empty()) << "nothing of a live sandbox under the state dir";
  if (can().limits) {
    EXPECT_FALSE(live.processes.empty()) << live.Describe();
  }
  Destroy(box.id);
  const Traces left = HostTraces(box.id);
  EXPECT_TRUE(left.empty()) << "left after the destroy:\n" << left.Describe();
  EXPECT_TRUE(engine_->Destroy(box.id)) << "a second destroy must succeed";
}

// A sandbox whose processes are killed from outside (the host's OOM killer, an operator) is not
// alive, and the engine says so with a reason the daemon records.
TEST_P(EngineConformance, ASandboxKilledFromOutsideIsNotAlive) {
  NEEDS_ISOLATION();
  Box box = Make();
  ASSERT_TRUE(engine_->Alive(box.id)) << "the control: a sandbox that runs";
  const Traces live = HostTraces(box.id);
  ASSERT_FALSE(live.processes.empty()) << live.Describe();
  for (const std::string& pid : live.processes) ::kill(std::stoi(pid), SIGKILL);
  Status alive;
  for (int i = 0; i < 500 && (alive = engine_->Alive(box.id)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(alive) << "still alive 10 s after its processes were killed";
  EXPECT_EQ(alive.error().code(), ErrorCode::kFailedPrecondition) << alive.error().message();
  EXPECT_FALSE(alive.error().message().empty());
  // What is left of it goes with its destroy.
  Destroy(box.id);
  EXPECT_TRUE(HostTraces(box.id).empty()) << HostTraces(box.id).Describe();
  Status unknown = engine_->Alive(NewSandboxId());
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), ErrorCode::kNotFound) << unknown.error().message();
}

TEST_P(EngineConformance, ManyCyclesLeakNothing) {
  const auto fds = [] {
    std::error_code ec;
    return std::distance(fs::directory_iterator("/proc/self/fd", ec), fs::directory_iterator());
  };
  const auto fds_before = fds();
  std::vector<std::string> ids;
  for (int i = 0; i < GetParam().leak_cycles; ++i) {
    runtime::SandboxSpec spec;
    spec.id = NewSandboxId();
    auto sandbox = engine_->Create(spec);
    ASSERT_TRUE(sandbox) << "cycle " << i << ": " << sandbox.error().message();
    made_.push_back(spec.id);
    ids.push_back(spec.id);
    {
      auto client = p::BlockingClient::Connect((*sandbox)->TakeAgentChannel());
      ASSERT_TRUE(client) << "cycle " << i << ": " << client.error().message();
      ASSERT_TRUE(client->Ping(static_cast<uint64_t>(i)));
    }
    Destroy(spec.id);
  }
  EXPECT_EQ(fds(), fds_before) << "descriptors of this process";
  for (const std::string& id : {ids.front(), ids[ids.size() / 2], ids.back()}) {
    const Traces left = HostTraces(id);
    EXPECT_TRUE(left.empty()) << id << ":\n" << left.Describe();
  }
  auto listed = engine_->ListSandboxes();
  ASSERT_TRUE(listed);
  EXPECT_TRUE(listed->empty());
}

TEST_P(EngineConformance, ItsProbeLeavesNothing) {
  const auto entries = [this] {
    std::set<std::string> all;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      all.insert(it->path());
    }
    return all;
  };
  const auto before = entries();
  ASSERT_TRUE(engine_->Probe());
  EXPECT_EQ(entries(), before) << "the probe left files in the state dir";
  auto listed = engine_->ListSandboxes();
  ASSERT_TRUE(listed);
  EXPECT_TRUE(listed->empty()) << "the probe left a sandbox";
}

TEST_P(EngineConformance, TheGuestContractHolds) {
  Box box = Make();
  // docs/design/guest.md: the home directory exists; the sandbox's env reaches commands.
  EXPECT_TRUE(box.client->Stat("/home/user")) << "no /home/user";
  runtime::SandboxSpec spec;
  spec.env = {"GREETING=hello from the spec"};
  Box with_env = Make(spec);
  EXPECT_EQ(Run(with_env, "echo \"$GREETING\"").stdout_data, "hello from the spec\n");
  EXPECT_EQ(Run(box, "echo \"${GREETING:-unset}\"").stdout_data, "unset\n")
      << "the control: another sandbox's env is not this one's";
}

TEST_P(EngineConformance, AMemoryLimitKillsOnlyInsideThatSandbox) {
  NEEDS(limits);
  runtime::SandboxSpec spec;
  spec.limits.memory_mb = 64;
  Box box = Make(spec);
  Box neighbour = Make();
  // 16 MiB fits (the control); a shell holding 200 MB of output in a variable does not, and the
  // exec result says the OOM killer ended it.
  auto small = Run(box, "python3 -c 'b = bytearray(16 << 20); print(len(b) >> 20)'");
  EXPECT_EQ(small.stdout_data, "16\n") << small.stderr_data;
  auto big = Run(box, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}");
  EXPECT_EQ(big.exit.term_signal, SIGKILL) << big.stdout_data << big.stderr_data;
  EXPECT_TRUE(big.exit.oom_killed) << "the exec result must say the OOM killer ended it";
  // The sandbox goes on, and its next command is not reported as killed.
  auto fine = Run(box, "echo alive");
  EXPECT_EQ(fine.stdout_data, "alive\n");
  EXPECT_FALSE(fine.exit.oom_killed);
  auto roomy = Run(neighbour, "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}");
  EXPECT_EQ(roomy.stdout_data, "100000000\n") << "the neighbour (512 MiB) was held too";
  EXPECT_FALSE(roomy.exit.oom_killed);
}

// Forks until the kernel refuses; the count of children alive at once (each sleeps, then all
// are killed).
constexpr const char* kForkCount = R"(python3 -c '
import os, signal
kids = []
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    kids.append(pid)
print(len(kids))
for k in kids:
    os.kill(k, signal.SIGKILL)
')";

TEST_P(EngineConformance, APidsLimitHoldsFromTheCreate) {
  NEEDS(limits);
  runtime::SandboxSpec spec;
  spec.limits.pids_max = 24;
  Box box = Make(spec);
  Box control = Make();  // the default: 256
  auto capped = Run(box, kForkCount);
  auto free = Run(control, kForkCount);
  EXPECT_EQ(free.stdout_data, "100\n") << "the control: 100 processes fit in 256; "
                                       << free.stderr_data;
  ASSERT_FALSE(capped.stdout_data.empty()) << capped.stderr_data;
  EXPECT_LT(std::stoi(capped.stdout_data), 24) << "more processes than pids_max";
  EXPECT_GT(std::stoi(capped.stdout_data), 0) << "the control: some forks succeed";
}

TEST_P(EngineConformance, ACpuQuotaHoldsFromTheCreate) {
  NEEDS(limits);
  runtime::SandboxSpec spec;
  spec.limits.cpus = 0.25;
  Box box = Make(spec);
  // Two busy threads for 2 s of wall time: at most 0.5 s of CPU under a quarter of a core (plus
  // a period's slack). Only the upper bound is held: a loaded host may give it less, never more.
  auto r = Run(box, R"(python3 -c '
import os, threading, time
end = time.monotonic() + 2
def spin():
    while time.monotonic() < end:
        pass
ts = [threading.Thread(target=spin) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
t = os.times()
print(t.user + t.system)
')");
  ASSERT_FALSE(r.stdout_data.empty()) << r.stderr_data;
  const double cpu = std::stod(r.stdout_data);
  EXPECT_LT(cpu, 0.8) << "CPU seconds in 2 s under cpus=0.25";
  EXPECT_GT(cpu, 0.05) << "the control: the loop ran";
}

TEST_P(EngineConformance, ADiskLimitFillsOnlyItsOwnLayer) {
  NEEDS(limits);
  runtime::SandboxSpec spec;
  spec.limits.disk_mb = 16;
  Box box = Make(spec);
  Box neighbour = Make();
  auto r = Run(box, "dd if=/dev/zero of=/home/user/fill bs=1M count=64 2>&1; echo rc=$?");
  EXPECT_NE(r.stdout_data.find("No space left on device"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("rc=0"), std::string::npos);
  auto n = Run(neighbour, "dd if=/dev/zero of=/home/user/f bs=1M count=32 2>/dev/null; echo rc=$?");
  EXPECT_EQ(n.stdout_data, "rc=0\n") << "the control: the neighbour's 32 MiB fit";
}

// Engine::Stats: what the daemon's sampler reads (docs/design/metrics.md) moves with what the
// sandbox does, and only that sandbox's: a neighbour doing nothing is the control.
TEST_P(EngineConformance, StatsMoveWithWhatTheSandboxDoes) {
  Box box = Make();
  Box neighbour = Make();
  auto before = engine_->Stats(box.id);
  ASSERT_TRUE(before) << before.error().message();
  EXPECT_GT(before->memory_bytes, 0u);
  EXPECT_GE(before->pids, 1u);
  auto quiet_before = engine_->Stats(neighbour.id);
  ASSERT_TRUE(quiet_before) << quiet_before.error().message();
  // CPU (a busy loop), disk (8 MB in its writable layer), memory (64 MiB held by a process
  // while the stats are read).
  ASSERT_EQ(Run(box, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo ok").stdout_data,
            "ok\n");
  // Through the agent's file operation (the FakeEngine's commands run on the host; its files
  // are confined to its root).
  ASSERT_TRUE(box.client);
  ASSERT_TRUE(box.client->WriteFile("/home/user/blob", std::string(8'000'000, 'x'), 0644, false));
  // The holder runs on a second channel to its agent while this thread reads the stats.
  auto channel = engine_->ConnectAgent(box.id);
  ASSERT_TRUE(channel) << channel.error().message();
  auto second = p::BlockingClient::Connect(std::move(*channel));
  ASSERT_TRUE(second) << second.error().message();
  std::thread holder([&] {
    Run(*second, "python3 -c 'import time; a = b\"x\" * (64 << 20); time.sleep(6)'");
  });
  runtime::SandboxStats after{};
  for (int i = 0; i < 50; ++i) {  // until the 64 MiB are charged (while the holder sleeps)
    auto read = engine_->Stats(box.id);
    EXPECT_TRUE(read) << read.error().message();
    if (!read) break;
    after = *read;
    if (after.memory_bytes >= before->memory_bytes + (48u << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  holder.join();
  EXPECT_GT(after.cpu_seconds, before->cpu_seconds + 0.1);
  EXPECT_GE(after.disk_bytes, before->disk_bytes + 7'000'000);
  // (The FakeEngine has no cgroup: its memory is its agent's own.)
  if (engine_->name() != "fake") {
    EXPECT_GE(after.memory_bytes, before->memory_bytes + (48u << 20));
  }
  if (after.memory_peak_bytes > 0) {
    EXPECT_GE(after.memory_peak_bytes, after.memory_bytes);
  }
  auto quiet_after = engine_->Stats(neighbour.id);
  ASSERT_TRUE(quiet_after);
  EXPECT_LT(quiet_after->disk_bytes, quiet_before->disk_bytes + 1'000'000) << "the neighbour's";
  EXPECT_LT(quiet_after->cpu_seconds, quiet_before->cpu_seconds + 0.1) << "the neighbour's";
  Destroy(box.id);
  auto gone = engine_->Stats(box.id);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code(), ErrorCode::kNotFound);
}

TEST_P(EngineConformance, LimitsChangeOnALiveSandbox) {
  NEEDS(live_limits);
  Box box = Make();
  auto before = Run(box, "python3 -c 'b = bytearray(128 << 20); print(len(b) >> 20)'");
  EXPECT_EQ(before.stdout_data, "128\n") << "the control: 128 MiB fits in 512";
  runtime::Limits lower;
  lower.memory_mb = 64;
  ASSERT_TRUE(engine_->UpdateLimits(box.id, lower));
  auto after = Run(box, "python3 -c 'b = bytearray(128 << 20); print(len(b) >> 20)'");
  EXPECT_NE(after.stdout_data, "128\n") << "the lower limit did not hold";
}

TEST_P(EngineConformance, AnEngineWithoutLiveLimitsSaysSo) {
  if (can().live_limits) GTEST_SKIP() << "it has live_limits (the test above checks them)";
  Box box = Make();
  auto refused = engine_->UpdateLimits(box.id, runtime::Limits{});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("live_limits"), std::string::npos);
}

TEST_P(EngineConformance, APausedSandboxAnswersNothingUntilResumed) {
  NEEDS(pause);
  Box box = Make();
  ASSERT_TRUE(engine_->Pause(box.id));
  auto fd = engine_->ConnectAgent(box.id);
  ASSERT_TRUE(fd) << fd.error().message();
  // A frozen agent cannot answer a hello: the connect does not complete while paused.
  auto hello = std::async(std::launch::async, [fd = std::move(*fd)]() mutable {
    return p::BlockingClient::Connect(std::move(fd)).has_value();
  });
  EXPECT_EQ(hello.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "a paused sandbox's agent answered";
  ASSERT_TRUE(engine_->Resume(box.id));
  EXPECT_TRUE(hello.get()) << "the hello sent while paused is answered after the resume";
  EXPECT_EQ(Run(box, "echo awake").stdout_data, "awake\n");
}

TEST_P(EngineConformance, AnEngineWithoutPauseSaysSo) {
  if (can().pause) GTEST_SKIP() << "it has pause (the test above checks it)";
  Box box = Make();
  auto refused = engine_->Pause(box.id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(Run(box, "echo running").stdout_data, "running\n") << "it must go on running";
}

// A background shell holding a random value in a variable: every 20 ms it writes "value count"
// to /tmp/state (on the sandbox's /tmp, which is memory too). Returns its pid.
int32_t StartRememberer(p::BlockingClient& client) {
  p::Exec e;
  e.shell =
      "x=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n'); i=0; "
      "while :; do i=$((i+1)); echo \"$x $i\" > /tmp/state.new; mv /tmp/state.new /tmp/state; "
      "sleep 0.02; done";
  e.background = true;
  auto stream = client.StartExec(e);
  EXPECT_TRUE(stream) << (stream ? "" : stream.error().message());
  if (!stream) return 0;
  auto started = client.NextFor(*stream);
  EXPECT_TRUE(started && std::holds_alternative<p::Started>(*started));
  if (!started || !std::holds_alternative<p::Started>(*started)) return 0;
  return std::get<p::Started>(*started).pid;
}

// The rememberer's value and count, once /tmp/state holds a count above `above` (waits up to
// 10 s for it).
std::pair<std::string, long> Remembered(p::BlockingClient& client, long above = 0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto text = client.ReadFile("/tmp/state"); text && text->size() > 18) {
      std::istringstream in(*text);
      std::string value;
      long count = 0;
      if (in >> value >> count && value.size() == 16 && count > above) return {value, count};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "the background process wrote no state with a count above " << above;
  return {"", 0};
}

TEST_P(EngineConformance, AHibernatedSandboxWakesWithItsProcessesAndMemory) {
  NEEDS(memory_checkpoint);
  Box box = Make();
  const int32_t pid = StartRememberer(*box.client);
  ASSERT_GT(pid, 0);
  const auto [value, count] = Remembered(*box.client);
  ASSERT_FALSE(value.empty());
  ASSERT_TRUE(box.client->WriteFile("/home/user/kept.txt", "on its disk"));
  box.client.reset();
  auto saved = engine_->Hibernate(box.id);
  ASSERT_TRUE(saved) << saved.error().message();
  EXPECT_GT(saved->image_bytes, 0u);
  EXPECT_FALSE(saved->engine_state.empty());
  // Nothing of it runs, and its agent cannot be reached.
  EXPECT_TRUE(HostTraces(box.id).processes.empty()) << HostTraces(box.id).Describe();
  EXPECT_FALSE(engine_->ConnectAgent(box.id)) << "a hibernated sandbox's agent answered";
  EXPECT_TRUE(engine_->Alive(box.id)) << "a hibernated sandbox is not gone";
  auto refused = engine_->Hibernate(box.id);
  EXPECT_FALSE(refused) << "hibernated twice";

  auto woke = engine_->Wake(box.id);
  ASSERT_TRUE(woke) << woke.error().message();
  auto client = p::BlockingClient::Connect((*woke)->TakeAgentChannel());
  ASSERT_TRUE(client) << client.error().message();
  // The same process, with the value it held in memory, counting on from where it was.
  const std::string after = Remembered(*client, count).first;
  EXPECT_EQ(after, value) << "the value in the process's memory changed";
  ASSERT_TRUE(client->Remove("/tmp/state"));
  const std::string again = Remembered(*client).first;
  EXPECT_EQ(again, value) << "the process does not run on after the wake";
  bool listed = false;
  for (const p::ProcessInfo& info :
       client->ListProcesses().value_or(std::vector<p::ProcessInfo>{})) {
    listed = listed || (info.pid == pid && info.running);
  }
  EXPECT_TRUE(listed) << "the agent's table lost the background process";
  EXPECT_EQ(client->ReadFile("/home/user/kept.txt").value_or(""), "on its disk");
  EXPECT_FALSE(engine_->Wake(box.id)) << "woke a sandbox that runs";

  // A second round, and a destroy of a hibernated sandbox that leaves nothing.
  auto second = engine_->Hibernate(box.id);
  ASSERT_TRUE(second) << second.error().message();
  Destroy(box.id);
  EXPECT_TRUE(HostTraces(box.id).empty()) << HostTraces(box.id).Describe();
}

TEST_P(EngineConformance, AHibernateIsRefusedWhileACommandRunsAndTheSandboxRunsOn) {
  NEEDS(memory_checkpoint);
  Box box = Make();
  auto other = engine_->ConnectAgent(box.id);
  ASSERT_TRUE(other);
  auto busy = p::BlockingClient::Connect(std::move(*other));
  ASSERT_TRUE(busy);
  p::Exec sleep;
  sleep.shell = "sleep 100";
  auto stream = busy->StartExec(sleep);
  ASSERT_TRUE(stream);
  auto started = busy->NextFor(*stream);
  ASSERT_TRUE(started && std::holds_alternative<p::Started>(*started));
  auto refused = engine_->Hibernate(box.id);
  ASSERT_FALSE(refused) << "hibernated with a command in the foreground";
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition) << refused.error().message();
  EXPECT_EQ(Run(box, "echo running").stdout_data, "running\n") << "it must go on running";
  ASSERT_TRUE(busy->Send(*stream, p::Signal{SIGKILL}));
  auto exited = busy->NextFor(*stream);
  EXPECT_TRUE(exited && std::holds_alternative<p::Exited>(*exited));
}

TEST_P(EngineConformance, ARestartedEngineAdoptsAndWakesAHibernatedSandbox) {
  NEEDS(memory_checkpoint);
  Box box = Make();
  ASSERT_GT(StartRememberer(*box.client), 0);
  const auto [value, count] = Remembered(*box.client);
  box.client.reset();
  auto saved = engine_->Hibernate(box.id);
  ASSERT_TRUE(saved) << saved.error().message();
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<Engine> restarted = std::move(*made);
  EXPECT_FALSE(restarted->Adopt(box.id, saved->engine_state, runtime::SandboxState::kRunning))
      << "adopted a hibernated sandbox as a running one";
  auto adopted = restarted->Adopt(box.id, saved->engine_state, runtime::SandboxState::kHibernated);
  ASSERT_TRUE(adopted) << adopted.error().message();
  EXPECT_EQ(adopted->state, runtime::SandboxState::kHibernated);
  auto woke = restarted->Wake(box.id);
  ASSERT_TRUE(woke) << woke.error().message();
  auto client = p::BlockingClient::Connect((*woke)->TakeAgentChannel());
  ASSERT_TRUE(client) << client.error().message();
  const std::string after = Remembered(*client, count).first;
  EXPECT_EQ(after, value);
  ASSERT_TRUE(restarted->Destroy(box.id));
  std::erase(made_, box.id);
  EXPECT_TRUE(HostTraces(box.id).empty()) << HostTraces(box.id).Describe();
}

TEST_P(EngineConformance, SandboxesMadeFromAMemoryImageGoOnFromItsProcessesMemoryAndFiles) {
  NEEDS(memory_fork);
  Box parent = Make();
  const int32_t pid = StartRememberer(*parent.client);
  ASSERT_GT(pid, 0);
  const auto [value, count] = Remembered(*parent.client);
  ASSERT_TRUE(parent.client->WriteFile("/home/user/kept.txt", "from the parent"));
  parent.client.reset();
  // Handed out whole before the parent is back: a sandbox made from it meanwhile works.
  std::optional<Box> early;
  std::string handed;
  auto image = engine_->SaveMemoryImage(parent.id, [&](const runtime::MemoryImage& saved) {
    handed = saved.id;
    EXPECT_GT(saved.bytes, 0u);
    runtime::SandboxSpec from;
    from.memory_image = saved.id;
    early.emplace(Make(from));
  });
  ASSERT_TRUE(image) << image.error().message();
  EXPECT_EQ(handed, image->id) << "the image was not handed out (once) before the return";
  ASSERT_TRUE(early && early->client);
  EXPECT_GT(image->bytes, 0u);
  EXPECT_NE(image->engine_state, parent.engine_state) << "the save restarts the sandbox";
  parent.engine_state = image->engine_state;
  // The parent runs on, with its memory.
  auto fd = engine_->ConnectAgent(parent.id);
  ASSERT_TRUE(fd) << fd.error().message();
  auto parent_client = p::BlockingClient::Connect(std::move(*fd));
  ASSERT_TRUE(parent_client) << parent_client.error().message();
  EXPECT_EQ(Remembered(*parent_client, count).first, value);

  // The image is listed, also by a restarted engine (templates keep theirs across restarts).
  auto images = engine_->ListMemoryImages();
  ASSERT_TRUE(images) << images.error().message();
  EXPECT_EQ(*images, std::vector<std::string>{image->id});
  {
    auto made = GetParam().make(dir_, layers_.get());
    ASSERT_TRUE(made) << made.error().message();
    auto relisted = (*made)->ListMemoryImages();
    ASSERT_TRUE(relisted) << relisted.error().message();
    EXPECT_EQ(*relisted, std::vector<std::string>{image->id}) << "a restart removed the image";
  }

  runtime::SandboxSpec spec;
  spec.memory_image = image->id;
  Box first = Make(spec);
  Box second = Make(spec);
  ASSERT_TRUE(first.client && second.client);
  for (Box* child : {&first, &second, &*early}) {
    // The same process with the same value, counting on from the parent's count.
    EXPECT_EQ(Remembered(*child->client, count).first, value) << child->id;
    EXPECT_EQ(child->client->ReadFile("/home/user/kept.txt").value_or(""), "from the parent");
    bool listed = false;
    for (const p::ProcessInfo& info :
         child->client->ListProcesses().value_or(std::vector<p::ProcessInfo>{})) {
      listed = listed || (info.pid == pid && info.running);
    }
    EXPECT_TRUE(listed) << "the agent's table in " << child->id << " lost the process";
  }
  // Each goes its own way: what one writes, the others do not see.
  ASSERT_TRUE(first.client->WriteFile("/home/user/kept.txt", "first's own"));
  ASSERT_TRUE(first.client->WriteFile("/tmp/only-first", "x"));
  EXPECT_EQ(second.client->ReadFile("/home/user/kept.txt").value_or(""), "from the parent");
  EXPECT_EQ(parent_client->ReadFile("/home/user/kept.txt").value_or(""), "from the parent");
  EXPECT_FALSE(second.client->ReadFile("/tmp/only-first"));
  EXPECT_FALSE(parent_client->ReadFile("/tmp/only-first"));
  // The image goes; the sandboxes made from it stay.
  ASSERT_TRUE(engine_->RemoveMemoryImage(image->id));
  ASSERT_TRUE(engine_->RemoveMemoryImage(image->id)) << "a second remove is not an error";
  images = engine_->ListMemoryImages();
  ASSERT_TRUE(images) << images.error().message();
  EXPECT_TRUE(images->empty()) << "a removed image is listed";
  EXPECT_EQ(Run(first, "echo still").stdout_data, "still\n");
  runtime::SandboxSpec gone;
  gone.memory_image = image->id;
  gone.id = NewSandboxId();
  auto refused = engine_->Create(gone);
  ASSERT_FALSE(refused) << "made a sandbox from a removed image";
  EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(HostTraces(gone.id).empty()) << HostTraces(gone.id).Describe();
  for (Box* box : {&first, &second, &*early}) {
    Destroy(box->id);
    EXPECT_TRUE(HostTraces(box->id).empty()) << HostTraces(box->id).Describe();
  }
}

TEST_P(EngineConformance, AnEngineWithoutMemoryForksSaysSo) {
  if (can().memory_fork) GTEST_SKIP() << "it has memory_fork (the test above checks it)";
  Box box = Make();
  auto refused = engine_->SaveMemoryImage(box.id, [](const runtime::MemoryImage&) {
    ADD_FAILURE() << "an engine without memory_fork handed out an image";
  });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("memory_fork"), std::string::npos);
  auto listed = engine_->ListMemoryImages();
  ASSERT_TRUE(listed) << listed.error().message();
  EXPECT_TRUE(listed->empty());
  runtime::SandboxSpec spec;
  spec.id = NewSandboxId();
  spec.memory_image = "mem-abcdefghijklmnop";
  auto create = engine_->Create(spec);
  ASSERT_FALSE(create);
  EXPECT_EQ(create.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(Run(box, "echo running").stdout_data, "running\n") << "it must go on running";
}

// The gVisor engine's own: a daemon that stopped between its agent's quiesce and the checkpoint
// left an agent that listens nowhere; the next start's adopt wakes it.
TEST_P(EngineConformance, AnAdoptWakesAnAgentLeftQuiesced) {
  NEEDS(memory_checkpoint);
  if (GetParam().name != "gvisor") GTEST_SKIP() << "the wake file is the gVisor engine's";
  Box box = Make();
  ASSERT_TRUE(box.client->WriteFile("/tmp/before", "kept"));
  ASSERT_TRUE(box.client->Quiesce("/.airlock/run/wake"));
  box.client.reset();
  EXPECT_FALSE(engine_->ConnectAgent(box.id)) << "a quiesced agent still listens";
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<Engine> restarted = std::move(*made);
  auto adopted = restarted->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning);
  ASSERT_TRUE(adopted) << adopted.error().message();
  auto fd = restarted->ConnectAgent(box.id);
  ASSERT_TRUE(fd) << fd.error().message();
  auto client = p::BlockingClient::Connect(std::move(*fd));
  ASSERT_TRUE(client) << client.error().message();
  EXPECT_EQ(client->ReadFile("/tmp/before").value_or(""), "kept");
}

// A daemon that stopped after a hibernate's checkpoint and before recording it still has the
// sandbox's record saying running, with the old engine state: the adopt restores the sandbox.
TEST_P(EngineConformance, AnAdoptRestoresASandboxSavedWhileItsRecordSaysRunning) {
  NEEDS(memory_checkpoint);
  Box box = Make();
  ASSERT_GT(StartRememberer(*box.client), 0);
  const auto [value, count] = Remembered(*box.client);
  box.client.reset();
  ASSERT_TRUE(engine_->Hibernate(box.id));
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<Engine> restarted = std::move(*made);
  auto adopted = restarted->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning);
  ASSERT_TRUE(adopted) << adopted.error().message();
  EXPECT_NE(adopted->engine_state, box.engine_state) << "restored: a new pid";
  auto fd = restarted->ConnectAgent(box.id);
  ASSERT_TRUE(fd) << fd.error().message();
  auto client = p::BlockingClient::Connect(std::move(*fd));
  ASSERT_TRUE(client) << client.error().message();
  EXPECT_EQ(Remembered(*client, count).first, value);
  // And the state it returned is what the next adopt takes.
  auto again = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(again);
  EXPECT_TRUE((*again)->Adopt(box.id, adopted->engine_state, runtime::SandboxState::kRunning));
}

TEST_P(EngineConformance, AnEngineWithoutMemoryCheckpointsSaysSo) {
  if (can().memory_checkpoint) GTEST_SKIP() << "it has memory_checkpoint (the tests above check it)";
  Box box = Make();
  auto refused = engine_->Hibernate(box.id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("memory_checkpoint"), std::string::npos);
  EXPECT_FALSE(engine_->Wake(box.id));
  EXPECT_EQ(Run(box, "echo running").stdout_data, "running\n") << "it must go on running";
}

TEST_P(EngineConformance, ASnapshotLayerCarriesWhatASandboxWrote) {
  NEEDS(layer_snapshot);
  Box box = Make();
  ASSERT_TRUE(box.client->WriteFile("/home/user/kept.txt", "written before the snapshot"));
  auto layer = engine_->SnapshotLayer(box.id);
  ASSERT_TRUE(layer) << layer.error().message();
  EXPECT_TRUE(layers_->Has(layer->digest));
  EXPECT_EQ(Run(box, "echo still running").stdout_data, "still running\n");
  runtime::SandboxSpec spec;
  spec.root.layers = {layer->digest};
  Box child = Make(spec);
  EXPECT_EQ(child.client->ReadFile("/home/user/kept.txt").value_or("<missing>"),
            "written before the snapshot");
  Box plain = Make();
  EXPECT_FALSE(plain.client->ReadFile("/home/user/kept.txt")) << "the control: no layer, no file";
  // What the child writes stays its own.
  ASSERT_TRUE(child.client->WriteFile("/home/user/kept.txt", "changed"));
  Box again = Make(spec);
  EXPECT_EQ(again.client->ReadFile("/home/user/kept.txt").value_or(""),
            "written before the snapshot");
}

// What a sandbox wrote becomes a layer that new sandboxes start from: owners as the sandbox saw
// them, deletions and replaced directories, hard links, no set-user-ID bit, copy-up on write.
TEST_P(EngineConformance, SnapshotLayersCarryOwnersDeletionsAndLinks) {
  NEEDS(layer_snapshot);
  NEEDS_ISOLATION();
  if (can().max_layers < 2) {
    GTEST_SKIP() << "the " << GetParam().name << " engine stacks " << can().max_layers
                 << " layer at most; this test stacks two";
  }
  Box a = Make();
  auto made = Run(a,
                  "mkdir -p /opt/app/dir && chmod 777 /opt/app && echo old > /opt/app/dir/old"
                  " && cp /bin/true /opt/app/suid"
                  " && chmod 4755 /opt/app/suid && mkfifo /opt/app/fifo && ln -s x /opt/app/link"
                  " && echo ok",
                  "root");
  ASSERT_EQ(made.stdout_data, "ok\n") << made.stderr_data;
  ASSERT_EQ(Run(a, "echo mine > /home/user/notes && ln /home/user/notes /home/user/notes-link && "
                   "echo hello > /opt/app/x && echo ok")
                .stdout_data,
            "ok\n");
  auto first = engine_->SnapshotLayer(a.id);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_FALSE(first->existed);
  EXPECT_GT(first->files, 5u);
  // The sandbox goes on, and the same tree is the same layer.
  EXPECT_EQ(Run(a, "echo alive").stdout_data, "alive\n");
  auto again = engine_->SnapshotLayer(a.id);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->digest, first->digest);
  EXPECT_TRUE(again->existed);

  // In the layer store: root-only, owners as inside, no set-user-ID bit, a hard link kept one
  // (copied apart, links could multiply the bytes without bound).
  const std::string layer = layers_->Path(first->digest);
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/layers").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((layer + "/opt/app/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  ASSERT_EQ(::stat((layer + "/opt/app/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  struct stat link;
  ASSERT_EQ(::stat((layer + "/home/user/notes").c_str(), &st), 0);
  ASSERT_EQ(::stat((layer + "/home/user/notes-link").c_str(), &link), 0);
  EXPECT_EQ(st.st_ino, link.st_ino);
  EXPECT_EQ(st.st_nlink, 2u);

  // A second generation deletes a file and replaces a directory.
  runtime::SandboxSpec on_first;
  on_first.root.layers = {first->digest};
  Box b = Make(on_first);
  auto changed = Run(b,
                     "cat /opt/app/x && rm /opt/app/x && rm -rf /opt/app/dir && mkdir /opt/app/dir"
                     " && echo new > /opt/app/dir/new && echo ok",
                     "root");
  ASSERT_EQ(changed.stdout_data, "hello\nok\n") << changed.stderr_data;
  auto second = engine_->SnapshotLayer(b.id);
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_NE(second->digest, first->digest);

  runtime::SandboxSpec on_both;
  on_both.root.layers = {second->digest, first->digest};
  Box c = Make(on_both);
  // Python, not ls and stat: coreutils' statx flags are refused by gVisor 20221219's kernel
  // (docs/design/gvisor.md, "A statx finding"). A named pipe made on gVisor lives in its kernel's
  // memory, never in the writable layer, so no snapshot has it (gvisor.md, "Layers").
  const bool fifos_on_disk = std::string(GetParam().name) != "gvisor";
  auto seen = Run(c,
                  "python3 -c \"import os, pwd, stat\n"
                  "print(' '.join(sorted(os.listdir('/opt/app'))))\n"
                  "print(' '.join(os.listdir('/opt/app/dir')))\n"
                  "for p in ('/home/user/notes', '/opt/app/suid'):\n"
                  "    st = os.stat(p)\n"
                  "    print(pwd.getpwuid(st.st_uid).pw_name, format(st.st_mode & 0o7777, 'o'))\n"
                  "print(os.readlink('/opt/app/link'))\n"
                  "p = '/opt/app/fifo'\n"
                  "print('fifo' if os.path.exists(p) and stat.S_ISFIFO(os.stat(p).st_mode) "
                  "else 'none')\"");
  EXPECT_EQ(seen.stdout_data, fifos_on_disk
                                  ? "dir fifo link suid\nnew\nuser 644\nroot 755\nx\nfifo\n"
                                  : "dir link suid\nnew\nuser 644\nroot 755\nx\nnone\n")
      << seen.stderr_data;
  // Files from the layers are the sandbox's own: its user appends to one, root changes another's
  // mode (both copied up), and nothing written in c reaches the layer or the other sandboxes.
  EXPECT_EQ(Run(c, "echo more >> /home/user/notes && cat /home/user/notes").stdout_data,
            "mine\nmore\n");
  EXPECT_EQ(Run(c,
                "chmod 700 /opt/app/suid && python3 -c \"import os; "
                "print(format(os.stat('/opt/app/suid').st_mode & 0o777, 'o'))\"",
                "root")
                .stdout_data,
            "700\n");
  std::ifstream kept(layer + "/home/user/notes");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "mine\n");
  EXPECT_EQ(Run(b, "cat /home/user/notes").stdout_data, "mine\n");
}

// A tree nested deeper than a layer may hold is refused with a clear error, not copied until the
// daemon runs out of fds or stack; the sandbox goes on and nothing is kept.
TEST_P(EngineConformance, ASnapshotOfATooDeepTreeIsRefused) {
  NEEDS(layer_snapshot);
  NEEDS_ISOLATION();
  Box box = Make();
  // One mkdir for the 300 levels (d/d/.../d, 600 bytes): a mkdir per level is 300 execs, which
  // take 15 s on gVisor.
  auto made = Run(box, "cd /home/user && mkdir -p $(printf 'd/%.0s' $(seq 300)) && echo deep");
  ASSERT_EQ(made.stdout_data, "deep\n") << made.stderr_data;
  auto before = layers_->List();
  ASSERT_TRUE(before);
  const auto entries = [this] {
    std::error_code ec;
    return std::distance(fs::directory_iterator(dir_ + "/layers", ec), fs::directory_iterator());
  };
  const auto entries_before = entries();
  auto snap = engine_->SnapshotLayer(box.id);
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(snap.error().message().find("deeper than 256"), std::string::npos)
      << snap.error().message();
  EXPECT_EQ(Run(box, "echo alive").stdout_data, "alive\n");
  EXPECT_EQ(*layers_->List(), *before);
  EXPECT_EQ(entries(), entries_before) << "a temporary was left";
}

TEST_P(EngineConformance, LayersItCannotStackAreRefusedBeforeAnythingIsMade) {
  runtime::SandboxSpec missing;
  missing.id = NewSandboxId();
  for (const std::string& layer : {std::string(64, 'a'), std::string("../x")}) {
    missing.root.layers = {layer};
    auto refused = engine_->Create(missing);
    ASSERT_FALSE(refused) << layer;
    EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound) << layer;
  }
  runtime::SandboxSpec many;
  many.id = NewSandboxId();
  many.root.layers.assign(can().max_layers + 1, std::string(64, 'b'));
  EXPECT_FALSE(engine_->Create(many)) << "more than max_layers";
  // The shared layer store turns no name into a path.
  EXPECT_FALSE(layers_->Has("../../etc"));
  EXPECT_FALSE(layers_->Remove("../../etc"));
  EXPECT_TRUE(layers_->Remove(std::string(64, 'b'))) << "removing no layer succeeds";
  // Nor can a sandbox that does not exist be snapshotted.
  auto snap = engine_->SnapshotLayer("sbx-nothere");
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code(), ErrorCode::kNotFound);
  auto left = engine_->ListSandboxes();
  ASSERT_TRUE(left);
  EXPECT_TRUE(left->empty()) << "a refused create left something";
}

TEST_P(EngineConformance, ARestartedEngineAdoptsItsLiveSandboxes) {
  Box box = Make();
  ASSERT_TRUE(box.client->WriteFile("/tmp/before", "before the restart"));
  // The daemon restarts: a new instance on the same state dir, with what the record kept.
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<Engine> restarted = std::move(*made);
  auto adopted = restarted->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning);
  ASSERT_TRUE(adopted) << adopted.error().message();
  EXPECT_EQ(adopted->id, box.id);
  EXPECT_FALSE(adopted->engine_state.empty());
  auto fd = restarted->ConnectAgent(box.id);
  ASSERT_TRUE(fd) << fd.error().message();
  auto client = p::BlockingClient::Connect(std::move(*fd));
  ASSERT_TRUE(client) << client.error().message();
  EXPECT_EQ(client->ReadFile("/tmp/before").value_or(""), "before the restart");
  // Adopting it twice is refused; a destroyed one cannot be adopted.
  EXPECT_FALSE(restarted->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning));
  ASSERT_TRUE(restarted->Destroy(box.id));
  std::erase(made_, box.id);
  auto made_again = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made_again);
  auto gone = (*made_again)->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning);
  ASSERT_FALSE(gone) << "adopted a destroyed sandbox";
}

TEST_P(EngineConformance, ACorruptEngineStateIsRefusedNotTrusted) {
  Box box = Make();
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made);
  for (const char* bad : {"", "not json", "{}", "{\"init_pid\":1,\"pid\":1}", "[1,2]"}) {
    EXPECT_FALSE((*made)->Adopt(box.id, bad, runtime::SandboxState::kRunning)) << "adopted with state " << bad;
  }
  EXPECT_EQ(Run(box, "echo untouched").stdout_data, "untouched\n");
}


// What an engine's process watch reported (Engine::WatchProcesses), for a test to wait on. Held
// by the sink through a shared_ptr: it outlives the engine, whose destroy waits for the sink.
class ProcessRecord {
 public:
  using Event = runtime::ProcessEvent;
  struct Seen {
    std::string id;
    Event event;
  };
  runtime::ProcessEventSink Sink(std::shared_ptr<ProcessRecord> self) {
    return [self](const std::string& id, const Event& event) { self->Add(id, event); };
  }
  // Stops the sink at the next event until Release (a consumer that does not keep up).
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  // Waits (up to 60 s) for an event that `match` takes.
  std::optional<Seen> WaitFor(const std::function<bool(const Seen&)>& match,
                              std::chrono::seconds within = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    std::optional<Seen> found;
    cv_.wait_for(lock, within, [&] {
      for (const Seen& s : seen_) {
        if (match(s)) {
          found = s;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  std::vector<Seen> All() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void Add(const std::string& id, const Event& event) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !held_; });
    seen_.push_back({id, event});
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  std::vector<Seen> seen_;
};

using Seen = ProcessRecord::Seen;
using Kind = runtime::ProcessEvent::Kind;

std::shared_ptr<ProcessRecord> WatchOf(Engine& engine) {
  auto record = std::make_shared<ProcessRecord>();
  auto watched = engine.WatchProcesses(record->Sink(record));
  EXPECT_TRUE(watched) << watched.error().message();
  return watched ? record : nullptr;
}

// The exec of `argv` in sandbox `id`.
std::function<bool(const Seen&)> ExecOf(const std::string& id,
                                        const std::vector<std::string>& argv) {
  return [=](const Seen& s) {
    return s.id == id && s.event.kind == Kind::kExec && s.event.argv == argv;
  };
}
std::function<bool(const Seen&)> ExitOf(const std::string& id, int64_t pid) {
  return [=](const Seen& s) { return s.id == id && s.event.kind == Kind::kExit && s.event.pid == pid; };
}

TEST_P(EngineConformance, AnEngineWithoutProcessEventsSaysSo) {
  if (can().process_events) GTEST_SKIP() << "the " << GetParam().name << " engine has them";
  Status watched = engine_->WatchProcesses([](const std::string&, const runtime::ProcessEvent&) {});
  ASSERT_FALSE(watched);
  EXPECT_EQ(watched.error().code(), ErrorCode::kFailedPrecondition) << watched.error().message();
  EXPECT_NE(watched.error().message().find("process_events"), std::string::npos);
}

// A process that stays until the test lets it go: `/bin/cat <fifo>` waits for a writer, so its
// exec is looked at while it runs (a short-lived one may be gone first: argv_lost).
class Gate {
 public:
  // Runs `shell` (which reads `fifo`, made here) in sandbox `id`, on a channel and a thread of
  // its own.
  Gate(Engine& engine, std::string id, std::string fifo, const std::string& shell)
      : engine_(engine), id_(std::move(id)), fifo_(std::move(fifo)) {
    p::Exec e;
    e.shell = "mkfifo " + fifo_ + " && " + shell;
    e.timeout_ms = 60000;
    running_ = std::async(std::launch::async, [this, e] {
      auto client = Channel();
      if (!client) return p::ExecResult{};
      auto r = client->Exec(e);
      EXPECT_TRUE(r) << (r ? "" : r.error().message());
      return r ? std::move(*r) : p::ExecResult{};
    });
  }
  // Writes `line` into the fifo and waits for the command's end.
  p::ExecResult Open(const std::string& line = "go") {
    if (opened_) return {};
    opened_ = true;
    if (auto client = Channel()) {
      p::Exec e;
      e.shell = "echo " + line + " > " + fifo_;
      e.timeout_ms = 60000;
      EXPECT_TRUE(client->Exec(e));
    }
    return running_.get();
  }
  // Waits for the command's end without writing (its reader is gone).
  p::ExecResult Wait() {
    opened_ = true;
    return running_.get();
  }
  ~Gate() { (void)Open(); }

 private:
  std::optional<p::BlockingClient> Channel() {
    auto fd = engine_.ConnectAgent(id_);
    EXPECT_TRUE(fd) << (fd ? "" : fd.error().message());
    if (!fd) return std::nullopt;
    auto client = p::BlockingClient::Connect(std::move(*fd));
    EXPECT_TRUE(client) << (client ? "" : client.error().message());
    if (!client) return std::nullopt;
    return std::move(*client);
  }
  Engine& engine_;
  std::string id_;
  std::string fifo_;
  bool opened_ = false;
  std::future<p::ExecResult> running_;
};

TEST_P(EngineConformance, ProcessEventsShowWhatRanAsTheSandboxSeesIt) {
  NEEDS(process_events);
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto record = WatchOf(*engine_);
  ASSERT_TRUE(record);
  const std::string uid = Run(box, "id -u | tr -d '\\n'").stdout_data;
  ASSERT_FALSE(uid.empty());
  // A process of the host's, during the watch: never reported (it ends before the sandbox's
  // commands start, so its event came first).
  ASSERT_EQ(std::system("/bin/true airlock-host-marker"), 0);

  const std::string inner = "echo $$ > /tmp/sh.pid; /bin/cat /tmp/gate; /bin/echo hello-marker; exit 3";
  Gate gate(*engine_, box.id, "/tmp/gate", "sh -c '" + inner + "'");
  auto cat = record->WaitFor(ExecOf(box.id, {"/bin/cat", "/tmp/gate"}));
  auto sh = record->WaitFor(ExecOf(box.id, {"sh", "-c", inner}));
  p::ExecResult r = gate.Open();
  ASSERT_TRUE(cat) << "no exec of /bin/cat reported";
  ASSERT_TRUE(sh) << "no exec of the inner sh reported";
  EXPECT_EQ(r.exit.exit_code, 3);
  EXPECT_EQ(r.stdout_data, "go\nhello-marker\n");

  // Pids as the sandbox sees them: the sh's own $$, and its children's parent.
  const std::string sh_pid = Run(box, "tr -d '\\n' < /tmp/sh.pid").stdout_data;
  EXPECT_EQ(std::to_string(sh->event.pid), sh_pid);
  EXPECT_EQ(cat->event.ppid, sh->event.pid);
  EXPECT_NE(cat->event.pid, sh->event.pid);
  EXPECT_GT(sh->event.ppid, 0);
  for (const Seen* s : {&*cat, &*sh}) {
    EXPECT_EQ(std::to_string(s->event.uid), uid) << "the uid as the sandbox sees it";
    EXPECT_FALSE(s->event.argv_truncated);
    EXPECT_FALSE(s->event.argv_lost);
    EXPECT_GT(s->event.at_ms, 1'600'000'000'000) << "unix ms";
  }
  // The echo ran between the gate and the exit: reported, a child of the sh (its argv may be
  // lost: it can end before it is looked at).
  auto echo = record->WaitFor([&](const Seen& s) {
    return s.id == box.id && s.event.kind == Kind::kExec && s.event.ppid == sh->event.pid &&
           s.event.pid != cat->event.pid;
  });
  ASSERT_TRUE(echo) << "no exec of /bin/echo reported";
  if (!echo->event.argv_lost) {
    EXPECT_EQ(echo->event.argv, (std::vector<std::string>{"/bin/echo", "hello-marker"}));
  }
  // The ends: the sh's status, the cat's.
  auto sh_exit = record->WaitFor(ExitOf(box.id, sh->event.pid));
  ASSERT_TRUE(sh_exit);
  EXPECT_EQ(sh_exit->event.exit_code, 3);
  EXPECT_EQ(sh_exit->event.signal, 0);
  EXPECT_EQ(sh_exit->event.ppid, sh->event.ppid);
  auto cat_exit = record->WaitFor(ExitOf(box.id, cat->event.pid));
  ASSERT_TRUE(cat_exit);
  EXPECT_EQ(cat_exit->event.exit_code, 0);

  for (const Seen& s : record->All()) {
    EXPECT_EQ(s.id, box.id) << "an event of a sandbox that does not exist";
    for (const std::string& arg : s.event.argv) {
      EXPECT_EQ(arg.find("airlock-host-marker"), std::string::npos) << "a host process reported";
    }
  }
}

TEST_P(EngineConformance, ProcessEventsShowAPipelineAndASignal) {
  NEEDS(process_events);
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto record = WatchOf(*engine_);
  ASSERT_TRUE(record);
  // Both ends of the pipe wait for the gate: each is looked at while it runs.
  Gate gate(*engine_, box.id, "/tmp/pipe", "sh -c \"cat /tmp/pipe | tr a b\"");
  auto cat = record->WaitFor(ExecOf(box.id, {"cat", "/tmp/pipe"}));
  auto tr = record->WaitFor(ExecOf(box.id, {"tr", "a", "b"}));
  p::ExecResult r = gate.Open("a");
  ASSERT_TRUE(cat);
  ASSERT_TRUE(tr);
  EXPECT_EQ(r.stdout_data, "b\n");
  EXPECT_EQ(cat->event.ppid, tr->event.ppid) << "both children of the sh";
  EXPECT_NE(cat->event.pid, tr->event.pid);
  auto tr_exit = record->WaitFor(ExitOf(box.id, tr->event.pid));
  ASSERT_TRUE(tr_exit);
  EXPECT_EQ(tr_exit->event.exit_code, 0);

  // A process killed by a signal: its end says which.
  Gate killed(*engine_, box.id, "/tmp/never", "/bin/cat /tmp/never; true");
  auto victim = record->WaitFor(ExecOf(box.id, {"/bin/cat", "/tmp/never"}));
  ASSERT_TRUE(victim);
  EXPECT_EQ(Run(box, "kill -KILL " + std::to_string(victim->event.pid)).exit.exit_code, 0);
  EXPECT_EQ(killed.Wait().exit.exit_code, 0);
  auto victim_exit = record->WaitFor(ExitOf(box.id, victim->event.pid));
  ASSERT_TRUE(victim_exit);
  EXPECT_EQ(victim_exit->event.signal, SIGKILL);
  EXPECT_EQ(victim_exit->event.exit_code, -1);
}

TEST_P(EngineConformance, ProcessEventsOfTwoSandboxesAreNotMixed) {
  NEEDS(process_events);
  Box a = Make();
  Box b = Make();
  ASSERT_TRUE(a.client && b.client);
  auto record = WatchOf(*engine_);
  ASSERT_TRUE(record);
  Gate gate_a(*engine_, a.id, "/tmp/gate-a", "/bin/cat /tmp/gate-a");
  Gate gate_b(*engine_, b.id, "/tmp/gate-b", "/bin/cat /tmp/gate-b");
  auto in_a = record->WaitFor(ExecOf(a.id, {"/bin/cat", "/tmp/gate-a"}));
  auto in_b = record->WaitFor(ExecOf(b.id, {"/bin/cat", "/tmp/gate-b"}));
  EXPECT_EQ(gate_a.Open().exit.exit_code, 0);
  EXPECT_EQ(gate_b.Open().exit.exit_code, 0);
  ASSERT_TRUE(in_a);
  ASSERT_TRUE(in_b);
  for (const Seen& s : record->All()) {
    EXPECT_TRUE(s.id == a.id || s.id == b.id) << s.id;
    const std::string other = s.id == a.id ? "gate-b" : "gate-a";
    for (const std::string& arg : s.event.argv) {
      EXPECT_EQ(arg.find(other), std::string::npos) << s.id << " got " << arg;
    }
  }
  // A destroyed sandbox's processes are not reported any more: the other's still are.
  Destroy(a.id);
  Gate again(*engine_, b.id, "/tmp/again", "/bin/cat /tmp/again");
  EXPECT_TRUE(record->WaitFor(ExecOf(b.id, {"/bin/cat", "/tmp/again"})));
}

TEST_P(EngineConformance, AnArgvOverTheCapIsCutAndMarked) {
  NEEDS(process_events);
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto record = WatchOf(*engine_);
  ASSERT_TRUE(record);
  // Too many arguments (cat stops at the gate, the first).
  std::string many = "/bin/cat /tmp/many";
  for (int i = 0; i < 40; ++i) many += " a" + std::to_string(i);
  Gate gate(*engine_, box.id, "/tmp/many", many + "; true");
  auto seen = record->WaitFor([&](const Seen& s) {
    return s.id == box.id && s.event.kind == Kind::kExec && s.event.argv.size() >= 2 &&
           s.event.argv[0] == "/bin/cat" && s.event.argv[1] == "/tmp/many";
  });
  gate.Open();
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->event.argv.size(), runtime::ProcessEvent::kMaxArgs);
  EXPECT_TRUE(seen->event.argv_truncated);
  EXPECT_EQ(seen->event.argv.back(), "a29");
  // Too many bytes: one long argument, cut where the cap is.
  Gate big(*engine_, box.id, "/tmp/big",
           "/bin/cat /tmp/big $(head -c 6000 /dev/zero | tr '\\0' x); true");
  auto long_one = record->WaitFor([&](const Seen& s) {
    return s.id == box.id && s.event.kind == Kind::kExec && s.event.argv.size() >= 2 &&
           s.event.argv[0] == "/bin/cat" && s.event.argv[1] == "/tmp/big";
  });
  big.Open();
  ASSERT_TRUE(long_one);
  EXPECT_TRUE(long_one->event.argv_truncated);
  ASSERT_EQ(long_one->event.argv.size(), 3u);
  size_t bytes = 0;
  for (const std::string& arg : long_one->event.argv) bytes += arg.size();
  EXPECT_EQ(bytes, runtime::ProcessEvent::kMaxArgvBytes);
  EXPECT_EQ(long_one->event.argv[2], std::string(long_one->event.argv[2].size(), 'x'));
}

// A storm of processes while the consumer is stuck: the sandbox goes on, the engine drops (and
// counts) instead of holding everything, and reports again once the consumer is back.
TEST_P(EngineConformance, AProcessStormNeitherBlocksNorGrowsWithoutBound) {
  NEEDS(process_events);
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto record = WatchOf(*engine_);
  ASSERT_TRUE(record);
  record->Hold();
  constexpr int kExecs = 5000;
  p::Exec storm;
  storm.shell = "i=0; while [ $i -lt " + std::to_string(kExecs) +
                " ]; do /bin/true; i=$((i+1)); done; echo done";
  storm.timeout_ms = 300000;
  box.client->set_receive_timeout(std::chrono::milliseconds(storm.timeout_ms));  // silent until done
  auto r = box.client->Exec(storm);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->stdout_data, "done\n") << "the storm did not finish while the consumer was stuck";
  // 2 events a process; a bound below that drops (or the kernel's buffer overflows: lost).
  runtime::ProcessEventCounters counts;
  for (int i = 0; i < 3000; ++i) {
    counts = engine_->ProcessEventCounts();
    if (counts.dropped + counts.lost > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(counts.dropped + counts.lost, 0u) << "10000 events held for a stuck consumer";
  std::cout << "storm of " << kExecs << " execs, consumer stuck: dropped " << counts.dropped
            << ", lost " << counts.lost << "\n";
  record->Release();
  // Reporting goes on after the storm. While the engine's queue still holds the storm's backlog
  // (a slow consumer: a sanitizer build), a new exec may be dropped like the storm's were: one
  // is tried every few seconds until one is reported.
  std::optional<Seen> after;
  for (int attempt = 0; attempt < 12 && !after; ++attempt) {
    const std::string fifo = "/tmp/after" + std::to_string(attempt);
    Gate gate(*engine_, box.id, fifo, "/bin/cat " + fifo);
    after = record->WaitFor(ExecOf(box.id, {"/bin/cat", fifo}), std::chrono::seconds(5));
    gate.Open();
  }
  ASSERT_TRUE(after) << "nothing reported for a minute after the storm";
  const size_t reported = record->All().size();
  EXPECT_LT(reported, 2u * kExecs) << "every event was kept";
  EXPECT_GE(engine_->ProcessEventCounts().reported, reported);
}

TEST_P(EngineConformance, ProcessEventsCoverAdoptedSandboxes) {
  NEEDS(process_events);
  Box box = Make();
  ASSERT_TRUE(box.client);
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<Engine> restarted = std::move(*made);
  auto record = WatchOf(*restarted);
  ASSERT_TRUE(record);
  ASSERT_TRUE(restarted->Adopt(box.id, box.engine_state, runtime::SandboxState::kRunning));
  Gate gate(*restarted, box.id, "/tmp/adopted", "/bin/cat /tmp/adopted");
  auto seen = record->WaitFor(ExecOf(box.id, {"/bin/cat", "/tmp/adopted"}));
  gate.Open();
  EXPECT_TRUE(seen) << "an adopted sandbox's process was not reported";
}

// The watch's threads and descriptors go with the engine.
TEST_P(EngineConformance, AWatchEndsWithItsEngine) {
  NEEDS(process_events);
  const auto count = [](const char* dir) {
    std::error_code ec;
    return std::distance(fs::directory_iterator(dir, ec), fs::directory_iterator());
  };
  const auto fds_before = count("/proc/self/fd");
  const auto threads_before = count("/proc/self/task");
  {
    auto made = GetParam().make(dir_ + "/second", layers_.get());
    ASSERT_TRUE(made) << made.error().message();
    std::unique_ptr<Engine> engine = std::move(*made);
    auto record = WatchOf(*engine);
    ASSERT_TRUE(record);
    EXPECT_GT(count("/proc/self/task"), threads_before) << "the control: a watch has threads";
    EXPECT_FALSE(engine->WatchProcesses(record->Sink(record))) << "a second watch";
    runtime::SandboxSpec spec;
    spec.id = NewSandboxId();
    auto sandbox = engine->Create(spec);
    ASSERT_TRUE(sandbox) << sandbox.error().message();
    {
      auto client = p::BlockingClient::Connect((*sandbox)->TakeAgentChannel());
      ASSERT_TRUE(client);
      p::Exec e;
      e.argv = {"/bin/true", "watched"};
      EXPECT_TRUE(client->Exec(e));
    }
    // Its argv may be lost (it ends at once): its exec is reported all the same.
    EXPECT_TRUE(record->WaitFor([&](const Seen& s) {
      return s.id == spec.id && s.event.kind == Kind::kExec &&
             (s.event.argv_lost ||
              s.event.argv == std::vector<std::string>{"/bin/true", "watched"});
    }));
    EXPECT_TRUE(engine->Destroy(spec.id));
  }
  EXPECT_EQ(count("/proc/self/fd"), fds_before) << "descriptors of this process";
  EXPECT_EQ(count("/proc/self/task"), threads_before) << "threads of this process";
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineConformance, ::testing::ValuesIn(Makers()),
                         [](const auto& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace airlock
