"""The tester zoo (``hfexport sweep --zoo testers``): architectures built with the configs and inputs of
Transformers' own model testers, checked at the tester's shape and at a second one.

The fast tests check the registry and the sweep's plumbing (a stand-in runner); the ``sweep``-marked one exports a
representative subset on dynamo and ONNX, one process per case (about a minute on 2 cores, so ``slow``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from hfexport import cli
from hfexport_sweep import sweep, tester_zoo
from hfexport_sweep.sweep import RESULTS_FILE, SweepError, run_case, run_sweep, select_cases

# One case per kind of second shape: a decoder with the tester's head_mask (ignored by transformers 5), an
# encoder-decoder with its own decoder length, raw audio of 1024 samples at batch 13, an image twice the tester's
# size, and an SSM with a batch of 14. Every one is expected `ok` on both backends.
REPRESENTATIVE = ("gpt2/GPT2LMHeadModel", "t5/T5Model", "wav2vec2/Wav2Vec2Model",
                  "convnext/ConvNextForImageClassification", "mamba/MambaModel")


def fake_checks_both_shapes(model, inputs, alt_inputs, backend, atol, rtol, verify_traced=False):
    """A sweep runner that is ok only when asked to verify at the traced shape too (the tester zoo's criterion)."""
    if not verify_traced:
        return {"status": "mismatch", "cause": "verify_traced not passed"}
    return {"status": "ok", "export_s": 0.0, "verify_s": 0.0, "max_abs_diff": 0.0}


def test_the_registry_covers_every_family_with_at_least_60_architectures():
    cases = tester_zoo.list_cases()
    families = Counter(tester_zoo.get_case(c.case_id).family for c in cases)
    assert len({c.model_type for c in cases}) >= 60, len({c.model_type for c in cases})
    assert {"decoder", "encoder", "encoder-decoder", "vision", "audio", "speech", "multimodal", "ssm"} <= set(families)
    assert all(c.case_id == f"{c.model_type}/{c.class_name}" and c.task.startswith("tester:") for c in cases)
    # the tester's facts, as read from the upstream testers
    gpt2 = tester_zoo.get_case("gpt2/GPT2LMHeadModel")
    assert (gpt2.batch, gpt2.seq, gpt2.config["vocab_size"], gpt2.config["hidden_size"]) == (13, 7, 99, 32)
    assert "head_mask" in gpt2.inputs
    w2v = tester_zoo.get_case("wav2vec2/Wav2Vec2ForCTC")
    assert (w2v.batch, w2v.seq, w2v.alt_seq, w2v.config["conv_stride"]) == (13, 1024, 1600, (4, 4, 4))


@pytest.mark.parametrize(("case_id", "shapes", "alt_shapes"), [
    ("gpt2/GPT2LMHeadModel", {"input_ids": (13, 7), "token_type_ids": (13, 7), "head_mask": (2, 2)},
     {"input_ids": (14, 12), "token_type_ids": (14, 12), "head_mask": (2, 2)}),
    ("t5/T5Model", {"input_ids": (13, 7), "attention_mask": (13, 7), "decoder_input_ids": (13, 9),
                    "decoder_attention_mask": (13, 9)},
     {"input_ids": (14, 12), "attention_mask": (14, 12), "decoder_input_ids": (14, 14),
      "decoder_attention_mask": (14, 14)}),
    ("wav2vec2/Wav2Vec2Model", {"input_values": (13, 1024), "attention_mask": (13, 1024)},
     {"input_values": (14, 1600), "attention_mask": (14, 1600)}),
    ("convnext/ConvNextForImageClassification", {"pixel_values": (13, 3, 32, 32)}, {"pixel_values": (14, 3, 64, 64)}),
    ("whisper/WhisperForConditionalGeneration", {"input_features": (3, 80, 60), "decoder_input_ids": (3, 1)},
     {"input_features": (4, 80, 60), "decoder_input_ids": (4, 1)}),  # Whisper takes 2 x max_source_positions only
])
def test_cases_build_at_the_testers_shape_and_a_second_one_deterministically(case_id, shapes, alt_shapes):
    model, inputs, alt_inputs = tester_zoo.build_case(case_id)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    assert {k: tuple(v.shape) for k, v in alt_inputs.items()} == alt_shapes
    again, inputs2, alt2 = tester_zoo.build_case(case_id)
    assert all(torch.equal(inputs[k], inputs2[k]) for k in inputs) and all(torch.equal(alt_inputs[k], alt2[k])
                                                                         for k in alt_inputs)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    with torch.no_grad():
        model(**inputs), model(**alt_inputs)


def test_the_testers_input_recipes():
    _, inputs, _ = tester_zoo.build_case("bart/BartModel")  # clamp(3), an EOS last, ne(pad) masks
    ids = inputs["input_ids"]
    assert int(ids[:, :-1].min()) >= 3 and bool((ids[:, -1] == 2).all()) and bool((inputs["attention_mask"] == 1).all())
    _, inputs, _ = tester_zoo.build_case("llama/LlamaForCausalLM")  # CausalLMModelTester: a tril mask
    assert torch.equal(inputs["attention_mask"], torch.tril(torch.ones(13, 7, dtype=torch.long)))
    _, inputs, _ = tester_zoo.build_case("bert/BertModel")  # random_attention_mask: the last column is 1
    assert bool((inputs["attention_mask"][:, -1] == 1).all()) and bool((inputs["attention_mask"] == 0).any())
    _, inputs, _ = tester_zoo.build_case("llava/LlavaForConditionalGeneration")  # 16 image tokens in every row
    assert bool((inputs["input_ids"][:, :16] == 0).all()) and bool((inputs["input_ids"][:, 16:] != 0).all())


def test_a_tester_case_is_verified_at_both_shapes_and_says_which(tmp_path):
    record = run_case("convnext/ConvNextForImageClassification", "dynamo", runner="test_tester_zoo:fake_checks_both_shapes",
                      zoo="testers")
    assert record["status"] == "ok", record
    assert record["shapes_checked"] == ["pixel_values 13x3x32x32", "pixel_values 14x3x64x64"]
    # the default zoo's runner call is unchanged (no verify_traced)
    assert run_case("bert/BertModel", "dynamo", runner="test_tester_zoo:fake_checks_both_shapes")["status"] == \
        "mismatch"


def test_the_tester_zoo_sweeps_into_its_own_results(tmp_path):
    out = tmp_path / "testers" / "dynamo"
    summary = run_sweep("dynamo", filter="^(gpt2|bert)/", zoo="testers", output=out,
                        runner="test_tester_zoo:fake_checks_both_shapes", jobs=2, progress=False)
    assert {r["case_id"] for r in summary.records} == {"gpt2/GPT2LMHeadModel", "bert/BertModel",
                                                        "bert/BertForMaskedLM"}
    assert summary.ok == 3
    meta = json.loads((out / "meta.json").read_text())
    assert meta["zoo"] == "testers" and meta["runs"][-1]["zoo_cases"] == len(tester_zoo.list_cases())
    # a directory of the default zoo is not mixed with it, and --sample belongs to the default zoo
    with pytest.raises(SweepError, match="zoo 'testers' there, 'default' here"):
        run_sweep("dynamo", filter="^bert/BertModel$", output=out, runner="test_tester_zoo:fake_checks_both_shapes")
    with pytest.raises(SweepError, match="--sample draws from the default zoo"):
        select_cases(sample=0, zoo="testers")
    assert sweep.default_output("onnx", "testers") == Path("reports/testers/onnx")


@pytest.mark.sweep
@pytest.mark.slow  # about a minute on 2 cores: ten exports, one process each
def test_representative_tester_cases_pass_on_dynamo_and_onnx(tmp_path, capsys):
    pattern = "^(?:" + "|".join(REPRESENTATIVE) + ")$"
    for backend in ("dynamo", "onnx"):
        code = cli.main(["sweep", "--backend", backend, "--zoo", "testers", "--filter", pattern, "--jobs", "2",
                         "--timeout", "240", "--output", str(tmp_path / backend)])
        assert code == 0, capsys.readouterr().out
        records = {r["case_id"]: r for r in sweep.load_results(tmp_path / backend / RESULTS_FILE)}
        assert set(records) == set(REPRESENTATIVE)
        wrong = {c: (r["status"], r.get("cause")) for c, r in records.items() if r["status"] != "ok"}
        assert not wrong, (backend, wrong)
        # both shapes were compared with eager within the sweep's tolerances
        assert all(r["traced_max_abs_diff"] is not None and r["max_abs_diff"] is not None for r in records.values())
        assert all(r["max_abs_diff"] <= 1e-3 for r in records.values()), records


def _write_tester_sweep(directory: Path, backend: str, records: list[dict]) -> None:
    sweep.prepare_output(directory, sweep.sweep_meta(backend, f"hfexport-{backend} 0.1.0", zoo="testers"),
                         overwrite=False)
    meta = json.loads((directory / "meta.json").read_text())
    meta["runs"] = [{"started": "2026-01-01T00:00:00+00:00", "command": f"hfexport sweep --backend {backend} --zoo "
                     "testers", "ran": len(records), "zoo_cases": 90, "filter": None, "zoo": "testers"}]
    (directory / "meta.json").write_text(json.dumps(meta))
    lines = []
    for case_id, status, extra in records:
        model_type, class_name = case_id.split("/")
        lines.append(json.dumps({"case_id": case_id, "model_type": model_type, "class_name": class_name,
                                 "task": "tester:decoder", "modality": "text", "backend": backend, "status": status,
                                 **extra}) + "\n")
    (directory / RESULTS_FILE).write_text("".join(lines))


def test_the_report_lists_what_passes_on_dynamo_and_not_on_another_backend(tmp_path, monkeypatch):
    from hfexport_sweep import sweep_report

    root = tmp_path / "testers"
    _write_tester_sweep(root / "dynamo", "dynamo", [("gpt2/GPT2LMHeadModel", "ok", {}), ("rwkv/RwkvModel", "ok", {}),
                                                    ("bert/BertModel", "ok", {})])
    _write_tester_sweep(root / "executorch-xnnpack", "executorch-xnnpack", [
        ("gpt2/GPT2LMHeadModel", "ok", {"shapes": "static"}),
        ("rwkv/RwkvModel", "export_error", {"cause": "SpecViolationError: a thing upstream breaks"}),
        ("bert/BertModel", "mismatch", {"cause": "1 of 1 outputs differ"})])
    monkeypatch.setattr(sweep_report, "UPSTREAM_REASONS", (("^rwkv/", "SpecViolationError", "pytorch/executorch#1: named"),
                                                           ("^bert/", "SpecViolationError", "not this one")))
    sweep_report.write_reports(root / "executorch-xnnpack")
    md = (root / "executorch-xnnpack" / "report.md").read_text()
    assert "90 tester-zoo cases" in md.replace("3 of 90", "90") and "at the tester's shape and at a second one" in md
    assert "Of the 3 cases ok on dynamo beside this sweep, 1 are ok here (1 of them as static exports)." in md
    assert "The 2 others (1 with a named upstream reason):" in md
    assert "| `rwkv/RwkvModel` | export_error | SpecViolationError: a thing upstream breaks | pytorch/executorch#1: " \
           "named |" in md
    assert "| `bert/BertModel` | mismatch | 1 of 1 outputs differ | none named: hfexport to look at |" in md
    assert "Against dynamo" not in (root / "dynamo" / "report.md").read_text()
