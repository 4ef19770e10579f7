#pragma once
// The shared layer store (docs/design/engines.md, docs/design/templates.md): read-only file
// system layers, content addressed, that every engine stacks under its sandboxes' roots, each
// mounting them its own way. A layer is a directory <root>/<digest>/ holding a tree as a sandbox
// sees it: owners are the sandbox's own ids (0..65535), stored on the host as those same
// numbers (the jail maps them into each sandbox's uid range with an idmapped mount). Overlayfs
// whiteouts (0/0 character devices) and opaque markers (user.overlay.opaque) are kept, so
// layers stack.
//
// <root> is 0700: an owner of 0 or 1000 in a layer means nothing on the host, and no host user
// can reach those files. Set-user-ID and set-group-ID bits are dropped from files on import
// (inside a sandbox they could never raise privileges anyway: no_new_privs). The store is safe
// to use from any thread: every operation is a rename or a read of whole directories.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "runtime/engine.h"

namespace airlock::runtime {

// A layer digest: the SHA-256, as 64 lowercase hex digits, of the layer's manifest (every
// entry's path, type, mode, owner, extended attributes and content hash, in sorted order).
[[nodiscard]] Status ValidateLayerDigest(std::string_view digest);

class LayerStore {
 public:
  // `staging`: where ImportTree's trees are written (on the same file system).
  LayerStore(std::string root, std::string staging)
      : root_(std::move(root)), staging_(std::move(staging)) {}

  // Makes the root and staging (0700) and removes what interrupted imports left.
  [[nodiscard]] Status Prepare() const;
  std::string Path(std::string_view digest) const { return root_ + "/" + std::string(digest); }
  bool Has(std::string_view digest) const;
  // Copies the tree under the directory `src` into a new layer. Owners in the source are host
  // ids id_base..id_base+65535 (a sandbox's range) and are stored as 0..65535; an owner outside
  // that range fails the import. Sockets and device nodes other than whiteouts are skipped;
  // hard links stay hard links.
  [[nodiscard]] Result<LayerSnapshot> Import(int src, uid_t id_base) const;
  // A layer from a tree that `fill` writes into an empty directory of staging it is given
  // (owners as they are to appear inside a sandbox: 0..65535); the directory goes afterwards.
  [[nodiscard]] Result<LayerSnapshot> ImportTree(
      const std::function<Status(const std::string& dir)>& fill) const;
  // Removes a layer. Removing one that does not exist succeeds.
  [[nodiscard]] Status Remove(std::string_view digest) const;
  [[nodiscard]] Result<std::vector<std::string>> List() const;

 private:
  std::string root_;
  std::string staging_;
};

}  // namespace airlock::runtime
