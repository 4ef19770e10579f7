#include "daemon/server/doctor.h"

#include <sched.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/error.h"
#include "common/syscall.h"

namespace airlock::daemon {
namespace fs = std::filesystem;
namespace {

// A small file's text, trimmed of the trailing newline; nullopt if it cannot be read.
std::optional<std::string> ReadSmall(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 16);
  if (!text) return std::nullopt;
  while (!text->empty() && (text->back() == '\n' || text->back() == ' ')) text->pop_back();
  return std::move(*text);
}

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(std::move(w));
  return out;
}

bool Has(const std::vector<std::string>& words, std::string_view word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

std::string Join(const std::vector<std::string>& words, std::string_view sep = ", ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : std::string(sep)) + w;
  return out;
}

// The first executable `name` in the colon-separated `path_env`; "" when none.
std::string FindProgram(const std::string& path_env, const std::string& name) {
  std::istringstream dirs(path_env);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
  }
  return "";
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

Finding Kernel(const HostPaths& host) {
  auto release = ReadSmall(host.proc + "/sys/kernel/osrelease");
  if (!release) return {"kernel", Verdict::kWarn, "cannot read the kernel's release", ""};
  int major = 0, minor = 0;
  std::sscanf(release->c_str(), "%d.%d", &major, &minor);
  if (major < 5 || (major == 5 && minor < 10)) {
    return {"kernel", Verdict::kWarn,
            *release +
                ": older than 5.10 (Debian 11's); the engine probes below tell whether "
                "it is enough",
            "run a kernel of 5.10 or later"};
  }
  return {"kernel", Verdict::kOk, *release, ""};
}

Finding Cgroups(const HostPaths& host) {
  const std::string root = host.sys + "/fs/cgroup";
  const std::vector<std::string> needed = {"memory", "cpu", "pids"};
  if (fs::exists(root + "/cgroup.controllers")) {
    // v2: this process's own cgroup must be given the controllers (delegation).
    std::string own = "/";
    if (auto self = ReadSmall(host.proc + "/self/cgroup")) {
      std::istringstream lines(*self);
      for (std::string line; std::getline(lines, line);) {
        if (line.starts_with("0::")) own = line.substr(3);
      }
    }
    const std::string dir = root + (own == "/" ? "" : own);
    const auto present = Words(ReadSmall(dir + "/cgroup.controllers").value_or(""));
    std::vector<std::string> missing;
    for (const auto& c : needed) {
      if (!Has(present, c)) missing.push_back(c);
    }
    if (!missing.empty()) {
      return {"cgroups", Verdict::kFail,
              "cgroup v2, but this process's cgroup " + own + " is not given " + Join(missing) +
                  " (its parent's cgroup.subtree_control does not enable them): sandboxes "
                  "cannot be limited",
              "run airlockd as the packaged systemd service (its unit has Delegate=yes), or "
              "enable them in the parent: echo '+" +
                  Join(missing, " +") + "' > " + fs::path(dir).parent_path().string() +
                  "/cgroup.subtree_control"};
    }
    return {"cgroups", Verdict::kOk, "cgroup v2, " + Join(needed) + " delegated to " + own, ""};
  }
  std::vector<std::string> missing;
  for (const std::string c : {"memory", "cpu", "pids", "freezer"}) {
    if (!fs::is_directory(root + "/" + c)) missing.push_back(c);
  }
  if (!missing.empty()) {
    return {"cgroups", Verdict::kFail,
            "no cgroup v2 hierarchy, and cgroup v1 lacks " + Join(missing) + " under " + root,
            "boot with the unified hierarchy (systemd.unified_cgroup_hierarchy=1, the default "
            "since Debian 11), or mount the missing v1 controllers"};
  }
  return {"cgroups", Verdict::kOk,
          std::string("cgroup v1") +
              (fs::exists(root + "/unified") ? " (hybrid: an empty v2 hierarchy beside it)" : "") +
              " with memory, cpu, pids and freezer",
          ""};
}

// unshare(CLONE_NEWUSER) in a child: 0, or the errno it failed with.
int TryUserNamespace() {
  const pid_t pid = ::fork();
  if (pid < 0) return errno;
  if (pid == 0) ::_exit(::unshare(CLONE_NEWUSER) == 0 ? 0 : (errno & 0xff));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : EINTR;
}

std::vector<Finding> UserNamespaces(const HostCheckInput& in) {
  std::vector<Finding> out;
  auto max = ReadSmall(in.host.proc + "/sys/user/max_user_namespaces");
  if (!max) {
    out.push_back({"user namespaces", Verdict::kFail,
                   "the kernel has none (no user.max_user_namespaces)",
                   "run a kernel built with CONFIG_USER_NS"});
  } else if (std::atoll(max->c_str()) <= 0) {
    out.push_back({"user namespaces", Verdict::kFail,
                   "turned off: user.max_user_namespaces = " + *max,
                   "sysctl -w user.max_user_namespaces=15000, and keep it in /etc/sysctl.d/"});
  } else if (int err = in.probe ? TryUserNamespace() : 0; err != 0) {
    out.push_back({"user namespaces", Verdict::kFail,
                   std::string("unshare(CLONE_NEWUSER) failed here: ") + std::strerror(err),
                   "look for what forbids it: a seccomp or LSM policy on airlockd, a container "
                   "it runs in"});
  } else {
    out.push_back({"user namespaces", Verdict::kOk,
                   "up to " + *max + (in.probe ? "; one was made here" : ""), ""});
  }
  if (ReadSmall(in.host.proc + "/sys/kernel/apparmor_restrict_unprivileged_userns") == "1") {
    out.push_back(
        in.running_as_root
            ? Finding{"apparmor", Verdict::kInfo,
                      "restricts user namespaces for unprivileged processes; airlockd runs as root "
                      "and is not affected",
                      ""}
            : Finding{"apparmor", Verdict::kWarn,
                      "restricts user namespaces for unprivileged processes, and this is not root",
                      "run airlockd as root (the packaged service does)"});
  }
  if (ReadSmall(in.host.sys + "/fs/selinux/enforce") == "1") {
    out.push_back({"selinux", Verdict::kWarn,
                   "enforcing: a policy that denies airlockd namespaces or mounts shows as an "
                   "engine failing its probe below, and in the audit log",
                   "if an engine fails, see `ausearch -m avc` for airlockd's denials"});
  }
  return out;
}

Finding Overlay(const HostPaths& host) {
  const auto text = ReadSmall(host.proc + "/filesystems").value_or("");
  if (Has(Words(text), "overlay")) return {"overlayfs", Verdict::kOk, "available", ""};
  return {"overlayfs", Verdict::kWarn,
          "not in /proc/filesystems: sandboxes over template layers need it",
          "modprobe overlay (and add it to /etc/modules)"};
}

Finding Seccomp(const HostPaths& host) {
  auto actions = ReadSmall(host.proc + "/sys/kernel/seccomp/actions_avail");
  if (!actions) {
    return {"seccomp", Verdict::kFail, "the kernel has no seccomp filters",
            "run a kernel built with CONFIG_SECCOMP_FILTER"};
  }
  const auto words = Words(*actions);
  std::vector<std::string> missing;
  for (const std::string a : {"kill_process", "errno", "trap"}) {
    if (!Has(words, a)) missing.push_back(a);
  }
  if (!missing.empty()) {
    return {"seccomp", Verdict::kFail, "the kernel's filters lack the actions " + Join(missing),
            "run a kernel of 4.14 or later"};
  }
  return {"seccomp", Verdict::kOk, "filters with " + *actions, ""};
}

std::vector<Finding> Networking(const HostCheckInput& in) {
  std::vector<Finding> out;
  for (const auto& [program, package] :
       std::vector<std::pair<std::string, std::string>>{{"nft", "nftables"}, {"ip", "iproute2"}}) {
    const std::string found = FindProgram(in.host.path_env, program);
    out.push_back(found.empty() ? Finding{program, Verdict::kWarn,
                                          "not found: sandboxes get no network (mode none only)",
                                          "apt install " + package}
                                : Finding{program, Verdict::kOk, found, ""});
  }
  const std::string forward_file = in.host.proc + "/sys/net/ipv4/ip_forward";
  const std::string forward = ReadSmall(forward_file).value_or("?");
  if (!in.open_mode) {
    out.push_back({"ip_forward", Verdict::kInfo,
                   forward + "; no uplink is configured, so open mode is off and it is not needed",
                   ""});
  } else if (forward == "1") {
    out.push_back({"ip_forward", Verdict::kOk, "1 (open mode routes through the uplink)", ""});
  } else if (in.probe && ::access(forward_file.c_str(), W_OK) != 0) {
    out.push_back({"ip_forward", Verdict::kFail,
                   forward + ", and it cannot be changed here: open mode needs it",
                   "sysctl -w net.ipv4.ip_forward=1 on the host (a container cannot)"});
  } else {
    out.push_back({"ip_forward", Verdict::kOk,
                   forward + ": airlockd turns it on at start for open mode, and back at stop",
                   ""});
  }
  return out;
}

Finding Runsc(const HostCheckInput& in) {
  if (!in.runsc.empty()) {
    if (::access(in.runsc.c_str(), X_OK) == 0) return {"runsc", Verdict::kOk, in.runsc, ""};
    return {"runsc", Verdict::kWarn,
            "not found at " + in.runsc + " (the configured path): the gVisor engine cannot run",
            "install runsc there, or change [engine.gvisor] runsc"};
  }
  const std::string found = FindProgram(in.host.path_env, "runsc");
  if (!found.empty()) return {"runsc", Verdict::kOk, found, ""};
  return {"runsc", Verdict::kWarn, "not found in PATH: the gVisor engine cannot run",
          "apt install runsc, or give its path as [engine.gvisor] runsc"};
}

Finding Kvm(const HostPaths& host) {
  if (!fs::exists(host.dev + "/kvm")) {
    return {"kvm", Verdict::kInfo, "no /dev/kvm: engines run without hardware virtualization", ""};
  }
  return {"kvm", Verdict::kInfo,
          "/dev/kvm is present; it counts only where a guest really boots, which an engine that "
          "uses it finds out by booting one (see the engine lines)",
          ""};
}

Finding Disk(const std::string& state_dir) {
  // The state dir, or the nearest directory above it that exists (before the first start).
  fs::path dir = state_dir;
  std::error_code ec;
  while (!dir.empty() && !fs::exists(dir, ec) && dir != dir.root_path()) dir = dir.parent_path();
  struct statvfs st {};
  if (dir.empty() || ::statvfs(dir.c_str(), &st) != 0) {
    return {"disk", Verdict::kFail, "cannot read the file system of " + state_dir,
            "check that the state dir's parent exists"};
  }
  const double free_bytes = static_cast<double>(st.f_bavail) * st.f_frsize;
  const double total = static_cast<double>(st.f_blocks) * st.f_frsize;
  const bool counts_inodes = st.f_files > 0;
  const double inode_share = counts_inodes ? static_cast<double>(st.f_favail) / st.f_files : 1;
  std::string detail = Gib(free_bytes) + " free of " + Gib(total);
  if (counts_inodes) {
    detail += ", " + std::to_string(st.f_favail) + " inodes free of " + std::to_string(st.f_files);
  }
  detail += " on the file system of " + dir.string();
  constexpr double kMiB = 1024.0 * 1024;
  if (free_bytes < 512 * kMiB || (counts_inodes && st.f_favail < 4096)) {
    return {"disk", Verdict::kFail, detail + ": too little to create sandboxes",
            "free space there, or give airlockd a state_dir on a bigger file system"};
  }
  if (free_bytes < 4096 * kMiB || inode_share < 0.05) {
    return {"disk", Verdict::kWarn, detail + ": little headroom for templates and sandboxes",
            "free space there, or move state_dir"};
  }
  return {"disk", Verdict::kOk, detail, ""};
}

}  // namespace

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kInfo:
      return "info";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
  }
  return "?";
}

std::vector<Finding> CheckHost(const HostCheckInput& input) {
  std::vector<Finding> out;
  out.push_back(Kernel(input.host));
  out.push_back(Cgroups(input.host));
  for (Finding& f : UserNamespaces(input)) out.push_back(std::move(f));
  out.push_back(Overlay(input.host));
  out.push_back(Seccomp(input.host));
  for (Finding& f : Networking(input)) out.push_back(std::move(f));
  out.push_back(Runsc(input));
  out.push_back(Kvm(input.host));
  out.push_back(Disk(input.state_dir));
  return out;
}

std::vector<Finding> CheckEngines(const std::vector<runtime::EngineStatus>& engines,
                                  const std::string& default_engine) {
  std::vector<Finding> out;
  bool default_listed = false;
  for (const runtime::EngineStatus& e : engines) {
    const bool is_default = e.name == default_engine;
    default_listed = default_listed || is_default;
    const std::string check = "engine " + e.name;
    if (e.available) {
      out.push_back(
          {check, Verdict::kOk,
           std::string("available") + (is_default ? " (the default): " : ": ") + e.description,
           ""});
    } else if (is_default) {
      out.push_back({check, Verdict::kFail, "unavailable (the default engine): " + e.reason,
                     "mend what the reason says, or set default_engine to an available engine"});
    } else if (!e.enabled) {
      out.push_back({check, Verdict::kInfo, "turned off in the config", ""});
    } else {
      out.push_back({check, Verdict::kWarn, "unavailable: " + e.reason,
                     "sandboxes that ask for " + e.name +
                         " are refused; mend what the reason says if you need it"});
    }
  }
  if (!default_listed) {
    out.push_back({"engine " + default_engine, Verdict::kFail,
                   "the default engine is not in this build", "set default_engine to one that is"});
  }
  return out;
}

bool Ready(const std::vector<Finding>& findings) {
  return std::none_of(findings.begin(), findings.end(),
                      [](const Finding& f) { return f.verdict == Verdict::kFail; });
}

nlohmann::json DoctorJson(const std::vector<Finding>& findings,
                          const std::vector<runtime::EngineStatus>& engines,
                          const std::string& default_engine) {
  nlohmann::json list = nlohmann::json::array();
  for (const Finding& f : findings) {
    list.push_back({{"check", f.check},
                    {"verdict", VerdictName(f.verdict)},
                    {"detail", f.detail},
                    {"fix", f.fix}});
  }
  nlohmann::json engine_list = nlohmann::json::array();
  for (const runtime::EngineStatus& e : engines) {
    engine_list.push_back({{"name", e.name},
                           {"available", e.available},
                           {"default", e.name == default_engine},
                           {"reason", e.reason}});
  }
  return {{"ready", Ready(findings)},
          {"default_engine", default_engine},
          {"findings", std::move(list)},
          {"engines", std::move(engine_list)}};
}

std::string DoctorText(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    char head[64];
    std::snprintf(head, sizeof head, "%-5s %-16s ", std::string(VerdictName(f.verdict)).c_str(),
                  f.check.c_str());
    out += head + f.detail + "\n";
    if (!f.fix.empty()) out += std::string(23, ' ') + "fix: " + f.fix + "\n";
  }
  return out;
}

}  // namespace airlock::daemon
