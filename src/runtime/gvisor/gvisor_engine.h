#pragma once
// The gVisor engine: each sandbox is a runsc sandbox, gVisor's user-space kernel (the Sentry)
// between its processes and the host's kernel (docs/design/gvisor.md). For each sandbox the
// engine writes an OCI bundle: the root an overlay of the shared layer store's layers (over a
// skeleton of mount points, or the host's /usr bound read-only) under a writable layer on a
// tmpfs capped at disk_mb, both mounted on the host in the sandbox's directory; airlock-agent
// bound in read-only as the container's init, with the seccomp policy it installs on itself; and
// a directory of the host bound in, where the agent makes its socket (runsc --host-uds=all) and
// the daemon connects to it. A networked sandbox joins the daemon's network namespace.

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "runtime/engine.h"
#include "runtime/gvisor/trace_watch.h"
#include "runtime/layer_store.h"
#include "runtime/registry.h"

namespace airlock::gvisor {

struct GvisorOptions {
  std::string state_dir;  // holds gvisor/sandboxes/<id>/ and the roots' skeletons gvisor/{base,rootfs}
  std::string runsc_path = "runsc";  // looked up in /usr/sbin, /usr/bin, /sbin, /bin if bare
  std::string agent_path;            // airlock-agent
  const runtime::LayerStore* layers = nullptr;
  // runsc --platform: ptrace; kvm where KVM runs guests; auto: kvm if a trial sandbox on it
  // runs (ChoosePlatform), else ptrace. The daemon's default is auto.
  std::string platform = "ptrace";
  std::string platform_why;  // how auto chose (Open fills it), for GET /v1/engines
  // runsc puts each sandbox in the cgroup <cgroup_parent>/<id> of every hierarchy it uses.
  std::string cgroup_parent = "airlock-gvisor";
};

// The platform "auto" picks: kvm when /dev/kvm opens and a runsc sandbox on KVM runs `true`
// to its end within a few seconds (a device that exists but cannot run a guest, as in some
// nested VMs, hangs instead), else ptrace; and why, in words. `work` is a scratch directory
// and the trial's cgroups are <cgroup_parent>/platform-trial-<pid> (both made and removed).
struct PlatformChoice {
  std::string platform;
  std::string why;
};
[[nodiscard]] PlatformChoice ChoosePlatform(const std::string& runsc_path,
                                            const std::string& work,
                                            const std::string& cgroup_parent);

// The registry's factory: options (airlockd.toml [engine.gvisor]) runsc, platform,
// cgroup_parent. kInvalidArgument for an option it does not know or a bad value;
// kFailedPrecondition when runsc is not installed or this is not root.
[[nodiscard]] Result<std::unique_ptr<runtime::Engine>> MakeEngine(
    const runtime::EngineContext& context, const std::map<std::string, std::string>& options);

class GvisorEngine : public runtime::Engine {
 public:
  // Checks runsc and the agent, and prepares the roots' skeletons. Needs root.
  [[nodiscard]] static Result<std::unique_ptr<GvisorEngine>> Open(GvisorOptions options);
  // Leaves live sandboxes alone (they can be destroyed by id later).
  ~GvisorEngine() override = default;

  std::string_view name() const override { return "gvisor"; }
  const runtime::Capabilities& capabilities() const override { return capabilities_; }
  Status Probe() override;
  Result<std::unique_ptr<runtime::Sandbox>> Create(const runtime::SandboxSpec& spec) override;
  Status Destroy(const std::string& id) override;
  Result<UniqueFd> ConnectAgent(const std::string& id) override;
  // engine_state: {"pid": N} (the sandbox's Sentry, as runsc reports it) as Create or Wake
  // returned it; {"hibernated": true} as Hibernate did.
  Result<runtime::SandboxInfo> Adopt(const std::string& id, const std::string& engine_state,
                                     runtime::SandboxState state) override;
  Result<std::vector<std::string>> ListSandboxes() override;
  Status UpdateLimits(const std::string& id, const runtime::Limits& limits) override;
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id) override;
  // runsc's host cgroups and the writable layer's tmpfs.
  Result<runtime::SandboxStats> Stats(const std::string& id) override;
  Status Alive(const std::string& id) override;
  Status Pause(const std::string& id) override;
  Status Resume(const std::string& id) override;
  // `runsc checkpoint` after the agent quiesced (it holds no host socket then: a listening or
  // connected host socket cannot be saved), the image in <dir>/memory; then everything of the
  // sandbox that runs is stopped. Only a sandbox without a network: runsc cannot save its host
  // networking (docs/design/gvisor.md).
  Result<runtime::Hibernation> Hibernate(const std::string& id) override;
  // `runsc restore` from <dir>/memory with the bundle it was made from; the agent listens again
  // once it sees the wake file the engine made in its directory.
  Result<std::unique_ptr<runtime::Sandbox>> Wake(const std::string& id) override;

  // A memory image in <state>/gvisor/memory-images/<image>/: `checkpoint/` (runsc's) and
  // `upper/` (a copy of the sandbox's writable layer at the checkpoint). The sandbox is restored
  // from it and runs on. Only a sandbox without a network (as Hibernate). Images stay across
  // restarts (templates restore them); recovery removes those nothing names.
  Result<runtime::MemoryImage> SaveMemoryImage(const std::string& id,
                                               const ImageSaved& saved) override;
  Status RemoveMemoryImage(const std::string& image) override;
  Result<std::vector<std::string>> ListMemoryImages() override;
  // Through runsc's trace points (trace_watch.h); unavailable when the state dir's path is too
  // long for the sockets' (process_events_unavailable() says).
  Status WatchProcesses(runtime::ProcessEventSink sink) override;
  runtime::ProcessEventCounters ProcessEventCounts() const override;
  const std::string& process_events_unavailable() const { return process_events_unavailable_; }

  std::string SandboxDir(const std::string& id) const;

 private:
  explicit GvisorEngine(GvisorOptions options);
  // The roots' lowest layers: gvisor/base (mount points for the host's /usr) and gvisor/rootfs
  // (mount points only, under a root file system's layers).
  Status PrepareSkeletons();
  std::string SkeletonDir(bool host_usr) const;
  std::string SeccompPath() const;  // the compiled policy the agent installs
  // runsc's --root for a sandbox: in its directory, so that its state goes with it.
  std::string RunscRoot(const std::string& id) const;
  // `runsc <command> <id>` (pause, resume); fails quoting its output unless it exits 0.
  Status Runsc(const std::string& id, const std::string& command) const;
  // `runsc state`: {"status": ..., "pid": N}.
  Result<std::pair<std::string, int>> State(const std::string& id) const;
  // Kills and removes what a sandbox holds, whatever state a crash left it in.
  Status TearDown(const std::string& id);
  // Kills every process in the sandbox's cgroups and removes them (and their parents when no
  // sandbox is left in them); its files stay.
  Status StopProcesses(const std::string& id);
  // The runsc flags a sandbox was started with, which its restore repeats (with its trace
  // session when it is watched).
  std::vector<std::string> RunscFlags(const std::string& id, bool networked);
  // Where a sandbox's trace points are sent, and the session naming it (runsc's
  // --pod-init-config).
  std::string TraceSocket(const std::string& id) const;
  std::string TraceConfig(const std::string& id) const;
  // With a process watch: listens for sandbox `id`'s trace points (its directory exists) and,
  // if `running`, has runsc make the session on it anew (an adopted sandbox's Sentry was
  // sending to the daemon before this one). Failures are logged: the sandbox runs on without
  // process events. Whether it is watched.
  bool Trace(const std::string& id, bool running);
  bool Traced(const std::string& id);
  std::string MemoryImageDir(const std::string& image) const;
  std::string HibernationImage(const std::string& id) const;  // <dir>/memory
  // Whether a sandbox held here can be saved with its memory now: running (not hibernated),
  // without a network.
  Status CheckSaveable(const std::string& id);
  // Quiesces the agent and checkpoints the sandbox to `image`; it stops. On failure it runs on
  // if it could be woken, else it is stopped (the error says which).
  Status SaveTo(const std::string& id, const std::string& image);
  // After a checkpoint: whatever of the sandbox still runs is stopped, runsc's record cleared.
  Status ClearRun(const std::string& id);
  // Restores the sandbox (its bundle in its directory) from `image`: its agent channel and pid.
  // On failure nothing of it runs.
  Result<std::pair<UniqueFd, int>> RestoreFrom(const std::string& id, const std::string& image);
  // `runsc run` or `restore` (`argv`) of sandbox `id`, its output appended to `log`: the exit
  // code, tried again when it met another sandbox's teardown removing the cgroups' parent.
  Result<int> StartRunsc(const std::string& id, const std::vector<std::string>& argv,
                         const std::string& log);
  // Waits for the agent's socket in the sandbox's directory: the channel, or why not (with the
  // end of its console log).
  Result<UniqueFd> AwaitAgent(const std::string& id);
  bool Holds(const std::string& id);
  bool IsHibernated(const std::string& id);

  GvisorOptions options_;
  runtime::Capabilities capabilities_;
  std::vector<std::string> top_dirs_;  // of the host's top-level dirs, those bound (not symlinks)
  std::vector<std::string> usr_dirs_;  // of kHostUsrDirs, those the host has as directories
  bool agent_static_ = true;
  mutable std::mutex mu_;
  std::set<std::string> live_;  // made or adopted by this instance, not destroyed
  std::set<std::string> hibernated_;  // of live_, those saved to disk and not running
  std::unique_ptr<TraceWatch> watch_;  // set once, by WatchProcesses
  std::string process_events_unavailable_;
};

}  // namespace airlock::gvisor
