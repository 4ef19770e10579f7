#include "runtime/seccomp_policy.h"

#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// The plain rules: the whole syscall is denied, whatever its arguments (shared/SECURITY.md).
// Everything not listed here or in the conditional rules below is allowed.
// ---------------------------------------------------------------------------------------------

constexpr SeccompRule Eperm(std::string_view syscall, std::string_view reason) {
  return {syscall, SeccompAction::kErrno, EPERM, reason};
}
// ENOSYS where a libc or runtime has a fallback for "this kernel does not have it".
constexpr SeccompRule Enosys(std::string_view syscall, std::string_view reason) {
  return {syscall, SeccompAction::kErrno, ENOSYS, reason};
}

constexpr SeccompRule kRules[] = {
    // Namespaces and mounts: the jail builds them before the sandbox runs; no changes after.
    Eperm("unshare", "a new user namespace hands out a full capability set"),
    Eperm("setns", "joining another namespace through an inherited fd leaves the jail"),
    Eperm("mount", "mounts can cover or expose host paths; the jail mounted everything already"),
    Eperm("umount2", "unmounting can reveal what the jail's mounts cover"),
    Eperm("pivot_root", "swaps the root of the mount namespace: jail setup only"),
    Eperm("chroot", "with a directory fd kept outside, the classic chroot escape"),
    // The host and its kernel.
    Eperm("reboot", "reboots the machine, or kills the pid namespace's init"),
    Eperm("kexec_load", "loads and boots another kernel"),
    Eperm("kexec_file_load", "loads and boots another kernel"),
    Eperm("init_module", "kernel modules run with full kernel privileges"),
    Eperm("finit_module", "kernel modules run with full kernel privileges"),
    Eperm("delete_module", "unloads host kernel modules"),
    Eperm("swapon", "swap is host-wide configuration"),
    Eperm("swapoff", "swap is host-wide configuration"),
    Eperm("acct", "process accounting is host-wide"),
    Eperm("quotactl", "filesystem quotas are host configuration"),
    Eperm("quotactl_fd", "quotactl by fd: the same power as quotactl (not in SECURITY.md's list)"),
    Eperm("syslog", "the kernel log leaks kernel addresses and host activity"),
    Eperm("settimeofday", "the wall clock is shared with the host"),
    Eperm("clock_settime", "the wall clock is shared with the host"),
    Eperm("sethostname", "the jail sets the UTS names"),
    Eperm("setdomainname", "the jail sets the UTS names"),
    Eperm("vhangup", "hangs up a terminal for every process that has it open"),
    Eperm("iopl", "raw I/O port access"),
    Eperm("ioperm", "raw I/O port access"),
    Eperm("modify_ldt", "16-bit segments: no use in a sandbox, a history of kernel bugs"),
    Eperm("uselib", "obsolete a.out loader"),
    Eperm("ustat", "obsolete; reports host filesystems by device number"),
    Eperm("sysfs", "obsolete filesystem type query"),
    Eperm("_sysctl", "removed binary sysctl interface"),
    Eperm("lookup_dcookie", "profiler interface that turns kernel cookies into host paths"),
    // Other processes.
    Eperm("ptrace", "reads and controls other processes (and could rewrite their syscalls)"),
    Eperm("process_vm_readv", "reads another process's memory"),
    Eperm("process_vm_writev", "writes another process's memory"),
    Eperm("kcmp", "compares kernel objects of other processes: a kernel pointer oracle"),
    Eperm("pidfd_getfd", "copies a file descriptor out of another process"),
    Eperm("process_madvise", "changes another process's memory"),
    // Kernel attack surface with no use inside a sandbox.
    Eperm("bpf", "loads programs into the kernel: a large attack surface"),
    Eperm("perf_event_open", "performance counters: side channels and a history of kernel bugs"),
    Eperm("userfaultfd", "stalls the kernel mid-copy: a standard exploit primitive"),
    Eperm("add_key", "the kernel keyrings are not namespaced"),
    Eperm("keyctl", "the kernel keyrings are not namespaced"),
    Eperm("request_key", "the kernel keyrings are not namespaced"),
    Eperm("fanotify_init", "watches and can block access on whole filesystems"),
    Eperm("open_by_handle_at",
          "opens files by handle past the mount namespace (the shocker escape)"),
    Eperm("name_to_handle_at", "makes the handles open_by_handle_at takes"),
    Eperm("mbind", "NUMA placement is a host resource"),
    Eperm("set_mempolicy", "NUMA placement is a host resource"),
    Eperm("set_mempolicy_home_node", "NUMA placement (newer call, not in SECURITY.md's list)"),
    Eperm("migrate_pages", "moves another process's pages between NUMA nodes"),
    Eperm("move_pages", "moves another process's pages between NUMA nodes"),
    // ENOSYS: as if the kernel were older, so callers take their fallback path.
    Enosys("clone3", "its flags are in memory seccomp cannot read: glibc falls back to clone"),
    Enosys("open_tree", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("move_mount", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("fsopen", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("fsconfig", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("fsmount", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("fspick", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("mount_setattr", "new mount API: mount's power; tools fall back to mount(2)"),
    Enosys("io_uring_setup", "io_uring ops are not seen by seccomp; runtimes fall back to epoll"),
    Enosys("io_uring_enter", "io_uring ops are not seen by seccomp; runtimes fall back to epoll"),
    Enosys("io_uring_register",
           "io_uring ops are not seen by seccomp; runtimes fall back to epoll"),
};

// ---------------------------------------------------------------------------------------------
// The conditional rules: a syscall is denied only for some argument values.
//
// The kernel reads most of these arguments as 32-bit ints (socket's family, ioctl's request,
// personality, clone's flags via lower_32_bits), while seccomp sees the full 64-bit register.
// A deny that compared all 64 bits could be dodged by setting the high half; so denies that
// name specific values compare the low 32 bits only (a MASKED_EQ whose mask has no high bits),
// and allowlists compare all 64 bits, which can only deny too much (a high half no libc sets).
// ---------------------------------------------------------------------------------------------

#ifndef CLONE_NEWTIME
constexpr uint64_t CLONE_NEWTIME = 0x00000080;
#endif

struct CloneFlag {
  uint64_t flag;
  std::string_view name;
};
// clone(2) with any of these -> EPERM: each creates a namespace, and a new user namespace hands
// out capabilities. Threads, fork, vfork and the agent's CLONE_VM|CLONE_VFORK spawn set none.
// CLONE_NEWTIME shares its bit with clone's exit-signal byte (no valid signal sets it), so it
// only means "new time namespace" to clone3 and unshare; listed for completeness.
constexpr CloneFlag kDeniedCloneFlags[] = {
    {CLONE_NEWNS, "CLONE_NEWNS"},     {CLONE_NEWCGROUP, "CLONE_NEWCGROUP"},
    {CLONE_NEWUTS, "CLONE_NEWUTS"},   {CLONE_NEWIPC, "CLONE_NEWIPC"},
    {CLONE_NEWUSER, "CLONE_NEWUSER"}, {CLONE_NEWPID, "CLONE_NEWPID"},
    {CLONE_NEWNET, "CLONE_NEWNET"},   {CLONE_NEWTIME, "CLONE_NEWTIME"},
};

// socket(2) and socketpair(2) families allowed; every other family -> EAFNOSUPPORT, the
// kernel's own answer for a family it was built without, so programs treat it as absent.
// Denied families include AF_PACKET (raw frames), AF_VSOCK (the hypervisor), AF_ALG (kernel
// crypto), AF_KEY, AF_XDP, AF_BLUETOOTH, AF_TIPC...: creating one can also autoload a module.
// socketpair is covered too because it creates its sockets the same way.
constexpr uint64_t kAllowedSocketFamilies[] = {
    AF_UNIX,     // local IPC, including the agent channel
    AF_INET,     // the network, as far as the egress policy lets it go
    AF_INET6,    // the network, as far as the egress policy lets it go
    AF_NETLINK,  // NETLINK_ROUTE only (below): getaddrinfo, if_nameindex, `ip addr`
};
// AF_NETLINK protocols allowed; others -> EPROTONOSUPPORT, the kernel's answer for a netlink
// protocol it lacks, which callers such as libaudit read as "not available" (EAFNOSUPPORT would
// say netlink is missing). The others reach host-wide kernel state: audit, uevents, sock_diag
// of every socket, netfilter, xfrm.
constexpr uint64_t kAllowedNetlinkProtocols[] = {NETLINK_ROUTE};
constexpr int kDeniedNetlinkErrno = EPROTONOSUPPORT;

// AF_INET / AF_INET6 socket types -> EPERM, the kernel's answer without CAP_NET_RAW (so ping
// uses its unprivileged ICMP datagram socket instead). Matched on the type's low four bits
// (SOCK_TYPE_MASK); the rest carries SOCK_CLOEXEC / SOCK_NONBLOCK.
constexpr uint64_t kSockTypeMask = 0xf;
constexpr uint64_t kDeniedInetSocketTypes[] = {
    SOCK_RAW,     // forges and sniffs packets past the egress proxy
    SOCK_PACKET,  // with AF_INET the kernel's legacy alias for an AF_PACKET socket
};

// ioctl(2) requests -> EPERM, matched on the low 32 bits (the kernel's `unsigned int cmd`).
constexpr uint64_t kDeniedIoctls[] = {
    TIOCSTI,    // pushes input into a terminal: commands typed into whoever reads it next
    TIOCLINUX,  // virtual console control: selection paste is TIOCSTI by another name
};

// mknod(2) and mknodat(2) of a block or character device -> EPERM, the kernel's answer without
// CAP_MKNOD, which a sandbox never has. On the jail the kernel refuses them anyway; gVisor's
// kernel lets any user make device nodes on its tmpfs (the node is the Sentry's, not the host's,
// but the contract is the same on every engine). Matched on the mode's file-type bits (the
// kernel reads the mode as a 16-bit umode_t; a mask has no use for the rest). A character device
// 0:0 (an overlayfs whiteout, which Linux lets anyone make) is refused as well.
constexpr uint64_t kDeniedNodeTypes[] = {S_IFBLK, S_IFCHR};

// personality(2) values allowed (Docker's default profile); every other value -> EPERM.
// Denied flags include READ_IMPLIES_EXEC (makes every readable mapping executable),
// ADDR_NO_RANDOMIZE (turns off ASLR), MMAP_PAGE_ZERO and the foreign exec domains.
constexpr uint64_t kAllowedPersonalities[] = {
    PER_LINUX,                        // the default (and back to it)
    PER_LINUX32,                      // `linux32` / `setarch i686`: uname reports i686
    UNAME26,                          // `uname26`: reports a 2.6 kernel to old build scripts
    uint64_t{UNAME26} | PER_LINUX32,  // both of the above
    0xffffffff,                       // a query: returns the personality, changes nothing
};

// ---------------------------------------------------------------------------------------------

struct ScmpCtxDeleter {
  void operator()(void* ctx) const { seccomp_release(static_cast<scmp_filter_ctx>(ctx)); }
};
using ScmpCtx = std::unique_ptr<void, ScmpCtxDeleter>;

std::string LibseccompError(std::string_view what, int rc) {
  return std::string(what) + ": " + ErrnoName(-rc);
}

// Resolves a syscall name for the native architecture. Pseudo-syscalls (negative numbers,
// names this architecture lacks) are refused: a rule for one would silently deny nothing.
Result<int> SyscallNumber(std::string_view name) {
  std::string n(name);
  int nr = seccomp_syscall_resolve_name(n.c_str());
  if (nr < 0) return Fail(ErrorCode::kInternal, "seccomp: no syscall named " + n + " on x86_64");
  return nr;
}

// One rule: `action` for syscall `nr` when all `conditions` hold (each on a different argument).
Status AddRule(scmp_filter_ctx ctx, uint32_t action, int nr, std::string_view what,
               std::span<const scmp_arg_cmp> conditions) {
  int rc = seccomp_rule_add_exact_array(ctx, action, nr, static_cast<unsigned>(conditions.size()),
                                        conditions.data());
  if (rc < 0) {
    return Fail(ErrorCode::kInternal, LibseccompError("seccomp rule " + std::string(what), rc));
  }
  return {};
}
Status AddRule(scmp_filter_ctx ctx, uint32_t action, int nr, std::string_view what,
               std::initializer_list<scmp_arg_cmp> conditions) {
  return AddRule(ctx, action, nr, what, std::span(conditions.begin(), conditions.size()));
}

// Denies `nr` (with `action`) when argument `arg` is not one of `allowed` (sorted, compared on
// all 64 bits) and every `also` condition holds. libseccomp takes one comparison per argument
// per rule, so "not one of" becomes: below the smallest, above the largest, and each gap
// between neighbours cut into aligned power-of-two blocks, one MASKED_EQ each (as a range of
// addresses becomes CIDR prefixes).
Status DenyUnlessOneOf(scmp_filter_ctx ctx, uint32_t action, int nr, std::string_view what,
                       unsigned arg, std::span<const uint64_t> allowed,
                       std::initializer_list<scmp_arg_cmp> also) {
  auto add = [&](scmp_arg_cmp cmp) -> Status {
    scmp_arg_cmp conditions[4];
    size_t n = 0;
    for (const scmp_arg_cmp& c : also) conditions[n++] = c;
    conditions[n++] = cmp;
    return AddRule(ctx, action, nr, what, std::span<const scmp_arg_cmp>(conditions, n));
  };
  if (allowed.empty() || also.size() > 3) {
    return Fail(ErrorCode::kInternal, "seccomp rule " + std::string(what) + ": bad allowlist");
  }
  if (allowed.front() > 0) {
    if (auto s = add({arg, SCMP_CMP_LT, allowed.front(), 0}); !s) return s;
  }
  for (size_t i = 0; i + 1 < allowed.size(); ++i) {
    if (allowed[i] >= allowed[i + 1]) {
      return Fail(ErrorCode::kInternal, "seccomp rule " + std::string(what) + ": unsorted");
    }
    uint64_t lo = allowed[i] + 1;
    const uint64_t hi = allowed[i + 1] - 1;  // the gap is [lo, hi], maybe empty
    while (lo <= hi) {
      // The largest block that starts at lo (aligned) and ends by hi.
      uint64_t size = lo & -lo;  // lo > 0: its lowest set bit
      while (size > 1 && lo + (size - 1) > hi) size >>= 1;
      if (auto s = add({arg, SCMP_CMP_MASKED_EQ, ~(size - 1), lo}); !s) return s;
      lo += size;
    }
  }
  if (allowed.back() < std::numeric_limits<uint64_t>::max()) {
    if (auto s = add({arg, SCMP_CMP_GT, allowed.back(), 0}); !s) return s;
  }
  return {};
}

// A deny on the low 32 bits of `arg` equal to `value` (see the note above the conditional rules).
constexpr scmp_arg_cmp Low32Equals(unsigned arg, uint64_t value) {
  return {arg, SCMP_CMP_MASKED_EQ, 0xffffffffu, value & 0xffffffffu};
}

Status AddSocketRules(scmp_filter_ctx ctx, int nr, std::string_view name) {
  // Rules for the same syscall are alternatives (any match denies); their family conditions
  // are disjoint, so the order does not matter.
  if (auto s = DenyUnlessOneOf(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, name, 0,
                               kAllowedSocketFamilies, {});
      !s) {
    return s;
  }
  if (auto s = DenyUnlessOneOf(ctx, SCMP_ACT_ERRNO(kDeniedNetlinkErrno), nr, name, 2,
                               kAllowedNetlinkProtocols, {SCMP_A0_64(SCMP_CMP_EQ, AF_NETLINK)});
      !s) {
    return s;
  }
  for (uint64_t family : {AF_INET, AF_INET6}) {
    for (uint64_t type : kDeniedInetSocketTypes) {
      if (auto s = AddRule(ctx, SCMP_ACT_ERRNO(EPERM), nr, name,
                           {SCMP_A0_64(SCMP_CMP_EQ, family),
                            SCMP_A1_64(SCMP_CMP_MASKED_EQ, kSockTypeMask, type)});
          !s) {
        return s;
      }
    }
  }
  return {};
}

Status AddConditionalRules(scmp_filter_ctx ctx) {
  auto clone = SyscallNumber("clone");
  if (!clone) return std::unexpected(clone.error());
  for (const CloneFlag& f : kDeniedCloneFlags) {
    // x86_64 clone(flags, stack, parent_tid, child_tid, tls): flags are argument 0.
    if (auto s = AddRule(ctx, SCMP_ACT_ERRNO(EPERM), *clone, f.name,
                         {SCMP_A0_64(SCMP_CMP_MASKED_EQ, f.flag, f.flag)});
        !s) {
      return s;
    }
  }

  for (std::string_view name : {"socket", "socketpair"}) {
    auto nr = SyscallNumber(name);
    if (!nr) return std::unexpected(nr.error());
    if (auto s = AddSocketRules(ctx, *nr, name); !s) return s;
  }

  auto ioctl = SyscallNumber("ioctl");
  if (!ioctl) return std::unexpected(ioctl.error());
  for (uint64_t request : kDeniedIoctls) {
    if (auto s = AddRule(ctx, SCMP_ACT_ERRNO(EPERM), *ioctl, "ioctl", {Low32Equals(1, request)});
        !s) {
      return s;
    }
  }

  for (auto [name, mode_arg] : {std::pair<std::string_view, unsigned>{"mknod", 1}, {"mknodat", 2}}) {
    auto nr = SyscallNumber(name);
    if (!nr) return std::unexpected(nr.error());
    for (uint64_t type : kDeniedNodeTypes) {
      if (auto s = AddRule(ctx, SCMP_ACT_ERRNO(EPERM), *nr, name,
                           {{mode_arg, SCMP_CMP_MASKED_EQ, S_IFMT, type}});
          !s) {
        return s;
      }
    }
  }

  auto personality = SyscallNumber("personality");
  if (!personality) return std::unexpected(personality.error());
  return DenyUnlessOneOf(ctx, SCMP_ACT_ERRNO(EPERM), *personality, "personality", 0,
                         kAllowedPersonalities, {});
}

}  // namespace

std::span<const SeccompRule> SeccompRules() { return kRules; }

Result<SeccompProgram> SeccompProgram::Compile() {
  if (seccomp_arch_native() != SCMP_ARCH_X86_64) {
    return Fail(ErrorCode::kUnimplemented, "seccomp policy: only x86_64 is supported");
  }
  ScmpCtx ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) return Fail(ErrorCode::kInternal, "seccomp_init failed");
  // The filter holds the native architecture only, so a syscall made through another ABI
  // (int 0x80 as i386) and, by libseccomp's x86_64 prologue, any x32 number (nr | 0x40000000)
  // takes this action.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
      rc < 0) {
    return Fail(ErrorCode::kInternal, LibseccompError("seccomp bad-arch action", rc));
  }
  // A binary search over syscall numbers instead of a linear scan: every allowed syscall of
  // the sandbox pays for the filter.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2); rc < 0) {
    return Fail(ErrorCode::kInternal, LibseccompError("seccomp optimize level", rc));
  }

  for (const SeccompRule& rule : kRules) {
    auto nr = SyscallNumber(rule.syscall);
    if (!nr) return std::unexpected(nr.error());
    uint32_t action = rule.action == SeccompAction::kKillProcess ? SCMP_ACT_KILL_PROCESS
                                                                 : SCMP_ACT_ERRNO(rule.err);
    if (auto s = AddRule(ctx.get(), action, *nr, rule.syscall, {}); !s) {
      return std::unexpected(s.error());
    }
  }
  if (auto s = AddConditionalRules(ctx.get()); !s) return std::unexpected(s.error());

  // libseccomp 2.5 exports BPF only to an fd; read it back from a memfd.
  UniqueFd memfd(::memfd_create("airlock-seccomp", MFD_CLOEXEC));
  if (!memfd) return FailErrno("seccomp: memfd_create", errno);
  if (int rc = seccomp_export_bpf(ctx.get(), memfd.get()); rc < 0) {
    return Fail(ErrorCode::kInternal, LibseccompError("seccomp_export_bpf", rc));
  }
  off_t size = ::lseek(memfd.get(), 0, SEEK_END);
  if (size < 0) return FailErrno("seccomp: lseek", errno);
  std::string bytes(static_cast<size_t>(size), '\0');
  auto read = ::pread(memfd.get(), bytes.data(), bytes.size(), 0);
  if (read != size) return FailErrno("seccomp: reading the exported program", errno);
  return FromBytes(bytes);
}

}  // namespace airlock::runtime
