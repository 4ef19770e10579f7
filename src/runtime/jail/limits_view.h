#pragma once
// What a jail sandbox sees of its own limits (docs/design/jail.md, "Limits seen from inside"):
// its processes may run on ceil(cpus) CPUs (their affinity: nproc, os.sched_getaffinity), and
// two host files bound read-only into it show its CPUs and memory instead of the host's:
//   SANDBOX_DIR/view/cpu_online  over /sys/devices/system/cpu/online (glibc's get_nprocs,
//                                sysconf(_SC_NPROCESSORS_ONLN), os.cpu_count())
//   SANDBOX_DIR/view/meminfo     over /proc/meminfo (free, psutil, JVM and Node heap sizing):
//                                MemTotal is the memory limit, the rest from its memory cgroup,
//                                rewritten in place (the bind holds the inode) by the engine
// A sandbox whose limits are at or above the host's sees the host's values.

#include <sched.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "runtime/jail/cgroups.h"

namespace airlock::jail {

// The CPUs this thread may run on, ascending.
std::vector<int> AllowedCpus();
// ceil(cpus) of `allowed` from index `start` on (wrapping), ascending; all of them when that
// is as many as `allowed` has.
std::vector<int> ViewCpus(const std::vector<int>& allowed, double cpus, size_t start);
// "0-1,3": a CPU list as the kernel writes it, with a newline.
std::string CpuList(const std::vector<int>& cpus);
cpu_set_t CpuSet(const std::vector<int>& cpus);
// The sandbox's /proc/meminfo from the host's (`host`) and its memory cgroup's `use`: the
// host's own when the cgroup has no limit below the host's MemTotal.
std::string Meminfo(std::string_view host, const SandboxCgroup::MemoryUse& use);
// Writes `content` over `path` in place: the same inode (a bind mount holds it), then cut to
// size. Without `create`, a file that is gone (its sandbox destroyed) is not made again.
[[nodiscard]] Status RewriteInPlace(const std::string& path, std::string_view content,
                                    bool create = false);
// Sets the affinity of every thread of every process in `cgroup` (a process forking meanwhile
// passes its new mask on: the second pass catches a child that copied the old one).
[[nodiscard]] Status PinCpus(const SandboxCgroup& cgroup, const std::vector<int>& cpus);

}  // namespace airlock::jail
