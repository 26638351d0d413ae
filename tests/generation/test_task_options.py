"""A task export's options are a dataclass of the tracer's, sorted by field name: every option a user passes
reaches the plan as given, or is refused with what the backend and the task take; none is silently overwritten."""

import pytest
import torch

import hfexport
from helpers import tiny_model


class _Planned(Exception):
    pass


def _planned_options(monkeypatch, **options):
    """The options and needs the tracer's planner receives for ``options`` (the export stops right there)."""
    from hfexport_dynamo import DYNAMO_TRACER

    seen = {}

    def plan_task(model, task, inputs, task_options, needs):
        seen.update(options=task_options, needs=needs)
        raise _Planned

    monkeypatch.setattr(type(DYNAMO_TRACER), "plan_task", lambda self, *a: plan_task(*a))
    with pytest.raises(_Planned):
        hfexport.export(tiny_model("llama"), backend="onnx", task="text-generation", **options)
    return seen


def test_the_users_task_options_reach_the_plan_as_given(monkeypatch):
    seen = _planned_options(monkeypatch, max_cache_len=24, max_batch=3, prefill_chunk=6)
    options = seen["options"]
    assert (type(options).__name__, options.max_cache_len, options.max_batch, options.prefill_chunk) == (
        "GenerationOptions", 24, 3, 6)
    assert (seen["needs"].cache_layout, seen["needs"].attention) == ("io", "hfexport::cache_attention")
    # the backend's own option decides its needs, as data: plain ONNX ops, no fused attention
    assert _planned_options(monkeypatch, ort_fusions=None)["needs"].attention is None


@pytest.mark.parametrize("options,message", [
    ({"fused_cache_attention": False}, r"'fused_cache_attention': not an option of backend 'onnx' \(OnnxConfig: "),
    ({"stateful": True}, r"'stateful': not an option of backend 'onnx'"),
    ({"max_images": 2}, r"'max_images': not an option of backend 'onnx' .* nor of task 'text-generation' "
                        r"\(GenerationOptions: max_cache_len, max_batch, prefill_chunk\)"),
    ({"max_cache_len": "32"}, r"max_cache_len must be a positive int \(or None for its default\), got '32'"),
    ({"max_cache_len": 0}, r"max_cache_len must be a positive int"),
    ({"dynamic": True}, r"task='text-generation' plans the dynamic dims of each program itself"),
    ({"dynamic_shapes": {"input_ids": {1: torch.export.Dim("seq")}}}, r"export without dynamic=/dynamic_shapes="),
])
def test_an_option_the_plan_would_drop_or_overwrite_is_refused(options, message):
    with pytest.raises(TypeError, match=message):
        hfexport.export(tiny_model("llama"), backend="onnx", task="text-generation", **options)


def test_each_task_takes_its_own_options():
    from hfexport_dynamo import DYNAMO_TRACER

    names = {task: [f for f in DYNAMO_TRACER.task_options(task).__dataclass_fields__] for task in (
        "text-generation", "text2text-generation", "automatic-speech-recognition", "image-text-to-text",
        "audio-text-to-text")}
    assert names == {"text-generation": ["max_cache_len", "max_batch", "prefill_chunk"],
                     "text2text-generation": ["max_cache_len", "max_batch"],
                     "automatic-speech-recognition": ["max_cache_len", "max_batch"],
                     "image-text-to-text": ["max_cache_len", "max_batch", "prefill_chunk", "max_images"],
                     "audio-text-to-text": ["max_cache_len", "max_batch", "prefill_chunk"]}
    with pytest.raises(TypeError, match=r"'prefill_chunk': not an option .* nor of task 'text2text-generation' "
                                        r"\(TaskOptions: max_cache_len, max_batch\)"):
        hfexport.export(tiny_model("t5"), backend="dynamo", task="text2text-generation", prefill_chunk=4)
