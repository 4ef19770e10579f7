#include "runtime/jail/contain.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/mount.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/syscall.h"
#include "runtime/guest_files.h"
#include "runtime/guest.h"
#include "runtime/seccomp_policy.h"

namespace airlock::jail {
namespace {

// The inode cap of a tmpfs of `mb` MiB: one inode per 4 KiB, at least 1024.
uint64_t InodesFor(uint64_t mb) { return std::max<uint64_t>(mb * 256, 1024); }

constexpr uid_t kUserUid = runtime::guest::kUserUid;

struct Failure {
  const char* step = nullptr;
  int err = 0;
};

// The record the sandbox process writes to the launcher if a step fails (fixed size: one write).
struct FailureRecord {
  char step[48];
  int err;
};

// Locked mount flags of an existing mount, which a remount inside a user namespace must keep.
unsigned long LockedFlags(const char* path) {
  struct statvfs st;
  if (::statvfs(path, &st) != 0) return 0;
  unsigned long flags = 0;
  if (st.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  return flags;
}

// Binds `src` onto `dst` and remounts it with `flags` added (read-only, nosuid, ...).
int BindWithFlags(const char* src, const char* dst, unsigned long flags) {
  if (::mount(src, dst, nullptr, MS_BIND | MS_REC, nullptr) < 0) return -1;
  return ::mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | flags | LockedFlags(dst), nullptr);
}

int WriteFile(const std::string& path, std::string_view text, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) return -1;
  if (!WriteAll(fd.get(), text)) return -1;
  return 0;
}

int Touch(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  return ::close(fd);
}

int MkdirOwned(const std::string& path, mode_t mode, uid_t owner) {
  if (::mkdir(path.c_str(), mode) < 0 && errno != EEXIST) return -1;
  if (::chown(path.c_str(), owner, owner) < 0) return -1;
  return ::chmod(path.c_str(), mode);
}

int MkdirAll(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0755) < 0 && errno != EEXIST) return -1;
    if (slash == std::string::npos) return 0;
  }
}

// The sandbox's own /usr and /usr/local, made in its writable layer's upper directory before the
// overlay is mounted (a directory of the template, owned by the host's root, is nobody's inside:
// nothing could be made in it). The mount points for the host's directories come from the
// template's /usr, merged under it; /usr/local is empty but for Debian's layout.
int MakeOwnUsr(const std::string& upper) {
  if (::mkdir((upper + "/usr").c_str(), 0755) < 0) return -1;
  const std::string local = upper + "/usr/local";
  if (::mkdir(local.c_str(), 0755) < 0) return -1;
  for (const char* dir : runtime::guest::kUsrLocalDirs) {
    if (::mkdir((local + "/" + dir).c_str(), 0755) < 0) return -1;
  }
  return 0;
}

// Sets (or clears) mount attributes on the mount at `path`, or on every mount at or below it.
int SetMountAttr(const std::string& path, uint64_t set, uint64_t clear, bool recursive) {
  mount_attr attr{};
  attr.attr_set = set;
  attr.attr_clr = clear;
  return static_cast<int>(::syscall(SYS_mount_setattr, AT_FDCWD, path.c_str(),
                                    recursive ? AT_RECURSIVE : 0, &attr, sizeof attr));
}

// The base root's /usr: the sandbox's own directory, holding the host's kHostUsrDirs and
// /usr/local (the sandbox's own, or the host's); all of it (what the host mounted below its
// directories too) read-only, nosuid and nodev, but for the sandbox's own /usr/local, which
// stays writable. Runs before pivot_root, once every mount point was checked to be a directory.
Failure MountUsr(const std::string& root, const JailConfig& c) {
  const std::string usr = root + "/usr", local = usr + "/local";
  // A mount of its own (the overlay under it stays writable), for the binds to go on.
  if (::mount(usr.c_str(), usr.c_str(), nullptr, MS_BIND, nullptr) < 0) return {"bind /usr", errno};
  for (const std::string& dir : c.usr_dirs) {
    if (::mount(("/usr/" + dir).c_str(), (usr + "/" + dir).c_str(), nullptr, MS_BIND | MS_REC,
                nullptr) < 0) {
      return {"bind /usr directory", errno};
    }
  }
  const std::string local_source = c.host_usr_local ? "/usr/local" : local;
  if (::mount(local_source.c_str(), local.c_str(), nullptr, MS_BIND | MS_REC, nullptr) < 0) {
    return {"bind /usr/local", errno};
  }
  // One call for the whole tree: attributes only added, so the flags a host's mount holds
  // locked stay as they are.
  if (SetMountAttr(usr, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, true) < 0) {
    return {"read-only /usr", errno};
  }
  if (!c.host_usr_local && SetMountAttr(local, 0, MOUNT_ATTR_RDONLY, false) < 0) {
    return {"writable /usr/local", errno};
  }
  return {};
}

// /sys holds only the sandbox's own cgroup directories, read-only, on a read-only tmpfs.
Failure MakeSys(const std::string& root, const JailConfig& c) {
  std::string sys = root + "/sys";
  if (::mount("tmpfs", sys.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=16k,mode=0755") < 0) {
    return {"mount /sys", errno};
  }
  for (const auto& [host, inside] : c.cgroup_binds) {
    std::string target = root + inside;
    if (MkdirAll(target) < 0) return {"mkdir cgroup mount point", errno};
    if (BindWithFlags(host.c_str(), target.c_str(), MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC) <
        0) {
      return {"bind cgroup", errno};
    }
  }
  if (c.limits_view) {
    // glibc's get_nprocs (sysconf(_SC_NPROCESSORS_ONLN), os.cpu_count()) reads this file.
    std::string cpu = sys + "/devices/system/cpu";
    if (MkdirAll(cpu) < 0) return {"mkdir /sys/devices/system/cpu", errno};
    UniqueFd online(
        ::open((cpu + "/online").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
    if (!online) return {"make /sys/devices/system/cpu/online", errno};
    if (BindWithFlags((c.sandbox_dir + "/view/cpu_online").c_str(), (cpu + "/online").c_str(),
                      MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC) < 0) {
      return {"bind cpu view", errno};
    }
  }
  if (::mount(nullptr, sys.c_str(), nullptr,
              MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0) {
    return {"read-only /sys", errno};
  }
  return {};
}

// /proc/meminfo shows the sandbox's memory limit and use (the engine rewrites the host file in
// place); read-only, and the sandbox cannot unmount it (no CAP_SYS_ADMIN once it runs).
Failure BindMeminfo(const std::string& root, const JailConfig& c) {
  if (!c.limits_view) return {};
  if (BindWithFlags((c.sandbox_dir + "/view/meminfo").c_str(), (root + "/proc/meminfo").c_str(),
                    MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC) < 0) {
    return {"bind memory view", errno};
  }
  return {};
}

int LoopbackUp() {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return -1;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) < 0) return -1;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  return ::ioctl(s.get(), SIOCSIFFLAGS, &ifr);
}

int SetCapabilities() {
  // Bounding set: everything but the agent's capabilities goes, for good.
  for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    bool keep = false;
    for (int k : kAgentCaps) keep |= k == cap;
    if (!keep && ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return -1;
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) return -1;
  // The agent execs as root of the namespace, so it gets its bounding set as permitted and
  // effective capabilities; nothing is inheritable.
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  for (int k : kAgentCaps) {
    data[k / 32].effective |= 1u << (k % 32);
    data[k / 32].permitted |= 1u << (k % 32);
  }
  return static_cast<int>(::syscall(SYS_capset, &header, data));
}

// Masks what /proc must not show or let be written, as runc and bubblewrap do.
Failure MaskProc(const std::string& root) {
  static constexpr const char* kHiddenFiles[] = {
      "kcore",       "keys",          "key-users",     "kmsg",        "timer_list",
      "sched_debug", "sysrq-trigger", "latency_stats", "timer_stats", "kallsyms"};
  static constexpr const char* kHiddenDirs[] = {"acpi", "scsi", "asound", "firmware"};
  static constexpr const char* kReadOnly[] = {"sys", "irq", "bus", "fs"};
  for (const char* f : kHiddenFiles) {
    std::string p = root + "/proc/" + f;
    if (::access(p.c_str(), F_OK) != 0) continue;
    if (::mount("/dev/null", p.c_str(), nullptr, MS_BIND, nullptr) < 0)
      return {"mask /proc file", errno};
  }
  for (const char* d : kHiddenDirs) {
    std::string p = root + "/proc/" + d;
    if (::access(p.c_str(), F_OK) != 0) continue;
    if (::mount("tmpfs", p.c_str(), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "size=0,mode=0555") < 0) {
      return {"mask /proc dir", errno};
    }
  }
  for (const char* d : kReadOnly) {
    std::string p = root + "/proc/" + d;
    if (::access(p.c_str(), F_OK) != 0) continue;
    if (BindWithFlags(p.c_str(), p.c_str(), MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC) < 0) {
      return {"read-only /proc dir", errno};
    }
  }
  return {};
}

// A minimal /dev: a few host device nodes bound in, a private devpts and a capped /dev/shm.
Failure MakeDev(const std::string& root) {
  std::string dev = root + "/dev";
  if (::mount("tmpfs", dev.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") < 0) {
    return {"mount /dev", errno};
  }
  for (const char* node : {"null", "zero", "full", "random", "urandom", "tty"}) {
    std::string host = std::string("/dev/") + node, inside = dev + "/" + node;
    if (Touch(inside) < 0) return {"create /dev node", errno};
    if (::mount(host.c_str(), inside.c_str(), nullptr, MS_BIND, nullptr) < 0) {
      return {"bind /dev node", errno};
    }
  }
  std::string pts = dev + "/pts";
  if (::mkdir(pts.c_str(), 0755) < 0) return {"mkdir /dev/pts", errno};
  if (::mount("devpts", pts.c_str(), "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,gid=5") < 0) {
    return {"mount /dev/pts", errno};
  }
  std::string shm = dev + "/shm";
  if (::mkdir(shm.c_str(), 01777) < 0) return {"mkdir /dev/shm", errno};
  if (::mount("tmpfs", shm.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=64m,nr_inodes=16384,mode=1777") < 0) {
    return {"mount /dev/shm", errno};
  }
  static constexpr std::pair<const char*, const char*> kLinks[] = {{"pts/ptmx", "ptmx"},
                                                                   {"/proc/self/fd", "fd"},
                                                                   {"/proc/self/fd/0", "stdin"},
                                                                   {"/proc/self/fd/1", "stdout"},
                                                                   {"/proc/self/fd/2", "stderr"}};
  for (const auto& [target, name] : kLinks) {
    if (::symlink(target, (dev + "/" + name).c_str()) < 0) return {"symlink in /dev", errno};
  }
  return {};
}

// Receives the launcher's go-ahead byte, and with it the idmapped layer mounts (in order).
int ReceiveGo(int sock, std::vector<UniqueFd>& layers) {
  char go;
  iovec iov{&go, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxLayers)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = RetryEintr([&] { return ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); });
  if (n != 1) return -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      layers.emplace_back(fd);
    }
  }
  return (msg.msg_flags & MSG_CTRUNC) ? -1 : 0;
}

// Reads a small file that must not be a symlink into `out`.
int ReadSmallFile(const char* path, std::string& out) {
  UniqueFd fd(::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return -1;
  char buf[4096];
  while (true) {
    ssize_t n = RetryEintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) return -1;
    if (n == 0) return 0;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) {
      errno = EFBIG;
      return -1;
    }
  }
}

// /etc's files, the home directories and, on the host-/usr root, the host's /etc/alternatives.
// Runs inside the new root (after pivot_root): every path resolves inside the sandbox.
Failure WriteEtc(const JailConfig& c, const UniqueFd& alternatives) {
  if (MkdirOwned("/etc", 0755, 0) < 0) return {"mkdir /etc", errno};
  for (auto& [name, text] : runtime::guest::EtcFiles(c.id, c.nameserver)) {
    const std::string path = "/etc/" + name;
    // A root file system has accounts of its own (daemon, _apt, ...); ours replace those with
    // the same name or id.
    if (c.rootfs && (name == "passwd" || name == "group")) {
      std::string existing;
      if (ReadSmallFile(path.c_str(), existing) < 0 && errno != ENOENT) {
        return {"read /etc accounts", errno};
      }
      text = runtime::guest::MergeAccounts(existing, text);
    }
    // What a layer has there (a symlink, say) is replaced, not written through.
    if (::unlink(path.c_str()) < 0 && errno != ENOENT) return {"replace /etc file", errno};
    if (WriteFile(path, text, 0644) < 0) return {"write /etc", errno};
  }
  if (alternatives) {
    if (MkdirOwned("/etc/alternatives", 0755, 0) < 0) return {"mkdir /etc/alternatives", errno};
    if (::syscall(SYS_move_mount, alternatives.get(), "", AT_FDCWD, "/etc/alternatives",
                  MOVE_MOUNT_F_EMPTY_PATH) < 0) {
      return {"bind /etc/alternatives", errno};
    }
  }
  if (MkdirOwned("/root", 0700, 0) < 0) return {"mkdir /root", errno};
  if (MkdirOwned("/home", 0755, 0) < 0) return {"mkdir /home", errno};
  if (MkdirOwned(std::string(runtime::guest::kHome).c_str(), 0755, kUserUid) < 0) {
    return {"mkdir the user's home", errno};
  }
  return {};
}

// Everything the sandbox process does between clone and exec, in order. Any failure returns the
// step and errno; nothing is retried.
Failure ContainProcess(const JailConfig& c, int sync_fd, int agent_fd,
                       const runtime::SeccompProgram& seccomp, const std::vector<char*>& argv,
                       const std::vector<char*>& envp) {
  // 1. Wait until the launcher has written our uid and gid maps (and made the layers' idmapped
  //    mounts), then become root of the new user namespace (which is uid_base on the host).
  std::vector<UniqueFd> layers;
  if (ReceiveGo(sync_fd, layers) < 0) return {"wait for id maps", EIO};
  if (layers.size() != c.layers.size()) return {"receive layers", EBADF};
  if (agent_fd == kWritableLayerFd) return {"agent fd", EBADF};
  if (::setgroups(0, nullptr) < 0) return {"setgroups", errno};
  if (::setresgid(0, 0, 0) < 0) return {"setresgid", errno};
  if (::setresuid(0, 0, 0) < 0) return {"setresuid", errno};

  // 2. Root filesystem: nothing we mount propagates back to the host; the writable layer is a
  //    tmpfs capped at disk_mb; the root is an overlay of the template under it.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) {
    return {"make mounts private", errno};
  }
  std::string disk = c.sandbox_dir + "/disk", root = c.sandbox_dir + "/rootfs";
  // The inode count is capped with the size (one per 4 KiB): a tmpfs's default is half the
  // host's RAM pages, so a sandbox of a 32 MiB disk could otherwise make millions of empty files
  // (the soak's inode fill made 112,000 in 3 s, 200 MiB of kernel memory).
  std::string disk_opts = "size=" + std::to_string(c.disk_mb) +
                          "m,nr_inodes=" + std::to_string(InodesFor(c.disk_mb)) + ",mode=0755";
  if (::mount("tmpfs", disk.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, disk_opts.c_str()) < 0) {
    return {"mount writable layer", errno};
  }
  if (::mkdir((disk + "/upper").c_str(), 0755) < 0 || ::mkdir((disk + "/work").c_str(), 0755) < 0) {
    return {"mkdir upper and work", errno};
  }
  if (!c.rootfs && MakeOwnUsr(disk + "/upper") < 0) return {"mkdir /usr", errno};
  // Kept (as fd 4 of PID 1) for the host to read: snapshots copy upper/ from it.
  UniqueFd disk_fd(::open(disk.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!disk_fd) return {"open writable layer", errno};
  // The template's layers, idmapped by the launcher, on mount points in the writable layer's
  // tmpfs (outside upper/: the sandbox never sees them but through the overlay).
  std::string lowerdirs;
  for (size_t i = 0; i < layers.size(); ++i) {
    std::string at = disk + "/lower" + std::to_string(i);
    if (::mkdir(at.c_str(), 0755) < 0) return {"mkdir layer mount point", errno};
    if (::syscall(SYS_move_mount, layers[i].get(), "", AT_FDCWD, at.c_str(),
                  MOVE_MOUNT_F_EMPTY_PATH) < 0) {
      return {"mount layer", errno};
    }
    layers[i].Reset();
    lowerdirs += at + ":";
  }
  std::string overlay = "lowerdir=" + lowerdirs + c.template_dir + ",upperdir=" + disk +
                        "/upper,workdir=" + disk + "/work,userxattr";
  if (::mount("overlay", root.c_str(), "overlay", MS_NOSUID | MS_NODEV, overlay.c_str()) < 0) {
    return {"mount overlay", errno};
  }
  // Every mount point is a directory of the root, not a symlink a layer put there (the mount
  // would follow it out of the root). /usr and /usr/local come first: the others below them are
  // reached through them.
  std::vector<std::string> mount_points = {"/proc", "/dev", "/sys", "/tmp", "/etc"};
  if (!c.rootfs) {
    mount_points.insert(mount_points.begin(), {"/usr", "/usr/local"});
    for (const std::string& dir : c.usr_dirs) mount_points.push_back("/usr/" + dir);
  }
  for (const std::string& dir : mount_points) {
    struct stat st;
    if (::lstat((root + dir).c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      return {"mount point is not a directory", ENOTDIR};
    }
  }
  UniqueFd alternatives;
  if (!c.rootfs) {
    // Of the host's /usr, the directories programs need, read-only; /bin, /lib, ... are
    // symlinks into them in the template.
    if (Failure f = MountUsr(root, c); f.step) return f;
    for (const auto& dir : c.ro_binds) {  // a host whose /bin, /lib, ... are not symlinks
      if (BindWithFlags(dir.c_str(), (root + dir).c_str(), MS_RDONLY | MS_NOSUID | MS_NODEV) < 0) {
        return {"bind host directory", errno};
      }
    }
    // Debian's /usr/bin/awk, editor, ... are symlinks through /etc/alternatives: the host's,
    // read-only (symlinks only: nothing in it is secret), mounted in step 6.
    struct stat st;
    if (::lstat("/etc/alternatives", &st) == 0 && S_ISDIR(st.st_mode)) {
      alternatives.Reset(static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, "/etc/alternatives",
                                                    OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
      mount_attr attr{};
      attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
      if (!alternatives ||
          ::syscall(SYS_mount_setattr, alternatives.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) <
              0) {
        return {"bind /etc/alternatives", errno};
      }
    }
  }
  std::string tmp_opts = "size=" + std::to_string(c.tmp_mb) +
                         "m,nr_inodes=" + std::to_string(InodesFor(c.tmp_mb)) + ",mode=1777";
  if (::mount("tmpfs", (root + "/tmp").c_str(), "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts.c_str()) <
      0) {
    return {"mount /tmp", errno};
  }

  // 3. A fresh /proc for the new pid namespace, with the sensitive parts masked, and /dev.
  if (::mount("proc", (root + "/proc").c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) <
      0) {
    return {"mount /proc", errno};
  }
  if (Failure f = MaskProc(root); f.step) return f;
  if (Failure f = BindMeminfo(root, c); f.step) return f;
  if (Failure f = MakeDev(root); f.step) return f;
  if (Failure f = MakeSys(root, c); f.step) return f;

  // 4. Make the new root the root, and let go of the old one entirely.
  if (::chdir(root.c_str()) < 0) return {"chdir rootfs", errno};
  if (::syscall(SYS_pivot_root, ".", ".") < 0) return {"pivot_root", errno};
  if (::umount2(".", MNT_DETACH) < 0) return {"detach old root", errno};
  if (::chdir("/") < 0) return {"chdir /", errno};

  // 5. /etc and the home directories, in the writable layer. Only now: a path a layer made a
  //    symlink resolves inside the sandbox, never to the host's files.
  if (Failure f = WriteEtc(c, alternatives); f.step) return f;

  // 6. Identity and network: the sandbox id as hostname; loopback only, unless the host gave a
  //    network namespace (configured already, loopback up).
  if (::sethostname(c.id.data(), c.id.size()) < 0) return {"sethostname", errno};
  if (c.netns.empty() && LoopbackUp() < 0) return {"bring up loopback", errno};

  // 7. Into the sandbox's cgroups (the launcher moves us while we set up the file system; a
  //    cgroup v1 move waits out an RCU grace period, ~10 ms, which this way costs nothing),
  //    then a cgroup namespace rooted there. Limits, a session of its own, and no fd but
  //    stdio, the agent's channel (as fd 3) and the writable layer's root (as fd 4).
  char go;
  if (RetryEintr([&] { return ::read(sync_fd, &go, 1); }) != 1) return {"wait for cgroup", EIO};
  if (::unshare(CLONE_NEWCGROUP) < 0) return {"unshare cgroup namespace", errno};
  rlimit nofile{c.nofile, c.nofile}, core{0, 0};
  if (::setrlimit(RLIMIT_NOFILE, &nofile) < 0) return {"setrlimit(NOFILE)", errno};
  if (::setrlimit(RLIMIT_CORE, &core) < 0) return {"setrlimit(CORE)", errno};
  if (::setsid() < 0) return {"setsid", errno};
  if (c.channel_fd != 3) {
    if (::dup2(c.channel_fd, 3) < 0) return {"dup2 channel", errno};
  } else if (::fcntl(3, F_SETFD, 0) < 0) {
    return {"keep channel", errno};
  }
  // The report pipe and the agent binary's fd are close-on-exec; everything else goes now.
  if (::syscall(SYS_close_range, 4u, ~0u, CLOSE_RANGE_CLOEXEC) < 0) return {"close_range", errno};
  if (::dup2(disk_fd.get(), kWritableLayerFd) < 0) return {"keep writable layer", errno};

  // 8. No privilege can be gained again; capabilities cut to the agent's few; seccomp last.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return {"no_new_privs", errno};
  if (SetCapabilities() < 0) return {"capabilities", errno};
  if (int err = runtime::InstallSeccomp(seccomp.prog()); err != 0) return {"seccomp", err};

  // 9. The agent, as PID 1, from the fd opened before pivot_root (it is not in the sandbox's
  //    file system at all).
  ::syscall(SYS_execveat, agent_fd, "", argv.data(), envp.data(), AT_EMPTY_PATH);
  return {"execve agent", errno};
}

// Detached, read-only, idmapped copies of the layer directories (nullptr), or the step that
// failed (errno set).
const char* IdmapLayers(const std::vector<std::string>& dirs, const std::string& userns_path,
                        std::vector<UniqueFd>& out) {
  if (dirs.empty()) return nullptr;
  UniqueFd userns(::open(userns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!userns) return "open user namespace";
  for (const std::string& dir : dirs) {
    UniqueFd tree(static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, dir.c_str(),
                                             OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
    if (!tree) return "open layer";
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    attr.userns_fd = static_cast<uint64_t>(userns.get());
    if (::syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) {
      return "idmap layer";
    }
    out.push_back(std::move(tree));
  }
  return nullptr;
}

int SendGo(int sock, const std::vector<UniqueFd>& layers) {
  char go = 'g';
  iovec iov{&go, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxLayers)]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!layers.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * layers.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      int fd = layers[i].get();
      std::memcpy(CMSG_DATA(cm) + i * sizeof(int), &fd, sizeof fd);
    }
  }
  return RetryEintr([&] { return ::sendmsg(sock, &msg, MSG_NOSIGNAL); }) == 1 ? 0 : -1;
}

}  // namespace

std::string FormatReport(const LaunchReport& r) {
  if (r.failed_step.empty()) return "ok " + std::to_string(r.pid) + "\n";
  std::string step = r.failed_step;
  for (char& ch : step) {
    if (ch == ' ') ch = '_';
  }
  return "error " + step + " " + std::to_string(r.err) + " " + std::to_string(r.pid) + "\n";
}

Result<LaunchReport> ParseReport(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  auto bad = [&] {
    return Fail(ErrorCode::kInternal, "the jail launcher reported '" + std::string(line) + "'");
  };
  LaunchReport r;
  if (line.starts_with("ok ")) {
    auto v = line.substr(3);
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), r.pid);
    if (ec != std::errc() || end != v.data() + v.size() || r.pid <= 0) return bad();
    return r;
  }
  if (!line.starts_with("error ")) return bad();
  // "<step with underscores> <errno> <pid>"
  auto rest = line.substr(6);
  size_t sp2 = rest.rfind(' ');
  if (sp2 == std::string_view::npos) return bad();
  size_t sp1 = rest.rfind(' ', sp2 - 1);
  if (sp1 == std::string_view::npos || sp1 == 0 || sp2 == 0) return bad();
  r.failed_step = std::string(rest.substr(0, sp1));
  for (char& ch : r.failed_step) {
    if (ch == '_') ch = ' ';
  }
  auto number = [](std::string_view v, auto& out) {
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    return ec == std::errc() && end == v.data() + v.size();
  };
  if (!number(rest.substr(sp1 + 1, sp2 - sp1 - 1), r.err) || !number(rest.substr(sp2 + 1), r.pid)) {
    return bad();
  }
  return r;
}

LaunchReport Launch(const JailConfig& c) {
  pid_t pid = 0;  // the sandbox process, once cloned: a failure report names it for reaping
  auto fail = [&](const char* step, int err) { return LaunchReport{pid, step, err}; };

  // Everything that can fail or allocate happens before the clone.
  std::string bpf;
  char buf[4096];
  for (ssize_t n;
       (n = ::pread(c.seccomp_fd, buf, sizeof buf, static_cast<off_t>(bpf.size()))) != 0;) {
    if (n < 0) return fail("read seccomp program", errno);
    bpf.append(buf, static_cast<size_t>(n));
  }
  auto seccomp = runtime::SeccompProgram::FromBytes(bpf);
  if (!seccomp) return fail("read seccomp program", EINVAL);
  UniqueFd agent(::open(c.agent_path.c_str(), O_PATH | O_CLOEXEC));
  if (!agent) return fail("open agent binary", errno);
  std::vector<std::string> args = {"airlock-agent"};
  args.insert(args.end(), c.agent_args.begin(), c.agent_args.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  static char kPath[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  envp = {kPath, nullptr};
  if (c.layers.size() > kMaxLayers) return fail("too many layers", E2BIG);
  int sync[2], report[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sync) < 0 ||
      ::pipe2(report, O_CLOEXEC) < 0) {
    return fail("pipe", errno);
  }
  UniqueFd sync_r(sync[0]), sync_w(sync[1]), report_r(report[0]), report_w(report[1]);

  // A network namespace the host made is joined here, by the launcher (root on the host, which
  // the sandbox never is), and inherited by the clone.
  if (!c.netns.empty()) {
    UniqueFd netns(::open(c.netns.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns) return fail("open network namespace", errno);
    if (::setns(netns.get(), CLONE_NEWNET) < 0) return fail("join network namespace", errno);
  }
  const unsigned long kFlags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS |
                               CLONE_NEWIPC | CLONE_PARENT | (c.netns.empty() ? CLONE_NEWNET : 0);
  // The launcher's exit signal (SIGCHLD) goes to our parent with CLONE_PARENT.
  pid = static_cast<pid_t>(::syscall(SYS_clone, kFlags, nullptr, nullptr, nullptr, 0));
  if (pid < 0) {
    pid = 0;
    return fail("clone", errno);
  }
  if (pid == 0) {
    sync_w.Reset();
    report_r.Reset();
    Failure f = ContainProcess(c, sync_r.get(), agent.get(), *seccomp, argv, envp);
    FailureRecord rec{};
    std::strncpy(rec.step, f.step, sizeof rec.step - 1);
    rec.err = f.err;
    (void)!::write(report_w.get(), &rec, sizeof rec);
    _exit(1);
  }
  sync_r.Reset();
  report_w.Reset();

  // Ids 0..65535 of the sandbox are uid_base.. on the host: root inside is nobody outside.
  std::string map = "0 " + std::to_string(c.uid_base) + " 65536\n";
  std::string proc = "/proc/" + std::to_string(pid);
  for (const char* file : {"/uid_map", "/gid_map"}) {
    UniqueFd fd(::open((proc + file).c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || !WriteAll(fd.get(), map)) {
      int err = errno;
      ::kill(pid, SIGKILL);
      return fail("write id map", err);
    }
  }
  // The layers, mounted idmapped into the sandbox's user namespace (which only the host's
  // root may do) and handed over with the go-ahead; the sandbox mounts them in its own tree.
  std::vector<UniqueFd> layers;
  if (auto step = IdmapLayers(c.layers, proc + "/ns/user", layers); step) {
    int err = errno;
    ::kill(pid, SIGKILL);
    return fail(step, err);
  }
  if (SendGo(sync_w.get(), layers) < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    return fail("release sandbox", err);
  }
  layers.clear();
  // Into the sandbox's cgroups, while it mounts; it goes no further than that until told.
  std::string pid_text = std::to_string(pid);
  const char* join_failed = nullptr;
  int join_err = 0;
  for (const auto& procs : c.cgroup_procs) {
    UniqueFd fd(::open(procs.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || !WriteAll(fd.get(), pid_text)) {
      join_failed = "join cgroup";
      join_err = errno;
      break;
    }
  }
  if (!join_failed && ::write(sync_w.get(), "c", 1) != 1) {
    join_failed = "release sandbox";
    join_err = errno;
  }
  if (join_failed) ::kill(pid, SIGKILL);
  sync_w.Reset();
  // End of file on the report pipe: the sandbox exec'd the agent (the pipe is close-on-exec).
  FailureRecord rec{};
  ssize_t n = RetryEintr([&] { return ::read(report_r.get(), &rec, sizeof rec); });
  if (n == static_cast<ssize_t>(sizeof rec)) {
    rec.step[sizeof rec.step - 1] = '\0';
    return fail(rec.step[0] ? rec.step : "setup", rec.err);  // its own failure comes first
  }
  if (join_failed) return fail(join_failed, join_err);
  if (n != 0) return fail("read setup report", n < 0 ? errno : EIO);
  // Or it died without a word (killed from outside, or the agent failed at once).
  std::string state = ReadFileToString(proc + "/stat", 4096).value_or("");
  size_t paren = state.rfind(')');
  if (paren == std::string::npos || state.compare(paren + 2, 1, "Z") == 0) {
    return fail("start agent", ECHILD);
  }
  return LaunchReport{pid, "", 0};
}

}  // namespace airlock::jail
