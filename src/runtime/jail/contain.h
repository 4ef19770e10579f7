#pragma once
// The jail's setup: what airlock-jail (the single-threaded launcher) does to turn itself into a
// sandbox whose PID 1 is airlock-agent. The steps, in order, are the security argument; they
// are in one function in contain.cc that reads top to bottom.

#include <linux/capability.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::jail {

// The capabilities the agent keeps (all of them namespaced: they act only on ids and processes
// of its own sandbox). It switches commands to their user (SETUID, SETGID), drops every
// capability from them before they run (SETPCAP), signals their processes (KILL) and does file
// operations on files its user may own (CHOWN, DAC_OVERRIDE, FOWNER). Commands get none.
inline constexpr int kAgentCaps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_KILL,
                                     CAP_SETGID, CAP_SETUID,       CAP_SETPCAP};

// kAgentCaps as a capability mask, as /proc/<pid>/status shows it (CapEff, CapBnd).
constexpr uint64_t AgentCapabilityMask() {
  uint64_t mask = 0;
  for (int cap : kAgentCaps) mask |= uint64_t{1} << cap;
  return mask;
}

struct JailConfig {
  std::string id;            // becomes the hostname
  std::string sandbox_dir;   // host directory holding empty "disk" and "rootfs" mount points
  std::string template_dir;  // the read-only lowest layer of the root filesystem
  // The layers hold a whole root file system (a Debian or OCI image): nothing of the host's
  // /usr nor its /etc/alternatives is bound in, and its accounts are merged with the sandbox's.
  bool rootfs = false;
  // Without rootfs: the names (of kHostUsrDirs) of the host's /usr directories bound read-only at
  // /usr/<name>; the template has a mount point for each.
  std::vector<std::string> usr_dirs;
  // Without rootfs: /usr/local is the host's, read-only, instead of the sandbox's own (empty,
  // writable, in its layer).
  bool host_usr_local = false;
  // Content-addressed layers (layers.h) stacked on it, topmost first; each is mounted idmapped
  // into the sandbox's uid range, read-only.
  std::vector<std::string> layers;
  // A network namespace (a path like /run/netns/NAME) the sandbox joins instead of a new one
  // with loopback only: made and configured by the host (a veth, addresses, routes, loopback
  // up) and owned by the host's user namespace, so nothing inside can reconfigure it.
  std::string netns;
  std::string nameserver;    // resolv.conf's nameserver (with netns)
  uid_t uid_base = 0;        // sandbox ids 0..65535 map to uid_base.. on the host
  uint64_t disk_mb = 1024;   // the writable layer (a tmpfs inside the sandbox)
  uint64_t tmp_mb = 256;     // /tmp
  uint64_t nofile = 4096;    // RLIMIT_NOFILE
  std::vector<std::string> cgroup_procs;  // cgroup.procs files the sandbox is born into
  std::vector<std::string> ro_binds;      // host directories bound read-only at the same path
  // The sandbox's own cgroup directories, bound read-only at these paths below /sys/fs/cgroup
  // (so the agent can read its memory events and tell an OOM kill): host dir -> inside path.
  std::vector<std::pair<std::string, std::string>> cgroup_binds;
  // The view of its own limits (docs/design/jail.md, "Limits seen from inside"): the host's
  // files sandbox_dir/view/meminfo and sandbox_dir/view/cpu_online, bound read-only over
  // /proc/meminfo and /sys/devices/system/cpu/online. The engine writes and refreshes them.
  bool limits_view = false;
  std::string agent_path;
  std::vector<std::string> agent_args;  // after argv[0]; the channel is fd 3
  int channel_fd = -1;                  // the agent's channel, inherited by the launcher
  int seccomp_fd = -1;                  // the compiled seccomp program (raw BPF), read with pread
};

// What the launcher reports on its report fd, one line:
//   "ok <pid>"                   the sandbox's PID 1 (host pid) runs the agent
//   "error <step> <errno> <pid>" setup step <step> failed with <errno>; <pid> is the sandbox
//                                process that is left to reap, or 0 if none was cloned
// The sandbox process is cloned with CLONE_PARENT: it is the launcher's caller's child, so the
// caller (the daemon) reaps it.
struct LaunchReport {
  pid_t pid = 0;
  std::string failed_step;
  int err = 0;
};
std::string FormatReport(const LaunchReport& report);
[[nodiscard]] Result<LaunchReport> ParseReport(std::string_view line);

// The fd of the sandbox's PID 1 that holds the root of its writable layer (a tmpfs with upper/
// and work/), so that the host can read what the sandbox wrote (/proc/<pid>/fd/4/upper) to
// snapshot it. The agent's commands never inherit it.
inline constexpr int kWritableLayerFd = 4;

// The most layers a sandbox's root may stack (overlayfs allows 500; the mount options must fit
// in a page).
inline constexpr size_t kMaxLayers = 64;

// Runs the launcher: clones the sandbox, maps its ids, waits for it to exec the agent or fail.
// Returns the report to write. Precondition: single-threaded, root on the host.
LaunchReport Launch(const JailConfig& config);

}  // namespace airlock::jail
