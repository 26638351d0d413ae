"""What an export will cost, said and checked before it starts (issue 44): weight bytes counted once, the CLI's
line, the refusal's message, and ``hfexport.export`` refusing before any trace."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
import transformers

import hfexport
from hfexport._cost import AVAILABLE_MEMORY_ENV, estimate_export_cost, refusal, weight_bytes


def _tiny_llama(tie: bool) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(config)


def test_weight_bytes_count_a_tied_weight_once_also_on_the_meta_device():
    # embed 128*32 + one layer (q 32*32, k and v 32*16, o 32*32, gate/up/down 32*64, two norms 32) + the final
    # norm 32 = 13,408 float32 parameters (53,632 bytes), + the rotary tables inv_freq and original_inv_freq (4
    # floats each, 32 bytes); the untied head adds 128*32*4 = 16,384 bytes
    assert weight_bytes(_tiny_llama(tie=True)) == 53_664
    assert weight_bytes(_tiny_llama(tie=False)) == 53_664 + 16_384
    with torch.device("meta"):
        assert weight_bytes(_tiny_llama(tie=True)) == 53_664
    shared = torch.nn.Linear(8, 8, bias=False)  # two modules holding one Parameter
    assert weight_bytes(torch.nn.Sequential(shared, shared)) == 8 * 8 * 4


def test_the_refusal_names_the_peak_what_is_available_and_what_would_fit(tmp_path):
    cost = estimate_export_cost(1_976_000_000, 3.6, directory=tmp_path, available_memory=4_000_000_000,
                                free_disk=10**12, basis="measured for onnx fp32")
    assert (cost.weight_bytes, cost.peak_bytes, cost.disk_bytes) == (1_976_000_000, 7_113_600_000, 1_976_000_000)
    message = refusal(cost, {"quantize='int4'": 3_000_000_000, "quantize='int8'": 5_000_000_000})
    assert message == ("its estimated peak memory is 7.11 GB (3.6x its 1.98 GB of weights, measured for onnx fp32) "
                       "and 4.00 GB of memory are available to it; what would fit: quantize='int4' (estimated peak "
                       "3.0 GB)")
    # nothing else fits: the machine that would
    assert refusal(cost, {}).endswith("what would fit: a machine with 7.1 GB of memory available")
    assert refusal(cost, {"quantize='int4'": 3_000_000_000}) is not None
    roomy = estimate_export_cost(1_976_000_000, 3.6, directory=tmp_path, available_memory=8 * 10**9, free_disk=10**12)
    assert refusal(roomy) is None
    small_disk = estimate_export_cost(1_976_000_000, 3.6, 0.16, directory=tmp_path, available_memory=8 * 10**9,
                                      free_disk=100_000_000)
    assert refusal(small_disk) == (f"its artifact needs about 316.16 MB of disk and {tmp_path} has 100.00 MB free: "
                                   "free some, or point TMPDIR or the output elsewhere")
    unmeasured = estimate_export_cost(1_976_000_000, None, directory=tmp_path, available_memory=1, free_disk=10**12)
    assert refusal(unmeasured) is None  # no figure for the backend: nothing to refuse on


def test_available_memory_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, "1.5GB")
    assert estimate_export_cost(10, 2.0, directory=tmp_path).available_memory == 1_500_000_000
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="give bytes, or a size such as 512MB"):
        estimate_export_cost(10, 2.0, directory=tmp_path)


def test_export_refuses_before_any_trace_when_the_machine_cannot_hold_it(monkeypatch):
    """Told that 1 MB is available, the onnx export of a 1 MiB Linear (estimated peak 2.8x) is refused before its
    first stage starts; ``check_resources=False`` exports it."""
    model = torch.nn.Linear(512, 512, bias=False)
    events = []
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, "1MB")
    with pytest.raises(hfexport.InsufficientResourcesError) as caught:
        hfexport.export(model, {"input": torch.randn(2, 512)}, backend="onnx", progress=events.append)
    assert events == []  # no stage started
    message = str(caught.value)
    assert message.startswith("onnx export of Linear refused before it starts: its estimated peak memory is 2.94 MB "
                               "(2.8x its 1.05 MB of weights, measured for onnx fp32) and 1.00 MB of memory are "
                               "available to it; what would fit: a machine with 2.9 MB of memory available; ")
    assert "quantize='int4'" not in message  # measured at 4.7x: it would not fit either
    assert "check_resources=False (CLI --no-resource-check)" in message
    assert caught.value.cost.peak_bytes == int(512 * 512 * 4 * 2.8) and caught.value.cost.available_memory == 10**6
    assert isinstance(caught.value, MemoryError)
    exported = hfexport.export(model, {"input": torch.randn(2, 512)}, backend="onnx", check_resources=False)
    assert exported.manifest["verification"]["passed"] is True


def test_the_cli_says_what_the_export_will_cost_and_refuses_what_does_not_fit(tmp_path):
    """``hfexport export`` prints one line before the export (weights, estimated peak, artifact, this machine);
    with too little memory it stops there, naming the figures and the override."""
    command = [sys.executable, "-m", "hfexport.cli", "export", "--demo", "--backend", "onnx", "-o", str(tmp_path / "o")]
    run = subprocess.run(command, capture_output=True, text=True, env={**_env(), AVAILABLE_MEMORY_ENV: "1"})
    assert run.returncode == 1, run.stderr
    line = re.search(r"^\[hfexport \d+\.\ds\] (weights .*)$", run.stderr, re.M)
    assert line, run.stderr
    assert re.fullmatch(r"weights \d+\.\d\d [MG]B; estimated peak \d+\.\d [MG]B \(2\.8x, measured for onnx fp32\); artifact "
                        r"~\d+\.\d [MG]B; this machine: 0\.0 MB memory available, \d+\.\d GB disk free at "
                        + re.escape(str(tmp_path)), line[1]), line[1]
    assert "error: onnx export of" in run.stderr and "refused before it starts" in run.stderr
    assert "--no-resource-check" in run.stderr
    assert not (tmp_path / "o").exists()
    assert "--no-resource-check" in subprocess.run([*command[:4], "--help"], capture_output=True, text=True).stdout


@pytest.mark.slow  # a second CLI export of the real MiniLM (19 s); the API's override is in the default set
def test_the_cli_exports_anyway_with_no_resource_check(tmp_path):
    command = [sys.executable, "-m", "hfexport.cli", "export", "--demo", "--backend", "dynamo", "--no-verify",
               "--no-resource-check", "-o", str(tmp_path / "o")]
    run = subprocess.run(command, capture_output=True, text=True, env={**_env(), AVAILABLE_MEMORY_ENV: "1"})
    assert run.returncode == 0, run.stderr
    assert re.search(r"^\[hfexport \d+\.\ds\] weights .* \(1\.9x, measured for dynamo fp32\); .* 0\.0 MB memory "
                     r"available", run.stderr, re.M), run.stderr
    assert (tmp_path / "o" / "model.pt2").is_file()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1"}
