"""ExecuTorch bounds that come from the inputs and the model, never below them (issue 26; ``_bounds.py``): a
default grows to the example, audio gets 30 s, images twice the traced size, and a bound below the example is
refused only when the user set it, saying so. Also the 1-d convolutions XNNPACK cannot reshape with two dynamic
dims (``_patch_conv1d_one_dynamic_dim``)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

from helpers import tiny_model  # noqa: E402
from hfexport_dynamo import dummy_inputs  # noqa: E402
from hfexport_executorch import ExecutorchConfig  # noqa: E402
from hfexport_executorch._bounds import bound_dynamic_dims  # noqa: E402

ATOL = 1e-4


def max_diff(exported: hfexport.ExportedModel, inputs: dict, reference=None) -> float:
    report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0, reference=reference)
    assert report.passed and report.max_abs_diff <= ATOL, str(report)
    return report.max_abs_diff


def tiny_wav2vec2(**overrides) -> torch.nn.Module:
    """A seeded 1-layer Wav2Vec2 whose convolutions shrink the audio 320 times, as the real one does (2 layers of
    8 channels, strides 5 and 64), with a mask along the samples (``feat_extract_norm="layer"``)."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(**{**dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, conv_dim=(8, 8),
        conv_kernel=(10, 8), conv_stride=(5, 64), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer", do_stable_layer_norm=True, vocab_size=32), **overrides})
    return tf.Wav2Vec2Model(config).eval()


def audio(batch: int, seconds: float, seed: int) -> dict[str, torch.Tensor]:
    samples = int(16_000 * seconds)
    return {"input_values": torch.randn(batch, samples, generator=torch.Generator().manual_seed(seed)),
            "attention_mask": torch.ones(batch, samples, dtype=torch.long)}


def _bounds(model, inputs, dynamic_shapes, **options):
    """``bound_dynamic_dims`` on the torch.export program of ``model`` (no lowering): role -> (max, source)."""
    program = torch.export.export(model, (), copy.deepcopy(inputs), dynamic_shapes=dynamic_shapes, strict=False)
    ctx = SimpleNamespace(config=ExecutorchConfig(dynamic=True, **options), inputs=inputs, model=model)
    bounds = bound_dynamic_dims(program, ctx)
    return {role: (info["max"], info["source"]) for role, info in bounds.roles.items()}


def test_bounds_come_from_the_inputs_and_the_config():
    """No lowering: the bounds each role gets, and where they come from."""
    model = tiny_wav2vec2()
    shapes = {"input_values": {0: Dim.AUTO, 1: Dim.AUTO}, "attention_mask": {0: Dim.AUTO, 1: Dim.AUTO}}
    assert _bounds(model, audio(2, 1, 0), shapes) == {"batch": (8, "default max_batch"),
                                                      "audio": (480_000, "30 s at 16 kHz")}
    assert _bounds(model, audio(13, 0.1, 0), shapes, max_seq_len=32_000) == {
        "batch": (16, "default max_batch, grown to the example"), "audio": (32_000, "max_seq_len")}
    model.config.sampling_rate = 8_000
    assert _bounds(model, audio(2, 1, 0), shapes)["audio"] == (240_000, "30 s at config.sampling_rate")
    convnext = tiny_model("convnext", layers=1)  # image_size=32
    pixels = {"pixel_values": torch.randn(2, 3, 24, 40)}
    assert _bounds(convnext, pixels, {"pixel_values": {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO}}) == {
        "batch": (8, "default max_batch"), "image_height": (48, "2 x the example"),
        "image_width": (80, "2 x the example")}
    bert = tiny_model("bert", layers=1)  # max_position_embeddings=64
    tokens = dummy_inputs(bert, 2, 8, seed=0)
    assert _bounds(bert, tokens, {k: {0: Dim.AUTO, 1: Dim.AUTO} for k in tokens})["sequence"] == (
        64, "config.max_position_embeddings")


def test_a_bound_below_the_example_is_refused_only_when_the_user_set_it():
    """Dims with no role: the default (64) holds the batch of 2 and grows to 128 for the example's 100;
    ``dim_upper_bound=16`` is refused as the user's, before any lowering."""

    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    inputs, shapes = {"x": torch.randn(2, 100)}, {"x": {0: Dim.AUTO, 1: Dim.AUTO}}
    program = torch.export.export(Twice(), (), copy.deepcopy(inputs), dynamic_shapes=shapes, strict=False)
    ctx = SimpleNamespace(config=ExecutorchConfig(dynamic=True), inputs=inputs, model=Twice())
    assert sorted(bound_dynamic_dims(program, ctx).bounded.values()) == [(2, 64), (2, 128)]
    with pytest.raises(ValueError, match=r"dim_upper_bound=16 \(your ExecutorchConfig setting\) is below the "
                                         r"example inputs' size of the dynamic dim s\d+ \(size 100\)"):
        bound_dynamic_dims(torch.export.export(Twice(), (), copy.deepcopy(inputs), dynamic_shapes=shapes),
                           SimpleNamespace(config=ExecutorchConfig(dynamic=True, dim_upper_bound=16),
                                           inputs=inputs, model=Twice()))


def test_a_batch_above_the_default_exports_and_runs():
    """A batch of 13 (Transformers' model testers use 12-14) with no max_batch: the bound grows to 16; the program
    equals eager at the traced shape, at the bound and at a second shape."""
    model = tiny_model("bert", layers=1)
    exported = hfexport.export(model, dummy_inputs(model, 13, 7, seed=0), backend="executorch-xnnpack",
                               dynamic=True)
    section = exported.manifest["executorch"]
    assert section["dim_bounds"]["batch"]["max"] == 16 and section["max_batch"] == 16
    assert section["dim_bounds"]["batch"]["source"] == "default max_batch, grown to the example"
    for batch, seq, seed in ((13, 7, 1), (16, 9, 2), (3, 12, 3)):
        max_diff(exported, dummy_inputs(model, batch, seq, seed=seed))


class Conv1dStack(torch.nn.Module):
    """An audio front end: two 1-d convolutions over ``[batch, channels, length]``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Conv1d(1, 8, 10, stride=5), torch.nn.Conv1d(8, 8, 3, stride=2)

    def forward(self, x):
        return self.second(torch.nn.functional.gelu(self.first(x[:, None])))


def test_patch_conv1d_one_dynamic_dim():
    """A dynamic batch and length: XNNPACK's conv1d reshapes refuse two dynamic dims at lowering; with the patch
    those convolutions run on the portable kernel and equal eager at two shapes."""
    inputs = {"x": torch.randn(2, 400, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(hfexport.ExportError, match="only supports 1 dynamic dimension"):
        hfexport.export(Conv1dStack(), copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True,
                        disable=("_patch_conv1d_one_dynamic_dim",))
    exported = hfexport.export(Conv1dStack(), copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True)
    assert "_patch_conv1d_one_dynamic_dim" in str(exported.manifest["workarounds"])
    assert exported.manifest["executorch"]["bounded_dims"]  # length <= 512: the example's 400, rounded up
    max_diff(exported, {"x": torch.randn(3, 512, generator=torch.Generator().manual_seed(1))})


@pytest.mark.slow
def test_wav2vec2_one_and_five_seconds():
    """Traced on 1 s of audio, run on 5 s (and a batch of 3): the audio bound is 30 s at 16 kHz, not 64 samples.
    Slow (lowering, ~35 s); the bounds are covered without lowering by the first test of this module."""
    model = tiny_wav2vec2()
    exported = hfexport.export(model, audio(2, 1, 0), backend="executorch-xnnpack", dynamic=True)
    bounds = exported.manifest["executorch"]["dim_bounds"]
    assert (bounds["audio"]["max"], bounds["audio"]["source"]) == (480_000, "30 s at 16 kHz")
    max_diff(exported, audio(3, 5, 1))


@pytest.mark.slow
def test_convnext_traced_at_32_runs_at_64():
    model = tiny_model("convnext")
    pixels = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    exported = hfexport.export(model, pixels, backend="executorch-xnnpack", dynamic=True)
    bounds = exported.manifest["executorch"]["dim_bounds"]
    assert bounds["image_height"]["max"] == bounds["image_width"]["max"] == 64
    max_diff(exported, {"pixel_values": torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))})


# ── the memory budget (_memory_plan.py) ─────────────────────────────────────────────────────────────────────
def _fitted(traced, model, inputs, **options):
    """``bound_dynamic_dims`` then ``fit_memory_budget`` on a copy of the torch.export program ``traced`` (no
    lowering): the bounds, the budget record and the program."""
    from hfexport_executorch._memory_plan import fit_memory_budget

    program = copy.deepcopy(traced)
    ctx = SimpleNamespace(config=ExecutorchConfig(dynamic=True, **options), inputs=inputs, model=model,
                          note=lambda message: None)
    bounds = bound_dynamic_dims(program, ctx)
    fit_memory_budget(program, ctx, bounds)
    return {role: (info["max"], info["source"]) for role, info in bounds.roles.items()}, bounds.budget, program


def test_default_bounds_that_plan_over_the_budget_are_halved_before_lowering(caplog):
    """Transformers' Wav2Vec2 tester (convolutions shrink audio 64 times; batch 13): 30 s of audio at a batch of 16
    plans 16.1 GiB once lowered (measured; the estimate says 14.3): the audio bound, whose halving lowers it most,
    is halved twice to 120,000 samples (7.5 s; estimated 0.9 GiB, 1.0 GiB planned when lowered), never below the
    example; the batch stays. A bound the user set is kept (the default batch then goes down to the example's 13), and
    a budget of None keeps the defaults."""
    from hfexport_sweep import tester_zoo

    model, inputs, _ = tester_zoo.build_case("wav2vec2/Wav2Vec2Model")
    traced = torch.export.export(model, (), copy.deepcopy(inputs), strict=False,
                                 dynamic_shapes={k: {0: Dim.AUTO, 1: Dim.AUTO} for k in inputs})
    with caplog.at_level("WARNING", logger="hfexport"):
        roles, budget, program = _fitted(traced, model, inputs)
    assert roles == {"batch": (16, "default max_batch, grown to the example"),
                     "audio": (120_000, "30 s at 16 kHz, halved to fit 2 GiB")}
    assert budget["lowered"] == {"audio": [480_000, 120_000]} and budget["cause"] == "audio"
    assert 12 * 2**30 < budget["estimated_bytes"] < 18 * 2**30 and budget["estimated_bytes_after"] <= 2 * 2**30
    assert [str(s) for s, r in program.range_constraints.items() if int(r.upper) == 120_000]
    assert "most of it for audio: lowered audio <= 120000 (was 480000; max_seq_len sets it)" in caplog.text
    roles, budget, _ = _fitted(traced, model, inputs, max_seq_len=480_000)
    assert roles["audio"] == (480_000, "max_seq_len") and budget["lowered"] == {"batch": [16, 13]}
    roles, budget, _ = _fitted(traced, model, inputs, memory_budget_gib=None)
    assert roles["audio"] == (480_000, "30 s at 16 kHz") and budget is None
    # a budget only the example's own size fits: halved down to the example, not below
    roles, _, _ = _fitted(traced, model, inputs, memory_budget_gib=1e-6)
    assert roles["audio"][0] == 1024 and roles["batch"][0] == 13


class TablePositions(torch.nn.Module):
    """Self-attention over ``inputs_embeds + table[:seq]``: torch.export bounds the sequence at the table's 48 rows, below the
    default, and the scores grow with its square (as ProphetNet's 510 positions and n-gram attention do)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(48, 8))

    def forward(self, inputs_embeds):
        h = inputs_embeds + self.table[: inputs_embeds.shape[1]]
        return torch.softmax(h @ h.transpose(1, 2), dim=-1) @ h


def test_a_bound_torch_export_inferred_is_halved_like_a_default():
    """Over the budget, the sequence bound torch.export inferred from the model (48) is halved, since the quadratic
    scores make it the one whose halving lowers the plan most, and the default batch keeps its 8. Before, only the
    batch could go down, to the example's (ProphetNet in the sample sweep: batch 9, and batch 10 refused)."""
    model, inputs = TablePositions(), {"inputs_embeds": torch.randn(2, 6, 8)}
    traced = torch.export.export(model, (), copy.deepcopy(inputs), strict=False,
                                 dynamic_shapes={"inputs_embeds": {0: Dim.AUTO, 1: Dim.AUTO}})
    roles, budget, _ = _fitted(traced, model, inputs, memory_budget_gib=None)
    assert roles == {"batch": (8, "default max_batch"), "sequence": (48, "torch.export")}
    _, floor, _ = _fitted(traced, model, inputs, memory_budget_gib=1e-12)  # everything down to the example
    gib = 0.45 * floor["estimated_bytes"] / 2**30
    roles, budget, _ = _fitted(traced, model, inputs, memory_budget_gib=gib)
    assert set(budget["lowered"]) == {"sequence"} and budget["estimated_bytes_after"] <= gib * 2**30
    assert roles["batch"] == (8, "default max_batch") and roles["sequence"][0] in (12, 24)
    assert roles["sequence"][1].startswith("torch.export, halved to fit ")


class SelectedTokens(torch.nn.Module):
    """The embeddings of the tokens the mask keeps: a size-like unbacked count with no upper bound
    (``sys.maxsize - 1``), as a VLM's image tokens over a dynamic batch and sequence."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)

    def forward(self, input_ids, attention_mask):
        return self.embed(input_ids)[attention_mask.bool()] * 2


def test_a_size_without_upper_bound_is_not_planned_at_sys_maxsize():
    """Counted at ``sys.maxsize - 1`` the estimate was 2**65 bytes, and every default bound was halved to the
    example's size (Molmo2's batch to 9, below its second shape's 10); the defaults stay."""
    inputs = {"input_ids": torch.randint(0, 32, (3, 7)), "attention_mask": torch.tensor([[1] * 7, [0] + [1] * 6,
                                                                                            [1] * 5 + [0] * 2])}
    traced = torch.export.export(SelectedTokens(), (), copy.deepcopy(inputs), strict=False,
                                 dynamic_shapes={k: {0: Dim.AUTO, 1: Dim.AUTO} for k in inputs})
    assert [int(r.upper) for s, r in traced.range_constraints.items() if str(s).startswith("u")] == [2**63 - 2]
    roles, budget, _ = _fitted(traced, SelectedTokens(), inputs)
    assert roles["batch"][0] >= 8 and budget is not None and budget["lowered"] == {}
    assert budget["estimated_bytes"] < 2**30


@pytest.mark.slow
def test_a_plan_over_the_budget_halves_the_default_and_runs_or_refuses_the_users():
    """Slow (three to five lowerings: 230 s at load 12; the halving is covered without lowering above). On the runtime: tiny Wav2Vec2 traced on 1 s with a 24 MiB budget gets an audio bound below 30 s that still
    holds the example, plans within the budget and equals eager at 1 s and at the new bound; a longer input is
    refused by name. The same budget with max_seq_len=480,000 set by the user is refused at export, naming the dim
    and the option."""
    model = tiny_wav2vec2()
    exported = hfexport.export(model, audio(2, 1, 0), backend="executorch-xnnpack", dynamic=True,
                               memory_budget_gib=24 / 1024)
    section = exported.manifest["executorch"]
    bound = section["dim_bounds"]["audio"]["max"]
    assert 16_000 <= bound < 480_000 and "halved to fit" in section["dim_bounds"]["audio"]["source"]
    assert section["planned_memory_bytes"] <= 24 * 2**20
    assert section["memory_budget"]["lowered"]["audio"] == [480_000, bound]
    max_diff(exported, audio(2, 1, 1))
    max_diff(exported, audio(1, bound / 16_000, 2))
    with pytest.raises(Exception, match="input_values"):
        exported(**audio(1, (bound + 16) / 16_000, 3))
    with pytest.raises(hfexport.ExportError, match=r"most of it for audio <= 480000 \(your max_seq_len\): lower "
                                                   r"max_seq_len.*memory_budget_gib"):
        hfexport.export(model, audio(2, 1, 0), backend="executorch-xnnpack", dynamic=True, max_seq_len=480_000,
                        memory_budget_gib=24 / 1024)


class DownTo1x1(torch.nn.Module):
    """Five 2-strided 3x3 convolutions (32 times smaller: a 32x32 image ends 1x1, as RegNet's and ConvNext's last
    stage does) and a 1x1 convolution after them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.down = torch.nn.Sequential(*[torch.nn.Conv2d(3 if i == 0 else 8, 8, 3, stride=2, padding=1)
                                          for i in range(5)])
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, pixel_values):
        return self.head(torch.relu(self.down(pixel_values)))


def test_patch_is_nhwc_without_size_guards():
    """Traced at 32x32 (1x1 after the convolutions) with image bounds of 64: the program runs 33x33 and 64x64 equal
    to eager. Without the patch, XNNPACK's layout pass guards on the 1x1 and narrows the image to 32 after the bounds
    were set: ExecuTorch plans 32x32 and the runtime fails (0x10) on 33x33 (transformers' tester RegNet did, in the
    tester zoo)."""
    pixels = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    larger = [{"pixel_values": torch.randn(b, 3, s, s, generator=torch.Generator().manual_seed(s))}
              for b, s in ((3, 33), (2, 64))]
    unpatched = hfexport.export(DownTo1x1(), copy.deepcopy(pixels), backend="executorch-xnnpack", dynamic=True,
                                verify=False, disable=("_patch_is_nhwc_without_size_guards",))
    with pytest.raises(RuntimeError, match="0x10"):
        unpatched.verify(copy.deepcopy(larger[0]), atol=ATOL, rtol=0.0)
    exported = hfexport.export(DownTo1x1(), copy.deepcopy(pixels), backend="executorch-xnnpack", dynamic=True)
    assert exported.manifest["executorch"]["dim_bounds"]["image_height"]["max"] == 64
    for inputs in larger:
        max_diff(exported, inputs)


class ShiftByOne(torch.nn.Module):
    """RWKV's time shift: each step sees the previous one (``nn.ZeroPad2d((0, 0, 1, -1))`` over ``[B, T, C]``)."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, x):
        return x + 2 * self.shift(x)


def test_fix_negative_constant_pad():
    """A negative pad (a crop) fails on ExecuTorch's portable kernel at every shape (0x12); rewritten as a slice
    and a non-negative pad, the program equals eager at the traced shape and at another batch and length."""
    inputs = {"x": torch.randn(2, 7, 4, generator=torch.Generator().manual_seed(0))}
    unfixed = hfexport.export(ShiftByOne(), copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True,
                              verify=False, disable=("_fix_negative_constant_pad",))
    with pytest.raises(RuntimeError, match="0x12"):
        unfixed.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
    exported = hfexport.export(ShiftByOne(), copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True)
    assert "_fix_negative_constant_pad" in str(exported.manifest["workarounds"])
    for batch, length in ((2, 7), (3, 12), (1, 1)):
        max_diff(exported, {"x": torch.randn(batch, length, 4, generator=torch.Generator().manual_seed(length))})


def test_the_memory_plan_message_of_given_bounds_names_options_not_symbols(caplog):
    """A task export's dims are bounded by its options (max_batch, prefill_chunk, max_cache_len), which generate
    checks before it runs: the plan is noted in those terms, without torch's symbols (s61 <= 64), and it is a
    warning only when it is large (a user saw ``warning: ExecuTorch plans 9.7 MiB ... s61 <= 64 ... (raise
    max_batch or max_seq_len ...)`` for every program, naming an option --task exports do not have)."""
    import logging

    from hfexport_executorch._bounds import DimBounds
    from hfexport_executorch._delegation import report_planned_memory

    notes: list[str] = []
    ctx = SimpleNamespace(note=notes.append)
    bounds = DimBounds(bounded={"s61": (1, 64), "s88": (1, 64)})
    with caplog.at_level(logging.INFO, logger="hfexport"):
        report_planned_memory(ctx, int(9.7 * 2**20), bounds)
        report_planned_memory(ctx, 3 * 2**30, bounds)
    small, large = caplog.records
    assert small.levelno == logging.INFO and large.levelno == logging.WARNING
    for record, note in zip((small, large), notes, strict=True):
        assert record.getMessage() == note and "s61" not in note and "max_seq_len" not in note
        assert "--max-cache-len" in note
    assert "lower --prefill-chunk, --max-batch or --max-cache-len" in large.getMessage()


def test_the_memory_plan_message_of_a_dynamic_export_names_the_options_the_user_has(caplog):
    """A ``dynamic=True`` export whose bounds were chosen for the user says how to raise them in the user's terms: the
    CLI flags of ``hfexport export --dynamic`` and ``hfexport.export``'s keyword arguments, of the roles it has (it
    named ``ExecutorchConfig(max_batch, max_seq_len)``, which a CLI user does not have)."""
    import logging

    from hfexport_executorch._bounds import DimBounds
    from hfexport_executorch._delegation import report_planned_memory

    notes: list[str] = []
    ctx = SimpleNamespace(note=notes.append)
    roles = {"batch": {"max": 8, "source": "default max_batch", "symbols": ["s0"]},
             "sequence": {"max": 512, "source": "config.max_position_embeddings", "symbols": ["s1"]}}
    with caplog.at_level(logging.INFO, logger="hfexport"):
        report_planned_memory(ctx, 300 * 2**20, DimBounds(roles=roles))
        report_planned_memory(ctx, 3 * 2**30, DimBounds(roles=roles))
        report_planned_memory(ctx, 2**20, DimBounds(roles={"other": {"max": 64, "source": "default dim_upper_bound",
                                                                     "symbols": ["s2"]}}))
    small, large, other = notes
    assert "ExecutorchConfig" not in small + large + other
    assert ("larger inputs are refused (raise with `hfexport export --dynamic --max-batch N / --max-seq-len N`, or "
            "max_batch=N, max_seq_len=N in hfexport.export; or give explicit Dim(name, max=...)") in small
    assert ("The largest bound chosen for you is sequence <= 512 (config.max_position_embeddings): lower it with "
            "`hfexport export --dynamic --max-seq-len N`, or max_seq_len=N in hfexport.export") in large
    assert "`hfexport export --dynamic --dim-upper-bound N`, or dim_upper_bound=N in hfexport.export" in other


def test_the_cli_flags_of_a_dynamic_export_are_refused_by_a_backend_without_them(tmp_path, capsys):
    """``--max-seq-len`` / ``--max-batch`` with ``--dynamic`` on onnx: refused by name, before any model loads."""
    from hfexport import cli

    tiny_model("bert", layers=1).save_pretrained(tmp_path / "bert")
    for flags, option in ((["--max-seq-len", "16"], "max_seq_len"), (["--max-batch", "4"], "max_batch")):
        code = cli.main(["export", str(tmp_path / "bert"), "--backend", "onnx", "--dynamic", *flags,
                         "-o", str(tmp_path / "onnx")])
        assert code == 2 and f"does not take the option {option}" in capsys.readouterr().err
        assert not (tmp_path / "onnx").exists()


@pytest.mark.slow  # 74 s on a loaded 2-core machine (lowering, saving, reloading, verifying)
def test_the_cli_flags_of_a_dynamic_export_bound_its_dims(tmp_path):
    """``hfexport export DIR --backend executorch-xnnpack --dynamic --max-batch 2 --max-seq-len 16``: the flags the
    memory plan's message names reach ``ExecutorchConfig`` (the manifest's bounds are the user's), and the check of
    the artifact loaded back stays within them (it took batch 3 x 13, beyond --max-batch 2, and failed)."""
    from hfexport import cli

    model = tiny_model("bert", layers=1)
    model.save_pretrained(tmp_path / "bert")
    out = tmp_path / "out"
    code = cli.main(["export", str(tmp_path / "bert"), "--backend", "executorch-xnnpack", "--dynamic",
                     "--max-batch", "2", "--max-seq-len", "16", "-o", str(out)])
    assert code == 0
    import json

    bounds = json.loads((out / "export.json").read_text())["executorch"]["dim_bounds"]
    assert {k: (v["max"], v["source"]) for k, v in bounds.items()} == {"batch": (2, "max_batch"),
                                                                         "sequence": (16, "max_seq_len")}
