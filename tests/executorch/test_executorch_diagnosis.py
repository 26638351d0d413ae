"""A failed ExecuTorch verification names the delegated partition and the op that compute wrongly, found by
lowering again with partitions left on portable kernels (hfexport_executorch/_bisect.py; issue 25)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hfexport

pytest.importorskip("executorch")


class SplitByCumsum(torch.nn.Module):
    """Three XNNPACK partitions (cumsum is not delegated): a Linear, a tanh GELU, a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.cumsum(self.up(x), dim=-1)
        h = torch.cumsum(F.gelu(h, approximate="tanh") * 2.0, dim=-1)
        return self.down(h)


def test_the_wrong_partition_and_op_are_named():
    """With the tanh-GELU patch off, XNNPACK's erf GELU makes the second of three partitions wrong: the bisection
    names that partition and ``gelu``, and the manifest of the failed artifact records the same."""
    model, inputs = SplitByCumsum().eval(), {"x": torch.linspace(-3.0, 3.0, 48).reshape(6, 8)}
    with pytest.raises(hfexport.VerificationError) as caught:
        hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack",
                        disable=("_patch_gelu_tanh_not_delegated",))
    diagnosis = caught.value.report.diagnosis
    assert diagnosis["partitions"] == 3 and diagnosis["partition"] == "0:tag1", diagnosis
    assert diagnosis["culprit_ops"] == ["gelu.default"], diagnosis
    assert diagnosis["lowerings"] <= 6, diagnosis  # nothing delegated, 2 bisection steps, the ops of one partition
    assert "XnnpackPartitioner partition 2 of 3" in str(caught.value)
    assert "with gelu.default refused by the partitioner" in str(caught.value)
    assert caught.value.exported.manifest["verification"]["diagnosis"]["partition"] == "0:tag1"

