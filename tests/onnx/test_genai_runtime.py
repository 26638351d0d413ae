"""An onnx text-generation artifact runs as-is in ONNX Runtime GenAI (``onnxruntime_genai.Model("<artifact>/decoder")``
and its ``Generator``), in a new process that imports neither hfexport nor torch, with the token ids of eager greedy
decoding; the files it reads (``genai_config.json``, ``genai_model.onnx``) are in the manifest, and the decoder's
weights are stored once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import hfexport
from helpers import tiny_model

NEW_TOKENS = 32
PROMPT = [5, 17, 42, 9, 33, 61, 8]

# ORT GenAI's own greedy loop, in a process of its own: only onnxruntime_genai imported
OG_SCRIPT = """
import json, sys, time
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(json.loads(sys.argv[2]))
ids, times = [], []
while not generator.is_done() and len(ids) < int(sys.argv[3]):
    start = time.perf_counter()
    generator.generate_next_token()
    times.append(time.perf_counter() - start)
    ids.append(int(generator.get_next_tokens()[0]))
print(json.dumps({"ids": ids, "seconds": times, "modules": sorted(m for m in ("torch", "hfexport") if m in sys.modules)}))
"""


def og_generate(decoder_dir, prompt: list[int], new_tokens: int) -> dict:
    """ORT GenAI's greedy ids (and per-token seconds) for ``prompt`` on the artifact's ``decoder_dir``, in a new
    process."""
    proc = subprocess.run([sys.executable, "-c", OG_SCRIPT, str(decoder_dir), json.dumps(prompt), str(new_tokens)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"onnxruntime_genai failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def eager_ids(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


def export_generation(kind: str, directory, **overrides) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    model = tiny_model(kind, **overrides)
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=48)
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def llama_artifact(tmp_path_factory):
    directory = tmp_path_factory.mktemp("genai") / "llama"
    model, _ = export_generation("llama", directory, layers=1)
    return model, directory


def test_ort_genai_runs_the_artifact_with_eagers_greedy_ids(llama_artifact):
    model, directory = llama_artifact
    got = og_generate(directory / "decoder", PROMPT, NEW_TOKENS)
    expected = eager_ids(model, PROMPT, NEW_TOKENS)
    assert got["modules"] == []  # hfexport and torch not needed at run time
    assert len(expected) == NEW_TOKENS and got["ids"] == expected


def test_the_genai_files_are_in_the_manifest_and_share_the_decoders_weights(llama_artifact):
    model, directory = llama_artifact
    manifest = json.loads((directory / "export.json").read_text())
    section = manifest["components"]["decoder"]["genai"]
    assert section == {"config_file": "decoder/genai_config.json", "model_file": "decoder/genai_model.onnx",
                       "max_length": 48}
    assert {"decoder/genai_config.json", "decoder/genai_model.onnx"} <= set(manifest["files_sha256"])
    config = json.loads((directory / "decoder" / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (1, 2, 8)
    assert config["model"]["eos_token_id"] == model.generation_config.eos_token_id == 2
    assert config["search"]["past_present_share_buffer"] is True and config["search"]["max_length"] == 48
    # the graph only: its initializers point into model.onnx.data
    assert (directory / "decoder" / "genai_model.onnx").stat().st_size < 0.5 * (
        directory / "decoder" / "model.onnx.data").stat().st_size + 100_000
    hfexport.load(directory)  # the hashes of the new files check


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_ort_genai_runs_other_decoders_with_eagers_greedy_ids(kind, tmp_path):
    # an eos id as real checkpoints have (the tiny configs have none; ORT GenAI then stops at the pad id 0)
    model, _ = export_generation(kind, tmp_path / kind, eos_token_id=2)
    got = og_generate(tmp_path / kind / "decoder", PROMPT, NEW_TOKENS)
    expected = eager_ids(model, PROMPT, NEW_TOKENS)
    assert len(expected) == NEW_TOKENS and got["ids"] == expected
