#include "runtime/layer_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>

#include "common/sha256.h"
#include "common/syscall.h"

namespace airlock::runtime {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kIdRange = 65536;
constexpr std::string_view kTmpPrefix = ".tmp-";
// The deepest directory nesting a layer may hold.
constexpr size_t kMaxDepth = 256;

// The extended attributes a layer keeps: the user's own (user.*), and of overlayfs's markers
// only those that mean something in a lower layer (opaque directories, whiteouts). The rest
// (origin, impure, ...) describe the upper layer they were written in.
bool KeepXattr(std::string_view name) {
  if (!name.starts_with("user.")) return false;
  if (!name.starts_with("user.overlay.")) return true;
  return name == "user.overlay.opaque" || name == "user.overlay.whiteout";
}

// name=value pairs of the kept attributes of an open file, sorted by name.
Result<std::vector<std::pair<std::string, std::string>>> ReadXattrs(int fd) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string names(4096, '\0');
  ssize_t n = ::flistxattr(fd, names.data(), names.size());
  if (n < 0 && errno == ERANGE) {
    names.resize(65536);
    n = ::flistxattr(fd, names.data(), names.size());
  }
  if (n < 0) {
    if (errno == ENOTSUP) return out;
    return FailErrno("listing extended attributes", errno);
  }
  for (size_t at = 0; at < static_cast<size_t>(n);) {
    std::string name(names.c_str() + at);
    at += name.size() + 1;
    if (!KeepXattr(name)) continue;
    std::string value(65536, '\0');
    ssize_t len = ::fgetxattr(fd, name.c_str(), value.data(), value.size());
    if (len < 0) return FailErrno("reading extended attribute " + name, errno);
    value.resize(static_cast<size_t>(len));
    out.emplace_back(std::move(name), std::move(value));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class Copier {
 public:
  // `dst_root`: the layer's root, where hard links are made from.
  Copier(uid_t id_base, int dst_root) : base_(id_base), dst_root_(dst_root) {}

  // Copies the directory `src` into the (existing, empty) directory `dst`, `rel` being its
  // path in the layer ("" for the root).
  Status CopyDir(int src, int dst, const std::string& rel, size_t depth = 0) {
    // Each level holds two open directories and a frame of this recursion: a tree made deep on
    // purpose would run the daemon out of fds or stack.
    if (depth > kMaxDepth) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "/" + rel.substr(0, 200) + "...: directories nest deeper than " +
                      std::to_string(kMaxDepth) + " levels");
    }
    std::vector<std::string> names;
    {
      int dup = ::fcntl(src, F_DUPFD_CLOEXEC, 3);
      if (dup < 0) return FailErrno("dup", errno);
      DIR* dir = ::fdopendir(dup);
      if (!dir) {
        ::close(dup);
        return FailErrno("reading directory /" + rel, errno);
      }
      ::rewinddir(dir);
      while (dirent* e = ::readdir(dir)) {
        std::string_view name = e->d_name;
        if (name != "." && name != "..") names.emplace_back(name);
      }
      ::closedir(dir);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      if (auto st = CopyEntry(src, dst, name, rel.empty() ? name : rel + "/" + name, depth);
          !st) {
        return st;
      }
    }
    return {};
  }

  // Metadata of a directory or file once its content is in place, and its manifest line
  // (`detail`: what identifies its content).
  Status FinishMetadata(int src, int dst, const struct stat& st, const std::string& rel,
                        char type, const std::string& detail = "") {
    auto owner = Owner(st, rel);
    if (!owner) return std::unexpected(owner.error());
    auto xattrs = ReadXattrs(src);
    if (!xattrs) return std::unexpected(xattrs.error().Wrap("/" + rel));
    for (const auto& [name, value] : *xattrs) {
      if (::fsetxattr(dst, name.c_str(), value.data(), value.size(), 0) < 0) {
        return FailErrno("setting " + name + " on /" + rel, errno);
      }
    }
    // Set-user-ID and set-group-ID go from files; directories keep set-group-ID and sticky.
    mode_t mode = st.st_mode & (type == 'd' ? 03777 : 01777);
    if (::fchown(dst, owner->first, owner->second) < 0 || ::fchmod(dst, mode) < 0) {
      return FailErrno("setting the owner and mode of /" + rel, errno);
    }
    const timespec times[2] = {st.st_atim, st.st_mtim};
    if (::futimens(dst, times) < 0) return FailErrno("setting the times of /" + rel, errno);
    Record(rel, type, mode, *owner, detail + XattrsText(*xattrs));
    return {};
  }

  std::string Manifest() const { return manifest_; }
  uint64_t files() const { return files_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Result<std::pair<uid_t, gid_t>> Owner(const struct stat& st, const std::string& rel) const {
    if (st.st_uid < base_ || st.st_uid - base_ >= kIdRange || st.st_gid < base_ ||
        st.st_gid - base_ >= kIdRange) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "/" + rel + " is owned by host ids " + std::to_string(st.st_uid) + ":" +
                      std::to_string(st.st_gid) + ", outside the sandbox's range");
    }
    return std::pair<uid_t, gid_t>{st.st_uid - base_, st.st_gid - base_};
  }

  static std::string XattrsText(const std::vector<std::pair<std::string, std::string>>& xattrs) {
    std::string text;
    for (const auto& [name, value] : xattrs) {
      Sha256 h;
      h.Update(value);
      text += " " + name + "=" + h.Hex();
    }
    return text;
  }

  // One manifest line per entry; the layer's digest is the hash of them all.
  void Record(const std::string& rel, char type, mode_t mode, std::pair<uid_t, gid_t> owner,
              const std::string& detail) {
    ++files_;
    manifest_ += std::string(1, type) + " " + std::to_string(mode) + " " +
                 std::to_string(owner.first) + ":" + std::to_string(owner.second) + " " +
                 std::to_string(rel.size()) + ":" + rel + detail + "\n";
  }

  Status CopyEntry(int src, int dst, const std::string& name, const std::string& rel,
                   size_t depth) {
    struct stat st;
    if (::fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      return FailErrno("stat /" + rel, errno);
    }
    switch (st.st_mode & S_IFMT) {
      case S_IFDIR: {
        if (::mkdirat(dst, name.c_str(), 0700) < 0) return FailErrno("mkdir /" + rel, errno);
        UniqueFd from(::openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        UniqueFd to(::openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!from || !to) return FailErrno("opening directory /" + rel, errno);
        if (auto copied = CopyDir(from.get(), to.get(), rel, depth + 1); !copied) return copied;
        return FinishMetadata(from.get(), to.get(), st, rel, 'd');
      }
      case S_IFREG: {
        // Hard links stay links: copied apart, a million links to one big file would fill the
        // host's disk from a sandbox's small tmpfs.
        std::pair<dev_t, ino_t> inode{st.st_dev, st.st_ino};
        if (st.st_nlink > 1) {
          if (auto seen = links_.find(inode); seen != links_.end()) {
            if (::linkat(dst_root_, seen->second.c_str(), dst, name.c_str(), 0) < 0) {
              return FailErrno("linking /" + rel + " to /" + seen->second, errno);
            }
            auto owner = Owner(st, rel);
            if (!owner) return std::unexpected(owner.error());
            Record(rel, 'h', 0, *owner, " " + std::to_string(seen->second.size()) + ":" +
                                            seen->second);
            return {};
          }
          links_.emplace(inode, rel);
        }
        UniqueFd from(::openat(src, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
        if (!from) return FailErrno("opening /" + rel, errno);
        UniqueFd to(
            ::openat(dst, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!to) return FailErrno("creating /" + rel, errno);
        Sha256 content;
        std::string buf(1 << 17, '\0');
        uint64_t size = 0;
        for (;;) {
          ssize_t n = RetryEintr([&] { return ::read(from.get(), buf.data(), buf.size()); });
          if (n < 0) return FailErrno("reading /" + rel, errno);
          if (n == 0) break;
          std::string_view piece(buf.data(), static_cast<size_t>(n));
          content.Update(piece);
          if (auto st2 = WriteAll(to.get(), piece); !st2) return st2;
          size += static_cast<uint64_t>(n);
        }
        bytes_ += size;
        return FinishMetadata(from.get(), to.get(), st, rel, 'f',
                              " " + std::to_string(size) + " " + content.Hex());
      }
      case S_IFLNK: {
        std::string target(PATH_MAX, '\0');
        ssize_t n = ::readlinkat(src, name.c_str(), target.data(), target.size());
        if (n < 0) return FailErrno("readlink /" + rel, errno);
        target.resize(static_cast<size_t>(n));
        auto owner = Owner(st, rel);
        if (!owner) return std::unexpected(owner.error());
        if (::symlinkat(target.c_str(), dst, name.c_str()) < 0 ||
            ::fchownat(dst, name.c_str(), owner->first, owner->second, AT_SYMLINK_NOFOLLOW) < 0) {
          return FailErrno("symlink /" + rel, errno);
        }
        const timespec times[2] = {st.st_atim, st.st_mtim};
        (void)::utimensat(dst, name.c_str(), times, AT_SYMLINK_NOFOLLOW);
        Record(rel, 'l', 0777, *owner, " " + std::to_string(target.size()) + ":" + target);
        return {};
      }
      case S_IFCHR:
      case S_IFIFO: {
        const bool whiteout = S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0);
        if (S_ISCHR(st.st_mode) && !whiteout) return {};  // a device node: not kept
        auto owner = Owner(st, rel);
        if (!owner) return std::unexpected(owner.error());
        mode_t mode = st.st_mode & 0777;
        if (::mknodat(dst, name.c_str(), (st.st_mode & S_IFMT) | mode, st.st_rdev) < 0 ||
            ::fchownat(dst, name.c_str(), owner->first, owner->second, AT_SYMLINK_NOFOLLOW) < 0) {
          return FailErrno("mknod /" + rel, errno);
        }
        Record(rel, whiteout ? 'w' : 'p', mode, *owner, "");
        return {};
      }
      default:
        return {};  // sockets and block devices are not kept
    }
  }

  uid_t base_;
  int dst_root_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;  // inode -> its first path, copied
  std::string manifest_;
  uint64_t files_ = 0, bytes_ = 0;
};

std::string RandomSuffix() {
  unsigned char raw[8];
  if (::getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw)) return "0";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace

Status ValidateLayerDigest(std::string_view digest) {
  bool ok = digest.size() == 64 && std::all_of(digest.begin(), digest.end(), [](char c) {
              return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
            });
  if (!ok) {
    return Fail(ErrorCode::kInvalidArgument,
                "'" + std::string(digest.substr(0, 80)) + "' is not a layer digest (64 hex digits)");
  }
  return {};
}

Status LayerStore::Prepare() const {
  std::error_code made;
  fs::create_directories(fs::path(root_).parent_path(), made);
  if (made) return FailErrno("making the parent of " + root_, made.value());
  if (::mkdir(root_.c_str(), 0700) < 0 && errno != EEXIST) return FailErrno("mkdir " + root_, errno);
  if (::chmod(root_.c_str(), 0700) < 0) return FailErrno("chmod " + root_, errno);
  // What interrupted imports left in staging; 0700 like the layers (its trees are a sandbox's
  // ids).
  std::error_code cleared;
  fs::remove_all(staging_, cleared);
  if (cleared) return FailErrno("clearing " + staging_, cleared.value());
  if (::mkdir(staging_.c_str(), 0700) < 0) return FailErrno("mkdir " + staging_, errno);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    if (entry.path().filename().string().starts_with(kTmpPrefix)) {
      std::error_code ignored;
      fs::remove_all(entry.path(), ignored);
    }
  }
  if (ec) return Fail(ErrorCode::kInternal, "listing " + root_ + ": " + ec.message());
  return {};
}

bool LayerStore::Has(std::string_view digest) const {
  if (!ValidateLayerDigest(digest)) return false;
  struct stat st;
  return ::stat(Path(digest).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<LayerSnapshot> LayerStore::Import(int src, uid_t id_base) const {
  const std::string tmp = root_ + "/" + std::string(kTmpPrefix) + RandomSuffix();
  if (::mkdir(tmp.c_str(), 0700) < 0) return FailErrno("mkdir " + tmp, errno);
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  UniqueFd to(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat root_stat;
  if (!to || ::fstat(src, &root_stat) < 0) {
    cleanup();
    return FailErrno("opening the layer's directories", errno);
  }
  Copier copier(id_base, to.get());
  Status copied = copier.CopyDir(src, to.get(), "");
  if (copied) copied = copier.FinishMetadata(src, to.get(), root_stat, "", 'd');
  if (!copied) {
    cleanup();
    return std::unexpected(copied.error().Wrap("copying a layer"));
  }
  Sha256 manifest;
  manifest.Update(copier.Manifest());
  LayerSnapshot result{manifest.Hex(), copier.files(), copier.bytes(), false};
  // Content addressed: the same tree is the same layer, and the first copy stays.
  if (::rename(tmp.c_str(), Path(result.digest).c_str()) < 0) {
    int err = errno;
    cleanup();
    if ((err == EEXIST || err == ENOTEMPTY) && Has(result.digest)) {
      result.existed = true;
      return result;
    }
    return FailErrno("storing layer " + result.digest, err);
  }
  return result;
}

Result<LayerSnapshot> LayerStore::ImportTree(
    const std::function<Status(const std::string& dir)>& fill) const {
  std::string dir = staging_ + "/import-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return FailErrno("making a staging directory", errno);
  auto imported = [&]() -> Result<LayerSnapshot> {
    if (auto st = fill(dir); !st) return std::unexpected(st.error());
    UniqueFd src(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!src) return FailErrno("opening " + dir, errno);
    return Import(src.get(), 0);
  }();
  std::error_code ec;
  fs::remove_all(dir, ec);  // what this leaves, the next Prepare removes
  if (!imported) return std::unexpected(imported.error().Wrap("importing a root file system"));
  return imported;
}

Status LayerStore::Remove(std::string_view digest) const {
  if (auto st = ValidateLayerDigest(digest); !st) return st;
  // Renamed out of the way first, so that a half-removed layer is never mistaken for one.
  const std::string doomed = root_ + "/" + std::string(kTmpPrefix) + RandomSuffix();
  if (::rename(Path(digest).c_str(), doomed.c_str()) < 0) {
    if (errno == ENOENT) return {};
    return FailErrno("removing layer " + std::string(digest), errno);
  }
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (ec) return Fail(ErrorCode::kInternal, "removing " + doomed + ": " + ec.message());
  return {};
}

Result<std::vector<std::string>> LayerStore::List() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    std::string name = entry.path().filename().string();
    if (ValidateLayerDigest(name)) out.push_back(std::move(name));
  }
  if (ec) return Fail(ErrorCode::kInternal, "listing " + root_ + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace airlock::runtime
