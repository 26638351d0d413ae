"""An onnx text-generation artifact runs as-is in ONNX Runtime GenAI, loaded from the artifact's root as users call it
(``onnxruntime_genai.Model("<artifact>")``, its ``Generator`` and ``onnxruntime_genai.Tokenizer(model)`` over the
artifact's ``tokenizer.json``), in a new process that imports neither hfexport nor torch, with the token ids of eager
greedy decoding; the files it reads (``genai_config.json``, ``genai_model.onnx``) are in the manifest, and the
decoder's weights are stored once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hfexport
from helpers import tiny_model

NEW_TOKENS = 32
PROMPT = [5, 17, 42, 9, 33, 61, 8]
TEXT = "the quick brown fox"

# ORT GenAI's own greedy loop, in a process of its own: only onnxruntime_genai imported; with a text, its tokenizer
# (og.Tokenizer(model): the tokenizer files beside genai_config.json) encodes it and decodes what was generated
OG_SCRIPT = """
import json, sys, time
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
prompt, text = json.loads(sys.argv[2]), sys.argv[4]
if text:
    tokenizer = og.Tokenizer(model)
    prompt = [int(i) for i in tokenizer.encode(text)]
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(prompt)
ids, times = [], []
while not generator.is_done() and len(ids) < int(sys.argv[3]):
    start = time.perf_counter()
    generator.generate_next_token()
    times.append(time.perf_counter() - start)
    ids.append(int(generator.get_next_tokens()[0]))
result = {"ids": ids, "seconds": times, "prompt": prompt,
          "modules": sorted(m for m in ("torch", "hfexport") if m in sys.modules)}
if text:
    result["text"] = tokenizer.decode(ids)
print(json.dumps(result))
"""


def bpe_tokenizer():
    """A byte-level BPE (as GPT-2's, Llama 3's, Qwen's) trained offline on one sentence, under the tiny models' 100 ids
    (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2): ORT GenAI's tokenizer library reads it (not a WordLevel one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10,
                                  trainers.BpeTrainer(vocab_size=100, special_tokens=["<pad>", "<s>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def og_generate(directory, prompt: list[int], new_tokens: int, text: str = "") -> dict:
    """ORT GenAI's greedy ids (and per-token seconds) for ``prompt`` (or ``text``, through its tokenizer) on the
    artifact ``directory`` (its root), in a new process."""
    proc = subprocess.run([sys.executable, "-c", OG_SCRIPT, str(directory), json.dumps(prompt), str(new_tokens), text],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"onnxruntime_genai failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def eager_ids(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


def export_generation(kind: str, directory, tokenizer=None, **overrides) -> tuple[torch.nn.Module,
                                                                                  hfexport.ExportedModel]:
    model = tiny_model(kind, **overrides)
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=48)
    if tokenizer is not None:  # beside the programs, hashed, as `hfexport export` copies the model folder's
        exported.extra_files["tokenizer"] = lambda d: [Path(name).name for name in tokenizer.save_pretrained(d)]
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def llama_artifact(tmp_path_factory):
    directory = tmp_path_factory.mktemp("genai") / "llama"
    model, _ = export_generation("llama", directory, tokenizer=bpe_tokenizer(), layers=1)
    return model, directory


def test_ort_genai_runs_the_artifact_with_eagers_greedy_ids(llama_artifact):
    """``og.Model("<artifact>")``: the root, as users load it; 32 greedy ids equal eager's."""
    model, directory = llama_artifact
    got = og_generate(directory, PROMPT, NEW_TOKENS)
    expected = eager_ids(model, PROMPT, NEW_TOKENS)
    assert got["modules"] == []  # hfexport and torch not needed at run time
    assert len(expected) == NEW_TOKENS and got["ids"] == expected


def test_ort_genai_tokenizes_with_the_artifacts_tokenizer(llama_artifact):
    """``og.Tokenizer(model)`` reads the artifact's ``tokenizer.json`` at its root: the prompt's ids are the
    transformers tokenizer's, the greedy ids eager's, the text decoded as transformers decodes it."""
    model, directory = llama_artifact
    got = og_generate(directory, [], NEW_TOKENS, text=TEXT)
    tokenizer = bpe_tokenizer()
    prompt = tokenizer(TEXT)["input_ids"]
    expected = eager_ids(model, prompt, NEW_TOKENS)
    assert got["prompt"] == prompt and got["ids"] == expected
    assert got["text"] == tokenizer.decode(expected)


def test_the_genai_files_are_in_the_manifest_and_share_the_decoders_weights(llama_artifact):
    model, directory = llama_artifact
    manifest = json.loads((directory / "export.json").read_text())
    section = manifest["components"]["decoder"]["genai"]
    assert section == {"config_file": "genai_config.json", "model_file": "genai_model.onnx", "max_length": 48}
    # the decoder's files at the root (ORT GenAI's Model(dir) reads genai_config.json there), each hashed
    assert manifest["components"]["decoder"]["program_file"] == "model.onnx"
    assert {"genai_config.json", "genai_model.onnx", "model.onnx", "model.onnx.data", "tokenizer.json",
            "tokenizer_config.json"} <= set(manifest["files_sha256"])
    assert not (directory / "decoder").exists()
    config = json.loads((directory / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (1, 2, 8)
    assert config["model"]["eos_token_id"] == model.generation_config.eos_token_id == 2
    assert config["search"]["past_present_share_buffer"] is True and config["search"]["max_length"] == 48
    # the graph only: its initializers point into model.onnx.data
    assert (directory / "genai_model.onnx").stat().st_size < 0.5 * (
        directory / "model.onnx.data").stat().st_size + 100_000
    hfexport.load(directory)  # the hashes of the new files check


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_ort_genai_runs_other_decoders_with_eagers_greedy_ids(kind, tmp_path):
    # an eos id as real checkpoints have (the tiny configs have none; ORT GenAI then stops at the pad id 0)
    model, _ = export_generation(kind, tmp_path / kind, eos_token_id=2)
    got = og_generate(tmp_path / kind, PROMPT, NEW_TOKENS)
    expected = eager_ids(model, PROMPT, NEW_TOKENS)
    assert len(expected) == NEW_TOKENS and got["ids"] == expected
