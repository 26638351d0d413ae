"""Named ``Dim(min=, max=)`` ranges that torch.export's solver cannot prove: the export traces again with
``Dim.DYNAMIC`` over the same ranges, keeps them as the program's checked bounds, warns and records them
(hfexport_dynamo/tracer.py ``_export_with_ranges_as_hints``; issue 25)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import hfexport


class PadToEvenSliceBack(torch.nn.Module):
    def forward(self, x):  # [b, h, w, c]
        b, h, w, c = x.shape
        padded = F.pad(x, (0, 0, 0, 2 * ((w + 1) // 2) - w, 0, 2 * ((h + 1) // 2) - h))
        return padded.roll((1, 1), dims=(1, 2))[:, :h, :w, :].contiguous() * 2.0


SHAPES = {"x": {1: Dim("h", min=2, max=16), 2: Dim("w", min=2, max=16)}}


def test_plain_torch_export_refuses_the_named_ranges():
    """What the retry is for: the guard ``h <= 2*((h + 1)//2)`` holds for every h, but the solver cannot show it."""
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(PadToEvenSliceBack(), (torch.randn(2, 5, 7, 3),), dynamic_shapes=SHAPES)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_named_ranges_are_kept_as_checked_bounds(backend, caplog):
    model, x = PadToEvenSliceBack().eval(), torch.randn(2, 5, 7, 3, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="hfexport"):
        exported = hfexport.export(model, {"x": x}, backend=backend, dynamic_shapes=copy.deepcopy(SHAPES))
    assert any("refused the named dims h, w" in r.getMessage() for r in caplog.records)
    relaxed = exported.manifest["relaxed_dims"]
    assert [(r["input"], r["dim"], r["name"], r["min"], r["max"], r["checked"]) for r in relaxed] == [
        ("x", 1, "h", 2, 16, [2, 16]), ("x", 2, "w", 2, 16, [2, 16])]
    for shape in ((2, 6, 8, 3), (2, 16, 3, 3), (2, 2, 2, 3)):  # both parities, the bounds
        y = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(exported(x=y), model(y), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="outside the program's range"):
        exported(x=torch.randn(2, 17, 8, 3))
