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


def test_a_loaded_program_moves_its_packed_weights_into_huge_pages_and_a_fresh_export_does_not(tmp_path: Path) -> None:
    """A loaded artifact's runner collapses the memory its method allocated when it loaded (XNNPACK's packed weights,
    ``hfexport.memory``) on a background thread; the program the export just lowered is left in 4 KiB pages. The
    outputs are the same either way. A 1,024 x 1,024 linear layer: 4 MiB of packed float weights."""
    import time

    from hfexport.memory import huge_pages_possible

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024)).eval()
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(model, {"input": x}, backend="executorch-xnnpack")
    assert exported.components["model"].runner.huge_page_bytes is None
    loaded = hfexport.load(exported.save_pretrained(tmp_path / "linear"))
    runner = loaded.components["model"].runner
    deadline = time.monotonic() + 60
    while runner.huge_page_bytes is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(runner.huge_page_bytes, int)
    if not huge_pages_possible():
        assert runner.huge_page_bytes == 0
    with torch.no_grad():
        torch.testing.assert_close(pytree.tree_leaves(loaded(input=x))[0], model(x), atol=1e-4, rtol=1e-4)
