"""The kernel's part of quantized exports: the ``quantize=`` option's value and checks, and the comparison of a
quantized artifact with float eager (cosine similarity of the main output; max abs diff; top-1 agreement)."""

from __future__ import annotations

import math

import pytest
import torch

import hfexport
from hfexport.quantization import QuantizationRecipe, compare_quantized, resolve_quantization

RECIPES = {"int8": QuantizationRecipe("int8", "static int8", min_cosine=0.9, options=("calibration",)),
           "4w": QuantizationRecipe("4w", "int4 weights", min_cosine=0.8, options=("group_size",),
                                    default_group_size=32)}


def test_a_recipe_name_resolves_with_its_defaults():
    assert resolve_quantization(None, RECIPES, "backend 'x'") is None
    assert resolve_quantization("4w", RECIPES, "backend 'x'") == hfexport.Quantization("4w", group_size=32,
                                                                                         min_cosine=0.8)
    given = hfexport.Quantization("int8", min_cosine=0.99)
    assert resolve_quantization(given, RECIPES, "backend 'x'").min_cosine == 0.99
    calibration = [{"x": torch.ones(2)}] * 3
    assert repr(hfexport.Quantization("int8", calibration=calibration)) == "Quantization('int8', calibration=<3 batches>)"


def test_refusals_name_what_is_supported():
    with pytest.raises(ValueError, match=r"backend 'x' does not support quantize='8da4w': it supports 'int8', '4w'"):
        resolve_quantization("8da4w", RECIPES, "backend 'x'")
    with pytest.raises(ValueError, match="it supports no quantization recipe"):
        resolve_quantization("int8", {}, "backend 'y'")
    with pytest.raises(ValueError, match=r"quantize recipe 'int8' \(static int8\) takes no group_size; it takes "
                                         r"calibration"):
        resolve_quantization(hfexport.Quantization("int8", group_size=64), RECIPES, "backend 'x'")
    with pytest.raises(TypeError, match="group_size must be a positive int"):
        hfexport.Quantization("4w", group_size=0)
    with pytest.raises(TypeError, match="a quantization recipe is a name"):
        hfexport.Quantization("")


def test_the_main_output_gates_and_every_output_is_reported():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 10)
    hidden = torch.randn(2, 5, 4)
    close = logits + 0.01 * torch.randn_like(logits)
    expected = {"logits": logits, "hidden": hidden, "ids": torch.tensor([1, 2, 3])}
    actual = {"logits": close, "hidden": -hidden, "ids": torch.tensor([1, 2, 4])}
    report = compare_quantized("b", expected, actual, {"recipe": "int8", "min_cosine": 0.99})
    assert report.passed  # the main output (logits) is close; the others are reported, not gated
    assert report.main_output == "logits" and report.cosine > 0.999
    assert report.top1_agreement == pytest.approx(float((close.argmax(-1) == logits.argmax(-1)).float().mean()))
    assert report["hidden"].cosine == pytest.approx(-1.0) and report["hidden"].ok
    assert report["ids"].agreement == pytest.approx(2 / 3)
    data = report.as_dict()
    assert data["metric"] == "quantized" and data["min_cosine"] == 0.99 and data["passed"]
    assert [o["gates"] for o in data["outputs"]] == [True, False, False]
    assert "PASSED" in str(report) and "cosine" in str(report)

    failing = compare_quantized("b", {"logits": logits}, {"logits": torch.randn_like(logits)},
                                {"recipe": "int8", "min_cosine": 0.99})
    assert not failing.passed
    assert "cosine" in failing.failure_message("b", "M") and "threshold is 0.99" in failing.failure_message("b", "M")


def test_nan_zero_and_shape_mismatch():
    nan = compare_quantized("b", {"y": torch.ones(3)}, {"y": torch.tensor([1.0, math.nan, 1.0])},
                            {"recipe": "r", "min_cosine": 0.5})
    assert not nan.passed and "NaN" in nan["y"].note
    zeros = compare_quantized("b", {"y": torch.zeros(3)}, {"y": torch.zeros(3)}, {"recipe": "r", "min_cosine": 0.5})
    assert zeros.passed and zeros.cosine == 1.0
    shape = compare_quantized("b", {"y": torch.zeros(3)}, {"y": torch.zeros(4)}, {"recipe": "r", "min_cosine": 0.5})
    assert not shape.passed and "shape [4] where eager has [3]" in shape["y"].note
