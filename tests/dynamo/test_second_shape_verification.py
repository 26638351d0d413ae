"""The export's verification runs a second shape, each dynamic size moved by one within its range, so that a
program specialized by a guard on the sizes (their parity) fails at export time (issue 25, e11's kind)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hfexport


class PadIfOdd(torch.nn.Module):
    """Pads to an even length only ``if`` it is odd (the Swin pattern, unpatched): the trace keeps one branch."""

    def forward(self, x):  # [b, n]
        n = x.shape[1]
        pad = (2 - n % 2) % 2
        if pad > 0:
            x = F.pad(x, (0, pad))
        return x.view(x.shape[0], -1, 2).sum(-1)


class Plain(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).cumsum(-1)


def test_a_parity_guard_fails_the_export():
    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    with pytest.raises(hfexport.ExportError, match=r"verification at a second shape \(x=\[3, 8\]\)") as caught:
        hfexport.export(PadIfOdd().eval(), {"x": x}, backend="dynamo", dynamic=True)
    assert "Guard failed" in str(caught.value)
    kept = hfexport.export(PadIfOdd().eval(), {"x": x}, backend="dynamo", dynamic=True, verify=False)
    second = kept.manifest["verification"]["second_shape"]
    assert second["passed"] is False and "Guard failed" in second["error"], second


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_the_second_shape_is_recorded(backend):
    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(Plain().eval(), {"x": copy.deepcopy(x)}, backend=backend, dynamic=True)
    second = exported.manifest["verification"]["second_shape"]
    assert second["passed"] is True and second["inputs"] == {"x": [3, 8]}, second
    assert exported.manifest["verification"]["inputs"] == {"x": [2, 7]}  # the traced shape's report stays
    static = hfexport.export(Plain().eval(), {"x": x}, backend=backend)
    assert "second_shape" not in static.manifest["verification"]
