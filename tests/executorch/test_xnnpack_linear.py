"""XNNPACK's rewrite of decomposed Linears (``_patch_linear_conversion_through_reshapes``,
``_patch_linear_partition_exact`` in hfexport_executorch/workarounds/xnnpack_patches.py): ``torch.vmap`` over a Linear, which
decomposes it per sample around an ``mm`` (issue 25, e02; the field cases s58 and s59 are its siblings)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

BATCH = Dim("batch", min=2, max=32)


def export(model, inputs, shapes, disable=(), **options):
    return hfexport.export(model.eval(), copy.deepcopy(inputs), backend="executorch-xnnpack",
                           dynamic_shapes=shapes, disable=disable, **options)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


class VmappedMlp(torch.nn.Module):
    def __init__(self, in_dims=0):
        super().__init__()
        self.mlp, self.in_dims = Mlp(), in_dims

    def forward(self, x):
        return torch.vmap(self.mlp, in_dims=self.in_dims)(x)


def max_diff(exported, model, x):
    with torch.no_grad():
        return float((exported(x=x.clone()) - model(x)).abs().max())


def test_patch_linear_conversion_through_reshapes():
    """vmap's ``unsqueeze, view, mm, view, squeeze, add(bias)``: upstream's rewrite drops both biases (about 0.15
    off, fully delegated, no error but the verification's, whose diagnosis names the ``mm``); with the patch the
    program is exact and still fully delegated."""
    model, x = VmappedMlp().eval(), torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(hfexport.VerificationError) as caught:
        export(model, {"x": x}, {"x": {0: BATCH}}, disable=("_patch_linear_conversion_through_reshapes",))
    assert max_diff(caught.value.exported, model, x) > 0.05
    assert caught.value.report.diagnosis["culprit_ops"] == ["mm.default"]
    exported = export(model, {"x": x}, {"x": {0: BATCH}})
    assert exported.manifest["executorch"]["delegated_fraction"] == 1.0
    for b in (6, 2, 17):
        assert max_diff(exported, model, torch.randn(b, 8, generator=torch.Generator().manual_seed(b))) < 1e-5


def test_patch_linear_partition_exact():
    """``vmap(in_dims=1)`` puts a permute before the ``mm``: the rewrite failed the export; with the patch the
    ``mm`` runs on the portable kernel and the program matches eager."""
    model, x = VmappedMlp(in_dims=1).eval(), torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    with pytest.raises(hfexport.ExportError, match="ConvertToLinearPass"):
        export(model, {"x": x}, {"x": {1: BATCH}}, disable=("_patch_linear_partition_exact",))
    exported = export(model, {"x": x}, {"x": {1: BATCH}})
    assert exported.manifest["executorch"]["portable_ops"].get("aten::mm.default") == 1  # the first Linear; the second is delegated
    assert max_diff(exported, model, torch.randn(8, 13, generator=torch.Generator().manual_seed(2))) < 1e-5
