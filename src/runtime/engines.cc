// Every engine this build has, for the registry (runtime/registry.h). Adding an engine: its
// folder under src/runtime/, its library linked to airlock_engines (src/runtime/CMakeLists.txt),
// and one line here.

#include "runtime/gvisor/gvisor_engine.h"
#include "runtime/jail/jail_engine.h"
#include "runtime/registry.h"

namespace airlock::runtime {

const std::vector<EngineRegistration>& RegisteredEngines() {
  static const std::vector<EngineRegistration> kEngines = {
      {"jail", "Linux namespaces, seccomp and cgroups on the host's kernel: the fast path",
       &jail::MakeEngine},
      {"gvisor", "gVisor's user-space kernel (runsc) between the sandbox and the host's kernel",
       &gvisor::MakeEngine},
  };
  return kEngines;
}

}  // namespace airlock::runtime
