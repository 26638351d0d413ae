"""Every field case (tests/field_cases: the reproducers of ../shared/cases and their siblings) exports on every
backend, runs on the backend's runtime and matches its expected eager value (floats within atol 1e-4 /
rtol 1e-3, integers exactly), at both input shapes where the case gives two."""

import copy
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import hfexport

FIELD = Path(__file__).parent  # c*: ../shared/cases round one; d*: round two; e*: round three; f*: round four;
CASES = sorted(p.stem for p in FIELD.glob("[cdefs][0-9]*.py"))  # s*: our siblings
BACKENDS = ["dynamo", "onnx", "executorch-xnnpack", "openvino"]
ATOL, RTOL = 1e-4, 1e-3


def load_case(name: str):
    if str(FIELD) not in sys.path:
        sys.path.insert(0, str(FIELD))  # the cases import their sibling helper `_tiny`
    spec = importlib.util.spec_from_file_location(f"field_case_{name}", FIELD / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_kwargs(model, inputs):
    if isinstance(inputs, dict):
        return inputs
    names = list(inspect.signature(model.forward).parameters)
    return dict(zip(names, inputs, strict=False))


def assert_matches(actual, expected, where, tol=(ATOL, RTOL)):
    if isinstance(expected, torch.Tensor) and not isinstance(actual, torch.Tensor):
        actual = actual.logits  # transformers cases compare the logits of the ModelOutput
    elif isinstance(expected, tuple | list) and hasattr(actual, "to_tuple"):
        actual = actual.to_tuple()  # ... or its non-None fields in order (e11: last_hidden_state, pooler_output)
    actual = actual if isinstance(actual, tuple | list) else (actual,)
    expected = expected if isinstance(expected, tuple | list) else (expected,)
    assert len(actual) == len(expected), where
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape, f"{where} output {i}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        if e.is_floating_point():
            label = f"{where} output {i}"
            torch.testing.assert_close(a.to(e.dtype), e, atol=tol[0], rtol=tol[1],
                                       msg=lambda m, label=label: f"{label}: {m}")
        else:  # the dtype too: a uint8 shift returned as int8 wraps back to the right bytes
            assert a.dtype == e.dtype and torch.equal(a, e), f"{where} output {i}: {a} != {e}"


def export_options(module, inputs) -> dict:
    """``hfexport.export`` options of a case: its ``HF_OPTIONS``, and ``DYNAMIC_SHAPES`` (per input name, or in
    forward-parameter order)."""
    options = dict(getattr(module, "HF_OPTIONS", {}))
    shapes = getattr(module, "DYNAMIC_SHAPES", None)
    if shapes is not None and "dynamic_shapes" not in options:
        options["dynamic_shapes"] = shapes if isinstance(shapes, dict) else dict(zip(inputs, shapes, strict=False))
    return options


# Reported cases not fixed yet (issue 25), with what happens: an xfail runs and must fail (strict), a skip would
# not finish in the suite's time.
OPEN: dict[tuple[str, str], Any] = {}  # none open (issue 46 closed c01's and e05's on openvino)


# Cases a runtime cannot express without an option: the export without it must be refused with an error that names
# the op, the runtime's upstream issue and the option (the pattern); with the option the case must match eager.
_WHILE_LOOP_REFUSAL = r"while_loop.*pytorch/executorch#8769.*while_loop_max_iterations"
NEEDS_OPTION: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    (case, "executorch-xnnpack"): (_WHILE_LOOP_REFUSAL, {"while_loop_max_iterations": 8})
    for case in ("f04_while_loop_linear_body", "s76_while_loop_until_converged", "s77_while_loop_counter_submodule")
}


# Reported cases whose run on a backend is in the full suite only: the backend's part of their fix has its own
# test in the default set, on a small module (named here; test_the_covering_tests_are_in_the_default_set checks
# it), and the reported model's lowering is the slowest of the default set (ExecuTorch: 25 and 15 s of CPU).
COVERED_ELSEWHERE = {
    ("e11_swin_window_padding_dynamic", "executorch-xnnpack"):
        "tests/executorch/test_executorch_workarounds.py::test_fix_sym_floor_mod",  # pad by (-h) % 2, odd sizes
    ("d14_llama4_complex_rope", "executorch-xnnpack"):
        "tests/executorch/test_executorch_workarounds.py::test_fix_complex_to_real_pairs",  # helpers.ComplexRope
    ("f01_gru_dynamic_time", "executorch-xnnpack"):  # nn.GRU as a scan op (which ExecuTorch lowers: s72, s73)
        "tests/dynamo/test_rnn_layers.py::test_gru_exports_with_a_dynamic_time_axis_and_not_without_the_patch",
    ("s72_lstm_bidirectional_proj_dynamic_time", "dynamo"):  # 13-15 s each here: four and five scans to trace
        "tests/dynamo/test_rnn_layers.py::test_scan_form_matches_the_fused_op",
    ("s73_stacked_gru_relu_rnn_time_major", "dynamo"):
        "tests/dynamo/test_rnn_layers.py::test_scan_form_matches_the_fused_op",
    ("f03_associative_scan_recurrence", "executorch-xnnpack"):  # associative_scan as a scan op (s74, s75 on ET)
        "tests/dynamo/test_associative_scan.py::test_pointwise_associative_scan_is_a_scan_op_and_not_without_the_patch",
    ("f04_while_loop_linear_body", "executorch-xnnpack"):  # refused, naming the option; with it, masked steps
        "tests/executorch/test_executorch_while_loop.py::test_while_loop_is_refused_naming_the_issue_and_the_option",
    ("f05_fake_quantize_eval", "executorch-xnnpack"):  # the fake-quant ops decomposed (what ExecuTorch rejects)
        "tests/dynamo/test_fake_quant.py::test_fake_quantize_ops_are_decomposed_and_kept_without_the_patch",
    ("f11_lfm2_conv_cache_decode", "executorch-xnnpack"):  # a dict-held state mutated in place, written back
        "tests/dynamo/test_dict_held_states.py::test_dict_held_state_mutated_in_place",
    ("f12_qwen3next_gated_delta_prefill", "executorch-xnnpack"):  # a partition returning a slice twice; f12's
        "tests/executorch/test_executorch_workarounds.py::test_patch_pass_through_outputs_copied",  # lowering: 150 s
    # a whole bf16 RoBERTa on XNNPACK (30 s at load 3): its fixes there, _fix_sdpa_contiguous_output and
    # _fix_view_as_reshape, have their own tests; a bf16 Linear lowered by the XNNPACK variant:
    ("e05_roberta_bf16", "executorch-xnnpack"):
        "tests/executorch/test_executorch_workarounds.py::test_fix_float_casts_to_variant_dtype",
    # siblings of e11 (which stays on dynamo and onnx): 21 and 12 s at load 3, the window padding on a small module
    ("s60_swinv2_even_grid", "dynamo"):
        "tests/dynamo/test_window_padding.py::test_a_slice_back_from_padding_keeps_both_parities",
    ("s61_donut_swin_odd_even", "dynamo"):
        "tests/dynamo/test_window_padding.py::test_ops_on_a_slice_back_from_padding_keep_both_parities",
    # Llamas and a Mixtral lowered whole (46-63 s each at load 6, the three slowest ET cases of the default set):
    # their model-side fixes are dynamo-scope patches (_patch_dynamic_rope_update, _patch_moe_experts_dense), run
    # by the dynamo and onnx rows; on XNNPACK the fixes they fire (_fix_last_dim_mean_as_average_pooling,
    # _fix_view_as_reshape, _fix_sdpa_contiguous_output) have their own tests, and a whole tiny Llama is lowered by:
    ("c15_llama_dynamic_rope", "executorch-xnnpack"):
        "tests/executorch/test_executorch.py::test_tiny_matrix_dynamic",
    ("d01_mixtral_moe_eager_experts", "executorch-xnnpack"):
        "tests/executorch/test_xnnpack_partitions.py::test_a_norms_mean_stays_in_the_xnnpack_partition",
    # f12 exported on ONNX before issue 46 (no ONNX-side change); 14 s here: its run on ONNX is in the full suite,
    # and the Qwen3-Next states' ONNX export is in the default set
    ("f12_qwen3next_gated_delta_prefill", "onnx"):
        "tests/dynamo/test_dict_held_states.py::test_dict_held_state_mutated_in_place",
}


def _params() -> list:
    """Every case on every backend; in the -m "not slow" loop, the reported cases (c*, d*, e*, f*) on every backend
    but openvino (and but those of ``COVERED_ELSEWHERE``) and our siblings (s*) on dynamo only (their ONNX and ExecuTorch runs are in
    the full suite)."""
    params = []
    for case in CASES:
        for backend in BACKENDS:
            # openvino: every case in the full suite; its fixes' tests are in tests/openvino/test_openvino_parity.py
            # and tests/dynamo/test_dict_held_states.py (the default set's budget has no room for 20 conversions)
            slow = (case.startswith("s") and backend != "dynamo") or (case, backend) in COVERED_ELSEWHERE \
                or backend == "openvino"
            marks = [pytest.mark.slow] if slow else []
            marks += [OPEN[case, backend]] if (case, backend) in OPEN else []
            params.append(pytest.param(case, backend, marks=marks))
    return params


@pytest.mark.parametrize("case,backend", _params())
def test_field_case(case, backend):
    module = load_case(case)
    model, inputs, expected = module.build()
    inputs = as_kwargs(model, inputs)
    options = export_options(module, inputs)
    if (case, backend) in NEEDS_OPTION:
        refusal, extra = NEEDS_OPTION[case, backend]
        with pytest.raises(hfexport.ExportError, match=refusal):
            hfexport.export(model, copy.deepcopy(inputs), backend=backend, **options)
        options.update(extra)
    exported = hfexport.export(model, copy.deepcopy(inputs), backend=backend, **options)
    tol = getattr(module, "TOL", (ATOL, RTOL))
    assert_matches(exported(**copy.deepcopy(inputs)), expected, f"{case} on {backend}", tol)
    if hasattr(module, "ALT_INPUTS"):
        alt_inputs, alt_expected = module.ALT_INPUTS()
        assert_matches(exported(**as_kwargs(model, alt_inputs)), alt_expected, f"{case} on {backend} (second shape)",
                       tol)


def test_the_covering_tests_are_in_the_default_set():
    """Each test that ``COVERED_ELSEWHERE`` names exists, and neither it nor its module is marked slow."""
    root = FIELD.parents[1]
    for case_backend, test in COVERED_ELSEWHERE.items():
        path, name = test.split("::")
        source = (root / path).read_text()
        found = re.search(rf"^def {name}\(", source, re.M)
        assert found, f"{case_backend}: {test} does not exist"
        decorators = source[:found.start()].rsplit("\n\n", 1)[-1]  # the lines since the blank line before it
        assert not re.search(r"^@pytest\.mark\.slow", decorators, re.M), f"{case_backend}: {test} is marked slow"
        assert not re.search(r"^pytestmark\b.*slow", source, re.M), f"{case_backend}: {path} is marked slow"
