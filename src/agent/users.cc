#include "agent/users.h"

#include <charconv>

#include "common/syscall.h"

namespace airlock::agent {
namespace {

std::vector<std::string_view> Split(std::string_view line, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = line.find(sep, start);
    out.push_back(line.substr(start, pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

bool ParseId(std::string_view s, uint32_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

template <typename F>
void ForEachLine(const std::string& text, F&& f) {
  std::string_view rest(text);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (!line.empty() && line[0] != '#') f(line);
  }
}

}  // namespace

Result<UserInfo> LookupUser(std::string_view spec, const std::string& etc_dir) {
  if (spec.empty()) return Fail(ErrorCode::kInvalidArgument, "user is empty");
  uint32_t numeric = 0;
  bool by_uid = ParseId(spec, numeric);

  auto passwd = ReadFileToString(etc_dir + "/passwd", 4 << 20);
  UserInfo user;
  bool found = false;
  if (passwd) {
    ForEachLine(*passwd, [&](std::string_view line) {
      if (found) return;
      auto f = Split(line, ':');  // name:x:uid:gid:gecos:home:shell
      uint32_t uid, gid;
      if (f.size() < 7 || !ParseId(f[2], uid) || !ParseId(f[3], gid)) return;
      if (by_uid ? uid != numeric : f[0] != spec) return;
      user.name = f[0];
      user.uid = uid;
      user.gid = gid;
      user.home = f[5].empty() ? "/" : std::string(f[5]);
      if (!f[6].empty()) user.shell = f[6];
      found = true;
    });
  }
  if (!found) {
    if (!by_uid) {
      return Fail(ErrorCode::kInvalidArgument,
                  "unknown user '" + std::string(spec) + "' (not in " + etc_dir + "/passwd)");
    }
    user.uid = numeric;
    user.gid = numeric;
  }
  user.groups.push_back(user.gid);
  if (user.name.empty()) return user;
  auto group = ReadFileToString(etc_dir + "/group", 4 << 20);
  if (!group) return user;
  ForEachLine(*group, [&](std::string_view line) {
    auto f = Split(line, ':');  // name:x:gid:member,member
    uint32_t gid;
    if (f.size() < 4 || !ParseId(f[2], gid) || gid == user.gid) return;
    for (auto member : Split(f[3], ',')) {
      if (member == user.name) {
        user.groups.push_back(gid);
        return;
      }
    }
  });
  return user;
}

}  // namespace airlock::agent
