#include "security/inventory.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/syscall.h"
#include "daemon/store/store.h"

namespace airlock::security {
namespace {

namespace fs = std::filesystem;

// A directory's names; none when it is gone. The listing is read with increment(ec), not ++,
// which throws: a directory may go while it is read (a sandboxes' cgroup parent goes with its
// last sandbox, a process from /proc).
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path().filename());
  }
  return out;
}

// A file's contents, "" when it cannot be read. Not an ifstream: a process that ends between
// the open and the read of its /proc files fails the read with ESRCH, on which libstdc++'s
// filebuf throws out of istreambuf_iterator.
std::string ReadAll(const std::string& path) {
  return ReadFileToString(path).value_or("");
}

// pid -> (ppid, comm), for every process on the host.
std::map<pid_t, std::pair<pid_t, std::string>> ProcessTable() {
  std::map<pid_t, std::pair<pid_t, std::string>> table;
  for (const std::string& name : Entries("/proc")) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const std::string stat = ReadAll("/proc/" + name + "/stat");
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    table[std::stoi(name)] = {ppid, stat.substr(open + 1, close - open - 1)};
  }
  return table;
}

// What the store knows: every sandbox id, and the slot of each one that holds a network.
void ReadRecords(const std::string& state_dir, std::set<std::string>& ids,
                 std::map<std::string, uint32_t>& slots) {
  const std::string db = state_dir + "/airlock.db";
  std::error_code ec;
  if (!fs::exists(db, ec)) return;
  auto store = store::Store::Open(db);
  if (!store) {
    std::fprintf(stderr, "inventory: %s\n", store.error().message().c_str());
    return;
  }
  auto records = (*store)->List();
  if (!records) return;
  for (const auto& r : *records) {
    ids.insert(r.id);
    auto slot = r.resources.find("net.slot");
    if (slot == r.resources.end()) continue;
    if (r.state == store::SandboxState::kRunning || r.state == store::SandboxState::kPaused ||
        r.state == store::SandboxState::kCreating) {
      slots[r.id] = static_cast<uint32_t>(std::stoul(slot->second));
    }
  }
}

// "<prefix><slot>" -> the slot, or -1.
int64_t SlotOf(const std::string& name, const std::string& prefix) {
  if (!name.starts_with(prefix) || name.size() == prefix.size()) return -1;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

}  // namespace

size_t Inventory::Count(const std::string& kind) const {
  return std::count_if(objects.begin(), objects.end(),
                       [&](const HostObject& o) { return o.kind == kind; });
}

InventoryTarget::InventoryTarget(pid_t daemon_pid, std::string state_dir, std::string network_id)
    : state_dir_(std::move(state_dir)), network_id_(std::move(network_id)) {
  // "N:controllers:/path" per hierarchy: the sandbox cgroups are <mount><path>/airlock/<id>
  // (src/runtime/jail/cgroups.h). v1 hierarchies are mounted at /sys/fs/cgroup/<controllers>;
  // a v2 line ("0::/path") at /sys/fs/cgroup (v2) or /sys/fs/cgroup/unified (hybrid).
  std::istringstream lines(ReadAll("/proc/" + std::to_string(daemon_pid) + "/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path == "/") path = "";
    if (controllers.starts_with("name=")) continue;
    std::vector<std::string> mounts;
    if (controllers.empty()) {
      mounts = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    } else {
      mounts = {"/sys/fs/cgroup/" + controllers};
    }
    for (const auto& m : mounts) {
      // The daemon may sit in a leaf ".../airlockd" beside ".../airlock" (cgroup v2).
      std::string own = m + path;
      if (own.ends_with("/airlockd")) own.resize(own.size() - 9);
      // The parent itself goes with the last sandbox in it (cgroups.cc), so it may be absent.
      std::error_code ec;
      if (fs::is_directory(own, ec)) cgroup_parents_.push_back(own + "/airlock");
    }
  }
}

Inventory InventoryTarget::Take(pid_t daemon_pid) const {
  Inventory inv;
  std::set<std::string> ids;
  ReadRecords(state_dir_, ids, inv.slots);
  std::map<uint32_t, std::string> owner_of_slot;
  for (const auto& [id, slot] : inv.slots) owner_of_slot[slot] = id;
  auto slot_owner = [&](int64_t slot) -> std::string {
    if (slot < 0) return "";
    auto it = owner_of_slot.find(static_cast<uint32_t>(slot));
    return it == owner_of_slot.end() ? "" : it->second;
  };

  // Cgroups of this daemon's sandboxes, and every process in them.
  std::set<pid_t> in_sandboxes;
  for (const std::string& parent : cgroup_parents_) {
    for (const std::string& id : Entries(parent)) {
      if (!ids.contains(id)) continue;  // another daemon's (the parents are shared)
      const std::string dir = parent + "/" + id;
      inv.objects.insert({"cgroup", dir, id});
      std::istringstream procs(ReadAll(dir + "/cgroup.procs"));
      for (pid_t pid; procs >> pid;) {
        if (!in_sandboxes.insert(pid).second) continue;
        const std::string comm = ReadAll("/proc/" + std::to_string(pid) + "/comm");
        inv.objects.insert({"process", std::to_string(pid) + " " +
                                           comm.substr(0, comm.find('\n')), id});
      }
    }
  }
  // The daemon's descendants (launchers, ip, nft, ...): none should outlive their call.
  if (daemon_pid > 0) {
    const auto table = ProcessTable();
    std::set<pid_t> tree = {daemon_pid};
    bool grew = true;
    while (grew) {
      grew = false;
      for (const auto& [pid, entry] : table) {
        if (tree.contains(entry.first) && tree.insert(pid).second) grew = true;
      }
    }
    tree.erase(daemon_pid);
    for (pid_t pid : tree) {
      if (in_sandboxes.contains(pid)) continue;
      inv.objects.insert({"process", std::to_string(pid) + " " + table.at(pid).second, ""});
    }
    inv.daemon_fds = static_cast<int>(Entries("/proc/" + std::to_string(daemon_pid) + "/fd").size());
    std::istringstream status(ReadAll("/proc/" + std::to_string(daemon_pid) + "/status"));
    for (std::string line; std::getline(status, line);) {
      if (line.starts_with("VmRSS:")) inv.daemon_rss_kb = std::stoll(line.substr(6));
    }
  }

  // Mounts under the state dir (the host's mount table; the daemon shares it).
  std::istringstream mounts(ReadAll("/proc/self/mountinfo"));
  const std::string jail_dir = state_dir_ + "/jail/";
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, point;
    fields >> id >> parent >> devno >> root >> point;
    if (!point.starts_with(state_dir_ + "/")) continue;
    std::string owner;
    if (point.starts_with(jail_dir)) {
      owner = point.substr(jail_dir.size());
      owner = owner.substr(0, owner.find('/'));
    }
    inv.objects.insert({"mount", point, owner});
  }

  // Network namespaces, veths and nftables entries of this network id.
  const std::string netns_prefix = "airlock-" + network_id_ + "-";
  for (const std::string& name : Entries("/run/netns")) {
    if (name.starts_with(netns_prefix)) {
      inv.objects.insert({"netns", name, slot_owner(SlotOf(name, netns_prefix))});
    }
  }
  const std::string veth_prefix = "al" + network_id_ + "-";
  for (const std::string& name : Entries("/sys/class/net")) {
    if (name.starts_with(veth_prefix)) {
      inv.objects.insert({"veth", name, slot_owner(SlotOf(name, veth_prefix))});
    }
  }
  // Every mention of a veth in the table (set elements, rules), one object per mention.
  if (FILE* nft = ::popen(("nft list table inet airlock_" + network_id_ + " 2>/dev/null").c_str(),
                          "r")) {
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, nft)) > 0;) text.append(buf, n);
    ::pclose(nft);
    for (size_t at = text.find(veth_prefix); at != std::string::npos;
         at = text.find(veth_prefix, at + 1)) {
      size_t end = at + veth_prefix.size();
      while (end < text.size() && ::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      const std::string name = text.substr(at, end - at);
      if (SlotOf(name, veth_prefix) >= 0) {
        inv.objects.insert({"nft", "element " + name, slot_owner(SlotOf(name, veth_prefix))});
      }
    }
  }

  // Directories the daemon makes per sandbox and per import.
  for (const std::string& name : Entries(state_dir_ + "/jail")) {
    inv.objects.insert({"dir", state_dir_ + "/jail/" + name, name});
  }
  for (const std::string& name : Entries(state_dir_ + "/staging")) {
    inv.objects.insert({"dir", state_dir_ + "/staging/" + name, ""});
  }
  return inv;
}

std::vector<HostObject> Leaks(const Inventory& before, const Inventory& after,
                              const std::set<std::string>& live) {
  std::vector<HostObject> leaks;
  for (const HostObject& o : after.objects) {
    if (before.objects.contains(o)) continue;
    if (!o.owner.empty() && live.contains(o.owner)) continue;
    leaks.push_back(o);
  }
  if (before.daemon_fds >= 0 && after.daemon_fds > before.daemon_fds) {
    leaks.push_back({"daemon fds",
                     std::to_string(before.daemon_fds) + " -> " +
                         std::to_string(after.daemon_fds),
                     ""});
  }
  return leaks;
}

Settled WaitUntilNoLeaks(const InventoryTarget& target, pid_t daemon_pid, const Inventory& before,
                         const std::set<std::string>& live, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Settled s;
  while (true) {
    s.inventory = target.Take(daemon_pid);
    s.leaks = Leaks(before, s.inventory, live);
    if (s.leaks.empty() || std::chrono::steady_clock::now() > deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

std::string Describe(const std::vector<HostObject>& objects, size_t max) {
  std::string out;
  for (size_t i = 0; i < objects.size() && i < max; ++i) {
    out += objects[i].kind + " " + objects[i].name;
    if (!objects[i].owner.empty()) out += " (" + objects[i].owner + ")";
    out += "\n";
  }
  if (objects.size() > max) out += "... and " + std::to_string(objects.size() - max) + " more\n";
  return out;
}

}  // namespace airlock::security
