// The jail's seccomp policy, tried for real. Each test forks a child that sets NO_NEW_PRIVS,
// installs the compiled filter, tries one thing and reports the result (return value and
// errno) through a pipe, or dies of the signal the filter sends. Where it helps to show that a
// deny comes from the filter, the same probe also runs in a child without the filter (a
// control): those probes are chosen to be harmless even then, though the tests run as root.
//
// Children leave through _exit (no atexit handlers, no LeakSanitizer, which would need ptrace)
// and start a new session, so that nothing they try reaches the test runner's terminal.

#include "runtime/seccomp_policy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <linux/capability.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/netlink.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace airlock::runtime {

// For gtest's messages about table parameters.
void PrintTo(const SeccompRule& rule, std::ostream* os) {
  *os << rule.syscall << " -> "
      << (rule.action == SeccompAction::kErrno ? ErrnoName(rule.err) : "kill");
}

namespace {

// ---- Running a probe in a child ---------------------------------------------------------------

// What a probe reports. For one call: its return value and errno. For a sweep: `ret` counts
// the mismatches, `detail` is the first mismatching input and `err` what it got.
struct Report {
  long ret = 0;
  int err = 0;
  uint64_t detail = 0;
};

Report Sys(long ret) { return {ret, ret < 0 ? errno : 0, 0}; }

// How a child ended.
struct Outcome {
  bool reported = false;  // the probe returned and its Report arrived
  Report report;
  int signal = 0;        // the signal that killed the child, or 0
  int exit_status = -1;  // when it exited
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  if (o.reported) {
    os << "returned " << o.report.ret;
    if (o.report.ret < 0) os << " errno " << ErrnoName(o.report.err);
    if (o.report.detail) os << " detail 0x" << std::hex << o.report.detail << std::dec;
  } else if (o.signal) {
    os << "killed by signal " << o.signal << " (" << strsignal(o.signal) << ")";
  } else {
    os << "exited with status " << o.exit_status << " without reporting";
  }
  return os;
}

// Child exit statuses for failures before the probe ran.
constexpr int kNoNewPrivsFailed = 120;
constexpr int kInstallFailed = 121;

enum class Filter { kOn, kOff };

const Result<SeccompProgram>& Program() {
  static const Result<SeccompProgram> program = SeccompProgram::Compile();
  return program;
}

template <typename Probe>
Outcome RunChild(Filter filter, Probe probe) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << ErrnoName(errno);
    return {};
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << ErrnoName(errno);
    return {};
  }
  if (pid == 0) {
    ::close(fds[0]);
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // SIGSYS dumps core by default
    ::setsid();
    if (filter == Filter::kOn) {
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(kNoNewPrivsFailed);
      if (InstallSeccomp(Program()->prog()) != 0) _exit(kInstallFailed);
    }
    Report r = probe();
    (void)!::write(fds[1], &r, sizeof r);
    _exit(0);
  }
  ::close(fds[1]);
  Outcome out;
  Report r;
  ssize_t n;
  do {
    n = ::read(fds[0], &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  ::close(fds[0]);
  if (n == static_cast<ssize_t>(sizeof r)) {
    out.reported = true;
    out.report = r;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  if (WIFEXITED(status)) out.exit_status = WEXITSTATUS(status);
  return out;
}

class SeccompTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Program()) << Program().error().message(); }

  // The call fails with `err` under the filter. The control (no filter) must not fail the same
  // way, or the test could not tell the filter's answer from the kernel's: then it skips.
  template <typename Probe>
  void ExpectDenied(Probe probe, int err) {
    Outcome filtered = RunChild(Filter::kOn, probe);
    ASSERT_TRUE(filtered.reported) << filtered;
    EXPECT_EQ(filtered.report.ret, -1) << filtered;
    EXPECT_EQ(ErrnoName(filtered.report.err), ErrnoName(err)) << filtered;
    Outcome control = RunChild(Filter::kOff, probe);
    ASSERT_TRUE(control.reported) << "control: " << control;
    if (!HasFailure() && control.report.ret == -1 && control.report.err == err) {
      GTEST_SKIP() << "inconclusive: without the filter the kernel also answers " << ErrnoName(err)
                   << " here";
    }
  }

  // The call succeeds under the filter.
  template <typename Probe>
  void ExpectAllowed(Probe probe) {
    Outcome filtered = RunChild(Filter::kOn, probe);
    ASSERT_TRUE(filtered.reported) << filtered;
    EXPECT_GE(filtered.report.ret, 0) << filtered;
  }

  // The filter kills the process with SIGSYS; without it, the process lives.
  template <typename Probe>
  void ExpectKilled(Probe probe) {
    Outcome filtered = RunChild(Filter::kOn, probe);
    EXPECT_EQ(filtered.signal, SIGSYS) << filtered;
    Outcome control = RunChild(Filter::kOff, probe);
    EXPECT_TRUE(control.reported) << "control: " << control;
  }
};

// ---- The program object -----------------------------------------------------------------------

TEST_F(SeccompTest, CompilesToAProgramThatPointsAtItsInstructions) {
  const SeccompProgram& p = *Program();
  EXPECT_GT(p.instructions(), 10u);
  EXPECT_LE(p.instructions(), static_cast<size_t>(BPF_MAXINSNS));
  EXPECT_EQ(p.prog()->len, p.instructions());
  ASSERT_NE(p.prog()->filter, nullptr);
  // libseccomp's program starts by loading the architecture: seccomp_data.arch at offset 4.
  EXPECT_EQ(p.prog()->filter[0].code, BPF_LD | BPF_W | BPF_ABS);
  EXPECT_EQ(p.prog()->filter[0].k, 4u);
  RecordProperty("instructions", static_cast<int>(p.instructions()));
}

TEST_F(SeccompTest, MoveRepointsTheProgramAtTheNewVector) {
  auto compiled = SeccompProgram::Compile();
  ASSERT_TRUE(compiled) << compiled.error().message();
  const std::vector<sock_filter> before(compiled->prog()->filter,
                                        compiled->prog()->filter + compiled->prog()->len);
  SeccompProgram moved(std::move(*compiled));
  EXPECT_EQ(compiled->prog()->len, 0u);
  EXPECT_EQ(compiled->instructions(), 0u);
  ASSERT_EQ(moved.prog()->len, before.size());
  ASSERT_EQ(moved.instructions(), before.size());
  ASSERT_NE(moved.prog()->filter, nullptr);
  for (size_t i = 0; i < before.size(); ++i) {
    const sock_filter& a = before[i];
    const sock_filter& b = moved.prog()->filter[i];
    ASSERT_TRUE(a.code == b.code && a.jt == b.jt && a.jf == b.jf && a.k == b.k) << "at " << i;
  }
  // The moved program installs and works; the emptied one is refused by the kernel.
  Outcome o = RunChild(Filter::kOff, [&] {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Sys(-1);
    int empty = InstallSeccomp(compiled->prog());
    if (empty != EINVAL) return Report{-2, empty, 0};
    int err = InstallSeccomp(moved.prog());
    if (err != 0) return Report{-3, err, 0};
    return Sys(::mount("none", "/nonexistent-airlock-seccomp", "tmpfs", 0, nullptr));
  });
  ASSERT_TRUE(o.reported) << o;
  EXPECT_EQ(o.report.ret, -1) << o;
  EXPECT_EQ(ErrnoName(o.report.err), "EPERM") << o;
}

TEST_F(SeccompTest, InstallReturnsTheErrno) {
  Outcome o = RunChild(Filter::kOff, [] { return Report{0, InstallSeccomp(nullptr), 0}; });
  ASSERT_TRUE(o.reported) << o;
  EXPECT_EQ(ErrnoName(o.report.err), "EFAULT");
}

// ---- The table ----------------------------------------------------------------------------------

// shared/SECURITY.md's lists, to hold the table to them.
const std::set<std::string_view> kSpecEperm = {"unshare",
                                               "setns",
                                               "mount",
                                               "umount2",
                                               "pivot_root",
                                               "chroot",
                                               "reboot",
                                               "kexec_load",
                                               "kexec_file_load",
                                               "init_module",
                                               "finit_module",
                                               "delete_module",
                                               "swapon",
                                               "swapoff",
                                               "acct",
                                               "quotactl",
                                               "syslog",
                                               "settimeofday",
                                               "clock_settime",
                                               "sethostname",
                                               "setdomainname",
                                               "vhangup",
                                               "iopl",
                                               "ioperm",
                                               "modify_ldt",
                                               "uselib",
                                               "ustat",
                                               "sysfs",
                                               "_sysctl",
                                               "lookup_dcookie",
                                               "ptrace",
                                               "process_vm_readv",
                                               "process_vm_writev",
                                               "kcmp",
                                               "pidfd_getfd",
                                               "process_madvise",
                                               "bpf",
                                               "perf_event_open",
                                               "userfaultfd",
                                               "add_key",
                                               "keyctl",
                                               "request_key",
                                               "fanotify_init",
                                               "open_by_handle_at",
                                               "name_to_handle_at",
                                               "mbind",
                                               "set_mempolicy",
                                               "migrate_pages",
                                               "move_pages"};
const std::set<std::string_view> kSpecEnosys = {
    "clone3", "open_tree",     "move_mount",     "fsopen",         "fsconfig",         "fsmount",
    "fspick", "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register"};
// Beyond the spec's list: newer variants of listed calls (docs/design/seccomp.md).
const std::set<std::string_view> kExtraEperm = {"quotactl_fd", "set_mempolicy_home_node"};

TEST(SeccompRulesTest, TableHoldsTheSpecAndEachRuleHasAReason) {
  std::set<std::string_view> seen;
  for (const SeccompRule& rule : SeccompRules()) {
    SCOPED_TRACE(std::string(rule.syscall));
    EXPECT_TRUE(seen.insert(rule.syscall).second) << "listed twice";
    EXPECT_FALSE(rule.reason.empty());
    EXPECT_EQ(rule.reason.find('\n'), std::string_view::npos) << "a reason is one line";
    EXPECT_EQ(rule.action, SeccompAction::kErrno);
    if (kSpecEnosys.contains(rule.syscall)) {
      EXPECT_EQ(rule.err, ENOSYS);
    } else if (kSpecEperm.contains(rule.syscall) || kExtraEperm.contains(rule.syscall)) {
      EXPECT_EQ(rule.err, EPERM);
    } else {
      ADD_FAILURE() << "not in SECURITY.md: add it there (or to kExtraEperm) first";
    }
  }
  for (const auto* spec : {&kSpecEperm, &kSpecEnosys, &kExtraEperm}) {
    for (std::string_view name : *spec) EXPECT_TRUE(seen.contains(name)) << name << " missing";
  }
}

// The test's own syscall numbers (from glibc's headers, not from libseccomp), and arguments
// that make each call fail harmlessly if a rule ever stopped matching: -1 is a bad fd, a
// kernel-space pointer and every flag bit at once (never NULL, which often means "reset").
struct Probe {
  long nr;
  long args[6] = {-1, -1, -1, -1, -1, -1};
};
#define AIRLOCK_NR(name)        \
  {                             \
#name, Probe { SYS_##name } \
  }
const std::map<std::string_view, Probe> kProbes = {
    AIRLOCK_NR(unshare),
    AIRLOCK_NR(setns),
    AIRLOCK_NR(mount),
    AIRLOCK_NR(umount2),
    AIRLOCK_NR(pivot_root),
    AIRLOCK_NR(chroot),
    AIRLOCK_NR(reboot),
    AIRLOCK_NR(kexec_load),
    AIRLOCK_NR(kexec_file_load),
    // A length of 0 fails fast (ENOEXEC) instead of asking vmalloc for 2^64 bytes.
    {"init_module", Probe{SYS_init_module, {-1, 0, -1, -1, -1, -1}}},
    AIRLOCK_NR(finit_module),
    AIRLOCK_NR(delete_module),
    AIRLOCK_NR(swapon),
    AIRLOCK_NR(swapoff),
    AIRLOCK_NR(acct),
    AIRLOCK_NR(quotactl),
    AIRLOCK_NR(quotactl_fd),
    AIRLOCK_NR(syslog),
    AIRLOCK_NR(settimeofday),
    AIRLOCK_NR(clock_settime),
    AIRLOCK_NR(sethostname),
    AIRLOCK_NR(setdomainname),
    AIRLOCK_NR(vhangup),
    AIRLOCK_NR(iopl),
    AIRLOCK_NR(ioperm),
    AIRLOCK_NR(modify_ldt),
    AIRLOCK_NR(uselib),
    AIRLOCK_NR(ustat),
    AIRLOCK_NR(sysfs),
    AIRLOCK_NR(_sysctl),
    AIRLOCK_NR(lookup_dcookie),
    AIRLOCK_NR(ptrace),
    AIRLOCK_NR(process_vm_readv),
    AIRLOCK_NR(process_vm_writev),
    AIRLOCK_NR(kcmp),
    AIRLOCK_NR(pidfd_getfd),
    AIRLOCK_NR(process_madvise),
    AIRLOCK_NR(bpf),
    AIRLOCK_NR(perf_event_open),
    AIRLOCK_NR(userfaultfd),
    AIRLOCK_NR(add_key),
    AIRLOCK_NR(keyctl),
    AIRLOCK_NR(request_key),
    AIRLOCK_NR(fanotify_init),
    AIRLOCK_NR(open_by_handle_at),
    AIRLOCK_NR(name_to_handle_at),
    AIRLOCK_NR(mbind),
    AIRLOCK_NR(set_mempolicy),
    AIRLOCK_NR(set_mempolicy_home_node),
    AIRLOCK_NR(migrate_pages),
    AIRLOCK_NR(move_pages),
    AIRLOCK_NR(clone3),
    AIRLOCK_NR(open_tree),
    AIRLOCK_NR(move_mount),
    AIRLOCK_NR(fsopen),
    AIRLOCK_NR(fsconfig),
    AIRLOCK_NR(fsmount),
    AIRLOCK_NR(fspick),
    AIRLOCK_NR(mount_setattr),
    AIRLOCK_NR(io_uring_setup),
    AIRLOCK_NR(io_uring_enter),
    AIRLOCK_NR(io_uring_register),
};
#undef AIRLOCK_NR

class SeccompTableTest : public SeccompTest, public ::testing::WithParamInterface<SeccompRule> {};

TEST_P(SeccompTableTest, DeniesWithItsResult) {
  const SeccompRule& rule = GetParam();
  auto it = kProbes.find(rule.syscall);
  ASSERT_NE(it, kProbes.end()) << "add " << rule.syscall << " to kProbes";
  const Probe p = it->second;
  auto call = [p] {
    return Sys(::syscall(p.nr, p.args[0], p.args[1], p.args[2], p.args[3], p.args[4], p.args[5]));
  };
  if (rule.action == SeccompAction::kKillProcess) {
    ExpectKilled(call);
  } else {
    ExpectDenied(call, rule.err);
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, SeccompTableTest, ::testing::ValuesIn(SeccompRules()),
                         [](const ::testing::TestParamInfo<SeccompRule>& param) {
                           return std::string(param.param.syscall);
                         });

// ---- Architectures ------------------------------------------------------------------------------

constexpr long kX32SyscallBit = 0x40000000;

TEST_F(SeccompTest, X32SyscallNumberKills) {
  ExpectKilled([] { return Sys(::syscall(kX32SyscallBit | SYS_getpid)); });
}

TEST_F(SeccompTest, X32NumberOfADeniedCallKills) {
  // x32's own number space (512 and up) and the x86_64 numbers both carry the bit.
  ExpectKilled([] { return Sys(::syscall(kX32SyscallBit | SYS_mount, -1, -1, -1, -1, -1)); });
}

TEST_F(SeccompTest, X32CallFromAThreadKillsTheWholeProcess) {
  // KILL_PROCESS, not KILL_THREAD: a thread's bad call must not leave the rest running.
  Outcome filtered = RunChild(Filter::kOn, [] {
    pthread_t thread;
    int err = ::pthread_create(
        &thread, nullptr,
        [](void*) -> void* {
          ::syscall(kX32SyscallBit | SYS_getpid);
          return nullptr;
        },
        nullptr);
    if (err != 0) return Report{-1, err, 0};
    ::pthread_join(thread, nullptr);  // with KILL_THREAD this returns and the child reports
    return Report{};
  });
  EXPECT_EQ(filtered.signal, SIGSYS) << filtered;
}

// getpid through the i386 ABI (int $0x80, i386 number 20): another architecture to seccomp.
long Int80Getpid() {
  long ret;
  asm volatile("int $0x80"
               : "=a"(ret)
               : "a"(20L)
               : "memory", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15");
  return ret;
}

TEST_F(SeccompTest, I386SyscallKills) {
  // A kernel without the i386 entry (ia32_emulation off) answers int $0x80 with SIGSEGV; the
  // default action, not a sanitizer's handler, so that the child dies of it.
  auto getpid_int80 = [] {
    ::signal(SIGSEGV, SIG_DFL);
    return Report{Int80Getpid(), 0, 0};
  };
  Outcome control = RunChild(Filter::kOff, getpid_int80);
  if (control.signal == SIGSEGV) GTEST_SKIP() << "this kernel has no i386 syscall entry";
  ASSERT_TRUE(control.reported) << "control: " << control;
  Outcome filtered = RunChild(Filter::kOn, getpid_int80);
  EXPECT_EQ(filtered.signal, SIGSYS) << filtered;
}

// ---- clone and namespaces
// -------------------------------------------------------------------------

TEST_F(SeccompTest, ForkWorks) {
  ExpectAllowed([] {
    pid_t pid = ::fork();
    if (pid == 0) _exit(7);
    if (pid < 0) return Sys(-1);
    int status;
    if (::waitpid(pid, &status, 0) != pid) return Sys(-1);
    return Report{WIFEXITED(status) && WEXITSTATUS(status) == 7 ? 0 : -1, 0, 0};
  });
}

TEST_F(SeccompTest, VforkWorks) {
  ExpectAllowed([] {
    pid_t pid = ::vfork();
    if (pid == 0) _exit(7);
    if (pid < 0) return Sys(-1);
    int status;
    if (::waitpid(pid, &status, 0) != pid) return Sys(-1);
    return Report{WIFEXITED(status) && WEXITSTATUS(status) == 7 ? 0 : -1, 0, 0};
  });
}

TEST_F(SeccompTest, PthreadCreateWorks) {
  // glibc tries clone3 first and, on ENOSYS, clone without namespace flags.
  ExpectAllowed([] {
    pthread_t thread;
    static int ran;
    int err = ::pthread_create(
        &thread, nullptr,
        [](void*) -> void* {
          ran = 42;
          return nullptr;
        },
        nullptr);
    if (err != 0) return Report{-1, err, 0};
    err = ::pthread_join(thread, nullptr);
    if (err != 0) return Report{-1, err, 0};
    return Report{ran == 42 ? 0 : -1, 0, 0};
  });
}

int ExitSeven(void*) { _exit(7); }

TEST_F(SeccompTest, AgentStyleSpawnWorks) {
  // airlock-agent spawns commands with clone(CLONE_VM | CLONE_VFORK | SIGCHLD).
  ExpectAllowed([] {
    alignas(16) static char stack[64 * 1024];
    pid_t pid = ::clone(ExitSeven, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, nullptr);
    if (pid < 0) return Sys(-1);
    int status;
    if (::waitpid(pid, &status, 0) != pid) return Sys(-1);
    return Report{WIFEXITED(status) && WEXITSTATUS(status) == 7 ? 0 : -1, 0, 0};
  });
}

TEST_F(SeccompTest, Clone3IsEnosysSoLibcFallsBack) {
  ExpectDenied(
      [] {
        clone_args args{};
        args.exit_signal = SIGCHLD;
        long pid = ::syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0) _exit(0);
        Report r = Sys(pid);
        if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
        return r;
      },
      ENOSYS);
}

TEST_F(SeccompTest, UnshareNewUserIsEperm) {
  ExpectDenied([] { return Sys(::unshare(CLONE_NEWUSER)); }, EPERM);
}

// clone(flags | SIGCHLD) by raw syscall; a child that does get made exits at once.
Report RawClone(uint64_t flags) {
  long pid = ::syscall(SYS_clone, flags, 0L, nullptr, nullptr, 0L);
  if (pid == 0) _exit(0);
  Report r = Sys(pid);
  if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
  return r;
}

TEST_F(SeccompTest, PlainRawCloneWorks) {
  ExpectAllowed([] { return RawClone(SIGCHLD); });
}

class SeccompCloneFlagTest : public SeccompTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(SeccompCloneFlagTest, CloneWithNamespaceFlagIsEperm) {
  const uint64_t flag = GetParam();
  ExpectDenied([flag] { return RawClone(flag | SIGCHLD); }, EPERM);
}

TEST_P(SeccompCloneFlagTest, HighBitsDoNotHideTheFlag) {
  // The kernel reads the low 32 bits of clone's flags; so must the rule.
  const uint64_t flag = GetParam();
  ExpectDenied([flag] { return RawClone(0xffffffff00000000ull | flag | SIGCHLD); }, EPERM);
}

INSTANTIATE_TEST_SUITE_P(Flags, SeccompCloneFlagTest,
                         ::testing::Values(CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
                                           CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
                                           CLONE_NEWTIME),
                         [](const ::testing::TestParamInfo<uint64_t>& param) {
                           switch (param.param) {
                             case CLONE_NEWNS:
                               return std::string("NEWNS");
                             case CLONE_NEWCGROUP:
                               return std::string("NEWCGROUP");
                             case CLONE_NEWUTS:
                               return std::string("NEWUTS");
                             case CLONE_NEWIPC:
                               return std::string("NEWIPC");
                             case CLONE_NEWUSER:
                               return std::string("NEWUSER");
                             case CLONE_NEWPID:
                               return std::string("NEWPID");
                             case CLONE_NEWNET:
                               return std::string("NEWNET");
                             default:
                               return std::string("NEWTIME");
                           }
                         });

// ---- socket
// ----------------------------------------------------------------------------------------

Report Socket(uint64_t family, uint64_t type, uint64_t protocol) {
  return Sys(::syscall(SYS_socket, family, type, protocol));
}

TEST_F(SeccompTest, InetStreamWorks) {
  ExpectAllowed([] { return Socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); });
}

TEST_F(SeccompTest, Inet6DatagramWorks) {
  ExpectAllowed([] { return Socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK, 0); });
}

TEST_F(SeccompTest, UnixWorks) {
  ExpectAllowed([] { return Socket(AF_UNIX, SOCK_STREAM, 0); });
  ExpectAllowed([] {
    int sv[2];
    return Sys(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  });
}

TEST_F(SeccompTest, NetlinkRouteWorks) {
  ExpectAllowed([] { return Socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE); });
  ExpectAllowed([] { return Socket(AF_NETLINK, SOCK_DGRAM, NETLINK_ROUTE); });
}

TEST_F(SeccompTest, OtherNetlinkProtocolsAreEprotonosupport) {
  for (int protocol : {NETLINK_AUDIT, NETLINK_KOBJECT_UEVENT, NETLINK_SOCK_DIAG, NETLINK_NETFILTER,
                       NETLINK_XFRM, NETLINK_GENERIC}) {
    SCOPED_TRACE(protocol);
    ExpectDenied([protocol] { return Socket(AF_NETLINK, SOCK_RAW, protocol); }, EPROTONOSUPPORT);
  }
}

TEST_F(SeccompTest, NetlinkRouteWithHighBitsIsDenied) {
  // The kernel would read NETLINK_ROUTE; the rule compares all 64 bits and refuses.
  ExpectDenied([] { return Socket(AF_NETLINK, SOCK_RAW, 0x100000000ull | NETLINK_ROUTE); },
               EPROTONOSUPPORT);
}

TEST_F(SeccompTest, PacketSocketIsEafnosupport) {
  ExpectDenied([] { return Socket(AF_PACKET, SOCK_RAW, 0); }, EAFNOSUPPORT);
}

TEST_F(SeccompTest, PacketSocketWithHighBitsIsEafnosupport) {
  ExpectDenied([] { return Socket(0xffffffff00000000ull | AF_PACKET, SOCK_RAW, 0); }, EAFNOSUPPORT);
}

TEST_F(SeccompTest, SocketpairFollowsTheFamilyRule) {
  // socketpair creates its sockets the way socket does (module autoloading included). Without
  // the filter these get as far as EOPNOTSUPP.
  ExpectDenied(
      [] {
        int sv[2];
        return Sys(::socketpair(AF_PACKET, SOCK_RAW, 0, sv));
      },
      EAFNOSUPPORT);
  ExpectDenied(
      [] {
        int sv[2];
        return Sys(::socketpair(AF_INET, SOCK_PACKET, 0, sv));
      },
      EPERM);
}

TEST_F(SeccompTest, InetRawIsEperm) {
  ExpectDenied([] { return Socket(AF_INET, SOCK_RAW, IPPROTO_ICMP); }, EPERM);
  ExpectDenied([] { return Socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 58); }, EPERM);
}

TEST_F(SeccompTest, InetPacketIsEperm) {
  // (AF_INET, SOCK_PACKET) is the kernel's legacy spelling of a packet socket.
  ExpectDenied([] { return Socket(AF_INET, SOCK_PACKET, htons(0x0003)); }, EPERM);
  ExpectDenied([] { return Socket(AF_INET6, SOCK_PACKET | SOCK_CLOEXEC, 0); }, EPERM);
}

TEST_F(SeccompTest, UnprivilegedPingSocketIsNotTheFiltersBusiness) {
  // ICMP datagram sockets are governed by net.ipv4.ping_group_range, not by the filter.
  Outcome filtered =
      RunChild(Filter::kOn, [] { return Socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP); });
  Outcome control =
      RunChild(Filter::kOff, [] { return Socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP); });
  ASSERT_TRUE(filtered.reported && control.reported) << filtered << " / " << control;
  EXPECT_EQ(filtered.report.ret < 0, control.report.ret < 0) << filtered << " / " << control;
  EXPECT_EQ(filtered.report.err, control.report.err) << filtered << " / " << control;
}

TEST_F(SeccompTest, OnlyTheListedFamiliesPass) {
  Outcome o = RunChild(Filter::kOn, [] {
    Report r;
    std::vector<uint64_t> families;
    for (uint64_t f = 0; f < 128; ++f) families.push_back(f);
    for (uint64_t f : {0x7fffffffull, 0xffffffffull, 0x100000001ull, 0x100000002ull, 0x10000000aull,
                       0x100000010ull, 0xffffffffffffffffull}) {
      families.push_back(f);
    }
    for (uint64_t f : families) {
      const bool allowed = f == AF_UNIX || f == AF_INET || f == AF_INET6 || f == AF_NETLINK;
      long fd = ::syscall(SYS_socket, f, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      const int err = errno;
      if (fd >= 0) ::close(static_cast<int>(fd));
      if (allowed ? fd < 0 : (fd >= 0 || err != EAFNOSUPPORT)) {
        if (r.ret++ == 0) {
          r.detail = f;
          r.err = fd < 0 ? err : 0;
        }
      }
    }
    return r;
  });
  ASSERT_TRUE(o.reported) << o;
  EXPECT_EQ(o.report.ret, 0) << "families answered wrongly, first 0x" << std::hex << o.report.detail
                             << std::dec << " with " << ErrnoName(o.report.err);
}

// ---- ioctl
// -------------------------------------------------------------------------------------------

// A pty whose slave is the calling process's controlling terminal (RunChild made it a session
// leader), in raw mode so that FIONREAD counts every byte of input. Returns the slave, or -1.
int OpenControllingPty(int* master_out) {
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return -1;
  const char* name = ::ptsname(master);
  if (!name) return -1;
  int slave = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0 || ::ioctl(slave, TIOCSCTTY, 0) != 0) return -1;
  termios t;
  if (::tcgetattr(slave, &t) != 0) return -1;
  ::cfmakeraw(&t);
  if (::tcsetattr(slave, TCSANOW, &t) != 0) return -1;
  *master_out = master;
  return slave;
}

// TIOCSTI `request` on our own terminal; detail = the bytes of input it managed to push.
Report TryTiocsti(unsigned long request) {
  int master;
  int slave = OpenControllingPty(&master);
  if (slave < 0) return {-2, errno, 0};
  const char c = 'x';
  Report r = Sys(::syscall(SYS_ioctl, slave, request, &c));
  int pending = 0;
  if (::ioctl(slave, FIONREAD, &pending) != 0) return {-3, errno, 0};
  r.detail = static_cast<uint64_t>(pending);
  return r;
}

TEST_F(SeccompTest, TiocstiIsEpermAndPushesNothing) {
  Outcome filtered = RunChild(Filter::kOn, [] { return TryTiocsti(TIOCSTI); });
  ASSERT_TRUE(filtered.reported) << filtered;
  EXPECT_EQ(filtered.report.ret, -1) << filtered;
  EXPECT_EQ(ErrnoName(filtered.report.err), "EPERM") << filtered;
  EXPECT_EQ(filtered.report.detail, 0u) << "bytes pushed into the terminal";
}

TEST_F(SeccompTest, TiocstiWithHighBitsIsEpermAndPushesNothing) {
  Outcome filtered = RunChild(Filter::kOn, [] { return TryTiocsti(0xffffffff00005412ul); });
  ASSERT_TRUE(filtered.reported) << filtered;
  EXPECT_EQ(filtered.report.ret, -1) << filtered;
  EXPECT_EQ(ErrnoName(filtered.report.err), "EPERM") << filtered;
  EXPECT_EQ(filtered.report.detail, 0u) << "bytes pushed into the terminal";
  // The control shows why the high bits matter: the kernel reads only the low 32.
  Outcome control = RunChild(Filter::kOff, [] { return TryTiocsti(0xffffffff00005412ul); });
  ASSERT_TRUE(control.reported) << "control: " << control;
  if (control.report.ret != 0) {
    GTEST_SKIP() << "this kernel refuses TIOCSTI itself (dev.tty.legacy_tiocsti=0?): " << control;
  }
  EXPECT_EQ(control.report.detail, 1u) << "control: " << control;
}

TEST_F(SeccompTest, TioclinuxIsEperm) {
  for (unsigned long request : {0x541Cul, 0xdeadbeef0000541Cul}) {
    SCOPED_TRACE(request);
    ExpectDenied(
        [request] {
          int master;
          int slave = OpenControllingPty(&master);
          if (slave < 0) return Report{-2, errno, 0};
          char subcode = 6;  // TIOCL_GETSHIFTSTATE: a read
          return Sys(::syscall(SYS_ioctl, slave, request, &subcode));
        },
        EPERM);
  }
}

TEST_F(SeccompTest, HarmlessIoctlsWork) {
  ExpectAllowed([] {
    int master;
    int slave = OpenControllingPty(&master);  // TIOCSCTTY and TCSETS on the way
    if (slave < 0) return Report{-2, errno, 0};
    winsize ws{24, 80, 0, 0};
    if (::ioctl(slave, TIOCSWINSZ, &ws) != 0) return Sys(-1);
    winsize got{};
    if (::ioctl(master, TIOCGWINSZ, &got) != 0) return Sys(-1);
    return Report{got.ws_row == 24 && got.ws_col == 80 ? 0 : -1, 0, 0};
  });
  ExpectAllowed([] {
    int p[2];
    if (::pipe(p) != 0 || ::write(p[1], "abc", 3) != 3) return Sys(-1);
    int n = 0;
    if (::ioctl(p[0], FIONREAD, &n) != 0) return Sys(-1);
    return Report{n == 3 ? 0 : -1, 0, 0};
  });
}

// ---- personality
// -----------------------------------------------------------------------------------

Report Personality(uint64_t value) { return Sys(::syscall(SYS_personality, value)); }

TEST_F(SeccompTest, PersonalityQueryAndDockerValuesWork) {
  for (uint64_t v : {0xffffffffull, 0ull, 0x0008ull, 0x20000ull, 0x20008ull}) {
    SCOPED_TRACE(v);
    ExpectAllowed([v] { return Personality(v); });
  }
}

TEST_F(SeccompTest, PersonalityOtherValuesAreEperm) {
  for (uint64_t v : std::initializer_list<uint64_t>{PER_BSD, READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE,
                                                    MMAP_PAGE_ZERO, ADDR_LIMIT_3GB, 0xfffffffeull,
                                                    0x100000000ull, 0xffffffffffffffffull}) {
    SCOPED_TRACE(v);
    ExpectDenied([v] { return Personality(v); }, EPERM);
  }
}

TEST_F(SeccompTest, PersonalityAllowsExactlyTheListedValues) {
  // A sweep of the low values, every single bit, and pseudo-random 32- and 64-bit values.
  Outcome o = RunChild(Filter::kOn, [] {
    Report r;
    auto check = [&r](uint64_t v) {
      const bool allowed = v == 0 || v == 0x8 || v == 0x20000 || v == 0x20008 || v == 0xffffffff;
      long got = ::syscall(SYS_personality, v);
      const int err = errno;
      if (got >= 0 && v != 0xffffffff) ::syscall(SYS_personality, 0L);
      if (allowed ? got < 0 : (got >= 0 || err != EPERM)) {
        if (r.ret++ == 0) {
          r.detail = v;
          r.err = got < 0 ? err : 0;
        }
      }
    };
    for (uint64_t v = 0; v <= 0x40000; ++v) check(v);
    for (int bit = 0; bit < 64; ++bit) check(uint64_t{1} << bit);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 20000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      check(x >> 32);
      check(x);
    }
    for (uint64_t v : {0xfffffff7ull, 0xfffdffffull, 0xfffdfff7ull, 0x1ffffffffull}) check(v);
    return r;
  });
  ASSERT_TRUE(o.reported) << o;
  EXPECT_EQ(o.report.ret, 0) << "values answered wrongly, first 0x" << std::hex << o.report.detail
                             << std::dec << " with " << ErrnoName(o.report.err);
}

// ---- Named denies from the spec's test list
// ----------------------------------------------------------

TEST_F(SeccompTest, IoUringSetupIsEnosys) {
  ExpectDenied(
      [] {
        io_uring_params params{};
        return Sys(::syscall(SYS_io_uring_setup, 1, &params));
      },
      ENOSYS);
}

TEST_F(SeccompTest, MountIsEperm) {
  ExpectDenied(
      [] { return Sys(::mount("none", "/nonexistent-airlock-seccomp", "tmpfs", 0, nullptr)); },
      EPERM);
}

// Device nodes: the kernel refuses them without CAP_MKNOD, but gVisor's lets anyone make them on
// its tmpfs; the filter refuses them on every engine. The control runs as root here, where the
// kernel makes the node (so the filter's answer is the one seen), and removes it.
class SeccompMknodTest : public SeccompTest {
 protected:
  void SetUp() override {
    SeccompTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: the control makes a device node";
    char dir[] = "/tmp/airlock-seccomp-mknod-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr) << ErrnoName(errno);
    dir_ = dir;
  }
  void TearDown() override {
    if (dir_.empty()) return;
    ::unlink(node().c_str());
    ::rmdir(dir_.c_str());
  }
  std::string node() const { return dir_ + "/node"; }
  std::string dir_;
};

TEST_F(SeccompMknodTest, BlockAndCharacterDevicesAreEperm) {
  const std::string path = node();
  for (mode_t type : {S_IFBLK, S_IFCHR}) {
    SCOPED_TRACE(type == S_IFBLK ? "block" : "character");
    ExpectDenied([&] { return Sys(::mknod(path.c_str(), type | 0600, makedev(8, 0))); }, EPERM);
    ::unlink(path.c_str());
    ExpectDenied(
        [&] { return Sys(::mknodat(AT_FDCWD, path.c_str(), type | 0600, makedev(1, 3))); }, EPERM);
    ::unlink(path.c_str());
  }
}

TEST_F(SeccompMknodTest, HighBitsInTheModeDoNotHideTheType) {
  // The kernel reads a 16-bit mode: bits above it are dropped, and the node is still a device.
  const std::string path = node();
  ExpectDenied(
      [&] { return Sys(::syscall(SYS_mknod, path.c_str(), 0xff0000ul | S_IFBLK | 0600, 0x800)); },
      EPERM);
  ExpectDenied([&] {
    return Sys(::syscall(SYS_mknodat, AT_FDCWD, path.c_str(), ~0xfffful | S_IFCHR | 0600, 0x103));
  }, EPERM);
}

TEST_F(SeccompMknodTest, FifosSocketsAndFilesWork) {
  const std::string path = node();
  for (mode_t type : {S_IFIFO, S_IFSOCK, S_IFREG}) {
    ExpectAllowed([&] { return Sys(::mknod(path.c_str(), type | 0600, 0)); });
    ::unlink(path.c_str());
  }
}

TEST_F(SeccompTest, PtraceIsEperm) {
  ExpectDenied([] { return Sys(::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr)); }, EPERM);
}

TEST_F(SeccompTest, BpfIsEperm) {
  ExpectDenied(
      [] {
        bpf_attr attr{};
        return Sys(::syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr));
      },
      EPERM);
}

TEST_F(SeccompTest, KeyctlIsEperm) {
  ExpectDenied(
      [] { return Sys(::syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)); },
      EPERM);
}

// ---- What stays allowed
// ---------------------------------------------------------------------------

// What airlock-agent does as PID 1 of the sandbox: under the filter each call must end as it
// does without it.
struct AgentCall {
  const char* name;
  Report (*call)();
};

const AgentCall kAgentCalls[] = {
    {"epoll_create1", [] { return Sys(::epoll_create1(EPOLL_CLOEXEC)); }},
    {"signalfd",
     [] {
       sigset_t mask;
       sigemptyset(&mask);
       sigaddset(&mask, SIGCHLD);
       return Sys(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
     }},
    {"openat2",
     [] {
       open_how how{};
       how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
       how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
       int root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
       return Sys(::syscall(SYS_openat2, root, "tmp", &how, sizeof how));
     }},
    {"pty",
     [] {
       int master;
       int slave = OpenControllingPty(&master);
       if (slave < 0) return Report{-2, errno, 0};
       winsize ws{30, 100, 0, 0};
       return Sys(::ioctl(slave, TIOCSWINSZ, &ws));
     }},
    {"subreaper", [] { return Sys(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)); }},
    {"setresuid", [] { return Sys(::setresuid(::getuid(), ::getuid(), ::getuid())); }},
    {"setresgid", [] { return Sys(::setresgid(::getgid(), ::getgid(), ::getgid())); }},
    {"setgroups",
     [] {
       gid_t g = ::getgid();
       return Sys(::setgroups(1, &g));
     }},
    {"capset",
     [] {
       __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
       __user_cap_data_struct data[2]{};
       if (::syscall(SYS_capget, &header, data) != 0) return Sys(-1);
       return Sys(::syscall(SYS_capset, &header, data));
     }},
    {"capbset_drop", [] { return Sys(::prctl(PR_CAPBSET_DROP, CAP_SYS_BOOT, 0, 0, 0)); }},
    {"close_range", [] { return Sys(::syscall(SYS_close_range, 3u, ~0u, 4u /*CLOEXEC*/)); }},
    {"waitpid",
     [] {
       pid_t pid = ::fork();
       if (pid == 0) _exit(3);
       int status = 0;
       Report r = Sys(::waitpid(pid, &status, 0));
       r.detail = static_cast<uint64_t>(status);
       return r;
     }},
    {"seccomp_again",  // a sandboxed program may add its own filter (it has NO_NEW_PRIVS)
     [] {
       ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
       sock_filter allow{BPF_RET | BPF_K, 0, 0, SECCOMP_RET_ALLOW};
       sock_fprog prog{1, &allow};
       int err = InstallSeccomp(&prog);
       return Report{err == 0 ? 0 : -1, err, 0};
     }},
};

void PrintTo(const AgentCall& c, std::ostream* os) { *os << c.name; }

class SeccompAgentCallTest : public SeccompTest, public ::testing::WithParamInterface<AgentCall> {};

TEST_P(SeccompAgentCallTest, EndsAsWithoutTheFilter) {
  const AgentCall& c = GetParam();
  Outcome filtered = RunChild(Filter::kOn, c.call);
  Outcome control = RunChild(Filter::kOff, c.call);
  ASSERT_TRUE(filtered.reported) << filtered;
  ASSERT_TRUE(control.reported) << "control: " << control;
  EXPECT_EQ(filtered.report.ret < 0, control.report.ret < 0) << filtered << " / " << control;
  EXPECT_EQ(ErrnoName(filtered.report.err), ErrnoName(control.report.err))
      << filtered << " / " << control;
  EXPECT_EQ(filtered.report.detail, control.report.detail) << filtered << " / " << control;
  if (!HasFailure() && control.report.ret < 0) {
    GTEST_SKIP() << "fails without the filter too (needs root?): " << control;
  }
}

INSTANTIATE_TEST_SUITE_P(Agent, SeccompAgentCallTest, ::testing::ValuesIn(kAgentCalls),
                         [](const ::testing::TestParamInfo<AgentCall>& param) {
                           return std::string(param.param.name);
                         });

TEST_F(SeccompTest, OrdinaryProgramsRunUnderTheFilter) {
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  Outcome o = RunChild(Filter::kOn, [&] {
    if (::dup2(out[1], 1) < 0) return Sys(-1);
    const char* argv[] = {"/bin/sh", "-c",
                          "echo ok; ls / >/dev/null; cat /proc/self/status | grep -E "
                          "'^(Seccomp|NoNewPrivs):'; (sleep 0 &); wait; uname -m",
                          nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    return Sys(-1);
  });
  ::close(out[1]);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) output.append(buf, n);
  ::close(out[0]);
  EXPECT_FALSE(o.reported) << "exec failed: " << o;
  EXPECT_EQ(o.exit_status, 0) << o << "\n" << output;
  EXPECT_EQ(output.rfind("ok\n", 0), 0u) << output;
  EXPECT_NE(output.find("Seccomp:\t2\n"), std::string::npos) << output;
  EXPECT_NE(output.find("NoNewPrivs:\t1\n"), std::string::npos) << output;
  EXPECT_NE(output.find("x86_64\n"), std::string::npos) << output;
}

}  // namespace
}  // namespace airlock::runtime
