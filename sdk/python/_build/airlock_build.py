"""A small PEP 517 build backend for the Airlock SDK, standard library only.

The SDK is pure Python with no dependencies, so a wheel is a zip of the ``airlock`` package
plus its metadata. Building it here, instead of with setuptools, means ``pip install
./sdk/python`` needs nothing from a package index: it works offline, as the SDK promises.
The metadata comes from the ``[project]`` table of pyproject.toml (name, version, description,
requires-python, license).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "airlock"


def _project() -> Dict[str, str]:
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if table is None:
        raise RuntimeError("pyproject.toml has no [project] table")
    fields = dict(re.findall(r'^([a-z-]+)\s*=\s*"([^"]*)"', table.group(1), re.M))
    license_text = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', table.group(1), re.M)
    if license_text:
        fields["license"] = license_text.group(1)
    for key in ("name", "version"):
        if key not in fields:
            raise RuntimeError(f"pyproject.toml: [project] needs {key}")
    return fields


def _dist_name(p: Dict[str, str]) -> str:
    return re.sub(r"[-_.]+", "_", p["name"]) + "-" + p["version"]


def _metadata(p: Dict[str, str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    if "license" in p:
        lines.append(f"License: {p['license']}")
    lines.append("Description-Content-Type: text/markdown")
    readme = os.path.join(_ROOT, "README.md")
    body = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> List[Tuple[str, str]]:
    """(path on disk, path in the archive) of every file of the package."""
    out = []
    for root, dirs, files in os.walk(os.path.join(_ROOT, _PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(root, name)
            out.append((full, os.path.relpath(full, _ROOT).replace(os.sep, "/")))
    return out


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    p = _project()
    dist_info = _dist_name(p) + ".dist-info"
    files = files + [
        (f"{dist_info}/METADATA", _metadata(p).encode()),
        (f"{dist_info}/WHEEL",
         b"Wheel-Version: 1.0\nGenerator: airlock_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = [_record_line(name, data) for name, data in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    wheel_name = _dist_name(p) + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            z.writestr(name, data)
    return wheel_name


# ---- PEP 517 hooks -------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[dict] = None) -> str:
    p = _project()
    dist_info = _dist_name(p) + ".dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w",
              encoding="utf-8") as f:
        f.write(_metadata(p))
    return dist_info


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    files = []
    for full, arcname in _package_files():
        with open(full, "rb") as f:
            files.append((arcname, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """`pip install -e`: a wheel holding one .pth file that puts the source tree on sys.path."""
    name = re.sub(r"[-_.]+", "_", _project()["name"])
    return _write_wheel(wheel_directory, [(f"__editable__.{name}.pth", (_ROOT + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    p = _project()
    base = _dist_name(p)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in ("pyproject.toml", "README.md"):
            if os.path.exists(os.path.join(_ROOT, rel)):
                t.add(os.path.join(_ROOT, rel), f"{base}/{rel}")
        t.add(os.path.join(_ROOT, "_build", "airlock_build.py"), f"{base}/_build/airlock_build.py")
        for full, arcname in _package_files():
            t.add(full, f"{base}/{arcname}")
        info = _metadata(p).encode()
        member = tarfile.TarInfo(f"{base}/PKG-INFO")
        member.size = len(info)
        t.addfile(member, io.BytesIO(info))
    return name
