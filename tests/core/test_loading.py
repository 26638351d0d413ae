"""Loading an artifact as untrusted input (kernel behaviour, on dynamo artifacts): a fresh process loads it with
nothing imported first; no code runs from it (crafted pickles, shape expressions, guards, output modules); every
file it names lies inside it; every file's SHA-256 is checked; the manifest's schema is validated; ``hfexport
verify`` says what it checked."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import hfexport
from helpers import TinyMLP, load_in_fresh_process, tiny_model
from hfexport import IntegrityError, ManifestError, UntrustedArtifactError, cli
from hfexport._pickle_globals import pickle_globals, unsafe_pickle_globals

# ── fixtures: one tiny BERT and one plain module, exported once ─────────────────────────────────────────────


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("artifacts")
    bert, mlp = tiny_model("bert", layers=1), TinyMLP().eval()
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    out: dict[str, Any] = {"bert_inputs": {"input_ids": ids}, "mlp_inputs": {"x": x}, "bert": bert, "mlp": mlp}
    out["bert_dir"] = hfexport.export(bert, out["bert_inputs"]).save_pretrained(base / "bert")
    out["mlp_dir"] = hfexport.export(mlp, out["mlp_inputs"]).save_pretrained(base / "mlp")
    # dynamic: its program holds shape expressions and guards
    out["dyn_dir"] = hfexport.export(mlp, {"x": torch.randn(3, 8)}, dynamic_shapes={"x": {0: torch.export.Dim("batch")}}
                                     ).save_pretrained(base / "dyn")
    return out


def _copy(source: Path, tmp_path: Path, name: str = "artifact") -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "export.json").read_text())


def _write_manifest(directory: Path, manifest: Any) -> None:
    (directory / "export.json").write_text(json.dumps(manifest))


def _rehash(directory: Path) -> None:
    """Record the current files' hashes, as an attacker who rewrites the files would."""
    manifest = _manifest(directory)
    manifest["files_sha256"] = {name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
                                       "size": (directory / name).stat().st_size}
                                for name in manifest.get("files_sha256", {})}
    _write_manifest(directory, manifest)


def _rewrite_pt2(file: Path, replace: dict[str, bytes] | None = None, edit_json: Any = None) -> None:
    """Rewrite members of a .pt2 (record name below the archive root -> bytes; a function of the program JSON)."""
    source = zipfile.ZipFile(file)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            record = info.filename.split("/", 1)[1]
            if replace and record in replace:
                data = replace[record]
            if edit_json and record.startswith("models/") and record.endswith(".json"):
                data = json.dumps(edit_json(json.loads(data))).encode()
            target.writestr(info.filename, data)
    source.close()
    file.write_bytes(buffer.getvalue())


class _WritesMarker:
    """Unpickling it runs ``exec``: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# ── every artifact loads in a fresh process ─────────────────────────────────────────────────────────────────
def test_fresh_process_loads_transformers_and_plain_module(saved: dict[str, Any], tmp_path: Path) -> None:
    results = load_in_fresh_process({"bert": (saved["bert_dir"], saved["bert_inputs"]),
                                     "mlp": (saved["mlp_dir"], saved["mlp_inputs"])}, tmp_path)
    for name in ("bert", "mlp"):
        with torch.no_grad():
            expected = pytree.tree_leaves(saved[name](**saved[f"{name}_inputs"]))
        kind, leaves = results[name]
        assert len(leaves) == len(expected)
        for got, want in zip(leaves, expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert results["bert"][0] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    assert results["mlp"][0] == "builtins.tuple"


# ── no code runs from the artifact ─────────────────────────────────────────────────────────────────────────
def test_crafted_pickle_in_pt2_is_refused_and_never_runs(saved: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(((_WritesMarker(marker),), {}), buffer)  # the sample inputs torch.export.load unpickles
    artifact = _copy(saved["mlp_dir"], tmp_path)
    _rewrite_pt2(artifact / "model.pt2", replace={"data/sample_inputs/model.pt": buffer.getvalue()})
    _rehash(artifact)
    with pytest.raises(UntrustedArtifactError, match=r"data/sample_inputs/model.pt.*exec.*trust_remote_code"):
        hfexport.load(artifact)
    assert not marker.exists()
    # the opt-in lets torch unpickle it: the check above is what stood between the file and the code
    with contextlib.suppress(Exception):  # whatever torch makes of the rest
        hfexport.load(artifact, trust_remote_code=True)(**saved["mlp_inputs"])
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("where", ["expr_str", "guards_code", "target"])
def test_code_in_program_json_is_refused(saved: dict[str, Any], tmp_path: Path, where: str) -> None:
    marker = tmp_path / "marker"
    code = f"__import__('pathlib').Path({str(marker)!r}).write_text('ran')"

    def edit(program: dict[str, Any]) -> dict[str, Any]:
        if where == "guards_code":  # exec-ed by program.module()
            program["guards_code"] = [*program["guards_code"], f"{code} is None"]
            return program
        text = json.dumps(program)
        if where == "expr_str":  # sympy.sympify-ed (eval) on load
            start = text.index('"expr_str": "') + len('"expr_str": "')
            text = text[:start] + json.dumps(f"{code} and ")[1:-1] + text[start:]
        else:  # a node target resolved by attribute lookup and called on run
            text = text.replace('"torch.ops.aten.relu.default"', '"torch.os.system"', 1)
        return json.loads(text)

    artifact = _copy(saved["dyn_dir"], tmp_path)
    _rewrite_pt2(artifact / "model.pt2", edit_json=edit)
    _rehash(artifact)
    if where == "guards_code":  # hfexport loads without guards (it checks inputs against the manifest): never exec-ed
        hfexport.load(artifact)(x=torch.randn(3, 8))
    else:
        with pytest.raises(UntrustedArtifactError, match="outside hfexport's grammar|is not an operator"):
            hfexport.load(artifact)(x=torch.randn(3, 8))
    assert not marker.exists()


def test_output_modules_are_never_imported(saved: dict[str, Any], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "hfexport_test_evil_outputs.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    artifact = _copy(saved["mlp_dir"], tmp_path)
    manifest = _manifest(artifact)
    for section in (manifest, manifest["components"]["model"]):
        section["output_modules"] = ["hfexport_test_evil_outputs"]
    _write_manifest(artifact, manifest)
    hfexport.load(artifact)(**saved["mlp_inputs"])  # the outputs are a tuple: nothing to import
    assert not marker.exists()

    # an output type that is neither registered nor transformers': refused, its module not imported
    spec = json.loads(manifest["components"]["model"]["output_spec"])
    spec[1]["type"] = "hfexport_test_evil_outputs.Output"
    manifest["components"]["model"]["output_spec"] = json.dumps(spec)
    _write_manifest(artifact, manifest)
    with pytest.raises(UntrustedArtifactError, match="hfexport_test_evil_outputs.Output.*does not admit"):
        hfexport.load(artifact)
    assert not marker.exists()


def test_pickle_globals_are_read_without_unpickling() -> None:
    assert pickle_globals(pickle.dumps(os.system, protocol=0)) == [(os.system.__module__, "system")]
    assert (os.system.__module__, "system") in pickle_globals(pickle.dumps(os.system, protocol=4))  # STACK_GLOBAL
    # names pushed once and fetched from the memo (BINGET) are still read
    memo = (b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94h\x00h\x01\x93\x94.")
    assert pickle_globals(memo) == [("os", "system"), ("os", "system")]
    assert unsafe_pickle_globals(b"\x80\x02\x82\x01.")[0].startswith("(unreadable pickle: opcode EXT1")
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(2), "p": torch.nn.Parameter(torch.ones(1)), "i": torch.arange(3)}, buffer)
    data = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    pickled = data.read(next(n for n in data.namelist() if n.endswith("data.pkl")))
    assert unsafe_pickle_globals(pickled) == []


# ── every file the manifest names lies inside the artifact ─────────────────────────────────────────────────
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "files"])
def test_manifest_pointing_outside_is_refused(saved: dict[str, Any], tmp_path: Path, how: str) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    outside = tmp_path / "outside.pt2"
    shutil.copyfile(artifact / "model.pt2", outside)  # a loadable program outside the artifact
    manifest = _manifest(artifact)
    if how == "symlink":
        (artifact / "model.pt2").unlink()
        (artifact / "model.pt2").symlink_to(outside)
    elif how == "files":
        manifest["files"].append("../outside.pt2")
        manifest["files_sha256"]["../outside.pt2"] = manifest["files_sha256"]["model.pt2"]
    else:
        name = "../outside.pt2" if how == "dotdot" else str(outside)
        for section in (manifest, manifest["components"]["model"]):
            section["program_file"] = name
        manifest["files_sha256"][name] = manifest["files_sha256"]["model.pt2"]  # hashed: only the path check stops it
    _write_manifest(artifact, manifest)
    with pytest.raises(ValueError, match="outside the artifact directory"):
        hfexport.load(artifact)


def test_hugging_face_cache_layout_symlinks_into_blobs_load(saved: dict[str, Any], tmp_path: Path) -> None:
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in saved["mlp_dir"].iterdir():  # how huggingface_hub lays out a download
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    hfexport.load(snapshot)(**saved["mlp_inputs"])
    (snapshot / "model.pt2").unlink()
    (snapshot / "model.pt2").symlink_to(saved["mlp_dir"] / "model.pt2")  # out of the repository: refused
    with pytest.raises(ValueError, match="outside the artifact directory"):
        hfexport.load(snapshot)


@pytest.mark.parametrize("how", ["blobs linked elsewhere", "blob linked out", "ancestor blobs"])
def test_only_the_caches_own_blobs_count_as_a_root(saved: dict[str, Any], tmp_path: Path, how: str) -> None:
    """Issue 43: in a Hub-style ``repo/snapshots/<rev>/`` whose ``repo/blobs`` is a symlink (to ``/`` there), every
    file of the artifact could be a link anywhere on disk: the roots accepted any ancestor's ``blobs`` after
    resolving it. Now only that cache's own ``blobs`` directory, not a link, and a file's link must be the
    ``../../blobs/<blob>`` huggingface_hub writes."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo = tmp_path / ("outer/snapshots/r/models--org--tiny" if how == "ancestor blobs" else "models--org--tiny")
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    blobs = repo / "blobs"
    if how == "blobs linked elsewhere":
        blobs.symlink_to(elsewhere)
    else:
        blobs.mkdir()
    if how == "ancestor blobs":  # the real repository has no blobs here; an ancestor "snapshots" has
        shutil.rmtree(blobs)
        (tmp_path / "outer" / "blobs").symlink_to(elsewhere)
    for file in saved["mlp_dir"].iterdir():
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, elsewhere / blob)
        if how == "blob linked out":
            (blobs / blob).symlink_to(elsewhere / blob)  # the blob itself a link out of the cache
            (snapshot / file.name).symlink_to(Path("../../blobs") / blob)
        elif how == "ancestor blobs":
            (snapshot / file.name).symlink_to(elsewhere / blob)
        else:
            (snapshot / file.name).symlink_to(Path("../../blobs") / blob)
    with pytest.raises(ValueError, match="outside the artifact directory"):
        hfexport.load(snapshot)


def test_a_symlinked_folder_inside_the_artifact_is_refused(saved: dict[str, Any], tmp_path: Path) -> None:
    """No ancestor is trusted: a file named through a folder that is a symlink (here back into the artifact itself)
    is refused, as the OS would follow it."""
    artifact = _copy(saved["mlp_dir"], tmp_path)
    (artifact / "real").mkdir()
    shutil.move(artifact / "model.pt2", artifact / "real" / "model.pt2")
    (artifact / "linked").symlink_to(artifact / "real")
    manifest = _manifest(artifact)
    for section in (manifest, manifest["components"]["model"]):
        section["program_file"] = "linked/model.pt2"
    manifest["files"] = [f if f != "model.pt2" else "linked/model.pt2" for f in manifest["files"]]
    manifest["files_sha256"]["linked/model.pt2"] = manifest["files_sha256"].pop("model.pt2")
    _write_manifest(artifact, manifest)
    with pytest.raises(ValueError, match="goes through a symlink at 'linked'"):
        hfexport.load(artifact)


def _other_mlp_program(tmp_path: Path, inputs: dict[str, Any]) -> Path:
    torch.manual_seed(1234)
    return hfexport.export(TinyMLP().eval(), inputs).save_pretrained(tmp_path / "other") / "model.pt2"


def test_a_file_swapped_after_the_check_never_reaches_the_runtime(saved: dict[str, Any], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: files were hashed by path and the runtime opened the path again; a ``.pt2`` swapped in between
    (a concurrent writer) ran with no error. The runner reads the file once, checks those bytes, and hands them
    over."""
    from crafting import swap_after_check

    artifact = _copy(saved["mlp_dir"], tmp_path)
    swap_after_check(monkeypatch, artifact / "model.pt2", _other_mlp_program(tmp_path, saved["mlp_inputs"]))
    with pytest.raises(IntegrityError, match="model.pt2 changed while it was loaded"):
        hfexport.load(artifact)


def test_a_file_grown_after_the_check_is_an_integrity_error(saved: dict[str, Any], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43, found by ``benchmarks/probe_concurrent_writer.py``: a file a concurrent writer made larger than the
    manifest's size was refused with a bare ``ValueError`` ("is N bytes, over the M expected") by the reader's
    bound, not as the changed file it is."""
    from crafting import swap_after_check

    artifact = _copy(saved["mlp_dir"], tmp_path)
    grown = tmp_path / "grown.pt2"
    grown.write_bytes((artifact / "model.pt2").read_bytes() + b"\0" * 64)
    swap_after_check(monkeypatch, artifact / "model.pt2", grown)
    with pytest.raises(IntegrityError, match=r"model.pt2 changed while it was loaded: 'model.pt2' is [\d,]+ bytes, "
                                             r"over the [\d,]+ expected"):
        hfexport.load(artifact)


def test_a_verification_file_swapped_after_load_is_refused_by_verify(saved: dict[str, Any], tmp_path: Path) -> None:
    """``verify_stored`` reads verification.safetensors once by descriptor and checks its hash on those bytes: one
    rewritten after the load (other stored outputs) is an IntegrityError, not a report against other values."""
    from safetensors.torch import load_file, save_file

    artifact = _copy(saved["mlp_dir"], tmp_path)
    model = hfexport.load(artifact)
    tensors = {k: v + 1 if k.startswith("outputs.") else v
               for k, v in load_file(str(artifact / "verification.safetensors")).items()}
    save_file(tensors, artifact / "verification.safetensors")
    with pytest.raises(IntegrityError, match="verification.safetensors changed while it was loaded"):
        model.verify_stored()


@pytest.mark.slow
def test_a_concurrent_writer_never_changes_dynamo_outputs(saved: dict[str, Any], tmp_path: Path) -> None:
    from crafting import concurrent_swaps

    artifact = _copy(saved["mlp_dir"], tmp_path)
    x = saved["mlp_inputs"]["x"]
    expected = saved["mlp"](x)
    counts = concurrent_swaps(artifact / "model.pt2", _other_mlp_program(tmp_path, saved["mlp_inputs"]), 100,
                              lambda: hfexport.load(artifact)(x=x), lambda out: torch.equal(out[0], expected[0]))
    assert counts["ok"] + counts["refused"] == 100 and counts["swaps"] > 100, counts


# ── integrity ─────────────────────────────────────────────────────────────────────────────────────────────
def test_save_records_size_and_sha256_of_every_file(saved: dict[str, Any]) -> None:
    directory = saved["bert_dir"]
    manifest = _manifest(directory)
    assert manifest["schema_version"] == 2
    assert sorted(manifest["files_sha256"]) == sorted(set(manifest["files"]) - {"export.json"})
    for name, entry in manifest["files_sha256"].items():
        data = (directory / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


@pytest.mark.parametrize("name", ["model.pt2", "config.json"])
def test_flipped_byte_is_detected_before_loading(saved: dict[str, Any], tmp_path: Path, name: str) -> None:
    artifact = _copy(saved["bert_dir"], tmp_path)
    data = bytearray((artifact / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (artifact / name).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=rf"{name}: SHA-256 [0-9a-f]+… where the manifest recorded") as info:
        hfexport.load(artifact)
    assert info.value.files == [name]


def test_each_file_is_read_and_hashed_once_on_load(saved: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: check_integrity hashed every file, then each runner read its program and hashed it again (3.8 GB
    hashed to load Qwen2.5-0.5B's 1.9 GB ONNX artifact). The files a runner reads through artifact_bytes are hashed
    there only, on the bytes it hands over: a load hashes each file's bytes once."""
    import hashlib

    hashed = [0]
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"", **kwargs: Any) -> None:
            self.digest = real(**kwargs)
            self.update(data)

        def update(self, data: Any) -> None:
            hashed[0] += len(data)
            self.digest.update(data)

        def hexdigest(self) -> str:
            return self.digest.hexdigest()

    monkeypatch.setattr(hashlib, "sha256", Counting)
    hfexport.load(saved["bert_dir"])
    assert hashed[0] == sum(entry["size"] for entry in _manifest(saved["bert_dir"])["files_sha256"].values())


def test_truncated_file_is_named_with_its_sizes(saved: dict[str, Any], tmp_path: Path) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    size = (artifact / "model.pt2").stat().st_size
    with open(artifact / "model.pt2", "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(IntegrityError, match=rf"model.pt2: {size - 10:,} bytes where the manifest recorded {size:,}"):
        hfexport.load(artifact)


# ── the manifest's schema ─────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize(("edit", "problems"), [
    (lambda m: [], ["the manifest must be a JSON object, got a list"]),
    (lambda m: {k: v for k, v in m.items() if k not in ("backend", "files_sha256")},
     ["lacks required key 'backend'", "lacks required key 'files_sha256'"]),
    (lambda m: {**m, "schema_version": "2", "files": "model.pt2", "dynamic": "no"},
     ["schema_version is '2'", "files must be a list, got a string", "dynamic must be true or false, got a string"]),
    (lambda m: {**m, "components": {"model": {**m["components"]["model"], "inputs": {"x": 1},
                                              "program_file": 3}}},
     ["components['model'].inputs must be a list, got an object",
      "components.model.program_file must be a file name (a string), got an integer"]),
])
def test_manifest_schema_problems_are_listed_one_per_line(saved: dict[str, Any], tmp_path: Path, edit: Any,
                                                          problems: list[str]) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    _write_manifest(artifact, edit(_manifest(artifact)))
    with pytest.raises(ManifestError) as info:
        hfexport.load(artifact)
    assert len(info.value.problems) == len(problems), info.value.problems
    for problem, expected in zip(info.value.problems, problems, strict=True):
        assert problem.startswith(expected), (problem, expected)
        assert f"  - {problem}" in str(info.value)


def test_manifest_that_is_not_json(saved: dict[str, Any], tmp_path: Path) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    (artifact / "export.json").write_text('{"schema_version": 2,')
    with pytest.raises(ManifestError, match="not valid JSON"):
        hfexport.load(artifact)



def test_json_that_is_not_utf8_is_refused_without_importing_a_codec() -> None:
    """Found by the mutation fuzz test (issue 43): ``json.loads`` on bytes detects UTF-16/32 from the first bytes and
    imports that codec's module while an untrusted file is read (a spliced ``tokenizer.json`` imported
    ``encodings.utf_32_be``). Artifact JSON is read as UTF-8 only; checked in a new process, where no such codec
    module is imported yet."""
    # '{"schema_version": 2}' in UTF-32-BE, spelled without the codec (which would import its module)
    code = ("import sys\nfrom hfexport._trust import parse_json\n"
            "data = b''.join(b'\\0\\0\\0' + bytes([c]) for c in b'{\"schema_version\": 2}')\n"
            "try:\n    print('parsed:', parse_json(data))\n"
            "except ValueError as error:\n    print('refused:', error)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('encodings.utf_32', 'encodings.utf_16'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the bytes are valid UTF-8 (NULs), so the refusal is JSON's; before, json.loads decoded them as UTF-32 and parsed
    assert out.startswith("refused: not valid JSON") and out.strip().endswith("[]"), out

# ── hfexport verify ───────────────────────────────────────────────────────────────────────────────────────
def test_verify_says_what_it_checked(saved: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(saved["bert_dir"])]) == 0
    out = capsys.readouterr().out
    for check in ("✅ manifest  schema 2, backend dynamo, BertModel", "✅ hashes    3 files",
                  "✅ loading   1 component(s) opened on dynamo, no code run from the artifact",
                  "✅ run       component 'model' at input_ids=[1, 8]: 2 outputs, finite, shapes as recorded",
                  "✅ stored    component 'model' re-ran its stored inputs (input_ids=[1, 8]): 2 outputs within "
                  "atol=0.0001, rtol=0.001 of the stored eager outputs",
                  "eager     not compared: pass --model DIR"):
        assert check in out, out


def test_verify_compares_with_the_model(saved: dict[str, Any], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    saved["bert"].save_pretrained(tmp_path / "bert-model")
    assert cli.main(["verify", str(saved["bert_dir"]), "--model", str(tmp_path / "bert-model")]) == 0
    out = capsys.readouterr().out
    assert "✅ eager     at input_ids=[1, 8]:" in out and "PASSED" in out


def test_verify_names_a_corrupt_file(saved: dict[str, Any], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    data = bytearray((artifact / "model.pt2").read_bytes())
    data[-100] ^= 0xFF
    (artifact / "model.pt2").write_bytes(bytes(data))
    assert cli.main(["verify", str(artifact)]) == 1
    captured = capsys.readouterr()
    assert "✅ manifest" in captured.out and "✅ hashes" not in captured.out
    assert captured.err.startswith("error: ") and "model.pt2: SHA-256" in captured.err


# ── loading by construction (issue 24): names only from the manifest, all hashed; bounds; allow-listed specs ──
def test_schema_1_manifest_is_refused_unless_trusted(saved: dict[str, Any], tmp_path: Path) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    manifest = _manifest(artifact)
    manifest["schema_version"] = 1
    del manifest["files_sha256"]  # schema 1 records no hashes: nothing the runtime reads would be checked
    _write_manifest(artifact, manifest)
    with pytest.raises(UntrustedArtifactError, match=r"schema-1.*records no file hashes.*save_pretrained"):
        hfexport.load(artifact)
    hfexport.load(artifact, trust_remote_code=True)(**saved["mlp_inputs"])


@pytest.mark.parametrize("how", ["unhashed", "no name"])
def test_a_runner_opens_only_files_the_manifest_names_and_hashes(saved: dict[str, Any], tmp_path: Path,
                                                                 how: str) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    shutil.copyfile(artifact / "model.pt2", artifact / "other.pt2")  # a file the hash check would not see
    manifest = _manifest(artifact)
    for section in (manifest, manifest["components"]["model"]):
        if how == "unhashed":
            section["program_file"] = "other.pt2"
        else:  # the runner would fall back to a default name
            section.pop("program_file", None)
    _write_manifest(artifact, manifest)
    match = "has no entry for \\['other.pt2'\\]" if how == "unhashed" else "names no file"
    with pytest.raises(ManifestError, match=match):
        hfexport.load(artifact)


@pytest.mark.parametrize("how", ["size", "depth", "integer"])
def test_manifest_bounds_are_a_manifest_error(saved: dict[str, Any], tmp_path: Path, how: str) -> None:
    artifact = _copy(saved["mlp_dir"], tmp_path)
    text = (artifact / "export.json").read_text()
    if how == "size":
        text = text[:-2] + " " * (3 * 2**20) + text[-2:]  # over the 2 MiB bound (4 MiB until issue 43's bounds probe)
    elif how == "depth":  # json raises a bare RecursionError past ~1,000 levels
        text = text[:-2] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + text[-2:]
    else:  # int() of 100,000 digits is refused by Python itself; 4,000 digits are not
        text = text[:-2] + ', "timings_s": {"x": ' + "9" * 4000 + "}" + text[-2:]
    (artifact / "export.json").write_text(text)
    start = time.perf_counter()
    with pytest.raises(ManifestError, match="damaged or crafted"):
        hfexport.load(artifact)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("unit", ["{}", "[]", "0"])
def test_bounded_json_costs_a_few_times_json_loads(unit: str) -> None:
    """Issue 43's bounds probe: a manifest at its size bound of empty objects took 7.9 s of load + generate (at load
    7 on 2 cores), most of it ``parse_json``'s depth walk (a ``(node, depth)`` tuple per value: 21x ``json.loads``'s
    CPU time). Walked level by level over containers only it costs ~3x; the test allows 8x (CPU time, best of 3)."""
    from hfexport._trust import MANIFEST_MAX_BYTES, parse_json

    text = "[" + ",".join([unit] * (MANIFEST_MAX_BYTES // (len(unit) + 1) - 1)) + "]"

    def best(function: Any) -> float:
        times = []
        for _ in range(3):
            start = time.process_time()
            function(text)
            times.append(time.process_time() - start)
        return min(times)

    assert best(parse_json) < 8 * best(json.loads)


def test_bounded_json_runs_no_garbage_collection() -> None:
    """Issue 43's bounds probe: a manifest at its size bound of lists nested 60 deep (2 M containers) took 11.4 s of
    load (3.8 s of CPU) in a process that had imported torch and transformers: each cyclic collection while the
    containers were built scanned their objects too (2.8 s of CPU parsing with it, 0.6 s without)."""
    import gc

    from hfexport._trust import MANIFEST_MAX_BYTES, parse_json

    unit = "[" * 60 + "0" + "]" * 60
    text = "[" + ",".join([unit] * (MANIFEST_MAX_BYTES // (len(unit) + 1) - 1)) + "]"
    collections: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(record)
    try:
        parse_json(text)
    finally:
        gc.callbacks.remove(record)
    assert collections == [] and gc.isenabled()


@pytest.mark.parametrize("how,message", [
    ("count", r"names 303 files, over the 256 a manifest may name"),
    ("components", r"names a file of 40 path components, over the bound of 16"),
    ("component", r"names a file of 300 bytes in one component, over the bound of 255"),
    ("length", r"names a file of 1,499 characters, over the bound of 1,024"),
])
def test_path_bounds_name_the_bound_and_the_value(saved: dict[str, Any], tmp_path: Path, how: str,
                                                 message: str) -> None:
    """Issue 43: 300 paths of 4,000 components took 15.6 s, then a raw ``OSError: File name too long``."""
    artifact = _copy(saved["mlp_dir"], tmp_path)
    manifest = _manifest(artifact)
    names = {"count": [f"f{i}" for i in range(300)], "components": ["/".join(["d"] * 39 + ["f"])],
             "component": ["x" * 300], "length": ["/".join(["y" * 99] * 15)]}[how]
    manifest["files"] += names
    manifest["files_sha256"].update({n: {"sha256": "0" * 64, "size": 1} for n in names})
    _write_manifest(artifact, manifest)
    start = time.perf_counter()
    with pytest.raises(ManifestError, match=message) as caught:
        hfexport.load(artifact)
    assert time.perf_counter() - start < 2 and len(str(caught.value)) < 600  # not every name


@pytest.mark.parametrize("depth", [500, 5_000])  # 5,000: past the recursion limit, the manifest under 2 MiB
def test_a_deeply_nested_output_spec_names_the_depth_limit(saved: dict[str, Any], tmp_path: Path, depth: int) -> None:
    """Issue 43: a deeply nested output spec ended in a raw ``RecursionError`` (the tracer's scan of the spec's
    type names parsed it with ``json.loads`` and walked it recursively)."""
    artifact = _copy(saved["mlp_dir"], tmp_path)
    manifest = _manifest(artifact)
    leaf = '{"type": null, "context": null, "children_spec": []}'
    nested = '{"type": "builtins.list", "context": "null", "children_spec": [' * depth + leaf + "]}" * depth
    spec = f"[1, {nested}]"
    for section in (manifest, manifest["components"]["model"]):
        section["output_spec"] = spec
    _write_manifest(artifact, manifest)
    with pytest.raises(ValueError, match=r"nested deeper than 128 levels") as caught:
        hfexport.load(artifact)
    assert not isinstance(caught.value, RecursionError)


def test_a_verification_file_of_too_many_tensors_names_the_bound(saved: dict[str, Any], tmp_path: Path) -> None:
    """Issue 43: 400,000 tensors in verification.safetensors took 31 s and a message listing every name."""
    from safetensors.torch import save_file

    from hfexport._stored import STORED_MAX_TENSORS

    artifact = _copy(saved["mlp_dir"], tmp_path)
    save_file({f"outputs.t{i}": torch.zeros(1) for i in range(STORED_MAX_TENSORS + 1)},
              artifact / "verification.safetensors")
    _rehash(artifact)
    with pytest.raises(IntegrityError, match=r"holds 4,097 tensors, over the bound of 4,096") as caught:
        hfexport.load(artifact).verify_stored()
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize("context", ["enum", "defaultdict"])
def test_output_spec_naming_a_module_is_refused_and_never_imported(saved: dict[str, Any], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   context: str) -> None:
    marker = tmp_path / "marker"
    module = f"hfexport_test_evil_spec_{context}"
    (tmp_path / f"{module}.py").write_text(
        f"import enum\nopen({str(marker)!r}, 'w').write('ran')\nclass E(enum.Enum):\n    A = 1\nf = list\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    if context == "enum":  # a dict key that is an enum: torch's reader imports its module
        node = {"type": "builtins.dict", "context": json.dumps([{"__enum__": True, "fqn": f"{module}:E",
                                                                 "name": "A"}]),
                "children_spec": [{"type": None, "context": None, "children_spec": []}]}
    else:
        node = {"type": "collections.defaultdict", "context": {"default_factory_module": module,
                                                               "default_factory_name": "f", "dict_context": ["a"]},
                "children_spec": [{"type": None, "context": None, "children_spec": []}]}
    spec = json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [node, node]}])
    artifact = _copy(saved["mlp_dir"], tmp_path)
    manifest = _manifest(artifact)
    for section in (manifest, manifest["components"]["model"]):
        section["output_spec"] = spec
    _write_manifest(artifact, manifest)
    with pytest.raises(UntrustedArtifactError, match="not plain JSON|does not admit"):
        hfexport.load(artifact)(**saved["mlp_inputs"])
    assert not marker.exists()
    pytree.treespec_loads(spec)  # torch's own reader imports it: the check is what stood between
    assert marker.read_text() == "ran"


def test_verification_file_has_the_mode_of_the_others(saved: dict[str, Any]) -> None:
    modes = {p.name: p.stat().st_mode & 0o777 for p in saved["mlp_dir"].iterdir()}
    assert "verification.safetensors" in modes and len(set(modes.values())) == 1, modes


def _mount_tmpfs(path: Path) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack", "openvino"])
def test_saving_onto_a_full_tmpfs_is_an_oserror_and_leaves_nothing(tmp_path: Path, backend: str) -> None:
    """A 96 KiB tmpfs filled but for 8 KiB (root only: skipped elsewhere; ``tests/dynamo/test_pt2_untrusted.py``
    covers torch's writer with ``/dev/full``): the free-space check passes (the weights need ~1 KB), and the write
    fails mid-file (torch's .pt2 writer, ONNX's, ExecuTorch's and OpenVINO's copies)."""
    if backend == "executorch-xnnpack":
        pytest.importorskip("executorch")
    exported = hfexport.export(TinyMLP().eval(), {"x": torch.randn(2, 8)}, backend=backend)
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk):
        pytest.skip("mounting a tmpfs needs root")
    try:
        (disk / "filler").write_bytes(b"\0" * (88 * 1024))
        with pytest.raises(OSError) as info:
            exported.save_pretrained(disk / "out")
        assert info.value.errno == errno.ENOSPC
        assert [p.name for p in disk.iterdir()] == ["filler"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_file_is_read_into_one_buffer(tmp_path: Path) -> None:
    """``read_beneath`` reads a file into one buffer of its size (issue 44: it joined 16 MiB chunks, a transient
    second copy): ``bytes``, or with ``writable`` a ``bytearray`` that tensors are built on; ``max_bytes`` holds."""
    from hfexport.trust import read_beneath

    data = os.urandom(3 * 2**20 + 5)
    (tmp_path / "weights.bin").write_bytes(data)
    read = read_beneath(tmp_path, "weights.bin")
    writable = read_beneath(tmp_path, "weights.bin", writable=True)
    assert type(read) is bytes and read == data
    assert type(writable) is bytearray and writable == data
    (tmp_path / "empty.bin").write_bytes(b"")
    assert read_beneath(tmp_path, "empty.bin") == b"" and read_beneath(tmp_path, "empty.bin", writable=True) == b""
    for flag in (False, True):
        with pytest.raises(ValueError, match="over the 1,000 expected"):
            read_beneath(tmp_path, "weights.bin", max_bytes=1000, writable=flag)
