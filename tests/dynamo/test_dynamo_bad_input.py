"""Bad inputs to the dynamo backend are named before any stage runs (float token ids, a zero-size batch, a tensor
that would only reach ``**kwargs``), and a call of an exported program outside what it takes is named before the
runtime runs. docs/guide.md's table "Bad input and what hfexport says" lists them."""

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport import ExportError, InvalidInputError
from hfexport_dynamo.inputs import dummy_inputs


class _NoStage:
    def __call__(self, event):
        raise AssertionError(f"stage {event.stage.title} ran before the error")


@pytest.fixture(scope="module")
def bert1():
    return tiny_model("bert", layers=1)


@pytest.fixture(scope="module")
def exported_bert(bert1):
    return hfexport.export(bert1, dynamic=True)


class TakesKwargs(torch.nn.Module):
    def forward(self, x, **kwargs):
        return x * 2 if not kwargs.get("negate") else -x


def test_float_input_ids_are_named_before_any_stage(bert1):
    inputs = dict(dummy_inputs(bert1), input_ids=torch.rand(2, 8))
    with pytest.raises(InvalidInputError, match=r"input 'input_ids' is a float32 tensor; token ids must be integers "
                                                r"\(torch.long\): pass input_ids.long\(\)"):
        hfexport.export(bert1, inputs, progress=_NoStage())


def test_a_zero_size_batch_is_named_before_any_stage(bert1):
    inputs = {k: v[:0] for k, v in dummy_inputs(bert1).items()}
    with pytest.raises(InvalidInputError, match=r"input 'input_ids' has batch size 0 \(shape \[0, 8\]\): export "
                                                r"with a non-empty example"):
        hfexport.export(bert1, inputs, progress=_NoStage())


def test_an_extra_tensor_for_kwargs_is_refused_not_made_a_program_input():
    with pytest.raises(InvalidInputError, match=r"input 'y' is not a parameter of TakesKwargs.forward: it would "
                                                r"reach forward only through \*\*kwargs .*forward's parameters: x"):
        hfexport.export(TakesKwargs(), {"x": torch.ones(2), "y": torch.ones(2)}, progress=_NoStage())
    # A constant may still go through **kwargs: it is baked into the program, not an input.
    exported = hfexport.export(TakesKwargs(), {"x": torch.ones(2), "negate": True})
    assert exported.input_names == ["x"] and torch.equal(exported(x=torch.ones(2)), -torch.ones(2))


def test_transformers_deprecated_cache_names_may_go_through_kwargs():
    from hfexport_dynamo.tracer import DYNAMO_TRACER

    llama = tiny_model("llama", layers=1)
    inputs = {"input_ids": torch.tensor([[7]]), "past_key_values": torch.ones(1)}
    DYNAMO_TRACER.check_inputs(inputs, llama)  # transformers renames it to `cache` inside forward
    with pytest.raises(InvalidInputError, match="input 'past_key_valuez' is not a parameter of LlamaForCausalLM"):
        DYNAMO_TRACER.check_inputs({"input_ids": torch.tensor([[7]]), "past_key_valuez": torch.ones(1)}, llama)


def test_a_name_forward_does_not_take_is_refused_before_any_stage():
    with pytest.raises(InvalidInputError, match=r"Linear.forward takes no 'x'; it takes input"):
        hfexport.export(torch.nn.Linear(3, 2), {"x": torch.ones(2, 3)}, progress=_NoStage())


def test_dynamic_shapes_naming_a_dim_the_input_lacks_is_named(bert1):
    with pytest.raises(ExportError, match=r"stage 4/5 \(Dynamic shapes\).*dynamic_shapes\['input_ids'\] names dims "
                                          r"\[2\], but input 'input_ids' has 2 dims \(shape \[2, 8\]\)"):
        hfexport.export(bert1, dynamic_shapes={"input_ids": {2: None}})
    with pytest.raises(ExportError, match=r"dynamic_shapes\['input_ids'\] gives 3 dim specs, but input 'input_ids' "
                                          r"has 2 dims"):
        hfexport.export(bert1, dynamic_shapes={"input_ids": [None, None, None]})


@pytest.mark.parametrize("change,error,match", [
    (lambda i: dict(i, input_ids=i["input_ids"].float()), TypeError,
     r"input 'input_ids' is float32; this dynamo export takes input_ids as int64 \[s\d+, s\d+\] with s\d+ in \[1, "
     r"inf\), s\d+ in \[1, 64\]: pass input_ids.to\(torch.int64\)"),
    (lambda i: dict(i, input_ids=i["input_ids"].int()), TypeError, r"input 'input_ids' is int32"),
    (lambda i: dict(i, input_ids=i["input_ids"][0]), ValueError, r"input 'input_ids' has 1 dims \(shape \[8\]\)"),
    (lambda i: dict(i, attention_mask=i["attention_mask"][:, :5]), ValueError,
     r"input 'attention_mask' has size 5 in dim 1, but 'input_ids' dim 1 is 8: both are s\d+"),
    (lambda i: {k: torch.ones(2, 65, dtype=torch.long) for k in i}, ValueError,
     r"input 'input_ids' has size 65 in dim 1 \(shape \[2, 65\]\), outside the program's range"),
])
def test_a_call_outside_the_program_is_named_before_the_runtime(exported_bert, bert1, change, error, match,
                                                                monkeypatch):
    def runtime_called(args):
        raise AssertionError("the runtime ran")

    monkeypatch.setattr(exported_bert.runner, "run", runtime_called)
    with pytest.raises(error, match=match):
        exported_bert(**change(dummy_inputs(bert1)))


def test_verify_at_a_shape_a_static_export_cannot_take_names_the_static_dim(bert1):
    exported = hfexport.export(bert1)  # static: batch 2, seq 8
    with pytest.raises(ValueError, match=r"input 'input_ids' has size 3 in dim 0 \(shape \[3, 8\]\); this dynamo "
                                         r"export takes input_ids as int64 \[2, 8\] \(static shape\): dim 0 is static "
                                         r"\(2\); re-export with dynamic=True"):
        exported.verify(dummy_inputs(bert1, batch=3))


def test_a_call_with_float64_runs_cast_to_the_programs_float32():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    exported = hfexport.export(model, {"input": torch.ones(2, 3)})
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(exported(input=x), model(x.float()))
