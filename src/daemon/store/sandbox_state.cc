#include "daemon/store/sandbox_state.h"

#include <algorithm>

namespace airlock::store {
namespace {

using S = SandboxState;

// The state machine, in one place. Recovery (daemon restart) uses the same table: it adopts
// what it finds alive, and marks failed what it cannot recover.
constexpr StateTransition kTransitions[] = {
    {S::kCreating, S::kRunning, "the engine created the sandbox and its agent said hello"},
    {S::kCreating, S::kFailed, "the create failed, or the daemon restarted during it"},
    {S::kCreating, S::kDestroying, "delete during create: tear down what was made so far"},
    {S::kRunning, S::kPaused, "pause (freeze) a running sandbox"},
    {S::kPaused, S::kRunning,
     "resume; recovery also uses it for a record left paused but found thawed"},
    {S::kRunning, S::kHibernated, "pause with memory: saved to disk, its processes stopped"},
    {S::kHibernated, S::kRunning, "resume: restored from its memory image"},
    {S::kRunning, S::kDestroying, "delete, or TTL expiry"},
    {S::kHibernated, S::kDestroying, "delete, or TTL expiry, of a hibernated sandbox"},
    {S::kPaused, S::kDestroying, "delete, or TTL expiry, of a frozen sandbox"},
    {S::kFailed, S::kDestroying, "delete of a failed sandbox removes what it left behind"},
    {S::kDestroying, S::kDestroyed, "every resource named after the id is gone"},
    // Recovery transitions: a restart finds the sandbox dead or unrecoverable.
    {S::kRunning, S::kFailed, "recovery: the sandbox's processes or resources are gone"},
    {S::kPaused, S::kFailed, "recovery: a paused sandbox whose resources are gone"},
    {S::kHibernated, S::kFailed, "the restore failed, or recovery found its image gone"},
    {S::kDestroying, S::kFailed, "teardown failed and left resources; a later delete retries"},
};

}  // namespace

std::string_view SandboxStateName(SandboxState state) {
  switch (state) {
    case S::kCreating:
      return "creating";
    case S::kRunning:
      return "running";
    case S::kPaused:
      return "paused";
    case S::kHibernated:
      return "hibernated";
    case S::kDestroying:
      return "destroying";
    case S::kDestroyed:
      return "destroyed";
    case S::kFailed:
      return "failed";
  }
  Panic("SandboxStateName: value out of range");
}

std::optional<SandboxState> ParseSandboxState(std::string_view name) {
  for (SandboxState state : kAllSandboxStates) {
    if (SandboxStateName(state) == name) return state;
  }
  return std::nullopt;
}

std::span<const StateTransition> AllowedTransitions() { return kTransitions; }

bool IsAllowedTransition(SandboxState from, SandboxState to) {
  return std::ranges::any_of(
      kTransitions, [&](const StateTransition& t) { return t.from == from && t.to == to; });
}

Status RequireState(std::string_view id, SandboxState current,
                    std::span<const SandboxState> wanted) {
  AIRLOCK_CHECK(!wanted.empty());
  if (std::ranges::find(wanted, current) != wanted.end()) return {};
  std::string message =
      "sandbox " + std::string(id) + " is " + std::string(SandboxStateName(current)) + ", not ";
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (i > 0) message += " or ";
    message += SandboxStateName(wanted[i]);
  }
  return Fail(ErrorCode::kFailedPrecondition, std::move(message));
}

}  // namespace airlock::store
