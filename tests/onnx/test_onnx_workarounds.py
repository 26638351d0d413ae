"""Each ONNX workaround: what goes wrong without it (``disable=("<its name>",)``) and the right value with it."""

from __future__ import annotations

import pytest
import torch
from test_onnx import onnx_export

import hfexport
from helpers import Bf16Block, ComplexRope
from hfexport import ExportError
from hfexport_dynamo.inputs import dummy_inputs

ATOL = 1e-4
PATCHES = "hfexport_onnx.workarounds.torch_patches."  # where each stage's workarounds are registered
FIXES = "hfexport_onnx.workarounds.node_fixes."


# ── _patch_tensor_rsub, _patch_torch_rsub, _fix_sub_scalar_int_tensor after the decomposition (c18) ──────────
class InvertMask(torch.nn.Module):
    def forward(self, x, mask):
        return (1.0 - mask) * x


class TorchRsub(torch.nn.Module):
    def forward(self, x, mask):
        return torch.rsub(mask, 1.0) * x


def _op_types(path) -> list[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return [n.op_type for n in model.graph.node] + [n.op_type for f in model.functions for n in f.node]


def _mask_inputs():
    return {"x": torch.randn(2, 3, generator=torch.Generator().manual_seed(0)),
            "mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}


TYPE_PROMOTION_FAILURE = "Cannot find a compatible OpOverload for aten.sub"
ALL_RSUB = ("_patch_tensor_rsub", "_patch_torch_rsub", "_fix_sub_scalar_int_tensor")


@pytest.mark.parametrize("module,patch", [(InvertMask, "_patch_tensor_rsub"), (TorchRsub, "_patch_torch_rsub")])
def test_rsub_patch_alone_fixes_float_minus_int_tensor(module, patch):
    inputs = _mask_inputs()
    with pytest.raises(ExportError, match=r"step torch.onnx.export failed.*" + TYPE_PROMOTION_FAILURE):
        hfexport.export(module(), inputs, backend="onnx", disable=ALL_RSUB)

    # Only the trace-time patch: the program has the cast, so no fix fires after decomposition.
    others = tuple(name for name in ALL_RSUB if name != patch)
    exported = hfexport.export(module(), inputs, backend="onnx", disable=others)
    assert any(p["name"] == PATCHES + patch for p in exported.manifest["workarounds"]["patches"])
    report = exported.verify(inputs, atol=0, rtol=0)
    assert report.passed and report.max_abs_diff == 0.0, report


def test_sub_scalar_fix_runs_on_the_decomposed_program():
    """Traced without the rsub patches, the decomposed graph has ``sub.Tensor(1.0, int_tensor)``: the FX fix repairs
    it only because ``lower`` runs torch.onnx's decomposition itself (the step ``ExportedProgram.run_decompositions``)
    and applies stage 3's fixes again to its result, before ``torch.onnx.export``'s type promotion."""
    inputs = _mask_inputs()
    patches_off = ("_patch_tensor_rsub", "_patch_torch_rsub")
    events = []
    exported = hfexport.export(InvertMask(), inputs, backend="onnx", disable=patches_off,
                               progress=lambda e: events.append(e.step) if e.step and e.status == "start" else None)
    assert exported.manifest["onnx"]["fixes_after_decomposition"] == {FIXES + "_fix_sub_scalar_int_tensor": 1}
    assert FIXES + "_fix_sub_scalar_int_tensor" not in exported.manifest["workarounds"]["fixes"]  # not before
    assert events.index("ExportedProgram.run_decompositions") + 1 == events.index("torch.onnx.export"), events
    report = exported.verify(inputs, atol=0, rtol=0)
    assert report.passed and report.max_abs_diff == 0.0, report

    with pytest.raises(ExportError, match=r"step torch.onnx.export failed.*" + TYPE_PROMOTION_FAILURE):
        hfexport.export(InvertMask(), inputs, backend="onnx", disable=(*patches_off, "_fix_sub_scalar_int_tensor"))


# ── _aten_sort_stable (c21) ──────────────────────────────────────────────────────
class StableSort(torch.nn.Module):
    def forward(self, scores):
        return torch.sort(scores, dim=-1, descending=True, stable=True)


class StableArgsort(torch.nn.Module):
    def forward(self, scores):
        return torch.argsort(scores, dim=0, stable=True)


SCORES = torch.tensor([[0.3, 0.9, 0.1, 0.5, 0.9], [0.2, 0.2, 0.8, 0.4, 0.2], [0.3, 0.2, 0.1, 0.5, 0.2]])


@pytest.mark.parametrize("module", [StableSort, StableArgsort])  # argsort(stable=True) decomposes to sort.stable
def test_stable_sort_translation(module):
    inputs = {"scores": SCORES}
    with pytest.raises(ExportError, match=r"step torch.onnx.export failed.*DispatchError: No ONNX function found for "
                                          r"<OpOverload\(op='aten.sort', overload='stable'\)>") as info:
        hfexport.export(module(), inputs, backend="onnx", dynamic=True, disable=("_aten_sort_stable",))
    assert "_ONNX_TRANSLATION_TABLE" in str(info.value)  # the hint

    exported = hfexport.export(module(), inputs, backend="onnx", dynamic=True)
    assert "_aten_sort_stable" in exported.manifest["onnx"]["translations"]
    for scores in (SCORES, torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.1]])):  # ties: stable order
        report = exported.verify({"scores": scores}, atol=0, rtol=0)
        assert report.passed, report  # values and indices exactly


# ── _aten_searchsorted (s30) ───────────────────────────────────────────────────────────────────────────
class SearchSorted(torch.nn.Module):
    def forward(self, sequence, values, sorter):
        return (torch.searchsorted(sequence, values, right=True), torch.searchsorted(sequence, values, out_int32=True),
                torch.searchsorted(sequence[0, sorter], values[0], sorter=torch.argsort(sorter)))


def test_searchsorted_translation():
    sequence = torch.tensor([[0.0, 1.0, 1.0, 2.0], [-1.0, 0.5, 3.0, 4.0]])
    inputs = {"sequence": sequence, "values": torch.tensor([[-2.0, 1.0, 1.5, float("nan")], [0.5, 3.5, 9.0, -1.0]]),
              "sorter": torch.tensor([2, 0, 3, 1])}
    with pytest.raises(ExportError, match=r"No ONNX function found for <OpOverload\(op='aten.searchsorted'"):
        hfexport.export(SearchSorted(), inputs, backend="onnx", disable=("_aten_searchsorted",))
    exported = hfexport.export(SearchSorted(), inputs, backend="onnx")
    assert "_aten_searchsorted" in exported.manifest["onnx"]["translations"]
    report = exported.verify(inputs, atol=0, rtol=0)
    assert report.passed, report  # exact indices, NaN past the end as in eager


# ── _aten_sym_numel ──────────────────────────────────────────────────────────────────────────────────
@pytest.mark.slow  # two ONNX exports of the zoo's tiny PaddleOCR-VL with its image; about 22 s on an idle 2-core machine
def test_numel_of_paddleocr_vl_image_features_exports():
    """PaddleOCR-VL checks ``n_image_tokens * hidden == image_features.numel()`` on features whose count is
    data-dependent (packed patches): ``aten.sym_numel`` stays in the program (a backed-only ``numel()`` is folded to a
    product of sizes before the translation, so a plain module does not show it)."""
    from hfexport_sweep.zoo import build_case

    model, inputs, alt_inputs = build_case("paddleocr_vl/PaddleOCRVLModel")
    with pytest.raises(ExportError, match=r"No ONNX function found for <OpOverload\(op='aten.sym_numel'"):
        hfexport.export(model, inputs, backend="onnx", dynamic=True, disable=("_aten_sym_numel",))
    exported = hfexport.export(model, inputs, backend="onnx", dynamic=True)
    assert "_aten_sym_numel" in exported.manifest["onnx"]["translations"]
    report = exported.verify(alt_inputs, atol=1e-4, rtol=1e-3)
    assert report.passed, str(report)


# ── _aten_scaled_dot_product_attention (c03, left padding) ─────────────────────────────────────────────
class BoolMaskAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_translation_zeroes_fully_masked_rows_like_eager(kind):
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 2, 5, 5, dtype=torch.bool)
    mask[0, 0, 0, :] = False  # query row 0 of batch 0, head 0 sees no key
    mask[:, :, :, 4] = False  # the last key is padding for everyone
    if kind == "additive":  # (1 - mask) * -inf padding: 0 where visible, -inf where not
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    inputs = {"q": q, "k": q, "v": q, "mask": mask}
    without = hfexport.export(BoolMaskAttention(), inputs, backend="onnx", disable=("_aten_scaled_dot_product_attention",),
                              verify=False)  # it would raise VerificationError
    assert without.manifest["verification"]["passed"] is False
    report = without.verify(inputs, atol=ATOL, rtol=0)
    assert not report.passed, report
    row = without(**inputs)[0, 0, 0]
    if kind == "bool":
        assert torch.allclose(row, q[0, 0].mean(0), atol=1e-5)  # a uniform softmax: the mean of v, not 0
    else:
        assert torch.isnan(row).all()  # softmax over -inf only
    exported = hfexport.export(BoolMaskAttention(), inputs, backend="onnx")
    report = exported.verify(inputs, atol=ATOL, rtol=0)
    assert report.passed and report.max_abs_diff < 1e-5, report
    assert torch.equal(exported(**inputs)[0, 0, 0], torch.zeros(8))
    assert "IsNaN" not in _op_types(exported.runner.path)  # a boolean mask goes in as an additive one


def test_sdpa_translation_on_a_left_padded_llama_batch():
    model, exported = onnx_export("llama")  # with the translation (shared with the matrix test)
    inputs = dummy_inputs(model, batch=3, seq=11, seed=2)
    inputs["attention_mask"][0, :4] = 0  # left padding: the padded query rows see no key under the causal mask
    report = exported.verify(inputs, atol=ATOL, rtol=0)
    assert report.passed, report
    without = hfexport.export(model, backend="onnx", dynamic=True, disable=("_aten_scaled_dot_product_attention",))
    report = without.verify(inputs, atol=ATOL, rtol=0)
    assert not report.passed and report["logits"].max_abs_diff > 1e-2, report


# ── _fix_ir_topk_sorted ────────────────────────────────────────────────────────────────────────────────
class TopkUnsorted(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 5, dim=-1, sorted=False)


def test_topk_sorted_fix_makes_ort_return_eagers_order():
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        values, indices = TopkUnsorted()(x)
    without = hfexport.export(TopkUnsorted(), {"x": x}, backend="onnx", disable=("_fix_ir_topk_sorted",),
                              verify=False)  # it would raise VerificationError
    assert without.manifest["onnx"]["ir_fixes"] == {}
    got_values, got_indices = without(x=x)
    assert not torch.equal(got_values, values)  # ORT's heap order
    assert torch.equal(got_values.sort(-1).values, values.sort(-1).values)  # the same set

    exported = hfexport.export(TopkUnsorted(), {"x": x}, backend="onnx")
    assert exported.manifest["onnx"]["ir_fixes"] == {"_fix_ir_topk_sorted": 1}
    report = exported.verify({"x": x}, atol=0, rtol=0)
    assert report.passed, report  # values and indices in eager's (sorted) order


# ── _aten_gelu ─────────────────────────────────────────────────────────────────────────────────────────
def _ort_optimized_op_types(path, tmp_path) -> list[str]:
    """The op types of the graph ONNX Runtime actually runs (after its own fusions)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    options.log_severity_level = 3
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return _op_types(tmp_path / "ort_optimized.onnx")


def test_gelu_translation_is_fused_by_onnxruntime(tmp_path):
    model, exported = onnx_export("bert")  # with the translation (shared with the matrix test)
    assert "_aten_gelu" in exported.manifest["onnx"]["translations"]
    fused = _ort_optimized_op_types(exported.runner.path, tmp_path)
    assert "Erf" not in fused and fused.count("BiasGelu") + fused.count("Gelu") == 2, fused  # one per layer
    report = exported.verify(dummy_inputs(model, batch=3, seq=13, seed=1), atol=ATOL, rtol=0)
    assert report.passed, report

    # Without it (and without onnxscript's fusions, whose erf_gelu rule matches torchlib's order in the file), ONNX
    # Runtime's session leaves the five ops.
    without = hfexport.export(model, backend="onnx", dynamic=True, disable=("_aten_gelu",), ort_fusions=None)
    unfused = _ort_optimized_op_types(without.runner.path, tmp_path)
    assert unfused.count("Erf") == 2 and "Gelu" not in unfused and "BiasGelu" not in unfused, unfused
    # From opset 20 on torchlib writes ONNX Gelu itself, and the translation steps aside.
    from hfexport_onnx.exporter_onnx import translation_table

    assert torch.ops.aten.gelu.default not in translation_table((), opset_version=20)


# ── _fix_complex_to_real_pairs (d14) ───────────────────────────────────────────────────────────────────
class ComplexOutput(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x) * 2


def test_complex_fix_rewrites_complex_rope_into_real_pairs():
    inputs = {"x": torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0)),
              "positions": torch.arange(5.0).repeat(2, 1)}
    with pytest.raises(ExportError, match=r"step torch.onnx.export failed.*No ONNX function found for "
                                          r"<OpOverload\(op='aten.unsqueeze'.*complex-valued input"):
        hfexport.export(ComplexRope(), inputs, backend="onnx", disable=("_fix_complex_to_real_pairs",))
    exported = hfexport.export(ComplexRope(), inputs, backend="onnx")
    assert "hfexport_dynamo.rewrites._fix_complex_to_real_pairs" in exported.manifest["workarounds"]["fixes"]
    report = exported.verify(inputs, atol=ATOL)
    assert report.passed, report


class SqueezeFirst(torch.nn.Module):
    """``squeeze(0)`` of a batch that is not 1 (torch skips the dim) and of one that is."""

    def forward(self, x, one):
        return x.squeeze(0) * 2, one.squeeze(0) + 1


def test_squeeze_fix_drops_the_dims_torch_keeps():
    inputs = {"x": torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), "one": torch.ones(1, 3)}
    with pytest.raises(ExportError, match=r"Op \(Squeeze\).*Dimension of input 0 must be 1 instead of 16"):
        hfexport.export(SqueezeFirst(), inputs, backend="onnx", disable=("_fix_squeeze_dims_torch_keeps",),
                        ort_fusions=None)
    exported = hfexport.export(SqueezeFirst(), inputs, backend="onnx", ort_fusions=None)
    fixes = exported.manifest["workarounds"]["fixes"]
    assert fixes["hfexport_dynamo.rewrites._fix_squeeze_dims_torch_keeps"] == 1  # not `one`'s
    report = exported.verify(inputs, atol=0, rtol=0)
    assert report.passed and report.max_abs_diff == 0.0, report


def test_complex_output_fails_with_a_clear_error():
    """ONNX Runtime runs (almost) no complex kernels: a program that returns a complex tensor is refused, saying
    what to return instead."""
    with pytest.raises(ExportError, match=r"stage 3/5 \(FX node fixes.*ComplexRewriteError: the program returns "
                                          r"a complex tensor \(return torch.view_as_real\(z\) instead\): the onnx "
                                          r"backend has no complex dtype"):
        hfexport.export(ComplexOutput(), {"x": torch.randn(3, 2)}, backend="onnx")


@pytest.mark.slow  # two ONNX exports of the zoo's tiny LLaVA with an image; about 40 s
def test_is_all_true_translation_lets_llava_with_an_image_export():
    from hfexport_sweep.zoo import build_case, image_inputs

    model, inputs, alt_inputs = build_case("llava/LlavaModel")
    assert image_inputs(model).used and "pixel_values" in inputs  # its torch._check on the image tokens is traced
    exported = hfexport.export(model, inputs, backend="onnx", dynamic=True)
    report = exported.verify(alt_inputs, atol=1e-4, rtol=1e-3)  # batch 3, another text length, the same image
    assert report.passed, str(report)

    with pytest.raises(ExportError, match=r"No ONNX function found for <OpOverload\(op='aten\._is_all_true'"):
        hfexport.export(model, inputs, backend="onnx", dynamic=True, disable=("_aten_is_all_true",))


# ── _fix_bitwise_shift_spellings, _aten_bitwise_right_shift, _aten_bitwise_left_shift (s50, s51) ───────────
class ShiftSpellings(torch.nn.Module):
    def forward(self, packed, amounts, signed):
        return ((packed.unsqueeze(-1) >> amounts) & 3, (packed << 4) | (packed >> 4), 1 << amounts,
                signed >> 3, torch.bitwise_right_shift(-96, amounts.to(torch.int32)))


def _shift_inputs():
    return {"packed": torch.tensor([0x00, 0x1F, 0xA7, 0xFF], dtype=torch.uint8),
            "amounts": torch.tensor([0, 2, 4, 6], dtype=torch.uint8),
            "signed": torch.tensor([-1000, -9, 7, 1000], dtype=torch.int32)}


def _assert_exact(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e), (a, e)


def test_shift_fix_gives_torchlib_one_overload_per_direction():
    inputs = _shift_inputs()
    with pytest.raises(ExportError, match=r"No ONNX function found for <OpOverload\(op='aten.__rshift__', "
                                          r"overload='Tensor'\)>"):
        hfexport.export(ShiftSpellings(), inputs, backend="onnx", disable=("_fix_bitwise_shift_spellings",))
    exported = hfexport.export(ShiftSpellings(), inputs, backend="onnx")
    _assert_exact(exported(**inputs), ShiftSpellings()(**inputs))


def test_shift_translations_keep_unsigned_dtypes():
    inputs = _shift_inputs()
    # torchlib's shifts: uint8 >> gives int8, and ONNX Runtime refuses BitwiseAnd(int8, uint8) at session creation
    with pytest.raises(ExportError, match=r"BitwiseAnd.*\(tensor\(int8\) and tensor\(uint8\)"):
        hfexport.export(ShiftSpellings(), inputs, backend="onnx", ort_fusions=None,
                        disable=("_aten_bitwise_right_shift", "_aten_bitwise_left_shift"))
    exported = hfexport.export(ShiftSpellings(), inputs, backend="onnx")
    _assert_exact(exported(**inputs), ShiftSpellings()(**inputs))


# ── _aten_masked_select (e10) ────────────────────────────────────────────────────────────────────────────
class AboveThreshold(torch.nn.Module):
    def forward(self, scores, keep_row):
        return scores.masked_select(scores > 0.5) * 1.5, scores.masked_select(keep_row.unsqueeze(-1))


def test_masked_select_translation_as_compress():
    g = torch.Generator().manual_seed(0)
    inputs = {"scores": torch.rand(4, 6, generator=g), "keep_row": torch.tensor([True, False, True, True])}
    with pytest.raises(ExportError, match=r"No ONNX function found for <OpOverload\(op='aten.masked_select'"):
        hfexport.export(AboveThreshold(), inputs, backend="onnx", disable=("_aten_masked_select",))
    exported = hfexport.export(AboveThreshold(), inputs, backend="onnx")
    other = {"scores": torch.rand(4, 6, generator=g), "keep_row": torch.tensor([False, False, True, False])}
    for sample in (inputs, other):  # 11 and another count of values: the length is the data's
        for a, e in zip(exported(**sample), AboveThreshold()(**sample), strict=True):
            torch.testing.assert_close(a, e, atol=ATOL, rtol=0)


# ── _fix_ir_bfloat16_as_float32 (e05) ───────────────────────────────────────────────────────────────────
class Bf16Island(torch.nn.Module):
    """s54: a bfloat16 projection inside a float32 model; its output is rounded to bfloat16 as eager's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(8, 16).to(torch.bfloat16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.inner(x.to(torch.bfloat16))).float()), self.inner.weight.sum()


def test_bfloat16_fix_computes_in_float32_on_the_cpu():
    inputs = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(ExportError, match=r"NOT_IMPLEMENTED : Could not find an implementation for (MatMul|Gemm)"):
        hfexport.export(Bf16Island(), inputs, backend="onnx", ort_fusions=None,
                        disable=("_fix_ir_bfloat16_as_float32",))
    exported = hfexport.export(Bf16Island(), inputs, backend="onnx", atol=1e-2, rtol=1e-2)
    assert exported.manifest["onnx"]["ir_fixes"]["_fix_ir_bfloat16_as_float32"] > 0  # recorded in the manifest
    actual, expected = exported(**inputs), Bf16Island()(**inputs)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-2, rtol=1e-2)
    assert actual[1].dtype == torch.float32  # a bfloat16 output comes back as float32, of the same value
    torch.testing.assert_close(actual[1], expected[1].float(), atol=1e-2, rtol=1e-2)


def test_bfloat16_inputs_run_on_the_float32_graph(tmp_path):
    """A bfloat16 model exported to ONNX computes in float32; the bfloat16 tensors it takes are fed as float32,
    on the exported artifact (its own verification included) and on the loaded one; float32 is taken as well.
    Before, the feed raised "TypeError: Got unsupported ScalarType BFloat16" (numpy has no bfloat16)."""
    model = Bf16Block().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    exported = hfexport.export(model, {"x": x}, backend="onnx", atol=2e-2, rtol=2e-2)
    assert exported.manifest["inputs"][0]["dtype"] == "bfloat16"
    exported.save(tmp_path / "bf16")
    loaded = hfexport.load(tmp_path / "bf16")
    with torch.no_grad():
        expected = model(x)
    for artifact in (exported, loaded):
        for given in (x, x.float()):
            actual = artifact(x=given)
            assert actual.dtype == torch.float32  # computed in float32, returned unrounded
            torch.testing.assert_close(actual, expected.float(), atol=2e-2, rtol=2e-2)


# ── _patch_identity_constants_match_exactly (MuseGlimmer's post-norm epsilon) ─────────────────────
class TinyEpsilonNorm(torch.nn.Module):
    """``x / sqrt(mean(x**2) + 1e-8)``: an epsilon at onnxscript's ``abs_tol``, on values whose mean square is
    comparable to it."""

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def test_identity_rules_keep_an_epsilon_of_1e_8():
    inputs = {"x": 1e-4 * torch.randn(2, 8, generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        eager = TinyEpsilonNorm()(**inputs)
    for disable, ok in (((), True), (("_patch_identity_constants_match_exactly",), False)):
        exported = hfexport.export(TinyEpsilonNorm(), inputs, backend="onnx", disable=disable, verify=False,
                                   ort_fusions=None)
        assert exported.manifest["onnx"]["optimized"] is True
        error = (exported(**inputs) - eager).abs().max().item()
        assert (error <= 1e-6) == ok, (disable, error)  # 0.0 with the patch; 0.64 with the epsilon dropped


# ── _patch_constant_outputs_left_out ──
class ReturnsIndexedFeatures(torch.nn.Module):
    """Returns ``(layer index, features)`` pairs beside its output, as Granite 4 Vision's deepstack features do."""

    def forward(self, x):
        return x * 2, [(0, x + 1), (1, x - 1)], True


def test_constant_outputs_are_left_out_of_the_graph_and_put_back(tmp_path):
    inputs = {"x": torch.randn(2, 3, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(ExportError, match="'int' object has no attribute 'name'"):
        hfexport.export(ReturnsIndexedFeatures(), inputs, backend="onnx",
                        disable=("_patch_constant_outputs_left_out",))

    exported = hfexport.export(ReturnsIndexedFeatures(), inputs, backend="onnx")
    assert exported.manifest["onnx"]["output_constants"] == {"1": 0, "3": 1, "5": True}
    exported.save(tmp_path / "art")
    loaded = hfexport.load(tmp_path / "art")
    doubled, pairs, flag = loaded(**inputs)
    x = inputs["x"]
    assert torch.equal(doubled, x * 2) and flag is True
    assert [index for index, _ in pairs] == [0, 1]
    assert torch.equal(pairs[0][1], x + 1) and torch.equal(pairs[1][1], x - 1)


# ── hfexport_dynamo._pytree: a cache's traced sizes are not kept in the output spec's static context ──
class SlidingWindowCache(torch.nn.Module):
    """Returns a cache of one sliding-window layer (window 4) filled with keys of a dynamic length."""

    def forward(self, keys):
        import transformers

        cache = transformers.DynamicCache(config=transformers.MistralConfig(sliding_window=4, num_hidden_layers=1))
        k, _ = cache.update(keys, keys * 2, 0)
        return k.sum(-1), cache


def test_sliding_window_cache_output_exports_at_a_dynamic_length():
    """``DynamicSlidingWindowLayer.cumulative_length`` is the SymInt of the traced length; kept in the output spec's
    static context, torch.onnx's ``run_decompositions`` failed to deep-copy its FakeTensors (DiffusionGemma)."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 2, 6, 8, generator=gen)
    exported = hfexport.export(SlidingWindowCache(), {"keys": keys}, backend="onnx", dynamic=True)
    report = exported.verify({"keys": torch.randn(3, 2, 9, 8, generator=gen)}, atol=1e-5, rtol=0)
    assert report.passed, report
    layer = exported(keys=keys)[1].layers[0]
    assert type(layer).__name__ == "DynamicSlidingWindowLayer"
    assert torch.equal(layer.keys, keys[:, :, -3:]) and torch.equal(layer.values, keys[:, :, -3:] * 2)
    assert layer.cumulative_length is None  # eager's is 6; a traced size has no one value to keep
