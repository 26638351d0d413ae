"""Inputs a forward takes only through ``**kwargs`` and transformers ignores (``head_mask``: transformers 5 removed
head masks, Transformers' own model testers still pass them) are dropped with one warning that names them, and
dropped again when the export is called with them (issue 26; ``hfexport_dynamo.tracer.IGNORED_KWARGS``). Any other
tensor for ``**kwargs``, and any name a forward without ``**kwargs`` does not take, is still refused."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport import InvalidInputError
from hfexport_dynamo.inputs import dummy_inputs

ATOL = 1e-4


def _with_head_mask(model, batch: int, seq: int, seed: int) -> dict:
    return {**dummy_inputs(model, batch, seq, seed=seed), "head_mask": torch.ones(1, 2)}


@pytest.mark.parametrize("backend", ["dynamo", "onnx", pytest.param("executorch-xnnpack", marks=pytest.mark.slow)])
def test_gpt2_head_mask_is_dropped_with_a_warning(backend, tmp_path):
    """ExecuTorch is slow: the behaviour is the trace's, which dynamo and ONNX check; one more lowering."""
    if backend.startswith("executorch"):
        pytest.importorskip("executorch")
    model = tiny_model("gpt2", layers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = hfexport.export(model, _with_head_mask(model, 2, 7, 0), backend=backend, dynamic=True)
    dropped = [str(w.message) for w in caught if "dropped input" in str(w.message)]
    assert len(dropped) == 1 and "dropped input 'head_mask'" in dropped[0] and "ignores it" in dropped[0]
    assert exported.manifest["ignored_inputs"] == ["head_mask"]
    assert [i["name"] for i in exported.manifest["inputs"]] == ["input_ids", "attention_mask"]
    for inputs in (_with_head_mask(model, 2, 7, 1), _with_head_mask(model, 3, 12, 2)):
        report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)
    if backend == "dynamo":  # the saved manifest keeps it: a loaded export drops head_mask too
        loaded = hfexport.load(exported.save_pretrained(tmp_path / "gpt2"))
        report = loaded.verify(_with_head_mask(model, 3, 12, 3), atol=ATOL, rtol=0.0, reference=model)
        assert report.passed, str(report)


def test_other_names_are_still_refused():
    class TakesKwargs(torch.nn.Module):
        def forward(self, x, **kwargs):
            return x * 2

    with pytest.raises(InvalidInputError, match=r"input 'y' is not a parameter of TakesKwargs.forward"):
        hfexport.export(TakesKwargs(), {"x": torch.ones(2), "y": torch.ones(2)})
    # a forward without **kwargs: head_mask is a name it does not take
    with pytest.raises(InvalidInputError, match=r"Linear.forward takes no 'head_mask'; it takes input"):
        hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3), "head_mask": torch.ones(1, 2)})
