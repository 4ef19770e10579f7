#include "runtime/engine.h"

#include "common/ids.h"
#include "protocol/client.h"

namespace airlock::runtime {

bool ProcessEvent::AddArg(std::string_view arg) {
  size_t used = 0;
  for (const std::string& a : argv) used += a.size();
  if (argv.size() == kMaxArgs || used == kMaxArgvBytes) {
    argv_truncated = true;
    return false;
  }
  if (used + arg.size() > kMaxArgvBytes) {
    argv.emplace_back(arg.substr(0, kMaxArgvBytes - used));
    argv_truncated = true;
    return false;
  }
  argv.emplace_back(arg);
  return true;
}

void ProcessEvent::SetWaitStatus(int status) {
  if ((status & 0x7f) == 0) {
    exit_code = (status >> 8) & 0xff;
    signal = 0;
  } else {
    exit_code = -1;
    signal = status & 0x7f;
  }
}


Error Lacks(std::string_view engine, std::string_view capability, std::string_view what) {
  return Error(ErrorCode::kFailedPrecondition,
               "the " + std::string(engine) + " engine cannot " + std::string(what) +
                   " (it lacks the capability " + std::string(capability) +
                   "; GET /v1/engines lists what each engine can do)");
}

Status Engine::WatchProcesses(ProcessEventSink) {
  return std::unexpected(Lacks(name(), "process_events", "report the processes of its sandboxes"));
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
