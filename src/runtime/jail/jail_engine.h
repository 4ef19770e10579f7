#pragma once
// The jail engine: Linux namespaces, an overlay root, seccomp, cgroups and a uid range of its
// own per sandbox (docs/design/jail.md). Create runs airlock-jail, the single-threaded launcher,
// so that the (multithreaded) caller never clones a sandbox itself.

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "runtime/engine.h"
#include "runtime/jail/cgroups.h"
#include "runtime/jail/proc_events.h"
#include "runtime/jail/uid_allocator.h"
#include "runtime/layer_store.h"
#include "runtime/registry.h"

namespace airlock::jail {

struct JailOptions {
  std::string state_dir;  // holds jail/<id>/ per sandbox and templates/{base,rootfs}/
  std::string launcher_path;  // airlock-jail
  std::string agent_path;     // airlock-agent (static)
  const runtime::LayerStore* layers = nullptr;  // the shared layer store
  uid_t uid_first = 1u << 30;
  uint32_t uid_slots = 16384;
  std::string cgroup_root = "/sys/fs/cgroup";
  // The base root shows the host's /usr/local (read-only) instead of an empty, writable one of
  // the sandbox's own: what the host's operator installed there becomes visible to every sandbox.
  bool base_usr_local = false;
};

// The registry's factory: options (airlockd.toml [engine.jail]) launcher, uid_first, uid_slots,
// cgroup_root, base_usr_local ("true"/"false"); a launcher not given is airlock-jail beside the
// agent. kInvalidArgument for an option it does not know or a bad value.
[[nodiscard]] Result<std::unique_ptr<runtime::Engine>> MakeEngine(
    const runtime::EngineContext& context, const std::map<std::string, std::string>& options);

class JailEngine : public runtime::Engine {
 public:
  // Detects the cgroup layout and prepares the roots. Needs root.
  [[nodiscard]] static Result<std::unique_ptr<JailEngine>> Open(JailOptions options);
  // Leaves live sandboxes alone (they can be destroyed by id later); removes the cgroup parent
  // directories if no sandbox is left in them.
  ~JailEngine() override;

  std::string_view name() const override { return "jail"; }
  const runtime::Capabilities& capabilities() const override { return capabilities_; }
  Status Probe() override;
  Result<std::unique_ptr<runtime::Sandbox>> Create(const runtime::SandboxSpec& spec) override;
  Status Destroy(const std::string& id) override;
  Result<UniqueFd> ConnectAgent(const std::string& id) override;
  // engine_state: {"init_pid": N, "uid_base": N, "cgroups": [...]} as Create returned it.
  Result<runtime::SandboxInfo> Adopt(const std::string& id, const std::string& engine_state,
                                     runtime::SandboxState state) override;
  Result<std::vector<std::string>> ListSandboxes() override;
  Status UpdateLimits(const std::string& id, const runtime::Limits& limits) override;
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id) override;
  // Its cgroups (v1: cpuacct where mounted; runtime/cgroup_stats.h) and its writable layer.
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
  // The kernel's process events connector (proc_events.h); Lacks when Open could not subscribe
  // (process_events_unavailable() says why).
  Status WatchProcesses(runtime::ProcessEventSink sink) override;
  runtime::ProcessEventCounters ProcessEventCounts() const override;
  // Why capabilities().process_events is false ("" when it is true).
  const std::string& process_events_unavailable() const { return process_events_unavailable_; }

  const CgroupLayout& cgroup_layout() const { return layout_; }
  // Whether the agent is statically linked (a sanitizer build's is not), which a sandbox on its
  // own root file system needs: no host /usr holds its interpreter there.
  bool agent_is_static() const { return agent_static_; }
  std::string SandboxDir(const std::string& id) const;
  // The host pid of a live sandbox's agent (its PID 1), 0 if it is not held here: for the
  // posture checks of tests and tools.
  pid_t InitPid(const std::string& id);
  // The same, read from the engine_state Create or Adopt returned.
  static pid_t InitPidOf(const std::string& engine_state);

 private:
  struct Live {
    pid_t init_pid;
    uid_t uid_base;
    SandboxCgroup cgroup;
    bool paused = false;
    // It sees its own limits (limits_view.h): the CPUs it runs on (empty: not known, after an
    // adopt) and its view files, refreshed by the viewer thread.
    bool view = false;
    std::vector<int> cpus;
  };
  // Rewrites `id`'s meminfo view from its memory cgroup.
  Status RefreshMeminfo(const std::string& id, const SandboxCgroup& cgroup);
  // The viewer thread: every sandbox's meminfo, every kViewRefresh.
  void RefreshViews();

  JailEngine(JailOptions options, CgroupLayout layout);
  std::string TemplateDir(bool host_usr) const;
  // The roots' lowest layers (templates/base, templates/rootfs).
  Status PrepareTemplates();
  runtime::SandboxInfo Info(const std::string& id, const Live& live) const;
  // Undoes a create or destroys a sandbox: kills, reaps, removes, releases. Never fails on
  // what is already gone.
  Status TearDown(const std::string& id, pid_t init_pid, std::optional<uid_t> uid_base,
                  const SandboxCgroup& cgroup);
  // Tells the process watch, if any, of a sandbox added to live_ (mu_ held).
  void WatchLocked(const std::string& id, pid_t init_pid, uid_t uid_base);

  JailOptions options_;
  CgroupLayout layout_;
  UidAllocator uids_;
  runtime::Capabilities capabilities_;
  std::vector<std::string> ro_binds_;  // host top-level dirs that are not symlinks into /usr
  std::vector<std::string> usr_dirs_;  // of kHostUsrDirs, those the host has as directories
  UniqueFd seccomp_bpf_;               // the policy, compiled once: a sealed memfd
  bool agent_static_ = true;
  std::string process_events_unavailable_;
  mutable std::mutex mu_;
  std::map<std::string, Live> live_;
  // Set once by WatchProcesses; told of every sandbox added to or removed from live_ (under mu_).
  std::unique_ptr<ProcessWatch> watch_;
  size_t next_cpu_ = 0;  // guarded by mu_: where the next sandbox's CPUs start
  // The viewer thread and how it is stopped.
  std::mutex viewer_mu_;
  std::condition_variable viewer_cv_;
  bool stop_viewer_ = false;
  std::thread viewer_;
};

}  // namespace airlock::jail
