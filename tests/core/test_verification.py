"""The verification report: NaN/Inf reported as such (never as a 0.0 difference), stored in the manifest with
the max abs and rel diffs, tolerances and input shapes, and saved in export.json. Every export verifies itself
(a mismatch raises VerificationError) and stores its inputs and eager outputs, which ``hfexport verify DIR``
re-runs without the model."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import hfexport
import hfexport.plugin
from helpers import tiny_model
from hfexport import VerificationError, cli
from hfexport._artifact import (
    MANIFEST_NAME,
    Component,
    ExportedModel,
    OutputDiff,
    VerificationReport,
    compare_outputs,
)


class _Runner:
    """Runs a function in place of a runtime (e.g. one whose program file has a flipped byte)."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, args):
        return [self.fn(*args)]


def _artifact(runtime) -> ExportedModel:
    spec = pytree.tree_flatten(torch.zeros(1))[1]
    manifest = {"schema_version": 1, "backend": "fake", "inputs": [{"name": "x"}],
                "outputs": [{"name": "output"}]}

    def write(directory):
        (directory / "model.bin").write_bytes(b"program")
        return ["model.bin"]

    return ExportedModel("fake", [Component("model", _Runner(runtime), spec, write)], manifest,
                         reference=lambda x: x * 2)


def test_nan_in_the_export_fails_and_is_reported_as_nan_not_zero(tmp_path):
    def runtime(x):
        out = x * 2
        out[0, 1] = float("nan")
        return out

    exported = _artifact(runtime)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    report = exported.verify({"x": x}, atol=1e-5, rtol=1e-5)
    assert not report.passed
    output = report["output"]
    assert math.isnan(output.max_abs_diff) and math.isnan(output.max_rel_diff), output
    assert "1 NaN in the export where eager has none" in output.note
    assert "max abs diff nan" in str(report) and "0.000e+00" not in str(report)
    assert math.isnan(report.max_abs_diff)

    stored = exported.manifest["verification"]
    assert stored["passed"] is False and stored["max_abs_diff"] == "nan"
    assert stored["inputs"] == {"x": [2, 3]} and stored["atol"] == 1e-5 and stored["rtol"] == 1e-5
    assert stored["outputs"][0]["max_abs_diff"] == "nan" and stored["outputs"][0]["ok"] is False

    saved = exported.save_pretrained(tmp_path / "out")  # a save after verify keeps the report
    on_disk = json.loads((saved / MANIFEST_NAME).read_text())  # strict JSON: no bare NaN
    assert on_disk["verification"] == stored


def test_inf_where_eager_is_finite_fails_with_inf(tmp_path):
    exported = _artifact(lambda x: torch.where(x > 4, torch.inf, x * 2))
    report = exported.verify({"x": torch.arange(6, dtype=torch.float32)}, atol=1e-3, rtol=1e-3)
    assert not report.passed and report["output"].max_abs_diff == math.inf
    assert "1 Inf in the export where eager differs" in report["output"].note
    assert exported.manifest["verification"]["outputs"][0]["max_abs_diff"] == "inf"


def test_nan_and_inf_at_the_same_places_on_both_sides_are_equal():
    e = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    report = compare_outputs("fake", {"y": e}, {"y": e.clone()}, atol=0.0, rtol=0.0)
    assert report.passed and report["y"].max_abs_diff == 0.0 and report["y"].note == ""
    swapped = compare_outputs("fake", {"y": e}, {"y": torch.tensor([1.0, 2.0, float("inf"), -float("inf")])},
                              atol=1.0, rtol=1.0)
    assert not swapped.passed and math.isnan(swapped["y"].max_abs_diff)
    assert "NaN in eager where the export has none" in swapped["y"].note


def test_a_passing_report_has_abs_and_rel_diffs_and_the_tolerance():
    e = torch.tensor([[1.0, -2.0], [4.0, 0.0]])
    report = compare_outputs("fake", e, e + 1e-4, atol=1e-3, rtol=1e-3)
    o = report.outputs[0]
    assert report.passed and o.max_abs_diff == pytest.approx(1e-4, rel=1e-2)
    # relative where |eager| > atol only (1, -2, 4): the 0 that the export puts 1e-4 off is the absolute term's
    assert o.max_rel_diff == pytest.approx(1e-4, rel=1e-2)
    assert o.tolerance == pytest.approx(1e-3 + 1e-3 * 4.0)
    d = report.as_dict()
    assert d["outputs"][0]["max_rel_diff"] == pytest.approx(1e-4, rel=1e-2) and d["passed"] is True
    assert "max_rel_diff over the elements where |eager| > atol" in d["rule"]
    assert "'rel': the largest |exported - eager| / |eager| where |eager| > atol" in str(report)
    json.dumps(d, allow_nan=False)


# ── the verification every export runs, stored with the artifact ──────────────────────────────────────────

def _rehash(directory: Path) -> None:
    """Record the current files' hashes in export.json, as another runtime's result rewritten on purpose would."""
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["files_sha256"] = {name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
                                       "size": (directory / name).stat().st_size}
                                for name in manifest["files_sha256"]}
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def bert_export(tmp_path_factory):
    bert = tiny_model("bert", layers=1)
    inputs = {"input_ids": torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))}
    exported = hfexport.export(bert, inputs)
    return exported, exported.save_pretrained(tmp_path_factory.mktemp("verified") / "bert")


def test_every_export_is_verified_and_saves_its_inputs_and_eager_outputs(bert_export):
    from safetensors import safe_open

    exported, directory = bert_export
    report = exported.manifest["verification"]
    assert report["passed"] is True and report["inputs"] == {"input_ids": [2, 8]}
    assert (report["atol"], report["rtol"]) == (1e-4, 1e-3)  # the Exporter's verify_atol / verify_rtol
    assert exported.manifest["timings_s"]["verification"] > 0
    stored = exported.manifest["components"]["model"]["verification"]["stored"]
    assert stored == {"data_file": "verification.safetensors", "inputs": [{"name": "input_ids", "leaves": 1}],
                      "outputs": ["last_hidden_state", "pooler_output"]}
    on_disk = json.loads((directory / MANIFEST_NAME).read_text())
    assert "verification.safetensors" in on_disk["files"] and "verification.safetensors" in on_disk["files_sha256"]
    with safe_open(str(directory / "verification.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["inputs.input_ids.0", "outputs.last_hidden_state", "outputs.pooler_output"]
        assert torch.equal(f.get_tensor("inputs.input_ids.0"), torch.randint(
            0, 100, (2, 8), generator=torch.Generator().manual_seed(0)))


def test_hfexport_verify_reruns_the_stored_inputs_and_exits_3_when_the_outputs_differ(bert_export, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    _, source = bert_export
    reports = hfexport.load(source).verify_stored()  # the Python form: no model needed
    assert list(reports) == ["model"] and reports["model"].passed and reports["model"].atol == 1e-4
    assert cli.main(["verify", str(source)]) == 0
    assert "✅ stored    component 'model' re-ran its stored inputs (input_ids=[2, 8])" in capsys.readouterr().out

    artifact = tmp_path / "tampered"
    shutil.copytree(source, artifact)
    tensors = load_file(str(artifact / "verification.safetensors"))
    tensors["outputs.pooler_output"] = tensors["outputs.pooler_output"] + 0.5  # another runtime's result
    save_file(tensors, str(artifact / "verification.safetensors"))
    with pytest.raises(hfexport.IntegrityError, match="verification.safetensors"):
        hfexport.load(artifact)  # hashed like every file
    _rehash(artifact)
    report = hfexport.load(artifact).verify_stored()["model"]
    assert not report.passed and not report["pooler_output"].ok and report["last_hidden_state"].ok
    assert report["pooler_output"].max_abs_diff == pytest.approx(0.5, rel=1e-3)
    assert cli.main(["verify", str(artifact)]) == 3
    out = capsys.readouterr().out
    assert "❌ stored    component 'model' re-ran its stored inputs" in out and "FAILED" in out


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: {**t, "inputs.input_ids.1": t["inputs.input_ids.0"].clone()}, r"not named by it \['inputs.input_ids.1'\]"),
    (lambda t: {k: v for k, v in t.items() if k != "outputs.pooler_output"}, r"missing \['outputs.pooler_output'\]"),
    (lambda t: {**t, "outputs.pooler_output": t["outputs.pooler_output"].long()}, "is int64 where the program"),
    (lambda t: {**t, "inputs.input_ids.0": t["inputs.input_ids.0"].float()}, "input_ids"),
])
def test_stored_inputs_are_checked_against_the_manifest_before_the_runtime_runs(bert_export, tmp_path, edit,
                                                                                message):
    from safetensors.torch import load_file, save_file

    artifact = tmp_path / "edited"
    shutil.copytree(bert_export[1], artifact)
    save_file(edit(load_file(str(artifact / "verification.safetensors"))), str(artifact / "verification.safetensors"))
    _rehash(artifact)
    with pytest.raises((ValueError, TypeError), match=message):
        hfexport.load(artifact).verify_stored()


def test_verification_options_are_type_checked_before_any_work():
    with pytest.raises(TypeError, match=r"verify must be True or False, got 'no' \(str\)"):
        hfexport.export(torch.nn.Linear(2, 2), {"input": torch.ones(2, 2)}, verify="no")
    with pytest.raises(TypeError, match="atol must be a non-negative number"):
        hfexport.export(torch.nn.Linear(2, 2), {"input": torch.ones(2, 2)}, atol=-1.0)
    with pytest.raises(TypeError, match="rtol must be a non-negative number"):
        hfexport.export(torch.nn.Linear(2, 2), {"input": torch.ones(2, 2)}, rtol="1e-3")


def test_atol_and_rtol_reach_the_manifest_and_verify_false_still_records_the_report():
    exported = hfexport.export(torch.nn.Linear(2, 2), {"input": torch.ones(2, 2)}, atol=0.0, rtol=0.0, verify=False)
    report = exported.manifest["verification"]
    assert (report["atol"], report["rtol"], report["passed"]) == (0.0, 0.0, True)


def test_the_error_lists_failing_outputs_with_nan_as_nan_and_says_how_to_opt_out():
    report = VerificationReport("onnx", 1e-4, 1e-3, [
        OutputDiff("logits", (2, 8, 16), "float32", float("nan"), False, float("nan"), 3e-3,
                   "4 NaN in the export where eager has none"),
        OutputDiff("hidden", (2, 8), "float32", 0.25, False, 1.0, 1.2e-3),
        OutputDiff("ok", (2,), "float32", 0.0, True)], {"input_ids": [2, 8]})
    error = VerificationError("onnx", "LlamaForCausalLM", report)
    assert isinstance(error, hfexport.ExportError) and error.report is report and not error.internal
    text = str(error)
    assert text.startswith("onnx export of LlamaForCausalLM failed verification: 2 of 3 outputs differ from eager "
                           "PyTorch at input_ids=[2, 8] (|exported - eager| <= atol + rtol * |eager| with "
                           "atol=0.0001, rtol=0.001):")
    assert "  - logits [2, 8, 16] float32: max abs diff nan where the tolerance is 3.000e-03 (4 NaN in the export " \
           "where eager has none)" in text
    assert "  - hidden [2, 8] float32: max abs diff 2.500e-01 where the tolerance is 1.200e-03" in text
    assert " ok " not in text and "verify=False" in text and "--no-verify" in text


def test_a_task_export_verifies_each_component_and_keeps_each_report(tmp_path):
    exported = hfexport.export(tiny_model("llama", layers=1), task="text-generation", max_cache_len=32, atol=2e-4)
    sections = exported.manifest["components"]
    assert "verification" not in exported.manifest  # one report per component, none for the whole
    assert list(sections) == ["decoder"]  # a decoder's one program (prefill and decode)
    report = sections["decoder"]["verification"]
    assert report["passed"] is True and report["atol"] == 2e-4, report
    assert report["stored"]["data_file"] == "decoder/verification.safetensors"
    directory = exported.save_pretrained(tmp_path / "gen")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    assert "decoder/verification.safetensors" in manifest["files"]
    reports = hfexport.load(directory).verify_stored()
    assert sorted(reports) == ["decoder"] and all(r.passed for r in reports.values())
    # the zero cache is described, not stored, and the cache the decoder returns is compared at export only
    stored = manifest["components"]["decoder"]["verification"]["stored"]
    cache = next(entry for entry in stored["inputs"] if entry["name"] == "cache")
    assert sorted(cache["zero_leaves"], key=int) == [str(i) for i in range(cache["leaves"])]
    assert cache["zero_leaves"]["0"] == {"shape": [1, 2, 32, 8], "dtype": "float32"}
    assert stored["outputs"] == ["logits"] and stored["state_outputs"] == ["cache"]
    assert (directory / "decoder" / "verification.safetensors").stat().st_size < 4096


@pytest.mark.parametrize("zero_leaf,message", [
    ({"shape": [2**20, 2**20], "dtype": "float32"}, "more than 8589934592 bytes of zeros"),
    ({"shape": [2, -1], "dtype": "float32"}, "malformed zero leaf"),
    ({"shape": [2, 2], "dtype": "object"}, "malformed zero leaf"),
])
def test_described_zero_inputs_are_checked_before_they_are_allocated(zero_leaf, message):
    from hfexport._stored import stored_inputs_and_outputs

    stored = {"inputs": [{"name": "x", "leaves": 1, "zero_leaves": {"0": zero_leaf}}], "outputs": []}
    section = {"inputs": [{"name": "x"}], "outputs": []}
    with pytest.raises(ValueError, match=message):
        stored_inputs_and_outputs(stored, {}, section, "component 'm'")


def test_cli_export_exits_3_on_a_mismatch_and_no_verify_saves_it_with_the_report(tmp_path, monkeypatch, capsys):
    from hfexport_dynamo.exporter_dynamo import DynamoRunner

    tiny_model("bert", layers=1).save_pretrained(tmp_path / "bert")
    capsys.readouterr()
    run = DynamoRunner.run
    monkeypatch.setattr(DynamoRunner, "run", lambda self, args: [t + 1.0 if t.is_floating_point() else t
                                                                 for t in run(self, args)])  # a faulty runtime
    assert cli.main(["export", str(tmp_path / "bert"), "-o", str(tmp_path / "out")]) == 3
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "max abs diff 1.000e+00" in captured.out
    assert "error: dynamo export of BertModel failed verification: 2 of 2 outputs differ" in captured.err
    assert not (tmp_path / "out").exists()  # nothing saved
    assert cli.main(["export", str(tmp_path / "bert"), "-o", str(tmp_path / "out"), "--no-verify"]) == 0
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["verification"]["passed"] is False and "verification.safetensors" in manifest["files"]


def test_backends_set_their_own_default_tolerances():
    assert (hfexport.plugin.Exporter.verify_atol, hfexport.plugin.Exporter.verify_rtol) == (1e-4, 1e-3)
    for name in ("dynamo", "onnx", "executorch-xnnpack"):  # float32 runtimes: the kernel's figures
        exporter = hfexport.get_backend(name).load_exporter()
        assert (exporter.verify_atol, exporter.verify_rtol) == (1e-4, 1e-3), name
    cuda = hfexport.get_backend("executorch-cuda").load_exporter()  # bfloat16 against float32 eager
    assert (cuda.verify_atol, cuda.verify_rtol) == (5e-2, 5e-2)


def test_manifest_inputs_draw_token_type_ids_from_the_segment_vocabulary():
    """`hfexport verify DIR` ran the demo's BertModel with token_type_ids drawn from the token vocabulary
    (IndexError in the segment embedding)."""
    from hfexport._verify import inputs_from_manifest

    section = {"inputs": [{"name": n, "dtype": "int64", "shape": [2, 64]}
                          for n in ("input_ids", "token_type_ids", "attention_mask")]}
    inputs = inputs_from_manifest(section, {"vocab_size": 30522, "type_vocab_size": 2})
    assert int(inputs["token_type_ids"].max()) < 2 and int(inputs["input_ids"].max()) >= 2
    assert bool((inputs["attention_mask"] == 1).all())


def test_outputs_in_another_order_are_compared_by_name_and_a_missing_tensor_fails_the_output():
    # A ModelOutput rebuilt from the program's output spec lists its fields in declaration order, eager's in the
    # order forward set them; a None where eager has a tensor is a failed output, not a crash of the check.
    eager = {"last_hidden_state": torch.ones(2, 3), "hidden_states": (torch.zeros(1),), "pooler_output": torch.ones(2)}
    exported = {"last_hidden_state": torch.ones(2, 3), "pooler_output": torch.ones(2), "hidden_states": (torch.zeros(1),)}
    report = compare_outputs("dynamo", eager, exported, 1e-4, 1e-3)
    assert report.passed and [o.name for o in report.outputs] == ["last_hidden_state", "hidden_states.0", "pooler_output"]

    report = compare_outputs("dynamo", eager, {**exported, "pooler_output": None}, 1e-4, 1e-3)
    failed = [o for o in report.outputs if not o.ok]
    assert not report.passed and [o.name for o in failed] == ["pooler_output"]
    assert failed[0].note == "None in the export where eager has a tensor"
