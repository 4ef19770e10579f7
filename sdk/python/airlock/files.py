"""Files inside a sandbox: read, write, list, remove, mkdir, and whole directories as tar."""

from __future__ import annotations

import base64
import io
import os
import posixpath
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from .errors import AirlockError, SandboxNotFound

if TYPE_CHECKING:
    from .sandbox import Sandbox


class UnsafeArchive(AirlockError):
    """A downloaded tar stream held a member that would land outside the target directory."""


def _name(value: Optional[str], encoding: Optional[str]) -> str:
    if value is None:
        return ""
    if encoding == "base64":
        # Names that are not UTF-8 round-trip through surrogateescape, like os.fsdecode.
        return base64.b64decode(value).decode("utf-8", "surrogateescape")
    return value


def _mode(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, int):
        return format(mode, "04o")
    return mode


@dataclass
class FileEntry:
    """One directory entry. `type` is file, directory, symlink or other; `mode` is octal text."""

    name: str
    type: str
    mode: str
    size: int
    mtime: str
    link_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "FileEntry":
        target = body.get("link_target")
        return cls(
            name=_name(body.get("name"), body.get("name_encoding")),
            type=str(body.get("type", "")),
            mode=str(body.get("mode", "")),
            size=int(body.get("size", 0)),
            mtime=str(body.get("mtime", "")),
            link_target=None if target is None
            else _name(target, body.get("link_target_encoding")),
        )


class Files:
    """`sandbox.files`: paths are absolute or relative to the sandbox user's home."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def _request(self, method: str, suffix: str, path: str, **kwargs: Any) -> Any:
        query: List[Tuple[str, str]] = [("path", path)]
        query.extend(kwargs.pop("extra_query", []))
        return self._sandbox.client.request(
            method, self._sandbox._path + "/files" + suffix, query=query, **kwargs
        )

    def write(
        self, path: str, data: Union[bytes, str], mode: Union[int, str, None] = None,
        parents: bool = False,
    ) -> FileEntry:
        """Creates or replaces the file with `data` (str is written as UTF-8)."""
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        extra = _mode_and_parents(mode, parents)
        r = self._request("PUT", "", path, body=payload, content_type="application/octet-stream",
                          extra_query=extra)
        return FileEntry.from_json(r.json())

    def read(self, path: str) -> bytes:
        """The file's bytes."""
        return bytes(self._request("GET", "", path).body)

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The file decoded as text."""
        return self.read(path).decode(encoding, errors)

    def list(self, path: str) -> List[FileEntry]:
        """The directory's entries (not recursive)."""
        body = self._request("GET", "/list", path).json()
        return [FileEntry.from_json(e) for e in body["entries"]]

    def remove(self, path: str, recursive: bool = False) -> None:
        """Deletes a file, symlink or directory (a non-empty one only with recursive=True)."""
        extra = [("recursive", "true")] if recursive else []
        self._request("DELETE", "", path, extra_query=extra)

    def mkdir(self, path: str, parents: bool = False,
              mode: Union[int, str, None] = None) -> FileEntry:
        """Creates a directory (and missing parents with parents=True)."""
        extra = _mode_and_parents(mode, parents)
        return FileEntry.from_json(self._request("POST", "/mkdir", path, extra_query=extra).json())

    def exists(self, path: str) -> bool:
        """Whether anything (file, directory, symlink) is at `path`."""
        trimmed = path.rstrip("/")
        if trimmed == "":
            return path.startswith("/")  # "/" always exists
        parent, name = posixpath.split(trimmed)
        if name in (".", ".."):
            raise ValueError(f"exists() needs a path that names an entry, got {path!r}")
        if parent == "":
            parent = "."
        try:
            return any(e.name == name for e in self.list(parent))
        except SandboxNotFound:
            if self._sandbox_gone():
                raise
            return False

    def _sandbox_gone(self) -> bool:
        try:
            self._sandbox.refresh()
        except SandboxNotFound:
            return True
        return False

    # --- directories as tar streams ---

    def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Copies the contents of `local_dir` into `remote_dir` (created if missing)."""
        if not os.path.isdir(local_dir):
            raise FileNotFoundError(f"not a directory: {local_dir}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, entry), arcname="./" + entry, recursive=True)
        self._request("PUT", "/tar", remote_dir, body=buf.getvalue(),
                      content_type="application/x-tar")

    def download_dir(self, remote_dir: str, local_dir: str) -> List[str]:
        """Copies the contents of `remote_dir` into `local_dir` (created if missing) and returns
        the relative paths written. Members with absolute names, `..`, links that point outside
        `local_dir`, or device nodes raise UnsafeArchive."""
        data = self._request("GET", "/tar", remote_dir).body
        return extract_tar(data, local_dir)


def _mode_and_parents(mode: Union[int, str, None], parents: bool) -> List[Tuple[str, str]]:
    """The query parameters of a write or mkdir."""
    extra: List[Tuple[str, str]] = []
    m = _mode(mode)
    if m is not None:
        extra.append(("mode", m))
    if parents:
        extra.append(("parents", "true"))
    return extra


def _member_path(name: str) -> Optional[str]:
    """The member's normalised relative path, None for the archive root; raises if unsafe."""
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeArchive(f"tar member has an absolute name: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"tar member name contains '..': {name!r}")
    return "/".join(parts) if parts else None


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _no_symlink_parents(root: str, rel: str) -> None:
    """Refuses a path whose existing parent directories inside `root` include a symlink, so
    nothing is ever written through a link."""
    current = root
    for part in rel.split("/")[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise UnsafeArchive(f"tar member {rel!r} would be written through a symlink")


def extract_tar(data: bytes, local_dir: str) -> List[str]:
    """Extracts a tar stream into `local_dir`, checking every member itself (not relying on
    tarfile's extraction filters, which differ between Python versions)."""
    root = os.path.realpath(local_dir)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        members = tar.getmembers()
        # First pass: refuse the whole archive before writing anything if a member is unsafe.
        plan: List[Tuple[tarfile.TarInfo, str]] = []
        for m in members:
            rel = _member_path(m.name)
            if rel is None:
                continue
            dest = os.path.join(root, rel)
            if m.issym():
                if os.path.isabs(m.linkname):
                    raise UnsafeArchive(
                        f"tar member {m.name!r} is a symlink to an absolute path {m.linkname!r}")
                target = os.path.normpath(os.path.join(os.path.dirname(dest), m.linkname))
                if not _inside(root, target):
                    raise UnsafeArchive(
                        f"tar member {m.name!r} is a symlink pointing outside: {m.linkname!r}")
            elif m.islnk():
                if _member_path(m.linkname) is None:
                    raise UnsafeArchive(f"tar member {m.name!r} is a hard link to the root")
            elif not (m.isfile() or m.isdir()):
                raise UnsafeArchive(f"tar member {m.name!r} is a device, fifo or other special file")
            plan.append((m, rel))

        os.makedirs(root, exist_ok=True)
        written: List[str] = []
        dir_modes: Dict[str, int] = {}
        links: List[Tuple[str, str]] = []
        for m, rel in plan:
            dest = os.path.join(root, rel)
            _no_symlink_parents(root, rel)
            if m.isdir():
                if os.path.islink(dest):
                    raise UnsafeArchive(f"tar member {m.name!r} would replace a symlink")
                os.makedirs(dest, exist_ok=True)
                dir_modes[dest] = m.mode & 0o7777
            elif m.issym():
                links.append((dest, m.linkname))  # made last, so nothing is written through them
            else:  # a regular file, or a hard link whose bytes tarfile reads from its target
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                if os.path.islink(dest) or os.path.isdir(dest):
                    raise UnsafeArchive(f"tar member {m.name!r} would replace a link or directory")
                src = tar.extractfile(m)
                content = src.read() if src is not None else b""
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
                os.chmod(dest, m.mode & 0o777)
            written.append(rel)
        for dest, linkname in links:
            if os.path.lexists(dest):
                raise UnsafeArchive(f"tar symlink {dest!r} would replace an existing entry")
            _no_symlink_parents(root, os.path.relpath(dest, root).replace(os.sep, "/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.symlink(linkname, dest)
        # Symlinks can combine (a link through another link, then ".."): check where each one
        # really resolves now that all exist, and undo them all if any leaves the target.
        for dest, linkname in links:
            if not _inside(root, os.path.realpath(dest)):
                for d, _ in links:
                    if os.path.lexists(d):
                        os.unlink(d)
                raise UnsafeArchive(f"tar symlink {dest!r} -> {linkname!r} resolves outside")
        for dest, mode in sorted(dir_modes.items(), reverse=True):
            os.chmod(dest, mode | 0o700)  # keep our own access so later copies still work
        return written
