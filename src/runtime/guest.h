#pragma once
// The guest contract (docs/design/guest.md): what every engine gives the sandbox it makes, so
// that one airlock-agent, one API and one SDK serve every engine alike. Engines make it true;
// the daemon relies on it (a relative path in the files API is taken from kHome, commands run as
// kUser unless told, ...).

#include <sys/types.h>

#include <string_view>

namespace airlock::runtime::guest {

// The accounts every sandbox has, in its own /etc/passwd and /etc/group (merged into a root file
// system's own, ours winning on a clash of name or id).
inline constexpr std::string_view kUser = "user";   // who commands run as by default
inline constexpr uid_t kUserUid = 1000;
inline constexpr gid_t kUserGid = 1000;
inline constexpr std::string_view kHome = "/home/user";  // kUser's home, writable, its cwd
inline constexpr std::string_view kRootHome = "/root";

// The agent is the sandbox's PID 1 and serves the daemon's channels, whatever carries them: an
// inherited socket it listens on (--listen-fd), a unix socket, or a virtual serial or vsock
// port (later engines). Its flags as an engine starts it, after the engine's own:
//   --listen-fd N | --listen PATH   where channels arrive
//   --root /                        the sandbox's root, as the agent sees it
//   --user user                     the default user of commands
//   --drop-caps                     no capability is kept across its execs
//   --env KEY=VALUE                 (repeated) the sandbox's env, for every command
inline constexpr std::string_view kAgentRoot = "/";

// PATH for commands that do not set one.
inline constexpr std::string_view kDefaultPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

}  // namespace airlock::runtime::guest
