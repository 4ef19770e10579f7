#pragma once
// File operations confined to one directory tree (the sandbox's root, or a test directory).
//
// Every path is resolved by the kernel with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS):
// ".." stops at the root, absolute symlinks are taken relative to it, and /proc magic links
// (/proc/self/root, /proc/1/cwd, ...) are refused, so no path or symlink a sandbox makes can
// lead outside, whatever races it runs.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"

namespace airlock::agent {

class FileRoot {
 public:
  // `root` must be an existing directory. Files and directories created are chowned to
  // `owner` (uid, gid) when given, so the sandbox's user can use what was uploaded.
  static Result<FileRoot> Open(const std::string& root,
                               std::optional<std::pair<uid_t, gid_t>> owner = std::nullopt);

  // A regular file opened for writing (created with `mode`, truncated unless `append`).
  [[nodiscard]] Result<UniqueFd> OpenForWrite(const std::string& path, uint32_t mode,
                                              bool create_parents, bool append) const;
  // A regular file opened for reading.
  [[nodiscard]] Result<UniqueFd> OpenForRead(const std::string& path) const;
  // lstat: a symlink at the end of the path is described, not followed.
  [[nodiscard]] Result<protocol::FileInfo> Stat(const std::string& path) const;
  // The entries of a directory (no "." or ".."), sorted by name.
  [[nodiscard]] Result<std::vector<protocol::FileInfo>> List(const std::string& path) const;
  // Removes a file, symlink or empty directory; with `recursive`, a whole tree (symlinks are
  // removed, never followed). Returns how many entries were removed. The root itself cannot be.
  [[nodiscard]] Result<uint64_t> Remove(const std::string& path, bool recursive) const;
  // Creates a directory; with `parents`, every missing one on the way and no error if it exists.
  [[nodiscard]] Status Mkdir(const std::string& path, uint32_t mode, bool parents) const;

 private:
  FileRoot(UniqueFd root, std::optional<std::pair<uid_t, gid_t>> owner)
      : root_(std::move(root)), owner_(owner) {}

  // openat2 below the root (openat where the kernel lacks openat2 and the root is "/").
  Result<UniqueFd> Resolve(const std::string& path, int flags, mode_t mode = 0) const;
  // The directory holding the last component, and that component ("" for the root itself).
  Result<std::pair<UniqueFd, std::string>> ResolveParent(const std::string& path) const;
  // An existing regular file, type-checked before it is opened with `flags`.
  Result<UniqueFd> OpenRegular(const std::string& path, int flags) const;
  Status MkdirAll(const std::string& path, uint32_t mode) const;
  void Chown(int fd) const;

  UniqueFd root_;
  std::optional<std::pair<uid_t, gid_t>> owner_;
  // The root is the agent's own "/": without openat2 (gVisor) paths need no confinement to it.
  bool is_process_root_ = false;
};

}  // namespace airlock::agent
