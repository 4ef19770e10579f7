#pragma once
// The engine registry (docs/design/engines.md): every engine this build has, built at start
// from the config ([engine.NAME] sections of airlockd.toml), probed, and listed with what it can
// do or why it cannot run. The daemon asks it for an engine by name (a create's `engine`, a
// template's, the default), and for the layer store every engine shares. An engine that fails
// its probe is unavailable and the daemon starts with the others.
//
// Adding an engine: a folder under src/runtime/ with a factory, and one line in
// runtime/engines.cc. Nothing under src/daemon/ names an engine.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "runtime/engine.h"
#include "runtime/layer_store.h"

namespace airlock::runtime {

// What every engine is built with.
struct EngineContext {
  std::string state_dir;   // the daemon's; an engine keeps what it needs below it
  std::string agent_path;  // airlock-agent (the guest agent every engine runs as PID 1)
  const LayerStore* layers = nullptr;
};

// One engine's section of the config: whether to build it, and options only that engine reads
// (its factory refuses one it does not know, with kInvalidArgument naming it).
struct EngineConfig {
  bool enabled = true;
  std::map<std::string, std::string> options;
};

using EngineFactory = std::function<Result<std::unique_ptr<Engine>>(
    const EngineContext& context, const std::map<std::string, std::string>& options)>;

struct EngineRegistration {
  std::string_view name;
  std::string_view description;  // one line for GET /v1/engines
  EngineFactory make;
};

// Every engine this build has (runtime/engines.cc).
const std::vector<EngineRegistration>& RegisteredEngines();

// An engine as the registry found it at start.
struct EngineStatus {
  std::string name;
  std::string description;
  bool enabled = true;         // the config did not turn it off
  bool available = false;      // built and probed
  std::string reason;          // why it is not available
  Capabilities capabilities;   // when available
};

class EngineRegistry {
 public:
  // Prepares the layer store (<state_dir>/layers), then builds and probes every registered
  // engine the config leaves enabled. Fails only on configuration: a section for an engine this
  // build lacks, an option an engine refuses, a default engine that does not exist.
  [[nodiscard]] static Result<std::unique_ptr<EngineRegistry>> Open(
      EngineContext context, const std::map<std::string, EngineConfig>& configs,
      const std::string& default_engine);
  // The given engines, already built (tests: a FakeEngine, the jail made by hand); probed.
  [[nodiscard]] static std::unique_ptr<EngineRegistry> With(
      std::vector<std::unique_ptr<Engine>> engines, std::unique_ptr<LayerStore> layers,
      const std::string& default_engine);
  ~EngineRegistry();

  // Every registered engine, available or not, by name.
  const std::vector<EngineStatus>& List() const { return statuses_; }
  const std::string& default_name() const { return default_; }
  // The engine called `name` when it is available; else the error a request gets: kInvalidArgument
  // for a name no engine has (listing those there are), kFailedPrecondition for one that is
  // unavailable (with the reason).
  [[nodiscard]] Result<Engine*> Get(std::string_view name) const;
  // Whether an engine of that name exists in this build (available or not).
  bool Knows(std::string_view name) const;
  // The available engines.
  std::vector<Engine*> Available() const;
  const LayerStore& layers() const { return *layers_; }

 private:
  EngineRegistry() = default;
  void Add(std::unique_ptr<Engine> engine, std::string description);

  std::unique_ptr<LayerStore> layers_;
  std::vector<EngineStatus> statuses_;
  std::map<std::string, std::unique_ptr<Engine>, std::less<>> engines_;  // available only
  std::string default_;
};

}  // namespace airlock::runtime
