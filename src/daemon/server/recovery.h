#pragma once
// Recovery: what a start of the daemon does before it serves. It brings every record and every
// engine's sandboxes into agreement: running and paused sandboxes whose agent answers are adopted
// by their own engine and held again (with their networks taken back), creating ones (a create
// the previous run never acknowledged) and those that cannot be adopted are destroyed and marked
// failed with the reason, destroys a previous run began are finished, builds it left are failed
// and their sandboxes destroyed, and what an engine holds that no live record claims goes. A
// record whose engine is unavailable now is left as it is (a hibernated sandbox is user data);
// the next start that has the engine takes it back. Then the layers and network namespaces
// nothing names go.
//
// Runs once, on one thread, before serving: it owns nothing and takes no lock of its own.

#include <functional>
#include <string>

#include "common/error.h"
#include "daemon/server/layer_keeper.h"
#include "daemon/server/sandbox_table.h"
#include "daemon/store/store.h"
#include "net/networks.h"
#include "runtime/registry.h"

namespace airlock::daemon {

// What recovery did at start.
struct RecoveryReport {
  int adopted = 0;          // running / paused sandboxes taken over, alive
  int failed = 0;           // records that could not be recovered: marked failed, resources gone
  int finished = 0;         // destroys a previous run had begun, completed
  int orphans_removed = 0;  // sandboxes the engine had that no live record claimed
  int unavailable = 0;      // records whose engine is unavailable: left as they were
};

class Recovery {
 public:
  // What recovery needs of the lifecycle.
  struct Lifecycle {
    // Tears down a sandbox whose record is destroying.
    std::function<Status(const std::string& id)> finish_destroy;
    std::function<Status(const std::string& id)> destroy;
    // A pooled record nobody will look at goes to destroyed.
    std::function<void(const std::string& id)> discard;
  };

  // Everything given outlives the recovery; `networks` may be nullptr (no sandbox networking).
  Recovery(store::Store& store, runtime::EngineRegistry& engines, SandboxTable& sandboxes,
           LayerKeeper& layers, net::Networks* networks, Lifecycle lifecycle)
      : store_(store),
        engines_(engines),
        sandboxes_(sandboxes),
        layers_(layers),
        networks_(networks),
        lifecycle_(std::move(lifecycle)) {}

  [[nodiscard]] Result<RecoveryReport> Run();

 private:
  // Recovery of one record; counts into `report`.
  void One(const store::SandboxRecord& record, RecoveryReport& report);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  SandboxTable& sandboxes_;
  LayerKeeper& layers_;
  net::Networks* networks_;
  Lifecycle lifecycle_;
};

}  // namespace airlock::daemon
