#pragma once
// FakeEngine: an engine with no isolation at all, for tests that need no root (the controller's
// services, the engine conformance suite). Each "sandbox" is a real airlock-agent started as an
// ordinary child process of the test, listening on a unix socket in the sandbox's directory,
// its file operations confined to <dir>/root (which holds /home/user and /tmp). Commands run on
// the host as the test's own user: never use it for anything but tests.
//
// It keeps the engine contract honestly: capabilities say what it does (no pause, no live
// limits, no networking; layer snapshots of <dir>/root), Adopt checks the agent it finds, and
// Destroy is idempotent and leaves nothing. Engine state: {"pid": N}.

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/layer_store.h"

namespace airlock::testing {

class FakeEngine : public runtime::Engine {
 public:
  // `state_dir`: its sandboxes' directories go in <state_dir>/fake; `agent_path`: airlock-agent.
  FakeEngine(std::string state_dir, std::string agent_path, const runtime::LayerStore* layers,
             std::string name = "fake");
  // Leaves its sandboxes running (as an engine does), for Adopt by another instance.
  ~FakeEngine() override = default;

  std::string_view name() const override { return name_; }
  const runtime::Capabilities& capabilities() const override { return capabilities_; }
  Status Probe() override;
  Result<std::unique_ptr<runtime::Sandbox>> Create(const runtime::SandboxSpec& spec) override;
  Status Destroy(const std::string& id) override;
  Result<UniqueFd> ConnectAgent(const std::string& id) override;
  Result<runtime::SandboxInfo> Adopt(const std::string& id, const std::string& engine_state,
                                     runtime::SandboxState state) override;
  Result<std::vector<std::string>> ListSandboxes() override;
  Status UpdateLimits(const std::string& id, const runtime::Limits& limits) override;
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id) override;
  // The agent's /proc/<pid>/stat (its children's CPU once reaped) and the files under its root.
  Result<runtime::SandboxStats> Stats(const std::string& id) override;
  Status Alive(const std::string& id) override;
  Status Pause(const std::string& id) override;
  Status Resume(const std::string& id) override;
  Result<runtime::Hibernation> Hibernate(const std::string& id) override;
  Result<std::unique_ptr<runtime::Sandbox>> Wake(const std::string& id) override;
  Result<runtime::MemoryImage> SaveMemoryImage(const std::string& id,
                                               const ImageSaved& saved) override;
  Status RemoveMemoryImage(const std::string& image) override;
  Result<std::vector<std::string>> ListMemoryImages() override { return {}; }

  std::string SandboxDir(const std::string& id) const;
  // The agent's pid of a live sandbox held here (0 if none).
  pid_t AgentPid(const std::string& id);

 private:
  std::string state_dir_, agent_path_, name_;
  const runtime::LayerStore* layers_;
  runtime::Capabilities capabilities_;
  std::mutex mu_;
  std::map<std::string, pid_t> live_;  // id -> agent pid
};

}  // namespace airlock::testing
