"""An ExecuTorch artifact loads in a fresh process with nothing imported first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import hfexport

pytest.importorskip("executorch")

from helpers import TinyMLP, load_in_fresh_process, tiny_model  # noqa: E402


@pytest.mark.slow  # two ExecuTorch lowerings and a subprocess: about 20 s on 2 cores
def test_fresh_process_loads_transformers_and_plain_module(tmp_path: Path) -> None:
    models = {"bert": tiny_model("bert", layers=1), "mlp": TinyMLP().eval()}
    inputs = {"bert": {"input_ids": torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))},
              "mlp": {"x": torch.randn(2, 8, generator=torch.Generator().manual_seed(0))}}
    dirs = {name: hfexport.export(model, inputs[name], backend="executorch-xnnpack").save_pretrained(tmp_path / name)
            for name, model in models.items()}
    results = load_in_fresh_process({name: (dirs[name], inputs[name]) for name in models}, tmp_path)
    for name, model in models.items():
        with torch.no_grad():
            expected = pytree.tree_leaves(model(**inputs[name]))
        for got, want in zip(results[name][1], expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert results["bert"][0] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
