// The engine conformance suite (docs/design/engines.md, "Conformance"): one black-box suite run
// over every engine this machine can build (the jail when root; the FakeEngine of
// tests/support/fake_engine.h always). Each test names the capabilities it needs: an engine
// that lacks one skips the test, saying which; an engine that claims one must pass it, since the
// check is made on the effect (from inside the sandbox, or through its agent), never on what
// the engine says.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/ids.h"
#include "protocol/client.h"
#include "runtime/engine.h"
#include "runtime/jail/jail_engine.h"
#include "runtime/layer_store.h"
#include "support/fake_engine.h"

namespace airlock {
namespace {

namespace fs = std::filesystem;

// Skips the test unless the engine claims the capability (a Capabilities field).
#define NEEDS(capability)  \
  if (!can().capability) \
  GTEST_SKIP() << "the " << GetParam().name << " engine lacks the capability " #capability
namespace p = protocol;
using runtime::Capabilities;
using runtime::Engine;

// How a test makes its engine: a fresh instance on a state dir (a second instance on the same
// dir stands for a restarted daemon). `missing` says why this machine cannot have it.
struct EngineMaker {
  std::string name;
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
      {"jail",
       [] { return ::geteuid() == 0 ? std::string() : std::string("the jail needs root"); },
       [](const std::string& dir, const runtime::LayerStore* layers)
           -> Result<std::unique_ptr<Engine>> {
         jail::JailOptions o;
         o.state_dir = dir;
         o.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
         o.agent_path = AIRLOCK_AGENT_PATH;
         o.layers = layers;
         auto engine = jail::JailEngine::Open(o);
         if (!engine) return std::unexpected(engine.error());
         return std::unique_ptr<Engine>(std::move(*engine));
       }},
      {"fake", [] { return std::string(); },
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
    ASSERT_TRUE(engine_->Probe()) << "its probe fails here";
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
  static p::ExecResult Run(p::BlockingClient& client, const std::string& shell) {
    p::Exec e;
    e.shell = shell;
    e.timeout_ms = 30000;
    auto r = client.Exec(e);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? std::move(*r) : p::ExecResult{};
  }
  static p::ExecResult Run(Box& box, const std::string& shell) {
    if (!box.client) {
      ADD_FAILURE() << "no agent";
      return {};
    }
    return Run(*box.client, shell);
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

TEST_P(EngineConformance, AMemoryLimitHoldsFromTheCreate) {
  NEEDS(limits);
  runtime::SandboxSpec spec;
  spec.limits.memory_mb = 64;
  Box box = Make(spec);
  // 128 MiB touched: over the limit (the control, 16 MiB, fits).
  auto small = Run(box, "python3 -c 'b = bytearray(16 << 20); print(len(b) >> 20)'");
  EXPECT_EQ(small.stdout_data, "16\n") << small.stderr_data;
  auto big = Run(box, "python3 -c 'b = bytearray(128 << 20); print(len(b) >> 20)'");
  EXPECT_NE(big.stdout_data, "128\n") << "128 MiB in a 64 MiB sandbox";
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

TEST_P(EngineConformance, LayersItCannotStackAreRefusedBeforeAnythingIsMade) {
  runtime::SandboxSpec missing;
  missing.id = NewSandboxId();
  missing.root.layers = {std::string(64, 'a')};
  auto refused = engine_->Create(missing);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound);
  runtime::SandboxSpec many;
  many.id = NewSandboxId();
  many.root.layers.assign(can().max_layers + 1, std::string(64, 'b'));
  EXPECT_FALSE(engine_->Create(many)) << "more than max_layers";
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
  auto adopted = restarted->Adopt(box.id, box.engine_state, /*paused=*/false);
  ASSERT_TRUE(adopted) << adopted.error().message();
  EXPECT_EQ(adopted->id, box.id);
  EXPECT_FALSE(adopted->engine_state.empty());
  auto fd = restarted->ConnectAgent(box.id);
  ASSERT_TRUE(fd) << fd.error().message();
  auto client = p::BlockingClient::Connect(std::move(*fd));
  ASSERT_TRUE(client) << client.error().message();
  EXPECT_EQ(client->ReadFile("/tmp/before").value_or(""), "before the restart");
  // Adopting it twice is refused; a destroyed one cannot be adopted.
  EXPECT_FALSE(restarted->Adopt(box.id, box.engine_state, false));
  ASSERT_TRUE(restarted->Destroy(box.id));
  std::erase(made_, box.id);
  auto made_again = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made_again);
  auto gone = (*made_again)->Adopt(box.id, box.engine_state, false);
  ASSERT_FALSE(gone) << "adopted a destroyed sandbox";
}

TEST_P(EngineConformance, ACorruptEngineStateIsRefusedNotTrusted) {
  Box box = Make();
  auto made = GetParam().make(dir_, layers_.get());
  ASSERT_TRUE(made);
  for (const char* bad : {"", "not json", "{}", "{\"init_pid\":1,\"pid\":1}", "[1,2]"}) {
    EXPECT_FALSE((*made)->Adopt(box.id, bad, false)) << "adopted with state " << bad;
  }
  EXPECT_EQ(Run(box, "echo untouched").stdout_data, "untouched\n");
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineConformance, ::testing::ValuesIn(Makers()),
                         [](const auto& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace airlock
