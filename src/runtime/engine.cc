#include "runtime/engine.h"

#include "common/ids.h"
#include "protocol/client.h"

namespace airlock::runtime {

Error Lacks(std::string_view engine, std::string_view capability, std::string_view what) {
  return Error(ErrorCode::kFailedPrecondition,
               "the " + std::string(engine) + " engine cannot " + std::string(what) +
                   " (it lacks the capability " + std::string(capability) +
                   "; GET /v1/engines lists what each engine can do)");
}

Status ProbeByCreate(Engine& engine, SandboxSpec spec) {
  spec.id = NewSandboxId();
  auto sandbox = engine.Create(spec);
  if (!sandbox) return std::unexpected(sandbox.error());
  auto client = protocol::BlockingClient::Connect((*sandbox)->TakeAgentChannel(), "airlock-probe");
  Status destroyed = engine.Destroy(spec.id);
  if (!client) return std::unexpected(client.error().Wrap("greeting the probe's agent"));
  return destroyed;
}

}  // namespace airlock::runtime
