"""Generation on OpenVINO: the KV cache held as OpenVINO variables (``ReadValue``/``Assign``), growing with the
sequence and read by ``ScaledDotProductAttention`` (default, the CPU plugin's in-place cache) or of fixed capacity
(``kv_cache="fixed"``, ``llama_fixed``), the weights stored once, and greedy ``generate`` equal to eager ``model.generate(do_sample=False)`` token for token, after
``save_pretrained`` and ``hfexport.load`` in a new process, with a left-padded batch of two prompts (decoders) and a
right-padded one (T5)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

NEW_TOKENS = 12
KINDS = {"llama": "text-generation", "llama_fixed": "text-generation", "qwen2": "text-generation",
         "gpt2": "text-generation", "t5": "text2text-generation"}
OPTIONS = {"llama_fixed": {"kv_cache": "fixed"}}
GENAI_TOKENS = 32  # OpenVINO GenAI's greedy tokens, compared with eager's
LIVELY = {"t5": dict(initializer_factor=5.0, seed=2)}  # the default draw makes greedy T5 repeat one token
CASES = [pytest.param(kind, marks=() if kind.startswith("llama") else pytest.mark.slow, id=kind) for kind in KINDS]


def prompts(kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One prompt at batch 1, and a batch of two whose second row is padded by 3 (left for a decoder, right for T5,
    as their tokenizers pad)."""
    def ids(batch: int, length: int, seed: int) -> torch.Tensor:
        return torch.randint(3, 100, (batch, length), generator=torch.Generator().manual_seed(seed))

    padded, mask = ids(2, 7, 2), torch.ones(2, 7, dtype=torch.long)
    rows = slice(-3, None) if KINDS[kind] == "text2text-generation" else slice(None, 3)
    padded[1, rows], mask[1, rows] = 0, 0
    return [(ids(1, 5, 0), torch.ones(1, 5, dtype=torch.long)), (padded, mask)]


def word_tokenizer():
    """A word-level tokenizer over the tiny models' 100 ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``w3`` ... ``w99``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 100)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>")


def eager_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def generated(request, tmp_path_factory):
    """The selected kinds exported (max_cache_len 48, max_batch 2; the growing ones with the word tokenizer, which
    ``openvino_tokenizers`` converts for OpenVINO GenAI) and saved, then generated in one new process. A failed
    export is kept for its test to raise."""
    workdir = tmp_path_factory.mktemp("openvino-generation")
    models, runs = {}, {}
    selected = [kind for (kind,) in selected_params(request, "test_generate_equals_eager_in_a_new_process", "kind")]
    for kind in dict.fromkeys(["llama", "llama_fixed", *selected]):  # llama's artifacts are also the state tests'
        model = tiny_model(kind.removesuffix("_fixed"), **LIVELY.get(kind, {}))
        try:
            options = OPTIONS.get(kind, {"tokenizer": word_tokenizer()} if KINDS[kind] == "text-generation" else {})
            hfexport.export(model, backend="openvino", task=KINDS[kind], max_cache_len=48,
                            max_batch=2, **options).save_pretrained(workdir / kind)
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            models[kind] = error
            continue
        models[kind] = model
        runs[kind] = (workdir / kind, prompts(kind), {"max_new_tokens": NEW_TOKENS})
    return models, generate_in_fresh_process(runs, workdir) if runs else {}, workdir


@pytest.mark.parametrize("kind", CASES)
def test_generate_equals_eager_in_a_new_process(kind, generated):
    models, results, _ = generated
    if isinstance(models[kind], Exception):
        raise models[kind]
    for (ids, mask), got in zip(prompts(kind), results[kind], strict=True):
        expected = eager_generate(models[kind], ids, mask)
        first = (got != expected).nonzero()
        assert torch.equal(got, expected), f"{kind} prompt {list(ids.shape)}: first difference at {first[:1].tolist()}"
        assert got.shape[1] > ids.shape[1] + 1 or kind == "t5"  # it generated (T5's output starts anew)


def test_the_growing_cache_is_openvino_state_read_by_sdpa_as_genai_expects(generated):
    """The default layout: per layer two variables that start empty and grow, each concat feeding a
    ``ScaledDotProductAttention``, a ``beam_idx`` input, and the names optimum-intel's export has; the CPU plugin
    fuses them (its runtime model's attention reads the variables, no ``Concatenation`` between)."""
    import openvino

    models, _, workdir = generated
    if isinstance(models["llama"], Exception):
        raise models["llama"]
    section = json.loads((workdir / "llama" / "export.json").read_text())["components"]["decoder"]["openvino"]
    layers = models["llama"].config.num_hidden_layers
    names = [f"{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    assert section["input_leaves"] == ["input_ids", "attention_mask", "position_ids",
                                       *(f"past_key_values.{n}" for n in names)]
    assert sorted(section["growing_states"].values(), key=str) == sorted(
        ({"input": f"past_key_values.{n}", "output": f"present.{n}"} for n in names), key=str)
    assert (section["kv_cache_precision"], section["inference_precision"]) == ("f32", "f32")
    model = openvino.Core().read_model(workdir / "llama" / section["model_file"])
    assert sorted(n for port in model.inputs for n in port.get_names()) == sorted(
        ["input_ids", "attention_mask", "position_ids", "beam_idx"])
    types = [op.get_type_name() for op in model.get_ordered_ops()]
    assert types.count("ReadValue") == types.count("Assign") == 2 * layers
    assert types.count("ScaledDotProductAttention") == layers
    compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1})
    for op in compiled.get_runtime_model().get_ordered_ops():
        if op.get_rt_info()["layerType"].astype(str) == "ScaledDotProductAttention":
            sources = [i.get_node().get_rt_info()["layerType"].astype(str) for i in op.input_values()]
            assert sources.count("MemoryInput") == 2, sources  # the plugin's own cache, appended in place


def test_the_cache_is_openvino_state_and_the_weights_are_stored_once(generated):
    models, _, workdir = generated
    if isinstance(models["llama_fixed"], Exception):
        raise models["llama_fixed"]
    manifest = json.loads((workdir / "llama_fixed" / "export.json").read_text())
    section = manifest["components"]["decoder"]
    layers = models["llama"].config.num_hidden_layers
    assert sorted(name.rpartition(".")[2] for name in section["openvino"]["states"]) == sorted(
        f"cache_{kv}_{i}" for kv in ("keys", "values") for i in range(layers))
    assert section["openvino"]["input_leaves"] == ["input_ids", "attention_mask", "position_ids", "past_length"]
    xml = (workdir / "llama_fixed" / section["openvino"]["model_file"]).read_text()
    assert len(re.findall(r'type="ReadValue"', xml)) == len(re.findall(r'type="Assign"', xml)) == 2 * layers
    # one program: the .bin holds the float32 weights once, and nothing of the cache (its initializer is a
    # broadcast zero); the tied lm_head may be stored apart from the embedding
    params = sum(p.numel() * p.element_size() for p in models["llama"].parameters())
    size = (workdir / "llama_fixed" / section["openvino"]["data_file"]).stat().st_size
    assert 0.9 * params <= size <= 1.2 * params, (size, params)


def index_put_transposes(xml: str) -> list[str]:
    """The IR's ``Transpose`` layers that OpenVINO's frontend made for an ``aten.index_put`` (the cache write)."""
    return re.findall(r'name="(index_put[^"]*/Transpose[^"]*)" type="Transpose"', xml)


def test_the_cache_write_transposes_nothing(generated):
    """``_fix_index_put_leading_slices``: the decoder's cache writes are ``ScatterNDUpdate``s on the variables, with
    no ``Transpose`` of the cache around them (its test without the fix below shows two per buffer)."""
    models, _, workdir = generated
    if isinstance(models["llama_fixed"], Exception):
        raise models["llama_fixed"]
    section = json.loads((workdir / "llama_fixed" / "export.json").read_text())["components"]["decoder"]["openvino"]
    xml = (workdir / "llama_fixed" / section["model_file"]).read_text()
    assert len(re.findall(r'type="ScatterNDUpdate"', xml)) == 2 * models["llama"].config.num_hidden_layers
    assert index_put_transposes(xml) == []


@pytest.mark.slow
def test_without_the_index_put_fix_the_cache_write_transposes_the_whole_cache(tmp_path):
    model = tiny_model("llama")
    hfexport.export(model, backend="openvino", task="text-generation", max_cache_len=32, max_batch=2,
                    kv_cache="fixed", disable=("_fix_index_put_leading_slices",)).save_pretrained(tmp_path)
    section = json.loads((tmp_path / "export.json").read_text())["components"]["decoder"]["openvino"]
    transposes = index_put_transposes((tmp_path / section["model_file"]).read_text())
    # at least one before and one after the ScatterNDUpdate, per buffer
    assert len(transposes) >= 2 * 2 * model.config.num_hidden_layers, transposes


@pytest.mark.slow
def test_without_the_cat_fix_t5s_decode_step_does_not_convert():
    model = tiny_model("t5", layers=1)
    with pytest.raises(hfexport.ExportError, match=r"openvino.convert_model.*OpConversionFailure") as failure:
        hfexport.export(model, backend="openvino", task="text2text-generation", max_cache_len=16, max_batch=2,
                        disable=("_fix_cat_legacy_empty",))
    assert "Conversion is failed for: SequenceMark, aten.cat.default" in str(failure.value.__cause__)


_GENAI_SCRIPT = """
import json, sys
import numpy as np
import openvino as ov
import openvino_genai

directory, ids, text, new = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
pipe = openvino_genai.LLMPipeline(directory, "CPU", ATTENTION_BACKEND="SDPA", INFERENCE_NUM_THREADS=1,
                                  INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
config = pipe.get_generation_config()
config.max_new_tokens, config.do_sample, config.ignore_eos = new, False, True
ids = np.array(ids, dtype=np.int64)
tokens = pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config).tokens
config.max_new_tokens = 5
print(json.dumps({"tokens": [list(map(int, row)) for row in tokens], "text": pipe.generate(text, config)}))
"""


@pytest.mark.parametrize("kind", [c for c in CASES if KINDS[c.values[0]] == "text-generation"
                                  and not c.values[0].endswith("_fixed")])
def test_openvino_genai_runs_the_artifact_as_eager_in_a_new_process(kind, generated):
    """OpenVINO GenAI's ``LLMPipeline`` (its SDPA backend, f32) on the artifact's root as saved (``LLMPipeline(dir)``,
    as users call it), in a new process: 32 greedy tokens equal eager's, and text in, text out through the tokenizer
    IR written beside the model (``openvino_tokenizer.xml``, ``openvino_detokenizer.xml``) and
    ``generation_config.json``, each hashed in the manifest; the weights stored once (no ``decoder`` folder)."""
    import os
    import subprocess
    import sys

    models, _, workdir = generated
    if isinstance(models[kind], Exception):
        raise models[kind]
    manifest = json.loads((workdir / kind / "export.json").read_text())
    section = manifest["components"]["decoder"]["openvino"]
    assert section["genai"]["tokenizer"] == "converted"
    root = ["openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_tokenizer.bin",
            "openvino_detokenizer.xml", "openvino_detokenizer.bin", "config.json", "generation_config.json"]
    assert (section["model_file"], section["data_file"]) == ("openvino_model.xml", "openvino_model.bin")
    assert set(root) <= set(manifest["files_sha256"]) and not (workdir / kind / "decoder").exists()
    ids = torch.randint(3, 100, (1, 5), generator=torch.Generator().manual_seed(0))
    text = "w5 w6 w7"
    proc = subprocess.run([sys.executable, "-c", _GENAI_SCRIPT, str(workdir / kind),
                           json.dumps(ids.tolist()), text, str(GENAI_TOKENS)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    model = models[kind]
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=GENAI_TOKENS, min_new_tokens=GENAI_TOKENS)
    assert got["tokens"] == expected[:, ids.shape[1]:].tolist()
    tokenizer = word_tokenizer()
    prompt = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        eager = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=5,
                               min_new_tokens=5)
    assert got["text"] == tokenizer.decode(eager[0, prompt.shape[1]:], skip_special_tokens=True)


def test_precision_options_are_checked_and_reach_the_cpu_plugin():
    """``inference_precision`` / ``kv_cache_precision``: a value the CPU plugin does not take is refused when the
    config is made (naming the property); the taken ones become its compile properties, float32 by default, and a
    precision below float32 makes the manifest's ``quantization`` section (verified by cosine, top-1 reported)."""
    from hfexport_openvino import OpenVINOConfig
    from hfexport_openvino._runner import compile_options
    from hfexport_openvino.exporter_openvino import with_runtime_precision

    with pytest.raises(ValueError, match="KV_CACHE_PRECISION"):
        OpenVINOConfig(kv_cache_precision="f8")
    with pytest.raises(ValueError, match="INFERENCE_PRECISION_HINT"):
        OpenVINOConfig(inference_precision="int8")
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        OpenVINOConfig(kv_cache="paged")
    assert compile_options(1)["KV_CACHE_PRECISION"] == compile_options(1)["INFERENCE_PRECISION_HINT"] == "f32"
    assert compile_options(1, None, "bf16", "f16") == {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f16",
                                                        "INFERENCE_NUM_THREADS": 1}
    assert with_runtime_precision(None, OpenVINOConfig()) is None
    section = with_runtime_precision(None, OpenVINOConfig(inference_precision="bf16", kv_cache_precision="f16"))
    assert section == {"recipe": "inference-bf16, kv-cache-f16", "min_cosine": 0.98,
                       "inference_precision": "bf16", "kv_cache_precision": "f16"}


@pytest.mark.slow
def test_bf16_inference_and_f16_cache_report_top1_agreement(tmp_path):
    """The CPU plugin's faster precisions as an option: the export is verified by cosine against float eager with
    its logits' top-1 agreement reported, the compiled model runs with them, and generate still runs."""
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="openvino", task="text-generation", max_cache_len=32,
                               inference_precision="bf16", kv_cache_precision="f16")
    section = exported.manifest["components"]["decoder"]
    assert section["quantization"]["recipe"] == "inference-bf16, kv-cache-f16"
    verification = section["verification"]
    assert verification["passed"] and verification["metric"] == "quantized"
    logits = next(o for o in verification["outputs"] if o["name"].endswith("logits"))
    assert logits["cosine"] >= 0.98 and 0 <= logits["top1_agreement"] <= 1
    runner = exported.components["decoder"].runner
    import openvino

    assert runner.compiled.get_property("KV_CACHE_PRECISION") == openvino.Type.f16
    ids, mask = prompts("llama")[0]
    got = exported.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    expected = eager_generate(model, ids, mask)
    agreement = float((got[0, -NEW_TOKENS:] == expected[0, -NEW_TOKENS:]).double().mean())
    print(f"bf16/f16 greedy token agreement with float eager: {agreement:.2f}")
    assert got.shape == expected.shape
