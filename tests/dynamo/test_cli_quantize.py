"""The quantization knobs through the CLI as a user runs them (new processes): ``--group-size`` and ``--no-sym``
reach ONNX Runtime's ``MatMulNBits`` (``block_size``, ``is_symmetric``), ``--group-size`` and ``--qembedding``
ExecuTorch's 8da4w, as each manifest records. The cheap checks of the mapping are in tests/core/test_cli.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import tiny_model


def _export(model_dir, out, *options):
    return subprocess.run([sys.executable, "-m", "hfexport.cli", "export", str(model_dir), "--task", "text-generation",
                           "--max-cache-len", "32", "-o", str(out), *options], capture_output=True, text=True)


@pytest.mark.slow
def test_group_size_sym_and_qembedding_reach_onnx_and_executorch(tmp_path):
    tiny_model("llama", layers=1, vocab_size=256).save_pretrained(tmp_path / "llama")
    run = _export(tmp_path / "llama", tmp_path / "onnx", "--backend", "onnx", "--quantize", "int4", "--group-size",
                  "16", "--no-sym")
    assert run.returncode == 0, run.stderr[-3000:]
    section = json.loads((tmp_path / "onnx" / "export.json").read_text())["components"]["decoder"]["quantization"]
    assert section["group_size"] == 16 and "is_symmetric=False" in section["steps"][0], section
    run = _export(tmp_path / "llama", tmp_path / "et", "--backend", "executorch-xnnpack", "--quantize", "8da4w",
                  "--group-size", "64", "--qembedding", "4w")
    assert run.returncode == 0, run.stderr[-3000:]
    section = json.loads((tmp_path / "et" / "export.json").read_text())["components"]["decoder"]["quantization"]
    assert (section["group_size"], section["embedding"]) == (64, "4w"), section
