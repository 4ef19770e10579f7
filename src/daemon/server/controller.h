#pragma once
// Controller: the sandbox lifecycle behind the API, and the facade that composes the services
// (docs/design/services.md). It writes the record before the engine acts, refuses calls that do
// not fit the record's state (409 with the current state), reconciles the records with what the
// engines find when the daemon starts (recovery, each record to its own engine), binds networks,
// builds templates, and takes snapshots and forks. What it composes:
//   SandboxTable (sandbox_table.h)  the sandboxes held here, their engines and agent channels
//   ExecService (exec_service.h)    commands and processes
//   FileService (file_service.h)    files and tar streams
//   Expiry (expiry.h)               the TTL reaper and the purge of destroyed records
//   PoolService (pool_service.h)    warm pools and their filler
// The router calls the services through exec(), files(), expiry() and pools().
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
#include "daemon/server/network_event_log.h"
#include "daemon/server/pool_service.h"
#include "daemon/server/sandbox_table.h"
#include "daemon/store/store.h"
#include "protocol/client.h"
#include "net/networks.h"
#include "runtime/registry.h"

namespace airlock::daemon {

// The API's view of a template.
api::TemplateView ToTemplateView(const store::TemplateRecord& record);

// What recovery did at start.
struct RecoveryReport {
  int adopted = 0;          // running / paused sandboxes taken over, alive
  int failed = 0;           // records that could not be recovered: marked failed, resources gone
  int finished = 0;         // destroys a previous run had begun, completed
  int orphans_removed = 0;  // sandboxes the engine had that no live record claimed
  int unavailable = 0;      // records whose engine is unavailable: left as they were
};

// Where template bases that are not templates come from (airlockd.toml: image_dir,
// debian_mirror).
struct ImageSources {
  std::string image_dir;  // OCI image archives are read from below it only; "": none are
  std::string debian_mirror = "http://deb.debian.org/debian";
};

class Controller {
 public:
  // `store` and `engines` outlive the controller.
  Controller(store::Store& store, runtime::EngineRegistry& engines)
      : store_(store),
        engines_(engines),
        sandboxes_(store, engines),
        exec_(sandboxes_),
        files_(sandboxes_),
        expiry_(store, [this](const std::string& id) { return Destroy(id); }),
        pools_(store, engines, sandboxes_, PoolLifecycle()) {}
  ~Controller();
  // Call before serving.
  void SetImageSources(ImageSources sources) { images_ = std::move(sources); }
  // Call before Recover; without it (or with nullptr) only network mode "none" is served.
  void SetNetworks(net::Networks* networks) {
    networks_ = networks;
    pools_.SetNetworks(networks);
  }
  // Where the verdicts of the networks go on their way to the store; NetworkEvents flushes it
  // before reading. Call before serving; it outlives the controller.
  void SetNetworkEventLog(NetworkEventLog* log) { network_events_ = log; }
  // What that log took since start (zeros without one).
  VerdictCounts network_verdicts() const {
    return network_events_ ? network_events_->counts() : VerdictCounts{};
  }

  // Whether this daemon can give a sandbox (or a build) `policy`: 501 without sandbox
  // networking for any mode but none, 409 for open mode without an uplink. Changes nothing.
  [[nodiscard]] Status CheckNetwork(const net::NetworkPolicy& policy) const;

  // Call once at start, before serving. Brings every record and every engine resource into
  // agreement: running / paused sandboxes whose agent is alive are adopted (held as if created
  // here); creating ones (a create the previous run never finished) and those that cannot be
  // adopted are destroyed and marked failed with the reason; destroying ones are finished;
  // sandboxes the engine has but no live record claims are destroyed.
  [[nodiscard]] Result<RecoveryReport> Recover();

  // The services it composes.
  ExecService& exec() { return exec_; }
  FileService& files() { return files_; }
  Expiry& expiry() { return expiry_; }
  PoolService& pools() { return pools_; }

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
  // The sandbox's stored network verdicts (proxy and DNS) after `query.after`, oldest first,
  // with those made up to this call included. Unlike Get, a destroyed sandbox's are served
  // until its record is purged; 404 for unknown and pooled ones.
  [[nodiscard]] Result<store::NetworkEventPage> NetworkEvents(const std::string& id,
                                                              const api::NetworkEventsQuery& query);

  // Shutdown: destroys every sandbox this process holds, pooled ones too. Call after the server
  // has stopped and its workers are joined. (Not calling it keeps them for adoption by the next
  // start.)
  void DestroyAll();

  // Every engine of this build, available or not, with what it can do (GET /v1/engines).
  const std::vector<runtime::EngineStatus>& Engines() const { return engines_.List(); }
  const std::string& default_engine() const { return engines_.default_name(); }

  // --- Templates, snapshots and forks (controller_templates.cc; docs/design/templates.md) --

  // Whether sandboxes can be made from `name` now: "base", or a ready template.
  [[nodiscard]] Status CheckTemplate(const std::string& name);
  // Builds a template: a build sandbox from the base, each step run in it (`log` gets the build
  // events, api/render.h), what it wrote frozen into a layer, the sandbox
  // destroyed. The record is building meanwhile, and failed with the reason if the build is.
  [[nodiscard]] Result<store::TemplateRecord> BuildTemplate(
      const api::CreateTemplateRequest& request, const std::function<void(api::Event)>& log);
  // BuildTemplate on a thread of its own (it outlives a client that goes away); its events as a
  // stream, the last one "done" or "error".
  [[nodiscard]] std::unique_ptr<EventStream> StartBuild(api::CreateTemplateRequest request);
  [[nodiscard]] Result<store::TemplateRecord> GetTemplate(const std::string& name);
  [[nodiscard]] Result<std::vector<store::TemplateRecord>> ListTemplates();
  // 409 while a sandbox (pooled ones too) uses it; its layers go unless something else uses them.
  [[nodiscard]] Status DeleteTemplate(const std::string& name);
  // A new template (ready at once) from what a running or paused sandbox wrote, on top of its
  // own template; the sandbox goes on.
  [[nodiscard]] Result<store::TemplateRecord> Snapshot(const std::string& id,
                                                       const api::SnapshotRequest& request);
  struct Forked {
    std::vector<store::SandboxRecord> sandboxes;
    std::string layer;  // the snapshot they start from
  };
  // `count` new sandboxes that start from a copy of the sandbox's file system (a layer shared
  // copy-on-write); memory and processes are not carried. All or nothing.
  [[nodiscard]] Result<Forked> Fork(const std::string& id, const api::ForkRequest& request);
  // Removes every layer that no template and no live sandbox refers to; how many went.
  Result<int> CollectLayers();

 private:
  // What a new sandbox's root is made of beyond its template's name.
  struct Origin {
    std::vector<std::string> layers;  // topmost first
    std::string workdir;
    std::string root{api::kRootHostUsr};  // what the layers stack on
    std::string engine;  // the template's engine ("": none named)
  };
  // A create request with its template's settings applied (env, limits), what the sandbox is
  // made of, and what runs once it is.
  struct Resolved {
    api::CreateSandboxRequest request;
    Origin origin;
    std::string start_cmd, ready_cmd;
    double ready_timeout_seconds = 0;
  };
  Result<Resolved> ResolveTemplate(const api::CreateSandboxRequest& request);
  // The sandbox a snapshot or fork starts from: running or paused, with room for a layer.
  Result<store::SandboxRecord> SnapshotSource(const std::string& id);
  // The engine's snapshot of the sandbox's writable layer, under its lifecycle lock.
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id);
  // start_cmd in the background, then ready_cmd until it succeeds (or its timeout: an error).
  Status StartTemplateCommands(const std::string& id, const Resolved& resolved);
  // The engine a create gets: the request's, else its template's, else the daemon's default;
  // refused (with what it lacks named) when it cannot make a sandbox of `origin` or with
  // `network`.
  Result<runtime::Engine*> ChooseEngine(const std::string& requested, const Origin& origin,
                                        const net::NetworkPolicy& network);
  // The cold path: a new sandbox for `request`. `pooled`: made by the filler, hidden from the
  // API until claimed, and on failure left destroyed rather than failed (nobody asked for it);
  // with sandbox networking it gets a parked link (a network of mode none: its veth is in no
  // firewall set, so it can send nothing) that a claim turns into the request's network.
  // `origin`: the layers and workdir (default: the template's, resolved here).
  Result<store::SandboxRecord> CreateSandbox(const api::CreateSandboxRequest& request, bool pooled,
                                             const Origin* origin = nullptr);
  // Destroy, and for `allow_pooled` also the pooled sandboxes the API cannot see.
  Status DestroySandbox(const std::string& id, bool allow_pooled);
  // A record nobody will look at (a pooled one that failed) goes to destroyed, so that it is
  // purged like any other instead of lingering hidden as failed.
  void Discard(const std::string& id);
  // Tears down `id` with the engine and records the outcome; the record must be destroying.
  Status FinishDestroy(const std::string& id);
  // Recovery of one record; counts into `report`.
  void RecoverOne(const store::SandboxRecord& record, RecoveryReport& report);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  SandboxTable sandboxes_;
  ExecService exec_;
  FileService files_;
  Expiry expiry_;
  PoolService pools_;
  // What the pools are given of the lifecycle.
  PoolService::Lifecycle PoolLifecycle();
  std::mutex patch_mu_;  // a metadata merge is read-modify-write

  // Held from a snapshot until what refers to the new layer is recorded, and by CollectLayers:
  // a layer is never collected between its making and its first use. Recursive: a destroy
  // under it (undoing a fork) collects too.
  // The base a build starts from: "base", a template, a Debian suite (made on first use) or an
  // OCI image archive (imported). Fills the build's layers, root and inherited settings.
  struct Base {
    std::vector<std::string> layers;
    std::string root{api::kRootHostUsr};
    std::optional<api::TemplateSettings> settings;  // what the base gives its sandboxes
  };
  Result<Base> PrepareBase(const std::string& base, const std::function<void(api::Event)>& log);
  // The record of "debian:<suite>", made with mmdebstrap if there is none yet (or only a failed
  // one); a build of it that is under way is waited for.
  Result<store::TemplateRecord> DebianBase(const std::string& name,
                                           const std::function<void(api::Event)>& log);
  Result<Base> ImportImage(const std::string& path, const std::function<void(api::Event)>& log);
  // Holds off CollectLayers while a layer exists that no record names yet (an import).
  class LayerPin {
   public:
    explicit LayerPin(Controller& c);
    ~LayerPin();
    LayerPin(const LayerPin&) = delete;
    LayerPin& operator=(const LayerPin&) = delete;

   private:
    Controller& c_;
  };

  // The sandbox's network policy as its record keeps it (mode none when it has none).
  static net::NetworkPolicy PolicyOf(const store::SandboxRecord& r);
  void DetachNetwork(const std::string& id);

  ImageSources images_;
  net::Networks* networks_ = nullptr;
  NetworkEventLog* network_events_ = nullptr;
  std::recursive_mutex layers_mu_;
  int layer_pins_ = 0;                // LayerPins alive; guarded by layers_mu_
  bool collection_deferred_ = false;  // a CollectLayers a pin held off; guarded by layers_mu_
  std::mutex builds_mu_;
  std::vector<std::thread> builds_;        // StartBuild's threads; guarded by builds_mu_
  std::set<std::string> build_sandboxes_;  // sandboxes builds run in; guarded by builds_mu_
  bool builds_stop_ = false;               // no new build sandbox; guarded by builds_mu_
  // Stops the builds: destroys their sandboxes (each build then fails) and joins their threads.
  void JoinBuilds();
};

}  // namespace airlock::daemon
