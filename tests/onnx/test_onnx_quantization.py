"""Quantized ONNX exports, ``quantize="int8-dynamic"`` (ONNX Runtime's dynamic int8 after the optimizer): the real
all-MiniLM-L6-v2 at about a quarter of the float artifact with its sentence embeddings kept; a tiny Llama that
generates; the verification against float eager by cosine similarity; and the refusals before any work."""

from __future__ import annotations

import json

import pytest
import torch
from quantization_helpers import (
    SENTENCES,
    artifact_bytes,
    embedding_cosines,
    first_token_agreement,
    minilm,
)

import hfexport
from helpers import tiny_model

ONNX_FILES = (".onnx", ".onnx.data")


@pytest.mark.slow
def test_minilm_int8_dynamic_is_small_and_keeps_sentence_embeddings(tmp_path):
    model, encode = minilm()
    inputs = encode(SENTENCES[:2])
    float_export = hfexport.export(model, inputs, backend="onnx", dynamic=True)
    quantized = hfexport.export(model, inputs, backend="onnx", dynamic=True, quantize="int8-dynamic")
    float_export.save_pretrained(tmp_path / "float")
    quantized.save_pretrained(tmp_path / "int8")
    ratio = artifact_bytes(tmp_path / "int8", ONNX_FILES) / artifact_bytes(tmp_path / "float", ONNX_FILES)

    section = quantized.manifest["quantization"]
    assert section["recipe"] == "int8-dynamic"
    assert section["quantized"]["MatMul"] == 37 and section["quantized"]["Gather"] >= 1  # 6 x 6 linears + pooler
    assert section["size_bytes"]["ratio"] == pytest.approx(ratio, abs=0.01)
    verification = quantized.manifest["verification"]
    assert verification["metric"] == "quantized" and verification["passed"] and verification["cosine"] >= 0.95

    loaded = hfexport.load(tmp_path / "int8")
    cosines = embedding_cosines(loaded, model, encode)
    print(f"\nONNX int8-dynamic all-MiniLM-L6-v2: {ratio:.1%} of the float artifact; sentence embeddings' cosine "
          f"with float eager: mean {cosines.mean():.4f}, min {cosines.min():.4f} over {len(cosines)} sentences")
    assert ratio <= 0.35
    assert cosines.mean() >= 0.99
    assert cosines.min() >= 0.98  # per-tensor dynamic activations: the shortest sentences lose most
    report = loaded.verify_stored()["model"]  # the stored check re-runs with the quantized comparison
    assert report.passed and report.as_dict()["metric"] == "quantized"


def test_tiny_llama_int8_dynamic_generates(capsys):
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=32,
                               quantize="int8-dynamic")
    for name in ("prefill", "decode"):
        section = exported.manifest["components"][name]
        assert section["quantization"]["recipe"] == "int8-dynamic"
        assert section["verification"]["metric"] == "quantized" and section["verification"]["passed"]
        assert section["verification"]["top1_agreement"] is not None  # logits: the next token's agreement
    prompt = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    got = exported.generate(prompt, max_new_tokens=10, eos_token_id=None)  # ten tokens, EOS or not
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=10, eos_token_id=None)
    agreement = first_token_agreement(got, expected, prompt.shape[1])
    with capsys.disabled():
        print(f"\nONNX int8-dynamic tiny Llama: first 10 greedy tokens agree with float eager at {agreement:.0%} "
              f"({got[0, 6:].tolist()} vs {expected[0, 6:].tolist()})")
    assert got.shape == expected.shape == (1, 16) and torch.equal(got[:, :6], prompt)


def test_quantized_verification_failure_names_the_cosine_and_the_way_out():
    model = tiny_model("bert")
    threshold = hfexport.Quantization("int8-dynamic", min_cosine=1.0)  # nothing quantized is exactly float
    with pytest.raises(hfexport.VerificationError) as raised:
        hfexport.export(model, backend="onnx", quantize=threshold)
    text = str(raised.value)
    assert "quantized with 'int8-dynamic' failed verification against float eager" in text
    assert "last_hidden_state" in text and "where the threshold is 1" in text and "min_cosine" in text
    kept = hfexport.export(model, backend="onnx", quantize=threshold, verify=False)
    assert kept.manifest["verification"]["passed"] is False


def test_manifest_records_the_recipe_and_sizes(tmp_path):
    exported = hfexport.export(tiny_model("bert"), backend="onnx", quantize="int8-dynamic")
    path = exported.save_pretrained(tmp_path / "a")
    manifest = json.loads((path / "export.json").read_text())
    section = manifest["quantization"]
    assert section["format"].startswith("QOperator") and section["weights"].startswith("int8")
    assert set(section["size_bytes"]) == {"float_weights", "float_onnx", "quantized_onnx", "ratio"}
    assert manifest["config"]["quantize"] == "Quantization('int8-dynamic', min_cosine=0.95)"
    import onnx

    proto = onnx.load(str(path / "model.onnx"), load_external_data=False)
    assert {p.key: p.value for p in proto.metadata_props}["pkg.hfexport.quantization"] == "int8-dynamic"
    assert "MatMulInteger" in {n.op_type for n in proto.graph.node}


# ── bad input ──────────────────────────────────────────────────────────────────────────────────────────
def test_a_recipe_the_backend_does_not_support_names_those_it_does():
    with pytest.raises(ValueError, match=r"backend 'onnx' does not support quantize='8da4w': it supports "
                                         r"'int8-dynamic'"):
        hfexport.export(tiny_model("bert"), backend="onnx", quantize="8da4w")
    with pytest.raises(TypeError, match="DynamoConfig does not take 'quantize'"):
        hfexport.export(tiny_model("bert"), backend="dynamo", quantize="int8-dynamic")


def test_options_the_recipe_does_not_take_are_refused():
    calibration = [{"input_ids": torch.ones(2, 8, dtype=torch.long)}]
    with pytest.raises(ValueError, match="takes no calibration; it takes no options"):
        hfexport.export(tiny_model("bert"), backend="onnx",
                        quantize=hfexport.Quantization("int8-dynamic", calibration=calibration))
    with pytest.raises(TypeError, match="quantize must be a recipe name"):
        hfexport.export(tiny_model("bert"), backend="onnx", quantize=8)
    with pytest.raises(TypeError, match=r"min_cosine must be a number in \(0, 1\]"):
        hfexport.Quantization("int8-dynamic", min_cosine=2)


def test_an_already_quantized_model_is_refused_before_any_work():
    model = tiny_model("bert")
    model.encoder.layer[0].output.dense.weight = torch.nn.Parameter(torch.zeros(32, 37, dtype=torch.int8),
                                                                    requires_grad=False)
    events = []
    with pytest.raises(hfexport.InvalidInputError,
                       match=r"BertModel is quantized already \(encoder.layer.0.output.dense.weight holds int8 "
                             r"weights\); quantize='int8-dynamic' quantizes a float model"):
        hfexport.export(model, backend="onnx", quantize="int8-dynamic", progress=events.append)
    assert events == []  # no stage started
    model = tiny_model("bert")
    model.config.quantization_config = {"quant_method": "bitsandbytes"}
    with pytest.raises(hfexport.InvalidInputError, match=r"quantization_config \(quant_method bitsandbytes\)"):
        hfexport.export(model, backend="onnx", quantize="int8-dynamic")


# ── CLI ────────────────────────────────────────────────────────────────────────────────────────────────
def test_cli_export_quantize(tmp_path, capsys):
    from hfexport import cli

    tiny_model("bert").save_pretrained(tmp_path / "bert")
    out = tmp_path / "int8"
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "onnx", "--quantize", "int8-dynamic",
                     "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verification of a int8-dynamic quantized export on onnx against float eager" in printed
    assert "PASSED" in printed
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["quantization"]["recipe"] == "int8-dynamic" and manifest["verification"]["metric"] == "quantized"
    # a recipe the backend lacks, and a backend that does not quantize: usage errors (exit 2) that say what to do
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "onnx", "--quantize", "8da4w",
                     "--output", str(tmp_path / "x")]) == 2
    assert "backend 'onnx' does not support quantize='8da4w': it supports 'int8-dynamic'" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "dynamo", "--quantize", "int8-dynamic",
                     "--output", str(tmp_path / "y")]) == 2
    assert "backend 'dynamo' does not quantize (--quantize int8-dynamic)" in capsys.readouterr().err
