#include "runtime/jail/cgroups.h"

// Layout and rules: docs/design/cgroups.md. In short:
//
// - Detect reads /proc/self/cgroup. `cgroup_root` is cgroup v2 when its cgroup.controllers
//   lists memory, cpu and pids; otherwise it must hold v1 hierarchies for memory, cpu, pids and
//   freezer, each at <root>/<controller> or at a comma-joined mount such as <root>/cpu,cpuacct.
//   No mount table is consulted, so tests can point `cgroup_root` at a plain directory tree.
// - On a plain (non-cgroupfs) tree the kernel does not populate new directories, so interface
//   files are created as plain files and optional ones (memory.swap.max,
//   memory.memsw.limit_in_bytes) are treated as present. On cgroupfs nothing is ever created
//   by open(): a missing interface file is an error, or skipped when it is optional.
// - v2 forbids processes in a cgroup that delegates controllers to children ("no internal
//   processes"), so Detect moves the calling process into the leaf <own>/airlockd before it
//   enables memory, cpu and pids for <own>/airlock.

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <thread>

#include "common/ids.h"
#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::jail {
namespace {

constexpr std::string_view kParentName = "airlock";  // <own>/airlock/<id>
constexpr std::string_view kLeafName = "airlockd";   // v2: where the daemon itself lives
constexpr std::array<std::string_view, 4> kV1Controllers = {"memory", "cpu", "pids", "freezer"};
constexpr std::string_view kV1Accounting = "cpuacct";
constexpr std::array<std::string_view, 3> kV2Controllers = {"memory", "cpu", "pids"};
constexpr std::string_view kV2SubtreeControl = "+memory +cpu +pids";

constexpr int64_t kCpuPeriodUs = 100000;
constexpr int64_t kMinCpuQuotaUs = 1000;  // the kernel's floor for cpu.max / cfs_quota_us
constexpr double kMaxCpus = 4096;

constexpr int kFreezeTimeoutMs = 2000;
constexpr int kDestroyKillTimeoutMs = 5000;
constexpr int kRmdirBusyRetryMs = 1000;
// How often a create makes the shared parent again when another sandbox's destroy removed it
// between its mkdir and the sandbox's own.
constexpr int kParentRaceRetries = 8;
constexpr int kKillRoundIntervalMs = 200;

using Clock = std::chrono::steady_clock;

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// False for the plain directory trees the tests build (see the top of this file).
bool IsCgroupFs(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return true;  // assume the real thing
  return fs.f_type == CGROUP_SUPER_MAGIC || fs.f_type == CGROUP2_SUPER_MAGIC;
}

std::string JoinCgroupPath(const std::string& dir, std::string_view own) {
  if (own.empty() || own == "/") return dir;
  std::string out = dir;
  if (own.front() != '/') out += '/';
  out += own;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> SplitAny(std::string_view s, std::string_view separators) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find_first_of(separators, pos);
    if (end == std::string_view::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

bool Contains(const std::vector<std::string_view>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// Writes `value` to a cgroup interface file. `create` is for plain test trees only.
Status WriteValue(const std::string& path, std::string_view value, bool create = false) {
  std::string what = "writing " + std::string(value) + " to " + path;
  int flags = O_WRONLY | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  UniqueFd fd(RetryEintr([&] { return ::open(path.c_str(), flags, 0644); }));
  if (!fd) return FailErrno(what, errno);
  // cgroupfs takes a value in one write() and reports a bad one from that write.
  if (auto written = WriteAll(fd.get(), value); !written) {
    return FailErrno(what, written.error().sys_errno());
  }
  return {};
}

Result<std::string> ReadValue(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text) return FailErrno("reading " + path, text.error().sys_errno());
  return text;
}

// "key value" lines (memory.events, memory.oom_control, cgroup.events).
std::optional<uint64_t> FindCount(std::string_view text, std::string_view key) {
  for (std::string_view line : SplitAny(text, "\n")) {
    auto fields = SplitAny(line, " \t");
    if (fields.size() != 2 || fields[0] != key) continue;
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(fields[1].data(), fields[1].data() + fields[1].size(), value);
    if (ec == std::errc() && end == fields[1].data() + fields[1].size()) return value;
  }
  return std::nullopt;
}

// The pids listed in a cgroup.procs; a cgroup that is gone holds none.
Status AppendPids(const std::string& procs_file, std::set<pid_t>& pids) {
  auto text = ReadFileToString(procs_file);
  if (!text) {
    if (text.error().sys_errno() == ENOENT) return {};
    return FailErrno("reading " + procs_file, text.error().sys_errno());
  }
  for (std::string_view field : SplitAny(*text, " \n")) {
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), pid);
    if (ec != std::errc() || end != field.data() + field.size() || pid <= 0) {
      return Fail(ErrorCode::kInternal,
                  procs_file + " holds \"" + std::string(field) + "\", which is not a pid");
    }
    pids.insert(pid);
  }
  return {};
}

// mkdir that accepts an existing directory. Reports whether it made one.
Result<bool> EnsureDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return true;
  if (errno == EEXIST && IsDirectory(path)) return false;
  return FailErrno("creating " + path, errno);
}

// Calls `done` until it returns true, an error, or `timeout_ms` passes (then kDeadlineExceeded
// with `what` and the last `detail`). Sleeps 1 ms at first, growing to 20 ms.
template <typename F>
Status PollUntil(int timeout_ms, std::string_view what, F done) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    Result<bool> finished = done();
    if (!finished) return std::unexpected(std::move(finished.error()));
    if (*finished) return {};
    if (Clock::now() >= deadline) {
      return Fail(ErrorCode::kDeadlineExceeded,
                  std::string(what) + ": not done after " + std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

// /proc/self/cgroup: "0::/path" for v2, "N:ctrl[,ctrl...]:/path" per v1 hierarchy.
struct ProcCgroups {
  std::optional<std::string> v2;
  std::map<std::string, std::string, std::less<>> v1;  // controller -> path
};

ProcCgroups ParseProcCgroup(std::string_view text) {
  ProcCgroups out;
  for (std::string_view line : SplitAny(text, "\n")) {
    size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string_view controllers = line.substr(first + 1, second - first - 1);
    std::string path(line.substr(second + 1));
    if (controllers.empty()) {
      if (line.substr(0, first) == "0") out.v2 = path;
      continue;
    }
    for (std::string_view controller : SplitAny(controllers, ",")) {
      out.v1.emplace(std::string(controller), path);
    }
  }
  return out;
}

bool HasV2Controllers(const std::string& root) {
  auto text = ReadFileToString(root + "/cgroup.controllers");
  if (!text) return false;
  auto available = SplitAny(*text, " \n");
  return std::all_of(kV2Controllers.begin(), kV2Controllers.end(),
                     [&](std::string_view c) { return Contains(available, c); });
}

// <root>/<controller>, or a comma-joined mount that includes it (<root>/cpu,cpuacct).
std::optional<std::string> FindV1Hierarchy(const std::string& root, std::string_view controller) {
  std::string direct = root + "/" + std::string(controller);
  if (IsDirectory(direct)) return direct;
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) return std::nullopt;
  std::optional<std::string> found;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name.find(',') == std::string_view::npos) continue;
    if (!Contains(SplitAny(name, ","), controller)) continue;
    std::string path = root + "/" + std::string(name);
    if (IsDirectory(path)) {
      found = path;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

Result<CgroupLayout> DetectV2(const std::string& root, const ProcCgroups& proc,
                              const std::string& proc_path) {
  if (!proc.v2) {
    return Fail(ErrorCode::kFailedPrecondition,
                root + " is cgroup v2 but " + proc_path + " has no \"0::\" line");
  }
  std::string own = *proc.v2;
  // A second Detect in this process (or systemd's DelegateSubgroup=airlockd) finds the caller
  // in the leaf already: the cgroup it owns is the leaf's parent.
  std::string leaf_suffix = "/" + std::string(kLeafName);
  if (own.size() >= leaf_suffix.size() && own.ends_with(leaf_suffix)) {
    own.resize(own.size() - leaf_suffix.size());
    if (own.empty()) own = "/";
  }
  std::string own_dir = JoinCgroupPath(root, own);
  if (!IsDirectory(own_dir)) {
    return Fail(ErrorCode::kFailedPrecondition,
                "own cgroup " + own_dir + " (from " + proc_path +
                    ") does not exist: is the cgroup namespace or mount unusual?");
  }
  bool plain = !IsCgroupFs(own_dir);

  // The root cgroup is exempt from the no-internal-processes rule; a cgroup namespace's root
  // is not, and is told apart by its cgroup.type file (the real root has none).
  bool is_real_root = own == "/" && !PathExists(own_dir + "/cgroup.type");
  if (!is_real_root) {
    auto procs = ReadValue(own_dir + "/cgroup.procs");
    if (!procs) return std::unexpected(std::move(procs.error()));
    if (!Trim(*procs).empty()) {
      std::string leaf = own_dir + "/" + std::string(kLeafName);
      if (auto made = EnsureDir(leaf); !made) return std::unexpected(std::move(made.error()));
      // "0" moves the writer's whole thread group. Other processes in <own> stay: they are
      // not ours to move, and enabling controllers below then fails with EBUSY.
      if (auto moved = WriteValue(leaf + "/cgroup.procs", "0", plain); !moved) {
        return std::unexpected(std::move(moved.error()).Wrap("moving the daemon into its leaf"));
      }
    }
  }

  std::string own_control = own_dir + "/cgroup.subtree_control";
  if (auto enabled = WriteValue(own_control, kV2SubtreeControl, plain); !enabled) {
    if (enabled.error().sys_errno() == EBUSY) {
      return std::unexpected(std::move(enabled.error())
                                 .Wrap("other processes share " + own_dir +
                                       "; the daemon needs a cgroup of its own (systemd: "
                                       "Delegate=yes)"));
    }
    return std::unexpected(std::move(enabled.error()));
  }
  CgroupLayout layout;
  layout.version = CgroupVersion::kV2;
  layout.v2_parent = own_dir + "/" + std::string(kParentName);
  if (auto made = EnsureDir(layout.v2_parent); !made) {
    return std::unexpected(std::move(made.error()));
  }
  if (auto enabled =
          WriteValue(layout.v2_parent + "/cgroup.subtree_control", kV2SubtreeControl, plain);
      !enabled) {
    return std::unexpected(std::move(enabled.error()));
  }
  return layout;
}

Result<CgroupLayout> DetectV1(const std::string& root, const ProcCgroups& proc,
                              const std::string& proc_path) {
  CgroupLayout layout;
  layout.version = CgroupVersion::kV1;
  for (std::string_view controller : kV1Controllers) {
    std::optional<std::string> hierarchy = FindV1Hierarchy(root, controller);
    if (!hierarchy) {
      return Fail(ErrorCode::kUnavailable,
                  "no usable cgroups under " + root +
                      ": not cgroup v2 with memory, cpu and pids, and no v1 " +
                      std::string(controller) + " hierarchy");
    }
    auto own = proc.v1.find(controller);
    if (own == proc.v1.end()) {
      return Fail(ErrorCode::kFailedPrecondition,
                  proc_path + " names no v1 " + std::string(controller) + " cgroup");
    }
    std::string own_dir = JoinCgroupPath(*hierarchy, own->second);
    if (!IsDirectory(own_dir)) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "own " + std::string(controller) + " cgroup " + own_dir +
                      " does not exist: is the hierarchy bind-mounted from a subtree?");
    }
    layout.v1_parents.emplace(std::string(controller), own_dir + "/" + std::string(kParentName));
  }
  // cpuacct, where it is mounted apart from cpu, only for the CPU time a sandbox used
  // (runtime/cgroup_stats.h): optional, since no limit depends on it.
  if (std::optional<std::string> hierarchy = FindV1Hierarchy(root, kV1Accounting)) {
    auto own = proc.v1.find(kV1Accounting);
    std::string own_dir =
        own == proc.v1.end() ? std::string() : JoinCgroupPath(*hierarchy, own->second);
    if (!own_dir.empty() && IsDirectory(own_dir)) {
      layout.v1_parents.emplace(std::string(kV1Accounting),
                                own_dir + "/" + std::string(kParentName));
    }
  }
  return layout;
}

int64_t CpuQuotaUs(double cpus) {
  return std::max<int64_t>(kMinCpuQuotaUs, std::llround(cpus * static_cast<double>(kCpuPeriodUs)));
}

Status ApplyV2Limits(const std::string& dir, const CgroupLimits& limits, bool plain) {
  if (auto st = WriteValue(dir + "/memory.max", std::to_string(limits.memory_bytes), plain); !st) {
    return st;
  }
  // No swap: memory.max is then the whole of it. Absent when the kernel has no swap accounting.
  if (plain || PathExists(dir + "/memory.swap.max")) {
    if (auto st = WriteValue(dir + "/memory.swap.max", "0", plain); !st) return st;
  }
  std::string cpu_max =
      std::to_string(CpuQuotaUs(limits.cpus)) + " " + std::to_string(kCpuPeriodUs);
  if (auto st = WriteValue(dir + "/cpu.max", cpu_max, plain); !st) return st;
  return WriteValue(dir + "/pids.max", std::to_string(limits.pids_max), plain);
}

Status ApplyV1Limits(const std::map<std::string, std::string>& dirs, const CgroupLimits& limits,
                     bool plain) {
  const std::string& memory = dirs.at("memory");
  std::string bytes = std::to_string(limits.memory_bytes);
  // memsw may never be below memory.limit_in_bytes; equal means no swap. Lowering (and a new
  // cgroup, whose memsw is unlimited) writes memory first; raising a live one must write memsw
  // first, which the kernel tells us with EINVAL.
  const std::string limit_file = memory + "/memory.limit_in_bytes";
  const std::string memsw_file = memory + "/memory.memsw.limit_in_bytes";
  const bool has_memsw = plain || PathExists(memsw_file);
  Status first = WriteValue(limit_file, bytes, plain);
  if (!first && !(has_memsw && first.error().sys_errno() == EINVAL)) return first;
  if (has_memsw) {
    if (auto st = WriteValue(memsw_file, bytes, plain); !st) return st;
  }
  if (!first) {
    if (auto st = WriteValue(limit_file, bytes, plain); !st) return st;
  }
  const std::string& cpu = dirs.at("cpu");
  if (auto st = WriteValue(cpu + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs), plain); !st) {
    return st;
  }
  if (auto st =
          WriteValue(cpu + "/cpu.cfs_quota_us", std::to_string(CpuQuotaUs(limits.cpus)), plain);
      !st) {
    return st;
  }
  return WriteValue(dirs.at("pids") + "/pids.max", std::to_string(limits.pids_max), plain);
}

Status ValidateLimits(const CgroupLimits& limits) {
  if (!std::isfinite(limits.cpus) || limits.cpus <= 0 || limits.cpus > kMaxCpus) {
    return Fail(ErrorCode::kInvalidArgument, "cpus must be more than 0 and at most 4096");
  }
  if (limits.memory_bytes == 0) {
    return Fail(ErrorCode::kInvalidArgument, "memory limit must be more than 0 bytes");
  }
  if (limits.pids_max == 0) {
    return Fail(ErrorCode::kInvalidArgument, "pids limit must be at least 1");
  }
  return {};
}

// rmdir of a cgroup removes it with its interface files. EBUSY while the last processes are
// being released is retried briefly; a directory that is gone already is fine.
Status RemoveCgroupDir(const std::string& dir) {
  auto deadline = Clock::now() + std::chrono::milliseconds(kRmdirBusyRetryMs);
  while (true) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return {};
    if (errno != EBUSY || Clock::now() >= deadline) return FailErrno("removing " + dir, errno);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void KillPids(const std::set<pid_t>& pids) {
  for (pid_t pid : pids) ::kill(pid, SIGKILL);  // ESRCH: it is gone already
}

}  // namespace

Result<CgroupLayout> CgroupLayout::Detect(const std::string& cgroup_root,
                                          const std::string& proc_self_cgroup) {
  std::string root = cgroup_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  auto text = ReadValue(proc_self_cgroup);
  if (!text) return std::unexpected(std::move(text.error()));
  ProcCgroups proc = ParseProcCgroup(*text);
  Result<CgroupLayout> layout = HasV2Controllers(root) ? DetectV2(root, proc, proc_self_cgroup)
                                                       : DetectV1(root, proc, proc_self_cgroup);
  return WithContext(std::move(layout), "detecting cgroups");
}

SandboxCgroup SandboxCgroup::Open(const CgroupLayout& layout, std::string_view id) {
  SandboxCgroup cgroup;
  cgroup.version_ = layout.version;
  // Create never makes a cgroup whose name is not a valid id, so for one there is nothing to
  // act on (and a name such as ".." must never reach rmdir).
  if (!ValidateSandboxId(id)) return cgroup;
  if (layout.version == CgroupVersion::kV2) {
    if (!layout.v2_parent.empty()) cgroup.dirs_.push_back(layout.v2_parent + "/" + std::string(id));
    return cgroup;
  }
  for (const auto& [controller, parent] : layout.v1_parents) {
    std::string dir = parent + "/" + std::string(id);
    cgroup.by_controller_.emplace(controller, dir);
    // Controllers mounted together share a directory.
    if (std::find(cgroup.dirs_.begin(), cgroup.dirs_.end(), dir) == cgroup.dirs_.end()) {
      cgroup.dirs_.push_back(dir);
    }
  }
  return cgroup;
}

Result<SandboxCgroup> SandboxCgroup::Create(const CgroupLayout& layout, std::string_view id,
                                            const CgroupLimits& limits) {
  std::string context = "creating cgroup for " + std::string(id);
  if (auto valid = ValidateSandboxId(id); !valid) {
    return std::unexpected(std::move(valid.error()).Wrap(context));
  }
  if (auto valid = ValidateLimits(limits); !valid) {
    return std::unexpected(std::move(valid.error()).Wrap(context));
  }
  SandboxCgroup cgroup = Open(layout, id);
  bool complete =
      layout.version == CgroupVersion::kV2
          ? !cgroup.dirs_.empty()
          : std::all_of(kV1Controllers.begin(), kV1Controllers.end(), [&](std::string_view c) {
              return cgroup.by_controller_.contains(std::string(c));
            });
  if (!complete) {
    return Fail(ErrorCode::kFailedPrecondition, context + ": the cgroup layout is incomplete");
  }

  std::vector<std::string> made;
  ScopeExit remove_made([&] {
    for (auto it = made.rbegin(); it != made.rend(); ++it) (void)RemoveCgroupDir(*it);
  });
  for (const std::string& dir : cgroup.dirs_) {
    // The parent may be missing: v1 parents are made here, and the last sandbox out (of this
    // daemon or another on the host) may have removed an empty one meanwhile, again and again
    // under churn (hence the retries).
    for (int attempt = 0;; ++attempt) {
      std::string parent = Parent(dir);
      auto parent_made = EnsureDir(parent);
      if (!parent_made) return std::unexpected(std::move(parent_made.error()).Wrap(context));
      if (*parent_made && layout.version == CgroupVersion::kV2) {
        if (auto enabled = WriteValue(parent + "/cgroup.subtree_control", kV2SubtreeControl,
                                      !IsCgroupFs(parent));
            !enabled) {
          return std::unexpected(std::move(enabled.error()).Wrap(context));
        }
      }
      if (::mkdir(dir.c_str(), 0755) == 0) break;
      int err = errno;
      if (err == ENOENT && attempt < kParentRaceRetries) continue;
      if (err == EEXIST) {
        return Fail(ErrorCode::kAlreadyExists, context + ": " + dir + " exists already");
      }
      return std::unexpected(ErrnoError("creating " + dir, err).Wrap(context));
    }
    made.push_back(dir);
  }

  bool plain = !IsCgroupFs(cgroup.dirs_.front());
  Status applied = layout.version == CgroupVersion::kV2
                       ? ApplyV2Limits(cgroup.dirs_.front(), limits, plain)
                       : ApplyV1Limits(cgroup.by_controller_, limits, plain);
  if (!applied) return std::unexpected(std::move(applied.error()).Wrap(context));
  remove_made.Dismiss();
  return cgroup;
}

Status SandboxCgroup::SetLimits(const CgroupLimits& limits) const {
  if (auto valid = ValidateLimits(limits); !valid) return valid;
  if (dirs_.empty()) return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no dirs");
  const bool plain = !IsCgroupFs(dirs_.front());
  return version_ == CgroupVersion::kV2 ? ApplyV2Limits(dirs_.front(), limits, plain)
                                        : ApplyV1Limits(by_controller_, limits, plain);
}

Status SandboxCgroup::AddProcess(pid_t pid) const {
  if (dirs_.empty()) return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no dirs");
  std::string value = std::to_string(pid);
  for (const std::string& dir : dirs_) {
    if (auto added = WriteValue(dir + "/cgroup.procs", value); !added) return added;
  }
  return {};
}

Status SandboxCgroup::Freeze() const {
  if (dirs_.empty()) return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no dirs");
  if (version_ == CgroupVersion::kV2) {
    const std::string& dir = dirs_.front();
    if (auto st = WriteValue(dir + "/cgroup.freeze", "1"); !st) return st;
    Status frozen = PollUntil(kFreezeTimeoutMs, "freezing " + dir, [&]() -> Result<bool> {
      auto events = ReadValue(dir + "/cgroup.events");
      if (!events) return std::unexpected(std::move(events.error()));
      return FindCount(*events, "frozen") == 1u;
    });
    if (!frozen) (void)Thaw();  // not half-frozen: the caller sees the error and a running cgroup
    return frozen;
  }
  auto freezer = by_controller_.find("freezer");
  if (freezer == by_controller_.end()) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no freezer");
  }
  std::string state_file = freezer->second + "/freezer.state";
  if (auto st = WriteValue(state_file, "FROZEN"); !st) return st;
  // It reads FREEZING until every task has stopped.
  Status frozen = PollUntil(kFreezeTimeoutMs, "freezing " + freezer->second, [&]() -> Result<bool> {
    auto state = ReadValue(state_file);
    if (!state) return std::unexpected(std::move(state.error()));
    return Trim(*state) == "FROZEN";
  });
  if (!frozen) (void)Thaw();
  return frozen;
}

Status SandboxCgroup::Thaw() const {
  if (dirs_.empty()) return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no dirs");
  if (version_ == CgroupVersion::kV2) return WriteValue(dirs_.front() + "/cgroup.freeze", "0");
  auto freezer = by_controller_.find("freezer");
  if (freezer == by_controller_.end()) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no freezer");
  }
  return WriteValue(freezer->second + "/freezer.state", "THAWED");
}

Result<std::vector<pid_t>> SandboxCgroup::Processes() const {
  std::set<pid_t> pids;
  for (const std::string& dir : dirs_) {
    if (auto st = AppendPids(dir + "/cgroup.procs", pids); !st) {
      return std::unexpected(std::move(st.error()));
    }
  }
  return std::vector<pid_t>(pids.begin(), pids.end());
}

Status SandboxCgroup::KillAll(int timeout_ms) const {
  auto initial = Processes();
  if (!initial) return std::unexpected(std::move(initial.error()));
  if (initial->empty()) return {};

  const bool has_kill_file =
      version_ == CgroupVersion::kV2 && PathExists(dirs_.front() + "/cgroup.kill");
  // One round kills everything that is in the cgroup now. cgroup.kill (v2, 5.14+) does it in
  // the kernel, racing with nothing. Otherwise the cgroup is frozen first: a frozen process
  // can neither fork nor exit, so every pid read is still that process when it is signalled.
  // If freezing times out (a task stuck in the kernel), the kill goes ahead anyway and later
  // rounds catch what forked meanwhile.
  auto kill_round = [&]() -> Status {
    if (has_kill_file) return WriteValue(dirs_.front() + "/cgroup.kill", "1");
    (void)Freeze();
    std::set<pid_t> pids;
    for (const std::string& dir : dirs_) {
      if (auto st = AppendPids(dir + "/cgroup.procs", pids); !st) return st;
    }
    KillPids(pids);
    // SIGKILLed tasks die only once thawed.
    if (auto thawed = Thaw(); !thawed && thawed.error().sys_errno() != ENOENT) return thawed;
    return {};
  };

  if (auto st = kill_round(); !st) return st;
  auto next_round = Clock::now() + std::chrono::milliseconds(kKillRoundIntervalMs);
  size_t left = 0;
  Status emptied =
      PollUntil(timeout_ms, "killing the processes in " + dirs_.front(), [&]() -> Result<bool> {
        auto pids = Processes();
        if (!pids) return std::unexpected(std::move(pids.error()));
        left = pids->size();
        if (pids->empty()) return true;
        if (Clock::now() >= next_round) {
          if (auto st = kill_round(); !st) return std::unexpected(std::move(st.error()));
          next_round = Clock::now() + std::chrono::milliseconds(kKillRoundIntervalMs);
        }
        return false;
      });
  if (!emptied) {
    return std::unexpected(
        std::move(emptied.error()).Wrap(std::to_string(left) + " processes left"));
  }
  return {};
}

Status SandboxCgroup::Destroy() const {
  if (dirs_.empty()) return {};
  if (auto killed = KillAll(kDestroyKillTimeoutMs); !killed) {
    return std::unexpected(std::move(killed.error()).Wrap("destroying " + dirs_.front()));
  }
  Status result;
  for (const std::string& dir : dirs_) {
    if (auto removed = RemoveCgroupDir(dir); !removed && result) result = std::move(removed);
    // The last sandbox out removes the shared "airlock" parent, so a host that stops using
    // Airlock is left with no trace in its cgroup tree. rmdir refuses while any other sandbox
    // (of this daemon or another) is in it; a create that loses the race makes it again.
    (void)::rmdir(Parent(dir).c_str());
  }
  return result;
}

Result<uint64_t> SandboxCgroup::OomKills() const {
  std::string file;
  if (version_ == CgroupVersion::kV2) {
    if (dirs_.empty()) return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no dirs");
    file = dirs_.front() + "/memory.events";
  } else {
    auto memory = by_controller_.find("memory");
    if (memory == by_controller_.end()) {
      return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no memory controller");
    }
    file = memory->second + "/memory.oom_control";
  }
  auto text = ReadValue(file);
  if (!text) return std::unexpected(std::move(text.error()));
  std::optional<uint64_t> kills = FindCount(*text, "oom_kill");
  if (!kills) return Fail(ErrorCode::kUnimplemented, file + " has no oom_kill count");
  return *kills;
}

Result<SandboxCgroup::MemoryUse> SandboxCgroup::Memory() const {
  const std::string dir = Dir("memory");
  if (dir.empty())
    return Fail(ErrorCode::kFailedPrecondition, "sandbox cgroup has no memory controller");
  const bool v2 = version_ == CgroupVersion::kV2;
  auto number = [](std::string_view text) -> uint64_t {
    uint64_t value = 0;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return ec == std::errc() && end == text.data() + text.size() ? value : 0;  // "max": none
  };
  MemoryUse use;
  auto limit = ReadValue(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  if (!limit) return std::unexpected(std::move(limit.error()));
  use.limit = number(*limit);
  auto usage = ReadValue(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  if (!usage) return std::unexpected(std::move(usage.error()));
  use.usage = number(*usage);
  auto stat = ReadValue(dir + "/memory.stat");
  if (!stat) return std::unexpected(std::move(stat.error()));
  for (std::string_view line : SplitAny(*stat, "\n")) {
    auto fields = SplitAny(line, " ");
    if (fields.size() == 2) use.stat[std::string(fields[0])] = number(fields[1]);
  }
  return use;
}

std::vector<std::string> ListSandboxCgroups(const CgroupLayout& layout) {
  std::vector<std::string> parents;
  if (layout.version == CgroupVersion::kV2) {
    parents.push_back(layout.v2_parent);
  } else {
    for (const auto& [controller, parent] : layout.v1_parents) parents.push_back(parent);
  }
  std::set<std::string> ids;
  for (const std::string& parent : parents) {
    if (parent.empty()) continue;
    DIR* dir = ::opendir(parent.c_str());
    if (dir == nullptr) continue;  // no parent yet: no sandboxes
    while (dirent* entry = ::readdir(dir)) {
      std::string_view name = entry->d_name;
      if (name == "." || name == "..") continue;
      bool is_dir = entry->d_type == DT_DIR ||
                    (entry->d_type == DT_UNKNOWN && IsDirectory(parent + "/" + std::string(name)));
      if (is_dir) ids.emplace(name);
    }
    ::closedir(dir);
  }
  return std::vector<std::string>(ids.begin(), ids.end());
}

}  // namespace airlock::jail
