#pragma once
// The sandbox state machine: the states a record can be in and the one table of transitions
// the store allows (docs/design/store.md has the diagram).
//
//   creating -> running <-> paused -> destroying -> destroyed
//               running <-> hibernated -> destroying
//   (and failed, which creating / running / paused / hibernated / destroying can fall into)

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::store {

enum class SandboxState {
  kCreating,    // the record exists; the engine's resources may not (yet)
  kRunning,     // the sandbox exists and its agent answers
  kPaused,      // frozen (cgroup freezer / runsc pause); memory kept
  kHibernated,  // saved to disk with its memory (a memory checkpoint); no process runs
  kDestroying,  // teardown started; resources may still exist
  kDestroyed,   // every resource is gone; the record stays until purged
  kFailed,      // broken or not recoverable; `error` says why; resources may remain
};

inline constexpr SandboxState kAllSandboxStates[] = {
    SandboxState::kCreating,   SandboxState::kRunning,   SandboxState::kPaused,
    SandboxState::kHibernated, SandboxState::kDestroying, SandboxState::kDestroyed,
    SandboxState::kFailed,
};

// "creating", "running", ... (the spelling stored in the database and shown by the API).
std::string_view SandboxStateName(SandboxState state);
// The inverse of SandboxStateName; nullopt for anything else.
std::optional<SandboxState> ParseSandboxState(std::string_view name);

struct StateTransition {
  SandboxState from;
  SandboxState to;
  const char* why;  // one line, for docs and for a reviewer of this table
};

// Every allowed transition. A pair not listed here is refused.
std::span<const StateTransition> AllowedTransitions();
bool IsAllowedTransition(SandboxState from, SandboxState to);

// kFailedPrecondition (HTTP 409) unless `current` is one of `wanted`:
// "sandbox sbx-ab12 is paused, not running" / "... is destroyed, not running or paused".
// `wanted` must not be empty.
[[nodiscard]] Status RequireState(std::string_view id, SandboxState current,
                                  std::span<const SandboxState> wanted);

}  // namespace airlock::store
