#pragma once
// One cgroup per sandbox, under the daemon's own cgroup, on cgroup v2 or v1 (including the
// "hybrid" layout: v1 controllers with an empty v2 hierarchy beside them).
//
//   v2: <own>/airlock/<id>                     memory.max, memory.swap.max, cpu.max, pids.max
//   v1: <hierarchy>/<own>/airlock/<id>         for memory, cpu, pids and freezer
//
// Every name carries the sandbox id, so that recovery can find what a crash left behind.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::jail {

enum class CgroupVersion { kV1, kV2 };

// Where this process's cgroups are, read from /proc/self/cgroup and the mounts.
struct CgroupLayout {
  CgroupVersion version = CgroupVersion::kV2;
  // v2: the directory sandboxes go under ("<own>/airlock").
  std::string v2_parent;
  // v1: controller ("memory", "cpu", "pids", "freezer") -> the directory sandboxes go under in
  // that controller's hierarchy ("<hierarchy>/<own>/airlock").
  std::map<std::string, std::string> v1_parents;

  // `cgroup_root` is normally /sys/fs/cgroup; tests point it at a fake tree. On v2 this may move
  // the calling process into a leaf "<own>/airlockd" (a cgroup with children cannot hold
  // processes) and enables the memory, cpu and pids controllers for the sandbox subtree.
  [[nodiscard]] static Result<CgroupLayout> Detect(
      const std::string& cgroup_root = "/sys/fs/cgroup",
      const std::string& proc_self_cgroup = "/proc/self/cgroup");
};

struct CgroupLimits {
  double cpus = 1.0;
  uint64_t memory_bytes = 512ull << 20;
  uint64_t pids_max = 256;
};

class SandboxCgroup {
 public:
  // Creates the sandbox's cgroup(s) and applies the limits. Fails (and leaves nothing) if it
  // cannot, or if a cgroup of that id exists already.
  [[nodiscard]] static Result<SandboxCgroup> Create(const CgroupLayout& layout, std::string_view id,
                                                    const CgroupLimits& limits);
  // The cgroup(s) of an existing sandbox, for recovery and destroy after a restart. Succeeds
  // even when some or all are gone (Destroy is then a no-op for those).
  static SandboxCgroup Open(const CgroupLayout& layout, std::string_view id);

  // Changes the limits of an existing cgroup (its processes keep running). Lowering memory
  // below what the cgroup uses now fails (EBUSY) once the kernel cannot reclaim enough.
  [[nodiscard]] Status SetLimits(const CgroupLimits& limits) const;
  // Moves `pid` (0: the caller) into the sandbox's cgroup(s), every hierarchy.
  [[nodiscard]] Status AddProcess(pid_t pid) const;
  [[nodiscard]] Status Freeze() const;
  [[nodiscard]] Status Thaw() const;
  // Every process in the cgroup (empty when gone).
  [[nodiscard]] Result<std::vector<pid_t>> Processes() const;
  // Kills every process in it (frozen first, so that nothing forks meanwhile) and waits, up to
  // `timeout_ms`, until it is empty.
  [[nodiscard]] Status KillAll(int timeout_ms = 5000) const;
  // KillAll, then removes the directories. Idempotent.
  [[nodiscard]] Status Destroy() const;
  // The memory cgroup's limit (0: none), use and memory.stat (name -> value), for the view of
  // /proc/meminfo. v1 names (cache, rss, ...) and v2 names (file, anon, ...) as the kernel
  // gives them.
  struct MemoryUse {
    uint64_t limit = 0;
    uint64_t usage = 0;
    std::map<std::string, uint64_t> stat;
  };
  [[nodiscard]] Result<MemoryUse> Memory() const;
  // The kernel's count of OOM kills in this cgroup.
  [[nodiscard]] Result<uint64_t> OomKills() const;
  // The directories this sandbox's cgroup consists of.
  const std::vector<std::string>& dirs() const { return dirs_; }
  // v1: the directory in `controller`'s hierarchy ("" if none); v2: the one directory.
  std::string Dir(const std::string& controller) const {
    if (version_ == CgroupVersion::kV2) return dirs_.empty() ? "" : dirs_[0];
    auto it = by_controller_.find(controller);
    return it == by_controller_.end() ? "" : it->second;
  }

 private:
  CgroupVersion version_ = CgroupVersion::kV2;
  std::vector<std::string> dirs_;                     // v2: one; v1: one per controller
  std::map<std::string, std::string> by_controller_;  // v1: controller -> dir
};

// The ids of the sandbox cgroups that exist under `layout` (for recovery and leak checks).
std::vector<std::string> ListSandboxCgroups(const CgroupLayout& layout);

}  // namespace airlock::jail
