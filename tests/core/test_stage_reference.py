"""Each exporter file's `# ── Stage N: Title ──` banners match its stage data, in order."""

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
    source = inspect.getsource(importlib.import_module(exporter.__module__))
    banners = [(int(n), t) for n, t in BANNER.findall(source)]
    stages = [(s.number, s.title) for s in exporter.stages]
    assert banners == stages
    for s in exporter.stages:
        assert callable(getattr(exporter, s.method)), s


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
