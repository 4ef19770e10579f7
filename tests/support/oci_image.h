#pragma once
// A small OCI image archive for the tests of image bases (docs/design/templates.md).

#include <string>

#include "support/airlockd.h"

namespace airlock::testing {

// Writes an OCI image archive to `out`: busybox in a first (plain tar) layer, and a second
// (gzip) layer that adds /etc/os-release and whites out /bin/vi; its config sets Env and
// WorkingDir. Made with tar, gzip and sha256sum, as an image builder would.
inline bool WriteBusyboxImage(const std::string& work, const std::string& out) {
  const std::string script = R"SH(set -e
cd "$1"
mkdir -p l1/bin l2/etc l2/bin img/blobs/sha256
cp /bin/busybox l1/bin/busybox
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "l1/bin/$a"; done
echo 'ID=airlock-test' > l2/etc/os-release
: > l2/bin/.wh.vi
tar -C l1 -cf l1.tar . && tar -C l2 -cf l2.tar .
D1=$(sha256sum l1.tar | cut -d' ' -f1); D2=$(sha256sum l2.tar | cut -d' ' -f1)
gzip -n l2.tar
blob() { d=$(sha256sum "$1" | cut -d' ' -f1); cp "$1" "img/blobs/sha256/$d"; echo "$d"; }
size() { stat -c %s "$1"; }
L1=$(blob l1.tar); L2=$(blob l2.tar.gz)
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/bin:/usr/bin:/bin","GREETING=hello"],"WorkingDir":"/srv/app","User":"1234"},"rootfs":{"type":"layers","diff_ids":["sha256:%s","sha256:%s"]}}' "$D1" "$D2" > config.json
C=$(blob config.json)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s},{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' "$C" "$(size config.json)" "$L1" "$(size l1.tar)" "$L2" "$(size l2.tar.gz)" > manifest.json
M=$(blob manifest.json)
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s}]}' "$M" "$(size manifest.json)" > img/index.json
echo '{"imageLayoutVersion":"1.0.0"}' > img/oci-layout
tar -C img -cf "$2" .
)SH";
  ProcessResult made = RunProcess({"/bin/bash", "-c", script, "image", work, out}, {});
  EXPECT_TRUE(WIFEXITED(made.status) && WEXITSTATUS(made.status) == 0) << made.err;
  return WIFEXITED(made.status) && WEXITSTATUS(made.status) == 0;
}

}  // namespace airlock::testing
