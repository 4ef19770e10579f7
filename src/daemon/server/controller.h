#pragma once
// Controller: the sandbox lifecycle behind the API, and the facade that composes the services
// (docs/design/services.md). It writes the record before the engine acts, refuses calls that do
// not fit the record's state (409 with the current state) and binds networks. What it composes:
//   SandboxTable (sandbox_table.h)  the sandboxes held here, their engines and agent channels
//   ExecService (exec_service.h)    commands and processes
//   FileService (file_service.h)    files and tar streams
//   Expiry (expiry.h)               the TTL reaper and the purge of destroyed records
//   PoolService (pool_service.h)    warm pools and their filler
//   TemplateService, SnapshotService (template_service.h)  templates, builds, bases; snapshots
//                                   and forks
//   LayerKeeper (layer_keeper.h)    when layers of the shared layer store may go
//   Recovery (recovery.h)           what a start does before serving
// The router calls the services through exec(), files(), expiry(), pools(), templates() and
// snapshots().
//
// Every method blocks (SQLite, the engine, the agent): call them from the daemon's worker pool,
// never from an IO thread. Thread-safe. Requests arrive already validated (api/types.h).

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/server/exec_service.h"
#include "daemon/server/expiry.h"
#include "daemon/server/file_service.h"
#include "daemon/server/metrics.h"
#include "daemon/server/recorder.h"
#include "daemon/server/pool_service.h"
#include "daemon/server/quota_gate.h"
#include "daemon/server/recovery.h"
#include "daemon/server/sampler.h"
#include "daemon/server/sandbox_table.h"
#include "daemon/server/template_service.h"
#include "daemon/store/store.h"
#include "net/networks.h"
#include "protocol/client.h"
#include "runtime/registry.h"

namespace airlock::daemon {

// The API's view of a template.
api::TemplateView ToTemplateView(const store::TemplateRecord& record);

class Controller {
 public:
  // `store`, `engines` and `recorder` outlive the controller.
  Controller(store::Store& store, runtime::EngineRegistry& engines, Recorder& recorder)
      : store_(store),
        engines_(engines),
        recorder_(recorder),
        sandboxes_(store, engines, recorder),
        sampler_(store, sandboxes_),
        exec_(sandboxes_),
        files_(sandboxes_),
        expiry_(store, [this](const std::string& id) { return Destroy(id, kExpired); }),
        layers_(store, engines.layers()),
        quotas_(store),
        pools_(store, engines, sandboxes_, quotas_, PoolLifecycle()),
        templates_(store, engines, sandboxes_, exec_, files_, layers_, pools_, Maker(),
                   [this](const net::NetworkPolicy& policy) { return CheckNetwork(policy); }),
        snapshots_(store, sandboxes_, layers_, Maker()) {
    expiry_.SetSweep([this] { PauseIdle(); });
    sandboxes_.SetWaker([this](const std::string& id) -> Status {
      auto resumed = Resume(id);
      if (!resumed) return std::unexpected(resumed.error());
      return {};
    });
  }
  ~Controller();
  // Call before serving.
  void SetImageSources(ImageSources sources) { templates_.SetImageSources(std::move(sources)); }
  // Call before Recover; without it (or with nullptr) only network mode "none" is served.
  void SetNetworks(net::Networks* networks) {
    networks_ = networks;
    pools_.SetNetworks(networks);
    if (networks) {
      sampler_.SetNetBytes([networks](const std::string& id) -> std::optional<NetBytes> {
        auto bytes = networks->Traffic(id);
        if (!bytes) return std::nullopt;
        return NetBytes{bytes->first, bytes->second};
      });
    }
  }
  // The flight recorder (docs/design/recorder.md), which the networks' verdicts go to as well.
  Recorder& recorder() { return recorder_; }
  const runtime::EngineRegistry& engines() const { return engines_; }

  // Whether this daemon can give a sandbox (or a build) `policy`: 501 without sandbox
  // networking for any mode but none, 409 for open mode without an uplink. Changes nothing.
  [[nodiscard]] Status CheckNetwork(const net::NetworkPolicy& policy) const;
  // Where secrets' values come from (the tenant's secret store). Call before serving; without
  // it no sandbox can have secrets bound.
  using SecretValues =
      std::function<Result<std::string>(const std::string& tenant, const std::string& name)>;
  void SetSecretValues(SecretValues values) { secret_values_ = std::move(values); }
  // Whether a sandbox of `tenant` may have `policy`'s secrets bound (docs/design/credentials.md):
  // network mode allowlist, every secret in the tenant's store, every host in the allowlist on
  // port 443, a daemon with an egress CA. kInvalidArgument naming the field, 501 without the CA.
  [[nodiscard]] Status CheckSecrets(const net::NetworkPolicy& policy,
                                    const std::string& tenant) const;

  // Call once at start, before serving (recovery.h: Recovery::Run).
  [[nodiscard]] Result<RecoveryReport> Recover();

  // The services it composes.
  ExecService& exec() { return exec_; }
  FileService& files() { return files_; }
  Expiry& expiry() { return expiry_; }
  Sampler& sampler() { return sampler_; }
  PoolService& pools() { return pools_; }
  QuotaGate& quotas() { return quotas_; }
  TemplateService& templates() { return templates_; }
  SnapshotService& snapshots() { return snapshots_; }

  // Inserts the record (creating), creates the sandbox, connects its agent, then running; on
  // any failure the record is failed with the error and the error is returned.
  [[nodiscard]] Result<store::SandboxRecord> Create(const api::CreateSandboxRequest& request);
  // kNotFound for unknown and destroyed sandboxes.
  [[nodiscard]] Result<store::SandboxRecord> Get(const std::string& id);
  // Like Get, but a destroyed sandbox's record is served too (its final state and why it ended,
  // resources["end_reason"]) until it is purged: GET /v1/sandboxes/{id}, and the check before
  // what a sandbox left on record (its events, verdicts, metrics) is read. 404 for pooled ones.
  [[nodiscard]] Result<store::SandboxRecord> Describe(const std::string& id);
  // Matching records, oldest first; destroyed ones are never listed.
  [[nodiscard]] Result<std::vector<store::SandboxRecord>> List(const api::ListFilter& filter);
  // Restarts the TTL from now and/or merges the metadata patch and/or changes the limits
  // (cpus, memory_mb, pids_max: ChangeLimits); refused (409) once destroyed. Nothing changes
  // when the patch is refused.
  [[nodiscard]] Result<store::SandboxRecord> Patch(const std::string& id,
                                                   const api::PatchSandboxRequest& request);
  // running / paused / failed -> destroying -> destroyed (failed if the engine could not).
  // `reason` is why it ends, on record (resources["end_reason"]) and in the log.
  [[nodiscard]] Status Destroy(const std::string& id, std::string_view reason = kDeleted);
  [[nodiscard]] Result<store::SandboxRecord> Pause(const std::string& id);
  // running -> hibernated: saved to disk with its memory (Capabilities::memory_checkpoint). A
  // sandbox the engine could not save runs on (409 with why), unless the save stopped it: then
  // it is failed with the reason.
  [[nodiscard]] Result<store::SandboxRecord> Hibernate(const std::string& id);
  // Pauses (or hibernates, as its auto_pause says) every running sandbox whose auto-pause idle
  // time has passed since a call last used its agent, with no command in the foreground (the
  // expiry thread's sweep). Returns how many it paused.
  int PauseIdle();
  // paused -> running (thawed), or hibernated -> running (restored; failed with the reason if
  // the restore fails). Also what a call to a sandbox the idle sweep paused does first.
  [[nodiscard]] Result<store::SandboxRecord> Resume(const std::string& id);
  // The sandbox's events (docs/design/recorder.md) after `query.after`, oldest first, with those
  // recorded up to this call included; like NetworkEvents, served until the record is purged.
  [[nodiscard]] Result<store::EventPage> Events(const std::string& id,
                                                const api::EventsQuery& query);
  // The sandbox's stored network verdicts (proxy and DNS) after `query.after`, oldest first,
  // with those made up to this call included. Unlike Get, a destroyed sandbox's are served
  // until its record is purged; 404 for unknown and pooled ones.
  [[nodiscard]] Result<store::NetworkEventPage> NetworkEvents(const std::string& id,
                                                              const api::NetworkEventsQuery& query);

  // The sandbox's samples (sampler.h) in the query's window. Like NetworkEvents, served after
  // the destroy until the record is purged; 404 for unknown and pooled ones.
  [[nodiscard]] Result<store::MetricPage> Metrics(const std::string& id,
                                                  const api::MetricsQuery& query);

  // Shutdown: destroys every sandbox this process holds, pooled ones too. Call after the server
  // has stopped and its workers are joined. (Not calling it keeps them for adoption by the next
  // start.)
  void DestroyAll();

  // Every engine of this build, available or not, with what it can do (GET /v1/engines).
  const std::vector<runtime::EngineStatus>& Engines() const { return engines_.List(); }
  const std::string& default_engine() const { return engines_.default_name(); }

 private:
  // The engine a create gets: the request's, else its template's, else the daemon's default;
  // refused (with what it lacks named) when it cannot make a sandbox of `origin` or with
  // `network`.
  Result<runtime::Engine*> ChooseEngine(const std::string& requested, const SandboxOrigin& origin,
                                        const net::NetworkPolicy& network);
  // The engine a create gets by name: the request's, else its template's, else the default.
  std::string EngineName(const std::string& requested, const std::string& template_engine) const;
  // A held sandbox under its lifecycle lock, its record in one of `from` (409 otherwise; 503 or
  // the engine's unavailability when this daemon does not hold it): what pause, hibernate and
  // resume start from.
  struct Locked {
    std::shared_ptr<HeldSandbox> live;
    std::unique_lock<std::mutex> lock;
    store::SandboxState state;
  };
  Result<Locked> LockHeld(const std::string& id, std::span<const store::SandboxState> from);
  // Whether the engine a create would get can pause (auto_pause) or hibernate (auto_pause with
  // memory) the sandbox: 409 naming the capability it lacks.
  Status CheckAutoPause(const api::CreateSandboxRequest& request,
                        const std::string& template_engine);
  // Pause and Hibernate; `idle`: the idle sweep's (the record is marked kAutoPaused).
  Result<store::SandboxRecord> DoPause(const std::string& id, bool idle);
  Result<store::SandboxRecord> DoHibernate(const std::string& id, bool idle);
  // The cold path: a new sandbox for `request`. `pooled`: made by the filler, hidden from the
  // API until claimed, and on failure left destroyed rather than failed (nobody asked for it);
  // with sandbox networking it gets a parked link (a network of mode none: its veth is in no
  // firewall set, so it can send nothing) that a claim turns into the request's network.
  // `origin`: the layers and workdir (default: the template's, resolved here).
  Result<store::SandboxRecord> CreateSandbox(const api::CreateSandboxRequest& request, bool pooled,
                                             const SandboxOrigin* origin = nullptr);
  // Destroy, and for `allow_pooled` also the pooled sandboxes the API cannot see.
  Status DestroySandbox(const std::string& id, bool allow_pooled, std::string_view reason);
  // A record nobody will look at (a pooled one that failed) goes to destroyed, so that it is
  // purged like any other instead of lingering hidden as failed.
  void Discard(const std::string& id);
  // Tears down `id` with the engine and records the outcome; the record must be destroying.
  Status FinishDestroy(const std::string& id);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  Recorder& recorder_;
  SandboxTable sandboxes_;
  Sampler sampler_;
  ExecService exec_;
  FileService files_;
  Expiry expiry_;
  LayerKeeper layers_;
  QuotaGate quotas_;
  PoolService pools_;
  TemplateService templates_;
  SnapshotService snapshots_;
  // What the services are given of the lifecycle.
  PoolService::Lifecycle PoolLifecycle();
  SandboxMaker Maker();
  std::mutex patch_mu_;  // a metadata merge is read-modify-write

  // A live change of a running or paused sandbox's limits (PATCH "limits"): 409 naming the
  // engine unless it has Capabilities::live_limits; increases must fit the tenant's quota
  // (429); the record changes only once the engine applied them. The one place a limit
  // changes on a live sandbox.
  Result<store::SandboxRecord> ChangeLimits(const store::SandboxRecord& record,
                                            const api::LimitsPatch& patch);
  // Takes the sandbox's network away (a failure is logged: the sandbox is gone anyway).
  void DetachNetwork(const std::string& id);

  net::Networks* networks_ = nullptr;
  SecretValues secret_values_;
};

}  // namespace airlock::daemon
