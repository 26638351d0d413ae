"""A ``.pt2`` is read by hfexport (``hfexport_dynamo._pt2.read_pt2``), never by ``torch.export.load``: each crafted
archive below is refused (or loads without running what it carries), and where ``trust_remote_code=True`` hands
the same file to torch, the code runs: the check is what stood between the file and the code."""

from __future__ import annotations

import copyreg
import errno
import io
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from crafting import copy_artifact, rehash, rewrite_zip

import hfexport
from helpers import TinyMLP
from hfexport import UntrustedArtifactError
from hfexport_dynamo._pt2 import read_pt2
from hfexport_dynamo._pt2_archive import RestrictedUnpickler, _Members, unpickle_sample_inputs
from hfexport_dynamo._pt2_program import parse_sym_expr


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("pt2")
    mlp = TinyMLP().eval()
    return {"mlp": mlp, "x": torch.randn(2, 8),
            "dir": hfexport.export(mlp, {"x": torch.randn(2, 8)}).save_pretrained(base / "mlp"),
            "dyn": hfexport.export(mlp, {"x": torch.randn(3, 8)}, dynamic_shapes={"x": {0: torch.export.Dim("b")}}
                                   ).save_pretrained(base / "dyn")}


class _WritesMarker:
    """Unpickling it runs ``exec``: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _edit_json(record: str, edit: Any) -> Any:
    def rewrite(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        return [(n, json.dumps(edit(json.loads(d))).encode() if n.endswith(record) else d) for n, d in members]
    return rewrite


def test_read_pt2_gives_the_program_torch_gives(saved: dict[str, Any]) -> None:
    ours = read_pt2(saved["dyn"] / "model.pt2")
    theirs = torch.export.load(saved["dyn"] / "model.pt2")
    x = torch.randn(5, 8)
    for a, b in zip(ours.module()(x), theirs.module()(x), strict=True):
        torch.testing.assert_close(a, b)
    assert str(ours.range_constraints) == str(theirs.range_constraints)
    assert ours.example_inputs[0][0].shape == theirs.example_inputs[0][0].shape


def test_pickled_weight_is_refused_and_runs_only_when_trusted(saved: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(_WritesMarker(marker), buffer)

    def config(data: dict[str, Any]) -> dict[str, Any]:
        first = next(iter(data["config"].values()))
        first["use_pickle"] = True
        return data

    artifact = copy_artifact(saved["dir"], tmp_path)
    rewrite_zip(artifact / "model.pt2", lambda ms: [(n, buffer.getvalue() if n.endswith("weights/weight_0") else d)
                                                    for n, d in _edit_json("model_weights_config.json", config)(ms)])
    rehash(artifact)
    with pytest.raises(UntrustedArtifactError, match="a pickle"):
        hfexport.load(artifact)
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 - torch unpickles it (running exec), then fails on the result
        hfexport.load(artifact, trust_remote_code=True)
    assert marker.read_text() == "ran"


def test_an_archive_of_too_many_members_is_refused_before_zipfile_reads_them(saved: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    """Issue 43's bounds probe: at the old bound of 1,000,000 members a 103 MiB archive of empty members took 17 s
    and +692 MiB (a ZipInfo per entry) before its layout was refused. The end record's counts are checked first."""
    import zipfile

    from hfexport_dynamo._pt2_archive import PT2_MAX_MEMBERS

    artifact = copy_artifact(saved["dir"], tmp_path)
    file = artifact / "model.pt2"
    with zipfile.ZipFile(file) as archive:
        root, existing = archive.infolist()[0].filename.split("/")[0], len(archive.infolist())
    with zipfile.ZipFile(file, "a") as archive:
        for i in range(PT2_MAX_MEMBERS + 1 - existing):
            archive.writestr(f"{root}/x/{i}", b"")
    rehash(artifact)
    with pytest.raises(ValueError, match=rf"and {PT2_MAX_MEMBERS + 1:,} members, over the bound of"):
        hfexport.load(artifact)


@pytest.mark.parametrize(("case", "message"), [
    ("duplicate", "appears twice"),
    ("case twin", "differ only in case"),
    ("aotinductor", "outside the layout"),
    ("extra", "outside the layout"),
    ("compressed", "compressed"),
    ("unused", "does not use"),
    ("custom object", "not a raw tensor"),
    ("name", "is not a name"),
])
def test_archive_outside_torchs_layout_is_refused(saved: dict[str, Any], tmp_path: Path, case: str,
                                                   message: str) -> None:
    artifact = copy_artifact(saved["dir"], tmp_path)
    file = artifact / "model.pt2"
    compression = 8 if case == "compressed" else 0

    def edit(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        program = next(d for n, d in members if n.endswith("models/model.json"))
        root = members[0][0].split("/")[0]  # "archive" (torch names it after a buffer) or the file's stem
        if case == "duplicate":  # torch's reader and zipfile may pick different copies
            return [*members, (f"{root}/models/model.json", program.replace(b"aten.relu", b"aten.sigmoid"))]
        if case == "case twin":  # torch's reader matches names case-insensitively
            return [*members, (f"{root}/models/MODEL.json", program)]
        if case == "aotinductor":  # load_pt2 would load it as a shared library
            return [*members, (f"{root}/data/aotinductor/model/model.so", b"\x7fELF")]
        if case == "extra":
            return [*members, (f"{root}/extra/notes.txt", b"x")]
        if case == "unused":
            return [*members, (f"{root}/data/weights/weight_99", b"\0" * 16)]
        if case == "custom object":
            return _edit_json("model_constants_config.json", lambda c: {"config": {"obj": {
                "path_name": "custom_obj_0", "is_param": False, "use_pickle": False, "tensor_meta": None}}})(members)
        if case == "name":  # a parameter name torch.fx would write into the code it generates
            return _edit_json("model_weights_config.json", lambda c: {"config": {
                f'{k}") or __import__("os").system("true") or ("': v for k, v in c["config"].items()}})(members)
        return members

    rewrite_zip(file, edit, compression)
    rehash(artifact)
    with pytest.raises((ValueError, UntrustedArtifactError), match=message):
        hfexport.load(artifact)


def test_pytree_spec_naming_a_module_is_refused_and_never_imported(saved: dict[str, Any], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """torch registers ``collections.defaultdict``: its context names a module, which ``treespec_loads`` imports."""
    marker = tmp_path / "marker"
    (tmp_path / "hfexport_test_evil_factory.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nf = list\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = json.dumps([1, {"type": "collections.defaultdict", "context": {
        "default_factory_module": "hfexport_test_evil_factory", "default_factory_name": "f", "dict_context": []},
        "children_spec": []}])

    def program(data: dict[str, Any]) -> dict[str, Any]:
        data["graph_module"]["module_call_graph"][0]["signature"]["out_spec"] = spec
        return data

    artifact = copy_artifact(saved["dir"], tmp_path)
    rewrite_zip(artifact / "model.pt2", _edit_json("models/model.json", program))
    rehash(artifact)
    with pytest.raises(UntrustedArtifactError, match="collections.defaultdict"):
        hfexport.load(artifact)
    assert not marker.exists() and "hfexport_test_evil_factory" not in sys.modules
    torch.utils._pytree.treespec_loads(spec)  # torch's own reader imports it
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("expr", [
    "Pow(Integer(10), Integer(100000000))",  # sympy would compute a 10**8-digit number
    "Integer(10)^Integer(100000000)",  # sympify reads ^ as **
    "Integer(" + "9" * 5000 + ")",
    "__import__('os').system('true')",
    "(" * 2000 + "s0" + ")" * 2000,
])
def test_shape_expression_outside_the_grammar_is_refused_fast(saved: dict[str, Any], tmp_path: Path,
                                                              expr: str) -> None:
    def program(data: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(data)
        start = text.index('"expr_str": "') + len('"expr_str": "')
        end = text.index('"', start)
        return json.loads(text[:start] + json.dumps(expr)[1:-1] + text[end:])

    artifact = copy_artifact(saved["dyn"], tmp_path)
    rewrite_zip(artifact / "model.pt2", _edit_json("models/model.json", program))
    rehash(artifact)
    start = time.perf_counter()
    with pytest.raises(UntrustedArtifactError, match="outside hfexport's grammar|characters"):
        hfexport.load(artifact)
    assert time.perf_counter() - start < 5


def test_grammar_builds_what_sympify_builds() -> None:
    import sympy

    symbols: dict[str, Any] = {}
    s = parse_sym_expr("Symbol('s77', positive=True, integer=True)", symbols)
    assert s == sympy.Symbol("s77", positive=True, integer=True)
    assert parse_sym_expr("Mul(Integer(32), s77)", symbols) == 32 * s
    from torch.utils._sympy.functions import FloorDiv

    text = "FloorDiv(s77, 2) + Max(1, s77 % 3)"
    assert parse_sym_expr(text, symbols) == sympy.sympify(text, locals={"FloorDiv": FloorDiv, "s77": s})


def test_shape_expressions_of_too_many_calls_are_refused_by_the_bound() -> None:
    """Issue 43's bounds probe: sympy builds each call in 1-7 ms inside a long product or sum (one 20,000-character
    product of 600 Max() took 11 s of CPU). An expression of more than EXPR_MAX_CALLS calls, or a program whose
    distinct expressions make more than PROGRAM_MAX_EXPR_CALLS, is refused naming the bound; an expression
    repeated is parsed once (counted once)."""
    from hfexport_dynamo._pt2_program import EXPR_MAX_CALLS, PROGRAM_MAX_EXPR_CALLS, _check_program

    def product(count: int, offset: int = 0) -> str:
        return "*".join(f"Max(s7, {offset + k + 2})" for k in range(count))

    assert parse_sym_expr(product(EXPR_MAX_CALLS)) is not None
    with pytest.raises(ValueError, match=rf"more than {EXPR_MAX_CALLS} function calls .*EXPR_MAX_CALLS"):
        parse_sym_expr(product(EXPR_MAX_CALLS + 1))
    per = PROGRAM_MAX_EXPR_CALLS // EXPR_MAX_CALLS
    repeated = {"a": [{"expr_str": product(EXPR_MAX_CALLS, 1000 * i)} for _ in range(3) for i in range(per)]}
    _check_program(repeated, "model.pt2", {})  # at the bound, each distinct text counted once
    over = {"a": [{"expr_str": product(EXPR_MAX_CALLS, 1000 * i)} for i in range(per + 1)]}
    with pytest.raises(UntrustedArtifactError, match=rf"more than {PROGRAM_MAX_EXPR_CALLS:,} function calls in all "
                                                     r".*PROGRAM_MAX_EXPR_CALLS"):
        _check_program(over, "model.pt2", {})


# ── the restricted unpickler ───────────────────────────────────────────────────────────────────────────────
def _torch_save(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _with_pickle(saved_bytes: bytes, pickled: bytes) -> bytes:
    """A torch.save zip whose data.pkl is ``pickled``."""
    import zipfile

    source = zipfile.ZipFile(io.BytesIO(saved_bytes))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            target.writestr(info.filename, pickled if info.filename.endswith("data.pkl") else source.read(info))
    return buffer.getvalue()


def test_restricted_unpickler_reads_tensors() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    args, kwargs = unpickle_sample_inputs(_torch_save(((x, x[1]), {"m": torch.ones(2, dtype=torch.long)})), "t")
    torch.testing.assert_close(args[0], x)
    torch.testing.assert_close(args[1], x[1])
    assert kwargs["m"].dtype == torch.long


@pytest.mark.parametrize("pickled", [
    pickle.dumps(os.system, protocol=0),  # GLOBAL
    pickle.dumps(os.system, protocol=4),  # STACK_GLOBAL
    b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94h\x00h\x01\x93\x94.",  # names fetched from the memo
    b"\x80\x02\x82\xf1\x03.",  # EXT1: a copyreg extension code (registered below)
    pickle.dumps(_WritesMarker(Path("/nonexistent")), protocol=2),
    b"\x80\x02ccollections\nOrderedDict\n)R}X\x03\x00\x00\x00__dict__}sb.",  # BUILD
    b"(cos\nsystem\nX\x04\x00\x00\x00trueo.",  # OBJ
])
def test_restricted_unpickler_refuses_everything_else(pickled: bytes) -> None:
    copyreg.add_extension("os", "system", 1009)
    try:
        data = _with_pickle(_torch_save(((torch.ones(1),), {})), pickled)
        with pytest.raises(UntrustedArtifactError, match="restricted unpickler"):
            unpickle_sample_inputs(data, "t")
    finally:
        copyreg.remove_extension("os", "system", 1009)


def test_restricted_unpickler_has_no_extension_or_build_opcodes() -> None:
    for opcode in (pickle.EXT1, pickle.EXT2, pickle.EXT4, pickle.BUILD, pickle.INST, pickle.OBJ, pickle.NEWOBJ,
                   pickle.NEWOBJ_EX, pickle.PERSID):
        assert opcode[0] not in RestrictedUnpickler.dispatch


def test_zip_reader_refuses_members_beyond_the_file(tmp_path: Path) -> None:
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/archive_format", b"pt2")
    with pytest.raises(ValueError, match="more than the archive"):
        _Members(io.BytesIO(buffer.getvalue()), "t", frozenset({"archive_format"}), __import__("re").compile("x"), 1)


def test_a_zip_version_zipfile_cannot_read_is_an_integrity_error(saved: dict[str, Any], tmp_path: Path) -> None:
    """One byte of a central-directory entry (version needed to extract: 22.6) made zipfile raise a bare
    NotImplementedError (found by the fuzz probe, seed 3)."""
    from hfexport import IntegrityError

    artifact = copy_artifact(saved["dir"], tmp_path)
    data = bytearray((artifact / "model.pt2").read_bytes())
    end = data.rindex(b"PK\x05\x06")  # the archive's own end record (sample inputs are a zip inside it)
    entry = int.from_bytes(data[end + 16: end + 20], "little")  # its first central-directory entry
    assert data[entry: entry + 4] == b"PK\x01\x02"
    data[entry + 6: entry + 8] = (226).to_bytes(2, "little")
    (artifact / "model.pt2").write_bytes(bytes(data))
    rehash(artifact)
    with pytest.raises(IntegrityError, match="model.pt2 is not a zip archive .*zip file version 22.6"):
        hfexport.load(artifact)


def test_member_names_without_the_utf8_flag_import_no_codec(saved: dict[str, Any], tmp_path: Path) -> None:
    """A central-directory entry without its UTF-8 flag (a flipped byte: the fuzz probe, seed 4) made zipfile decode
    the name as cp437, importing ``encodings.cp437`` while the artifact was read. Names are read as UTF-8."""
    artifact = copy_artifact(saved["dir"], tmp_path)
    data = bytearray((artifact / "model.pt2").read_bytes())
    end = data.rindex(b"PK\x05\x06")
    entry, count = int.from_bytes(data[end + 16: end + 20], "little"), int.from_bytes(data[end + 10: end + 12], "little")
    for _ in range(count):  # clear bit 11 (UTF-8 names) of every entry; torch's names are ASCII
        assert data[entry: entry + 4] == b"PK\x01\x02"
        data[entry + 9] &= ~0x08 & 0xFF
        name, extra, comment = (int.from_bytes(data[entry + at: entry + at + 2], "little") for at in (28, 30, 32))
        entry += 46 + name + extra + comment
    (artifact / "model.pt2").write_bytes(bytes(data))
    rehash(artifact)
    sys.modules.pop("encodings.cp437", None)
    loaded = hfexport.load(artifact)
    assert "encodings.cp437" not in sys.modules
    torch.testing.assert_close(loaded(x=saved["x"])[0], hfexport.load(saved["dir"])(x=saved["x"])[0])


# ── saving onto a full disk ────────────────────────────────────────────────────────────────────────────────
_FULL_DISK_SCRIPT = """
import sys, torch
from hfexport_dynamo._pt2 import save_program
program = torch.export.export(torch.nn.Linear(64, 64), (torch.randn(2, 64),))
try:
    save_program(program, sys.argv[1])
except OSError as exc:
    print("OSError", exc.errno)
"""


def test_a_full_disk_is_an_oserror_not_an_abort(tmp_path: Path) -> None:
    """torch's archive writer aborts the interpreter (SIGABRT) when a write fails; ``save_program`` never lets it
    see one. ``/dev/full`` fails every write with ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK_SCRIPT, "/dev/full"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"OSError {errno.ENOSPC}"


def test_the_saved_program_names_no_file_of_the_exporting_machine(saved: dict[str, Any]) -> None:
    """torch.export keeps each node's Python stack (absolute paths) in its meta: left out of the saved file, kept
    in memory; the saved program still loads and runs as the export did."""
    import zipfile

    here = str(Path(__file__).resolve().parents[2]).encode()
    with zipfile.ZipFile(saved["dir"] / "model.pt2") as archive:
        for name in archive.namelist():
            assert here not in archive.read(name) and sys.prefix.encode() not in archive.read(name), name
    loaded = hfexport.load(saved["dir"])
    torch.testing.assert_close(loaded(x=saved["x"]), saved["mlp"](saved["x"]), atol=1e-6, rtol=1e-6)
