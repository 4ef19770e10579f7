#include "common/helpers.h"

#include <unistd.h>

#include <filesystem>

#include "common/build_id.h"

namespace airlock {
namespace fs = std::filesystem;
namespace {

// Each helper's place in the build tree, below its top directory.
std::string_view BuildTreePath(std::string_view name) {
  if (name == "airlock-agent") return "src/agent/airlock-agent";
  if (name == "airlock-jail") return "src/runtime/jail/airlock-jail";
  if (name == "airlockd") return "src/daemon/server/airlockd";  // for airlock doctor
  return "";
}

bool Inside(const fs::path& path, const fs::path& dir) {
  auto [d, p] = std::mismatch(dir.begin(), dir.end(), path.begin(), path.end());
  return d == dir.end();
}

}  // namespace

std::vector<std::string> HelperCandidates(std::string_view name, const std::string& self) {
  const fs::path bin = fs::path(self).parent_path();
  std::vector<std::string> out = {bin / name, bin.parent_path() / "libexec" / "airlock" / name};
  const fs::path build = fs::path(kBuildDir).lexically_normal();
  if (std::string_view in_tree = BuildTreePath(name);
      !in_tree.empty() && !build.empty() && Inside(fs::path(self).lexically_normal(), build)) {
    out.push_back(build / in_tree);
  }
  return out;
}

std::string FindHelper(std::string_view name) {
  std::error_code ec;
  const fs::path self = fs::canonical("/proc/self/exe", ec);
  if (ec) return "";
  for (const std::string& candidate : HelperCandidates(name, self)) {
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

}  // namespace airlock
