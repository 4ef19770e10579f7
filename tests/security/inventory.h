// What one airlockd holds on the host, for leak and orphan checks: its sandboxes' processes and
// cgroups, the mounts under its state dir, the network namespaces, veths and nftables entries of
// its network id, its sandbox and staging directories, and its own fd count and RSS.
//
// Take a snapshot before and one after; Leaks(before, after, live) is what the second has that
// the first had not and that no live sandbox owns. Everything is read from /proc, /sys, /run
// and `nft`, and only objects named after this daemon (its state dir, its network id, the
// sandbox ids in its database) are looked at, so other daemons on the host do not interfere.
// Needs root (cgroup.procs of other users' processes, nft).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace airlock::security {

// One object on the host. `owner` is the sandbox id it belongs to ("" when it belongs to none,
// e.g. a child process of the daemon).
struct HostObject {
  std::string kind;  // process, cgroup, mount, netns, veth, nft, dir
  std::string name;  // what identifies it: a path, a pid and command, an nft line
  std::string owner;
  auto operator<=>(const HostObject&) const = default;
};

struct Inventory {
  std::set<HostObject> objects;
  int daemon_fds = -1;       // -1: the daemon is not running
  int64_t daemon_rss_kb = -1;
  // Sandbox id -> network slot, from the records (running, paused, creating ones).
  std::map<std::string, uint32_t> slots;

  // `kind`'s objects, for reports.
  size_t Count(const std::string& kind) const;
};

// The daemon to look at. The cgroup parents are found from the daemon's /proc/<pid>/cgroup at
// construction (a restarted daemon of the same test process has the same ones).
class InventoryTarget {
 public:
  InventoryTarget(pid_t daemon_pid, std::string state_dir, std::string network_id);

  // A snapshot. `daemon_pid` may have changed since construction (a restart); <= 0: not running.
  Inventory Take(pid_t daemon_pid) const;

  const std::vector<std::string>& cgroup_parents() const { return cgroup_parents_; }

 private:
  std::string state_dir_;
  std::string network_id_;
  std::vector<std::string> cgroup_parents_;  // .../airlock, one per hierarchy
};

// What `after` holds that `before` did not, less what belongs to a sandbox in `live`.
std::vector<HostObject> Leaks(const Inventory& before, const Inventory& after,
                              const std::set<std::string>& live);

// Takes snapshots until Leaks() is empty or `timeout` has passed (destroys and the network
// maintainer finish in the background); the last snapshot and its leaks.
struct Settled {
  Inventory inventory;
  std::vector<HostObject> leaks;
};
Settled WaitUntilNoLeaks(const InventoryTarget& target, pid_t daemon_pid, const Inventory& before,
                         const std::set<std::string>& live, std::chrono::milliseconds timeout);

// "kind name (owner)" lines, one per object, for failure messages and reports.
std::string Describe(const std::vector<HostObject>& objects, size_t max = 20);

}  // namespace airlock::security
