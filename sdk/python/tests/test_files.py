"""Files: binary-safe read/write, list, mkdir, remove, exists, directory copies as tar."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from airlock import AuthError, FileEntry, SandboxNotFound, UnsafeArchive
from airlock.files import extract_tar


def test_write_read_binary_safe(sbx) -> None:
    blob = bytes(range(256)) * 1024 + b"\x00\xff"
    entry = sbx.files.write("/home/user/blob.bin", blob)
    assert isinstance(entry, FileEntry)
    assert entry.name == "blob.bin" and entry.type == "file" and entry.size == len(blob)
    assert sbx.files.read("/home/user/blob.bin") == blob
    # the command sees the same bytes
    assert sbx.exec("sha256sum blob.bin").stdout.split()[0] == __import__("hashlib").sha256(
        blob).hexdigest()


def test_write_text_mode_parents_and_read_text(sbx) -> None:
    entry = sbx.files.write("deep/er/note.txt", "héllo\n", mode=0o600, parents=True)
    assert entry.mode == "0600"
    assert sbx.files.read_text("/home/user/deep/er/note.txt") == "héllo\n"
    assert sbx.exec("stat -c %a deep/er/note.txt").stdout.strip() == "600"


def test_write_without_parents_fails(sbx) -> None:
    with pytest.raises(SandboxNotFound):
        sbx.files.write("/home/user/missing/dir/f.txt", b"x")


def test_read_missing_is_not_found(sbx) -> None:
    with pytest.raises(SandboxNotFound) as e:
        sbx.files.read("/home/user/nope.txt")
    assert e.value.status == 404


def test_write_read_only_path_is_denied(sbx) -> None:
    with pytest.raises(AuthError) as e:
        sbx.files.write("/usr/bin/evil", b"x")
    assert e.value.status == 403


def test_mkdir_list_exists_remove(sbx) -> None:
    d = sbx.files.mkdir("/home/user/a/b", parents=True, mode="0750")
    assert d.type == "directory" and d.mode == "0750"
    sbx.files.write("/home/user/a/b/f.txt", b"12345")
    sbx.exec("ln -s f.txt /home/user/a/b/link")
    entries = {e.name: e for e in sbx.files.list("/home/user/a/b")}
    assert set(entries) == {"f.txt", "link"}
    assert entries["f.txt"].size == 5 and entries["f.txt"].is_file
    assert entries["link"].type == "symlink" and entries["link"].link_target == "f.txt"
    assert [e.name for e in sbx.files.list("a")] == ["b"]
    assert sbx.files.exists("/home/user/a/b/f.txt")
    assert sbx.files.exists("/home/user/a/b")
    assert sbx.files.exists("a")
    assert sbx.files.exists("/")
    assert not sbx.files.exists("/home/user/a/b/nope")
    assert not sbx.files.exists("/home/user/nodir/nope")
    sbx.files.remove("/home/user/a/b/f.txt")
    assert not sbx.files.exists("/home/user/a/b/f.txt")
    with pytest.raises(Exception):
        sbx.files.remove("/home/user/a")  # not empty
    sbx.files.remove("/home/user/a", recursive=True)
    assert not sbx.files.exists("/home/user/a")


def test_upload_download_dir_round_trip(sbx, tmp_path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "top.txt").write_text("top\n")
    (src / "sub" / "bin.dat").write_bytes(bytes(range(256)))
    (src / "sub" / "deeper" / "empty").write_bytes(b"")
    os.chmod(src / "top.txt", 0o640)
    os.symlink("top.txt", src / "rel-link")
    sbx.files.upload_dir(str(src), "/home/user/project")
    assert sbx.exec("cat project/top.txt; readlink project/rel-link").stdout == "top\ntop.txt\n"
    assert sbx.files.read("/home/user/project/sub/bin.dat") == bytes(range(256))

    sbx.files.write("/home/user/project/made-inside.txt", b"inside")
    dst = tmp_path / "dst"
    written = sbx.files.download_dir("/home/user/project", str(dst))
    assert "sub/bin.dat" in written
    assert (dst / "top.txt").read_text() == "top\n"
    assert (dst / "sub" / "bin.dat").read_bytes() == bytes(range(256))
    assert (dst / "sub" / "deeper" / "empty").read_bytes() == b""
    assert (dst / "made-inside.txt").read_bytes() == b"inside"
    assert os.readlink(dst / "rel-link") == "top.txt"
    assert (os.stat(dst / "top.txt").st_mode & 0o777) == 0o640


def test_download_refuses_link_outside(sbx, tmp_path) -> None:
    sbx.exec("mkdir -p out && echo hi > out/ok.txt && ln -s /etc/passwd out/evil")
    with pytest.raises(UnsafeArchive, match="absolute"):
        sbx.files.download_dir("/home/user/out", str(tmp_path / "dst"))
    assert not (tmp_path / "dst" / "ok.txt").exists()  # refused before writing anything


def _tar(*members: "tuple[tarfile.TarInfo, bytes]") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize("members, match", [
    ([(_file("/etc/evil"), b"x")], "absolute"),
    ([(_file("./../evil"), b"x")], r"'\.\.'"),
    ([(_file("a/../../evil"), b"x")], r"'\.\.'"),
    ([(_link("./l", "../../etc"), b"")], "outside"),
    ([(_link("./l", "/etc"), b"")], "absolute"),
    ([(_link("./h", "../x", tarfile.LNKTYPE), b"")], r"'\.\.'"),
    ([(_link("./d", "", tarfile.CHRTYPE), b"")], "device"),
    # a link that only escapes through another link made after it
    ([(_link("./s/l", "x/../.."), b""), (_link("./s/x", "."), b"")], "resolves outside"),
    # a link and a directory of the same name
    ([(_link("./l", "."), b""), (_file("./l/f"), b"x")], "replace an existing entry"),
])
def test_extract_refuses_unsafe_members(tmp_path, members, match) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive, match=match):
        extract_tar(_tar(*members), str(dest))
    outside = [p for p in tmp_path.rglob("*") if p != dest and dest not in p.parents]
    assert outside == []
    if dest.exists():
        assert all(not os.path.islink(p) for p in dest.rglob("*"))


def test_extract_never_writes_through_an_existing_link(tmp_path) -> None:
    dest = tmp_path / "dest"
    (tmp_path / "elsewhere").mkdir()
    dest.mkdir()
    os.symlink(str(tmp_path / "elsewhere"), dest / "l")
    with pytest.raises(UnsafeArchive, match="through a symlink"):
        extract_tar(_tar((_file("./l/f"), b"x")), str(dest))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_extract_allows_safe_links(tmp_path) -> None:
    data = _tar((_file("./d/f.txt"), b"data"), (_link("./d/l", "f.txt"), b""),
                (_link("./up", "d/../d/f.txt"), b""),
                (_link("./hard", "./d/f.txt", tarfile.LNKTYPE), b""))
    written = extract_tar(data, str(tmp_path / "out"))
    assert set(written) == {"d/f.txt", "d/l", "up", "hard"}
    assert (tmp_path / "out" / "up").read_bytes() == b"data"
    assert (tmp_path / "out" / "hard").read_bytes() == b"data"
    assert not os.path.islink(tmp_path / "out" / "hard")
