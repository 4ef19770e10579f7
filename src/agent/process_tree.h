#pragma once
// Finding and killing a process tree through /proc, so that a timed-out command takes its
// grandchildren and daemonised children with it.
//
// Why this works for daemons: the agent makes every exec's first process a child subreaper
// (PR_SET_CHILD_SUBREAPER), so a double-forked daemon is re-parented to that process rather
// than to the agent, and stays in its tree while the command runs.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace airlock::agent {

// A process, identified across pid reuse by its start time (clock ticks since boot).
struct ProcId {
  pid_t pid = 0;
  uint64_t start_time = 0;
  auto operator<=>(const ProcId&) const = default;
};

struct ProcStat {
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;
  pid_t session = 0;
  uint64_t start_time = 0;
};

// /proc/<pid>/stat, or nullopt if the process is gone. `proc_dir` is normally "/proc".
std::optional<ProcStat> ReadProcStat(pid_t pid, const char* proc_dir = "/proc");

// `root` (if alive) and every process below it, by parent links.
std::vector<ProcId> ProcessTree(pid_t root, const char* proc_dir = "/proc");

// The sessions of the live members of `procs`, each once, leaving out the caller's own.
std::vector<pid_t> SessionsOf(const std::vector<ProcId>& procs, const char* proc_dir = "/proc");

// Every live process in one of `sessions` (by session id: the pid of the session's leader).
std::vector<ProcId> SessionMembers(const std::vector<pid_t>& sessions,
                                   const char* proc_dir = "/proc");

// Sends `sig` to every live process in `procs` whose start time still matches.
void SignalAll(const std::vector<ProcId>& procs, int sig);

// SIGKILLs `roots` and all their descendants. The tree is stopped first (SIGSTOP, rescanned
// until no new process appears and every member is stopped), so nothing can fork out of it
// while it is being killed. Returns how many processes were killed.
size_t KillTree(const std::vector<ProcId>& roots, const char* proc_dir = "/proc");

}  // namespace airlock::agent
