"""Weight compression on OpenVINO through NNCF (``quantize="int8-weights"`` / ``"int4-weights"``): what the manifest
records (NNCF's mode, group size and ratio), the artifact's size against the float export's, the verification
against float eager by cosine similarity, and greedy tokens against float eager's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, tiny_model

LLAMA = dict(hidden_size=64, intermediate_size=128, vocab_size=256, num_attention_heads=4, num_key_value_heads=2)
NEW_TOKENS = 32


def bin_size(directory: Path, component: str = "") -> int:
    return (directory / component / "openvino_model.bin").stat().st_size


@pytest.fixture(scope="module")
def llama_int4(tmp_path_factory):
    """A seeded tiny Llama (hidden 64, vocab 256) exported float and int4 (groups of 32), both saved."""
    base = tmp_path_factory.mktemp("openvino-int4")
    model = tiny_model("llama", **LLAMA)
    options = dict(backend="openvino", task="text-generation", max_cache_len=48, max_batch=1)
    hfexport.export(model, **options).save_pretrained(base / "float")
    exported = hfexport.export(model, **options, quantize=hfexport.Quantization("int4-weights", group_size=32))
    exported.save_pretrained(base / "int4")
    return model, exported, base


@pytest.mark.slow
def test_int4_weights_record_nncf_settings_and_shrink_the_artifact(llama_int4):
    _, _, base = llama_int4
    manifest = json.loads((base / "int4" / "export.json").read_text())
    section = manifest["components"]["decoder"]["quantization"]
    assert (section["recipe"], section["mode"], section["group_size"], section["ratio"]) == (
        "int4-weights", "int4_asym", 32, 1.0)
    assert section["constant_bytes_after"]["u4"] > 0 and section["constant_bytes_after"].get("f32", 0) < 1024
    ratio = bin_size(base / "int4") / bin_size(base / "float")  # the decoder at the root (LLMPipeline loads it)
    assert ratio <= 0.35, ratio  # measured 0.18: int4 MatMuls, the embedding and lm_head int8 per channel
    verification = manifest["components"]["decoder"]["verification"]
    logits = verification["outputs"][0]
    assert verification["passed"] and logits["name"] == "logits" and logits["cosine"] >= 0.9, logits


@pytest.mark.slow
def test_int4_greedy_tokens_against_float_eager_in_a_new_process(llama_int4, tmp_path):
    model, exported, base = llama_int4
    prompt = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(prompt)
    got = generate_in_fresh_process({"int4": (base / "int4", [(prompt, mask)], {"max_new_tokens": NEW_TOKENS})},
                                    tmp_path)["int4"][0]
    # the same artifact in this process gives the same ids: the new process read what was exported
    assert torch.equal(got, exported.generate(prompt, mask, max_new_tokens=NEW_TOKENS))
    with torch.no_grad():
        eager = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS)
    free_running = float((got[0, 6:] == eager[0, 6:]).double().mean())
    # top-1 agreement: at each of the 32 positions of eager's greedy sequence, the int4 export's next token given
    # eager's prefix (one prefill each), against eager's
    forced = [int(exported.generate(eager[:, :n], torch.ones(1, n, dtype=torch.long), max_new_tokens=1)[0, -1])
              for n in range(6, 6 + NEW_TOKENS)]
    top1 = float((torch.tensor(forced) == eager[0, 6:]).double().mean())
    print(f"int4-weights against float eager over {NEW_TOKENS} greedy tokens: top-1 agreement {top1:.3f} "
          f"(on eager's prefixes), free-running {free_running:.3f}")
    assert got.shape == eager.shape
    assert top1 >= 0.5, top1


def test_int8_weights_on_bert_verify_and_reload(tmp_path):
    model = tiny_model("bert", layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    inputs = {"input_ids": torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))}
    exported = hfexport.export(model, inputs, backend="openvino", quantize="int8-weights")
    directory = exported.save_pretrained(tmp_path / "int8")
    section = exported.manifest["quantization"]
    assert (section["recipe"], section["mode"], section["group_size"]) == ("int8-weights", "int8_asym", None)
    assert exported.manifest["verification"]["passed"]
    assert exported.manifest["verification"]["outputs"][0]["cosine"] >= 0.98
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert bin_size(directory) <= 0.35 * params  # int8 weights and their per-channel scales
    loaded = hfexport.load(directory)
    torch.testing.assert_close(loaded(**inputs)["last_hidden_state"], exported(**inputs)["last_hidden_state"],
                               atol=0, rtol=0)


def test_an_unknown_recipe_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"backend 'openvino' does not support quantize='int4': it supports "
                                         r"'int8-weights', 'int4-weights'"):
        hfexport.export(tiny_model("bert", layers=1), backend="openvino", quantize="int4")
    with pytest.raises(ValueError, match=r"int4_ratio must be a number in \(0, 1\]"):
        hfexport.export(tiny_model("bert", layers=1), backend="openvino", quantize="int4-weights", int4_ratio=0)
