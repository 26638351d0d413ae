"""The dynamo backend on tiny models of five families: dynamic shapes, a second input shape, save and load."""

import copy

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

import hfexport
from helpers import tiny_model
from hfexport import ExportError, InvalidInputError
from hfexport_dynamo.inputs import dummy_inputs

ATOL = 1e-5


@pytest.mark.parametrize("kind", ["bert", "llama", "vit", "t5", "whisper"])
def test_tiny_model_exports_dynamic_and_matches_at_two_shapes(kind, tmp_path):
    model = tiny_model(kind, layers=1)  # one layer shows the dynamic shapes as two do, in about half the time
    exported = hfexport.export(model, dynamic=True)  # inputs built from the config
    first = dummy_inputs(model)  # the traced shape: batch 2
    second = dummy_inputs(model, batch=3, seq=13, seed=1)
    for inputs in (first, second):
        report = exported.verify(inputs, atol=ATOL, rtol=0)
        assert report.passed, report
    dims = {i["name"]: i["dynamic_dims"] for i in exported.manifest["inputs"]}
    main = next(iter(dims))
    assert "0" in dims[main], f"batch dim of {main} should stay dynamic: {dims}"
    reloaded = hfexport.load(exported.save_pretrained(tmp_path / kind))
    report = reloaded.verify(second, atol=ATOL, rtol=0, reference=model)
    assert report.passed, report


def test_manifest_describes_inputs_outputs_versions(bert, tmp_path):
    exported = hfexport.export(bert, dynamic=True)
    m = exported.manifest
    assert m["schema_version"] == 2 and m["backend"] == "dynamo" and m["model_class"] == "BertModel"
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert m["inputs"][0]["dtype"] == "int64" and set(m["inputs"][0]["dynamic_dims"]) == {"0", "1"}
    assert [o["name"] for o in m["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert m["versions"]["torch"] == torch.__version__.split("+")[0] or m["versions"]["torch"].startswith("2.")
    saved = exported.save_pretrained(tmp_path / "bert")
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "export.json", "model.pt2",
                                                        "verification.safetensors"]
    out = hfexport.load(saved)(**dummy_inputs(bert))
    assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"


def test_real_minilm_dynamic_export_matches_at_another_shape(tmp_path):
    from hfexport_dynamo.demo import minilm_demo

    model, inputs, check = minilm_demo()
    assert inputs["input_ids"].shape[0] != check["input_ids"].shape[0]
    assert inputs["input_ids"].shape[1] != check["input_ids"].shape[1]
    exported = hfexport.export(model, inputs, dynamic=True)
    reloaded = hfexport.load(exported.save_pretrained(tmp_path / "minilm"))
    report = reloaded.verify(check, atol=1e-5, rtol=0, reference=model)
    assert report.passed and report["last_hidden_state"].max_abs_diff <= 1e-5, report


def test_failed_save_leaves_no_artifact(bert, tmp_path):
    exported = hfexport.export(bert)

    def explode(directory):
        (directory / "half.bin").write_bytes(b"x" * 10)
        raise OSError("disk full")

    exported.extra_files["zz_explode"] = explode
    with pytest.raises(OSError, match="disk full"):
        exported.save_pretrained(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_non_empty_directory_and_keeps_it(bert, tmp_path):
    exported = hfexport.export(bert)
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        exported.save_pretrained(target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    with pytest.raises(FileExistsError, match="not an hfexport artifact"):  # overwrite replaces only an artifact
        exported.save_pretrained(target, overwrite=True)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (target / "keep.txt").unlink()
    exported.save_pretrained(target)  # an empty directory takes an artifact
    exported.save_pretrained(target, overwrite=True)  # and an artifact is replaced
    assert (target / "export.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging, retired directory or lock file left


def test_not_a_module_is_rejected():
    with pytest.raises(InvalidInputError, match="torch.nn.Module"):
        hfexport.export(lambda x: x, {"x": torch.ones(1)})


@pytest.mark.parametrize("inputs,match", [
    ([torch.ones(1, 3)], "mapping"),
    ({"input_ids": "hello"}, "input 'input_ids' is a str"),
    ({"input_ids": object()}, "input 'input_ids' is a object"),
])
def test_bad_inputs_are_rejected_and_model_unchanged(bert, inputs, match):
    before = copy.deepcopy(bert.state_dict())
    with pytest.raises(InvalidInputError, match=match):
        hfexport.export(bert, inputs)
    assert all(torch.equal(before[k], v) for k, v in bert.state_dict().items())


def test_unknown_option_lists_the_valid_ones(bert):
    with pytest.raises(TypeError, match="does not take 'opset_version'.*options it takes: .*dynamic_shapes"):
        hfexport.export(bert, opset_version=18)


def test_explicit_dynamic_shapes_override(bert):
    from torch.export import Dim

    inputs = dummy_inputs(bert)
    exported = hfexport.export(bert, inputs, dynamic_shapes={
        "input_ids": {1: Dim("seq", min=2, max=32)},
        "attention_mask": {1: Dim("seq", min=2, max=32)},
        "token_type_ids": {1: Dim("seq", min=2, max=32)}})
    dims = exported.manifest["inputs"][0]["dynamic_dims"]
    assert list(dims) == ["1"] and dims["1"]["max"] == 32
    assert exported.verify(dummy_inputs(bert, batch=2, seq=20, seed=3), atol=ATOL).passed
    with pytest.raises(ValueError, match=r"input 'input_ids' has size 3 in dim 0 .*dim 0 is static \(2\)"):  # batch
        exported(**dummy_inputs(bert, batch=3, seq=20))


def test_dynamic_shapes_naming_an_unknown_input_fails_clearly(bert):
    with pytest.raises(ExportError, match="stage 4/5 \\(Dynamic shapes\\).*not inputs"):
        hfexport.export(bert, dynamic_shapes={"pixel_values": {0: None}})


def test_cache_input_and_output_round_trip():
    """A decode step that takes a DynamicCache and returns one (pytorch/pytorch#136582, #148748)."""
    model = tiny_model("llama")
    prompt = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).cache
    inputs = {"input_ids": torch.tensor([[7]]), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "cache": cache}
    exported = hfexport.export(model, copy.deepcopy(inputs))
    report = exported.verify(inputs, atol=ATOL)
    assert report.passed, report
    cache_outputs = [o.name for o in report.outputs if o.name.startswith("cache")]
    assert len(cache_outputs) == 2 * 2 * 1, cache_outputs  # keys and values of 2 layers
    out = exported(**copy.deepcopy(inputs))
    assert type(out.cache).__name__ == "DynamicCache" and out.cache.get_seq_length() == 6


def test_stateful_attributes_are_nulled_for_the_trace_and_restored():
    from hfexport_dynamo.capture import _STATEFUL_CACHE_ATTRS

    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cached_sequence_length = None
            self.cached_rotary_positional_embedding = None

        def forward(self, x):
            if self.cached_sequence_length == x.shape[1] and self.cached_rotary_positional_embedding is not None:
                return x + self.cached_rotary_positional_embedding
            emb = torch.arange(x.shape[1], dtype=x.dtype).sin()[None, :, None]
            self.cached_sequence_length = x.shape[1]
            self.cached_rotary_positional_embedding = emb
            return x + emb

    assert "cached_rotary_positional_embedding" in _STATEFUL_CACHE_ATTRS
    model = Rotary()
    model(torch.zeros(1, 4, 2))  # eager call leaves a stale cache for length 4
    stale = model.cached_rotary_positional_embedding
    exported = hfexport.export(model, {"x": torch.zeros(2, 4, 2)}, dynamic=True)
    assert model.cached_rotary_positional_embedding is stale and model.cached_sequence_length == 4
    assert any("cached_rotary_positional_embedding" in n for n in exported.manifest["notes"])
    x = torch.randn(3, 7, 2)
    expected = x + torch.arange(7, dtype=x.dtype).sin()[None, :, None]
    torch.testing.assert_close(exported(x=x), expected)


def test_constant_inputs_are_baked_in_and_checked(bert):
    inputs = dict(dummy_inputs(bert), output_hidden_states=True)
    exported = hfexport.export(bert, inputs)
    assert exported.manifest["fixed_kwargs"]["output_hidden_states"] is True
    assert "output_hidden_states" not in exported.input_names
    out = exported(**inputs)  # the same constant is accepted
    assert len(out.hidden_states) == 3
    with pytest.raises(ValueError, match="baked into this export"):
        exported(**dict(inputs, output_hidden_states=False))


def test_version_drift_is_reported(monkeypatch):
    from hfexport._context import warn_version_drift
    from hfexport_dynamo.exporter_dynamo import DynamoExporter

    assert warn_version_drift(DynamoExporter) == []  # the lock installs the tested versions
    monkeypatch.setattr(DynamoExporter, "tested_versions", {"torch": "1.0.0"})
    monkeypatch.setenv("HFEXPORT_IGNORE_VERSION_DRIFT", "1")
    [message] = warn_version_drift(DynamoExporter)
    assert "torch" in message and "tested with 1.0.0" in message


def test_manifest_names_cache_outputs():
    model = tiny_model("llama")
    prompt = torch.randint(0, 100, (1, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).cache
    exported = hfexport.export(model, {"input_ids": torch.tensor([[4]]), "cache": cache})
    names = [o["name"] for o in exported.manifest["outputs"]]
    assert names[0] == "logits"
    assert names[1:] == [f"cache.layers.{i}.{kv}" for i in range(2) for kv in ("keys", "values")]


class PooledAfterConstruction(torch.nn.Module):
    """The LLaVA family's vision output: ``pooler_output`` set after the ModelOutput is built, and a
    ``hidden_states`` tuple that holds None."""

    def forward(self, x):
        out = BaseModelOutputWithPooling(last_hidden_state=x + 1.0, hidden_states=(None, None, x * 2.0))
        out.pooler_output = x.mean(dim=1)
        return out


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_model_output_with_a_field_set_after_construction_keeps_each_value_in_its_field(backend):
    """transformers' ModelOutput flattens in insertion order and unflattens in field order; every re-trace used to
    put ``pooler_output``'s value in ``hidden_states[2]`` (Aya Vision). Each field now holds eager's value."""
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    model, inputs = PooledAfterConstruction(), {"x": torch.randn(2, 5, 4)}
    exported = hfexport.export(model, copy.deepcopy(inputs), backend=backend, dynamic=True)
    other = {"x": torch.randn(3, 7, 4)}
    out, expected = exported(**copy.deepcopy(other)), model(**other)
    assert out.pooler_output.shape == (3, 4) and out.hidden_states[2].shape == (3, 7, 4)
    torch.testing.assert_close(out.pooler_output, expected.pooler_output, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.hidden_states[2], expected.hidden_states[2], atol=1e-6, rtol=0)
    assert out.hidden_states[:2] == (None, None)
