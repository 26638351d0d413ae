"""Issue 42's yardsticks (benchmarks/followability.py): the limits every export should meet, and the tool's rules.

The slow test profiles each installed backend's export of the tiny Llama (text-generation and one forward) in
the benchmark's own subprocesses and holds each figure to ``LIMITS``, or, where today's code is still over one, to
today's figure (``NOT_YET_MET``; benchmarks/results/followability.txt has the figures). The
fast tests check the classification rules on made-up frames and the profiler on ``hfexport.list_backends()``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "followability.py"

# Issue 42's acceptance limits, one per figure of the benchmark's table.
LIMITS = {
    "bounce_depth": 3,
    "upward_calls": 3,
    "interfaces": 20,
    "files": 15,
    "lines": 1800,
    "depth_to_torch_export": 6,
}
BACKENDS = ("dynamo", "onnx", "executorch-xnnpack", "openvino")
KINDS = ("text-generation", "forward")


def _load_script():
    spec = importlib.util.spec_from_file_location("followability_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load_script()


# ── the classification rules, on made-up frames ───────────────────────────────────────────────────────────────

CORE = "/x/packages/hfexport-core/src/hfexport/_exporter.py"
ONNX = "/x/packages/hfexport-onnx/src/hfexport_onnx/exporter_onnx.py"
DYNAMO = "/x/packages/hfexport-dynamo/src/hfexport_dynamo/tracer.py"


def test_packages_and_layers(bench):
    assert bench.package_of(CORE) == "hfexport"
    assert bench.package_of(ONNX) == "hfexport_onnx"
    assert bench.package_of("/usr/lib/python3/site-packages/torch/export/__init__.py") is None
    assert bench.is_upward("hfexport", "hfexport_onnx") and bench.is_upward("hfexport_dynamo", "hfexport_onnx")
    assert bench.is_upward("hfexport", "hfexport_dynamo")
    assert not bench.is_upward("hfexport_onnx", "hfexport") and not bench.is_upward("hfexport_onnx", "hfexport_sweep")


def test_declared_extension_points(bench):
    declared = bench.Declared(workarounds={(ONNX, 40): "patch"}, workaround_qualnames={(ONNX, "_patch_sdpa"): "patch"},
                              classes={(DYNAMO, "DynamoTracer"): "Tracer", (ONNX, "OnnxExporter"): "Exporter"})

    def interface(line, qualname, filename=ONNX):
        return bench.declared_interface(bench.frame_key(filename, line, qualname), declared)

    assert interface(40, "_patch_sdpa") == "workaround:patch"  # the registered factory
    assert interface(45, "_patch_sdpa.<locals>.replacement") == "workaround:patch"  # what it returns
    assert interface(47, "_patch_sdpa.<locals>.replacement.<locals>.inner") == "workaround:patch"
    # stage and step methods of any class: one interface per class
    assert interface(90, "Pipeline.stage_lower") == interface(99, "Pipeline.step_optimize") is not None
    assert interface(120, "OnnxExporter._private_helper") == interface(130, "OnnxExporter.package")  # Exporter's
    assert interface(10, "DynamoTracer.reference", DYNAMO) == "class:hfexport_dynamo/tracer.py:DynamoTracer"
    assert interface(20, "OnnxRunner.run") is not None and interface(25, "FileRunner.write_files") is not None
    # a function made inside a declared method (the callable Tracer.reference returns, a component's writer) is
    # that method's interface
    assert interface(220, "OnnxExporter.stage_trace.<locals>.callback") == interface(130, "OnnxExporter.package")
    assert interface(15, "DynamoTracer.reference.<locals>.<lambda>", DYNAMO) == \
        "class:hfexport_dynamo/tracer.py:DynamoTracer"
    # hidden: a plain function, a non-protocol method of a runner, a function nested in a plain function
    assert interface(200, "_helper") is None
    assert interface(210, "OnnxRunner._session") is None
    assert interface(240, "_helper.<locals>.callback") is None
    assert interface(230, "stage_lonely") is None  # a module-level function is no stage method


def test_figures_count_hidden_upward_calls_once_and_declared_ones_not(bench):
    declared = bench.Declared(workarounds={(ONNX, 40): "patch"}, workaround_qualnames={(ONNX, "_patch_sdpa"): "patch"})
    key = bench.frame_key
    hidden = key(ONNX, 200, "_helper")
    trace = bench.Trace(
        frames={key(CORE, 1, "export"), hidden, key(ONNX, 40, "_patch_sdpa"), key(ONNX, 90, "OnnxExporter.stage_a"),
                key(ONNX, 95, "OnnxExporter.stage_b")},
        edges={("hfexport", "hfexport_onnx", hidden),  # the kernel calling a backend's helper: hidden, upward
               ("hfexport_dynamo", "hfexport_onnx", hidden),
               ("hfexport", "hfexport_onnx", key(ONNX, 40, "_patch_sdpa")),
               ("hfexport", "hfexport_onnx", key(ONNX, 90, "OnnxExporter.stage_a")),
               ("hfexport", "hfexport_onnx", key(ONNX, 95, "OnnxExporter.stage_b")),
               ("hfexport_onnx", "hfexport", key(CORE, 1, "export"))},  # downward
        bounce=2, bounce_stack=["hfexport:export", "hfexport_onnx:_helper", "hfexport:export"],
        depth_to_torch_export=4)
    result = bench.figures(trace, declared)
    assert result["details"]["upward_calls"] == [hidden]
    assert result["upward_calls"] == 1
    # the helper, the stage methods (one), the workaround kind (one), the kernel's export
    assert result["interfaces"] == 4
    assert result["files"] == 2  # the workaround's frame is not read, its file is read for the others
    assert (result["bounce_depth"], result["depth_to_torch_export"], result["lines"]) == (2, 4, 0)  # no such files


def test_profiles_a_real_call(bench):
    import hfexport

    trace = bench.profile_call(lambda: hfexport.list_backends())
    result = bench.figures(trace, bench.declared_now())
    for name in LIMITS:
        if name != "depth_to_torch_export":
            assert isinstance(result[name], int), name
    assert result["depth_to_torch_export"] is None  # nothing exported
    assert result["files"] >= 1 and result["lines"] > 0
    assert any("_discovery.py" in f for f in result["details"]["files"])


# ── the limits, on every installed backend ────────────────────────────────────────────────────────────────────

# What the code measures today (2026-12-07, benchmarks/results/followability.txt), where it is still over an
# acceptance limit: a ceiling a change may not raise. Lower it as the figures come down; drop an entry once the
# figure meets its limit. (bounce, interfaces, files, lines) per backend; text-generation, then forward.
# benchmarks/results/followability.txt, 2026-12-07 session 23 (main 8c30e23, after the issue 44/46/47/48 merges)
NOT_YET_MET = {
    ("dynamo", "text-generation"): {"interfaces": 21, "files": 38, "lines": 3068},
    ("dynamo", "forward"): {"files": 31, "lines": 2029},
    ("onnx", "text-generation"): {"interfaces": 42, "files": 54, "lines": 4396},
    ("onnx", "forward"): {"interfaces": 40, "files": 46, "lines": 3085},
    ("executorch-xnnpack", "text-generation"): {"interfaces": 42, "files": 60, "lines": 4505},
    ("executorch-xnnpack", "forward"): {"interfaces": 39, "files": 52, "lines": 3374},
    ("openvino", "text-generation"): {"interfaces": 39, "files": 47, "lines": 3791},
    ("openvino", "forward"): {"interfaces": 37, "files": 38, "lines": 2725},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_export_meets_the_followability_limits(backend, kind, tmp_path):
    """Each figure at most its acceptance limit, or, where the code does not meet it yet, at most today's figure
    (``NOT_YET_MET``): the figures never go up (lines may grow by 2% with a fix, no more)."""
    import hfexport

    if not any(info.name == backend and info.status == "ok" for info in hfexport.list_backends()):
        pytest.skip(f"backend {backend!r} is not installed")
    out = tmp_path / "followability.json"
    process = subprocess.run([sys.executable, str(SCRIPT), "--backend", backend, "--kind", kind, "--json", str(out)],
                             capture_output=True, text=True, timeout=1800)
    assert process.returncode == 0 and out.exists(), process.stdout + process.stderr
    (row,) = json.loads(out.read_text())["rows"]
    ceilings = {**LIMITS, **{name: value * 1.02 if name == "lines" else value
                             for name, value in NOT_YET_MET.get((backend, kind), {}).items()}}
    over = {name: (row[name], limit) for name, limit in ceilings.items() if row[name] is None or row[name] > limit}
    assert not over, f"{backend}, {kind}: figures over their ceilings (figure, ceiling): {over}\n{process.stdout}"
