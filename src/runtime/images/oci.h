#pragma once
// Image archives: an OCI image layout or a `docker save` tar unpacked into a directory that
// then holds the image's root file system (docs/design/templates.md, "Image archives").
//
// The archive comes from anyone and this runs as root in the daemon: every name, link, digest
// and size in it is checked, and nothing outside the destination is created, changed or removed.

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock::images {

// What the image's config says its containers get (only what a sandbox can use).
struct ImageConfig {
  std::vector<std::string> env;  // "KEY=value" from config.Env
  std::string workdir;           // config.WorkingDir ("" if none)
  std::string user;              // config.User ("" if none)
  // "sha256:<hex>" of the manifest used (for the record). A docker save archive without an OCI
  // index has no manifest blob: there it is the image id, the digest of the config.
  std::string digest;
};

struct UnpackLimits {
  uint64_t max_bytes = 16ull << 30;  // file contents over all layers; also the archive's own
  uint64_t max_entries = 2'000'000;  // entries over all layers; also the archive's members
};

// Unpacks the image archive at `archive` (a tar file, maybe compressed, as `docker save` or
// `skopeo copy oci-archive:` write it) into `dest`, an existing empty directory: every layer in
// order, whiteouts applied, so `dest` holds the image's root file system. Owners and modes are
// those in the layers (the caller runs as root). Blobs are staged in `dest` + ".image", which
// is removed before and after. On failure `dest` is left empty.
// Errors: kInvalidArgument for a malformed or hostile archive (with a message saying what is
// wrong), kNotFound if the file is missing, kTooLarge past the limits, kFailedPrecondition if
// `dest` is not an empty directory.
[[nodiscard]] Result<ImageConfig> UnpackImage(const std::string& archive, const std::string& dest,
                                              const UnpackLimits& limits = {});

}  // namespace airlock::images
