#pragma once
// Controller: the sandbox lifecycle behind the API. It writes the record before the engine acts,
// refuses calls that do not fit the record's state (409 with the current state), and owns the
// agent channel of every sandbox this process created.
//
// Every method blocks (SQLite, the engine, the agent): call them from the daemon's worker pool,
// never from an IO thread. Thread-safe. Requests arrive already validated (api/types.h).

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "daemon/api/types.h"
#include "daemon/store/store.h"
#include "protocol/client.h"
#include "runtime/runtime.h"

namespace airlock::daemon {

class Controller {
 public:
  // `store` and `runtime` outlive the controller.
  Controller(store::Store& store, runtime::Runtime& runtime) : store_(store), runtime_(runtime) {}

  // Destroys, by id, what records in creating / running / paused / destroying / failed name
  // (left by a previous run: adoption is not implemented yet) and marks them destroyed, or
  // failed with the reason. Call once at start, before serving.
  [[nodiscard]] Status CleanUpPreviousRun();

  // Inserts the record (creating), creates the sandbox, connects its agent, then running; on
  // any failure the record is failed with the error and the error is returned.
  [[nodiscard]] Result<store::SandboxRecord> Create(const api::CreateSandboxRequest& request);
  // kNotFound for unknown and destroyed sandboxes.
  [[nodiscard]] Result<store::SandboxRecord> Get(const std::string& id);
  // Matching records, oldest first; destroyed ones are never listed.
  [[nodiscard]] Result<std::vector<store::SandboxRecord>> List(const api::ListFilter& filter);
  // Restarts the TTL from now and/or merges the metadata patch; refused (409) once destroyed.
  // Nothing changes when the patch is refused.
  [[nodiscard]] Result<store::SandboxRecord> Patch(const std::string& id,
                                                   const api::PatchSandboxRequest& request);
  // running / paused / failed -> destroying -> destroyed (failed if the engine could not).
  [[nodiscard]] Status Destroy(const std::string& id);
  [[nodiscard]] Result<store::SandboxRecord> Pause(const std::string& id);
  [[nodiscard]] Result<store::SandboxRecord> Resume(const std::string& id);
  // Runs one command through the sandbox's agent; one at a time per sandbox (others wait).
  [[nodiscard]] Result<protocol::ExecResult> Exec(const std::string& id,
                                                  const api::ExecRequest& request);

  // Shutdown: destroys every sandbox this process created and still holds. Call after the
  // server has stopped and its workers are joined.
  void DestroyAll();

 private:
  struct Live {
    std::mutex lifecycle_mu;  // serializes pause / resume / destroy on the engine
    std::mutex exec_mu;       // one exec at a time on the agent channel
    std::optional<protocol::BlockingClient> client;  // guarded by exec_mu
  };
  std::shared_ptr<Live> FindLive(const std::string& id);
  // Tears down `id` with the engine and records the outcome; the record must be destroying.
  Status FinishDestroy(const std::string& id);

  store::Store& store_;
  runtime::Runtime& runtime_;
  std::mutex patch_mu_;  // a metadata merge is read-modify-write
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Live>> live_;  // guarded by mu_
};

}  // namespace airlock::daemon
