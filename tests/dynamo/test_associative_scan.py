"""The patch of ``hfexport_dynamo._associative_scan``: ``associative_scan`` runs as a sequential ``scan`` op while
exporting. Pointwise mode: the program holds a ``scan`` (which every backend lowers) instead of the
``associative_scan`` op (which none does); generic mode: the scanned length stays dynamic. Disabling the patch brings
both failures back."""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch.export import Dim

import hfexport


def _gated(left, right):
    return left[0] * right[0], left[1] * right[0] + right[1]


class _Recurrence(torch.nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.gate = torch.nn.Linear(3, 4)

    def forward(self, x):
        _, h = associative_scan(_gated, (torch.sigmoid(self.gate(x)), x.repeat(1, 1, 2)[..., :4]), dim=1,
                                combine_mode=self.mode)
        return h


def _loop(model: _Recurrence, x: torch.Tensor) -> torch.Tensor:
    """The recurrence ``h_t = a_t h_{t-1} + b_t`` step by step: the reference (eager's associative_scan compiles)."""
    with torch.no_grad():
        a, b = torch.sigmoid(model.gate(x)), x.repeat(1, 1, 2)[..., :4]
        h, out = b[:, 0], [b[:, 0]]
        for t in range(1, x.shape[1]):
            h = a[:, t] * h + b[:, t]
            out.append(h)
        return torch.stack(out, 1)


def _ops(exported) -> list[str]:
    return [str(n.target) for n in exported.components["model"].runner.program.graph.nodes if n.op == "call_function"]


def test_pointwise_associative_scan_is_a_scan_op_and_not_without_the_patch():
    torch.manual_seed(0)
    model, x = _Recurrence("pointwise").eval(), torch.randn(2, 5, 3)
    expected = _loop(model, x)
    exported = hfexport.export(model, {"x": x}, backend="dynamo")
    torch.testing.assert_close(exported(x=x), expected, atol=1e-6, rtol=1e-5)
    ops = _ops(exported)
    assert "scan" in ops and "associative_scan" not in ops, ops
    kept = _ops(hfexport.export(model, {"x": x}, backend="dynamo", disable=("_patch_associative_scan_sequential",)))
    assert "associative_scan" in kept, kept  # what torch.onnx, ExecuTorch and OpenVINO fail on


def test_generic_associative_scan_keeps_the_length_dynamic_and_not_without_the_patch():
    torch.manual_seed(0)
    model = _Recurrence("generic").eval()
    shapes = {"x": {1: Dim("time", min=2, max=32)}}
    exported = hfexport.export(model, {"x": torch.randn(2, 6, 3)}, backend="dynamo", dynamic_shapes=shapes)
    for length in (2, 11):
        x = torch.randn(2, length, 3)
        torch.testing.assert_close(exported(x=x), _loop(model, x), atol=1e-6, rtol=1e-5)
    with pytest.raises(hfexport.ExportError, match=r"time|Dim"):
        hfexport.export(model, {"x": torch.randn(2, 6, 3)}, backend="dynamo", dynamic_shapes=shapes,
                        disable=("_patch_associative_scan_sequential",))
