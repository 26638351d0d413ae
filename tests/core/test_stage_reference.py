"""Each exporter file's `# ── Stage N: Title ──` banners match its stage data, in order; no documented stage runs a
toolchain call (the steps between the stages do, and each declared step is one the export runs)."""

import importlib
import inspect
import re

import pytest

from hfexport import get_backend

BANNER = re.compile(r"^# ── Stage (\d+): (.+?) ──$", re.M)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack", "openvino"])
def test_banners_match_stage_data(backend):
    try:
        exporter = get_backend(backend).load_exporter()
    except ImportError as exc:  # pragma: no cover - a member not built yet
        pytest.skip(str(exc))
    # the capture stages are marked where capture runs them (hfexport_dynamo.capture); a backend's in its exporter file
    module = "hfexport_dynamo.capture" if exporter.stages is exporter.tracer.stages else exporter.__module__
    source = inspect.getsource(importlib.import_module(module))
    banners = [(int(n), t) for n, t in BANNER.findall(source)]
    stages = [(s.number, s.title) for s in exporter.stages]
    assert banners == stages


STEP = re.compile(r"""ctx\.step\(\s*(f?)["']([^"']+)["']""")


@pytest.mark.parametrize("backend", ["onnx", "executorch-xnnpack", "openvino"])
def test_no_stage_runs_a_toolchain_call_and_every_export_runs_its_steps(backend):
    """Inside ``with ctx.stage(n):`` no ``ctx.step(...)`` (a stage applies its extension point, nothing else); the
    progress events of a real export show the documented stages and the declared steps in the order
    ``hfexport stages`` gives (the steps that only some options run left out)."""
    import torch

    import hfexport

    exporter = get_backend(backend).load_exporter()
    source = inspect.getsource(importlib.import_module(exporter.__module__))
    for block in re.findall(r"with ctx\.stage\(\d\)[^\n]*:\n((?:\s{12,}[^\n]*\n)+)", source):
        assert "ctx.step(" not in block, block
    events = []
    hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)}, backend=backend, dynamic=True,
                    progress=lambda e: events.append(e) if e.status == "start" and e.depth == 0 else None)
    ran = [e.step or e.stage.title for e in events]
    declared = [(s.runs if hasattr(s, "runs") else s.title) for s in
                __import__("hfexport._stages", fromlist=["running_order"]).running_order(exporter.stages, exporter.steps)]
    optional = {"torchao.quantization.quantize_", "prepare_pt2e, calibration, convert_pt2e", "nncf.compress_weights",
                "onnxruntime.quantization (with quantize=)"}
    expected = [d.replace("the dynamo stages, torch.export.export", "torch.export.export") for d in declared
                if d not in optional]
    assert [r for r in ran if r in expected or r in {s.title for s in exporter.stages}] == expected


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack", "executorch-cuda", "openvino",
                                     "testplugin"])
def test_stages_read_from_source_equal_the_imported_ones(backend):
    """``hfexport stages`` reads the stage data from the exporter's source, without importing the toolchain; it must
    say what the imported class says (inherited stages too: the ExecuTorch variants, the test plugin's)."""
    from hfexport._stage_source import stages_from_source

    declared = get_backend(backend)
    read = stages_from_source(declared.exporter)
    assert read is not None and read == declared.load_exporter().describe_stages()


def test_stages_command_imports_no_toolchain():
    import subprocess
    import sys

    code = ("import sys; from hfexport import cli; rc = cli.main(['stages', 'onnx']); "
            "print('heavy:', [m for m in ('torch', 'onnx', 'onnxscript', 'hfexport_onnx.exporter_onnx') if m in "
            "sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "4. ONNX translations" in out.stdout and "heavy: []" in out.stdout, out.stdout
