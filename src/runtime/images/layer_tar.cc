#include "runtime/images/layer_tar.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/syscall.h"
#include "common/sha256.h"

namespace airlock::images {
namespace {

constexpr std::string_view kWhiteoutPrefix = ".wh.";
constexpr std::string_view kOpaqueMarker = ".wh..wh..opq";
// aufs's own bookkeeping (.wh..wh.plnk, .wh..wh.aufs): never part of the image's tree.
constexpr std::string_view kAufsPrefix = ".wh..wh.";
// What a layer may carry after its end-of-archive marker: tar writers pad to their record size
// (GNU tar: 10 KiB by default), nothing more.
constexpr uint64_t kMaxTrailingBytes = 4 << 20;
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// Errnos that mean the host failed rather than that the layer asked for something impossible.
bool IsHostFailure(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EROFS:
      return true;
    default:
      return false;
  }
}

// An errno from doing what an entry asks: the layer's fault (kInvalidArgument) unless the host
// failed.
Error EntryError(std::string_view what, int err) {
  Error e = ErrnoError(what, err);
  if (IsHostFailure(err)) return e;
  return Error(ErrorCode::kInvalidArgument, e.message(), err);
}

std::string ArchiveMessage(archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "unknown error";
}

// A reader with the decompressors every archive may use and nothing else.
Result<ArchiveReader> NewReader() {
  ArchiveReader a(archive_read_new());
  if (!a) return Fail(ErrorCode::kInternal, "archive_read_new failed");
  // ARCHIVE_WARN here means libarchive would run an external program for the filter: a
  // decompressor outside the daemon's control, fed by whoever made the image.
  if (archive_read_support_filter_gzip(a.get()) != ARCHIVE_OK ||
      archive_read_support_filter_zstd(a.get()) != ARCHIVE_OK ||
      archive_read_support_filter_xz(a.get()) != ARCHIVE_OK ||
      archive_read_support_filter_bzip2(a.get()) != ARCHIVE_OK) {
    return Fail(ErrorCode::kInternal,
                "this libarchive has no built-in gzip, zstd, xz or bzip2 decompressor");
  }
  return a;
}

Result<std::pair<uid_t, gid_t>> Owner(archive_entry* entry) {
  const int64_t uid = archive_entry_uid(entry), gid = archive_entry_gid(entry);
  constexpr int64_t kMaxId = 0xfffffffe;  // (uid_t)-1 means "leave as is" to chown
  if (uid < 0 || uid > kMaxId || gid < 0 || gid > kMaxId) {
    return Fail(ErrorCode::kInvalidArgument,
                "owner " + std::to_string(uid) + ":" + std::to_string(gid) + " is out of range");
  }
  return std::pair<uid_t, gid_t>{static_cast<uid_t>(uid), static_cast<gid_t>(gid)};
}

timespec Mtime(archive_entry* entry) {
  if (!archive_entry_mtime_is_set(entry)) return {0, UTIME_OMIT};
  long nsec = archive_entry_mtime_nsec(entry);
  if (nsec < 0 || nsec > 999'999'999) nsec = 0;
  return {archive_entry_mtime(entry), nsec};
}

// Sets the owner, then the mode (chown clears set-user-ID), then the mtime of an open file.
Status SetMetadata(int fd, std::pair<uid_t, gid_t> owner, mode_t mode, const timespec* mtime) {
  if (::fchown(fd, owner.first, owner.second) < 0) return FailErrno("chown", errno);
  if (::fchmod(fd, mode) < 0) return FailErrno("chmod", errno);
  if (mtime && mtime->tv_nsec != UTIME_OMIT) {
    const timespec times[2] = {{0, UTIME_OMIT}, *mtime};
    if (::futimens(fd, times) < 0) return FailErrno("setting the mtime", errno);
  }
  return {};
}

enum class EntryKind {
  kNode,      // extracted
  kWhiteout,  // .wh.<name>: <name> in the same directory goes
  kOpaque,    // .wh..wh..opq: what lower layers put in the directory goes
  kIgnored,   // aufs bookkeeping
};

Result<EntryKind> Classify(const std::string& name) {
  auto [dir, base] = SplitParent(name);
  for (size_t at = 0; at < dir.size();) {
    size_t slash = std::min(dir.find('/', at), dir.size());
    if (std::string_view(dir).substr(at, slash - at).starts_with(kWhiteoutPrefix)) {
      return Fail(ErrorCode::kInvalidArgument, "a whiteout cannot have entries under it");
    }
    at = slash + 1;
  }
  if (!base.starts_with(kWhiteoutPrefix)) return EntryKind::kNode;
  if (base == kOpaqueMarker) return EntryKind::kOpaque;
  if (base.starts_with(kAufsPrefix)) return EntryKind::kIgnored;
  std::string_view target = std::string_view(base).substr(kWhiteoutPrefix.size());
  if (target.empty() || target == "." || target == "..") {
    return Fail(ErrorCode::kInvalidArgument, "the whiteout names nothing to delete");
  }
  return EntryKind::kWhiteout;
}

// The decompressed bytes of a layer, handed to a tar reader and hashed on the way, so that the
// layer's diff id comes from the same read that checks its entries.
class HashingSource {
 public:
  [[nodiscard]] Status Open(int fd) {
    auto raw = NewReader();
    if (!raw) return std::unexpected(raw.error());
    raw_ = std::move(*raw);
    if (archive_read_support_format_raw(raw_.get()) != ARCHIVE_OK ||
        archive_read_support_format_empty(raw_.get()) != ARCHIVE_OK ||
        archive_read_open_fd(raw_.get(), fd, 1 << 16) != ARCHIVE_OK) {
      return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + ArchiveMessage(raw_.get()));
    }
    archive_entry* entry;
    int r = archive_read_next_header(raw_.get(), &entry);
    if (r == ARCHIVE_EOF) {
      eof_ = true;  // an empty file: an empty layer
    } else if (r != ARCHIVE_OK) {
      return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + ArchiveMessage(raw_.get()));
    }
    return {};
  }

  // A tar reader over the decompressed bytes.
  [[nodiscard]] Result<ArchiveReader> OpenTar() {
    ArchiveReader tar(archive_read_new());
    if (!tar) return Fail(ErrorCode::kInternal, "archive_read_new failed");
    if (archive_read_support_format_tar(tar.get()) != ARCHIVE_OK ||
        archive_read_support_format_empty(tar.get()) != ARCHIVE_OK ||
        archive_read_open(tar.get(), this, nullptr, &HashingSource::Read, nullptr) != ARCHIVE_OK) {
      return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + ArchiveMessage(tar.get()));
    }
    return tar;
  }

  // Reads what the tar reader left (the padding after the end marker) and returns the digest.
  [[nodiscard]] Result<std::string> Finish() {
    uint64_t trailing = 0;
    while (!eof_) {
      const void* block;
      auto n = Next(&block);
      if (!n) return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + error_);
      trailing += *n;
      if (trailing > kMaxTrailingBytes) {
        return Fail(ErrorCode::kInvalidArgument,
                    "the layer has more than 4 MiB of data after its end-of-archive marker");
      }
    }
    return "sha256:" + hash_.Hex();
  }

 private:
  // The next block of decompressed bytes (0 bytes at the end), hashed.
  Result<size_t> Next(const void** block) {
    while (!eof_) {
      size_t len = 0;
      la_int64_t offset = 0;
      int r = archive_read_data_block(raw_.get(), block, &len, &offset);
      if (r == ARCHIVE_EOF) {
        eof_ = true;
        break;
      }
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        error_ = ArchiveMessage(raw_.get());
        return std::unexpected(Error(ErrorCode::kInvalidArgument, error_));
      }
      if (offset != static_cast<la_int64_t>(pos_)) {
        error_ = "the decompressed stream has a gap";
        return std::unexpected(Error(ErrorCode::kInvalidArgument, error_));
      }
      if (len == 0) continue;
      hash_.Update(*block, len);
      pos_ += len;
      return len;
    }
    return 0;
  }

  static la_ssize_t Read(archive* tar, void* self_ptr, const void** block) {
    auto* self = static_cast<HashingSource*>(self_ptr);
    auto n = self->Next(block);
    if (!n) {
      archive_set_error(tar, EINVAL, "%s", self->error_.c_str());
      return -1;
    }
    return static_cast<la_ssize_t>(*n);
  }

  ArchiveReader raw_;
  Sha256 hash_;
  uint64_t pos_ = 0;
  bool eof_ = false;
  std::string error_;
};

Status PwriteAll(int fd, const char* data, size_t size, off_t offset) {
  while (size > 0) {
    ssize_t n = RetryEintr([&] { return ::pwrite(fd, data, size, offset); });
    if (n < 0) return FailErrno("write", errno);
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return {};
}

}  // namespace

Result<std::string> CleanName(std::string_view name) {
  if (name.starts_with('/')) return Fail(ErrorCode::kInvalidArgument, "the name is absolute");
  std::string out;
  size_t depth = 0;
  for (size_t at = 0; at < name.size();) {
    size_t slash = std::min(name.find('/', at), name.size());
    std::string_view component = name.substr(at, slash - at);
    at = slash + 1;
    if (component.empty() || component == ".") continue;
    if (component == "..") {
      return Fail(ErrorCode::kInvalidArgument, "the name has a '..' component");
    }
    if (component.size() > NAME_MAX) {
      return Fail(ErrorCode::kInvalidArgument,
                  "a component of the name is longer than " + std::to_string(NAME_MAX) + " bytes");
    }
    if (++depth > kMaxDepth) {
      return Fail(ErrorCode::kInvalidArgument,
                  "the name is deeper than " + std::to_string(kMaxDepth) + " directories");
    }
    if (!out.empty()) out += '/';
    out += component;
  }
  return out;
}

std::pair<std::string, std::string> SplitParent(const std::string& clean) {
  size_t slash = clean.rfind('/');
  if (slash == std::string::npos) return {"", clean};
  return {clean.substr(0, slash), clean.substr(slash + 1)};
}

std::string Quote(std::string_view name) {
  constexpr size_t kMax = 200;
  std::string out = "'";
  for (char c : name.substr(0, kMax)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  if (name.size() > kMax) out += "...";
  return out + "'";
}

Result<ArchiveReader> OpenTarReader(int fd) {
  auto a = NewReader();
  if (!a) return a;
  if (archive_read_support_format_tar(a->get()) != ARCHIVE_OK ||
      archive_read_support_format_empty(a->get()) != ARCHIVE_OK ||
      archive_read_open_fd(a->get(), fd, 1 << 16) != ARCHIVE_OK) {
    return Fail(ErrorCode::kInvalidArgument, ArchiveMessage(a->get()));
  }
  return a;
}

Status WriteEntryData(archive* a, int fd, uint64_t size) {
  for (;;) {
    const void* block;
    size_t len = 0;
    la_int64_t offset = 0;
    int r = archive_read_data_block(a, &block, &len, &offset);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return Fail(ErrorCode::kInvalidArgument, "reading its data: " + ArchiveMessage(a));
    }
    if (offset < 0 || static_cast<uint64_t>(offset) > size || len > size - offset) {
      return Fail(ErrorCode::kInvalidArgument, "its data runs past its size");
    }
    if (auto st = PwriteAll(fd, static_cast<const char*>(block), len, offset); !st) {
      return std::unexpected(st.error().Wrap("writing its data"));
    }
  }
  // A sparse entry may end in a hole.
  if (::ftruncate(fd, static_cast<off_t>(size)) < 0) return FailErrno("truncate", errno);
  return {};
}

Result<UniqueFd> OpenDirBeneath(int root, std::string_view rel, bool create) {
  UniqueFd cur(::openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cur) return FailErrno("opening the root directory", errno);
  for (size_t at = 0; at < rel.size();) {
    size_t slash = std::min(rel.find('/', at), rel.size());
    const std::string component(rel.substr(at, slash - at));
    const std::string_view so_far = rel.substr(0, slash);
    at = slash + 1;
    // Names reach here through CleanName; anything else is a bug, not an image's doing.
    AIRLOCK_CHECK(!component.empty() && component != "." && component != "..");
    int fd = ::openat(cur.get(), component.c_str(), kDirFlags);
    if (fd < 0 && errno == ENOENT && create) {
      bool made = ::mkdirat(cur.get(), component.c_str(), 0755) == 0;
      if (!made && errno != EEXIST) {
        return std::unexpected(EntryError("mkdir " + Quote(so_far), errno));
      }
      fd = ::openat(cur.get(), component.c_str(), kDirFlags);
      if (fd >= 0 && made) (void)::fchmod(fd, 0755);  // whatever the umask
    }
    if (fd < 0) {
      const int err = errno;
      struct stat st;
      if (::fstatat(cur.get(), component.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode)) {
        return std::unexpected(
            Error(ErrorCode::kInvalidArgument, Quote(so_far) + " is a symlink", ELOOP));
      }
      if (err == ENOENT) {
        return std::unexpected(
            Error(ErrorCode::kInvalidArgument, Quote(so_far) + " does not exist", ENOENT));
      }
      if (err == ENOTDIR || err == ELOOP) {
        return std::unexpected(
            Error(ErrorCode::kInvalidArgument, Quote(so_far) + " is not a directory", ENOTDIR));
      }
      return std::unexpected(EntryError("opening " + Quote(so_far), err));
    }
    cur.Reset(fd);
  }
  return cur;
}

Status RemoveTreeAt(int parent, const std::string& name, size_t depth) {
  struct stat st;
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return {};
    return FailErrno("stat " + Quote(name), errno);
  }
  if (S_ISDIR(st.st_mode)) {
    UniqueFd dir(::openat(parent, name.c_str(), kDirFlags));
    if (!dir) return FailErrno("opening " + Quote(name), errno);
    if (auto removed = RemoveChildren(dir.get(), depth + 1); !removed) return removed;
  }
  if (::unlinkat(parent, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0 &&
      errno != ENOENT) {
    return FailErrno("removing " + Quote(name), errno);
  }
  return {};
}

Status RemoveChildren(int dir, size_t depth) {
  // Trees here are at most kMaxDepth deep (CleanName), and each level holds one fd.
  if (depth > kMaxDepth) {
    return Fail(ErrorCode::kInvalidArgument,
                "directories nest deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  std::vector<std::string> names;
  {
    int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return FailErrno("opening a directory", errno);
    DIR* listing = ::fdopendir(fd);
    if (!listing) {
      ::close(fd);
      return FailErrno("reading a directory", errno);
    }
    while (dirent* e = ::readdir(listing)) {
      std::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    ::closedir(listing);
  }
  for (const std::string& name : names) {
    if (auto removed = RemoveTreeAt(dir, name, depth); !removed) return removed;
  }
  return {};
}

Status Budget::AddEntry() {
  if (entries_ >= limits_.max_entries) {
    return Fail(ErrorCode::kTooLarge, "over the limit of " + std::to_string(limits_.max_entries) +
                                          " entries in " + what_);
  }
  ++entries_;
  return {};
}

Status Budget::CheckBytes(uint64_t n) const {
  if (n > limits_.max_bytes || bytes_ > limits_.max_bytes - n) {
    return Fail(ErrorCode::kTooLarge,
                "over the limit of " + std::to_string(limits_.max_bytes) + " bytes in " + what_);
  }
  return {};
}

Status Budget::AddBytes(uint64_t n) {
  if (auto fits = CheckBytes(n); !fits) return fits;
  bytes_ += n;
  return {};
}

struct LayerApplier::Scan {
  std::vector<std::string> opaque_markers;  // clean names of .wh..wh..opq entries
  std::vector<std::string> whiteouts;       // clean names of .wh.<name> entries
};

Status LayerApplier::Apply(int layer, std::string_view diff_id) {
  Scan scan;
  auto digest = ScanLayer(layer, scan);
  if (!digest) return std::unexpected(digest.error());
  if (*digest != diff_id) {
    return Fail(ErrorCode::kInvalidArgument,
                "its content is " + *digest + ", the config says " + std::string(diff_id));
  }
  if (auto st = ApplyWhiteouts(scan); !st) return st;
  return Extract(layer);
}

Result<std::string> LayerApplier::ScanLayer(int layer, Scan& scan) {
  if (::lseek(layer, 0, SEEK_SET) < 0) return FailErrno("seeking in the layer", errno);
  HashingSource source;
  if (auto opened = source.Open(layer); !opened) return std::unexpected(opened.error());
  auto tar = source.OpenTar();
  if (!tar) return std::unexpected(tar.error());
  // The data in this layer, whatever its entries' types: skipping data still decompresses it,
  // so a hard link or whiteout carrying gigabytes counts too.
  uint64_t declared = 0;
  for (;;) {
    archive_entry* entry;
    int r = archive_read_next_header(tar->get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + ArchiveMessage(tar->get()));
    }
    if (auto st = budget_.AddEntry(); !st) return std::unexpected(st.error());
    const char* raw_name = archive_entry_pathname(entry);
    if (!raw_name) return Fail(ErrorCode::kInvalidArgument, "an entry has no name");
    auto fail = [&](const Error& e) { return std::unexpected(e.Wrap("entry " + Quote(raw_name))); };
    const int64_t size = archive_entry_size(entry);
    if (size < 0) return fail(Error(ErrorCode::kInvalidArgument, "a negative size"));
    declared += static_cast<uint64_t>(size);
    if (auto fits = budget_.CheckBytes(declared); !fits) return std::unexpected(fits.error());
    auto name = CleanName(raw_name);
    if (!name) return fail(name.error());
    auto kind = Classify(*name);
    if (!kind) return fail(kind.error());
    if (*kind == EntryKind::kWhiteout) scan.whiteouts.push_back(*name);
    if (*kind == EntryKind::kOpaque) scan.opaque_markers.push_back(*name);
    if (*kind != EntryKind::kNode) continue;

    if (const char* target = archive_entry_hardlink(entry)) {
      auto clean = CleanName(target);
      if (!clean) return fail(clean.error().Wrap("its hard link target " + Quote(target)));
      if (clean->empty())
        return fail(Error(ErrorCode::kInvalidArgument, "a hard link to the root"));
      continue;
    }
    const mode_t type = archive_entry_filetype(entry);
    if (name->empty() && type != AE_IFDIR) {
      return fail(Error(ErrorCode::kInvalidArgument, "the root is not a directory"));
    }
    switch (type) {
      case AE_IFREG:
        break;
      case AE_IFLNK: {
        const char* target = archive_entry_symlink(entry);
        if (!target || !*target) {
          return fail(Error(ErrorCode::kInvalidArgument, "a symlink without a target"));
        }
        break;
      }
      case AE_IFDIR:
        break;
      case AE_IFCHR:
      case AE_IFBLK:
      case AE_IFIFO:
      case AE_IFSOCK:
        continue;  // skipped when extracting, whatever their owner
      default:
        return fail(Error(ErrorCode::kInvalidArgument,
                          "unknown entry type " + std::to_string(static_cast<unsigned>(type))));
    }
    if (auto owner = Owner(entry); !owner) return fail(owner.error());
  }
  return source.Finish();
}

Status LayerApplier::ApplyWhiteouts(const Scan& scan) {
  cached_fd_.Reset();
  cached_dir_.clear();
  // Whiteouts name what lower layers wrote; a missing path (or one through a regular file) has
  // nothing to delete: an empty fd. A path through a symlink is refused: following it could
  // delete outside the root.
  auto open_dir = [&](const std::string& dir, const std::string& entry) -> Result<UniqueFd> {
    auto fd = OpenDirBeneath(root_, dir, /*create=*/false);
    if (fd) return fd;
    const int err = fd.error().sys_errno();
    if (fd.error().code() == ErrorCode::kInvalidArgument && (err == ENOENT || err == ENOTDIR)) {
      return UniqueFd();
    }
    return std::unexpected(fd.error().Wrap("whiteout " + Quote(entry)));
  };
  for (const std::string& marker : scan.opaque_markers) {
    const std::string dir = SplitParent(marker).first;
    auto fd = open_dir(dir, marker);
    if (!fd) return std::unexpected(fd.error());
    if (!fd->valid()) continue;
    if (auto st = RemoveChildren(fd->get()); !st) {
      return std::unexpected(st.error().Wrap("whiteout " + Quote(marker)));
    }
    ForgetTimes(dir, /*keep_self=*/true);
  }
  for (const std::string& whiteout : scan.whiteouts) {
    const auto [dir, base] = SplitParent(whiteout);
    auto fd = open_dir(dir, whiteout);
    if (!fd) return std::unexpected(fd.error());
    if (!fd->valid()) continue;
    const std::string target = base.substr(kWhiteoutPrefix.size());
    if (auto st = RemoveTreeAt(fd->get(), target); !st) {
      return std::unexpected(st.error().Wrap("whiteout " + Quote(whiteout)));
    }
    ForgetTimes(dir.empty() ? target : dir + "/" + target, /*keep_self=*/false);
  }
  return {};
}

Status LayerApplier::Extract(int layer) {
  if (::lseek(layer, 0, SEEK_SET) < 0) return FailErrno("seeking in the layer", errno);
  auto tar = OpenTarReader(layer);
  if (!tar) return std::unexpected(tar.error().Wrap("reading the layer"));
  cached_fd_.Reset();
  cached_dir_.clear();
  for (;;) {
    archive_entry* entry;
    int r = archive_read_next_header(tar->get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return Fail(ErrorCode::kInvalidArgument, "reading the layer: " + ArchiveMessage(tar->get()));
    }
    // The scan read the same bytes and accepted every name.
    const char* raw_name = archive_entry_pathname(entry);
    auto name = raw_name ? CleanName(raw_name) : Fail(ErrorCode::kInternal, "no name");
    AIRLOCK_CHECK(name.has_value());
    auto kind = Classify(*name);
    AIRLOCK_CHECK(kind.has_value());
    // The root's owner and mode are the caller's.
    if (*kind != EntryKind::kNode || name->empty()) continue;
    if (auto st = ExtractEntry(tar->get(), entry, *name); !st) {
      return std::unexpected(st.error().Wrap("entry " + Quote(raw_name)));
    }
  }
  return {};
}

Result<int> LayerApplier::Parent(const std::string& dir) {
  if (cached_fd_ && cached_dir_ == dir) return cached_fd_.get();
  cached_fd_.Reset();
  auto fd = OpenDirBeneath(root_, dir, /*create=*/true);
  if (!fd) return std::unexpected(fd.error());
  cached_fd_ = std::move(*fd);
  cached_dir_ = dir;
  return cached_fd_.get();
}

void LayerApplier::ForgetTimes(const std::string& path, bool keep_self) {
  if (path.empty()) {
    dir_times_.clear();
    return;
  }
  if (!keep_self) dir_times_.erase(path);
  const std::string prefix = path + "/";
  auto it = dir_times_.lower_bound(prefix);
  while (it != dir_times_.end() && it->first.starts_with(prefix)) it = dir_times_.erase(it);
}

Status LayerApplier::ExtractEntry(archive* a, archive_entry* entry, const std::string& name) {
  const auto [dir, base] = SplitParent(name);
  const char* link_target = archive_entry_hardlink(entry);
  const mode_t type = archive_entry_filetype(entry);
  if (!link_target && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
    return {};  // device nodes, fifos and sockets are not created
  }
  auto parent = Parent(dir);
  if (!parent) return std::unexpected(parent.error());
  const int pfd = *parent;
  const char* c_base = base.c_str();

  // What is there from a lower layer (or earlier in this one) goes, unless both are
  // directories: a file is never opened for writing where it stands, so nothing is written
  // through a hard link another path shares.
  struct stat old;
  const bool exists = ::fstatat(pfd, c_base, &old, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && !(type == AE_IFDIR && !link_target && S_ISDIR(old.st_mode))) {
    if (link_target && CleanName(link_target).value_or("") == name) return {};  // a link to itself
    if (auto st = RemoveTreeAt(pfd, base); !st)
      return std::unexpected(st.error().Wrap("replacing it"));
    ForgetTimes(name, /*keep_self=*/false);
  }

  if (link_target) {
    // The target is resolved like any entry: beneath the root, through no symlink. The link is
    // made to the target itself (no AT_SYMLINK_FOLLOW), so a symlink target stays a symlink.
    const auto [target_dir, target_base] = SplitParent(*CleanName(link_target));
    auto target_parent = OpenDirBeneath(root_, target_dir, /*create=*/false);
    if (!target_parent) {
      return std::unexpected(target_parent.error().Wrap("hard link target " + Quote(link_target)));
    }
    struct stat target;
    if (::fstatat(target_parent->get(), target_base.c_str(), &target, AT_SYMLINK_NOFOLLOW) < 0) {
      return std::unexpected(EntryError("hard link target " + Quote(link_target), errno));
    }
    if (S_ISDIR(target.st_mode)) {
      return Fail(ErrorCode::kInvalidArgument,
                  "hard link target " + Quote(link_target) + " is a directory");
    }
    if (::linkat(target_parent->get(), target_base.c_str(), pfd, c_base, 0) < 0) {
      return std::unexpected(EntryError("linking to " + Quote(link_target), errno));
    }
    return {};
  }

  auto owner = Owner(entry);
  AIRLOCK_CHECK(owner.has_value());  // checked by the scan
  const mode_t mode = archive_entry_perm(entry) & 07777;
  const timespec mtime = Mtime(entry);
  switch (type) {
    case AE_IFDIR: {
      if (!exists || !S_ISDIR(old.st_mode)) {
        if (::mkdirat(pfd, c_base, 0700) < 0) return std::unexpected(EntryError("mkdir", errno));
      }
      UniqueFd fd(::openat(pfd, c_base, kDirFlags));
      if (!fd) return std::unexpected(EntryError("opening it", errno));
      if (auto st = SetMetadata(fd.get(), *owner, mode, nullptr); !st) return st;
      dir_times_[name] = mtime;
      return {};
    }
    case AE_IFREG: {
      const auto size = static_cast<uint64_t>(archive_entry_size(entry));
      if (auto fits = budget_.AddBytes(size); !fits) return fits;
      UniqueFd fd(
          ::openat(pfd, c_base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd) return std::unexpected(EntryError("creating it", errno));
      if (auto st = WriteEntryData(a, fd.get(), size); !st) return st;
      return SetMetadata(fd.get(), *owner, mode, &mtime);
    }
    case AE_IFLNK: {
      // The target is kept as written, absolute or not: it is resolved inside the sandbox,
      // never by the daemon.
      if (::symlinkat(archive_entry_symlink(entry), pfd, c_base) < 0) {
        return std::unexpected(EntryError("symlink", errno));
      }
      if (::fchownat(pfd, c_base, owner->first, owner->second, AT_SYMLINK_NOFOLLOW) < 0) {
        return FailErrno("chown", errno);
      }
      if (mtime.tv_nsec != UTIME_OMIT) {
        const timespec times[2] = {{0, UTIME_OMIT}, mtime};
        if (::utimensat(pfd, c_base, times, AT_SYMLINK_NOFOLLOW) < 0) {
          return FailErrno("setting the mtime", errno);
        }
      }
      return {};
    }
    default:
      return {};
  }
}

Status LayerApplier::Finish() {
  for (const auto& [path, mtime] : dir_times_) {
    if (mtime.tv_nsec == UTIME_OMIT) continue;
    auto fd = OpenDirBeneath(root_, path, /*create=*/false);
    if (!fd) continue;  // replaced by a later layer with something that is not a directory
    const timespec times[2] = {{0, UTIME_OMIT}, mtime};
    if (::futimens(fd->get(), times) < 0) {
      return FailErrno("setting the mtime of " + Quote(path), errno);
    }
  }
  return {};
}

}  // namespace airlock::images
