"""Artifacts on the Hugging Face Hub, without a network: ``hfexport.load("org/name")`` and ``hfexport verify
org/name`` from a populated Hugging Face cache (offline, the real cache layout: blobs, snapshots, refs), and
``ExportedModel.push_to_hub`` against a local stand-in of the Hub API (a tiny HTTP server in a thread)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import huggingface_hub
import pytest
import torch

import hfexport
from helpers import TinyMLP
from hfexport import IntegrityError, cli

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("hub")
    model = TinyMLP().eval()
    inputs = {"x": torch.randn(2, 8, generator=torch.Generator().manual_seed(0))}
    exported = hfexport.export(model, inputs)
    return {"model": model, "inputs": inputs, "exported": exported, "dir": exported.save_pretrained(base / "mlp")}


# ── load from a populated Hugging Face cache, offline ─────────────────────────────────────────────────────
def populate_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT,
                   ref: str = "main") -> Path:
    """Lay ``files`` (path in the repository -> bytes) out as huggingface_hub does: content-addressed blobs,
    a snapshot of relative symlinks into them, ``refs/<ref>`` holding the commit. Returns the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


def artifact_files(directory: Path, prefix: str = "") -> dict[str, bytes]:
    return {f"{prefix}{p.name}": p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these once, when imported: set them where it looks them up at call time too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def _assert_matches_eager(loaded: Any, saved: dict[str, Any]) -> None:
    with torch.no_grad():
        expected = saved["model"](**saved["inputs"])
    torch.testing.assert_close(loaded(**saved["inputs"]), expected, atol=1e-5, rtol=1e-5)


def test_load_by_repo_id_from_offline_cache_matches_eager(saved: dict[str, Any], hf_cache: Path) -> None:
    snapshot = populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"]))
    loaded = hfexport.load("org/tiny")
    _assert_matches_eager(loaded, saved)
    assert all((snapshot / name).is_symlink() for name in loaded.manifest["files"])


def test_load_by_repo_id_subfolder_and_revision(saved: dict[str, Any], hf_cache: Path) -> None:
    other = "fedcba9876543210fedcba9876543210fedcba98"
    populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"], "hfexport/dynamo/") | {"config.json": b"{}"},
                   commit=other, ref="v1")
    _assert_matches_eager(hfexport.load("org/tiny", revision="v1", subfolder="hfexport/dynamo"), saved)
    with pytest.raises(FileNotFoundError, match="holds no export.json of org/tiny@v1"):
        hfexport.load("org/tiny", revision="v1")  # the artifact is in a subfolder
    with pytest.raises(ValueError, match="is for a Hub repository id"):
        hfexport.load(saved["dir"], revision="v1")


def test_only_the_files_the_manifest_names_are_fetched(saved: dict[str, Any], hf_cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"]) | {"pytorch_model.bin": b"x" * 64})
    fetched: list[str] = []
    real = huggingface_hub.hf_hub_download

    def spy(repo_id: str, filename: str, **kwargs: Any) -> str:
        fetched.append(filename)
        return real(repo_id, filename, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    hfexport.load("org/tiny")
    assert fetched[0] == "export.json"
    assert sorted(fetched) == sorted(saved["exported"].manifest["files"])


def test_file_missing_from_cache_is_named(saved: dict[str, Any], hf_cache: Path) -> None:
    snapshot = populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"]))
    (snapshot / "model.pt2").unlink()
    with pytest.raises(FileNotFoundError, match=r"holds the export.json of org/tiny but not \['model.pt2'\]"):
        hfexport.load("org/tiny")


def test_repo_not_in_cache_offline(hf_cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match="org/absent is not a local directory.*HF_HUB_OFFLINE"):
        hfexport.load("org/absent")


def test_tampered_blob_is_an_integrity_error(saved: dict[str, Any], hf_cache: Path) -> None:
    snapshot = populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"]))
    blob = (snapshot / "model.pt2").resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="model.pt2: SHA-256"):
        hfexport.load("org/tiny")


def test_traversal_manifest_is_refused_before_any_other_download(saved: dict[str, Any], hf_cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = json.loads((saved["dir"] / "export.json").read_text())
    manifest["components"]["model"]["program_file"] = "../../../../etc/passwd"
    populate_cache(hf_cache, "org/evil", {"export.json": json.dumps(manifest).encode()})
    fetched: list[str] = []
    real = huggingface_hub.hf_hub_download
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo_id, filename, **kw: fetched.append(filename) or real(repo_id, filename, **kw))
    with pytest.raises(ValueError, match="outside the artifact directory"):
        hfexport.load("org/evil")
    assert fetched == ["export.json"]


def test_cli_verify_repo_id(saved: dict[str, Any], hf_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate_cache(hf_cache, "org/tiny", artifact_files(saved["dir"], "hfexport/dynamo/"))
    assert cli.main(["verify", "org/tiny", "--subfolder", "hfexport/dynamo"]) == 0
    out = capsys.readouterr().out
    assert "hub       org/tiny" in out and "hashes" in out and "run" in out
    assert cli.main(["verify", "org/tiny"]) == 1
    assert "holds no export.json of org/tiny" in capsys.readouterr().err


def test_help_does_not_import_huggingface_hub() -> None:
    code = ("import sys, contextlib, io\nfrom hfexport import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: cli.main(['--help'])\n    except SystemExit: pass\nprint('huggingface_hub' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


# ── push_to_hub against a local stand-in of the Hub API ───────────────────────────────────────────────────
class FakeHub:
    """What ``HfApi.create_repo`` / ``get_paths_info`` / ``create_commit`` (small files, regular uploads) and a
    file download call, for one repository's ``main``; records every request and every commit's operations."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.commits: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any, content_type: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:  # noqa: N802
                path = unquote(self.path.split("?")[0])
                with hub.lock:
                    hub.requests.append(("POST", path))
                body = self._body()
                if path == "/api/repos/create":
                    return self._reply(200, {"url": f"http://{self.headers['Host']}/org/tiny", "id": "org/tiny"})
                prefix = "/api/models/org/tiny/"
                if not path.startswith(prefix):
                    return self._reply(404, {"error": f"no route {path}"})
                action = path[len(prefix):].split("/")[0]
                if action == "paths-info":
                    wanted = parse_qs(body.decode()).get("paths", [])
                    with hub.lock:
                        return self._reply(200, [
                            {"type": "file", "path": p, "size": len(hub.files[p]),
                             "oid": hashlib.sha1(b"blob %d\0" % len(hub.files[p]) + hub.files[p]).hexdigest()}
                            for p in wanted if p in hub.files])
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})
                if action == "commit":
                    items = [json.loads(line) for line in body.splitlines() if line.strip()]
                    with hub.lock:
                        hub.commits.append(items)
                        for item in items:
                            if item["key"] == "file":
                                value = item["value"]
                                assert value.get("encoding") == "base64", value
                                hub.files[value["path"]] = base64.b64decode(value["content"])
                    return self._reply(200, {"commitUrl": f"http://{self.headers['Host']}/org/tiny/commit/{'b' * 40}",
                                             "commitOid": "b" * 40})
                return self._reply(404, {"error": f"no route {path}"})

            def do_GET(self) -> None:  # noqa: N802
                path = unquote(self.path.split("?")[0])
                with hub.lock:
                    hub.requests.append((self.command, path))
                prefix = "/org/tiny/resolve/main/"
                name = path[len(prefix):] if path.startswith(prefix) else None
                if name is None or name not in hub.files:
                    return self._reply(404, {"error": f"no file {path}"})
                return self._reply(200, hub.files[name], "application/octet-stream")

            do_HEAD = do_GET  # noqa: N815

        return Handler


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeHub, Any]]:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest sets it for loading
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    hub = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), hub.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = huggingface_hub.HfApi(endpoint=f"http://127.0.0.1:{server.server_address[1]}", token="hf_fake")
    try:
        yield hub, api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _committed_paths(commit: list[dict[str, Any]]) -> list[str]:
    return sorted(item["value"]["path"] for item in commit if item["key"] != "header")


def test_push_to_hub_uploads_exactly_the_artifact_into_its_folder(saved: dict[str, Any],
                                                                  fake_hub: tuple[FakeHub, Any]) -> None:
    hub, api = fake_hub
    hub.files = {"config.json": b'{"model_type": "mine"}', "model.safetensors": b"weights"}  # the model's own
    info = saved["exported"].push_to_hub("org/tiny", api=api)
    assert info.oid == "b" * 40
    assert ("POST", "/api/repos/create") in hub.requests
    assert len(hub.commits) == 1
    commit = hub.commits[0]
    assert not [item for item in commit if item["key"] not in ("header", "file")]  # nothing deleted
    files = saved["exported"].manifest["files"]
    assert _committed_paths(commit) == sorted(f"hfexport/dynamo/{f}" for f in files)
    assert hub.files["config.json"] == b'{"model_type": "mine"}' and hub.files["model.safetensors"] == b"weights"
    for name in files:
        assert hub.files[f"hfexport/dynamo/{name}"] == (saved["dir"] / name).read_bytes()
    assert commit[0]["value"]["summary"].startswith("hfexport: dynamo artifact of")


def test_pushed_artifact_loads_back_from_the_cache(saved: dict[str, Any], hf_cache: Path,
                                                   fake_hub: tuple[FakeHub, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    hub, api = fake_hub
    saved["exported"].push_to_hub("org/tiny", api=api, path_in_repo="elsewhere/here")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    populate_cache(hf_cache, "org/tiny", dict(hub.files))  # what a download of the repository lays out
    _assert_matches_eager(hfexport.load("org/tiny", subfolder="elsewhere/here"), saved)


def test_push_to_root_refuses_to_overwrite_a_model_file(saved: dict[str, Any],
                                                        fake_hub: tuple[FakeHub, Any]) -> None:
    hub, api = fake_hub
    hub.files = {"model.pt2": b"the model's own, unrelated"}
    with pytest.raises(FileExistsError, match=r"would overwrite files .*\['model.pt2'\].*path_in_repo"):
        saved["exported"].push_to_hub("org/tiny", api=api, path_in_repo="")
    assert hub.commits == [] and hub.files == {"model.pt2": b"the model's own, unrelated"}


def test_push_to_root_beside_identical_files_and_over_an_earlier_artifact(saved: dict[str, Any],
                                                                          fake_hub: tuple[FakeHub, Any]) -> None:
    hub, api = fake_hub
    files = saved["exported"].manifest["files"]
    # An earlier artifact at the root: its export.json names its files, which a new push may replace.
    earlier = json.loads((saved["dir"] / "export.json").read_text())
    earlier["model_class"] = "Earlier"
    hub.files = {f: b"earlier " + f.encode() for f in files} | {"export.json": json.dumps(earlier).encode(),
                                                                 "README.md": b"# mine"}
    saved["exported"].push_to_hub("org/tiny", api=api, path_in_repo="", commit_message="refresh")
    assert _committed_paths(hub.commits[-1]) == sorted(files)
    assert hub.commits[-1][0]["value"]["summary"] == "refresh"
    assert hub.files["README.md"] == b"# mine"
    assert ("GET", "/org/tiny/resolve/main/export.json") in hub.requests


def test_push_refuses_a_path_outside_the_repository(saved: dict[str, Any], fake_hub: tuple[FakeHub, Any]) -> None:
    _, api = fake_hub
    with pytest.raises(ValueError, match="path_in_repo"):
        saved["exported"].push_to_hub("org/tiny", api=api, path_in_repo="../up")


def test_a_missing_relative_path_that_reads_as_a_repository_id_says_it_may_be_a_typo(tmp_path, monkeypatch):
    """``out/nope`` reads as ``org/name``; with ``out/`` a local directory, the error also says the path may be
    mistyped (a fresh user's finding: it spoke only of the Hugging Face cache)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"out/ is a local directory, and out/nope does not exist in it"):
        hfexport.load("out/nope")
