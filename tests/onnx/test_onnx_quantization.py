"""Quantized ONNX exports, ``quantize="int8-dynamic"`` (ONNX Runtime's dynamic int8 after the optimizer): the real
all-MiniLM-L6-v2 at about a quarter of the float artifact with its sentence embeddings kept; a tiny Llama that
generates, and in ``int4`` (``MatMulNBits`` bits=4) loads in a new process; the verification against float eager by
cosine similarity; and the refusals before any work."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from quantization_helpers import (
    CALIBRATION_SENTENCES,
    SENTENCES,
    artifact_bytes,
    embedding_cosines,
    first_token_agreement,
    minilm,
)

import hfexport
from helpers import load_in_fresh_process, tiny_model

ONNX_FILES = (".onnx", ".onnx.data")


@pytest.fixture(scope="module")
def minilm_float(tmp_path_factory):
    """The bundled all-MiniLM-L6-v2, its ``encode``, the export's inputs and the size of its float ONNX artifact."""
    model, encode = minilm()
    inputs = encode(SENTENCES[:2])
    path = tmp_path_factory.mktemp("float")
    hfexport.export(model, inputs, backend="onnx", dynamic=True).save_pretrained(path)
    return model, encode, inputs, artifact_bytes(path, ONNX_FILES)


@pytest.mark.slow
def test_minilm_int8_dynamic_is_small_and_keeps_every_sentence_embedding(minilm_float, tmp_path):
    model, encode, inputs, float_bytes = minilm_float
    quantized = hfexport.export(model, inputs, backend="onnx", dynamic=True, quantize="int8-dynamic")
    quantized.save_pretrained(tmp_path / "int8")
    ratio = artifact_bytes(tmp_path / "int8", ONNX_FILES) / float_bytes

    section = quantized.manifest["quantization"]
    assert section["recipe"] == "int8-dynamic" and section["group_size"] == 128
    # 6 layers x (q/k/v packed into one MatMul by the ORT fusions step, attention output, intermediate, output) + pooler
    assert section["quantized"]["MatMul"] == 25 and section["quantized"]["Gather"] >= 1
    assert section["kept_float"]["MatMul with a constant weight"] == 0
    assert section["size_bytes"]["ratio"] == pytest.approx(ratio, abs=0.01)
    verification = quantized.manifest["verification"]
    assert verification["metric"] == "quantized" and verification["passed"] and verification["cosine"] >= 0.99

    loaded = hfexport.load(tmp_path / "int8")
    cosines = embedding_cosines(loaded, model, encode)
    print(f"\nONNX int8-dynamic all-MiniLM-L6-v2: {ratio:.1%} of the float artifact; sentence embeddings' cosine "
          f"with float eager: mean {cosines.mean():.4f}, min {cosines.min():.4f} over {len(cosines)} sentences")
    assert ratio <= 0.35
    assert cosines.min() >= 0.99  # the acceptance, for every sentence (measured 0.9974)
    assert cosines.mean() >= 0.995  # measured 0.9987
    report = loaded.verify_stored()["model"]  # the stored check re-runs with the quantized comparison
    assert report.passed and report.as_dict()["metric"] == "quantized"
    import onnx

    proto = onnx.load(str(tmp_path / "int8" / "model.onnx"), load_external_data=False)
    assert {n.op_type for n in proto.graph.node} >= {"MatMulNBits"}


@pytest.mark.slow
def test_minilm_int8_static_is_small_and_calibrated_on_the_given_inputs(minilm_float):
    model, encode, inputs, float_bytes = minilm_float
    calibration = [encode(CALIBRATION_SENTENCES[:4]), encode(CALIBRATION_SENTENCES[4:])]
    quantized = hfexport.export(model, inputs, backend="onnx", dynamic=True,
                                quantize=hfexport.Quantization("int8-static", calibration=calibration))
    section = quantized.manifest["quantization"]
    assert section["calibration"] == {"batches": 2, "source": "calibration="}
    assert section["format"].startswith("QDQ") and section["quantized"]["MatMul"] == 25  # q/k/v packed, as above
    assert section["kept_float"]["MatMul with a constant weight"] == 0
    ratio = section["size_bytes"]["quantized_onnx"] / float_bytes
    cosines = embedding_cosines(quantized, model, encode)
    print(f"\nONNX int8-static all-MiniLM-L6-v2: {ratio:.1%} of the float artifact; sentence embeddings' cosine "
          f"with float eager: mean {cosines.mean():.4f}, min {cosines.min():.4f} (per-tensor static activations)")
    assert ratio <= 0.35
    assert cosines.mean() >= 0.92 and cosines.min() >= 0.89  # measured 0.942 / 0.913: see _quantize.py's table
    assert quantized.manifest["verification"]["passed"]


@pytest.fixture(scope="module")
def bert_int8_static(tmp_path_factory):
    """The tiny BERT and an ``int8-static`` export of it on its dummy inputs, saved."""
    model = tiny_model("bert")
    exported = hfexport.export(model, backend="onnx", dynamic=True, quantize="int8-static")
    return model, exported, exported.save_pretrained(tmp_path_factory.mktemp("static") / "static")


@pytest.fixture(scope="module")
def fresh_process(bert_int8_static, llama_int4, tmp_path_factory):
    """The int8-static BERT and the int4 Llama loaded and run in one new process (starting one costs seconds), at
    other shapes than they were traced and calibrated at: name -> (inputs, the process's outputs)."""
    ids = torch.randint(3, 100, (3, 9), generator=torch.Generator().manual_seed(1))
    inputs = {"static": bert_batch(2, 7), "int4": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}}
    paths = {"static": bert_int8_static[2], "int4": llama_int4[1]}
    results = load_in_fresh_process({name: (paths[name], inputs[name]) for name in paths},
                                    tmp_path_factory.mktemp("fresh"))
    return {name: (inputs[name], results[name]) for name in paths}


def test_tiny_bert_int8_static_on_dummy_inputs_runs_in_a_new_process(bert_int8_static, fresh_process):
    model, exported, _ = bert_int8_static
    section = exported.manifest["quantization"]
    assert section["calibration"] == {"batches": 1, "source": "the export's inputs"}
    assert section["quantized"]["MatMul"] >= 6 and exported.manifest["verification"]["passed"]
    inputs, (_, outputs) = fresh_process["static"]  # other shapes than the dummy inputs it was traced on
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    got = outputs[0]  # last_hidden_state
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    assert got.shape == expected.shape and cosine >= 0.9


def test_tiny_llama_int8_dynamic_generates(capsys):
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=32,
                               quantize="int8-dynamic")
    assert list(exported.manifest["components"]) == ["decoder"]  # one program for prefill and decode
    section = exported.manifest["components"]["decoder"]
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
    assert section["format"].startswith("MatMulNBits") and section["weights"].startswith("int8")
    assert section["steps"][0].startswith("onnxruntime.quantization.MatMulNBitsQuantizer(bits=8, block_size=128")
    assert set(section["size_bytes"]) == {"float_weights", "float_onnx", "quantized_onnx", "ratio"}
    assert manifest["config"]["quantize"] == "Quantization('int8-dynamic', group_size=128, min_cosine=0.98)"
    import onnx

    proto = onnx.load(str(path / "model.onnx"), load_external_data=False)
    assert {p.key: p.value for p in proto.metadata_props}["pkg.hfexport.quantization"] == "int8-dynamic"
    assert "MatMulNBits" in {n.op_type for n in proto.graph.node}


def test_int8_dynamic_per_tensor_writes_the_qoperator_form():
    exported = hfexport.export(tiny_model("bert"), backend="onnx", quantize="int8-dynamic-per-tensor")
    section = exported.manifest["quantization"]
    assert section["format"].startswith("QOperator") and section["activations"].startswith("uint8, asymmetric, per tensor")
    assert section["quantized"]["MatMul"] >= 6 and "group_size" not in section
    assert exported.manifest["verification"]["passed"]


# ── int4 (MatMulNBits bits=4) ──────────────────────────────────────────────────────────────────────────────
@pytest.fixture(scope="module")
def llama_int4(tmp_path_factory):
    """The tiny Llama, an ``int4`` export of it with blocks of 16 (not the default 32: the option must reach the
    graph) saved to a directory, and the manifest."""
    model = tiny_model("llama")
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, backend="onnx",
                               dynamic=True, quantize=hfexport.Quantization("int4", group_size=16))
    return model, exported.save_pretrained(tmp_path_factory.mktemp("int4") / "int4"), exported.manifest


def test_int4_writes_matmulnbits_with_4_bits_and_the_block_size_asked_for(llama_int4):
    import onnx

    _, path, manifest = llama_int4
    proto = onnx.load(str(path / "model.onnx"), load_external_data=False)
    nbits = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in proto.graph.node
             if n.op_type == "MatMulNBits"]
    assert len(nbits) == 9  # 2 layers x (packed qkv, o, packed gate+up, down) + lm_head (_fusions.py packs them)
    assert all(a["bits"] == 4 and a["block_size"] == 16 and a["accuracy_level"] == 4 for a in nbits)
    section = manifest["quantization"]
    assert section["recipe"] == "int4" and section["group_size"] == 16 and section["weights"].startswith("int4")
    assert section["steps"][0].startswith("onnxruntime.quantization.MatMulNBitsQuantizer(bits=4, block_size=16")
    assert section["quantized"] == {"MatMul": 9, "Gather": 1}  # the embedding table int8 (quantize_dynamic)
    assert section["kept_float"]["MatMul with a constant weight"] == 0
    assert manifest["verification"]["metric"] == "quantized" and manifest["verification"]["passed"]
    from hfexport_onnx._quantize import resolve_onnx_quantization

    assert resolve_onnx_quantization("int4").group_size == 32  # the default: ONNX Runtime GenAI's block size


def test_int4_loads_in_a_fresh_process_close_to_float_eager(llama_int4, fresh_process):
    model, _, _ = llama_int4
    inputs, (_, outputs) = fresh_process["int4"]  # other shapes than traced
    with torch.no_grad():
        expected = model(**inputs).logits
    got = outputs[0]  # logits
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    top1 = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    print(f"\nONNX int4 (block 16) tiny Llama in a fresh process: logits cosine {cosine:.5f}, top-1 {top1:.0%}")
    assert got.shape == expected.shape
    assert cosine >= 0.99  # measured 0.9959 (int8-dynamic: 0.9999); top-1 85%: near-tied random logits


def test_int4_quantizes_a_tied_head_that_reads_the_embedding_table_transposed(tmp_path):
    """A tied LM head is a ``FusedMatMul(transB=1)`` over the embedding table in the float graph (the table stored
    once); MatMulNBits takes ``MatMul`` only, so int4 first writes the head as ``MatMul`` over its own transposed
    copy (``matmuls_over_transposed_weights``): every MatMul is 4-bit. The embedding then reads the head's 4-bit
    table through ``GatherBlockQuantized`` (``share_tied_tables``): the table is stored once, 4-bit, and no int8
    copy is left."""
    # a table above onnxscript's constant-folding limit (8,192 elements), as every real one: not folded transposed
    model = tiny_model("llama", tie_word_embeddings=True, vocab_size=1024)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exported = hfexport.export(model, inputs, backend="onnx", quantize="int4")
    section = exported.manifest["quantization"]
    assert section["transposed_weights_untied"] == 1 and section["tied_tables_shared"] == 1, section
    assert section["quantized"] == {"MatMul": 9, "Gather": 1}, section  # the head among the 9, as untied
    assert section["kept_float"]["MatMul with a constant weight"] == 0, section
    path = exported.save_pretrained(tmp_path / "int4")
    graph = onnx.load(str(path / "model.onnx"), load_external_data=False).graph
    assert [n.op_type for n in graph.node if n.op_type.startswith("Gather")] == ["GatherBlockQuantized", "GatherND"]
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
    assert gather.input[0] == head.input[1] == "model.lm_head.weight.transposed_Q4"  # one table: the head's, 4-bit
    assert not [i.name for i in graph.initializer if i.name.endswith("_quantized")]  # no int8 copy left
    with torch.no_grad():
        expected = model(**inputs).logits
    for artifact in (exported, hfexport.load(path)):
        got = artifact(**inputs).logits
        cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
        assert cosine >= 0.99, cosine  # 0.9919 (with an int8 table for the embedding: 0.9959)


# ── bad input ──────────────────────────────────────────────────────────────────────────────────────────
def test_a_recipe_the_backend_does_not_support_names_those_it_does():
    with pytest.raises(ValueError, match=r"backend 'onnx' does not support quantize='8da4w': it supports "
                                         r"'int8-dynamic', 'int4', 'int8-dynamic-per-tensor', 'int8-static'"):
        hfexport.export(tiny_model("bert"), backend="onnx", quantize="8da4w")
    with pytest.raises(TypeError, match="DynamoConfig does not take 'quantize'"):
        hfexport.export(tiny_model("bert"), backend="dynamo", quantize="int8-dynamic")


def test_options_the_recipe_does_not_take_are_refused():
    calibration = [{"input_ids": torch.ones(2, 8, dtype=torch.long)}]
    with pytest.raises(ValueError, match="takes no calibration; it takes group_size"):
        hfexport.export(tiny_model("bert"), backend="onnx",
                        quantize=hfexport.Quantization("int8-dynamic", calibration=calibration))
    with pytest.raises(ValueError, match="takes no group_size; it takes calibration"):
        hfexport.export(tiny_model("bert"), backend="onnx", quantize=hfexport.Quantization("int8-static", group_size=32))
    with pytest.raises(ValueError, match=r"group_size .* must be 16, 32, 64, 128 or 256 .* got 48"):
        hfexport.export(tiny_model("bert"), backend="onnx", quantize=hfexport.Quantization("int8-dynamic", group_size=48))
    with pytest.raises(ValueError, match=r"int4 group_size .* must be 16, 32, 64, 128 or 256 .* got 8"):
        hfexport.export(tiny_model("llama"), backend="onnx", quantize=hfexport.Quantization("int4", group_size=8))
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
    assert "backend 'onnx' does not support quantize='8da4w': it supports 'int8-dynamic'," in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "dynamo", "--quantize", "int8-dynamic",
                     "--output", str(tmp_path / "y")]) == 2
    assert "backend 'dynamo' does not quantize (--quantize int8-dynamic)" in capsys.readouterr().err


def bert_batch(batch: int, seq: int) -> dict[str, torch.Tensor]:
    """Inputs of the tiny BERT (vocab 99, 2 token types)."""
    ids = torch.randint(0, 99, (batch, seq), generator=torch.Generator().manual_seed(seq))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def test_a_calibration_set_that_does_not_match_is_refused_before_any_work():
    events = []
    bad = bert_batch(2, 8)
    bad["input_ids"] = bad["input_ids"].int()
    with pytest.raises(hfexport.InvalidInputError, match=r"calibration batch 1: input 'input_ids' is int32 of rank 2"):
        hfexport.export(tiny_model("bert"), backend="onnx", dynamic=True, progress=events.append,
                        quantize=hfexport.Quantization("int8-static", calibration=[bert_batch(2, 8), bad]))
    lacking = {"input_ids": bert_batch(2, 8)["input_ids"], "pixel_values": torch.ones(1, 3)}
    with pytest.raises(hfexport.InvalidInputError, match="calibration batch 0 lacks attention_mask, token_type_ids "
                                                         "and has pixel_values, which the export does not take"):
        hfexport.export(tiny_model("bert"), backend="onnx", dynamic=True, progress=events.append,
                        quantize=hfexport.Quantization("int8-static", calibration=[lacking]))
    with pytest.raises(hfexport.InvalidInputError, match=r"has shape \[3, 5\], but this onnx export has static "
                                                         r"shapes \(traced \[\d+, \d+\]\)"):
        hfexport.export(tiny_model("bert"), backend="onnx", progress=events.append,
                        quantize=hfexport.Quantization("int8-static", calibration=[bert_batch(3, 5)]))
    assert events == []  # no stage started


def test_quantize_without_the_optimizer_is_refused():
    """Unoptimized, a Linear's weight reaches its MatMul through a Transpose, which ONNX Runtime's quantizers skip: a
    tied tiny Llama with quantize='int4', optimize=False kept 14 of its 15 linear layers float and passed verification
    (a fresh user's finding). The config refuses the pair, naming why."""
    from hfexport_onnx import OnnxConfig

    for recipe in ("int4", "int8-dynamic"):
        with pytest.raises(ValueError, match=rf"quantize='{recipe}' needs optimize=True"):
            OnnxConfig(quantize=recipe, optimize=False)
