#pragma once
// Tests that run once per engine: the engines of this build (runtime/engines.cc), by name, and
// what a running daemon says about one of them.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/registry.h"
#include "support/airlockd.h"

namespace airlock::testing {

inline std::vector<std::string> EnginesOfThisBuild() {
  std::vector<std::string> names;
  for (const auto& e : runtime::RegisteredEngines()) names.emplace_back(e.name);
  return names;
}

// Why `daemon` cannot run `engine`'s sandboxes with `capability` (a key of the capabilities
// object, true when it has it; empty: none asked), or "" when it can: for a GTEST_SKIP.
inline std::string EngineLacks(Daemon& daemon, const std::string& engine,
                               const std::string& capability = "") {
  Reply r = daemon.Call(http::verb::get, "/v1/engines");
  if (r.status != 200) return "GET /v1/engines answered " + std::to_string(r.status);
  const nlohmann::json listed = r.Json();
  for (const nlohmann::json& e : listed["engines"]) {
    if (e.value("name", "") != engine) continue;
    if (!e.value("available", false)) {
      return "the " + engine + " engine is unavailable here: " + e.value("reason", "");
    }
    if (!capability.empty() && !e["capabilities"].value(capability, false)) {
      return "the " + engine + " engine has no " + capability;
    }
    return "";
  }
  return "airlockd lists no engine called " + engine;
}

// gtest's name for a test of one engine: its name.
inline std::string EngineName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace airlock::testing
