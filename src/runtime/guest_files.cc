#include "runtime/guest_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace airlock::runtime::guest {

std::vector<std::pair<std::string, std::string>> EtcFiles(const std::string& hostname,
                                                          const std::string& nameserver) {
  return {
      {"passwd",
       "root:x:0:0:root:/root:/bin/sh\n"
       "user:x:1000:1000:user:/home/user:/bin/bash\n"
       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
      {"group", "root:x:0:\ntty:x:5:user\nuser:x:1000:\nnogroup:x:65534:\n"},
      {"hosts", "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost ip6-localhost\n"},
      {"hostname", hostname + "\n"},
      {"nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"},
      // Without a network the resolver has nothing to ask.
      {"resolv.conf", nameserver.empty() ? "# this sandbox has no network\n"
                                         : "nameserver " + nameserver + "\noptions edns0\n"},
  };
}

std::string MergeAccounts(std::string_view existing, std::string_view ours) {
  // Field 0 is the name, field 2 the numeric id, in both passwd and group.
  auto field = [](std::string_view line, int n) {
    for (int i = 0; i < n; ++i) {
      size_t colon = line.find(':');
      if (colon == std::string_view::npos) return std::string_view();
      line.remove_prefix(colon + 1);
    }
    return line.substr(0, line.find(':'));
  };
  auto lines = [](std::string_view text, auto&& each) {
    while (!text.empty()) {
      size_t nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      if (!line.empty()) each(line);
      text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    }
  };
  std::vector<std::string_view> names, ids;
  lines(ours, [&](std::string_view line) {
    names.push_back(field(line, 0));
    ids.push_back(field(line, 2));
  });
  std::string out(ours);
  if (!out.empty() && out.back() != '\n') out += '\n';
  lines(existing, [&](std::string_view line) {
    auto taken = [](const std::vector<std::string_view>& v, std::string_view x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    if (taken(names, field(line, 0)) || taken(ids, field(line, 2))) return;
    out.append(line);
    out += '\n';
  });
  return out;
}

Result<std::vector<std::string>> MirrorHostEntries(const std::string& host, const std::string& dir,
                                                   std::span<const char* const> names) {
  std::vector<std::string> dirs;
  for (const char* name : names) {
    const std::string from = host + "/" + name, inside = dir + "/" + name;
    struct stat st, old;
    const bool present = ::lstat(from.c_str(), &st) == 0;
    std::error_code ec;
    // What is there is replaced unless it is already the mount point wanted (never chmod-ed
    // through a symlink).
    if (::lstat(inside.c_str(), &old) == 0 &&
        !(present && S_ISDIR(st.st_mode) && S_ISDIR(old.st_mode))) {
      std::filesystem::remove(inside, ec);
    }
    if (!present) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[256];
      ssize_t n = ::readlink(from.c_str(), target, sizeof target - 1);
      if (n <= 0) return FailErrno("readlink " + from, errno);
      if (::symlink(std::string(target, static_cast<size_t>(n)).c_str(), inside.c_str()) < 0) {
        return FailErrno("symlink " + inside, errno);
      }
    } else if (S_ISDIR(st.st_mode)) {
      if (::mkdir(inside.c_str(), 0755) < 0 && errno != EEXIST) {
        return FailErrno("mkdir " + inside, errno);
      }
      if (::chmod(inside.c_str(), 0755) < 0) return FailErrno("chmod " + inside, errno);
      dirs.emplace_back(name);
    }
  }
  return dirs;
}

}  // namespace airlock::runtime::guest
