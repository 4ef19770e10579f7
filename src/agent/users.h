#pragma once
// Users inside the sandbox, read from its own /etc/passwd and /etc/group.
// (The agent is static: glibc's NSS lookups do not work there, and the sandbox's files are
// what counts anyway.)

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::agent {

struct UserInfo {
  std::string name;  // empty for a numeric uid with no passwd entry
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups from /etc/group, the primary one first
  std::string home = "/";
  std::string shell = "/bin/sh";
};

// Resolves `spec`: a user name, or a numeric uid ("1000"). `etc_dir` holds passwd and group.
// A numeric uid without a passwd entry is accepted with gid = uid and home "/".
[[nodiscard]] Result<UserInfo> LookupUser(std::string_view spec, const std::string& etc_dir);

}  // namespace airlock::agent
