"""Loading is safe by construction, checked from outside: in a fresh process with an audit hook
(``sys.addaudithook``), ``hfexport.load``, a first call and ``hfexport verify`` of every artifact kind (``.pt2``,
ONNX, ``.pte``; their manifest and ``verification.safetensors``), pristine and mutated as an attacker would
(random bytes of one file changed, then every hash rewritten), import no module, compile and exec nothing but the
code torch.fx generates from a checked graph, open no file outside the artifact (and Python's own installation),
and end in hfexport's errors or in outputs, within time and memory bounds. A crash of the process fails the test.

Plus a property-based test (hypothesis) of the restricted unpickler on pickles built from its own opcodes and
globals. The default run is bounded (a few mutations per kind); ``-m slow`` runs many more.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import hfexport
from helpers import TinyMLP

_PROBE = r'''
import json, os, random, resource, shutil, sys, time, hashlib
spec = json.loads(sys.argv[1])
import torch, hfexport
from hfexport._verify import verify_artifact
import hfexport_dynamo, hfexport_onnx, hfexport_executorch  # the backends (imports before the hook are allowed)

def exercise(directory):
    model = hfexport.load(directory)
    inputs = {"x": torch.randn(2, 8)}
    model(**inputs)
    verify_artifact(directory, out=lambda line: None)

for directory in spec["pristine"]:  # warm-up: every module the loaders import lazily is imported here
    exercise(directory)
warm_rss_mb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def status_mb(field):
    """A /proc/self/status field (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field + ":"))


def reset_peak():
    """Start the peak (VmHWM) anew at the present RSS (Linux: 5 > /proc/self/clear_refs); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False

violations, watching, roots = [], [False], [os.path.realpath(p) for p in spec["allowed_roots"]]
allowed_prefixes = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                         | {"/proc", "/sys", "/dev"})

roots += [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]  # installed distributions' metadata


import tempfile
scratch = os.path.realpath(tempfile.gettempdir())  # O_TMPFILE: an anonymous scratch file hfexport_executorch makes
# Code whose text torch writes itself, from the checked program: typing.get_type_hints evaluating the string
# annotations of torch's own schema, the input guards torch.export._unlift generates from names (checked to be
# names) and integer sizes, and the forward torch.fx generates from the graph.
CODEGEN = (os.sep + "typing.py", os.path.join("torch", "export", "_unlift.py"), os.path.join("torch", "fx", ""))


def from_codegen():
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        if any(part in frame.f_code.co_filename for part in CODEGEN):
            return True
        frame = frame.f_back
    return False


def beneath_a_checked_descriptor():
    """Whether hfexport's descriptor walk (hfexport._artifact_files.open_beneath) makes this open: it opens each component
    relative to the descriptor of the folder before it (openat), starting from the artifact directory, whose own
    open is absolute and checked here; the audit event gives the relative name only."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("hfexport", "_artifact_files.py")) \
                and frame.f_code.co_name in ("_walk_open", "_walk_open_dir"):
            return True
        frame = frame.f_back
    return False


def hook(event, args):
    if not watching[0]:
        return
    if event in ("compile", "exec") and from_codegen():
        return
    if event == "import":
        if args[0] not in sys.modules:
            violations.append(f"import {args[0]}")
    elif event == "compile":
        filename = str(args[1]) if len(args) > 1 else ""
        if not filename.startswith("<eval_with_key>"):
            violations.append(f"compile {filename} {str(args[0])[:80]!r}")
    elif event == "exec":
        code = args[0]
        if not getattr(code, "co_filename", "").startswith("<eval_with_key>"):
            violations.append(f"exec {getattr(code, 'co_filename', code)!r}")
    elif event == "open":
        path = args[0]
        if isinstance(path, int):
            return
        if not os.path.isabs(os.fsdecode(path)) and beneath_a_checked_descriptor():
            return  # a component opened relative to a descriptor of the artifact directory (its open is checked)
        path = os.path.realpath(os.fsdecode(path))
        if path != scratch and not path.startswith(allowed_prefixes) \
                and not any(path == r or path.startswith(r + os.sep) for r in roots):
            import traceback
            violations.append(f"open {path} from {[f'{f.filename}:{f.lineno}' for f in traceback.extract_stack()[-6:-1]]}")

sys.addaudithook(hook)
rng = random.Random(spec["seed"])
results, worst_s, expected = [], 0.0, tuple(getattr(hfexport, n) for n in ("ManifestError", "IntegrityError",
                                                                          "UntrustedArtifactError"))
from hfexport_onnx._errors import OnnxSessionError  # ORT refused the (checked) model: hfexport's error naming it
expected += (OnnxSessionError,)
work = spec["work"]
for directory in spec["pristine"]:
    for trial in range(spec["mutations"] + 1):
        target = os.path.join(work, f"t{len(results)}")
        shutil.copytree(directory, target)
        names = sorted(n for n in os.listdir(target))
        note = "pristine"
        if trial:
            name = rng.choice(names)
            data = bytearray(open(os.path.join(target, name), "rb").read())
            how = rng.choice(["flip", "flip", "truncate", "splice"])
            if how == "flip" and data:
                for _ in range(rng.randint(1, 8)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            elif how == "truncate":
                data = data[: rng.randrange(len(data) + 1)]
            elif data:
                at = rng.randrange(len(data))
                data[at:at] = data[rng.randrange(len(data)):][: rng.randint(1, 64)]
            open(os.path.join(target, name), "wb").write(bytes(data))
            if name != "export.json":  # an attacker rewrites the hashes
                try:
                    manifest = json.load(open(os.path.join(target, "export.json")))
                    manifest["files_sha256"][name] = {"sha256": hashlib.sha256(bytes(data)).hexdigest(),
                                                      "size": len(data)}
                    json.dump(manifest, open(os.path.join(target, "export.json"), "w"))
                except Exception:
                    pass
            note = f"{how} {name}"
        rss_before_mb = status_mb("VmRSS")
        per_trial_peak = reset_peak()
        watching[0] = True
        start = time.perf_counter()
        try:
            exercise(target)
            outcome = "ran"
        except expected as exc:
            outcome = type(exc).__name__
        except ValueError as exc:  # hfexport's checks (a damaged member, a stored file that disagrees)
            outcome = f"ValueError: {str(exc)[:160]}"
        except (TypeError, KeyError, FileNotFoundError, RuntimeError, IndexError) as exc:
            outcome = f"other {type(exc).__name__}: {str(exc)[:160]}"
        finally:
            watching[0] = False
        elapsed = time.perf_counter() - start
        worst_s = max(worst_s, elapsed)
        # what this one load, call and verify allocated above the RSS before it (None: no per-trial peak here)
        grew_mb = round(status_mb("VmHWM") - rss_before_mb, 1) if per_trial_peak else None
        results.append([os.path.basename(directory), note, outcome, round(elapsed, 3), grew_mb])
        shutil.rmtree(target, ignore_errors=True)

print(json.dumps({"violations": violations, "results": results, "worst_s": worst_s, "warm_rss_mb": warm_rss_mb,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


# Tokenizer files as an export for a task copies them (hashed like every file); load, call and verify never read
# them. This tokenizer_config.json names a module to import (``auto_map``), as a crafted one would.
_TOKENIZER_FILES = {"tokenizer_config.json": {"tokenizer_class": "PayloadTokenizer",
                                              "auto_map": {"AutoTokenizer": ["payload.PayloadTokenizer", None]}},
                    "tokenizer.json": {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0},
                                                                   "unk_token": "[UNK]"}}}


def _with_tokenizer_files(exported: Any) -> Any:
    for name, content in _TOKENIZER_FILES.items():
        exported.extra_files[name] = lambda d, name=name, content=content: (d / name).write_text(json.dumps(content))
    return exported


class _PortableOps(torch.nn.Module):
    """A program that is not all XNNPACK: a linear (delegated), an embedding of a constant table by constant ids,
    a cumsum and an argmax (portable kernels), so constants live in the program's own segment."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.register_buffer("table", torch.randn(10, 16))
        self.register_buffer("ids", torch.tensor([1, 7]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.fc(x) + torch.nn.functional.embedding(self.ids, self.table)
        return torch.cumsum(hidden, 1), torch.argmax(hidden, -1)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("fuzz")
    mlp, x = TinyMLP().eval(), torch.randn(2, 8)
    dirs = [_with_tokenizer_files(hfexport.export(mlp, {"x": x})).save_pretrained(base / "dynamo"),
            hfexport.export(mlp, {"x": torch.randn(3, 8)}, dynamic_shapes={"x": {0: torch.export.Dim("b")}}
                            ).save_pretrained(base / "dynamic"),
            hfexport.export(mlp, {"x": x}, backend="onnx").save_pretrained(base / "onnx")]
    try:
        dirs.append(hfexport.export(mlp, {"x": x}, backend="executorch-xnnpack").save_pretrained(base / "pte"))
    except Exception as exc:  # noqa: BLE001 - ExecuTorch not installed
        print(f"no .pte artifact: {exc}")
    return dirs


def _probe(artifacts: list[Path], tmp_path: Path, mutations: int, seed: int) -> dict[str, Any]:
    work = tmp_path / "work"
    work.mkdir()
    spec = {"pristine": [str(d) for d in artifacts], "mutations": mutations, "seed": seed, "work": str(work),
            "allowed_roots": [str(work), *[str(d) for d in artifacts]]}
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(spec)], capture_output=True, text=True,
                          env=env, timeout=1800, cwd=tmp_path)
    assert proc.returncode == 0, f"the probe process died ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(report: dict[str, Any]) -> None:
    assert report["violations"] == [], sorted(set(report["violations"]))[:20]
    others = [r for r in report["results"] if r[2].startswith("other")]
    assert others == [], others[:10]
    pristine = [r for r in report["results"] if r[1] == "pristine"]
    assert all(r[2] == "ran" for r in pristine), pristine
    assert report["worst_s"] < 10, sorted(report["results"], key=lambda r: -r[3])[:3]
    # what any one load, call and verify allocated: its peak RSS above the RSS before it (Linux resets the peak per
    # trial); elsewhere the process's peak above its resident size once warm
    grown = [r for r in report["results"] if r[4] is not None]
    print("largest allocations (MiB):", sorted(grown, key=lambda r: -r[4])[:5])
    if grown:
        assert max(r[4] for r in grown) < 1024, sorted(grown, key=lambda r: -r[4])[:3]
    else:
        assert report["max_rss_mb"] - report["warm_rss_mb"] < 1024, report["max_rss_mb"]


def test_load_call_and_verify_run_nothing_from_any_artifact_kind(artifacts: list[Path], tmp_path: Path) -> None:
    _check(_probe(artifacts, tmp_path, mutations=6, seed=0))


@pytest.mark.slow
def test_load_call_and_verify_under_many_mutations(artifacts: list[Path], tmp_path: Path) -> None:
    """150 mutations of every file of each artifact kind, plus a .pte that runs portable kernels on constants of
    its own. ExecuTorch 1.5.1 killed the process here (SIGABRT, SIGSEGV) until check_pte read the .pte first."""
    portable = hfexport.export(_PortableOps().eval(), {"x": torch.randn(2, 8)}, backend="executorch-xnnpack"
                               ).save_pretrained(tmp_path / "portable")
    report = _probe([*artifacts, portable], tmp_path, mutations=150, seed=1)
    _check(report)
    mutated = [r for r in report["results"] if r[1] != "pristine"]
    print(f"{len(mutated)} mutations: {sum(r[2] == 'ran' for r in mutated)} ran, worst {report['worst_s']:.2f} s, "
          f"at most {max((r[4] or 0) for r in report['results']):.0f} MiB allocated by one trial")


def test_a_changed_byte_of_any_file_a_runner_reads_is_detected(artifacts: list[Path], tmp_path: Path) -> None:
    """Every file of every kind (.pt2, .onnx and its data, .pte, verification.safetensors, tokenizer files): its
    first, middle and last byte changed, hashes left as saved, is an IntegrityError naming the file at load."""
    import shutil

    checked = []
    for directory in artifacts:
        for name in sorted(json.loads((directory / "export.json").read_text())["files_sha256"]):
            size = (directory / name).stat().st_size
            for at in sorted({0, size // 2, size - 1}):
                target = tmp_path / f"{directory.name}-{name}-{at}"
                shutil.copytree(directory, target)
                data = bytearray((target / name).read_bytes())
                data[at] ^= 0x01
                (target / name).write_bytes(bytes(data))
                with pytest.raises(hfexport.IntegrityError, match=re.escape(name)) as info:
                    hfexport.load(target)
                assert info.value.files == [name]
                checked.append(name)
                shutil.rmtree(target)
    assert {"model.pt2", "model.onnx", "model.onnx.data", "verification.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(checked)
    assert "model.pte" in checked or len(artifacts) == 3  # no ExecuTorch installed


def _peak_rss_mib() -> float:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="measures the peak RSS through Linux's /proc")
@pytest.mark.parametrize("how", ["example shape", "zero leaves"])
def test_verify_builds_no_input_an_artifact_inflates(artifacts: list[Path], tmp_path: Path, how: str) -> None:
    """``hfexport verify`` builds inputs from the manifest: at the recorded shapes (``example_shape``) and the zero
    leaves of the stored inputs (a cache). A 30 KB manifest naming [16384, 16384] float32 (1 GiB) was built as
    asked (the zero leaves' bound was 8 GiB per input). Both now take at most 64 MiB + the artifact's size: 512 MiB
    let a 0.5 MB artifact's zero leaves take +1,026 MiB of ``verify_stored`` (issue 43's bounds probe), so a
    [8192, 8192] float32 input (256 MiB) is refused too."""
    import shutil

    from hfexport._verify import verify_artifact

    artifact = tmp_path / "crafted"
    shutil.copytree(artifacts[0], artifact)
    manifest = json.loads((artifact / "export.json").read_text())
    section = manifest["components"]["model"]
    if how == "example shape":
        section["inputs"][0]["example_shape"] = [8192, 8192]
        message = "describes inputs of more than"
    else:
        section["verification"]["stored"]["inputs"][0]["zero_leaves"] = {
            "0": {"shape": [8192, 8192], "dtype": "float32"}}
        message = "bytes of zeros"
    (artifact / "export.json").write_text(json.dumps(manifest))
    from hfexport._stored import built_inputs_budget

    assert built_inputs_budget(manifest) < 128 * 2**20  # an artifact under 1 MB: well under issue 43's 256 MiB
    Path("/proc/self/clear_refs").write_text("5")
    before = _peak_rss_mib()
    with pytest.raises(ValueError, match=message):
        verify_artifact(artifact, out=lambda line: None)
    assert _peak_rss_mib() - before < 256


# ── the restricted unpickler, property-based ─────────────────────────────────────────────────────────────
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_GLOBALS = [b"ctorch._utils\n_rebuild_tensor_v2\n", b"ccollections\nOrderedDict\n", b"ctorch\nFloatStorage\n",
            b"ctorch\nLongStorage\n", b"cos\nsystem\n", b"cbuiltins\neval\n", b"cbuiltins\ngetattr\n",
            b"c__builtin__\n__import__\n"]
_OPS = [b"(", b"t", b")", b"]", b"}", b"e", b"a", b"s", b"u", b"R", b"Q", b"0", b"2", b"\x85", b"\x86", b"\x87",
        b"N", b"\x88", b"\x89", b"\x93", b"b", b"o", b"i", b"\x81", b"\x82\x01", b"\x94", b"h\x00", b"h\x01",
        b"K\x00", b"K\x08", b"X\x07\x00\x00\x00storage", b"X\x01\x00\x00\x000", b"X\x03\x00\x00\x00cpu",
        b"X\x02\x00\x00\x00os", b"X\x06\x00\x00\x00system", b"q\x00", b"q\x01"]


def _saved_zip(pickled: bytes) -> bytes:
    buffer = io.BytesIO()
    torch.save(((torch.arange(8.0),), {}), buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info.filename, pickled if info.filename.endswith("data.pkl") else source.read(info))
    return out.getvalue()


def _unpickle_property(pieces: list[bytes]) -> None:
    from hfexport import UntrustedArtifactError
    from hfexport_dynamo._pt2_archive import unpickle_sample_inputs

    buffer = io.BytesIO()
    torch.save(((torch.arange(8.0),), {}), buffer)
    unpickle_sample_inputs(buffer.getvalue(), "warm-up")  # the reader's own lazy imports
    before = set(sys.modules)
    pickled = b"\x80\x02" + b"".join(pieces) + b"."
    try:
        args, kwargs = unpickle_sample_inputs(_saved_zip(pickled), "fuzz")
        assert isinstance(args, tuple) and isinstance(kwargs, dict)
    except (UntrustedArtifactError, ValueError):
        pass
    assert {m for m in set(sys.modules) - before if not m.startswith("encodings.")} == set()  # zipfile's cp437


_pickles = st.lists(st.sampled_from(_OPS + _GLOBALS), min_size=1, max_size=40)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(_pickles)
def test_restricted_unpickler_refuses_or_returns_tensors(pieces: list[bytes]) -> None:
    _unpickle_property(pieces)


@pytest.mark.slow
@hypothesis.settings(max_examples=20_000, deadline=None)
@hypothesis.given(_pickles)
def test_restricted_unpickler_refuses_or_returns_tensors_long(pieces: list[bytes]) -> None:
    _unpickle_property(pieces)


def test_a_real_sample_inputs_pickle_is_read() -> None:
    from hfexport_dynamo._pt2_archive import unpickle_sample_inputs

    buffer = io.BytesIO()
    torch.save(((torch.arange(8.0),), {}), buffer)
    args, _ = unpickle_sample_inputs(buffer.getvalue(), "t")
    torch.testing.assert_close(args[0], torch.arange(8.0))
    assert pickle.DEFAULT_PROTOCOL >= 2
