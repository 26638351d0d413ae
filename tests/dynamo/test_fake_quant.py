"""The patches of ``hfexport_dynamo._fake_quant``: a QAT model in eval exports with its fake-quant modules (flags read
as constants before the trace) and their ops decomposed bit-exactly; disabling either patch brings back the original
failure (a data-dependent guard on the flags; a fake-quant op that ExecuTorch cannot lower)."""

from __future__ import annotations

import pytest
import torch

import hfexport
from hfexport_dynamo._fake_quant import fake_quantize_decomposed


def _values(rows: int, scale: torch.Tensor) -> torch.Tensor:
    """Random values and exact half-way points of the quantization grid (the rounding's ties)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 40, generator=g) * 8
    x[:, :10] = (torch.randint(-300, 300, (rows, 10), generator=g) + 0.5) * scale.reshape(-1, 1)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_decomposition_is_bit_identical_to_aten(dtype):
    g = torch.Generator().manual_seed(1)
    scale = torch.rand(16, generator=g) * 0.2 + 1e-3
    zero = torch.randint(-10, 10, (16,), generator=g, dtype=torch.int32)
    zero_float = torch.randn(16, generator=g) * 5
    x = _values(16, scale).to(dtype)
    pairs = [
        (torch.fake_quantize_per_channel_affine(x, scale, zero, 0, -128, 127),
         fake_quantize_decomposed(x, scale, zero, -128, 127, axis=0)),
        (torch.fake_quantize_per_tensor_affine(x, float(scale[0]), 7, 0, 255),
         fake_quantize_decomposed(x, float(scale[0]), 7, 0, 255)),
        (torch.fake_quantize_per_tensor_affine(x, scale[:1], zero[:1], -128, 127),
         fake_quantize_decomposed(x, scale[:1], zero[:1], -128, 127)),
    ]
    if dtype == torch.float32:  # the float zero point and the learnable ops take float32 only
        pairs += [
            (torch.fake_quantize_per_channel_affine(x, scale, zero_float, 0, -128, 127),
             fake_quantize_decomposed(x, scale, zero_float, -128, 127, axis=0)),
            (torch._fake_quantize_learnable_per_channel_affine(x, scale, zero_float, 0, -128, 127, 1.0),
             fake_quantize_decomposed(x, scale, zero_float.round().clamp(-128, 127).int(), -128, 127, axis=0)),
        ]
    for i, (expected, actual) in enumerate(pairs):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), f"pair {i}"


class _QAT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fq = torch.ao.quantization.FakeQuantize()
        self.off_fq = torch.ao.quantization.FakeQuantize()
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.off_fq(self.linear(self.act_fq(x)))


def _qat(observer: bool = False) -> _QAT:
    torch.manual_seed(0)
    m = _QAT().train()
    with torch.no_grad():
        m.act_fq(torch.randn(32, 6) * 2)
    if not observer:
        m.apply(torch.ao.quantization.disable_observer)
    m.off_fq.disable_fake_quant()
    return m.eval()


def test_fake_quantize_exports_with_its_flags_folded_and_fails_without():
    model, x = _qat(), torch.randn(3, 6) * 2
    with torch.no_grad():
        expected = model(x)
    exported = hfexport.export(model, {"x": x}, backend="dynamo")
    assert torch.equal(exported(x=x), expected)  # bit-exact: the decomposition is the kernel's arithmetic
    with pytest.raises(hfexport.ExportError, match="data-dependent"):
        hfexport.export(_qat(), {"x": x}, backend="dynamo", disable=("_patch_fake_quantize_modules",))


def _ops(exported) -> list[str]:
    return [str(n.target) for n in exported.components["model"].runner.program.graph.nodes if n.op == "call_function"]


def test_fake_quantize_ops_are_decomposed_and_kept_without_the_patch():
    """What ExecuTorch rejects (``UnsupportedOperatorException: aten._fake_quantize_per_tensor_affine_cachemask...``,
    test below) and OpenVINO fails to convert: the fake-quant op in the program."""
    model, x = _qat(), torch.randn(3, 6) * 2
    assert not [op for op in _ops(hfexport.export(model, {"x": x}, backend="dynamo")) if "fake_quant" in op]
    kept = _ops(hfexport.export(_qat(), {"x": x}, backend="dynamo", disable=("_patch_fake_quantize_ops",)))
    assert [op for op in kept if "fake_quantize_per_tensor_affine" in op], kept


@pytest.mark.slow
def test_fake_quantize_ops_decomposed_for_executorch_and_not_without():
    model, x = _qat(), torch.randn(3, 6) * 2
    with torch.no_grad():
        expected = model(x)
    exported = hfexport.export(model, {"x": x}, backend="executorch-xnnpack")
    torch.testing.assert_close(exported(x=x), expected, atol=1e-5, rtol=0)
    with pytest.raises(hfexport.ExportError, match="fake_quantize"):
        hfexport.export(_qat(), {"x": x}, backend="executorch-xnnpack", disable=("_patch_fake_quantize_ops",))


def test_an_enabled_observer_is_refused_by_name():
    with pytest.raises(hfexport.ExportError, match=r"'act_fq' has observer_enabled=1.*disable_observer"):
        hfexport.export(_qat(observer=True), {"x": torch.randn(3, 6)}, backend="dynamo")
