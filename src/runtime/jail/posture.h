#pragma once
// The jail's posture, checked from the host (shared/SECURITY.md, "Jail posture"): for each
// process of a sandbox, what /proc/<pid> says about its seccomp mode, no_new_privs,
// capabilities, id maps, namespaces, open fds, rlimits and cgroups. A checker, not a guard: it
// reports every check with what it saw, and the caller (a test, an operator's tool) decides.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace airlock::jail {

// What a sandbox's processes must look like.
struct PostureExpectations {
  // Every namespace of a sandbox process must differ from this process's (the daemon's).
  pid_t host_pid = 0;
  // The capabilities the sandbox's PID 1 (the agent) keeps in its own user namespace (effective,
  // permitted and bounding set all exactly this); every other process must have none at all.
  uint64_t agent_caps = 0;
  // RLIMIT_NOFILE: the hard limit of every process, and the soft limit of every process but the
  // agent (which raises its own soft limit to the hard one). 0: not checked.
  uint64_t nofile = 0;
  // Every process's cgroup in the memory and pids hierarchies (v1), or its one cgroup (v2),
  // ends with this, e.g. "/airlock/<id>". Empty: not checked.
  std::string cgroup_suffix;
  // PID 1 of other sandboxes: no id range of ours may overlap one of theirs.
  std::vector<pid_t> other_sandboxes;
};

// One check on one process.
struct PostureCheck {
  pid_t pid = 0;
  std::string process;  // "agent" (PID 1 in the sandbox) or the process's comm
  std::string check;    // "seccomp", "no_new_privs", "capabilities", "uid_map", "gid_map",
                        // "ns <name>", "fds", "rlimits", "cgroup"
  bool ok = false;
  std::string detail;  // what was seen
};

// Runs every check on every pid (a process that is gone by then gets one failed "exists"
// check). Needs to read other users' /proc/<pid>/fd: root on the host. Any thread.
std::vector<PostureCheck> CheckPosture(const std::vector<pid_t>& pids,
                                       const PostureExpectations& expect);

// The failed checks of `checks`.
std::vector<PostureCheck> Findings(const std::vector<PostureCheck>& checks);

// Whether `pid` is PID 1 of a pid namespace below the host's (the last NSpid is 1).
bool IsNamespaceInit(pid_t pid);

}  // namespace airlock::jail
