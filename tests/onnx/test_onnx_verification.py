"""Every export verifies itself on its runtime: an ONNX export whose outputs differ from eager (a workaround
left out on purpose, as a different toolchain would get it wrong) raises ``VerificationError`` by default, naming
each failing output with its max abs diff and tolerance (NaN as NaN); ``verify=False`` returns the artifact, whose
manifest records ``passed: false``."""

from __future__ import annotations

import math

import pytest
import torch

import hfexport
from hfexport import VerificationError


class TopkUnsorted(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 5, dim=-1, sorted=False)


class AdditiveMaskAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_an_export_whose_outputs_differ_raises_verification_error_unless_verify_is_false():
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
    # without the fix ONNX Runtime returns topk(sorted=False) in heap order, where eager returns sorted values
    with pytest.raises(VerificationError) as info:
        hfexport.export(TopkUnsorted(), {"x": x}, backend="onnx", disable=("_fix_ir_topk_sorted",))
    error = info.value
    assert isinstance(error, hfexport.ExportError) and error.backend == "onnx"
    assert not error.report.passed and error.report.atol == 1e-4 and error.report.rtol == 1e-3
    text = str(error)
    assert text.startswith("onnx export of TopkUnsorted failed verification: 2 of 2 outputs differ from eager "
                           "PyTorch at x=[2, 1000]"), text
    for output in error.report.outputs:  # values, and indices (integers: equal or not, tolerance 0)
        assert f"  - {output.name} [2, 5] {output.dtype}: max abs diff {output.max_abs_diff:.3e} where the " \
               f"tolerance is {output.tolerance:.3e}" in text
    assert "Pass verify=False" in text
    assert error.exported.manifest["verification"]["passed"] is False  # the artifact rides on the error

    exported = hfexport.export(TopkUnsorted(), {"x": x}, backend="onnx", disable=("_fix_ir_topk_sorted",),
                               verify=False)
    assert exported.manifest["verification"]["passed"] is False
    assert exported.manifest["components"]["model"]["verification"]["passed"] is False
    assert exported.manifest["verification"]["outputs"][0]["max_abs_diff"] > 0.1


def test_a_nan_output_is_reported_as_nan():
    q = torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 2, 5, 5)
    mask[0, 0, 0, :] = float("-inf")  # a query row that sees no key: eager gives 0, a plain softmax NaN
    inputs = {"q": q, "k": q, "v": q, "mask": mask}
    with pytest.raises(VerificationError) as info:
        hfexport.export(AdditiveMaskAttention(), inputs, backend="onnx", disable=("_aten_scaled_dot_product_attention",))
    output = info.value.report.outputs[0]
    assert math.isnan(output.max_abs_diff) and "8 NaN in the export where eager has none" in output.note
    assert "max abs diff nan where the tolerance is" in str(info.value)
    assert "8 NaN in the export where eager has none" in str(info.value)
    assert info.value.exported.manifest["verification"]["max_abs_diff"] == "nan"

    exported = hfexport.export(AdditiveMaskAttention(), inputs, backend="onnx")  # with the translation: verified
    assert exported.manifest["verification"]["passed"] is True
