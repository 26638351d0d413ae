"""FX node fixes that keep XNNPACK's partitions whole (``_fix_last_dim_mean_as_average_pooling`` in
``hfexport_executorch/workarounds/node_fixes.py``): each left out with ``disable=``, what it changes in the lowered
program, and the same outputs either way."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

MEAN_FIX = "_fix_last_dim_mean_as_average_pooling"


class NormedLinear(torch.nn.Module):
    """Llama's RMSNorm (``x * rsqrt(mean(x^2, -1) + eps)``) between two linears: one XNNPACK partition when the mean
    is delegated, two around a portable ``mean`` when it is not."""

    def __init__(self, hidden=16):
        super().__init__()
        self.first, self.second = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)

    def forward(self, x):
        x = self.first(x)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.second(self.weight * (x * torch.rsqrt(variance + 1e-6)))


def lowered(model, x, dynamic_shapes, disable=()):
    exported = hfexport.export(model, {"x": x}, backend="executorch-xnnpack", dynamic_shapes=dynamic_shapes,
                               disable=disable)
    return exported, exported.manifest["executorch"]


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "disabled"])
def test_a_norms_mean_stays_in_the_xnnpack_partition(fixed):
    torch.manual_seed(0)
    model = NormedLinear().eval()
    x = torch.randn(1, 7, 16)
    exported, lowering = lowered(model, x, {"x": {1: Dim("seq", min=1, max=64)}}, () if fixed else (MEAN_FIX,))
    assert lowering["delegates"] == (1 if fixed else 2), lowering
    assert ("aten::mean.dim" in lowering["portable_ops"]) is not fixed, lowering["portable_ops"]
    for seq in (7, 1, 33):  # the traced length, a decode step, another prefill length
        other = torch.randn(1, seq, 16)
        torch.testing.assert_close(exported(x=other), model(other), atol=1e-5, rtol=1e-5)


def test_a_mean_over_two_dynamic_sizes_is_left_to_the_portable_kernel():
    """XNNPACK's reshape takes one symbolic size: with a dynamic batch too, the mean stays as it was."""
    torch.manual_seed(0)
    model = NormedLinear().eval()
    x = torch.randn(2, 7, 16)
    exported, lowering = lowered(model, x, {"x": {0: Dim("batch", min=1, max=4), 1: Dim("seq", min=1, max=64)}})
    assert "aten::mean.dim" in lowering["portable_ops"], lowering
    other = torch.randn(3, 5, 16)
    torch.testing.assert_close(exported(x=other), model(other), atol=1e-5, rtol=1e-5)
