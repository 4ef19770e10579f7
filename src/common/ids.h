#pragma once
// Sandbox ids: "sbx-" followed by 16 lowercase base32 characters (80 random bits).
// Ids become file, cgroup and netns names, so anything from outside is validated first.

#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock {

// A fresh random sandbox id from getrandom(2).
std::string NewSandboxId();
// Accepts 1-64 characters of [A-Za-z0-9-], not starting with '-' (firecracker's rule, which
// keeps ids safe as path components, cgroup names and interface-name suffixes).
[[nodiscard]] Status ValidateSandboxId(std::string_view id);

}  // namespace airlock
