"""The SDK's in-tree build backend makes a correct wheel with nothing but the standard library
(this is what lets `pip install ./sdk/python` work offline)."""

import base64
import hashlib
import importlib.util
import os
import zipfile

SDK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _backend():
    spec = importlib.util.spec_from_file_location(
        "airlock_build", os.path.join(SDK, "_build", "airlock_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_holds_the_package_and_a_valid_record(tmp_path):
    backend = _backend()
    assert backend.get_requires_for_build_wheel() == []
    name = backend.build_wheel(str(tmp_path))
    assert name == "airlock_sdk-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        assert "airlock/__init__.py" in names
        assert "airlock/py.typed" in names
        assert not any("__pycache__" in n for n in names)
        metadata = z.read("airlock_sdk-0.1.0.dist-info/METADATA").decode()
        assert "Name: airlock-sdk" in metadata
        assert "Requires-Python: >=3.9" in metadata
        record = z.read("airlock_sdk-0.1.0.dist-info/RECORD").decode().splitlines()
        listed = {}
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            listed[path] = (digest, size)
        assert set(listed) == names
        for path, (digest, size) in listed.items():
            if path.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = z.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), path
            assert int(size) == len(data), path


def test_sdist_and_metadata_hooks(tmp_path):
    backend = _backend()
    dist_info = backend.prepare_metadata_for_build_wheel(str(tmp_path))
    assert (tmp_path / dist_info / "METADATA").read_text().startswith("Metadata-Version: 2.1")
    sdist = backend.build_sdist(str(tmp_path))
    import tarfile
    with tarfile.open(tmp_path / sdist) as t:
        members = set(t.getnames())
    assert "airlock_sdk-0.1.0/pyproject.toml" in members
    assert "airlock_sdk-0.1.0/_build/airlock_build.py" in members
    assert "airlock_sdk-0.1.0/airlock/sandbox.py" in members
