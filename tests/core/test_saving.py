"""Saving never loses data: overwrite replaces only an artifact, atomically, restoring the old one on failure;
concurrent saves to one path never both succeed; no umask change; a full disk is a clean OSError.

The artifacts here are kernel-only (a fake component whose writer writes bytes): no backend, no torch.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hfexport import _saving
from hfexport._artifact import MANIFEST_NAME, Component, ExportedModel


class _Runner:
    def run(self, args):
        return []


class _FileRunner(_Runner):
    """Like a FileRunner: the runtime's files are known before saving."""

    def __init__(self, path: Path):
        self.files = [path]


def _artifact(payload: bytes = b"new", *, name: str = "model.bin", delay: float = 0.0, runner=None,
              fail: BaseException | None = None) -> ExportedModel:
    def write(directory: Path) -> list[str]:
        time.sleep(delay)
        (directory / name).write_bytes(payload)
        if fail is not None:
            raise fail
        return [name]

    return ExportedModel("fake", [Component("model", runner or _Runner(), write=write)],
                         {"schema_version": 1, "backend": "fake", "payload": payload.decode(errors="replace")})


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_overwrite_refuses_a_directory_that_is_not_an_artifact(tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')")
    (project / "README.md").write_text("mine")
    before = _tree(project)
    with pytest.raises(FileExistsError, match="not an hfexport artifact.*export.json"):
        _artifact().save_pretrained(project, overwrite=True)
    assert _tree(project) == before
    assert _siblings(project) == ["project"]  # no staging directory or lock file left


def test_overwrite_replaces_an_artifact_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "out"
    _artifact(b"old", name="old.bin").save_pretrained(target)
    with pytest.raises(FileExistsError, match="not empty.*overwrite=True"):
        _artifact(b"new").save_pretrained(target)
    assert (target / "old.bin").read_bytes() == b"old"
    _artifact(b"new").save_pretrained(target, overwrite=True)
    assert set(_tree(target)) == {"model.bin", MANIFEST_NAME}  # the old artifact's files are gone
    assert (target / "model.bin").read_bytes() == b"new"
    assert _siblings(target) == ["out"]


def test_a_failed_overwrite_leaves_the_old_artifact_as_it_was(tmp_path):
    target = tmp_path / "out"
    _artifact(b"old").save_pretrained(target)
    before = _tree(target)
    with pytest.raises(RuntimeError, match="writer broke"):
        _artifact(b"new", fail=RuntimeError("writer broke")).save_pretrained(target, overwrite=True)
    assert _tree(target) == before
    assert _siblings(target) == ["out"]


def test_without_an_atomic_exchange_a_failed_rename_restores_the_old_artifact(tmp_path, monkeypatch):
    target = tmp_path / "out"
    _artifact(b"old").save_pretrained(target)
    before = _tree(target)
    monkeypatch.setattr(_saving, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(src, dst):  # the second rename (staging -> target) fails, after the old one moved away
        if str(src).endswith(".partial"):
            raise OSError(errno.EIO, "injected rename failure")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="injected rename failure"):
        _artifact(b"new").save_pretrained(target, overwrite=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert _tree(target) == before
    assert _siblings(target) == ["out"]  # not hidden under .out.<pid>.old
    _artifact(b"new").save_pretrained(target, overwrite=True)  # and the two-rename path works
    assert (target / "model.bin").read_bytes() == b"new" and _siblings(target) == ["out"]


def test_an_artifact_left_hidden_by_a_crash_is_restored_by_the_next_save(tmp_path):
    target = tmp_path / "out"
    _artifact(b"old").save_pretrained(target)
    target.rename(tmp_path / ".out.old")  # a crash between the two renames of an overwrite
    with pytest.raises(FileExistsError, match="not empty"):
        _artifact(b"new").save_pretrained(target)
    assert (target / "model.bin").read_bytes() == b"old"
    assert _siblings(target) == ["out"]


def _save_concurrently(target: Path, n: int) -> list[object]:
    results: list[object] = [None] * n
    barrier = threading.Barrier(n)

    def save(i: int) -> None:
        barrier.wait()
        try:
            results[i] = _artifact(f"writer {i}".encode(), delay=0.3).save_pretrained(target)
        except Exception as exc:  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=save, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_saves_from_threads_never_both_succeed(tmp_path):
    target = tmp_path / "out"
    results = _save_concurrently(target, 3)
    won = [i for i, r in enumerate(results) if isinstance(r, Path)]
    assert len(won) == 1, results
    assert all(isinstance(r, FileExistsError) for i, r in enumerate(results) if i != won[0]), results
    assert (target / "model.bin").read_bytes() == f"writer {won[0]}".encode()  # the winner's artifact, whole
    assert json.loads((target / MANIFEST_NAME).read_text())["payload"] == f"writer {won[0]}"
    assert _siblings(target) == ["out"]


_SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hfexport._artifact import Component, ExportedModel

    class Runner:
        def run(self, args):
            return []

    def write(directory):
        time.sleep(0.5)
        (directory / "model.bin").write_bytes(sys.argv[2].encode())
        return ["model.bin"]

    artifact = ExportedModel("fake", [Component("model", Runner(), write=write)], {"schema_version": 1})
    Path(sys.argv[3]).touch()  # started
    try:
        artifact.save_pretrained(sys.argv[1])
    except FileExistsError as exc:
        print("refused:", exc)
        sys.exit(3)
    print("saved")
""")


def test_concurrent_saves_from_processes_never_both_succeed(tmp_path):
    target = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, str(target), f"process {i}", str(tmp_path / f"s{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 3], outs
    winner = next(i for i, p in enumerate(procs) if p.returncode == 0)
    assert (target / "model.bin").read_bytes() == f"process {winner}".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s0", "s1"]


def test_a_save_waits_for_the_lock_then_gives_up_naming_the_holder(tmp_path, monkeypatch):
    target = tmp_path / "out"
    monkeypatch.setattr(_saving, "LOCK_TIMEOUT_S", 0.3)
    with _saving.save_lock(target):
        with pytest.raises(TimeoutError, match=f"another save to .*out.*pid {os.getpid()}"):
            _artifact().save_pretrained(target)
    assert not target.exists()
    _artifact().save_pretrained(target)  # the lock was released (and its file removed)
    assert _siblings(target) == ["out"]


def test_save_does_not_touch_the_process_umask(tmp_path, monkeypatch):
    umask = os.umask(0o027)
    try:
        def no_umask(mask):
            raise AssertionError("save_pretrained changed the process umask")

        monkeypatch.setattr(os, "umask", no_umask)
        target = _artifact().save_pretrained(tmp_path / "out")
    finally:
        monkeypatch.undo()
        os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o750  # a plain mkdir under that umask
    assert (target / MANIFEST_NAME).stat().st_mode & 0o777 == 0o640


def test_a_full_disk_is_a_clean_oserror_naming_the_path(tmp_path):
    target = tmp_path / "out"
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as info:
        _artifact(b"x" * 1000, fail=full).save_pretrained(target)
    assert info.value.errno == errno.ENOSPC
    assert str(target) in str(info.value) and "at least 1,000 bytes" in str(info.value)
    assert info.value.__cause__ is full
    assert list(tmp_path.iterdir()) == []  # no staging directory, no lock file, no artifact


def test_a_save_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
    program = tmp_path / "runtime" / "model.bin"
    program.parent.mkdir()
    program.write_bytes(b"x" * 5000)
    monkeypatch.setattr(_saving, "_free_bytes", lambda path: 100)
    target = tmp_path / "out"
    with pytest.raises(OSError, match=r"saving the artifact to .*out: it needs at least 5,000 bytes, 100 bytes"
                                      r" are free") as info:
        _artifact(runner=_FileRunner(program)).save_pretrained(target)
    assert info.value.errno == errno.ENOSPC and info.value.bytes_needed == 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime"]


def test_update_manifest_replaces_export_json_atomically(tmp_path):
    target = _artifact().save_pretrained(tmp_path / "out")
    manifest = _saving.update_manifest(target, MANIFEST_NAME, {"verification": {"passed": True}})
    assert json.loads((target / MANIFEST_NAME).read_text()) == manifest
    assert manifest["verification"] == {"passed": True} and manifest["backend"] == "fake"
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST_NAME, "model.bin"]
    assert _siblings(target) == ["out"]
