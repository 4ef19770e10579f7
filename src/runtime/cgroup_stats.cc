#include "runtime/cgroup_stats.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <charconv>
#include <optional>
#include <string_view>

#include "common/unique_fd.h"

namespace airlock::runtime {
namespace {

// The start of a small interface file ("" when absent); one open and one read.
std::string ReadSmall(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return "";
  char buf[512];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::optional<uint64_t> ParseNumber(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<uint64_t> ReadNumber(const std::string& path) { return ParseNumber(ReadSmall(path)); }

// "key value" lines (cpu.stat).
std::optional<uint64_t> ReadKey(const std::string& path, std::string_view key) {
  const std::string text = ReadSmall(path);
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ') {
      return ParseNumber(line.substr(key.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace

void ReadCgroupStats(const std::vector<std::string>& dirs, SandboxStats& stats) {
  bool cpu = false, memory = false, peak = false, pids = false;
  for (const std::string& dir : dirs) {
    if (!cpu) {
      if (auto usec = ReadKey(dir + "/cpu.stat", "usage_usec")) {
        stats.cpu_seconds = static_cast<double>(*usec) / 1e6;
        cpu = true;
      } else if (auto ns = ReadNumber(dir + "/cpuacct.usage")) {
        stats.cpu_seconds = static_cast<double>(*ns) / 1e9;
        cpu = true;
      }
    }
    if (!memory) {
      auto bytes = ReadNumber(dir + "/memory.current");
      if (!bytes) bytes = ReadNumber(dir + "/memory.usage_in_bytes");
      if (bytes) {
        stats.memory_bytes = *bytes;
        memory = true;
      }
    }
    if (!peak) {
      auto bytes = ReadNumber(dir + "/memory.peak");
      if (!bytes) bytes = ReadNumber(dir + "/memory.max_usage_in_bytes");
      if (bytes) {
        stats.memory_peak_bytes = *bytes;
        peak = true;
      }
    }
    if (!pids) {
      if (auto n = ReadNumber(dir + "/pids.current")) {
        stats.pids = *n;
        pids = true;
      }
    }
  }
}

uint64_t FileSystemUsedBytes(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) < 0 || fs.f_blocks < fs.f_bfree) return 0;
  return static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * static_cast<uint64_t>(fs.f_bsize);
}

}  // namespace airlock::runtime
