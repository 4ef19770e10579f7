#pragma once
// Spawning one command: everything is prepared in the agent, then a vfork-style child
// (clone with CLONE_VM | CLONE_VFORK) runs a short, allocation-free list of steps and execs.
// A failed step comes back as {step, errno}.

#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "agent/users.h"
#include "common/error.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"

namespace airlock::agent {

struct SpawnPlan {
  std::vector<std::string> candidates;  // paths to try with execve, in order (a PATH search)
  std::vector<std::string> argv;
  std::vector<std::string> envp;
  std::string cwd;  // required directory; empty: try `home`, then "/"
  std::string home;
  std::optional<UserInfo> switch_to;  // set when the command runs as another user
  bool pty = false;
  uint16_t rows = 0, cols = 0;
  bool stdin_pipe = false;
  std::optional<rlimit> nofile;
  bool drop_caps = false;
};

struct Spawned {
  pid_t pid = -1;
  UniqueFd stdin_fd;   // pipe (or pty master) to write the command's stdin; may be empty
  UniqueFd stdout_fd;  // non-blocking; with a pty, the master (stdout and stderr together)
  UniqueFd stderr_fd;  // non-blocking; empty with a pty
};

struct ExecDefaults {
  std::string etc_dir = "/etc";          // where passwd and group are read
  std::optional<UserInfo> default_user;  // who commands run as when a request names nobody
  std::vector<std::string> env;          // KEY=VALUE applied before the request's own
  std::optional<rlimit> nofile;          // RLIMIT_NOFILE for commands (the agent raises its own)
  bool drop_caps = false;  // commands run with no capability at all, whatever their uid
};

// Turns a request into a plan: resolves the user, builds the environment, searches PATH.
[[nodiscard]] Result<SpawnPlan> PlanExec(const protocol::Exec& req, const ExecDefaults& defaults);

// Starts the plan. The child is a session leader (its pid is its process group), a child
// subreaper, has default signal dispositions and an empty mask, and no fd but 0, 1, 2.
[[nodiscard]] Result<Spawned> Spawn(const SpawnPlan& plan);

}  // namespace airlock::agent
