#include "runtime/jail/limits_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <map>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::jail {
namespace {

// "Key:   value kB" lines, in order.
struct MeminfoLine {
  std::string key;
  uint64_t kb = 0;
  std::string raw;
};

std::vector<MeminfoLine> ParseMeminfo(std::string_view text) {
  std::vector<MeminfoLine> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty()) continue;
    MeminfoLine l;
    l.raw = std::string(line);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      l.key = std::string(line.substr(0, colon));
      std::string_view rest = line.substr(colon + 1);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      std::from_chars(rest.data(), rest.data() + rest.size(), l.kb);
    }
    lines.push_back(std::move(l));
  }
  return lines;
}

std::string Line(const std::string& key, uint64_t kb) {
  std::string head = key + ":";
  std::string value = std::to_string(kb);
  // As the kernel pads them: the value right-aligned to column 24, then " kB".
  const size_t width = 24;
  std::string pad(head.size() + value.size() < width ? width - head.size() - value.size() : 1, ' ');
  return head + pad + value + " kB";
}

Status PinPid(pid_t pid, const cpu_set_t& set) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = ::opendir(tasks.c_str());
  if (dir == nullptr) return {};  // gone meanwhile
  while (dirent* entry = ::readdir(dir)) {
    pid_t tid = 0;
    std::string_view name = entry->d_name;
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), tid);
    if (ec != std::errc() || end != name.data() + name.size() || tid <= 0) continue;
    if (::sched_setaffinity(tid, sizeof set, &set) < 0 && errno != ESRCH) {
      const int err = errno;
      ::closedir(dir);
      return FailErrno("setting the CPU affinity of thread " + std::to_string(tid), err);
    }
  }
  ::closedir(dir);
  return {};
}

}  // namespace

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) < 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> ViewCpus(const std::vector<int>& allowed, double cpus, size_t start) {
  const size_t want = static_cast<size_t>(std::max(1.0, std::ceil(cpus - 1e-9)));
  if (want >= allowed.size()) return allowed;
  std::vector<int> out;
  for (size_t i = 0; i < want; ++i) out.push_back(allowed[(start + i) % allowed.size()]);
  std::sort(out.begin(), out.end());
  return out;
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out + "\n";
}

cpu_set_t CpuSet(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return set;
}

std::string Meminfo(std::string_view host, const SandboxCgroup::MemoryUse& use) {
  std::vector<MeminfoLine> lines = ParseMeminfo(host);
  uint64_t host_total = 0;
  for (const MeminfoLine& l : lines) {
    if (l.key == "MemTotal") host_total = l.kb;
  }
  const uint64_t total = use.limit / 1024;
  if (use.limit == 0 || host_total == 0 || total >= host_total) return std::string(host);
  auto stat = [&](std::initializer_list<const char*> names) -> uint64_t {
    for (const char* name : names) {
      if (auto it = use.stat.find(name); it != use.stat.end()) return it->second / 1024;
    }
    return 0;
  };
  // memory.stat names: cgroup v2 first, then v1.
  const uint64_t used = std::min(use.usage / 1024, total);
  const uint64_t active_anon = stat({"active_anon"}), inactive_anon = stat({"inactive_anon"});
  const uint64_t active_file = stat({"active_file"}), inactive_file = stat({"inactive_file"});
  const uint64_t cached = std::min(stat({"file", "cache"}), used);
  const uint64_t slab_reclaimable = stat({"slab_reclaimable"});
  const uint64_t slab = slab_reclaimable + stat({"slab_unreclaimable"});
  const uint64_t free = total - used;
  const std::map<std::string, uint64_t> mine = {
      {"MemTotal", total},
      {"MemFree", free},
      // What could be had without swapping: the free part and the page cache it could drop.
      {"MemAvailable", std::min(total, free + active_file + inactive_file + slab_reclaimable)},
      {"Buffers", 0},
      {"Cached", cached},
      {"SwapCached", 0},
      {"Active", active_anon + active_file},
      {"Inactive", inactive_anon + inactive_file},
      {"Active(anon)", active_anon},
      {"Inactive(anon)", inactive_anon},
      {"Active(file)", active_file},
      {"Inactive(file)", inactive_file},
      {"Unevictable", stat({"unevictable"})},
      {"Mlocked", 0},
      {"SwapTotal", 0},
      {"SwapFree", 0},
      {"Dirty", stat({"file_dirty", "dirty"})},
      {"Writeback", stat({"file_writeback", "writeback"})},
      {"AnonPages", stat({"anon", "rss"})},
      {"Mapped", stat({"file_mapped", "mapped_file"})},
      {"Shmem", stat({"shmem"})},
      {"KReclaimable", slab_reclaimable},
      {"Slab", slab},
      {"SReclaimable", slab_reclaimable},
      {"SUnreclaim", slab - slab_reclaimable},
  };
  std::string out;
  for (const MeminfoLine& l : lines) {
    auto it = mine.find(l.key);
    out += it == mine.end() ? l.raw : Line(l.key, it->second);
    out += '\n';
  }
  return out;
}

Status RewriteInPlace(const std::string& path, std::string_view content, bool create) {
  UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0444));
  if (!fd) return FailErrno("opening " + path, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n =
        ::pwrite(fd.get(), content.data() + done, content.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return FailErrno("writing " + path, errno);
    done += static_cast<size_t>(n);
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(content.size())) < 0) {
    return FailErrno("cutting " + path, errno);
  }
  return {};
}

Status PinCpus(const SandboxCgroup& cgroup, const std::vector<int>& cpus) {
  const cpu_set_t set = CpuSet(cpus);
  for (int pass = 0; pass < 2; ++pass) {
    auto pids = cgroup.Processes();
    if (!pids) return std::unexpected(pids.error());
    for (pid_t pid : *pids) {
      if (auto st = PinPid(pid, set); !st) return st;
    }
  }
  return {};
}

}  // namespace airlock::jail
