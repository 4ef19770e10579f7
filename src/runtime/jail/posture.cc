#include "runtime/jail/posture.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/jail/contain.h"

namespace airlock::jail {
namespace {

// The namespaces the jail makes for every sandbox. "time" is not one of them (the sandbox
// shares the host's clocks), so it is not compared.
constexpr const char* kNamespaces[] = {"user", "pid", "mnt", "uts", "ipc", "net", "cgroup"};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Proc(pid_t pid, const std::string& what) {
  return "/proc/" + std::to_string(pid) + "/" + what;
}

// The value of "Key:" in /proc/<pid>/status, trimmed ("" if absent).
std::string StatusField(const std::string& status, const std::string& key) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(key + ":")) continue;
    std::string v = line.substr(key.size() + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

std::string ReadLink(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n < 0 ? "<" + std::string(std::strerror(errno)) + ">" : std::string(buf, n);
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

struct IdRange {
  uint64_t inside = 0, outside = 0, count = 0;
};

std::vector<IdRange> IdMap(pid_t pid, const char* file) {
  std::vector<IdRange> ranges;
  std::istringstream in(Slurp(Proc(pid, file)));
  IdRange r;
  while (in >> r.inside >> r.outside >> r.count) ranges.push_back(r);
  return ranges;
}

std::string Describe(const std::vector<IdRange>& ranges) {
  std::string out;
  for (const IdRange& r : ranges) {
    out += (out.empty() ? "" : "; ") + std::to_string(r.inside) + " " + std::to_string(r.outside) +
           " " + std::to_string(r.count);
  }
  return out.empty() ? "<empty>" : out;
}

// The id map of a sandbox: not empty, never the identity (or any range holding host root), and
// no overlap with another sandbox's.
PostureCheck CheckIdMap(pid_t pid, const char* file, const PostureExpectations& expect) {
  PostureCheck c{pid, "", file, true, ""};
  const auto ranges = IdMap(pid, file);
  c.detail = Describe(ranges);
  if (ranges.empty()) {
    c.ok = false;
    c.detail += " (no map)";
  }
  for (const IdRange& r : ranges) {
    if (r.inside == r.outside || r.outside == 0) {
      c.ok = false;
      c.detail += " (maps to itself or holds host id 0)";
    }
  }
  for (pid_t other : expect.other_sandboxes) {
    for (const IdRange& theirs : IdMap(other, file)) {
      for (const IdRange& ours : ranges) {
        if (ours.outside < theirs.outside + theirs.count &&
            theirs.outside < ours.outside + ours.count) {
          c.ok = false;
          c.detail += " (overlaps sandbox PID " + std::to_string(other) + ": " +
                      Describe({theirs}) + ")";
        }
      }
    }
  }
  return c;
}

// fds: a command has stdio only. The agent has stdio, its channel (3, a socket), the root of
// the writable layer (kWritableLayerFd, a directory the host snapshots through), the sandbox's
// own root directory (to resolve paths in it), and what it makes itself to run commands:
// sockets, pipes, terminals, anonymous inodes (epoll, signalfd, pidfd, timerfd) and /dev/null.
// Any other file or directory is a leak. (What stdio is, the agent inherited from whoever
// started the sandbox: the detail shows it.)
PostureCheck CheckFds(pid_t pid, bool agent) {
  PostureCheck c{pid, "", "fds", true, ""};
  DIR* dir = ::opendir(Proc(pid, "fd").c_str());
  if (dir == nullptr) {
    return {pid, "", "fds", false, "cannot list fds: " + std::string(std::strerror(errno))};
  }
  std::vector<std::pair<int, std::string>> fds;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    fds.emplace_back(std::atoi(e->d_name), ReadLink(Proc(pid, "fd/") + e->d_name));
  }
  ::closedir(dir);
  struct stat root {};
  const bool have_root = ::stat(Proc(pid, "root").c_str(), &root) == 0;
  auto is_sandbox_root = [&](int fd) {
    struct stat st {};
    return have_root && ::stat(Proc(pid, "fd/" + std::to_string(fd)).c_str(), &st) == 0 &&
           st.st_dev == root.st_dev && st.st_ino == root.st_ino;
  };
  for (const auto& [fd, target] : fds) {
    c.detail += (c.detail.empty() ? "" : " ") + std::to_string(fd) + "=" + target;
    bool allowed;
    if (fd <= 2) {
      allowed = true;
    } else if (!agent) {
      allowed = false;
    } else if (fd == 3) {
      allowed = target.starts_with("socket:");
    } else if (fd == kWritableLayerFd) {
      allowed = target.starts_with("/");  // the layer's tmpfs root; which one is the host's to say
    } else {
      allowed = target.starts_with("socket:") || target.starts_with("pipe:") ||
                target.starts_with("anon_inode:") || target == "/dev/null" ||
                target == "/dev/ptmx" || target.starts_with("/dev/pts/") || is_sandbox_root(fd);
    }
    if (!allowed) {
      c.ok = false;
      c.detail += "(!)";
    }
  }
  return c;
}

// "Max open files  4096  4096  files" -> {soft, hard}; UINT64_MAX for "unlimited".
bool Limit(const std::string& limits, const std::string& name, uint64_t* soft, uint64_t* hard) {
  std::istringstream in(limits);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(name)) continue;
    std::istringstream fields(line.substr(name.size()));
    std::string s, h;
    fields >> s >> h;
    *soft = s == "unlimited" ? UINT64_MAX : std::strtoull(s.c_str(), nullptr, 10);
    *hard = h == "unlimited" ? UINT64_MAX : std::strtoull(h.c_str(), nullptr, 10);
    return true;
  }
  return false;
}

PostureCheck CheckRlimits(pid_t pid, bool agent, const PostureExpectations& expect) {
  PostureCheck c{pid, "", "rlimits", true, ""};
  const std::string limits = Slurp(Proc(pid, "limits"));
  uint64_t soft = 0, hard = 0;
  if (!Limit(limits, "Max core file size", &soft, &hard) || soft != 0 || hard != 0) {
    c.ok = false;
  }
  c.detail = "core " + std::to_string(soft) + "/" + std::to_string(hard);
  if (expect.nofile != 0) {
    if (!Limit(limits, "Max open files", &soft, &hard) || hard != expect.nofile ||
        (!agent && soft != expect.nofile)) {
      c.ok = false;
    }
    c.detail += ", nofile " + std::to_string(soft) + "/" + std::to_string(hard) + " (want " +
                std::to_string(expect.nofile) + ")";
  }
  return c;
}

// /proc/<pid>/cgroup as the host sees it: "ID:CONTROLLERS:PATH" per hierarchy.
PostureCheck CheckCgroup(pid_t pid, const PostureExpectations& expect) {
  PostureCheck c{pid, "", "cgroup", true, ""};
  std::istringstream in(Slurp(Proc(pid, "cgroup")));
  bool v1 = false;
  std::string unified;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const std::string path = line.substr(b + 1);
    if (controllers == ",,") {
      unified = path;
      continue;
    }
    for (const char* wanted : {",memory,", ",pids,"}) {
      if (controllers.find(wanted) == std::string::npos) continue;
      v1 = true;
      c.detail += (c.detail.empty() ? "" : " ") + line;
      if (!path.ends_with(expect.cgroup_suffix)) c.ok = false;
    }
  }
  if (!v1) {
    c.detail = "0::" + unified;
    c.ok = unified.ends_with(expect.cgroup_suffix);
  }
  return c;
}

std::string Comm(pid_t pid) {
  std::string comm = Slurp(Proc(pid, "comm"));
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

}  // namespace

bool IsNamespaceInit(pid_t pid) {
  const std::string nspid = StatusField(Slurp(Proc(pid, "status")), "NSpid");
  return nspid.find_first_of(" \t") != std::string::npos && nspid.ends_with("\t1");
}

std::vector<PostureCheck> CheckPosture(const std::vector<pid_t>& pids,
                                       const PostureExpectations& expect) {
  std::vector<PostureCheck> out;
  for (pid_t pid : pids) {
    const std::string status = Slurp(Proc(pid, "status"));
    if (status.empty()) {
      out.push_back({pid, "?", "exists", false, "/proc/" + std::to_string(pid) + " is gone"});
      continue;
    }
    const bool agent = IsNamespaceInit(pid);
    const std::string name = agent ? "agent" : Comm(pid);
    std::vector<PostureCheck> checks;
    const std::string seccomp = StatusField(status, "Seccomp");
    checks.push_back({pid, name, "seccomp", seccomp == "2", "Seccomp: " + seccomp});
    const std::string nnp = StatusField(status, "NoNewPrivs");
    checks.push_back({pid, name, "no_new_privs", nnp == "1", "NoNewPrivs: " + nnp});

    PostureCheck caps{pid, name, "capabilities", true, ""};
    const std::string want = Hex(agent ? expect.agent_caps : 0);
    for (const char* set : {"CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"}) {
      const std::string have = StatusField(status, set);
      const bool agent_set = std::strcmp(set, "CapAmb") != 0 && std::strcmp(set, "CapInh") != 0;
      const std::string expected = agent_set ? want : Hex(0);
      caps.detail += (caps.detail.empty() ? "" : " ") + std::string(set) + "=" + have;
      if (have != expected) {
        caps.ok = false;
        caps.detail += "(want " + expected + ")";
      }
    }
    checks.push_back(caps);

    checks.push_back(CheckIdMap(pid, "uid_map", expect));
    checks.push_back(CheckIdMap(pid, "gid_map", expect));
    for (const char* ns : kNamespaces) {
      const std::string theirs = ReadLink(Proc(pid, "ns/") + ns);
      const std::string ours = ReadLink(Proc(expect.host_pid, "ns/") + ns);
      checks.push_back({pid, name, std::string("ns ") + ns,
                        theirs != ours && !theirs.starts_with("<"),
                        theirs + (theirs == ours ? " (the host's)" : "")});
    }
    checks.push_back(CheckFds(pid, agent));
    checks.push_back(CheckRlimits(pid, agent, expect));
    if (!expect.cgroup_suffix.empty()) checks.push_back(CheckCgroup(pid, expect));
    for (PostureCheck& c : checks) {
      c.process = name;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<PostureCheck> Findings(const std::vector<PostureCheck>& checks) {
  std::vector<PostureCheck> failed;
  for (const PostureCheck& c : checks) {
    if (!c.ok) failed.push_back(c);
  }
  return failed;
}

}  // namespace airlock::jail
