"""An executorch-xnnpack text-generation artifact runs as-is in ExecuTorch's LLM runner (the ``TextLLMRunner``
Python bindings the executorch wheel ships, ``executorch.extension.llm.runner``), in a new process, with eager's
greedy ids: its ``decoder`` program takes the runner's inputs (``tokens [1, seq]``, ``input_pos [1]``) and carries
the constant methods the runner reads (``get_max_seq_len``, ``get_max_context_len``, ``get_eos_ids``, ...)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import hfexport
from helpers import tiny_model

NEW_TOKENS = 32
PROMPT = [5, 17, 42, 9, 33]
BASE = 0x4E00  # token i <-> the character chr(BASE + i): a tokenizer that the runner's tokenizers library reads

RUNNER_SCRIPT = """
import json, sys
import executorch.extension.llm.custom_ops.custom_ops  # ExecuTorch's LLM kernels (llama::custom_sdpa, update_cache)
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
from executorch.runtime import Runtime

program = Runtime.get().load_program(sys.argv[1])
metadata = {name: list(program.load_method(name).execute([])) for name in sorted(program.method_names)
            if name != "forward"}
runner = TextLLMRunner(sys.argv[1], sys.argv[2])
config = GenerationConfig()
config.max_new_tokens, config.temperature, config.echo = int(sys.argv[4]), 0.0, False
pieces = []
runner.generate(sys.argv[3], config, token_callback=pieces.append)
special = {"<pad>": 0, "<s>": 1, "</s>": 2}
print(json.dumps({"ids": [special[p] if p in special else ord(p) - BASE for p in pieces], "metadata": metadata}))
""".replace("BASE", str(BASE))


def char_tokenizer(path) -> None:
    """``tokenizer.json`` of a BPE over one character per id (no merges) for the tiny models' 100 ids."""
    from tokenizers import Tokenizer, models

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chr(BASE + i): i for i in range(3, 100)}}
    Tokenizer(models.BPE(vocab, merges=[], unk_token="<pad>")).save(str(path))


def run_llm_runner(pte, tokenizer, prompt: list[int], new_tokens: int) -> dict:
    text = "".join(chr(BASE + i) for i in prompt)
    proc = subprocess.run([sys.executable, "-c", RUNNER_SCRIPT, str(pte), str(tokenizer), text, str(new_tokens)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ExecuTorch's LLM runner failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def export_and_run(kind: str, tmp_path, **overrides) -> tuple[list[int], dict, list[int]]:
    model = tiny_model(kind, **overrides)
    exported = hfexport.export(model, backend="executorch-xnnpack", task="text-generation", max_cache_len=40)
    exported.save_pretrained(tmp_path / "artifact")
    char_tokenizer(tmp_path / "tokenizer.json")
    got = run_llm_runner(tmp_path / "artifact" / "decoder" / "model.pte", tmp_path / "tokenizer.json", PROMPT,
                         NEW_TOKENS)
    with torch.no_grad():
        expected = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                  eos_token_id=None)[0, len(PROMPT):].tolist()
    ours = exported.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, eos_token_id=None)
    return got["ids"], got["metadata"], expected, ours[0, len(PROMPT):].tolist()


def test_the_plan_for_executorchs_llm_kernels_takes_the_runners_inputs_and_carries_its_metadata():
    """The cheap check of the development loop (no export): the decoder ExecuTorch's LLM kernels plan is an
    LLMRunnerStep whose forward on (tokens, input_pos) gives eager's logits, prefill then a decode step."""
    from hfexport_dynamo._cache_attention import attention_for
    from hfexport_dynamo.tasks import plan_task
    from hfexport_dynamo.tasks.llm_runner import LLMRunnerStep
    from hfexport_executorch import XnnpackExporter

    model = tiny_model("llama", layers=1)
    needs = XnnpackExporter.needs
    plan = plan_task(model, "text-generation", max_cache_len=40, stateful=True,
                     fused_cache_attention=attention_for(needs.attention, True))
    step = plan.components[0].module
    assert isinstance(step, LLMRunnerStep) and list(plan.components[0].inputs) == ["input_ids", "input_pos"]
    assert plan.manifest["generation"]["cache"]["signature"] == "llm_runner"
    assert step.llm_metadata["get_max_context_len"] == 40 and step.llm_metadata["get_eos_ids"] == [2]
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        prefill = step(ids, torch.tensor([0]))["logits"]
        decode = step(torch.tensor([[7]]), torch.tensor([len(PROMPT)]))["logits"]
        eager = model(torch.cat([ids, torch.tensor([[7]])], 1)).logits
    torch.testing.assert_close(prefill, eager[:, -2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode, eager[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_executorchs_llm_runner_runs_the_artifact_with_eagers_greedy_ids(tmp_path):
    got, metadata, expected, ours = export_and_run("llama", tmp_path, layers=1, eos_token_id=None)
    assert len(expected) == NEW_TOKENS and got == expected and ours == expected
    # each constant method returns its values (an empty list: none)
    assert metadata == {"enable_dynamic_shape": [True], "get_bos_id": [1], "get_eos_ids": [], "get_max_context_len": [40],
                        "get_max_seq_len": [40], "get_vocab_size": [100], "use_kv_cache": [True],
                        "use_sdpa_with_kv_cache": [True]}


@pytest.mark.slow
def test_executorchs_llm_runner_runs_a_qwen2_artifact_with_eagers_greedy_ids(tmp_path):
    got, _, expected, ours = export_and_run("qwen2", tmp_path)
    assert len(expected) == NEW_TOKENS and got == expected and ours == expected
