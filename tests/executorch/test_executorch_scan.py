"""Recurrences traced as ``torch.ops.higher_order.scan`` (Mamba's selective scan, hfexport_dynamo._recurrences) on
ExecuTorch with a dynamic batch and sequence (issue 26): they lower (no ``Expected leaf to be a Tensor or None, got
<class 'torch.SymInt'>``: ``to_edge_transform_and_lower`` runs under ``no_grad``) and run at other batches and
lengths (the scan loop's buffers are sized from the run: ``_patch_scan_buffers_resized``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

ATOL = 1e-4


@pytest.fixture(scope="module")
def mamba():
    from hfexport_sweep.zoo import build_case

    model, _, _ = build_case("mamba/MambaForCausalLM")
    return model


def _inputs(batch: int, seq: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_mamba_with_a_dynamic_batch_and_sequence(mamba):
    exported = hfexport.export(mamba, _inputs(2, 8), backend="executorch-xnnpack", dynamic=True)
    assert "_patch_scan_buffers_resized" in str(exported.manifest["workarounds"])
    bounds = exported.manifest["executorch"]["dim_bounds"]
    assert bounds["batch"]["max"] == 8 and bounds["sequence"]["max"] == 64
    for batch, seq in ((3, 13), (8, 64), (1, 5)):
        report = exported.verify(copy.deepcopy(_inputs(batch, seq)), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)


@pytest.mark.slow
def test_patch_scan_buffers_resized(mamba):
    """Without the patch the scan's carry keeps its planned batch: the program fails at the traced shape.
    Slow (a second lowering, ~15 s); the test above shows the patch at work."""
    shapes = {"input_ids": {0: Dim("batch", max=8)}, "attention_mask": {0: Dim("batch", max=8)}}
    with pytest.raises(hfexport.ExportError, match="0x12"):
        hfexport.export(mamba, _inputs(2, 8), backend="executorch-xnnpack", dynamic_shapes=shapes,
                        disable=("_patch_scan_buffers_resized",))
