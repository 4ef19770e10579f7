#include "agent/process_tree.h"

#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::agent {
namespace {

// One scan of /proc: pid -> its stat.
std::unordered_map<pid_t, ProcStat> ScanProc(const char* proc_dir) {
  std::unordered_map<pid_t, ProcStat> out;
  DIR* dir = ::opendir(proc_dir);
  if (!dir) return out;
  while (dirent* e = ::readdir(dir)) {
    pid_t pid = 0;
    std::string_view name(e->d_name);
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (ec != std::errc() || end != name.data() + name.size() || pid <= 0) continue;
    if (auto st = ReadProcStat(pid, proc_dir)) out.emplace(pid, *st);
  }
  ::closedir(dir);
  return out;
}

bool Matches(const std::unordered_map<pid_t, ProcStat>& procs, const ProcId& id) {
  auto it = procs.find(id.pid);
  return it != procs.end() && it->second.start_time == id.start_time && it->second.state != 'Z';
}

// The live members of `roots` and everything below them.
std::set<ProcId> Collect(const std::unordered_map<pid_t, ProcStat>& procs,
                         const std::vector<ProcId>& roots) {
  std::unordered_multimap<pid_t, pid_t> children;
  for (const auto& [pid, st] : procs) children.emplace(st.ppid, pid);
  std::set<ProcId> found;
  std::vector<pid_t> todo;
  for (const auto& r : roots) {
    if (Matches(procs, r) && found.insert(r).second) todo.push_back(r.pid);
  }
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      const ProcStat& st = procs.at(it->second);
      if (st.state == 'Z') continue;
      if (found.insert(ProcId{it->second, st.start_time}).second) todo.push_back(it->second);
    }
  }
  return found;
}

void SleepMs(long ms) {
  timespec ts{0, ms * 1000000L};
  ::nanosleep(&ts, nullptr);
}

}  // namespace

std::optional<ProcStat> ReadProcStat(pid_t pid, const char* proc_dir) {
  std::string path = std::string(proc_dir) + "/" + std::to_string(pid) + "/stat";
  auto text = ReadFileToString(path, 4096);
  if (!text) return std::nullopt;
  // "pid (comm) S ppid pgrp session ...": comm may hold spaces and ')', so cut at the last ')'.
  size_t close = text->rfind(')');
  if (close == std::string::npos || close + 2 >= text->size()) return std::nullopt;
  std::string_view rest(*text);
  rest.remove_prefix(close + 2);
  ProcStat st;
  int field = 3;  // numbering of proc(5)
  while (!rest.empty() && field <= 22) {
    size_t sp = rest.find(' ');
    std::string_view tok = rest.substr(0, sp);
    rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    int64_t v = 0;
    if (field != 3) std::from_chars(tok.data(), tok.data() + tok.size(), v);
    switch (field) {
      case 3:
        st.state = tok.empty() ? '?' : tok[0];
        break;
      case 4:
        st.ppid = static_cast<pid_t>(v);
        break;
      case 5:
        st.pgrp = static_cast<pid_t>(v);
        break;
      case 6:
        st.session = static_cast<pid_t>(v);
        break;
      case 22:
        st.start_time = static_cast<uint64_t>(v);
        break;
    }
    ++field;
  }
  if (field <= 22) return std::nullopt;
  return st;
}

std::vector<ProcId> ProcessTree(pid_t root, const char* proc_dir) {
  auto procs = ScanProc(proc_dir);
  auto it = procs.find(root);
  if (it == procs.end()) return {};
  auto found = Collect(procs, {ProcId{root, it->second.start_time}});
  return {found.begin(), found.end()};
}

std::vector<pid_t> SessionsOf(const std::vector<ProcId>& procs, const char* proc_dir) {
  std::set<pid_t> sessions;
  const pid_t own = ::getsid(0);
  for (const auto& p : procs) {
    auto st = ReadProcStat(p.pid, proc_dir);
    if (!st || st->start_time != p.start_time || st->state == 'Z') continue;
    // Never the caller's own session, which holds the caller.
    if (st->session > 0 && st->session != own) sessions.insert(st->session);
  }
  return {sessions.begin(), sessions.end()};
}

std::vector<ProcId> SessionMembers(const std::vector<pid_t>& sessions, const char* proc_dir) {
  if (sessions.empty()) return {};
  std::set<pid_t> wanted(sessions.begin(), sessions.end());
  std::vector<ProcId> out;
  for (const auto& [pid, st] : ScanProc(proc_dir)) {
    if (st.state != 'Z' && wanted.contains(st.session)) out.push_back({pid, st.start_time});
  }
  return out;
}

void SignalAll(const std::vector<ProcId>& procs, int sig) {
  for (const auto& p : procs) {
    auto st = ReadProcStat(p.pid);
    if (st && st->start_time == p.start_time) ::kill(p.pid, sig);
  }
}

size_t KillTree(const std::vector<ProcId>& roots, const char* proc_dir) {
  std::set<ProcId> stopped;
  // Bounded: each round either stops new processes or ends. A tree that keeps forking faster
  // than it can be stopped still ends here, and the SIGKILLs below take what was found.
  for (int round = 0; round < 64; ++round) {
    auto procs = ScanProc(proc_dir);
    std::vector<ProcId> seeds(roots);
    seeds.insert(seeds.end(), stopped.begin(), stopped.end());
    std::vector<ProcId> fresh;
    for (const auto& p : Collect(procs, seeds)) {
      if (!stopped.contains(p)) fresh.push_back(p);
    }
    if (fresh.empty()) break;
    for (const auto& p : fresh) {
      ::kill(p.pid, SIGSTOP);
      stopped.insert(p);
    }
    // Wait (briefly) until the signal has taken effect: a stopped process cannot fork, so the
    // next scan sees every child it made before it stopped.
    for (int wait = 0; wait < 50; ++wait) {
      bool all_stopped = true;
      for (const auto& p : fresh) {
        auto st = ReadProcStat(p.pid, proc_dir);
        if (st && st->start_time == p.start_time && st->state != 'T' && st->state != 't' &&
            st->state != 'Z' && st->state != 'X') {
          all_stopped = false;
          break;
        }
      }
      if (all_stopped) break;
      SleepMs(1);
    }
  }
  size_t killed = 0;
  for (const auto& p : stopped) {
    auto st = ReadProcStat(p.pid, proc_dir);
    if (st && st->start_time == p.start_time && ::kill(p.pid, SIGKILL) == 0) ++killed;
  }
  return killed;
}

}  // namespace airlock::agent
