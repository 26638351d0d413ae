"""Exports more than one ExecuTorch test module reads, made once per test run (lowering is the slow part of these
tests). A test that changes an export or its directory works on its own copy."""

from __future__ import annotations

import pytest

import hfexport
from helpers import tiny_model


@pytest.fixture(scope="session")
def tiny_bert_int8():
    """``(model, export)``: a 1-layer tiny BERT, ``quantize="int8"`` (PT2E static, calibrated on the export's dummy
    inputs) on executorch-xnnpack, every workaround on."""
    pytest.importorskip("executorch")
    model = tiny_model("bert", layers=1)
    return model, hfexport.export(model, backend="executorch-xnnpack", quantize="int8")
