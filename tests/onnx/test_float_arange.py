"""Issue 47: a floating ``arange`` counts its elements as torch does (in float64) on ONNX. SmolVLM/Idefics3's
position boundaries ``arange(1/n, 1.0, 1/n)`` at n = 6 patches a side (48x48 images of 8-pixel patches) are 6
elements in torch and were 5 in ONNX's float32 ``Range``; the program's ``bucketize`` (traced for 6) then failed
with ``GatherND ... invalid index found, index = 5`` (``_aten_arange_float_in_float64``)."""

from __future__ import annotations

import pytest
import torch

import hfexport


class Boundaries(torch.nn.Module):
    """SmolVLM's position buckets at ``sides`` patches a side."""

    def __init__(self, sides: int):
        super().__init__()
        self.sides = sides

    def forward(self, x):  # x: float [n] in [0, 1)
        boundaries = torch.arange(1 / self.sides, 1.0, 1 / self.sides)
        return {"buckets": torch.bucketize(x, boundaries, right=True), "boundaries": boundaries + 0 * x[:1]}


@pytest.mark.parametrize("sides", [6, 7])
def test_float_arange_counts_as_torch(sides):
    x = torch.rand(9, generator=torch.Generator().manual_seed(0))
    model = Boundaries(sides).eval()
    exported = hfexport.export(model, {"x": x}, backend="onnx")
    got, expected = exported(x=x), model(x)
    assert got["boundaries"].shape == expected["boundaries"].shape == (sides,)
    assert torch.equal(got["boundaries"], expected["boundaries"]) and torch.equal(got["buckets"], expected["buckets"])


def test_float32_range_fails_as_in_the_field():
    x = torch.rand(9, generator=torch.Generator().manual_seed(0))
    with pytest.raises(hfexport.ExportError, match="invalid index found, index = 5"):
        hfexport.export(Boundaries(6).eval(), {"x": x}, backend="onnx", disable=("_aten_arange_float_in_float64",))
