"""Recurrences traced as ``torch.ops.higher_order.scan`` (Mamba's selective scan, hfexport_dynamo._recurrences) on
ExecuTorch (issue 26): a dynamic sequence (the scanned length) runs; a dynamic batch, which ExecuTorch's scan loop
cannot resize, is refused before lowering with what to export instead (``check_scan_dynamic_dims``), instead of
``Expected leaf to be a Tensor or None, got <class 'torch.SymInt'>`` at lowering or ``0x12`` at run time."""

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


def test_mamba_with_a_dynamic_batch_is_refused_before_lowering(mamba):
    with pytest.raises(hfexport.ExportError, match=r"a scan loop .* carries a dynamic size \(s\d+: 'input_ids' dim "
                                                   r"0\), which ExecuTorch's scan loop cannot resize.*Keep those dims "
                                                   r"static"):
        hfexport.export(mamba, _inputs(2, 8), backend="executorch-xnnpack", dynamic=True)


def test_mamba_with_a_dynamic_sequence_runs(mamba):
    shapes = {"input_ids": {1: Dim("seq", max=64)}, "attention_mask": {1: Dim("seq", max=64)}}
    exported = hfexport.export(mamba, _inputs(2, 8), backend="executorch-xnnpack", dynamic_shapes=shapes)
    for seq in (5, 13):
        report = exported.verify(copy.deepcopy(_inputs(2, seq)), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)
