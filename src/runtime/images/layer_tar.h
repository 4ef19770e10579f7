#pragma once
// Image layers (tar files, maybe compressed) applied to a root directory, and the path handling
// that the layers and the image archive around them share (docs/design/templates.md).
//
// Everything here works from directory fds and resolves a path one component at a time with
// O_NOFOLLOW: a name in a layer never reaches outside the root, whatever symlinks earlier
// entries made. Internal to airlock_images; oci.h is the interface.

#include <archive.h>
#include <archive_entry.h>
#include <time.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/unique_fd.h"
#include "runtime/images/oci.h"

namespace airlock::images {

// The deepest path (in components) an archive may name. Deeper trees are refused, so that
// removing one never holds more than this many fds.
inline constexpr size_t kMaxDepth = 256;

// `name` from a tar as a path relative to the root, empty and "." components dropped ("" is the
// root itself). Refuses absolute names, ".." components, components longer than NAME_MAX and
// paths deeper than kMaxDepth.
[[nodiscard]] Result<std::string> CleanName(std::string_view name);
// A clean name split into its directory ("" for the root) and its last component.
std::pair<std::string, std::string> SplitParent(const std::string& clean);
// A name for an error message: quoted, at most 200 bytes, control characters as '?'.
std::string Quote(std::string_view name);

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchiveReader = std::unique_ptr<archive, ArchiveFree>;

// A libarchive reader for a tar (any variant) on `fd` from its current offset, compressed with
// gzip, zstd, xz or bzip2 or not at all. The decompressors run in process, never as external
// programs. The fd stays the caller's.
[[nodiscard]] Result<ArchiveReader> OpenTarReader(int fd);
// Writes the data of the current entry of `a` to the new, empty file `fd`: `size` bytes, holes
// of a sparse entry left as holes. Data past `size` is refused.
[[nodiscard]] Status WriteEntryData(archive* a, int fd, uint64_t size);

// Opens the directory `rel` (a CleanName) beneath `root` without following any symlink. With
// `create`, missing directories are made (0755, owned by the caller). Fails with
// kInvalidArgument and errno ELOOP where a component is a symlink, ENOENT where one is missing,
// ENOTDIR where one is not a directory.
[[nodiscard]] Result<UniqueFd> OpenDirBeneath(int root, std::string_view rel, bool create);
// Removes `name` in the directory `parent`, and everything under it if it is a directory,
// never following a symlink. A missing `name` is not an error.
[[nodiscard]] Status RemoveTreeAt(int parent, const std::string& name, size_t depth = 0);
// Removes everything in the directory `dir`, never following a symlink.
[[nodiscard]] Status RemoveChildren(int dir, size_t depth = 0);

// Counts entries and bytes against UnpackLimits.
class Budget {
 public:
  Budget(const UnpackLimits& limits, std::string what) : limits_(limits), what_(std::move(what)) {}
  [[nodiscard]] Status AddEntry();
  [[nodiscard]] Status AddBytes(uint64_t n);
  // Whether `n` more bytes would still fit, counting nothing.
  [[nodiscard]] Status CheckBytes(uint64_t n) const;

 private:
  UnpackLimits limits_;
  std::string what_;  // "the image archive", "the image's layers"
  uint64_t bytes_ = 0;
  uint64_t entries_ = 0;
};

// Applies layers, lowest first, to the directory `root`. Caller: root (owners are set), one
// thread, and nothing else writing under `root` meanwhile. Owners, modes, mtimes, symlinks
// (whatever their target) and hard links are kept; device nodes, fifos and sockets are skipped;
// extended attributes, ACLs and file flags are not restored.
class LayerApplier {
 public:
  LayerApplier(int root, const UnpackLimits& limits)
      : root_(root), budget_(limits, "the image's layers") {}

  // Applies the layer in the open file `layer` on top of what earlier calls wrote: its whiteouts
  // first, then its entries. A first read of the layer checks every name, link target, type and
  // owner, counts it against the limits and computes its uncompressed digest (its diff id),
  // which must be `diff_id` ("sha256:<hex>"); nothing under the root changes before that read
  // has succeeded.
  [[nodiscard]] Status Apply(int layer, std::string_view diff_id);
  // Gives directories the mtimes their layers named (writing into a directory changed its own).
  [[nodiscard]] Status Finish();

 private:
  struct Scan;
  [[nodiscard]] Result<std::string> ScanLayer(int layer, Scan& scan);
  [[nodiscard]] Status ApplyWhiteouts(const Scan& scan);
  [[nodiscard]] Status Extract(int layer);
  [[nodiscard]] Status ExtractEntry(archive* a, archive_entry* entry, const std::string& name);
  [[nodiscard]] Result<int> Parent(const std::string& dir);
  // Drops the recorded mtimes of `path` (unless `keep_self`) and everything under it.
  void ForgetTimes(const std::string& path, bool keep_self);

  int root_;
  Budget budget_;
  // The directory of the last entry, kept open while entries stay in one directory. Dropped
  // before whiteouts (which remove anywhere); while extracting, the only thing ever removed is
  // the old version of the current entry, a child of this directory, never the directory.
  std::string cached_dir_;
  UniqueFd cached_fd_;
  std::map<std::string, timespec> dir_times_;  // directory -> mtime, set by Finish()
};

}  // namespace airlock::images
