#pragma once
// The jail engine: Linux namespaces, an overlay root, seccomp, cgroups and a uid range of its
// own per sandbox (docs/design/jail.md). Create runs airlock-jail, the single-threaded launcher,
// so that the (multithreaded) caller never clones a sandbox itself.

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/unique_fd.h"
#include "runtime/jail/cgroups.h"
#include "runtime/jail/layers.h"
#include "runtime/jail/uid_allocator.h"
#include "runtime/runtime.h"

namespace airlock::jail {

struct JailOptions {
  std::string state_dir;  // holds jail/<id>/ per sandbox, templates/{base,rootfs}/, layers/, staging/
  std::string launcher_path;  // airlock-jail
  std::string agent_path;     // airlock-agent (static)
  uid_t uid_first = 1u << 30;
  uint32_t uid_slots = 16384;
  std::string cgroup_root = "/sys/fs/cgroup";
  // The base root shows the host's /usr/local (read-only) instead of an empty, writable one of
  // the sandbox's own: what the host's operator installed there becomes visible to every sandbox.
  bool base_usr_local = false;
};

class JailRuntime : public runtime::Runtime {
 public:
  // Detects the cgroup layout and prepares the base template. Needs root.
  [[nodiscard]] static Result<std::unique_ptr<JailRuntime>> Open(JailOptions options);
  // Leaves live sandboxes alone (they can be destroyed by id later); removes the cgroup parent
  // directories if no sandbox is left in them.
  ~JailRuntime() override;

  std::string_view name() const override { return "jail"; }
  bool HasTemplate(const std::string& template_name) const override {
    return template_name == runtime::kBaseRoot || template_name == runtime::kRootfsRoot;
  }
  Result<std::unique_ptr<runtime::Sandbox>> Create(const runtime::SandboxSpec& spec) override;
  Status Destroy(const std::string& id) override;
  Result<UniqueFd> ConnectAgent(const std::string& id) override;
  Result<runtime::SandboxInfo> Adopt(const std::string& id, pid_t init_pid, bool paused) override;
  Result<std::vector<std::string>> ListSandboxes() override;
  Status UpdateLimits(const std::string& id, const runtime::Limits& limits) override;
  bool HasLayer(const std::string& digest) const override { return layers_.Has(digest); }
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id) override;
  Result<runtime::LayerSnapshot> ImportLayer(
      const std::function<Status(const std::string& dir)>& fill) override;
  Status RemoveLayer(const std::string& digest) override { return layers_.Remove(digest); }
  Result<std::vector<std::string>> ListLayers() override { return layers_.List(); }
  Status Pause(const std::string& id) override;
  Status Resume(const std::string& id) override;
  Status Checkpoint(const std::string& id, const std::string& dir) override;
  Result<std::unique_ptr<runtime::Sandbox>> Restore(const runtime::SandboxSpec& spec,
                                                    const std::string& dir) override;

  const CgroupLayout& cgroup_layout() const { return layout_; }
  // Whether the agent is statically linked (a sanitizer build's is not), which a sandbox on its
  // own root file system needs: no host /usr holds its interpreter there.
  bool agent_is_static() const { return agent_static_; }
  std::string SandboxDir(const std::string& id) const;
  std::string TemplateDir(const std::string& name) const;
  std::string StagingDir() const;  // where ImportLayer's trees are written

 private:
  struct Live {
    pid_t init_pid;
    uid_t uid_base;
    SandboxCgroup cgroup;
    bool paused = false;
  };

  JailRuntime(JailOptions options, CgroupLayout layout)
      : options_(std::move(options)),
        layout_(std::move(layout)),
        uids_(options_.uid_first, options_.uid_slots),
        layers_(options_.state_dir + "/layers") {}
  // The roots' lowest layers (templates/base, templates/rootfs) and an empty staging/.
  Status PrepareTemplates();
  runtime::SandboxInfo Info(const std::string& id, pid_t init_pid, uid_t uid_base,
                            const SandboxCgroup& cgroup) const;
  // Undoes a create or destroys a sandbox: kills, reaps, removes, releases. Never fails on
  // what is already gone.
  Status TearDown(const std::string& id, pid_t init_pid, std::optional<uid_t> uid_base,
                  const SandboxCgroup& cgroup);

  JailOptions options_;
  CgroupLayout layout_;
  UidAllocator uids_;
  LayerStore layers_;
  std::vector<std::string> ro_binds_;  // host top-level dirs that are not symlinks into /usr
  std::vector<std::string> usr_dirs_;  // of kHostUsrDirs, those the host has as directories
  UniqueFd seccomp_bpf_;               // the policy, compiled once: a sealed memfd
  bool agent_static_ = true;
  std::mutex mu_;
  std::map<std::string, Live> live_;
};

}  // namespace airlock::jail
