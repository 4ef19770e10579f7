// airlock-payload: the hostile half of the security suite. Uploaded into a sandbox through the
// files API and run through the exec API, it tries what it is told to and prints one JSON line
// per attempt saying what it observed (return value, errno name, bytes, ids). It judges nothing:
// the test on the host decides what counts as contained.
//
//   airlock-payload ATTEMPT[:ARG[:ARG...]] ...
//
// Each attempt runs in a forked child, so that one the kernel kills (SIGSYS from seccomp) is
// reported as {"signal": "SIGSYS"} and the rest still run. Built without sanitizers and static
// where it can be: it must run inside a sandbox exactly as hostile code would.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <linux/keyctl.h>
#include <linux/reboot.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Output: a flat JSON object per attempt.
// ---------------------------------------------------------------------------------------------

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

class Line {
 public:
  Line& Str(const char* key, const std::string& value) { return Raw(key, Quote(value)); }
  Line& Int(const char* key, long long value) { return Raw(key, std::to_string(value)); }
  Line& Bool(const char* key, bool value) { return Raw(key, value ? "true" : "false"); }
  Line& Raw(const char* key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + Quote(key) + ":" + json;
    return *this;
  }
  // {"ret": r, "errno": "E..."} of a call that returns -1 with errno on failure; errno is read
  // here, after the call (an argument list's order of evaluation is unspecified).
  Line& Result(long long ret) { return Result(ret, errno); }
  Line& Result(long long ret, int err) {
    Int("ret", ret);
    return Str("errno", ret < 0 ? ErrnoName(err) : "");
  }
  std::string Text() const { return "{" + body_ + "}"; }

  static std::string ErrnoName(int err) {
    static const std::map<int, const char*> kNames = {
        {EPERM, "EPERM"},     {ENOENT, "ENOENT"},   {ESRCH, "ESRCH"},
        {EINTR, "EINTR"},     {EIO, "EIO"},         {ENXIO, "ENXIO"},
        {E2BIG, "E2BIG"},     {ENOEXEC, "ENOEXEC"}, {EBADF, "EBADF"},
        {ECHILD, "ECHILD"},   {EAGAIN, "EAGAIN"},   {ENOMEM, "ENOMEM"},
        {EACCES, "EACCES"},   {EFAULT, "EFAULT"},   {EBUSY, "EBUSY"},
        {EEXIST, "EEXIST"},   {EXDEV, "EXDEV"},     {ENODEV, "ENODEV"},
        {ENOTDIR, "ENOTDIR"}, {EISDIR, "EISDIR"},   {EINVAL, "EINVAL"},
        {ENFILE, "ENFILE"},   {EMFILE, "EMFILE"},   {ENOTTY, "ENOTTY"},
        {ETXTBSY, "ETXTBSY"}, {EFBIG, "EFBIG"},     {ENOSPC, "ENOSPC"},
        {ESPIPE, "ESPIPE"},   {EROFS, "EROFS"},     {EMLINK, "EMLINK"},
        {EPIPE, "EPIPE"},     {ERANGE, "ERANGE"},   {ENOSYS, "ENOSYS"},
        {ELOOP, "ELOOP"},     {ENOTSUP, "EOPNOTSUPP"}, {EAFNOSUPPORT, "EAFNOSUPPORT"},
        {EPROTONOSUPPORT, "EPROTONOSUPPORT"},       {ESOCKTNOSUPPORT, "ESOCKTNOSUPPORT"},
        {ENETUNREACH, "ENETUNREACH"},               {EHOSTUNREACH, "EHOSTUNREACH"},
        {ECONNREFUSED, "ECONNREFUSED"},             {ETIMEDOUT, "ETIMEDOUT"},
        {EINPROGRESS, "EINPROGRESS"},               {EADDRNOTAVAIL, "EADDRNOTAVAIL"},
        {ENOKEY, "ENOKEY"},   {EDQUOT, "EDQUOT"},   {ENOTCONN, "ENOTCONN"},
        {EPROTOTYPE, "EPROTOTYPE"},
    };
    auto it = kNames.find(err);
    return it != kNames.end() ? it->second : "errno" + std::to_string(err);
  }

 private:
  std::string body_;
};

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

// FNV-1a, 64 bits: the host compares it with the same hash of its own file.
std::string Fnv(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Reads up to 1 MiB from fd.
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  while (out.size() < (1u << 20)) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string ReadLink(const std::string& path, int* err) {
  char buf[4096];
  ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) {
    *err = errno;
    return "";
  }
  *err = 0;
  return std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
  }
  closedir(d);
  return names;
}

std::string JsonList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + Quote(items[i]);
  return out + "]";
}

bool IsNumber(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

uint64_t Number(const std::string& s) { return strtoull(s.c_str(), nullptr, 0); }

// Our own root, to tell a walk that ends at it from one that ends anywhere else.
bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Climbs ".." from `fd` (a directory) until the top; says where it ended and whether the host
// file `canary` (an absolute host path) can be opened from there.
void Walk(int fd, const std::string& canary, Line& line, const char* prefix) {
  struct stat root {};
  stat("/", &root);
  int cur = dup(fd);
  int levels = 0;
  for (; levels < 64; ++levels) {
    int up = openat(cur, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (up < 0) break;
    struct stat a {}, b {};
    fstat(cur, &a);
    fstat(up, &b);
    close(cur);
    cur = up;
    if (SameFile(a, b)) break;
  }
  struct stat top {};
  fstat(cur, &top);
  std::string p(prefix);
  line.Bool((p + "_top_is_own_root").c_str(), SameFile(top, root));
  if (!canary.empty()) {
    int c = openat(cur, canary.c_str() + 1, O_RDONLY | O_CLOEXEC);
    line.Bool((p + "_canary_opened").c_str(), c >= 0);
    if (c >= 0) close(c);
  }
  close(cur);
}

// ---------------------------------------------------------------------------------------------
// The syscall table: each call with arguments chosen so that, were it not filtered, it would do
// something harmless or fail with an errno other than the filter's.
// ---------------------------------------------------------------------------------------------

long Sys(long nr, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  return syscall(nr, a, b, c, d, e, f);
}

const std::map<std::string, std::function<long()>>& SyscallTable() {
  static const auto* table = new std::map<std::string, std::function<long()>>{
      {"unshare", [] { return Sys(SYS_unshare, CLONE_NEWUSER); }},
      {"setns", [] {
         int fd = open("/proc/self/ns/uts", O_RDONLY);
         return Sys(SYS_setns, fd, CLONE_NEWUTS);
       }},
      {"mount", [] { return Sys(SYS_mount, (long)"none", (long)"/tmp", (long)"tmpfs", 0, 0); }},
      {"umount2", [] { return Sys(SYS_umount2, (long)"/proc", MNT_DETACH); }},
      {"pivot_root", [] { return Sys(SYS_pivot_root, (long)"/tmp", (long)"/tmp"); }},
      {"chroot", [] { return Sys(SYS_chroot, (long)"/tmp"); }},
      {"reboot", [] { return Sys(SYS_reboot, 0, 0, 0, 0); }},
      {"kexec_load", [] { return Sys(SYS_kexec_load, 0, 0, 0, 0); }},
      {"kexec_file_load", [] { return Sys(SYS_kexec_file_load, -1, -1, 0, 0, 0); }},
      {"init_module", [] { return Sys(SYS_init_module, 0, 0, (long)""); }},
      {"finit_module", [] { return Sys(SYS_finit_module, -1, (long)"", 0); }},
      {"delete_module", [] { return Sys(SYS_delete_module, (long)"airlock_nonexistent", 0); }},
      {"swapon", [] { return Sys(SYS_swapon, (long)"/nonexistent", 0); }},
      {"swapoff", [] { return Sys(SYS_swapoff, (long)"/nonexistent"); }},
      {"acct", [] { return Sys(SYS_acct, 0); }},
      {"quotactl", [] { return Sys(SYS_quotactl, 0, 0, 0, 0); }},
      {"syslog", [] { return Sys(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, 0, 0); }},
      // Both NULL: a no-op that returns 0 where it is allowed.
      {"settimeofday", [] { return Sys(SYS_settimeofday, 0, 0); }},
      {"clock_settime", [] { return Sys(SYS_clock_settime, CLOCK_REALTIME, 0); }},
      {"sethostname", [] { return Sys(SYS_sethostname, (long)"pwned", 5); }},
      {"setdomainname", [] { return Sys(SYS_setdomainname, (long)"pwned", 5); }},
      {"vhangup", [] { return Sys(SYS_vhangup); }},
      {"iopl", [] { return Sys(SYS_iopl, 0); }},
      {"ioperm", [] { return Sys(SYS_ioperm, 0x80, 1, 0); }},
      {"modify_ldt", [] { return Sys(SYS_modify_ldt, 0, 0, 0); }},
      {"uselib", [] { return Sys(SYS_uselib, 0); }},
      {"ustat", [] { return Sys(SYS_ustat, 0, 0); }},
      {"sysfs", [] { return Sys(SYS_sysfs, 3); }},
      {"_sysctl", [] { return Sys(SYS__sysctl, 0); }},
      {"lookup_dcookie", [] { return Sys(SYS_lookup_dcookie, 0, 0, 0); }},
      {"personality", [] { return Sys(SYS_personality, READ_IMPLIES_EXEC); }},
      {"personality_no_aslr", [] { return Sys(SYS_personality, ADDR_NO_RANDOMIZE); }},
      {"ptrace", [] { return Sys(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0); }},
      {"process_vm_readv", [] {
         char buf[8];
         iovec local{buf, sizeof buf}, remote{buf, sizeof buf};
         return Sys(SYS_process_vm_readv, getpid(), (long)&local, 1, (long)&remote, 1, 0);
       }},
      {"process_vm_writev", [] {
         char buf[8] = {};
         iovec local{buf, sizeof buf}, remote{buf, sizeof buf};
         return Sys(SYS_process_vm_writev, getpid(), (long)&local, 1, (long)&remote, 1, 0);
       }},
      {"kcmp", [] { return Sys(SYS_kcmp, getpid(), getpid(), KCMP_FILE, 0, 0); }},
      {"pidfd_getfd", [] { return Sys(SYS_pidfd_getfd, -1, 0, 0); }},
      {"process_madvise", [] { return Sys(SYS_process_madvise, -1, 0, 0, 0, 0); }},
      {"bpf", [] { return Sys(SYS_bpf, 5 /* BPF_PROG_LOAD */, 0, 0); }},
      {"perf_event_open", [] { return Sys(SYS_perf_event_open, 0, 0, -1, -1, 0); }},
      {"userfaultfd", [] { return Sys(SYS_userfaultfd, 0); }},
      {"add_key", [] {
         return Sys(SYS_add_key, (long)"user", (long)"airlock", (long)"x", 1,
                    KEY_SPEC_PROCESS_KEYRING);
       }},
      {"keyctl", [] { return Sys(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0); }},
      {"request_key", [] {
         return Sys(SYS_request_key, (long)"user", (long)"airlock", 0, 0);
       }},
      {"fanotify_init", [] { return Sys(SYS_fanotify_init, 0, 0); }},
      {"open_by_handle_at", [] { return Sys(SYS_open_by_handle_at, -1, 0, 0); }},
      {"name_to_handle_at", [] { return Sys(SYS_name_to_handle_at, AT_FDCWD, (long)"/", 0, 0, 0); }},
      {"mbind", [] { return Sys(SYS_mbind, 0, 0, 0, 0, 0, 0); }},
      {"set_mempolicy", [] { return Sys(SYS_set_mempolicy, 0, 0, 0); }},
      {"migrate_pages", [] { return Sys(SYS_migrate_pages, 0, 0, 0, 0); }},
      {"move_pages", [] { return Sys(SYS_move_pages, 0, 0, 0, 0, 0, 0); }},
      // ENOSYS: as if the kernel were older.
      {"clone3", [] { return Sys(SYS_clone3, 0, 0); }},
      {"open_tree", [] { return Sys(SYS_open_tree, -1, (long)"", 0); }},
      {"move_mount", [] { return Sys(SYS_move_mount, -1, (long)"", -1, (long)"", 0); }},
      {"fsopen", [] { return Sys(SYS_fsopen, (long)"tmpfs", 0); }},
      {"fsconfig", [] { return Sys(SYS_fsconfig, -1, 0, 0, 0, 0); }},
      {"fsmount", [] { return Sys(SYS_fsmount, -1, 0, 0); }},
      {"fspick", [] { return Sys(SYS_fspick, -1, (long)"", 0); }},
      {"mount_setattr", [] { return Sys(SYS_mount_setattr, -1, (long)"", 0, 0, 0); }},
      {"io_uring_setup", [] { return Sys(SYS_io_uring_setup, 1, 0); }},
      {"io_uring_enter", [] { return Sys(SYS_io_uring_enter, -1, 0, 0, 0, 0, 0); }},
      {"io_uring_register", [] { return Sys(SYS_io_uring_register, -1, 0, 0, 0); }},
      // Allowed: positive controls.
      {"getpid", [] { return Sys(SYS_getpid); }},
      {"personality_query", [] { return Sys(SYS_personality, 0xffffffff); }},
      {"personality_linux", [] { return Sys(SYS_personality, PER_LINUX); }},
      {"uname", [] {
         char buf[512];
         return Sys(SYS_uname, (long)buf);
       }},
      {"fork", [] {
         long pid = Sys(SYS_clone, SIGCHLD, 0, 0, 0, 0);
         if (pid == 0) _exit(0);
         if (pid > 0) waitpid(static_cast<pid_t>(pid), nullptr, 0);
         return pid;
       }},
      {"pidfd_open_self", [] { return Sys(SYS_pidfd_open, getpid(), 0); }},
      {"socketpair_unix", [] {
         int sv[2];
         return Sys(SYS_socketpair, AF_UNIX, SOCK_STREAM, 0, (long)sv);
       }},
  };
  return *table;
}

// ---------------------------------------------------------------------------------------------
// The attempts. `args` are the colon-separated parts after the attempt's name.
// ---------------------------------------------------------------------------------------------

using Args = std::vector<std::string>;

// The pipe an attempt's child reports on: its own, not something the sandbox gave it.
int g_report_fd = -1;

void ReadFile(const Args& a, Line& line) {
  int fd = open(a.at(0).c_str(), O_RDONLY | O_CLOEXEC);
  line.Result(fd);
  if (fd < 0) return;
  std::string data = ReadAll(fd);
  line.Int("bytes", static_cast<long long>(data.size())).Str("fnv", Fnv(data));
  close(fd);
}

// Opens for writing only: the permission check is the gate; nothing is written.
void OpenWrite(const Args& a, Line& line) {
  int fd = open(a.at(0).c_str(), O_WRONLY | O_CLOEXEC);
  line.Result(fd);
  if (fd >= 0) close(fd);
}

void CreateFile(const Args& a, Line& line) {
  int fd = open(a.at(0).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    line.Result(fd);
    return;
  }
  ssize_t n = write(fd, "airlock payload\n", 16);
  line.Result(n);
  close(fd);
}

void AppendFile(const Args& a, Line& line) {
  int fd = open(a.at(0).c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    line.Result(fd);
    return;
  }
  ssize_t n = write(fd, "pwned\n", 6);
  line.Result(n);
  close(fd);
}

// Appends up to MiB mebibytes to a file (made if missing), a MiB at a time: how much went in, and the
// error that stopped it (none if all of it did).
void FillFile(const Args& a, Line& line) {
  int fd = open(a.at(0).c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    line.Result(fd);
    return;
  }
  const long long mib = atoll(a.at(1).c_str());
  std::string chunk(1 << 20, 'x');
  long long written = 0;
  int err = 0;
  for (long long i = 0; i < mib && err == 0; ++i) {
    for (size_t off = 0; off < chunk.size();) {
      ssize_t n = write(fd, chunk.data() + off, chunk.size() - off);
      if (n <= 0) {
        err = n < 0 ? errno : ENOSPC;
        break;
      }
      off += static_cast<size_t>(n);
      written += n;
    }
  }
  close(fd);
  line.Int("ret", 0).Int("written", written);
  if (err) line.Str("write_errno", Line::ErrnoName(err));
}

void Mknod(const Args& a, Line& line) {
  // 8:0 is the first SCSI disk on the host.
  line.Result(mknod(a.at(0).c_str(), S_IFBLK | 0600, makedev(8, 0)));
}

void ListDirectory(const Args& a, Line& line) {
  DIR* d = opendir(a.at(0).c_str());
  line.Result(d ? 0 : -1);
  if (d) closedir(d);
  line.Raw("names", JsonList(ListDir(a.at(0))));
}

// Our own fds, with what each points at.
void OwnFds(const Args&, Line& line) {
  std::vector<std::string> fds;
  DIR* d = opendir("/proc/self/fd");
  const int skip = d ? dirfd(d) : -1;
  while (d && (true)) {
    dirent* e = readdir(d);
    if (e == nullptr) break;
    if (!IsNumber(e->d_name) || atoi(e->d_name) == skip || atoi(e->d_name) == g_report_fd) continue;
    int err = 0;
    fds.push_back(std::string(e->d_name) + "=" + ReadLink(std::string("/proc/self/fd/") + e->d_name, &err));
  }
  if (d) closedir(d);
  line.Raw("fds", JsonList(fds));
}

// Every process this sandbox's /proc shows: its comm, uid, and for its cwd, root and every fd:
// what readlink says, whether it opens, and where a ".." walk from a directory ends.
void Processes(const Args& a, Line& line) {
  const std::string canary = a.empty() ? "" : a[0];
  std::vector<std::string> procs, links;
  long long opened = 0, escaped = 0, canary_hits = 0, denied = 0;
  struct stat root {};
  stat("/", &root);
  // A child of its own in /tmp: a process every engine lets it look into (gVisor's procfs opens
  // another process's cwd and root only to its ancestors), for the positive control.
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) < 0) return;
  const pid_t child = fork();
  if (child == 0) {
    if (chdir("/tmp") == 0) (void)!write(ready[1], "r", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char r;
  const bool child_ready = child > 0 && read(ready[0], &r, 1) == 1;
  close(ready[0]);
  line.Int("child", child_ready ? child : -1);
  for (const std::string& pid : ListDir("/proc")) {
    if (!IsNumber(pid) || atoi(pid.c_str()) == getpid()) continue;
    const std::string base = "/proc/" + pid;
    int cfd = open((base + "/comm").c_str(), O_RDONLY | O_CLOEXEC);
    std::string comm = cfd >= 0 ? ReadAll(cfd) : "?";
    if (cfd >= 0) close(cfd);
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    procs.push_back(pid + ":" + comm);
    std::vector<std::string> targets = {base + "/cwd", base + "/root"};
    for (const std::string& fd : ListDir(base + "/fd")) targets.push_back(base + "/fd/" + fd);
    for (const std::string& t : targets) {
      int err = 0;
      std::string target = ReadLink(t, &err);
      links.push_back(t.substr(6) + "=" + (err ? Line::ErrnoName(err) : target));
      // O_DIRECTORY: a link to a file or device fails before anything is opened.
      int fd = open(t.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) {
        denied += errno == EACCES || errno == EPERM;
        continue;
      }
      ++opened;
      Line walk;
      Walk(fd, canary, walk, "w");
      std::string text = walk.Text();
      if (text.find("\"w_top_is_own_root\":false") != std::string::npos) ++escaped;
      if (text.find("\"w_canary_opened\":true") != std::string::npos) ++canary_hits;
      close(fd);
    }
  }
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  line.Raw("procs", JsonList(procs))
      .Raw("links", JsonList(links))
      .Int("opened", opened)
      .Int("denied", denied)
      .Int("escaped", escaped)
      .Int("canary_hits", canary_hits);
}

void CwdWalk(const Args& a, Line& line) {
  int fd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  line.Result(fd);
  if (fd < 0) return;
  Walk(fd, a.empty() ? "" : a[0], line, "cwd");
  close(fd);
}

// Tries, for `seconds`, to open every process's /proc/<pid>/exe for writing (and the agent's,
// pid 1, for reading), while the host runs commands in this sandbox: CVE-2019-5736.
void ExeRace(const Args& a, Line& line) {
  const double seconds = a.empty() ? 1.0 : atof(a[0].c_str());
  timespec start {};
  clock_gettime(CLOCK_MONOTONIC, &start);
  long long tries = 0, write_opens = 0, agent_reads = 0, pids_seen = 0;
  std::map<std::string, long long> errs;
  for (;;) {
    timespec now {};
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds) break;
    for (const std::string& pid : ListDir("/proc")) {
      if (!IsNumber(pid) || atoi(pid.c_str()) == getpid()) continue;
      ++pids_seen;
      const std::string exe = "/proc/" + pid + "/exe";
      for (int flags : {O_WRONLY, O_RDWR}) {
        ++tries;
        int fd = open(exe.c_str(), flags | O_CLOEXEC);
        if (fd >= 0) {
          ++write_opens;
          close(fd);
        } else {
          ++errs[Line::ErrnoName(errno)];
        }
      }
      if (pid == "1") {
        int fd = open(exe.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
          ++agent_reads;
          close(fd);
        }
      }
    }
  }
  std::string e = "{";
  for (const auto& [name, n] : errs) e += (e.size() > 1 ? "," : "") + Quote(name) + ":" + std::to_string(n);
  line.Int("tries", tries)
      .Int("pids_seen", pids_seen)
      .Int("write_opens", write_opens)
      .Int("agent_reads", agent_reads)
      .Raw("errnos", e + "}");
}

void SelfExe(const Args&, Line& line) {
  int fd = open("/proc/self/exe", O_WRONLY | O_CLOEXEC);
  line.Result(fd);
  if (fd >= 0) close(fd);
}

void Syscall(const Args& a, Line& line) {
  auto it = SyscallTable().find(a.at(0));
  if (it == SyscallTable().end()) {
    line.Str("error", "no such syscall in the table");
    return;
  }
  errno = 0;
  long r = it->second();
  line.Result(r);
}

// Raw clone with FLAGS (hex): a child that exits at once.
void Clone(const Args& a, Line& line) {
  long r = Sys(SYS_clone, static_cast<long>(Number(a.at(0)) | SIGCHLD), 0, 0, 0, 0);
  if (r == 0) _exit(0);
  line.Result(r);
  if (r > 0) waitpid(static_cast<pid_t>(r), nullptr, 0);
}

// socket(FAMILY, TYPE, PROTOCOL), each number as given (64 bits: high bits reach the filter).
void Socket(const Args& a, Line& line) {
  long r = Sys(SYS_socket, static_cast<long>(Number(a.at(0))), static_cast<long>(Number(a.at(1))),
               static_cast<long>(Number(a.at(2))));
  line.Result(r);
}

// A TCP connect to ADDR:PORT (IPv4), with a 2 s limit.
void Connect(const Args& a, Line& line) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(Number(a.at(1))));
  inet_pton(AF_INET, a.at(0).c_str(), &sa.sin_addr);
  int r = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  int err = errno;
  if (r < 0 && err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 2000);
    socklen_t len = sizeof err;
    err = 0;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    r = err == 0 ? 0 : -1;
  }
  line.Result(r, err);
  close(fd);
}

// The positive control of Connect: a listener on 127.0.0.1 and a connect to it.
void ConnectLoopback(const Args&, Line& line) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  listen(l, 1);
  getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len);
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int r = connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  line.Result(r);
  close(c);
  close(l);
}

// ioctl(0, REQUEST, &byte): REQUEST as given, 64 bits; the byte is what TIOCSTI would push, or
// TIOCLINUX's subcode 3 (paste the selection).
void Ioctl(const Args& a, Line& line) {
  char byte = a.size() > 1 ? static_cast<char>(Number(a[1])) : 'Q';
  long r = Sys(SYS_ioctl, 0, static_cast<long>(Number(a.at(0))), (long)&byte);
  line.Result(r);
}

// What stdin (a terminal, on a pty exec) holds unread: injected input would be there.
void Pending(const Args&, Line& line) {
  int n = -1;
  int r = ioctl(0, FIONREAD, &n);
  line.Result(r, errno).Int("pending", n).Bool("isatty", isatty(0));
  winsize ws {};
  if (ioctl(0, TIOCGWINSZ, &ws) == 0) line.Int("cols", ws.ws_col).Int("rows", ws.ws_row);
}

void Kill(const Args& a, Line& line) {
  line.Result(kill(static_cast<pid_t>(atol(a.at(0).c_str())), atoi(a.at(1).c_str())));
}

void PidfdOpen(const Args& a, Line& line) {
  line.Result(Sys(SYS_pidfd_open, atol(a.at(0).c_str()), 0));
}

void PtraceAttach(const Args& a, Line& line) {
  line.Result(Sys(SYS_ptrace, PTRACE_ATTACH, atol(a.at(0).c_str()), 0, 0));
}

// mount(SOURCE, TARGET, TYPE, 0, DATA) on a directory of our own.
void Mount(const Args& a, Line& line) {
  mkdir(a.at(1).c_str(), 0755);
  line.Result(mount(a.at(0).c_str(), a.at(1).c_str(), a.at(2).c_str(), 0,
                    a.size() > 3 ? a[3].c_str() : nullptr));
}

// Wrong architecture: the i386 getpid through int 0x80. Seccomp kills the process.
void I386(const Args&, Line& line) {
  long r = 20;  // __NR_getpid on i386
  asm volatile("int $0x80" : "+a"(r) : : "memory");
  line.Int("ret", r);
}

// x32: getpid with the x32 bit set. Seccomp kills the process.
void X32(const Args&, Line& line) { line.Result(Sys(0x40000000 | SYS_getpid)); }

// The ids this process runs as, from inside.
void Ids(const Args&, Line& line) {
  int err = 0;
  line.Int("uid", getuid()).Int("euid", geteuid()).Int("pid", getpid());
  for (const char* ns : {"user", "pid", "mnt", "net"}) {
    line.Str((std::string("ns_") + ns).c_str(), ReadLink(std::string("/proc/self/ns/") + ns, &err));
  }
  int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
  line.Str("uid_map", fd >= 0 ? ReadAll(fd) : "");
  if (fd >= 0) close(fd);
}

const std::map<std::string, void (*)(const Args&, Line&)>& Attempts() {
  static const auto* table = new std::map<std::string, void (*)(const Args&, Line&)>{
      {"read", ReadFile},          {"openw", OpenWrite},   {"create", CreateFile},
      {"append", AppendFile},      {"mknod", Mknod},       {"list", ListDirectory},
      {"fds", OwnFds},             {"procs", Processes},   {"cwdwalk", CwdWalk},
      {"exerace", ExeRace},        {"selfexe", SelfExe},   {"sys", Syscall},
      {"clone", Clone},            {"socket", Socket},     {"connect", Connect},
      {"connectlo", ConnectLoopback}, {"ioctl", Ioctl},    {"pending", Pending},
      {"kill", Kill},              {"pidfd", PidfdOpen},   {"ptrace", PtraceAttach},
      {"mount", Mount},            {"i386", I386},         {"x32", X32},
      {"ids", Ids},                {"fill", FillFile},
  };
  return *table;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSYS: return "SIGSYS";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    default: return "other";
  }
}

// Runs one attempt in a child; its line comes back over a pipe.
std::string RunOne(const std::string& spec) {
  Args parts;
  size_t start = 0;
  for (;;) {
    size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const std::string name = parts[0];
  parts.erase(parts.begin());
  auto it = Attempts().find(name);
  Line head;
  head.Str("attempt", spec);
  if (it == Attempts().end()) return head.Str("error", "unknown attempt").Text();
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return head.Str("error", "pipe").Text();
  pid_t child = fork();
  if (child == 0) {
    close(p[0]);
    g_report_fd = p[1];
    Line line;
    line.Str("attempt", spec);
    it->second(parts, line);
    std::string text = line.Text();
    (void)!write(p[1], text.data(), text.size());
    _exit(0);
  }
  close(p[1]);
  std::string text = ReadAll(p[0]);
  close(p[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFSIGNALED(status)) return head.Str("signal", SignalName(WTERMSIG(status))).Text();
  return text.empty() ? head.Str("error", "no output").Text() : text;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string out = RunOne(argv[i]) + "\n";
    (void)!write(STDOUT_FILENO, out.data(), out.size());
  }
  return 0;
}
