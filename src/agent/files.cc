#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/syscall.h"

namespace airlock::agent {
namespace {

constexpr int kMaxRemoveDepth = 256;

std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

protocol::FileInfo ToFileInfo(std::string name, const struct stat& st) {
  protocol::FileInfo f;
  f.name = std::move(name);
  f.type = S_ISREG(st.st_mode)   ? protocol::FileType::kFile
           : S_ISDIR(st.st_mode) ? protocol::FileType::kDirectory
           : S_ISLNK(st.st_mode) ? protocol::FileType::kSymlink
                                 : protocol::FileType::kOther;
  f.mode = st.st_mode & 07777;
  f.size = static_cast<uint64_t>(st.st_size);
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  f.uid = st.st_uid;
  f.gid = st.st_gid;
  return f;
}

// Describes `name` in `dirfd` without following a symlink.
Result<protocol::FileInfo> StatAt(int dirfd, const std::string& name, std::string shown) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    return FailErrno("stat " + shown, errno);
  }
  auto info = ToFileInfo(std::move(shown), st);
  if (S_ISLNK(st.st_mode)) {
    char target[protocol::kMaxPathLength];
    ssize_t n = ::readlinkat(dirfd, name.c_str(), target, sizeof target);
    if (n > 0) info.link_target.assign(target, static_cast<size_t>(n));
  }
  return info;
}

// The entry names of a directory, without "." and "..".
Result<std::vector<std::string>> ReadNames(int dirfd) {
  int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
  if (dup < 0) return FailErrno("dup", errno);
  DIR* dir = ::fdopendir(dup);
  if (!dir) {
    int err = errno;
    ::close(dup);
    return FailErrno("fdopendir", err);
  }
  ::rewinddir(dir);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(dir)) {
    std::string_view n(e->d_name);
    if (n != "." && n != "..") names.emplace_back(n);
  }
  int err = errno;
  ::closedir(dir);
  if (err) return FailErrno("readdir", err);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes everything inside `dirfd`, depth first, never following a symlink.
Result<uint64_t> RemoveContents(int dirfd, int depth) {
  if (depth > kMaxRemoveDepth) {
    return Fail(ErrorCode::kInvalidArgument,
                "directory tree is deeper than " + std::to_string(kMaxRemoveDepth) + " levels");
  }
  auto names = ReadNames(dirfd);
  if (!names) return std::unexpected(names.error());
  uint64_t removed = 0;
  for (const auto& name : *names) {
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT) continue;
      return FailErrno("stat " + name, errno);
    }
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) return FailErrno("open " + name, errno);
      auto n = RemoveContents(sub.get(), depth + 1);
      if (!n) return std::unexpected(n.error().Wrap(name));
      removed += *n;
      if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) < 0)
        return FailErrno("rmdir " + name, errno);
    } else if (::unlinkat(dirfd, name.c_str(), 0) < 0 && errno != ENOENT) {
      return FailErrno("unlink " + name, errno);
    }
    ++removed;
  }
  return removed;
}

}  // namespace

Result<FileRoot> FileRoot::Open(const std::string& root,
                                std::optional<std::pair<uid_t, gid_t>> owner) {
  UniqueFd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return FailErrno("opening file root " + root, errno);
  FileRoot r(std::move(fd), owner);
  struct stat of_root, of_process_root;
  r.is_process_root_ = ::fstat(r.root_.get(), &of_root) == 0 &&
                       ::stat("/", &of_process_root) == 0 && of_root.st_dev == of_process_root.st_dev &&
                       of_root.st_ino == of_process_root.st_ino;
  return r;
}

Result<UniqueFd> FileRoot::Resolve(const std::string& path, int flags, mode_t mode) const {
  std::string rel = path;
  rel.erase(0, rel.find_first_not_of('/'));
  if (rel.empty()) rel = ".";
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0;; ++attempt) {
    long fd = ::syscall(SYS_openat2, root_.get(), rel.c_str(), &how, sizeof how);
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    // A kernel without openat2 (gVisor's): a root that is the agent's own "/" needs no
    // confinement (every path resolves inside it anyway); any other root fails closed.
    if (errno == ENOSYS && is_process_root_) {
      fd = ::openat(root_.get(), rel.c_str(), static_cast<int>(how.flags), how.mode);
      if (fd >= 0) return UniqueFd(static_cast<int>(fd));
      return FailErrno(path, errno);
    }
    // EAGAIN: a rename raced the lookup; the kernel asks for a retry.
    if ((errno == EAGAIN || errno == EINTR) && attempt < 32) continue;
    return FailErrno(path, errno);
  }
}

Result<std::pair<UniqueFd, std::string>> FileRoot::ResolveParent(const std::string& path) const {
  auto parts = Components(path);
  if (parts.empty()) {
    auto fd = Resolve(".", O_PATH | O_DIRECTORY);
    if (!fd) return std::unexpected(fd.error());
    return std::make_pair(std::move(*fd), std::string());
  }
  const std::string& last = parts.back();
  if (last == "." || last == "..") {
    return Fail(ErrorCode::kInvalidArgument, path + ": path must not end in '.' or '..'");
  }
  auto dir = Resolve(Join(parts, parts.size() - 1), O_PATH | O_DIRECTORY);
  if (!dir) return std::unexpected(dir.error());
  return std::make_pair(std::move(*dir), last);
}

void FileRoot::Chown(int fd) const {
  // Best effort: a failure leaves the file owned by the agent, which is still usable by root.
  if (owner_) (void)::fchown(fd, owner_->first, owner_->second);
}

Status FileRoot::MkdirAll(const std::string& path, uint32_t mode) const {
  auto parts = Components(path);
  for (size_t i = 1; i <= parts.size(); ++i) {
    std::string prefix = Join(parts, i);
    if (Resolve(prefix, O_PATH | O_DIRECTORY)) continue;
    auto parent = Resolve(Join(parts, i - 1), O_PATH | O_DIRECTORY);
    if (!parent) return std::unexpected(parent.error());
    if (::mkdirat(parent->get(), parts[i - 1].c_str(), mode) < 0 && errno != EEXIST) {
      return FailErrno("mkdir " + prefix, errno);
    }
    auto made = Resolve(prefix, O_RDONLY | O_DIRECTORY);
    if (!made) return std::unexpected(made.error());
    Chown(made->get());
  }
  return {};
}

Result<UniqueFd> FileRoot::OpenForWrite(const std::string& path, uint32_t mode, bool create_parents,
                                        bool append) const {
  auto parts = Components(path);
  if (parts.empty() || parts.back() == "." || parts.back() == "..") {
    return Fail(ErrorCode::kInvalidArgument, path + ": not a file path");
  }
  if (create_parents) {
    if (auto st = MkdirAll(Join(parts, parts.size() - 1), 0755); !st) {
      return std::unexpected(st.error());
    }
  }
  int flags = O_WRONLY | (append ? O_APPEND : 0);
  // A new file is regular by construction; an existing one goes through the type check.
  auto fd = Resolve(path, flags | O_CREAT | O_EXCL | O_NOCTTY, mode);
  if (fd) {
    Chown(fd->get());
    return fd;
  }
  if (fd.error().sys_errno() != EEXIST) return std::unexpected(fd.error());
  fd = OpenRegular(path, flags);
  if (!fd) return std::unexpected(fd.error());
  if (!append && ::ftruncate(fd->get(), 0) < 0) return FailErrno("truncate " + path, errno);
  return fd;
}

Result<UniqueFd> FileRoot::OpenForRead(const std::string& path) const {
  return OpenRegular(path, O_RDONLY);
}

Result<UniqueFd> FileRoot::OpenRegular(const std::string& path, int flags) const {
  // Resolved as an O_PATH handle first: a FIFO or device is refused before it is ever opened
  // (opening one can block, or have side effects, such as arming /dev/watchdog).
  auto handle = Resolve(path, O_PATH);
  if (!handle) return std::unexpected(handle.error());
  struct stat st;
  if (::fstat(handle->get(), &st) < 0) return FailErrno("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) return Fail(ErrorCode::kInvalidArgument, path + ": is a directory");
  if (!S_ISREG(st.st_mode)) {
    return Fail(ErrorCode::kInvalidArgument, path + ": not a regular file");
  }
  // Reopened through the agent's own fd link: the very inode checked above, whatever a
  // sandbox process renames meanwhile.
  std::string self = "/proc/self/fd/" + std::to_string(handle->get());
  UniqueFd fd(::open(self.c_str(), flags | O_NOCTTY | O_CLOEXEC));
  if (!fd) return FailErrno("open " + path, errno);
  return fd;
}

Result<protocol::FileInfo> FileRoot::Stat(const std::string& path) const {
  auto parent = ResolveParent(path);
  if (!parent) return std::unexpected(parent.error());
  auto& [dir, name] = *parent;
  if (name.empty()) {
    struct stat st;
    if (::fstat(dir.get(), &st) < 0) return FailErrno("stat " + path, errno);
    return ToFileInfo(path, st);
  }
  return StatAt(dir.get(), name, path);
}

Result<std::vector<protocol::FileInfo>> FileRoot::List(const std::string& path) const {
  auto dir = Resolve(path, O_RDONLY | O_DIRECTORY);
  if (!dir) return std::unexpected(dir.error());
  auto names = ReadNames(dir->get());
  if (!names) return std::unexpected(names.error().Wrap("list " + path));
  std::vector<protocol::FileInfo> out;
  out.reserve(names->size());
  for (const auto& name : *names) {
    auto info = StatAt(dir->get(), name, name);
    if (info) out.push_back(std::move(*info));  // an entry removed meanwhile is skipped
  }
  return out;
}

Result<uint64_t> FileRoot::Remove(const std::string& path, bool recursive) const {
  auto parent = ResolveParent(path);
  if (!parent) return std::unexpected(parent.error());
  auto& [dir, name] = *parent;
  if (name.empty()) return Fail(ErrorCode::kInvalidArgument, "the root cannot be removed");
  struct stat st;
  if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    return FailErrno("remove " + path, errno);
  }
  uint64_t removed = 0;
  if (S_ISDIR(st.st_mode)) {
    if (recursive) {
      UniqueFd sub(
          ::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) return FailErrno("remove " + path, errno);
      auto n = RemoveContents(sub.get(), 1);
      if (!n) return std::unexpected(n.error().Wrap("remove " + path));
      removed += *n;
    }
    if (::unlinkat(dir.get(), name.c_str(), AT_REMOVEDIR) < 0) {
      return FailErrno("remove " + path, errno);
    }
  } else if (::unlinkat(dir.get(), name.c_str(), 0) < 0) {
    return FailErrno("remove " + path, errno);
  }
  return removed + 1;
}

Status FileRoot::Mkdir(const std::string& path, uint32_t mode, bool parents) const {
  if (parents) return MkdirAll(path, mode);
  auto parent = ResolveParent(path);
  if (!parent) return std::unexpected(parent.error());
  auto& [dir, name] = *parent;
  if (name.empty()) return FailErrno("mkdir " + path, EEXIST);
  if (::mkdirat(dir.get(), name.c_str(), mode) < 0) return FailErrno("mkdir " + path, errno);
  UniqueFd made(::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (made) Chown(made.get());
  return {};
}

}  // namespace airlock::agent
