#!/usr/bin/env bash
# The Debian package on a fresh Debian 12 root (docs/install.md): made from a build tree with
# cpack, installed with `apt-get install ./airlock_*.deb` into a root made with mmdebstrap, the
# daemon started from the installed files with no flag, a sandbox run through the installed CLI,
# the package removed (every sandbox destroyed, the state and the settings kept) and purged
# (nothing left). Everything runs in a mount namespace of its own: its mounts end with it.
#
#   install_test.sh BUILD_DIR     exit 0: passed; 77: skipped (the reason on the last line)
set -euo pipefail

build=$(realpath "$1")
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (mounts, pivot_root, the jail engine)"
for tool in mmdebstrap cpack dpkg-shlibdeps unshare pivot_root curl python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/setup installs it)"
done
mirror=${AIRLOCK_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d /tmp/airlock-package-XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== the package, from $build"
cpack --config "$build/CPackConfig.cmake" -B "$work/dist" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/dist/airlock_*.deb)
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
dpkg-deb --contents "$deb" | awk '{print $6}'

# The rest in a mount namespace of its own.
export deb mirror work
unshare --mount --propagation private -- bash -euo pipefail -c '
root=$work/root
fail() { echo "FAIL: $*"; exit 1; }
daemon=
port=
cleanup() {
  [ -z "$daemon" ] || { kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; }
  # A sandbox a failed run left: the installed daemon destroys what it kept.
  if [ -x "$root/usr/bin/airlockd" ]; then
    in_root /usr/bin/airlockd --destroy-all >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

echo "== a fresh Debian 12 root (mmdebstrap --variant=apt bookworm)"
mmdebstrap --quiet --mode=root --format=directory --variant=apt bookworm "$root" "$mirror" \
  >"$work/mmdebstrap.log" 2>&1 || { tail -n 30 "$work/mmdebstrap.log"; fail "mmdebstrap"; }
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
# Commands run in the new root through pivot_root in a mount namespace of their own, not chroot:
# the kernel refuses a user namespace (the jail makes one) to a chrooted process.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mkdir -p "$root/.oldroot"
# run_in_root replaces the calling shell: started with & it becomes the command ($! its pid).
run_in_root() {
  exec unshare --mount --propagation private -- /bin/sh -c \
    "cd \"\$0\" && pivot_root . .oldroot && cd / && exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive \"\$@\"" \
    "$root" "$@"
}
in_root() { (run_in_root "$@"); }

echo "== apt-get install ./$(basename "$deb")"
# mmdebstrap leaves no package lists behind: a fresh machine runs apt-get update first.
in_root apt-get update -q >"$work/update.log" 2>&1 || { tail -n 20 "$work/update.log"; fail "apt-get update"; }
in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" \
  >"$work/install.log" 2>&1 || { tail -n 40 "$work/install.log"; fail "apt-get install"; }
for f in /usr/bin/airlockd /usr/bin/airlock /usr/libexec/airlock/airlock-agent \
         /usr/libexec/airlock/airlock-jail; do
  [ -x "$root$f" ] || fail "$f is not installed"
done
for f in /usr/lib/systemd/system/airlockd.service /etc/airlock/airlockd.toml \
         /usr/share/doc/airlock/install.md /usr/share/doc/airlock/api/openapi.yaml; do
  [ -f "$root$f" ] || fail "$f is not installed"
done
[ "$(stat -c %a "$root/var/lib/airlock")" = 700 ] || fail "/var/lib/airlock is not 0700"
[ -L "$root/etc/systemd/system/multi-user.target.wants/airlockd.service" ] ||
  fail "the service is not enabled"
in_root /usr/bin/airlockd --check-config || fail "the installed settings are not valid"

echo "== airlockd from the installed files, with the installed settings"
# The operator edits the settings (a conffile): a port of its own, and networking that no
# other test daemon uses.
sed -i -e "s/^listen = .*/listen = \"127.0.0.1:0\"/" "$root/etc/airlock/airlockd.toml"
sed -i -e "1i network_id = \"pk\"" -e "1i network_subnet = \"10.213.250.0/24\"" \
  -e "1i network_warm_links = 0" "$root/etc/airlock/airlockd.toml"
run_in_root /usr/bin/airlockd >"$work/airlockd.out" 2>"$work/airlockd.log" &
daemon=$!
for _ in $(seq 600); do
  port=$(sed -n "s/^listening on 127.0.0.1://p" "$work/airlockd.out")
  [ -n "$port" ] && break
  kill -0 $daemon 2>/dev/null || { cat "$work/airlockd.log"; fail "airlockd stopped"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/airlockd.log"; fail "airlockd did not say where it listens"; }
key=$(cat "$root/var/lib/airlock/admin.key")
[ "$(stat -c %a "$root/var/lib/airlock/admin.key")" = 600 ] || fail "admin.key is not 0600"
engines=$(curl -sS -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/engines")
echo "$engines"
python3 -c "import json, sys; d = json.load(sys.stdin); sys.exit(0 if any(e[\"name\"] == \"jail\" and e[\"available\"] for e in d[\"engines\"]) else 1)" <<<"$engines" ||
  fail "the jail is not available"

echo "== a sandbox through the installed CLI"
cli() { in_root AIRLOCK_URL="http://127.0.0.1:$port" AIRLOCK_API_KEY="$key" /usr/bin/airlock "$@"; }
set +e
out=$(cli run -- sh -c "echo hello from \$(hostname); exit 3")
code=$?
set -e
echo "$out"
[ "$code" -eq 3 ] || fail "airlock run passed through exit code $code, not 3"
grep -q "^hello from sbx-" <<<"$out" || fail "airlock run printed: $out"
kept=$(cli create)
[[ "$kept" == sbx-* ]] || fail "airlock create printed: $kept"
[ "$(cli exec "$kept" -- sh -c "echo \$((6 * 7))")" = 42 ] || fail "exec in $kept"

echo "== airlock doctor from the installed files (it finds /usr/bin/airlockd beside it)"
doctor=$(cli doctor --json) || { echo "$doctor"; fail "airlock doctor says this root cannot run airlockd"; }
python3 -c "import json, sys; d = json.load(sys.stdin); v = {f[\"check\"]: f[\"verdict\"] for f in d[\"findings\"]}; sys.exit(0 if d[\"ready\"] and v[\"engine jail\"] == \"ok\" and v[\"daemon\"] == \"ok\" and v[\"daemon engines\"] == \"ok\" else 1)" <<<"$doctor" ||
  { echo "$doctor"; fail "airlock doctor: the jail, the daemon or their agreement is not ok"; }

echo "== stopped (on_shutdown keep: $kept runs on), then the package removed"
kill -TERM $daemon
wait $daemon || { tail -n 20 "$work/airlockd.log"; fail "airlockd did not stop cleanly"; }
daemon=
[ -n "$(find /sys/fs/cgroup -maxdepth 6 -type d -name "$kept" 2>/dev/null)" ] ||
  fail "$kept did not outlive the daemon"
in_root apt-get remove -y -q airlock >"$work/remove.log" 2>&1 ||
  { cat "$work/remove.log"; fail "apt-get remove"; }
cat "$work/remove.log" | grep -i -E "airlock|error" || true
for f in /usr/bin/airlockd /usr/bin/airlock /usr/libexec/airlock /usr/lib/systemd/system/airlockd.service \
         /usr/share/doc/airlock; do
  [ ! -e "$root$f" ] || fail "$f is left after remove"
done
[ -f "$root/etc/airlock/airlockd.toml" ] || fail "remove took the settings"
[ -f "$root/var/lib/airlock/airlock.db" ] || fail "remove took the state"
[ -z "$(find /sys/fs/cgroup -maxdepth 6 -type d -name "$kept" 2>/dev/null)" ] ||
  fail "$kept is left after remove"
[ -z "$(grep " $root/var/lib/airlock" /proc/self/mountinfo)" ] || fail "mounts are left after remove"
! in_root ip netns list | grep -q "^airlock-pk-" || fail "network namespaces are left after remove"
! nft list table inet airlock_pk >/dev/null 2>&1 || fail "the nftables table is left after remove"

echo "== purged"
in_root apt-get purge -y -q airlock >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "purge"; }
for f in /var/lib/airlock /etc/airlock /etc/systemd/system/airlockd.service \
         /etc/systemd/system/multi-user.target.wants/airlockd.service; do
  [ ! -e "$root$f" ] && [ ! -L "$root$f" ] || fail "$f is left after purge"
done
echo "PASS"
'
