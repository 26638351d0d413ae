"""An ONNX artifact loads in a fresh process with nothing imported first, and reads no file its manifest does
not list."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import torch.utils._pytree as pytree

import hfexport
from helpers import TinyMLP, load_in_fresh_process, tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("onnx-artifacts")
    bert, mlp = tiny_model("bert", layers=1), TinyMLP().eval()
    inputs = {"bert": {"input_ids": torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))},
              "mlp": {"x": torch.randn(2, 8, generator=torch.Generator().manual_seed(0))}}
    dirs = {name: hfexport.export(model, inputs[name], backend="onnx").save_pretrained(base / name)
            for name, model in (("bert", bert), ("mlp", mlp))}
    return {"inputs": inputs, "dirs": dirs, "models": {"bert": bert, "mlp": mlp}}


def test_fresh_process_loads_transformers_and_plain_module(saved: dict[str, Any], tmp_path: Path) -> None:
    results = load_in_fresh_process({name: (saved["dirs"][name], saved["inputs"][name]) for name in ("bert", "mlp")},
                                    tmp_path)
    for name in ("bert", "mlp"):
        with torch.no_grad():
            expected = pytree.tree_leaves(saved["models"][name](**saved["inputs"][name]))
        for got, want in zip(results[name][1], expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert results["bert"][0] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"


def test_external_data_the_manifest_does_not_list_is_refused(saved: dict[str, Any], tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(saved["dirs"]["bert"], artifact)
    model = onnx.load(str(artifact / "model.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "unlisted.data"  # ONNX Runtime would read it: it lies inside the directory
    onnx.save(model, str(artifact / "model.onnx"))
    (artifact / "model.onnx.data").rename(artifact / "unlisted.data")
    (artifact / "model.onnx.data").write_bytes(b"")
    manifest = json.loads((artifact / "export.json").read_text())
    for name in manifest["files_sha256"]:  # as an attacker who rewrites the files would
        data = (artifact / name).read_bytes()
        manifest["files_sha256"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (artifact / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"model.onnx reads external data from \['unlisted.data'\]"):
        hfexport.load(artifact)


class HalvedLength(torch.nn.Module):
    """Returns an int computed from a dynamic dim beside a tensor, as MaskFormer-Swin returns its spatial sizes."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.shape[1] // 2


def test_an_int_output_from_a_dynamic_dim_comes_back_as_an_int_in_a_new_process(tmp_path: Path) -> None:
    """torch.onnx makes the SymInt an int64 graph output; the manifest's ``int_outputs`` names it, and the runner
    gives it back as an int computed at the new shape (it came back as ``None`` when counted as a constant)."""
    import subprocess
    import sys

    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", min=2, max=64)}}
    exported = hfexport.export(HalvedLength(), {"x": torch.randn(2, 8)}, backend="onnx", dynamic_shapes=dims)
    assert exported.manifest["onnx"]["int_outputs"] == [1]
    directory = exported.save_pretrained(tmp_path / "halved")
    code = ("import sys, torch, hfexport; doubled, half = hfexport.load(sys.argv[1])(x=torch.ones(3, 13)); "
            "print(type(half).__name__, half, torch.equal(doubled, torch.full((3, 13), 2.0)))")
    done = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["int", "6", "True"]
