"""A bf16 checkpoint (what most Qwen2.5 and Llama 3 repositories hold) exported with ``hfexport export DIR --task
text-generation``: the model loads in float32 (each tensor widened exactly as it is read, one copy), each backend's
artifact generates the ids of eager on those float32 weights in a new process, and ``export.json`` records
``source_dtype: bfloat16``. A quantized export starts from the same float32 values (the bf16 values exactly) and
reports its token agreement. Through the CLI, in process (``cli.main``), as a user runs it."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from helpers import generate_in_fresh_process, tiny_model
from hfexport import cli
from hfexport.commands import checkpoint_dtype

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bf16") / "llama"
    tiny_model("llama", layers=1).to(torch.bfloat16).save_pretrained(directory)
    return directory


def _prompts() -> list[tuple[torch.Tensor, None]]:
    return [(torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(length)), None)
            for length in (5, 9)]


def _eager_fp32(directory) -> list[torch.Tensor]:
    """Eager generate on the bf16 weights widened to float32 (exact), the reference of a float32 artifact."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert model.dtype == torch.float32
    with torch.no_grad():
        return [model.generate(input_ids=ids, do_sample=False, max_new_tokens=NEW_TOKENS) for ids, _ in _prompts()]


def _export(directory, out, backend, *options) -> dict:
    assert cli.main(["export", str(directory), "--backend", backend, "--task", "text-generation", "--max-cache-len",
                     "32", "-o", str(out), *options]) == 0
    return json.loads((out / "export.json").read_text())


def test_checkpoint_dtype_reads_the_config_else_the_safetensors_header(bf16_checkpoint, tmp_path):
    assert checkpoint_dtype(bf16_checkpoint) == "bfloat16"
    config = json.loads((bf16_checkpoint / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype(tmp_path) is None  # no weights: nothing says
    header = json.dumps({"__metadata__": {}, "w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    assert checkpoint_dtype(tmp_path) == "float16"


@pytest.mark.parametrize("backend", [
    pytest.param("dynamo", marks=pytest.mark.slow),  # 26 s at load 3; the fast checks are the loader's below
    pytest.param("onnx", marks=pytest.mark.slow),
    pytest.param("executorch-xnnpack", marks=pytest.mark.slow),
    pytest.param("openvino", marks=pytest.mark.slow),
])
def test_a_bf16_checkpoint_exports_in_float32_and_generates_eager_ids_in_a_new_process(bf16_checkpoint, tmp_path,
                                                                                        backend):
    pytest.importorskip({"dynamo": "hfexport_dynamo", "onnx": "hfexport_onnx", "executorch-xnnpack":
                         "hfexport_executorch", "openvino": "hfexport_openvino"}[backend])
    manifest = _export(bf16_checkpoint, tmp_path / backend, backend)
    assert manifest["source_dtype"] == "bfloat16"  # the checkpoint's, though the model exported in float32
    assert json.loads((tmp_path / backend / "config.json").read_text()).get("dtype") in ("float32", None)
    assert manifest["verification"]["passed"] and manifest["verification"]["first_difference"] is None
    got = generate_in_fresh_process({backend: (tmp_path / backend, _prompts(), {"max_new_tokens": NEW_TOKENS})},
                                    tmp_path)[backend]
    for ours, eager in zip(got, _eager_fp32(bf16_checkpoint), strict=True):
        assert torch.equal(ours, eager)


def test_an_int4_export_of_a_bf16_checkpoint_reports_its_token_agreement(bf16_checkpoint, tmp_path):
    pytest.importorskip("hfexport_onnx")
    manifest = _export(bf16_checkpoint, tmp_path / "int4", "onnx", "--quantize", "int4")
    assert manifest["source_dtype"] == "bfloat16"
    assert manifest["verification"]["quantized"] == ["int4"]
    assert 0.0 <= manifest["verification"]["token_agreement"] <= 1.0


@pytest.mark.parametrize("flag,loaded", [(None, torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_cli_loads_a_bf16_checkpoint_in_float32_unless_told(bf16_checkpoint, flag, loaded):
    """Each weight widened as Transformers reads it (no bf16 model kept beside the float32 one); ``--dtype bf16``
    loads in bf16 directly; the checkpoint's dtype is kept for the manifest either way."""
    import argparse

    import hfexport
    from hfexport.commands import load_model

    args = argparse.Namespace(model=str(bf16_checkpoint), dtype=flag, trust_remote_code=False, backend="dynamo")
    model = load_model(hfexport.get_backend("dynamo").load_exporter(), args)
    assert {p.dtype for p in model.parameters()} == {loaded}
    assert args.source_dtype == "bfloat16"


def test_the_api_records_the_dtype_of_the_model_it_is_given():
    import hfexport

    model = tiny_model("llama", layers=1).to(torch.bfloat16)
    exported = hfexport.export(model, backend="dynamo", atol=5e-2, rtol=5e-2)
    assert exported.manifest["source_dtype"] == "bfloat16"
    assert next(model.parameters()).dtype == torch.bfloat16  # the model given back as it came
