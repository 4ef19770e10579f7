#pragma once
// Read-only file system layers, content addressed (docs/design/templates.md). A layer is a
// directory <root>/<digest>/ holding a tree as a sandbox sees it: owners are the sandbox's own
// ids (0..65535), stored on the host as those same numbers, and the jail maps them into each
// sandbox's uid range with an idmapped mount. Overlayfs whiteouts (0/0 character devices) and
// opaque markers (user.overlay.opaque) are kept, so layers stack.
//
// <root> is 0700: an owner of 0 or 1000 in a layer means nothing on the host, and no host user
// can reach those files. Set-user-ID and set-group-ID bits are dropped from files on import
// (inside a sandbox they could never raise privileges anyway: no_new_privs).

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::jail {

// A layer digest: the SHA-256, as 64 lowercase hex digits, of the layer's manifest (every
// entry's path, type, mode, owner, extended attributes and content hash, in sorted order).
[[nodiscard]] Status ValidateLayerDigest(std::string_view digest);

struct LayerImport {
  std::string digest;
  uint64_t files = 0;  // entries of any type
  uint64_t bytes = 0;  // regular file contents
  bool existed = false;  // the same content was already a layer; nothing new was kept
};

class LayerStore {
 public:
  explicit LayerStore(std::string root) : root_(std::move(root)) {}

  // Makes the root (0700) and removes what interrupted imports left.
  [[nodiscard]] Status Prepare() const;
  std::string Path(std::string_view digest) const { return root_ + "/" + std::string(digest); }
  bool Has(std::string_view digest) const;
  // Copies the tree under the directory `src` into a new layer. Owners in the source are host
  // ids id_base..id_base+65535 (a sandbox's range) and are stored as 0..65535; an owner outside
  // that range fails the import. Sockets and device nodes other than whiteouts are skipped;
  // hard links stay hard links.
  [[nodiscard]] Result<LayerImport> Import(int src, uid_t id_base) const;
  // Removes a layer. Removing one that does not exist succeeds.
  [[nodiscard]] Status Remove(std::string_view digest) const;
  [[nodiscard]] Result<std::vector<std::string>> List() const;

 private:
  std::string root_;
};

}  // namespace airlock::jail
