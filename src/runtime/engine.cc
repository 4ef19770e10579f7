#include "runtime/engine.h"

namespace airlock::runtime {

Error Lacks(std::string_view engine, std::string_view capability, std::string_view what) {
  return Error(ErrorCode::kFailedPrecondition,
               "the " + std::string(engine) + " engine cannot " + std::string(what) +
                   " (it lacks the capability " + std::string(capability) +
                   "; GET /v1/engines lists what each engine can do)");
}

}  // namespace airlock::runtime
