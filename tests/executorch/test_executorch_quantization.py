"""Quantized ExecuTorch (XNNPACK) exports: ``quantize="int8"`` (PT2E static int8, calibrated), ``"int8-dynamic"``
(PT2E, activations per token), ``"8da4w"``/``"8da8w"`` (torchao int4/int8 weights, a source transform) and their
``embedding="4w"``/``"8w"`` tables: the real
all-MiniLM-L6-v2 at about a quarter of the float program with its sentence embeddings kept; a tiny Llama that
generates; the caller's model untouched; and the refusals before any work."""

from __future__ import annotations

import subprocess
import sys

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
from helpers import generate_in_fresh_process, load_in_fresh_process, tiny_model

pytest.importorskip("executorch")
BACKEND = "executorch-xnnpack"
# batch and sequence dynamic, bounded: ExecuTorch plans memory for the largest shapes
_BATCH, _SEQ = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=1, max=32)
SHAPES = {name: {0: _BATCH, 1: _SEQ} for name in ("input_ids", "token_type_ids", "attention_mask")}


@pytest.fixture(scope="module")
def minilm_float(tmp_path_factory):
    """The float all-MiniLM-L6-v2 program (batch and sequence dynamic), saved: the size the quantized ones are measured by."""
    model, encode = minilm()
    inputs = encode(SENTENCES[:2])
    path = tmp_path_factory.mktemp("float") / "float"
    hfexport.export(model, inputs, backend=BACKEND, dynamic_shapes=SHAPES).save_pretrained(path)
    return model, encode, inputs, artifact_bytes(path, (".pte",))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["int8-dynamic", "int8"])
def test_minilm_int8_is_small_and_keeps_sentence_embeddings(minilm_float, recipe, tmp_path):
    model, encode, inputs, float_bytes = minilm_float
    quantize = hfexport.Quantization("int8", calibration=[encode(CALIBRATION_SENTENCES)]) if recipe == "int8" \
        else recipe
    exported = hfexport.export(model, inputs, backend=BACKEND, dynamic_shapes=SHAPES, quantize=quantize)
    exported.save_pretrained(tmp_path / "q")
    ratio = artifact_bytes(tmp_path / "q", (".pte",)) / float_bytes
    section = exported.manifest["quantization"]
    assert section["recipe"] == recipe and section["quantized"]["embedding"] == 3
    assert section["quantized"]["linear"] == 37
    if recipe == "int8":
        assert section["calibration"] == {"batches": 1, "source": "calibration="}
    verification = exported.manifest["verification"]
    assert verification["metric"] == "quantized" and verification["passed"]

    loaded = hfexport.load(tmp_path / "q")
    cosines = embedding_cosines(loaded, model, encode)
    print(f"\nExecuTorch {recipe} all-MiniLM-L6-v2: {ratio:.1%} of the float program; sentence embeddings' cosine "
          f"with float eager: mean {cosines.mean():.4f}, min {cosines.min():.4f} over {len(cosines)} sentences")
    assert ratio <= 0.35
    if recipe == "int8-dynamic":
        assert cosines.min() >= 0.99
    else:  # static per-tensor activations: what they cost a BERT-style encoder (the module docstring says so)
        assert cosines.mean() >= 0.93
    assert loaded.verify_stored()["model"].passed
    if recipe == "int8-dynamic":  # a new process: loading registers the quantized kernels (embedding_byte)
        code = ("import sys, hfexport; r = hfexport.load(sys.argv[1]).verify_stored()['model']; "
                "print(r.as_dict()['metric'], r.passed)")
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q")], capture_output=True, text=True,
                              timeout=300)
        assert done.stdout.split()[-2:] == ["quantized", "True"], done.stderr[-2000:]


@pytest.fixture(scope="module")
def llama_8da4w():
    """``(model, its state before the export, export)``: the tiny Llama's 8da4w text-generation export (cache of
    32), made once for the two tests that read it."""
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    return model, before, hfexport.export(model, backend=BACKEND, task="text-generation", max_cache_len=32,
                                          quantize="8da4w")


@pytest.mark.slow
def test_tiny_llama_8da4w_generates_and_leaves_the_model_float(llama_8da4w, capsys):
    model, before, exported = llama_8da4w
    assert all(type(p) is torch.nn.Parameter and p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert list(exported.manifest["components"]) == ["decoder"]  # one program for prefill and decode
    section = exported.manifest["components"]["decoder"]
    quantization = section["quantization"]
    assert quantization["recipe"] == "8da4w" and quantization["group_size"] == 32
    # the 37-wide MLP input: int8 per channel (XNNPACK's int4 kernels take whole groups of 32)
    # the component wraps the model (and, with ExecuTorch's LLM kernels, the LLM runner's step wraps that: "step.")
    assert [n.removeprefix("step.").removeprefix("model.") for n in quantization["int8_per_channel_layers"]] == [
        "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert section["verification"]["metric"] == "quantized" and section["verification"]["passed"]
    prompt = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    got = exported.generate(prompt, max_new_tokens=10, eos_token_id=None)
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=10, eos_token_id=None)
    agreement = first_token_agreement(got, expected, prompt.shape[1])
    with capsys.disabled():
        print(f"\nExecuTorch 8da4w tiny Llama: first 10 greedy tokens agree with float eager at {agreement:.0%} "
              f"({got[0, 6:].tolist()} vs {expected[0, 6:].tolist()}); the decoder's logits' top-1 agreement on the "
              f"verification inputs {section['verification']['top1_agreement']}")
    assert got.shape == expected.shape == (1, 16) and torch.equal(got[:, :6], prompt)


def program_operators(directory) -> set[str]:
    """The operators a saved ``model.pte`` calls (``namespace::name.overload``), read from the program itself."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary((directory / "model.pte").read_bytes())
    program = getattr(program, "program", program)
    return {f"{op.name}.{op.overload}" for plan in program.execution_plan for op in plan.operators}


@pytest.mark.slow
def test_tiny_llama_8da4w_with_4w_embeddings_is_smaller_and_generates_in_a_new_process(llama_8da4w, tmp_path, capsys):
    model, _, plain = llama_8da4w  # the 8da4w export above; the 4w embeddings' one is made here
    prompt = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    sizes, generated = {}, {}
    for name, quantize in (("8da4w", None), ("8da4w+4w", hfexport.Quantization("8da4w", embedding="4w"))):
        exported = plain if quantize is None else hfexport.export(model, backend=BACKEND, task="text-generation",
                                                                  max_cache_len=32, quantize=quantize)
        path = exported.save_pretrained(tmp_path / name)
        sizes[name] = artifact_bytes(path, (".pte",))
        generated[name] = exported.generate(prompt, max_new_tokens=10, eos_token_id=None)
    decoder = exported.manifest["components"]["decoder"]
    assert decoder["quantization"]["embedding"] == "4w" and decoder["quantization"]["quantized"]["embedding"] == 1
    assert decoder["quantization"]["kept_float"] == {"embedding": 0}
    # fused by to_executorch into ExecuTorch's quantized kernel, not left as torchao's dequantize (no kernel)
    assert "quantized_decomposed::embedding_4bit.out" in program_operators(tmp_path / "8da4w+4w" / "decoder")
    assert decoder["verification"]["passed"]
    # a new process: hfexport.load registers the quantized kernels before the programs open
    fresh = generate_in_fresh_process({"q": (tmp_path / "8da4w+4w", [(prompt, None)],
                                             {"max_new_tokens": 10, "eos_token_id": None})}, tmp_path)["q"][0]
    assert torch.equal(fresh, generated["8da4w+4w"])
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=10, eos_token_id=None)
    assert sizes["8da4w+4w"] < sizes["8da4w"]  # the 100 x 32 table: float32 -> int4 (+ a scale per 32)
    with capsys.disabled():
        print(f"\nExecuTorch tiny Llama: 8da4w {sizes['8da4w']} bytes, 8da4w + 4w embeddings {sizes['8da4w+4w']} "
              f"bytes; first 10 greedy tokens agree with float eager at "
              f"{first_token_agreement(generated['8da4w+4w'], expected, 6):.0%} (8da4w alone "
              f"{first_token_agreement(generated['8da4w'], expected, 6):.0%})")


def test_tiny_bert_8da8w_with_8w_embeddings_runs_in_a_new_process(tmp_path):
    model = tiny_model("bert", layers=1)
    ids = torch.randint(1, 99, (2, 8), generator=torch.Generator().manual_seed(3))
    ids[1, 6:] = 0  # padding tokens: the table's padding row is looked up like any other
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    exported = hfexport.export(model, inputs, backend=BACKEND,
                               quantize=hfexport.Quantization("8da8w", embedding="8w"))
    section = exported.manifest["quantization"]
    assert section["recipe"] == "8da8w" and section["quantized"] == {"linear": 7, "embedding": 3}
    assert exported.manifest["config"]["quantize"] == "Quantization('8da8w', min_cosine=0.98, embedding='8w')"
    assert section["weights"].startswith("linear: int8, symmetric, per output channel; embedding: 8w")
    assert exported.manifest["verification"]["passed"] and exported.manifest["verification"]["cosine"] >= 0.99
    assert model.embeddings.word_embeddings.padding_idx == 0  # the caller's model untouched
    path = exported.save_pretrained(tmp_path / "q")
    assert "quantized_decomposed::embedding_byte.out" in program_operators(path)
    got = load_in_fresh_process({"q": (path, inputs)}, tmp_path)["q"][1][0]
    assert torch.equal(got, exported(**inputs).last_hidden_state)


def test_tiny_bert_int8_records_what_was_quantized(tiny_bert_int8):
    _, exported = tiny_bert_int8
    section = exported.manifest["quantization"]
    assert section["quantized"] == {"linear": 7, "embedding": 3, "quantize_ops": section["quantized"]["quantize_ops"]}
    assert section["calibration"] == {"batches": 1, "source": "the export's inputs"}
    assert set(section["size_bytes"]) == {"float_weights", "quantized_program", "ratio_to_float_weights"}
    assert exported.manifest["config"]["quantize"] == "Quantization('int8', min_cosine=0.85)"
    assert exported.manifest["verification"]["passed"]


# ── bad input ──────────────────────────────────────────────────────────────────────────────────────────
def test_a_recipe_the_variant_does_not_support_names_those_it_does():
    with pytest.raises(ValueError, match=r"backend 'executorch-xnnpack' does not support quantize='int4': it "
                                         r"supports '8da4w', '8da8w', 'int8', 'int8-dynamic'"):
        hfexport.export(tiny_model("bert"), backend=BACKEND, quantize="int4")
    from hfexport_executorch import ExecutorchConfig

    with pytest.raises(ValueError, match="backend 'executorch-cuda' does not support quantize='8da4w': it "
                                         "supports no quantization recipe"):
        ExecutorchConfig(backend="cuda", quantize="8da4w")
    with pytest.raises(ValueError, match="8da4w group_size must be a multiple of 32"):
        ExecutorchConfig(quantize=hfexport.Quantization("8da4w", group_size=16))
    with pytest.raises(ValueError, match="quantize recipe '8da4w' .* takes no calibration; it takes group_size"):
        ExecutorchConfig(quantize=hfexport.Quantization("8da4w", calibration=[{}]))
    with pytest.raises(ValueError, match=r"embedding='2w' is not an embedding scheme: '8w' \(int8, one scale per "
                                         r"row\), '4w' \(int4, one scale per 32 weights of a row\)"):
        ExecutorchConfig(quantize=hfexport.Quantization("8da4w", embedding="2w"))
    with pytest.raises(ValueError, match="quantize recipe 'int8' .* takes no embedding; it takes calibration"):
        ExecutorchConfig(quantize=hfexport.Quantization("int8", embedding="4w"))
    with pytest.raises(TypeError, match="embedding must be a scheme name such as '4w' or '8w', got 4"):
        hfexport.Quantization("8da4w", embedding=4)


def test_a_calibration_set_that_does_not_match_is_refused_before_any_work():
    model = tiny_model("bert")
    inputs = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    cases = [
        ([{"input_ids": torch.randint(0, 100, (2, 8))}], r"calibration batch 0 lacks attention_mask"),
        ([dict(inputs, pixel_values=torch.ones(1))], r"has pixel_values, which the export does not take"),
        ([dict(inputs, input_ids=torch.rand(2, 8))],
         r"input 'input_ids' is float32 of rank 2 \(shape \[2, 8\]\); the export takes int64 of rank 2"),
        ([inputs, dict(inputs, attention_mask=torch.ones(2, 8, 1, dtype=torch.long))],
         r"calibration batch 1: input 'attention_mask' is int64 of rank 3"),
        ([{k: v[:, :5] for k, v in inputs.items()}],
         r"has shape \[2, 5\], but this executorch-xnnpack export has static shapes \(traced \[2, 8\]\)"),
    ]
    for calibration, message in cases:
        events = []
        with pytest.raises(hfexport.InvalidInputError, match=message):
            hfexport.export(model, inputs, backend=BACKEND, progress=events.append,
                            quantize=hfexport.Quantization("int8", calibration=calibration))
        assert events == []  # refused before the first stage
    with pytest.raises(TypeError, match="calibration must be a non-empty list of input mappings"):
        hfexport.Quantization("int8", calibration=inputs)


def test_quantizing_a_quantized_model_is_refused():
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_

    model = tiny_model("llama")
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and m.in_features % 32 == 0)
    with pytest.raises(hfexport.InvalidInputError,
                       match=r"LlamaForCausalLM is quantized already \(model.layers.0.self_attn.q_proj.weight is a "
                             r"\w+ \(a torchao quantized tensor\)\)"):
        hfexport.export(model, backend=BACKEND, quantize="8da4w")
