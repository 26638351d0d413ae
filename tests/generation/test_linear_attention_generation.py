"""Hybrid decoders whose cache holds linear-attention states (transformers' ``LinearAttentionLayer``) beside the KV
cache, through ``task="text-generation"`` (issue 46): LFM2's conv layers carry their ``[batch, channels, kernel]``
state, Qwen3-Next's gated-delta-net layers their conv state and ``[batch, heads, key_dim, value_dim]`` recurrent
state (``kv_cache.state_layer``, ``linear_attention_patches``) where each runtime keeps its cache: as the ``decoder``
program's inputs and outputs (dynamo, onnx), in its mutable buffers beside the KV buffers (executorch-xnnpack:
``CausalLMStep.carry_states``), as fixed-shape variables beside the growing KV variables (openvino); greedy
``generate`` returns eager ``model.generate(do_sample=False)``'s ids; what the program does not carry is refused
naming it."""

from __future__ import annotations

import os

import pytest
import torch

import hfexport

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NEW_TOKENS = 12


def tiny_lfm2(kind: str = "lfm2") -> torch.nn.Module:
    """A tiny LFM2 (conv, full attention), or its siblings of the same conv-state cache: LFM2-MoE (experts after
    the conv layer) and LFM3 (conv, sliding and full attention)."""
    import transformers

    torch.manual_seed(0)  # initializer_range 0.3: the greedy ids vary (at 0.02 they repeat one token)
    common = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 64, "conv_L_cache": 3, "initializer_range": 0.3,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    config, model_class = {
        "lfm2": (lambda: transformers.Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"],
                                                 **common), transformers.Lfm2ForCausalLM),
        "lfm2_moe": (lambda: transformers.Lfm2MoeConfig(num_hidden_layers=2, layer_types=["conv", "full_attention"],
                                                        moe_intermediate_size=16, num_experts=4,
                                                        num_experts_per_tok=2, num_dense_layers=1, **common),
                     transformers.Lfm2MoeForCausalLM),
        "lfm3": (lambda: transformers.Lfm3Config(num_hidden_layers=3, sliding_window=32,
                                                 layer_types=["conv", "sliding_attention", "full_attention"],
                                                 **common), transformers.Lfm3ForCausalLM),
    }[kind]
    return model_class(config()).eval()


def tiny_qwen3_next(layer_types: tuple[str, ...] = ("linear_attention", "full_attention")) -> torch.nn.Module:
    """A tiny Qwen3-Next: gated-delta-net (conv state and recurrent state) and gated full-attention layers, 4
    experts of which 2 per token; 4 value heads over 2 key heads (grouped values)."""
    import transformers

    torch.manual_seed(0)  # initializer_range 0.3: the greedy ids vary
    if layer_types == ("qwen3_5",):  # Qwen3.5's text model: the same gated delta net, dense MLPs
        return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, max_position_embeddings=64, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=8, linear_value_head_dim=8, initializer_range=0.3, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, attn_implementation="sdpa")).eval()
    if layer_types == ("olmo_hybrid",):  # OLMo-Hybrid: gated delta net with negative eigenvalues, OLMo attention
        return transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=64, initializer_range=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            attn_implementation="sdpa")).eval()
    config = transformers.Qwen3NextConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
        layer_types=list(layer_types), num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=64, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, initializer_range=0.3, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    return transformers.Qwen3NextForCausalLM(config).eval()


def assert_generates_eagers_ids(model: torch.nn.Module, exported) -> None:
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    ids[1, :2], mask[1, :2] = 0, 0
    for rows in (1, 2):
        with torch.no_grad():
            expected = model.generate(input_ids=ids[:rows], attention_mask=mask[:rows], do_sample=False,
                                      max_new_tokens=NEW_TOKENS)
        actual = exported.generate(ids[:rows], attention_mask=mask[:rows], max_new_tokens=NEW_TOKENS)
        assert torch.equal(actual, expected), (actual, expected)
        assert len(set(expected[0, 7:].tolist())) > 3  # not one repeated token


@pytest.mark.parametrize("backend,kind", [
    ("dynamo", "lfm2"), *(pytest.param(*case, marks=pytest.mark.slow)
                          for case in (("onnx", "lfm2"), ("executorch-xnnpack", "lfm2"), ("openvino", "lfm2"),
                                       ("dynamo", "lfm2_moe"), ("dynamo", "lfm3")))])
def test_lfm2_generates_eagers_ids(backend, kind):
    """One row and a batch whose second row is left-padded by 2, a prompt of 7 prefilled in chunks of 4, then
    decode steps of one token: the conv states go from call to call as the KV cache does. Before, planning failed
    on ``'LinearAttentionLayer' object has no attribute 'keys'``."""
    model = tiny_lfm2(kind)
    exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=32, max_batch=2,
                               prefill_chunk=4)
    assert_generates_eagers_ids(model, exported)


@pytest.mark.parametrize("backend,layer_types,prefill_chunk", [
    pytest.param("dynamo", ("linear_attention", "full_attention"), 4, id="dynamo"),
    *(pytest.param(backend, ("linear_attention", "full_attention"), 4, marks=pytest.mark.slow, id=backend)
      for backend in ("onnx", "executorch-xnnpack", "openvino")),
    pytest.param("dynamo", ("linear_attention", "linear_attention", "full_attention", "linear_attention"), None,
                 marks=pytest.mark.slow, id="dynamo-4-layers-one-prefill"),
    *(pytest.param("dynamo", (sibling,), 4, marks=pytest.mark.slow, id=f"dynamo-{sibling}")
      for sibling in ("qwen3_5", "olmo_hybrid"))])
def test_qwen3_next_generates_eagers_ids(backend, layer_types, prefill_chunk):
    """Qwen3-Next's gated-delta-net layers carry a conv state and a recurrent state from call to call: the prompt
    of 7 in chunks of 4 (or at once, ``prefill_chunk`` 32), then decode steps of one token, all through the chunked
    rule from the carried state, where eager decodes by the per-token rule (the same ids). Before, planning
    refused the recurrent state. Siblings of the same layer (``torch_chunk_gated_delta_rule``): Qwen3.5's text
    model, OLMo-Hybrid."""
    model = tiny_qwen3_next(layer_types)
    exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=32, max_batch=2,
                               prefill_chunk=prefill_chunk)
    assert_generates_eagers_ids(model, exported)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lfm2", "qwen3_next"])
def test_openvinos_fixed_cache_keeps_the_states_as_variables(kind):
    """OpenVINO with ``kv_cache="fixed"`` (``cache_layout="in_place"``): the states are the program's buffers, as on
    ExecuTorch, which stage 3 makes variables of their shape beside the fixed KV variables; the same ids as eager
    (LFM2 40 s, Qwen3-Next 68 s)."""
    model = tiny_lfm2() if kind == "lfm2" else tiny_qwen3_next()
    exported = hfexport.export(model, backend="openvino", task="text-generation", max_cache_len=32, max_batch=2,
                               prefill_chunk=4, kv_cache="fixed")
    assert_generates_eagers_ids(model, exported)


@pytest.mark.parametrize("kind", ["conv", "recurrent"])
def test_the_states_are_buffers_or_fixed_variables_where_the_runtime_keeps_the_cache(kind):
    """Where the runtime keeps the cache, a linear-attention layer's states are kept there too, at their fixed size:
    in the program's buffers (``in_place``: ExecuTorch) in place of the layer's key and value buffers, or as cache
    leaves of their own beside the growing keys and values (``growing``: OpenVINO's variables), one for a conv layer,
    two for a gated delta net; the manifest names the layers. Before, both were refused naming the layers."""
    from hfexport_dynamo.tasks import plan_task

    model = tiny_lfm2() if kind == "conv" else tiny_qwen3_next()
    plan = plan_task(model, "text-generation", max_cache_len=32, max_batch=2, prefill_chunk=4, stateful=True)
    buffers = {name: tuple(b.shape) for name, b in plan.components[0].module.named_buffers(recurse=False)}
    assert "cache_conv_0" in buffers and "cache_keys_0" not in buffers and "cache_keys_1" in buffers
    assert ("cache_recurrent_0" in buffers) == (kind == "recurrent")
    assert plan.manifest["generation"]["cache"]["state_layers"] == {"0": kind}
    plan = plan_task(model, "text-generation", max_cache_len=32, max_batch=2, prefill_chunk=4, growing=True)
    cache = plan.components[0].inputs["cache"]
    assert len(cache[0]) == (1 if kind == "conv" else 2) and cache[0][0].dim() == 3 and cache[1][0].dim() == 4
    assert plan.components[0].dynamic_shapes["cache"][0][0] == {0: plan.components[0].dynamic_shapes["cache"][1][0][0]}


def test_buffered_states_start_from_zeros_at_a_new_sequence():
    """The in-buffer states (ExecuTorch) are zeros whenever ``past_length`` is 0: a second prompt after a first one
    gets the logits it gets alone, the io layout's, where the KV buffers' stale positions are masked but a stale
    conv state would be read. Run eagerly (the step is the program's module)."""
    from hfexport_dynamo.tasks import plan_task

    model = tiny_qwen3_next()
    ids = torch.randint(3, 128, (2, 4), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 32, dtype=torch.long)
    mask[:, :4] = 1
    positions = torch.arange(4)[None].repeat(2, 1)

    def logits(plan, **cache):
        step = plan.components[0].module
        with torch.no_grad():
            return step(ids, mask, positions, torch.tensor(0), **cache)["logits"]

    buffered = plan_task(model, "text-generation", max_cache_len=32, max_batch=2, prefill_chunk=4, stateful=True)
    carried = plan_task(model, "text-generation", max_cache_len=32, max_batch=2, prefill_chunk=4)
    zeros = tuple(tuple(torch.zeros_like(t) for t in layer) for layer in carried.components[0].inputs["cache"])
    expected = logits(carried, cache=zeros)
    first = logits(buffered)
    assert bool(buffered.components[0].module.cache_recurrent_0.abs().sum() > 0)  # the first call left its state
    assert torch.equal(first, expected) and torch.equal(logits(buffered), expected)


def test_a_recurrence_without_a_chunked_rule_is_refused_naming_the_layer():
    """A recurrent state that the chunked gated delta rule does not update (Bamba's Mamba2 SSM state, chosen by
    its own ``seq_len == 1`` branch) is refused at planning, naming the layer and what is carried."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BambaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, max_position_embeddings=64)
    with pytest.raises(hfexport.InvalidInputError, match=r"layer 0 holds a linear-attention cache .*Mamba2"):
        hfexport.export(transformers.BambaForCausalLM(config).eval(), backend="dynamo", task="text-generation",
                        max_cache_len=32)


@pytest.mark.slow
def test_without_the_carried_recurrent_state_the_ids_differ():
    """The patch disabled (``_patch_chunked_rule_from_carried_state``: each call's chunked rule starts from zeros,
    as transformers' does when the cache reports no previous state): the export runs, and its ids are not eager's."""
    model = tiny_qwen3_next()
    exported = hfexport.export(model, backend="dynamo", task="text-generation", max_cache_len=32, prefill_chunk=4,
                               disable=("_patch_chunked_rule_from_carried_state",))
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.generate(input_ids=ids, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert not torch.equal(exported.generate(ids, max_new_tokens=NEW_TOKENS), expected)


def test_without_the_mask_at_the_new_positions_the_export_fails_its_verification():
    """The patch disabled (``_patch_recurrent_mask_at_new_positions``): transformers' mask helper reads the last
    positions of the mask over the capacity (zeros: not written yet) and gives None for one new position (a length
    test that the trace specializes): the verification of LFM2's decoder at one token finds the logits and the conv
    state off by units."""
    with pytest.raises(hfexport.VerificationError, match=r"input_ids=\[1, 1\].*\n.*logits"):
        hfexport.export(tiny_lfm2(), backend="dynamo", task="text-generation", max_cache_len=32, prefill_chunk=4,
                        disable=("_patch_recurrent_mask_at_new_positions",))
