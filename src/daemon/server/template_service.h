#pragma once
// TemplateService: templates (docs/design/templates.md). Their records (the built-in "base" and
// the store's), what a create of a template gets (its layers, root, engine, env, limits, workdir,
// start and ready commands), builds (a build sandbox from the base, each step run in it, what
// it wrote frozen into a layer, the sandbox destroyed) on threads of their own, and the bases a
// build may start from: a template, a Debian suite (made with mmdebstrap on first use) or an OCI
// image archive (imported). Build sandboxes are made and destroyed by the lifecycle (the
// controller) through the SandboxMaker it gives; steps run through ExecService and FileService.
//
// Owns the build threads and builds_mu_ (which guards them, the build sandboxes and the stop
// flag; never held across a call out). Thread-safe; every method blocks.

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/server/exec_service.h"
#include "daemon/server/file_service.h"
#include "daemon/server/layer_keeper.h"
#include "daemon/server/pool_service.h"
#include "daemon/store/store.h"
#include "net/policy.h"
#include "runtime/registry.h"

namespace airlock::daemon {

// The API's view of a template.
api::TemplateView ToTemplateView(const store::TemplateRecord& record);

// Where template bases that are not templates come from (airlockd.toml: image_dir,
// debian_mirror).
struct ImageSources {
  std::string image_dir;  // OCI image archives are read from below it only; "": none are
  std::string debian_mirror = "http://deb.debian.org/debian";
};

// What a new sandbox's root is made of beyond its template's name.
struct SandboxOrigin {
  std::vector<std::string> layers;  // topmost first
  std::string workdir;
  std::string root{api::kRootHostUsr};  // what the layers stack on
  std::string engine;                   // the template's engine ("": none named)
  // A memory image to start from (runtime::SandboxSpec::memory_image): a fork with memory, or a
  // template's memory snapshot.
  std::string memory_image;
};

// A create request with its template's settings applied (env, limits), what the sandbox is made
// of, and what runs once it is.
struct ResolvedCreate {
  api::CreateSandboxRequest request;
  SandboxOrigin origin;
  std::string start_cmd, ready_cmd;
  double ready_timeout_seconds = 0;
};

// How the template and snapshot services make and destroy the sandboxes they need: the
// lifecycle's cold path (never a pooled sandbox) and its destroy.
struct SandboxMaker {
  std::function<Result<store::SandboxRecord>(const api::CreateSandboxRequest&,
                                             const SandboxOrigin&)>
      create;
  std::function<Status(const std::string& id)> destroy;
};

class TemplateService {
 public:
  // What builds need of the lifecycle beside its sandboxes: whether this daemon can give a
  // build `policy` (Controller::CheckNetwork).
  using CheckNetwork = std::function<Status(const net::NetworkPolicy& policy)>;

  // Everything given outlives the service.
  TemplateService(store::Store& store, runtime::EngineRegistry& engines, SandboxTable& sandboxes,
                  ExecService& exec, FileService& files, LayerKeeper& layers, PoolService& pools,
                  SandboxMaker maker, CheckNetwork check_network)
      : store_(store),
        engines_(engines),
        sandboxes_(sandboxes),
        exec_(exec),
        files_(files),
        layers_(layers),
        pools_(pools),
        maker_(std::move(maker)),
        check_network_(std::move(check_network)) {}
  ~TemplateService() { JoinBuilds(); }
  TemplateService(const TemplateService&) = delete;
  TemplateService& operator=(const TemplateService&) = delete;

  // Call before serving.
  void SetImageSources(ImageSources sources) { images_ = std::move(sources); }

  // Whether sandboxes can be made from `name` now: "base", or a ready template.
  [[nodiscard]] Status Check(const std::string& name);
  // The request with its template's settings under it, and what the sandbox is made of.
  [[nodiscard]] Result<ResolvedCreate> Resolve(const api::CreateSandboxRequest& request);
  // start_cmd in the background, then ready_cmd until it succeeds (or its timeout: an error).
  [[nodiscard]] Status StartCommands(const std::string& id, const ResolvedCreate& resolved);

  [[nodiscard]] Result<store::TemplateRecord> Get(const std::string& name);
  [[nodiscard]] Result<std::vector<store::TemplateRecord>> List();
  // 409 while a sandbox (pooled ones too) uses it; its layers go unless something else uses
  // them, and its pool with it.
  [[nodiscard]] Status Delete(const std::string& name);

  // Builds a template (`log` gets the build events as they happen). The record is building
  // meanwhile, and failed with the reason if the build is.
  [[nodiscard]] Result<store::TemplateRecord> Build(const api::CreateTemplateRequest& request,
                                                    const std::function<void(api::Event)>& log);
  // Build on a thread of its own (it outlives a client that goes away); its events as a
  // stream, the last one "done" or "error".
  [[nodiscard]] std::unique_ptr<EventStream> StartBuild(api::CreateTemplateRequest request);
  // Stops the builds: destroys their sandboxes (each build then fails) and joins their threads;
  // no build starts after it.
  void JoinBuilds();

 private:
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
  // A build's memory snapshot: a sandbox of the template (`record`, its layers made) on
  // `engine`, its start_cmd and ready_cmd, then snapshot_after; once that exits 0 the sandbox's
  // processes and memory are saved. `sandbox_id` names the sandbox as soon as it exists (the
  // caller destroys it, whatever happens).
  Result<runtime::MemoryImage> SnapshotMemory(const store::TemplateRecord& record,
                                              const api::TemplateSettings& settings,
                                              const std::string& engine, std::string& sandbox_id,
                                              const std::function<void(api::Event)>& log);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  SandboxTable& sandboxes_;
  ExecService& exec_;
  FileService& files_;
  LayerKeeper& layers_;
  PoolService& pools_;
  SandboxMaker maker_;
  CheckNetwork check_network_;
  ImageSources images_;

  std::mutex builds_mu_;
  std::vector<std::thread> builds_;        // StartBuild's threads; guarded by builds_mu_
  std::set<std::string> build_sandboxes_;  // sandboxes builds run in; guarded by builds_mu_
  bool builds_stop_ = false;               // no new build sandbox; guarded by builds_mu_
};

// SnapshotService: snapshots (a running or paused sandbox's writable layer frozen into a new
// template, the sandbox going on) and forks (N new sandboxes that start from a copy of a
// sandbox's file system, shared copy-on-write; memory and processes are not carried). The
// copies are the engines' (SandboxTable::SnapshotLayer), under the LayerKeeper's lock until the
// records that name the new layer are written. Owns nothing; thread-safe.
class SnapshotService {
 public:
  SnapshotService(store::Store& store, SandboxTable& sandboxes, LayerKeeper& layers,
                  SandboxMaker maker)
      : store_(store), sandboxes_(sandboxes), layers_(layers), maker_(std::move(maker)) {}

  [[nodiscard]] Result<store::TemplateRecord> Snapshot(const std::string& id,
                                                       const api::SnapshotRequest& request);
  struct Forked {
    std::vector<store::SandboxRecord> sandboxes;
    std::string layer;  // the snapshot they start from
  };
  // All or nothing.
  [[nodiscard]] Result<Forked> Fork(const std::string& id, const api::ForkRequest& request);

 private:
  // Fork's with memory: one memory image of the source (which runs on), each fork restored
  // from it on the source's own layers; the image goes once they are made.
  Result<Forked> ForkWithMemory(const store::SandboxRecord& source, api::CreateSandboxRequest like,
                                const api::ForkRequest& request);
  // The sandbox a snapshot or fork starts from: running or paused, with room for a layer.
  Result<store::SandboxRecord> Source(const std::string& id);

  store::Store& store_;
  SandboxTable& sandboxes_;
  LayerKeeper& layers_;
  SandboxMaker maker_;
};

}  // namespace airlock::daemon
