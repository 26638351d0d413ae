"""The patches of ``hfexport_dynamo._recurrences``: Mamba's selective scan (Mamba, FalconMamba, Jamba, Zamba),
RWKV's WKV and RecurrentGemma's RG-LRU run as ``torch.ops.higher_order.scan`` while exporting, and CANINE's local
attention runs on reshaped chunks, so the zoo's tiny models export with a dynamic sequence and match eager at
other lengths; disabling a patch brings back the original failure (the sequence length is specialized)."""

from __future__ import annotations

import warnings

import pytest
import torch

import hfexport
import hfexport.plugin
import hfexport.workarounds
from hfexport_dynamo._recurrences import (
    _mamba_selective_scan,
    _patched_rnn_scan,
    _rwkv_linear_attention_cpu,
)
from hfexport_dynamo.export_step import SpecializedDimWarning

TRACED, OTHER = 8, (5, 13)  # the traced sequence length and two others
ATOL = 1e-4

# case -> (patch, the loop the patch replaces: module file and function named in the specialization warning)
CASES = {
    "mamba/MambaForCausalLM": ("_patch_mamba_selective_scan", r"modeling_mamba\.py:\d+ in mamba_selective_scan"),
    "falcon_mamba/FalconMambaModel": ("_patch_mamba_selective_scan",
                                      r"modeling_falcon_mamba\.py:\d+ in mamba_selective_scan"),
    "jamba/JambaForCausalLM": ("_patch_mamba_selective_scan", r"modeling_jamba\.py:\d+ in mamba_selective_scan"),
    "zamba/ZambaModel": ("_patch_mamba_selective_scan", r"modeling_zamba\.py:\d+ in mamba_selective_scan"),
    "rwkv/RwkvForCausalLM": ("_patch_rwkv_linear_attention_cpu", r"modeling_rwkv\.py:\d+ in rwkv_linear_attention_cpu"),
    "recurrent_gemma/RecurrentGemmaForCausalLM": ("_patch_recurrent_gemma_rnn_scan",
                                                  r"modeling_recurrent_gemma\.py:\d+ in _rnn_scan"),
    # CANINE: MaxPool1d in _downsample_attention_mask is the first blocker the trace meets
    "canine/CanineForTokenClassification": ("_patch_canine_downsample_attention_mask", r"_ops\.py:\d+ in __call__"),
}
# Traced at 8 characters, CANINE's program takes 8 (two molecules) to 128 (one local-attention chunk of the zoo's
# config): torch.export assumes a size seen as 2 is not 1 and keeps a size seen as 1 at 1.
LENGTHS = {"canine/CanineForTokenClassification": (12, 16)}


# Mamba (the largest group) runs in the development loop; the other families are slow (5-7 s each, after imports).
PARAMS = [pytest.param(c, marks=() if c.startswith("mamba/") else pytest.mark.slow) for c in CASES]


def _case(case_id: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from hfexport_sweep.zoo import build_case

    model, inputs, _ = build_case(case_id)
    return model, {name: value for name, value in inputs.items() if isinstance(value, torch.Tensor)}


def _inputs(like: dict[str, torch.Tensor], vocab: int, batch: int, seq: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, min(vocab, 100), (batch, seq), generator=torch.Generator().manual_seed(seq))
    return {"input_ids": ids, **({"attention_mask": torch.ones_like(ids)} if "attention_mask" in like else {})}


@pytest.mark.parametrize("case_id", PARAMS)
def test_exports_with_a_dynamic_sequence_and_matches_eager_at_other_lengths(case_id):
    model, inputs = _case(case_id)
    patch, _ = CASES[case_id]
    vocab = getattr(model.config, "vocab_size", 100)  # CANINE hashes code points: no vocabulary
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecializedDimWarning)  # no dim asked to be dynamic was fixed
        exported = hfexport.export(model, _inputs(inputs, vocab, 2, TRACED), backend="dynamo", dynamic=True)
    installed = [p["path"] for p in exported.manifest["workarounds"]["patches"] if p["name"].endswith(patch)]
    assert installed, f"{patch} was not installed"
    for seq in LENGTHS.get(case_id, OTHER):
        report = exported.verify(_inputs(inputs, vocab, 3, seq), atol=ATOL, rtol=0)
        assert report.passed, str(report)


@pytest.mark.parametrize("case_id", PARAMS)
def test_without_the_patch_the_loop_specializes_the_sequence(case_id):
    """The workaround stays re-checkable: without it, the loop fixes the traced length again."""
    model, inputs = _case(case_id)
    patch, loop = CASES[case_id]
    vocab = getattr(model.config, "vocab_size", 100)  # CANINE hashes code points: no vocabulary
    with pytest.warns(SpecializedDimWarning, match=rf"dim 1 .* fixed it to {TRACED}.*{loop}"):
        exported = hfexport.export(model, _inputs(inputs, vocab, 2, TRACED), backend="dynamo", dynamic=True,
                                   disable=(patch,))
    with pytest.raises(ValueError, match=rf"dim 1 is static \({TRACED}\)"):
        exported.verify(_inputs(inputs, vocab, 2, OTHER[1]), atol=ATOL)


def _random(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("return_last_state", [False, True])
def test_selective_scan_is_the_value_of_transformers_loop(return_last_state):
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan

    batch, inter, state, seq = 2, 6, 4, 40
    args = (_random(batch, inter, seq, seed=1), _random(batch, inter, seq, seed=2),
            -torch.exp(_random(inter, state, seed=3)), _random(batch, state, seq, seed=4),
            _random(batch, state, seq, seed=5))
    kwargs = dict(D=_random(inter, seed=6), z=_random(batch, inter, seq, seed=7), delta_bias=_random(inter, seed=8),
                  delta_softplus=True, return_last_state=return_last_state)
    expected = mamba_selective_scan(*args, **kwargs)
    actual = _mamba_selective_scan(*args, **kwargs)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_state", [False, True])
def test_wkv_scan_is_the_value_of_transformers_loop(with_state):
    """Also with a state passed in (decoding a prompt in chunks) and returned."""
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    batch, hidden, seq = 2, 6, 40
    args = (_random(hidden, seed=1), _random(hidden, seed=2), _random(batch, seq, hidden, seed=3, scale=3.0),
            _random(batch, seq, hidden, seed=4))
    state = [_random(batch, hidden, seed=5).abs(), _random(batch, hidden, seed=6).abs(), _random(batch, hidden, seed=7)]
    expected = rwkv_linear_attention_cpu(*args, state=[s.clone() for s in state] if with_state else None,
                                         return_state=True)
    actual = _rwkv_linear_attention_cpu(*args, state=[s.clone() for s in state] if with_state else None,
                                        return_state=True)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_state", [False, True])
def test_rg_lru_scan_is_the_value_of_transformers_loop(with_state):
    """Resets (a document boundary in the middle of the sequence) included."""
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    original = RecurrentGemmaRglru._rnn_scan
    batch, width, seq = 2, 6, 40
    hidden = _random(batch, seq, width, seed=1)
    gate = torch.sigmoid(_random(batch, seq, width, seed=2))
    reset = torch.zeros(batch, seq, 1, dtype=torch.bool)
    reset[:, 0], reset[1, 17] = True, True
    state = _random(batch, width, seed=3) if with_state else None
    expected = original(None, hidden, gate, reset, state)
    actual = _patched_rnn_scan(original)(None, hidden, gate, reset, state)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_patches_are_reverted_after_the_export():
    import transformers.models.mamba.modeling_mamba as modeling_mamba
    from transformers import MambaConfig, MambaForCausalLM

    original = modeling_mamba.mamba_selective_scan
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(hidden_size=16, intermediate_size=32, state_size=4, num_hidden_layers=1,
                                         vocab_size=50)).eval()
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    exported = hfexport.export(model, {"input_ids": ids}, backend="dynamo", dynamic=True)
    assert any(p["name"].endswith("_patch_mamba_selective_scan") for p in exported.manifest["workarounds"]["patches"])
    assert modeling_mamba.mamba_selective_scan is original
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)


CANINE_PATCHES = ("_patch_canine_local_attention", "_patch_canine_downsample_attention_mask",
                  "_patch_canine_repeat_molecules")


def _canine(stride: int = 4):
    from transformers import CanineConfig, CanineModel

    torch.manual_seed(0)
    config = CanineConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                          num_hash_buckets=64, num_hash_functions=2, downsampling_rate=4,
                          local_transformer_stride=stride)
    return CanineModel(config).eval()


def _chars(batch: int, seq: int, padded: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 5000, (batch, seq), generator=torch.Generator().manual_seed(seq))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, seq - padded:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.slow  # three exports of a tiny CANINE: about 25 s on an idle 2-core machine
@pytest.mark.parametrize("patch", CANINE_PATCHES)
def test_canine_needs_each_of_its_patches(patch):
    """Traced at 11 characters (several local-attention chunks of 4, a partial last one), CANINE runs at other
    lengths with all three patches; without any one of them the program refuses another length: already at the
    export's own check at a second shape (12, an ``ExportError``, a ``RuntimeError``), or at 13 or 16."""
    model = _canine()
    with pytest.raises((ValueError, RuntimeError, AssertionError), match=r"static \(11\)|Guard failed"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpecializedDimWarning)
            exported = hfexport.export(model, _chars(2, 11), backend="dynamo", dynamic=True, disable=(patch,))
        for seq in (13, 16):
            exported.verify(_chars(3, seq), atol=ATOL)


def test_canine_exports_with_a_dynamic_sequence():
    """Lengths with a partial and with only whole chunks, padding in a chunk and a fully padded chunk."""
    model = _canine()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecializedDimWarning)
        exported = hfexport.export(model, _chars(2, 11), backend="dynamo", dynamic=True)
    installed = {p["name"].rsplit(".", 1)[-1] for p in exported.manifest["workarounds"]["patches"]}
    assert set(CANINE_PATCHES) <= installed
    for batch, seq, padded in ((3, 16, 0), (3, 13, 0), (2, 23, 9)):
        report = exported.verify(_chars(batch, seq, padded), atol=ATOL, rtol=0)
        assert report.passed, str(report)


@pytest.mark.parametrize("seq,padded", [(11, 0), (16, 0), (23, 9), (23, 0)])
def test_canine_block_attention_is_the_value_of_the_chunk_loop(seq, padded):
    """The initial character encoder's local attention alone, in eager, against transformers' chunk loop."""
    model = _canine(stride=4)
    attention = model.initial_char_encoder.layer[0].attention
    assert attention.local
    hidden = _random(2, seq, 32, seed=seq)
    mask = torch.ones(2, seq, seq)
    if padded:
        mask[0, :, seq - padded:] = 0.0  # the last chunks of row 0 see no real key at all
    with torch.no_grad():
        expected = attention(hidden, mask)[0]
        with hfexport.workarounds.patch_context(("dynamo",)) as report:
            assert any(path.endswith("CanineAttention.forward") for _, path in report.installed)
            actual = attention(hidden, mask)[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_every_patch_names_why_upstream_and_when_it_can_go():
    import hfexport_dynamo._recurrences as module

    patches = [r for r in hfexport.list_workarounds() if r.module == module.__name__]
    assert {r.name for r in patches} == {"_patch_mamba_selective_scan", "_patch_rwkv_linear_attention_cpu",
                                         "_patch_recurrent_gemma_rnn_scan", *CANINE_PATCHES}
    for registration in patches:
        assert registration.scope == "dynamo", registration.name
        for part in ("**Why**", "**Upstream**", "**Remove when**"):
            assert part in registration.func.__doc__, (registration.name, part)
