#pragma once
// `airlockd --doctor` and `airlock doctor` (docs/doctor.md): the host judged as the daemon would
// see it at start. Each finding names what was checked, what was found and, when it is not
// fine, what to do about it. The engine findings come from the engine registry itself (each
// engine built and probed, as at start), so they cannot disagree with GET /v1/engines on the
// same host and config.
//
// The host checks read the host through HostPaths, so that tests can put a made-up /proc and
// /sys in front of them; the checks that try something for real (a user namespace) run only
// when `probe` is set.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/registry.h"

namespace airlock::daemon {

enum class Verdict { kOk, kInfo, kWarn, kFail };
std::string_view VerdictName(Verdict v);  // "ok", "info", "warn", "fail"

struct Finding {
  std::string check;  // "kernel", "cgroups", "engine jail", ...
  Verdict verdict = Verdict::kOk;
  std::string detail;  // what was found
  std::string fix;     // what to do (empty when nothing needs doing)
};

struct HostPaths {
  std::string proc = "/proc";
  std::string sys = "/sys";
  std::string dev = "/dev";
  std::string path_env;  // the directories searched for programs (nft, ip, runsc)
};

struct HostCheckInput {
  HostPaths host;
  std::string state_dir;
  bool open_mode = false;  // an uplink is configured: open-mode sandboxes route through it
  std::string runsc;       // a configured runsc path ("" if none: PATH is searched)
  bool probe = false;      // try what can be tried (a user namespace), not only read files
  bool running_as_root = true;
};

// The kernel, cgroups (version, controllers, delegation), user namespaces (and AppArmor or
// SELinux limits on them), overlayfs, seccomp, nftables and iproute2, IPv4 forwarding for open
// mode, runsc, /dev/kvm, and the state dir's free space and inodes.
std::vector<Finding> CheckHost(const HostCheckInput& input);

// One finding per engine, from what the registry found: available (with its description, which
// says what an engine chose, such as a platform) or not, with the reason. The default engine
// unavailable is a failure; another engine unavailable is a warning.
std::vector<Finding> CheckEngines(const std::vector<runtime::EngineStatus>& engines,
                                  const std::string& default_engine);

// Whether the findings let the daemon run its default engine: no failure among them.
bool Ready(const std::vector<Finding>& findings);

// {"ready": bool, "default_engine": NAME, "findings": [{check, verdict, detail, fix}],
//  "engines": [{name, available, default, reason}]}
nlohmann::json DoctorJson(const std::vector<Finding>& findings,
                          const std::vector<runtime::EngineStatus>& engines,
                          const std::string& default_engine);
// One line per finding ("ok    kernel       6.18.0 ..."), the fix indented below it.
std::string DoctorText(const std::vector<Finding>& findings);

}  // namespace airlock::daemon
