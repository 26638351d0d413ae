"""Every field case (tests/field_cases: the reproducers of ../shared/cases and their siblings) exports on every
backend, runs on the backend's runtime and matches its expected eager value (floats within atol 1e-4 /
rtol 1e-3, integers exactly), at both input shapes where the case gives two."""

import copy
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch

import hfexport

FIELD = Path(__file__).parent  # c*: ../shared/cases round one; d*: round two; s*: our sibling cases
CASES = sorted(p.stem for p in FIELD.glob("[cds][0-9]*.py"))
BACKENDS = ["dynamo", "onnx", "executorch-xnnpack"]
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


def assert_matches(actual, expected, where):
    if isinstance(expected, torch.Tensor) and not isinstance(actual, torch.Tensor):
        actual = actual.logits  # transformers cases compare the logits of the ModelOutput
    actual = actual if isinstance(actual, tuple | list) else (actual,)
    expected = expected if isinstance(expected, tuple | list) else (expected,)
    assert len(actual) == len(expected), where
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape, f"{where} output {i}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        if e.is_floating_point():
            label = f"{where} output {i}"
            torch.testing.assert_close(a.to(e.dtype), e, atol=ATOL, rtol=RTOL, msg=lambda m, label=label: f"{label}: {m}")
        else:
            assert torch.equal(a.to(e.dtype), e), f"{where} output {i}: {a} != {e}"


def _params() -> list:
    """Every case on every backend; in the -m "not slow" loop, the reported cases (c*, d*) on every backend and our
    siblings (s*) on dynamo only (their ONNX and ExecuTorch runs are in the full suite)."""
    return [pytest.param(case, backend, marks=pytest.mark.slow) if case.startswith("s") and backend != "dynamo"
            else pytest.param(case, backend) for case in CASES for backend in BACKENDS]


@pytest.mark.parametrize("case,backend", _params())
def test_field_case(case, backend):
    module = load_case(case)
    model, inputs, expected = module.build()
    inputs = as_kwargs(model, inputs)
    options = {}
    if hasattr(module, "DYNAMIC_SHAPES"):
        options["dynamic_shapes"] = dict(zip(inputs, module.DYNAMIC_SHAPES, strict=False))
    exported = hfexport.export(model, copy.deepcopy(inputs), backend=backend, **options)
    assert_matches(exported(**copy.deepcopy(inputs)), expected, f"{case} on {backend}")
    if hasattr(module, "ALT_INPUTS"):
        alt_inputs, alt_expected = module.ALT_INPUTS()
        assert_matches(exported(**as_kwargs(model, alt_inputs)), alt_expected, f"{case} on {backend} (second shape)")
