"""Generation: the one program a generative decoder runs (prefill and decode alike, over a KV cache of fixed
capacity that the runtime updates in place) and greedy decoding over it on any backend's runtime.

A decoder (``task="text-generation"``) is exported as one component, ``decoder``, of a :class:`CausalLMStep`:

* inputs: ``input_ids`` ``int64 [batch, seq]`` (the prompt, or a chunk of it, for a prefill; one token for a decode
  step), ``attention_mask`` ``int64 [batch, max_cache_len]`` (1 at every cached or new position that holds a real
  token, 0 at left padding and at positions not written yet), ``position_ids`` ``int64 [batch, seq]`` (when the
  model's forward takes them), ``past_length`` ``int64 []`` (the positions already in the cache; the new keys and
  values are written at ``past_length .. past_length + seq - 1``);
* output: ``logits`` ``float32 [batch, vocab]`` (the last position's).

The cache holds ``max_cache_len`` positions per layer, ``[batch, kv_heads, max_cache_len, head_dim]`` keys and values.
Where it lives depends on the runtime (``RuntimeNeeds.cache_layout`` of its exporter), and how it is read on
the runtime's fused kernel, if any (``RuntimeNeeds.attention``):

* as program inputs and outputs (ONNX, ``.pt2``): an input ``cache`` and an output ``cache``, ``((keys, values),
  ...)`` per layer. Where the backend lowers ``hfexport::cache_attention`` (ONNX: ONNX Runtime's
  ``GroupQueryAttention``), each layer's write and attention are that one op, which reads only the filled
  positions; otherwise the write is one ``ScatterND`` from the input to the output and attention reads the whole
  capacity under the mask. The ONNX Runtime runner binds each output to its input's memory
  (``manifest["components"]["decoder"]["onnx"]["in_place_outputs"]``), so nothing but the new positions is written;
* in the program's mutable buffers (ExecuTorch); the batch is then static (``max_batch``: the loop pads a smaller
  batch with copies of a row). With the runtime's in-place kernel (:class:`InPlaceCacheAttention`, ExecuTorch's
  ``llama::update_cache`` + ``llama::custom_sdpa``) at ``max_batch=1``: buffers ``[batch, max_cache_len, kv_heads,
  head_dim]``, causal attention over the filled positions without a padding mask (``generate`` runs a row without
  its left padding). Otherwise ``[batch * kv_heads, max_cache_len, head_dim]``, written with an ``index_put`` that
  ExecuTorch's re-inplace pass turns into ``index_put_``, and attention over the whole capacity under the mask.

Weights are stored once (one program), and a prompt longer than ``prefill_chunk`` tokens is prefilled in chunks
(the bound of the ``seq`` dim: ExecuTorch plans its memory for ``max_batch x prefill_chunk x max_cache_len``
attention scores). Attention folds a group's query heads into rows instead of repeating the cache per query head
(:func:`grouped_query_attention`).

:func:`generate` is the greedy loop; transformers supplies its logits processors (``_get_logits_processor``
from the stored generation config: repetition penalty, suppressed tokens, minimum length ...) and its stopping
criteria (``MaxLengthCriteria``, ``EosTokenCriteria``), and rows that reached EOS are padded exactly as
``model.generate(do_sample=False)`` pads them.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import InvalidInputError
from hfexport.trust import torch_dtype

from .. import _cache_attention  # noqa: F401  (registers hfexport::cache_attention)
from .decoding import (
    IMAGE_TEXT_TO_TEXT,
    MEDIA_TASKS,
    TASKS,
    TEXT_GENERATION,
    GenerationStats,
    check_prompt,
    generation_manifest,
    input_names,
    logits_processors,
    merged_generation_config,
    next_greedy,
    stopping_criteria,
    token_id_list,
)

__all__ = ["DECODER", "TASKS", "CausalLMStep", "GenerationStats", "InPlaceCacheAttention", "generate", "plan_task"]


DECODER = "decoder"  # the component name of a decoder's one program
DEFAULT_MAX_CACHE_LEN = 4096  # the cap of the default (the model's positions, else this)
SEQ2SEQ_DEFAULT_MAX_CACHE_LEN = 256  # encoder-decoders still export prefill + decode with a growing cache
DEFAULT_MAX_BATCH = 1
DEFAULT_PREFILL_CHUNK = 256
_STORED: Any = type("_Stored", (), {"__repr__": lambda self: "<the generation config's>"})()  # eos_token_id left out
# a decode step's value of a per-position decoder input (image-text-to-text: a new token is in no image block)
DECODE_STEP_VALUES = {"image_blocks": -1}
_TRACE_BATCH, _TRACE_PROMPT = 2, 6  # not 0 or 1: torch.export specializes those sizes


def _capacity_layer(keys: torch.Tensor, values: torch.Tensor, past_length: torch.Tensor, in_place: bool,
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


_FUSED_CACHE: contextvars.ContextVar[Any] = contextvars.ContextVar("hfexport_fused_cache", default=None)


def _pending_layer(module: Any, key: torch.Tensor) -> Any:
    """The cache layer whose new positions ``key`` are, left to this attention to write (fused mode), or None."""
    cache = _FUSED_CACHE.get()
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


class _RotaryTables:
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
def _recording_rotary(model: torch.nn.Module, tables: _RotaryTables) -> Any:
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
def _grouped_sdpa() -> Any:
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


class CausalLMStep(torch.nn.Module):
    """One forward of a decoder over a KV cache of ``max_cache_len`` positions: the ``decoder`` program.

    Args:
        model: a ``PreTrainedModel`` with a language-modeling head (``...ForCausalLM``).
        cache_shapes: per layer, the ``(keys, values)`` shapes ``[batch, kv_heads, max_cache_len, head_dim]``.
        dtype: the cache's dtype (the model's).
        in_buffers: keep the cache in this module's buffers (``cache_keys_<i>``, ``cache_values_<i>``, zeros,
            ``[batch * kv_heads, max_cache_len, head_dim]``), mutated in place, instead of taking it as the ``cache``
            input and returning it.
        fused_attention: what ``RuntimeNeeds.attention`` traces as (``_cache_attention.attention_for``). Without ``in_buffers``, ``True`` makes each layer's
            cache write and attention one ``hfexport::cache_attention`` node; with ``in_buffers``, an
            :class:`InPlaceCacheAttention` kernel writes and reads the buffers (then ``[batch, max_cache_len,
            kv_heads, head_dim]``). A forward raises :class:`FusedAttentionUnused` when a layer attends another way.
        fused_rotary: with ``fused_attention=True``, ``hfexport::cache_attention`` also applies the model's RoPE, from
            its tables at every cache position (buffers ``rotary_cos``/``rotary_sin``, :func:`rotary_tables`), to the
            query and keys the model's ``apply_rotary_pos_emb`` received. Off where the model has no such tables; a
            forward raises :class:`FusedRotaryUnusable` where its RoPE differs from them.

    Forward:
        input_ids: ``int64 [batch, seq]``.
        attention_mask: ``int64 [batch, max_cache_len]``, 1 at the cached and new positions that hold tokens.
        position_ids: ``int64 [batch, seq]`` (only when the model's forward takes them).
        past_length: ``int64 []``, the positions already cached (where the new ones are written).
        cache: ``((keys, values), ...)`` per layer (without ``in_buffers``).

    Returns:
        ``{"logits": float [batch, vocab] (last position)}``, and ``"cache"`` with the new positions written
        (without ``in_buffers``).

    Raises:
        hfexport.InvalidInputError: the model returned no cache (it was not loaded as a decoder).
    """

    def __init__(self, model: torch.nn.Module, cache_shapes: list[tuple[torch.Size, torch.Size]] | None = None,
                 dtype: torch.dtype = torch.float32, in_buffers: bool = False, fused_attention: Any = False,
                 fused_rotary: bool = False):
        super().__init__()
        # with in_buffers, a kernel (InPlaceCacheAttention) or nothing; otherwise a bool
        self.fused_attention = fused_attention if not in_buffers or callable(fused_attention) else False
        tables = None
        if fused_rotary and self.fused_attention is True and not in_buffers and cache_shapes:
            tables = rotary_tables(model, cache_shapes[0][0][2], dtype)
        self.fused_rotary = tables is not None
        if tables is not None:  # constants of the program: [max_cache_len, head_dim / 2]
            self.register_buffer("rotary_cos", tables[0], persistent=False)
            self.register_buffer("rotary_sin", tables[1], persistent=False)
        self.model = model
        self.config = model.config  # the tracer writes config.json and reads the model's facts from it
        self.takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
        self.in_buffers = in_buffers
        if in_buffers:
            for i, (key_shape, value_shape) in enumerate(cache_shapes or ()):
                if self.fused_attention:  # [batch, length, kv_heads, dim]: the kernel's layout
                    key_shape = (key_shape[0], key_shape[2], key_shape[1], key_shape[3])
                    value_shape = (value_shape[0], value_shape[2], value_shape[1], value_shape[3])
                else:  # [batch * kv_heads, length, dim]
                    key_shape = (key_shape[0] * key_shape[1], *key_shape[2:])
                    value_shape = (value_shape[0] * value_shape[1], *value_shape[2:])
                self.register_buffer(f"cache_keys_{i}", torch.zeros(key_shape, dtype=dtype), persistent=False)
                self.register_buffer(f"cache_values_{i}", torch.zeros(value_shape, dtype=dtype), persistent=False)
        self.cache_shapes = list(cache_shapes or ())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                past_length: torch.Tensor | None = None,
                cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None) -> dict[str, Any]:
        return self._step({"input_ids": input_ids}, attention_mask, position_ids, past_length, cache)

    def _step(self, tokens: dict[str, torch.Tensor], attention_mask: torch.Tensor, position_ids: torch.Tensor | None,
              past_length: torch.Tensor | None, cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None
              ) -> dict[str, Any]:
        """The forward of :meth:`forward`, with the new positions given as ``tokens``: ``{"input_ids": ...}`` or
        ``{"inputs_embeds": float [batch, seq, hidden]}`` (a subclass's forward names its first input)."""
        from transformers.cache_utils import Cache

        seq_len = next(iter(tokens.values())).shape[1]

        if self.in_buffers:
            cache = tuple((getattr(self, f"cache_keys_{i}"), getattr(self, f"cache_values_{i}"))
                          for i in range(len(self.cache_shapes)))
        past_length = torch.zeros((), dtype=torch.long) if past_length is None else past_length
        kv = Cache(layers=[_capacity_layer(k, v, past_length, self.in_buffers, shapes if self.in_buffers else None,
                                           fused=bool(self.fused_attention))
                           for (k, v), shapes in zip(cache, self.cache_shapes, strict=True)])
        if self.in_buffers and self.fused_attention:
            start = past_length.item()  # the kernel's start position, a SymInt bounded by the capacity
            torch._check(start >= 0)
            torch._check(start + seq_len <= self.cache_shapes[0][0][2])
            for layer in kv.layers:
                layer.kernel, layer.start = self.fused_attention, start
        extra = {"position_ids": position_ids} if self.takes_position_ids else {}
        token = _FUSED_CACHE.set(kv if self.fused_attention else None)
        rotary = contextlib.nullcontext()
        if self.fused_rotary and position_ids is not None:
            rotary = _recording_rotary(self.model, _RotaryTables(self.rotary_cos, self.rotary_sin, position_ids))
        try:
            with _grouped_sdpa(), rotary:
                out = self.model(**tokens, attention_mask=attention_mask, cache=kv, use_cache=True,
                                 logits_to_keep=1, **extra)
        finally:
            _FUSED_CACHE.reset(token)
        unwritten = [i for i, layer in enumerate(kv.layers) if layer.pending is not None]
        if unwritten:
            raise FusedAttentionUnused(f"layers {unwritten} of {type(self.model).__name__} attend without "
                                       "transformers' sdpa attention function; export without fused_attention")
        result = {"logits": out.logits[:, -1, :]}
        if not self.in_buffers:
            result["cache"] = tuple((layer.keys, layer.values) for layer in kv.layers)
        return result


def _probe_cache(model: torch.nn.Module, tokens: dict[str, torch.Tensor], mask: torch.Tensor,
                 takes_position_ids: bool) -> list[tuple[torch.Size, torch.Size]]:
    """The per-layer ``(keys, values)`` shapes of one eager forward with a ``DynamicCache`` (so that models with
    their own head dims or layer kinds report theirs); ``tokens``: ``{"input_ids": ...}`` or ``{"inputs_embeds":
    ...}``."""
    from transformers import DynamicCache

    extra = {"position_ids": positions_from_mask(mask)} if takes_position_ids else {}
    with torch.no_grad():
        out = model(**tokens, attention_mask=mask, cache=DynamicCache(config=model.config), use_cache=True,
                    logits_to_keep=1, **extra)
    if getattr(out, "cache", None) is None:  # e.g. BertLMHeadModel without config.is_decoder
        raise InvalidInputError(f"{type(model).__name__} returned no KV cache with use_cache=True, so "
                                "it cannot generate step by step: load it as a decoder (config.is_decoder=True "
                                "for BERT-like models) or export it without a task")
    return [(layer.keys.shape, layer.values.shape) for layer in out.cache.layers]


# ── planning ────────────────────────────────────────────────────────────────────────────────────────────
def _refuse(model: Any, task: str, why: str, instead: str) -> InvalidInputError:
    return InvalidInputError(f"{type(model).__name__} cannot be exported for task {task!r}: {why}; {instead}")


def _check_generative(model: Any, task: str) -> None:
    from transformers import GenerationMixin

    config = getattr(model, "config", None)
    if config is None:
        raise _refuse(model, task, "it has no Transformers config", "export a PreTrainedModel")
    is_seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    if not isinstance(model, GenerationMixin):
        raise _refuse(model, task, "it has no language-modeling head (it is not a GenerationMixin)",
                      "load it with AutoModelForCausalLM (decoders) or AutoModelForSeq2SeqLM (encoder-decoders)")
    if task == TEXT_GENERATION and is_seq2seq:
        raise _refuse(model, task, "it is an encoder-decoder", "export it with task='text2text-generation' "
                      "(or 'automatic-speech-recognition' for speech)")
    if task != TEXT_GENERATION and not is_seq2seq:
        raise _refuse(model, task, "it is a decoder without an encoder", "export it with task='text-generation'")


def _bounds(model: Any, max_cache_len: int | None, max_batch: int | None, *,
            default_cap: int = DEFAULT_MAX_CACHE_LEN) -> tuple[int, int]:
    """``(max_cache_len, max_batch)`` checked against the model: the default length is the model's positions
    (``max_position_embeddings``), capped at ``default_cap`` and at a sliding window."""
    config = model.config.get_text_config(decoder=True)
    positions = (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
                 or getattr(config, "max_target_positions", None))  # Whisper's decoder
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = bool(window) and ("sliding_attention" in layer_types or getattr(config, "use_sliding_window", True))
    if max_cache_len is None:
        max_cache_len = min(positions or default_cap, default_cap, *((window,) if sliding else ()))
    max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    for name, value, least in (("max_cache_len", max_cache_len, _TRACE_PROMPT + 2), ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if positions and max_cache_len > positions:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the model's {positions} positions "
                         "(max_position_embeddings): lower it")
    if sliding and window < max_cache_len:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the sliding window ({window} tokens), past "
                         "which the cache rolls over: export with max_cache_len <= sliding_window")
    return max_cache_len, max_batch


def _prompt(model: Any, inputs: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill's example ``input_ids`` and ``attention_mask`` (the user's, or seeded ones from the config)."""
    if inputs is not None:
        if not isinstance(inputs, Mapping) or not isinstance(inputs.get("input_ids"), torch.Tensor):
            raise InvalidInputError("a text-generation export takes inputs={'input_ids': LongTensor[batch, prompt], "
                                    "'attention_mask': ...} (the prompt to trace with), or none")
        ids = inputs["input_ids"]
        return ids, inputs.get("attention_mask", torch.ones_like(ids))
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3 if vocab > 3 else 0, vocab, (_TRACE_BATCH, _TRACE_PROMPT), generator=generator)
    return ids, torch.ones_like(ids)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded prompt, as transformers' generate makes them (0 at padding)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def plan_task(model: Any, task: str, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
              max_batch: int | None = None, prefill_chunk: int | None = None, max_images: int | None = None,
              stateful: bool = False, fused_cache_attention: Any = False) -> Any:
    """The components to export for ``task``: for ``"text-generation"``, the one ``decoder`` program of a
    :class:`CausalLMStep` (see the module docstring for its inputs, outputs, cache and dynamic dims).

    Args:
        model: a Transformers model with a generation head.
        task: one of :data:`TASKS`.
        inputs: an example prompt (``input_ids``, ``attention_mask``); default: 2 x 6 seeded tokens.
        max_cache_len: the most positions a sequence may hold, prompt and new tokens: the cache's capacity
            (default: ``max_position_embeddings``, capped at 4,096 and at a sliding window).
        max_batch: the largest batch (default 1).
        prefill_chunk: the most tokens one call takes, the bound of the ``seq`` dim (default
            ``min(256, max_cache_len)``); a longer prompt is prefilled in chunks of this size.
        max_images: an option of ``"image-text-to-text"`` only (refused here), whose programs
            :func:`hfexport_dynamo._image_text.plan_image_text` plans.
        stateful: the backend's runtime keeps a program's mutated buffers between calls
            (``RuntimeNeeds(cache_layout="in_place")``): the cache then lives in the program's buffers and the batch is static.
        fused_cache_attention: ``_cache_attention.attention_for(RuntimeNeeds.attention)``: ``True``, the backend lowers
            ``hfexport::cache_attention`` (each layer's cache write and attention are traced as that one op); with
            ``stateful``, an :class:`InPlaceCacheAttention`, the runtime's kernel over the cache buffers (used at
            ``max_batch=1``: it attends causally without a padding mask). Either applies where the model's attention
            allows it (checked by one eager forward; otherwise the write and the attention stay apart).

    Raises:
        ValueError: an unknown task (lists them), or bounds the model cannot take (says which).
        hfexport.InvalidInputError: the model cannot generate (says why and what to load instead).
    """
    from hfexport.plugin import TaskPlan

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if task in MEDIA_TASKS:  # its own module plans it (it builds on this one's decoder)
        raise ValueError(f"task {task!r} is planned by hfexport_dynamo.tasks.image_text.plan_image_text (the tracer's "
                         "plan_task calls it)")
    if max_images is not None:
        raise TypeError(f"max_images is an option of task {IMAGE_TEXT_TO_TEXT!r}, not of {task!r}")
    _check_generative(model, task)
    if task != TEXT_GENERATION:
        from .seq2seq import plan_seq2seq

        return plan_seq2seq(model, task, inputs,
                            *_bounds(model, max_cache_len, max_batch, default_cap=SEQ2SEQ_DEFAULT_MAX_CACHE_LEN))
    max_cache_len, max_batch = _bounds(model, max_cache_len, max_batch)
    prefill_chunk = check_prefill_chunk(prefill_chunk, max_cache_len)
    ids, mask = _prompt(model, inputs)
    if inputs is not None and ids.shape[0] > max_batch:
        raise InvalidInputError(f"the example prompt has a batch of {ids.shape[0]}, beyond max_batch={max_batch}")
    component, cache = plan_decoder(model, ids, mask, max_cache_len=max_cache_len, max_batch=max_batch,
                                    prefill_chunk=prefill_chunk, stateful=stateful,
                                    fused_cache_attention=fused_cache_attention)
    manifest = generation_manifest(model, max_cache_len, max_batch, len(cache["row_shapes"]))
    manifest.update(prefill_chunk=prefill_chunk, cache=cache)
    return TaskPlan(task, [component], manifest={"generation": manifest}, model=model)


def check_prefill_chunk(prefill_chunk: int | None, max_cache_len: int) -> int:
    """``prefill_chunk`` checked (default ``min(256, max_cache_len)``).

    Raises:
        ValueError: not an int from 2 to ``max_cache_len``.
    """
    prefill_chunk = min(DEFAULT_PREFILL_CHUNK, max_cache_len) if prefill_chunk is None else prefill_chunk
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or not 2 <= prefill_chunk <= max_cache_len:
        raise ValueError(f"prefill_chunk must be an int from 2 to max_cache_len={max_cache_len}, got {prefill_chunk!r}")
    return prefill_chunk


def plan_decoder(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, max_cache_len: int, max_batch: int,
                 prefill_chunk: int, stateful: bool = False, fused_cache_attention: Any = False,
                 embed: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None,
                 step_class: type[CausalLMStep] = CausalLMStep,
                 position_rows: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The ``decoder`` component of a generation task and its manifest's ``cache`` section (see :func:`plan_task`
    for the arguments; ``ids``/``mask`` are the example prompt, ``[batch, prompt]``).

    ``embed`` (with a ``step_class`` whose forward takes what it returns, as the image-text-to-text decoder's): the
    program takes ``embed(ids)``'s inputs instead of ``input_ids`` (``inputs_embeds`` ``float [batch, seq, hidden]``,
    and per-position inputs such as ``token_type_ids`` ``int64 [batch, seq]``), each with the ``batch`` and ``seq``
    dims; everything else (mask, positions, cache, dims) is the text decoder's. ``position_rows``: the program's
    ``position_ids`` are ``int64 [position_rows, batch, seq]`` (Qwen2-VL's 3-D RoPE positions), not ``[batch, seq]``.
    """
    from torch.export import Dim

    from hfexport.plugin import ComponentPlan

    # torch.export specializes a dim of size 1: trace a batch of 2 (a batch of 1 is static), a chunk of >= 2
    rows = 1 if max_batch == 1 else (max_batch if stateful else 2)
    ids, mask = (t[:1].repeat(rows, 1) if t.shape[0] < rows else t[:rows] for t in (ids, mask))
    ids, mask = ids[:, -min(prefill_chunk, ids.shape[1]):], mask[:, -min(prefill_chunk, ids.shape[1]):]
    if ids.shape[1] < 2:
        ids, mask = ids.repeat(1, 2), mask.repeat(1, 2)
    takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
    shapes = [(torch.Size((rows, k[1], max_cache_len, k[3])), torch.Size((rows, v[1], max_cache_len, v[3])))
              for k, v in _probe_cache(model, _tokens(ids, embed), mask, takes_position_ids)]
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    prompt = ids.shape[1]
    full_mask = torch.zeros(rows, max_cache_len, dtype=torch.long)
    full_mask[:, :prompt] = mask
    example: dict[str, Any] = {**_tokens(ids, embed), "attention_mask": full_mask}
    if takes_position_ids:
        example["position_ids"] = positions_from_mask(mask)
        if position_rows:
            example["position_ids"] = example["position_ids"][None].repeat(position_rows, 1, 1)
    example["past_length"] = torch.tensor(0)
    if not stateful:
        example["cache"] = tuple((torch.zeros(k, dtype=dtype), torch.zeros(v, dtype=dtype)) for k, v in shapes)
    attends_by_sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"  # grouped_query_attention's
    # a runtime's in-place kernel computes causal attention without a padding mask: a static batch of one row
    in_place_kernel = stateful and callable(fused_cache_attention) and rows == 1 and max_batch == 1
    step = None
    if fused_cache_attention and attends_by_sdpa and (in_place_kernel or not stateful):
        # RoPE in the fused op where the model's tables give it (tables of 1-D positions: not 3-D ones), else before
        for fused_rotary in (False,) if position_rows else (True, False):
            fused = step_class(model, shapes, dtype, in_buffers=stateful, fused_attention=fused_cache_attention,
                               fused_rotary=fused_rotary)
            try:  # a layer that attends another way (its own attention code) sees only the new positions: fail here
                with torch.no_grad():
                    fused(**example)
                step = fused
                for name, buffer in step.named_buffers(recurse=False):  # the probe wrote the cache buffers
                    if name.startswith("cache_"):
                        buffer.zero_()
                break
            except FusedRotaryUnusable:
                continue
            except Exception:  # the plain write and attention are exported instead (and raise what they raise)
                break
    if step is None:
        step = step_class(model, shapes, dtype, in_buffers=stateful)

    batch = {0: Dim("batch", min=1, max=max_batch)} if rows > 1 and not stateful else {}
    seq = Dim("seq", min=1, max=prefill_chunk)
    dynamic_shapes: dict[str, Any] = {**{name: {**batch, 1: seq} for name in _tokens(ids[:, :1], embed)},
                                      "attention_mask": dict(batch) or None}
    if takes_position_ids:
        dynamic_shapes["position_ids"] = {**({1: batch[0]} if batch else {}), 2: seq} if position_rows else \
            {**batch, 1: seq}
    dynamic_shapes["past_length"] = None
    if not stateful:
        dynamic_shapes["cache"] = tuple((dict(batch) or None, dict(batch) or None) for _ in shapes)
    # row_shapes: per layer, the (keys, values) shape of one batch row, [kv_heads, max_cache_len, head_dim]
    kernel = stateful and bool(step.fused_attention)
    layout = "[batch, max_cache_len, kv_heads, head_dim]" if kernel else "[batch, kv_heads, max_cache_len, head_dim]"
    # ignores_padding: causal attention over the filled positions without a mask (generate trims a row's padding)
    cache = {"layout": layout, "in_program_buffers": stateful,
             "static_batch": stateful or rows == 1, "dtype": str(dtype).removeprefix("torch."),
             "fused_attention": bool(step.fused_attention), "fused_rotary": step.fused_rotary,
             "ignores_padding": kernel,
             "row_shapes": [[list(k[1:]), list(v[1:])] for k, v in shapes]}
    return ComponentPlan(DECODER, step, example, dynamic_shapes), cache


def _tokens(ids: torch.Tensor, embed: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None
            ) -> dict[str, torch.Tensor]:
    if embed is None:
        return {"input_ids": ids}
    with torch.no_grad():
        return embed(ids)


# ── greedy decoding ─────────────────────────────────────────────────────────────────────────────────────


def generate(exported: Any, input_ids: Any, attention_mask: Any = None, *, max_new_tokens: int | None = None,
             eos_token_id: Any = _STORED, pad_token_id: int | None = None,
             **generation_options: Any) -> torch.Tensor:
    """Greedy decoding over an artifact's exported programs, on its backend's runtime.

    Matches ``model.generate(input_ids, attention_mask=..., do_sample=False, max_new_tokens=...)`` token for
    token: the stored generation config with these arguments applied, transformers' logits processors, a row
    that produced EOS continues with ``pad_token_id`` and generation stops when every row has.

    Args:
        exported: an :class:`~hfexport.ExportedModel` exported with a generative task.
        input_ids: ``int64 [batch, prompt]``, left-padded (decoders); the encoder's input for an encoder-decoder
            (``input_features`` ``float [batch, mels, frames]`` for speech).
        attention_mask: ``int64 [batch, prompt]``, 0 at padding (default: ones).
        max_new_tokens: the number of tokens to generate (required).
        eos_token_id: the id(s) that end a row (default: the generation config's; ``None`` never stops early).
        pad_token_id: the id written after a row's EOS (default: the generation config's, else the first EOS).
        **generation_options: other ``GenerationConfig`` fields (``min_new_tokens``, ``repetition_penalty``).

    Returns:
        ``int64 [batch, prompt + new]`` (decoders) or ``[batch, 1 + new]`` decoder ids (encoder-decoders). The
        timings are in ``exported.generation_stats`` (:class:`GenerationStats`).

    Raises:
        ValueError: no ``max_new_tokens``, sampling or beams asked for, prompt plus new tokens beyond
            ``max_cache_len``, a batch beyond ``max_batch``, or an EOS or pad id outside the vocabulary (each
            names the bound), before any program runs.
        TypeError: ``input_ids`` is not an integer tensor of rank 2, or an option is no ``GenerationConfig`` field.
    """
    section = exported.manifest["generation"]
    options = dict(generation_options)  # an option passed as None sets it to None, as in model.generate
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    if pad_token_id is not None:
        options["pad_token_id"] = pad_token_id
    if eos_token_id is not _STORED:
        options["eos_token_id"] = eos_token_id
    task = exported.manifest.get("task")
    media = {}
    if task in MEDIA_TASKS:  # the image or audio inputs, not GenerationConfig fields
        inputs = section["audio" if "audio" in section else "vision"]["inputs"]
        media = {name: options.pop(name) for name in list(options) if name in inputs}
    config = merged_generation_config(section, options)
    if task not in (TEXT_GENERATION, *MEDIA_TASKS):
        from .seq2seq import generate_seq2seq

        return generate_seq2seq(exported, input_ids, attention_mask, config, section)
    input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, section)
    prompt_embeds = embed_tokens = None
    per_position: dict[str, torch.Tensor] = {}
    encode_s = 0.0
    if task in MEDIA_TASKS:  # images or audio checked before any program runs, encoded, merged into the prompt
        from .image_prompt import audio_prompt, image_prompt

        start = time.perf_counter()
        prompt_embeds, embed_tokens, per_position = (audio_prompt if "audio" in section else image_prompt)(
            exported, section, input_ids, attention_mask, media)
        encode_s = time.perf_counter() - start
    padding = None
    if section["cache"].get("ignores_padding"):  # a kernel without a padding mask: run the row without its padding
        padding, input_ids, attention_mask = _split_left_padding(input_ids, attention_mask)
        if prompt_embeds is not None:
            prompt_embeds = prompt_embeds[:, padding.shape[1]:]
            per_position = {k: v[..., padding.shape[1]:] for k, v in per_position.items()}
    eos = token_id_list(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    processors = logits_processors(config, section, input_ids.shape[1], None, attention_mask)
    criteria = stopping_criteria(input_ids.shape[1] + config.max_new_tokens, eos)

    sequences, prefill_s, decode_s, steps, ends = _greedy(exported, section, input_ids, attention_mask, processors,
                                                           criteria, pad, prompt_embeds, embed_tokens, per_position)
    if padding is not None:
        sequences, input_ids = torch.cat([padding, sequences], -1), torch.cat([padding, input_ids], -1)
    exported.generation_stats = GenerationStats(
        **({"encode_s": encode_s} if task in MEDIA_TASKS else {}),
        prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps, new_tokens=sequences.shape[1] - input_ids.shape[1],
        decode_tokens_per_s=steps * input_ids.shape[0] / decode_s if decode_s > 0 and steps else float("nan"),
        decode_step_s=[b - a for a, b in zip(ends, ends[1:], strict=False)])
    return sequences


def _split_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(padding ids, ids, mask)`` of a one-row prompt: the leading masked positions split off. A row's tokens
    attend exactly as eager's (padding is masked out there, and positions count tokens only).

    Raises:
        ValueError: the mask hides a position after the first token (not left padding).
    """
    width = int((attention_mask[0].cumsum(-1) == 0).sum())
    if not bool(attention_mask[0, width:].all()):
        raise ValueError("this export attends causally without a padding mask (ExecuTorch's fused attention, "
                         "max_batch=1): attention_mask may only hide left padding, and it hides positions after the "
                         "first token; pass such a prompt without them")
    return input_ids[:, :width], input_ids[:, width:], attention_mask[:, width:]


def new_cache(section: Mapping[str, Any], batch: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """A zeroed cache for the ``decoder`` program's ``cache`` input: per layer ``(keys, values)``, each
    ``[batch, kv_heads, max_cache_len, head_dim]`` of the manifest's ``generation.cache.dtype``."""
    layout = section["cache"]
    dtype = torch_dtype(layout["dtype"])
    if dtype is None:
        raise ValueError(f"the manifest's generation.cache.dtype {layout['dtype']!r} is not a torch dtype")
    return tuple((torch.zeros((batch, *k), dtype=dtype), torch.zeros((batch, *v), dtype=dtype))
                 for k, v in layout["row_shapes"])


def _greedy(exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor, attention_mask: torch.Tensor,
            processors: Any, criteria: Any, pad: int | None, prompt_embeds: torch.Tensor | None = None,
            embed_tokens: Callable[[torch.Tensor], torch.Tensor] | None = None,
            per_position: Mapping[str, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, float, float, int, list[float]]:
    """The prefill (in chunks of ``prefill_chunk``) and decode steps over the ``decoder`` program; returns the
    sequences, the prefill and decode seconds, the number of decode steps and the clock at the end of each.

    With ``prompt_embeds`` (``[batch, prompt, hidden]``, a decoder that takes ``inputs_embeds``), the prefill feeds
    them and each decode step feeds ``embed_tokens(ids)`` of the new ids (``[batch, 1]`` -> ``[batch, 1, hidden]``).
    ``per_position``: more inputs ``[batch, prompt]`` (``image_blocks``), sliced with the prefill's chunks; at the
    decode steps, :data:`DECODE_STEP_VALUES` (else 0). Its ``position_ids`` ``[rows, batch, prompt]`` (Qwen2-VL's
    3-D RoPE positions), if any, replace the positions counted from the mask; each decode step's are then the
    prompt's largest position plus the steps, in every row (as the model's ``rope_deltas`` make them)."""
    names = input_names(exported, DECODER)
    rows, prompt = input_ids.shape
    per_position = dict(per_position or {})
    positions = per_position.pop("position_ids", None)
    if positions is None:
        positions = positions_from_mask(attention_mask)
    batch = section["max_batch"] if section["cache"]["static_batch"] else rows
    if batch > rows:  # a static batch: the extra rows repeat the last one, and their tokens are dropped
        input_ids = torch.cat([input_ids, input_ids[-1:].expand(batch - rows, -1)])
        attention_mask = torch.cat([attention_mask, attention_mask[-1:].expand(batch - rows, -1)])
        if prompt_embeds is not None:
            prompt_embeds = torch.cat([prompt_embeds, prompt_embeds[-1:].expand(batch - rows, -1, -1)])
        per_position = {k: torch.cat([v, v[-1:].expand(batch - rows, -1)]) for k, v in per_position.items()}
        positions = torch.cat([positions, positions[..., -1:, :].expand(*positions.shape[:-2], batch - rows, -1)],
                              -2)
    step_zeros = {k: torch.full((batch, 1), DECODE_STEP_VALUES.get(k, 0), dtype=v.dtype)  # the decode steps'
                  for k, v in per_position.items()}
    token_name = "input_ids" if prompt_embeds is None else "inputs_embeds"
    prompt_tokens = input_ids if prompt_embeds is None else prompt_embeds
    mask = torch.zeros(batch, section["max_cache_len"], dtype=torch.long)
    mask[:, :prompt] = attention_mask
    cache = new_cache(section, batch) if "cache" in names else None
    chunk = section["prefill_chunk"]

    past_length = torch.zeros((), dtype=torch.long)
    runner = exported.components[DECODER].runner
    rerun: Callable[[], list[Any]] | None = None  # the runner's repeat of the last decode step, once one ran
    logits_leaf = 0

    def step(ids: torch.Tensor, position_ids: torch.Tensor, past: int, decoding: bool = False,
             extra: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        nonlocal cache, rerun, logits_leaf
        past_length.fill_(past)
        if rerun is not None:
            return rerun()[logits_leaf][:rows]
        feed = {token_name: ids, **(extra or {}), "attention_mask": mask, "position_ids": position_ids,
                "past_length": past_length, "cache": cache}
        out = exported.run(DECODER, **{k: v for k, v in feed.items() if k in names})
        returned = out.get("cache", cache)
        if (decoding and hasattr(runner, "rerun") and returned is not None
                and all(a is b for a, b in zip(pytree.tree_leaves(returned), pytree.tree_leaves(cache), strict=True))):
            # a decode step whose cache was written in place: the next ones feed the same tensors (ids, position,
            # mask, past length, cache), updated in place, so the runner repeats this run without the checks and
            # flattening of exported.run
            rerun = runner.rerun
            logits_leaf = next(i for i, leaf in enumerate(pytree.tree_leaves(out)) if leaf is out["logits"])
        cache = returned
        return out["logits"][:rows]

    # the decode steps' inputs are updated in place: a runner that binds its inputs (ONNX Runtime's IO binding)
    # binds the cache, the mask and these once
    with getattr(runner, "reusing_bindings", contextlib.nullcontext)():
        start = time.perf_counter()
        for past in range(0, prompt, chunk):
            logits = step(prompt_tokens[:, past:past + chunk], positions[..., past:past + chunk], past,
                          extra={k: v[..., past:past + chunk] for k, v in per_position.items()})
        prefill_s = time.perf_counter() - start
        sequences, unfinished, steps = input_ids[:rows], torch.ones(rows, dtype=torch.bool), 0
        position, past = positions[:, -1:].clone(), prompt
        if positions.dim() == 3:  # [rows, batch, 1]: each row of the next position is the prompt's largest + 1
            position = positions.amax((0, 2), keepdim=True).expand_as(positions[..., -1:]).clone()
        ids = torch.zeros(batch, 1, dtype=torch.long)
        token_embeds = None  # the decode steps' inputs_embeds, written in place (a runner may have bound them)
        start = time.perf_counter()
        step_ends = [start]
        while True:  # stopping_criteria ends it: max length, or every row at EOS
            sequences, next_tokens = next_greedy(sequences, logits, processors, criteria, unfinished, pad)
            if not bool(unfinished.any()):
                break
            mask[:, past] = 1
            position += 1
            ids[:rows, 0] = next_tokens
            if batch > rows:
                ids[rows:, 0] = next_tokens[-1]  # a static batch's extra rows repeat the last one
            if embed_tokens is None:
                logits = step(ids, position, past, decoding=True)
            else:
                embeds = embed_tokens(ids)
                token_embeds = embeds.clone() if token_embeds is None else token_embeds.copy_(embeds)
                logits = step(token_embeds, position, past, decoding=True, extra=step_zeros)
            past, steps = past + 1, steps + 1
            step_ends.append(time.perf_counter())
    return sequences, prefill_s, time.perf_counter() - start, steps, step_ends


