"""The KV cache of a decoder program: ``max_cache_len`` positions per layer, written at ``past_length``, and the
attention over it (grouped-query attention without ``repeat_kv``; a runtime's fused op or in-place kernel where
the backend declares one, with the model's RoPE in it where its tables allow).

The cache holds ``[batch, kv_heads, max_cache_len, head_dim]`` keys and values per layer. Where it lives depends on
the runtime (``RuntimeNeeds.cache_layout`` of its exporter), and how it is read on the runtime's fused kernel, if
any (``RuntimeNeeds.attention``):

* as program inputs and outputs (ONNX, ``.pt2``): an input ``cache`` and an output ``cache``, ``((keys, values),
  ...)`` per layer. Where the backend lowers ``hfexport::cache_attention`` (ONNX: ONNX Runtime's
  ``GroupQueryAttention``), each layer's write and attention are that one op, which reads only the filled
  positions; otherwise the write is one ``ScatterND`` from the input to the output and attention reads the whole
  capacity under the mask. The ONNX Runtime runner binds each output to its input's memory
  (``manifest["components"]["decoder"]["onnx"]["in_place_outputs"]``), so nothing but the new positions is written;
* as program inputs of ``past`` positions and outputs of ``past + seq`` (``RuntimeNeeds(cache_layout="growing")``,
  OpenVINO): :func:`growing_layer` concatenates the new positions, attention is the model's own ``sdpa`` (one
  ``scaled_dot_product_attention`` per layer over the positions held), and the runtime keeps the outputs as its
  state, which its kernel appends to in place;
* in the program's mutable buffers (ExecuTorch); the batch is then static (``max_batch``: the loop pads a smaller
  batch with copies of a row). With the runtime's in-place kernel (:class:`InPlaceCacheAttention`, ExecuTorch's
  ``llama::update_cache`` + ``llama::custom_sdpa``) at ``max_batch=1``: buffers ``[batch, max_cache_len, kv_heads,
  head_dim]``, causal attention over the filled positions without a padding mask (``generate`` runs a row without
  its left padding). Otherwise ``[batch * kv_heads, max_cache_len, head_dim]``, written with an ``index_put`` that
  ExecuTorch's re-inplace pass turns into ``index_put_``, and attention over the whole capacity under the mask.

A linear-attention layer (LFM2's conv layers, Qwen3-Next's gated delta nets: :func:`state_layer`) holds fixed-size
states instead of keys and values, kept where the runtime keeps the cache: its ``(conv_state, recurrent_state)``
as inputs and outputs; buffers ``cache_conv_<i>`` and ``cache_recurrent_<i>`` (zeros at ``past_length`` 0:
``CausalLMStep.carry_states``); in a growing cache, leaves ``(conv_state,)`` or ``(conv_state, recurrent_state)``
that do not grow (OpenVINO variables of a static shape). The model reads them through the patches of scope
``"dynamo.text_generation"`` (:func:`linear_attention_patches`).

Attention folds a group's query heads into rows instead of repeating the cache per query head
(:func:`grouped_query_attention`). :class:`hfexport_dynamo.tasks.causal_lm.CausalLMStep` builds the layers
(:func:`capacity_layer`) and routes transformers' ``sdpa`` attention here (:func:`grouped_sdpa`).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Protocol

import torch

from hfexport.plugin import InvalidInputError

from .. import _cache_attention  # noqa: F401  (registers hfexport::cache_attention)
from .._linear_attention_patches import (  # registers the patches of scope "dynamo.text_generation"
    CARRIED,
    CONV_MASK_FAMILIES,
    GATED_DELTA_FAMILIES,
    NEW_POSITIONS,
    SCOPE,
    CarriedStates,
)

__all__ = ["FUSED_CACHE", "growing_layer", "linear_attention_module", "linear_attention_patches", "linear_attention_state",
           "probe_cache", "state_layer", "step_cache", "FusedAttentionUnused", "FusedRotaryUnusable", "InPlaceCacheAttention", "RotaryTables",
           "capacity_layer", "grouped_query_attention", "grouped_sdpa", "recording_rotary", "rotary_tables"]


def capacity_layer(keys: torch.Tensor, values: torch.Tensor, past_length: torch.Tensor, in_place: bool,
                    shapes: tuple[torch.Size, torch.Size] | None = None, fused: bool = False) -> Any:
    """A transformers cache layer over ``keys``/``values`` of ``max_cache_len`` positions that writes the new
    positions at ``past_length`` (in place into buffers, or into new tensors for a program's outputs).

    It is a ``StaticLayer`` for the mask code (``get_mask_sizes`` gives the whole capacity, ``get_seq_length`` the
    tensor ``past_length``), with its own ``update``: ``StaticLayer.update`` counts positions in its own state and
    writes with ``index_copy_``, which the ONNX exporter lowers as Transpose, ScatterND, Transpose (two copies of the
    whole cache); ``index_put`` over the leading (batch, head, position) indices is one ScatterND on the cache.

    In buffers (ExecuTorch, ``in_place``) ``keys``/``values`` are ``[batch * kv_heads, max_cache_len, head_dim]``
    (``shapes`` gives their 4-D views) and the write is ``buffer[:, positions] = new``: ExecuTorch's in-place
    ``index_put_`` kernel takes a single 1-D index and values of the buffer's rank ("Special case in-place index_put
    only supports 1-dimensional index tensors"), and its passes drop the unit batch dim of 4-D values (batch 1:
    "values.size(2) = 8, index_length = 6").

    With ``fused``, ``update`` writes nothing and returns the new positions: the layer's attention writes them with
    ``hfexport::cache_attention`` (:func:`grouped_query_attention`), or calls ``write`` where it cannot.
    """
    from transformers.cache_utils import StaticLayer

    class CapacityLayer(StaticLayer):
        pending: tuple[torch.Tensor, torch.Tensor] | None = None  # new positions left to the fused attention

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if fused:  # hfexport::cache_attention writes them (grouped_query_attention), or write() does
                self.pending = (key_states, value_states)
                return key_states, value_states
            return self.write(key_states, value_states)

        def write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> Any:
            self.pending = None
            batch, heads, seq = key_states.shape[:3]
            device = key_states.device
            positions = torch.arange(seq, device=device) + self.cumulative_length
            if in_place:
                self.flat_keys[:, positions] = key_states.reshape(batch * heads, seq, -1)
                self.flat_values[:, positions] = value_states.reshape(batch * heads, seq, -1)
            else:
                index = (torch.arange(batch, device=device)[:, None, None],
                         torch.arange(heads, device=device)[None, :, None], positions[None, None, :])
                self.keys = torch.ops.aten.index_put(self.keys, index, key_states)
                self.values = torch.ops.aten.index_put(self.values, index, value_states)
            return self.keys, self.values

    layer = CapacityLayer(max_cache_len=(shapes[0] if shapes else keys.shape)[2])
    if in_place and fused:  # buffers [batch, max_cache_len, kv_heads, head_dim], written by the runtime's kernel
        layer.key_buffer, layer.value_buffer = keys, values
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    elif in_place and shapes is not None:
        layer.flat_keys, layer.flat_values = keys, values
        keys, values = keys.view(shapes[0]), values.view(shapes[1])
    layer.keys, layer.values, layer.cumulative_length = keys, values, past_length
    layer.batch_size, layer.num_heads, _, layer.k_head_dim = keys.shape
    layer.v_head_dim, layer.device, layer.dtype = values.shape[-1], keys.device, keys.dtype
    layer.is_initialized = True
    return layer


def state_layer(conv_state: torch.Tensor, recurrent_state: torch.Tensor, recurrent: bool = False) -> Any:
    """A transformers ``LinearAttentionLayer`` over ``conv_state`` ``[batch, channels, kernel]`` and, with
    ``recurrent`` (Qwen3-Next's gated delta rule), ``recurrent_state`` ``[batch, heads, key_dim, value_dim]``, both
    carried as the program's input and output; without it (LFM2's short-conv layers) ``recurrent_state``
    (``[batch, 1]``) is carried unchanged.

    It reports no previous state (``get_conv_state`` and ``get_recurrent_state`` give None), so the model takes its
    path for any length, one token included: for the conv, the new positions after the carried ones, then the last
    ``kernel`` kept; for the recurrence, the chunked rule, which :func:`linear_attention_patches` starts from the
    carried state. Zeros before the first call are no history: the prefill and a decode step are one program.
    """
    from transformers.cache_utils import LinearAttentionLayer

    class StateLayer(LinearAttentionLayer):
        def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
            held = self.conv_states[state_idx]
            full = torch.cat([held, conv_states.to(held.dtype)], dim=-1)
            self.conv_states[state_idx] = full[..., -held.shape[-1]:]
            return full

        def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0,
                                   **kwargs: Any) -> torch.Tensor:
            # a new tensor, the program's output (transformers copies into the held one)
            self.recurrent_states[state_idx] = recurrent_states.to(self.recurrent_states[state_idx].dtype)
            return self.recurrent_states[state_idx]

    layer = StateLayer()
    layer.conv_states[0], layer.is_conv_states_initialized[0] = conv_state, True
    layer.conv_kernel_size[0] = conv_state.shape[-1]
    layer.recurrent_states[0], layer.is_recurrent_states_initialized[0] = recurrent_state, recurrent
    layer.device, layer.dtype = conv_state.device, conv_state.dtype
    return layer


def linear_attention_module(model: torch.nn.Module, families: tuple[str, ...]) -> Any:
    """The modeling module of ``model`` when it is one of transformers' ``families`` (``modeling_<family>``), else
    None."""
    import sys

    name = type(getattr(model, "model", model)).__module__
    return sys.modules.get(name) if name in {f"transformers.models.{f}.modeling_{f}" for f in families} else None


def linear_attention_state(model: torch.nn.Module, index: int, layer: Any) -> tuple[torch.Size, torch.Size, str]:
    """``(conv_state shape, recurrent_state shape, kind)`` of ``model``'s linear-attention cache layer ``index``
    after an eager forward: kind ``"conv"`` (LFM2's conv layers; the recurrent shape ``[batch, 1]``, a placeholder)
    or ``"recurrent"`` (Qwen3-Next's gated delta rule).

    Raises:
        hfexport.InvalidInputError: states the decoder program does not carry: a recurrent state updated by another
            rule than the chunked gated delta rule it starts from the carried state (``_linear_attention_patches.
            GATED_DELTA_FAMILIES``; Mamba2's SSM state, Kimi's delta attention), a layer of a family whose padding
            mask the step does not place (``CONV_MASK_FAMILIES``), one of another dtype than the model's (a bf16
            model's float32 state), several states, or attention beside them.
    """
    conv, recurrent = layer.conv_states[0], layer.recurrent_states[0]
    if layer.number_of_states != 1 or conv is None or hasattr(layer, "keys") or (
            linear_attention_module(model, CONV_MASK_FAMILIES) is None) or (recurrent is not None and (
            linear_attention_module(model, GATED_DELTA_FAMILIES) is None or recurrent.dtype != conv.dtype)):
        held = "" if conv is None or recurrent is None else f": conv state {conv.dtype}, recurrent state " \
                                                            f"{recurrent.dtype}"
        raise InvalidInputError(f"{type(model).__name__}'s layer {index} holds a linear-attention cache "
                                f"({type(layer).__name__}{held}) that task='text-generation' does not carry: it "
                                "carries one conv state (LFM2) and a recurrent state of the model's dtype updated by the "
                                "chunked gated delta rule (Qwen3-Next), not several states, attention beside "
                                "them or another recurrence (Mamba2's SSM state), in the families "
                                f"{', '.join(CONV_MASK_FAMILIES)}; export without a task")
    if recurrent is None:
        return conv.shape, torch.Size((conv.shape[0], 1)), "conv"
    return conv.shape, recurrent.shape, "recurrent"


def probe_cache(model: torch.nn.Module, tokens: dict[str, torch.Tensor], mask: torch.Tensor,
                 takes_position_ids: bool) -> list[tuple[torch.Size, torch.Size, str]]:
    """The per-layer ``(keys, values)`` shapes of one eager forward with a ``DynamicCache`` (so that models with
    their own head dims or layer kinds report theirs), and the kind of linear-attention state the layer holds
    instead, if any: ``"conv"`` (LFM2's conv layers: ``(conv_state, [batch, 1])``), ``"recurrent"`` (Qwen3-Next's
    gated delta rule: ``(conv_state, recurrent_state)``), else ``""``; ``tokens``: ``{"input_ids": ...}`` or
    ``{"inputs_embeds": ...}``.

    Raises:
        hfexport.InvalidInputError: a linear-attention layer whose states the decoder program does not carry
            (:func:`linear_attention_state`).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    from .planning import positions_from_mask

    extra = {"position_ids": positions_from_mask(mask)} if takes_position_ids else {}
    with torch.no_grad():
        out = model(**tokens, attention_mask=mask, cache=DynamicCache(config=model.config), use_cache=True,
                    logits_to_keep=1, **extra)
    if getattr(out, "cache", None) is None:  # e.g. BertLMHeadModel without config.is_decoder
        raise InvalidInputError(f"{type(model).__name__} returned no KV cache with use_cache=True, so "
                                "it cannot generate step by step: load it as a decoder (config.is_decoder=True "
                                "for BERT-like models) or export it without a task")
    shapes = []
    for i, layer in enumerate(out.cache.layers):
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            shapes.append((layer.keys.shape, layer.values.shape, False))
            continue
        shapes.append(linear_attention_state(model, i, layer))
    return shapes


def step_cache(layers: list[Any]) -> Any:
    """A transformers ``Cache`` over ``layers`` that tells the patched chunked rule which layer asked for its
    recurrent state (the one that runs the rule next: ``CarriedStates.read``)."""
    from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

    if not any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers):
        return Cache(layers=layers)

    class StepCache(Cache):
        def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> Any:
            carried = CARRIED.get()
            if carried is not None:
                carried.read.append((self.layers[layer_idx], state_idx))
            return super().get_recurrent_state(layer_idx, state_idx)

    return StepCache(layers=layers)


@contextlib.contextmanager
def linear_attention_patches(attention_mask: torch.Tensor, past: Any, length: int,
                             disabled: tuple[str, ...] = ()) -> Any:
    """Within the body, the patches of scope ``"dynamo.text_generation"`` (:mod:`hfexport_dynamo.
    _linear_attention_patches`, less ``disabled``) are installed with this forward's data: the linear-attention
    layers' padding mask is ``attention_mask`` at the new positions ``past .. past + seq - 1``, and the chunked
    gated delta rule starts from the state of the layer that last asked the :func:`step_cache` for it (a
    :func:`state_layer` answers None: no previous state) over its inputs padded to ``length`` (the ``seq`` dim's
    bound) rounded up to whole chunks. Restored after, also on error."""
    from hfexport.workarounds import patch_context

    tokens = CARRIED.set(CarriedStates(length)), NEW_POSITIONS.set((attention_mask, past))
    try:
        with patch_context((SCOPE,), disabled):
            yield
    finally:
        NEW_POSITIONS.reset(tokens[1])
        CARRIED.reset(tokens[0])


def growing_layer(keys: torch.Tensor, values: torch.Tensor) -> Any:
    """A transformers ``DynamicLayer`` holding ``keys``/``values`` ``[batch, kv_heads, past, head_dim]`` (``past`` may
    be 0): its ``update`` returns them with the new positions concatenated (``[.., past + seq, ..]``), its
    ``get_seq_length`` is ``past``, so the mask code reads ``past + seq`` positions of ``attention_mask``."""
    from transformers.cache_utils import DynamicLayer

    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


def grouped_query_attention(original: Any) -> Any:
    """transformers' ``sdpa`` attention function, computing grouped-query attention without ``repeat_kv``.

    ``repeat_kv`` expands each key/value head to its ``num_key_value_groups`` query heads: over a cache of
    ``max_cache_len`` positions that is a copy of ``groups`` times the whole cache per layer and per token (7x for
    Qwen2-0.5B's 14 heads over 2), which every runtime then executes. Here the query heads of a group are folded
    into the query rows instead: ``query [b, kv * g, s, d]`` is read as ``[b, kv, g * s, d]`` (a free reshape), so
    each key/value head is read once by one ``MatMul``; the boolean mask ``[b, 1, s, l]`` is tiled over the
    ``g`` row blocks (``g x s x l``, no cache-sized copy). Masked scores take the dtype's minimum, not ``-inf``: a row
    with every key masked (a left-padding query) gets finite values instead of NaN, as transformers' eager path.

    Models without groups take it too: SDPA's decomposition fused into ONNX Runtime's ``MultiHeadAttention``
    transposes the whole cache to ``[batch, seq, heads, dim]`` first (seeded Llama of 512 hidden units, 8 layers,
    cache of 2,048 positions, 1 thread: 32.2 ms per decode step, 9.5 of them in Transpose; 23.0 ms this way).
    Anything else (no boolean mask, dropout, softcap, sinks, a position bias, a per-head mask) goes to ``original``.
    """

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                  dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                  **kwargs: Any) -> Any:
        groups = getattr(module, "num_key_value_groups", 1)
        extras = dropout or any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "sinks", "position_bias"))
        unsupported = extras or not isinstance(attention_mask, torch.Tensor) \
            or attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
        layer = _pending_layer(module, key)
        if layer is not None and getattr(layer, "kernel", None) is not None:  # a runtime's in-place kernel
            if extras or not query.shape[-1] == key.shape[-1] == value.shape[-1]:
                raise FusedAttentionUnused(f"layer {module.layer_idx}: the fused kernel computes plain causal "
                                           "attention only")
            layer.pending = None
            out = layer.kernel(query, key, value, layer.key_buffer, layer.value_buffer, layer.start,
                               scaling if scaling is not None else query.shape[-1] ** -0.5)
            return out, None
        if layer is not None:
            if not unsupported and _fusable(query, key, value, layer, attention_mask):
                layer.pending = None
                rotary = _ROTARY.get()
                unrotated = rotary.unrotated(query, key) if rotary is not None else None
                if unrotated is not None:  # the kernel applies RoPE: the query and keys before it go in
                    query, key = unrotated
                    tables = (rotary.cos, rotary.sin, rotary.position_ids)
                else:
                    tables = (None, None, None)
                out, layer.keys, layer.values = torch.ops.hfexport.cache_attention(
                    query, key, value, layer.keys, layer.values, layer.cumulative_length, attention_mask,
                    scaling if scaling is not None else query.shape[-1] ** -0.5, *tables)
                return out, None
            key, value = layer.write(key, value)
        if unsupported:
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
        batch, heads, seq, dim = query.shape
        kv_heads, length, value_dim = key.shape[1], key.shape[2], value.shape[-1]
        # -1, not batch * kv_heads: each tensor's own batch (a cache input's batch is a symbol of its own, and a
        # reshape to the query's batch becomes a divisibility guard that decode steps fail)
        rows = query.reshape(-1, groups * seq, dim)
        # keys x rows^T, then the small [rows, length] transpose: no cache-sized transpose (a copy on ExecuTorch)
        scores = torch.bmm(key.reshape(-1, length, dim), rows.transpose(1, 2)).transpose(1, 2)
        scores = scores.reshape(-1, kv_heads, groups * seq, length) * (scaling if scaling is not None else dim ** -0.5)
        # the mask's rows tiled once per group (row g * seq + s is query head g's position s)
        mask = attention_mask.repeat(1, 1, groups, 1) if groups > 1 else attention_mask
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).reshape(-1, groups * seq, length)
        # bmm on 3-D views, not matmul, whose 4-D decomposition expands (copies) the values on ExecuTorch
        out = torch.bmm(probs, value.reshape(-1, length, value_dim))
        return out.reshape(-1, heads, seq, value_dim).transpose(1, 2).contiguous(), None

    return attention


FUSED_CACHE: contextvars.ContextVar[Any] = contextvars.ContextVar("hfexport_fused_cache", default=None)


def _pending_layer(module: Any, key: torch.Tensor) -> Any:
    """The cache layer whose new positions ``key`` are, left to this attention to write (fused mode), or None."""
    cache = FUSED_CACHE.get()
    index = getattr(module, "layer_idx", None)
    if cache is None or not isinstance(index, int) or not 0 <= index < len(cache.layers):
        return None
    layer = cache.layers[index]
    return layer if layer.pending is not None and layer.pending[0] is key else None


def _fusable(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: Any, mask: torch.Tensor) -> bool:
    """Whether ``hfexport::cache_attention`` computes this layer: one head size, whole query groups, a float32 or
    float16 cache (ONNX Runtime's CPU kernel), the mask over the whole capacity."""
    return (query.shape[-1] == key.shape[-1] == value.shape[-1] and query.shape[1] % key.shape[1] == 0
            and layer.keys.dtype in (torch.float32, torch.float16) and query.dtype == layer.keys.dtype
            and mask.shape[-1] == layer.keys.shape[2])


_ROTARY: contextvars.ContextVar[Any] = contextvars.ContextVar("hfexport_fused_rotary", default=None)


class FusedRotaryUnusable(RuntimeError):
    """The model's RoPE at a position is not its rotary table's row (a RoPE type that depends on more than the
    position): the fused attention then takes the query and keys rotated."""


class RotaryTables:
    """One forward's rotary tables (``[max_cache_len, head_dim / 2]``) and position ids, and what the model's
    ``apply_rotary_pos_emb`` rotated: by the rotated tensor, the tensor before and the ``cos``/``sin`` it used."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor):
        self.cos, self.sin, self.position_ids = cos, sin, position_ids
        self.sources: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def record(self, rotated: torch.Tensor, before: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.sources[id(rotated)] = (rotated, before, cos, sin)  # the rotated tensor is kept: its id stays its own

    def unrotated(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(query, key)`` before the model's RoPE when both went through one ``apply_rotary_pos_emb`` with cos/sin
        of the positions (checked on real tensors: raises :class:`FusedRotaryUnusable` where the table differs)."""
        q, k = self.sources.get(id(query)), self.sources.get(id(key))
        if q is None or k is None or q[0] is not query or k[0] is not key or q[2] is not k[2] or q[3] is not k[3]:
            return None
        cos, sin = q[2], q[3]
        if not torch.compiler.is_exporting():  # eager (the plan's probe, the verification's reference)
            table = (torch.cat((self.cos, self.cos), -1)[self.position_ids],
                     torch.cat((self.sin, self.sin), -1)[self.position_ids])
            if not (torch.equal(cos, table[0]) and torch.equal(sin, table[1])):
                raise FusedRotaryUnusable("the model's RoPE differs from its table at the same positions")
        return q[1], k[1]


def rotary_tables(model: torch.nn.Module, positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The model's RoPE ``cos``/``sin`` at positions ``0 .. positions - 1``, ``[positions, head_dim / 2]`` each, from
    its one rotary embedding module (transformers' ``...RotaryEmbedding(x, position_ids)``), or None: no such module
    or several, a RoPE type whose frequencies depend on the length (``dynamic``, ``longrope``), or halves that differ
    (an interleaved form)."""
    modules = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "inv_freq")]
    if len(modules) != 1 or getattr(modules[0], "rope_type", "default") in ("dynamic", "longrope"):
        return None
    with torch.no_grad():
        try:
            cos, sin = modules[0](torch.zeros((), dtype=dtype), torch.arange(positions)[None])
        except Exception:  # another signature
            return None
    half = cos.shape[-1] // 2
    if cos.dim() != 3 or not (torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])):
        return None
    return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()


@contextlib.contextmanager
def recording_rotary(model: torch.nn.Module, tables: RotaryTables) -> Any:
    """Have each ``apply_rotary_pos_emb`` of the model's attention modules record the query and key it rotates in
    ``tables`` (the transformers halves form, ``(q, k, cos, sin)`` with cos/sin ``[batch, seq, head_dim]``); restored
    after, also on error. The rotated values are still computed: a layer that attends another way uses them."""
    import sys

    modules = {sys.modules.get(type(m).__module__) for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)}
    patched = []
    for module in modules:
        original = getattr(module, "apply_rotary_pos_emb", None) if module is not None else None
        if not callable(original):
            continue

        def recording(q: Any, k: Any, cos: Any, sin: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            q_rotated, k_rotated = _original(q, k, cos, sin, *args, **kwargs)
            if not args and not kwargs and cos.dim() == 3 and cos.shape[-1] == q.shape[-1] == k.shape[-1]:
                tables.record(q_rotated, q, cos, sin)
                tables.record(k_rotated, k, cos, sin)
            return q_rotated, k_rotated

        module.apply_rotary_pos_emb = recording
        patched.append((module, original))
    token = _ROTARY.set(tables)
    try:
        yield
    finally:
        _ROTARY.reset(token)
        for module, original in patched:
            module.apply_rotary_pos_emb = original


class InPlaceCacheAttention(Protocol):
    """A runtime's fused kernel over a KV cache in a program's buffers (``RuntimeNeeds.attention`` of a
    backend whose cache is kept in place: :func:`hfexport_dynamo._cache_attention.llama_cache_attention`): writes ``key``/``value`` at ``start`` into the buffers and attends causally over the
    positions ``[0, start + i]`` for query row ``i``.

    Args: ``query [batch, heads, seq, dim]``, ``key``/``value [batch, kv_heads, seq, dim]`` (RoPE applied), the
    buffers ``[batch, max_cache_len, kv_heads, dim]`` (mutated), ``start`` (a SymInt), ``scale``.
    Returns: ``[batch, seq, heads, dim]``.
    """

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, start: Any, scale: float) -> torch.Tensor: ...


class FusedAttentionUnused(RuntimeError):
    """A layer's new keys and values reached no :func:`grouped_query_attention` (the model attends another way)."""


@contextlib.contextmanager
def grouped_sdpa() -> Any:
    """Route transformers' ``sdpa`` attention through :func:`grouped_query_attention` for the body (restored after,
    also on error)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had, before = "sdpa" in local, local.get("sdpa")
    ALL_ATTENTION_FUNCTIONS["sdpa"] = grouped_query_attention(ALL_ATTENTION_FUNCTIONS["sdpa"])
    try:
        yield
    finally:
        if had:
            local["sdpa"] = before
        else:
            del local["sdpa"]

