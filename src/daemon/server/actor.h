#pragma once
// Who asked for what the daemon is doing on this thread: the API key of the request the router
// is serving, for the flight recorder's lifecycle events ("by"). The router sets it for the span
// of a request's dispatch (ScopedActor); work of the daemon's own (the TTL reaper, the pool
// filler, recovery) has none.

#include <cstdint>
#include <optional>
#include <string>

namespace airlock::daemon {

struct Actor {
  int64_t key_id = 0;  // 0 with --no-auth
  std::string key;     // the key's name
};

// The actor of the request this thread is serving, if any.
const std::optional<Actor>& CurrentActor();

class ScopedActor {
 public:
  explicit ScopedActor(Actor actor);
  ~ScopedActor();
  ScopedActor(const ScopedActor&) = delete;
  ScopedActor& operator=(const ScopedActor&) = delete;

 private:
  std::optional<Actor> previous_;
};

}  // namespace airlock::daemon
