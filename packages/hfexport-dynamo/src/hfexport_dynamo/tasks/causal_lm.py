"""``task="text-generation"``: the one program a generative decoder runs (prefill and decode alike, over a KV cache
of fixed capacity that the runtime updates in place), its plan, and how the greedy loop runs it.

A decoder is exported as one component, ``decoder``, of a :class:`CausalLMStep`:

* inputs: ``input_ids`` ``int64 [batch, seq]`` (the prompt, or a chunk of it, for a prefill; one token for a decode
  step), ``attention_mask`` ``int64 [batch, max_cache_len]`` (1 at every cached or new position that holds a real
  token, 0 at left padding and at positions not written yet), ``position_ids`` ``int64 [batch, seq]`` (when the
  model's forward takes them), ``past_length`` ``int64 []`` (the positions already in the cache; the new keys and
  values are written at ``past_length .. past_length + seq - 1``);
* output: ``logits`` ``float32 [batch, vocab]`` (the last position's).

The cache holds ``max_cache_len`` positions per layer, as the program's inputs and outputs or in its buffers, as
the backend's ``RuntimeNeeds`` ask (:mod:`hfexport_dynamo.tasks.kv_cache`). Weights are stored once (one program),
and a prompt longer than ``prefill_chunk`` tokens is prefilled in chunks (the bound of the ``seq`` dim: ExecuTorch
plans its memory for ``max_batch x prefill_chunk x max_cache_len`` attention scores).

At generate time, :class:`DecoderPrograms` is how the one greedy loop (:mod:`hfexport_dynamo.tasks.decoding`) runs
the program: the prompt in chunks, then one token per step; the mask, positions, past length and cache carried
from call to call. The image- and audio-text decoders (:mod:`hfexport_dynamo.tasks.image_text`) are this program
on ``inputs_embeds``, run the same way.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import InvalidInputError
from hfexport.trust import torch_dtype

from .decoding import GenerationStats, GreedyRun, check_prompt, input_names
from .kv_cache import (
    FUSED_CACHE,
    FusedAttentionUnused,
    FusedRotaryUnusable,
    RotaryTables,
    capacity_layer,
    grouped_sdpa,
    linear_attention_patches,
    probe_cache,
    recording_rotary,
    rotary_tables,
    state_layer,
    step_cache,
)
from .names import DECODER, TEXT_GENERATION
from .planning import (
    check_generative,
    check_prefill_chunk,
    checked_bounds,
    example_prompt,
    generation_manifest,
    positions_from_mask,
)

__all__ = ["CausalLMStep", "DecoderPrograms", "decoder_run", "new_cache", "plan_causal_lm", "plan_decoder",
           "prepare_decoder"]

# a decode step's value of a per-position decoder input (image-text-to-text: a new token is in no image block)
DECODE_STEP_VALUES = {"image_blocks": -1}


class CausalLMStep(torch.nn.Module):
    """One forward of a decoder over a KV cache of ``max_cache_len`` positions: the ``decoder`` program.

    Args:
        model: a ``PreTrainedModel`` with a language-modeling head (``...ForCausalLM``).
        cache_shapes: per layer, the ``(keys, values)`` shapes ``[batch, kv_heads, max_cache_len, head_dim]``.
        dtype: the cache's dtype (the model's).
        in_buffers: keep the cache in this module's buffers (``cache_keys_<i>``, ``cache_values_<i>``, zeros,
            ``[batch * kv_heads, max_cache_len, head_dim]``), mutated in place, instead of taking it as the ``cache``
            input and returning it.
        fused_attention: what ``RuntimeNeeds.attention`` traces as (``_cache_attention.attention_for``). Without
            ``in_buffers``, ``True`` makes each layer's cache write and attention one ``hfexport::cache_attention``
            node; with ``in_buffers``, an :class:`~hfexport_dynamo.tasks.kv_cache.InPlaceCacheAttention` kernel writes
            and reads the buffers (then ``[batch, max_cache_len, kv_heads, head_dim]``). A forward raises
            :class:`FusedAttentionUnused` when a layer attends another way.
        fused_rotary: with ``fused_attention=True``, ``hfexport::cache_attention`` also applies the model's RoPE, from
            its tables at every cache position (buffers ``rotary_cos``/``rotary_sin``, :func:`rotary_tables`), to the
            query and keys the model's ``apply_rotary_pos_emb`` received. Off where the model has no such tables; a
            forward raises :class:`FusedRotaryUnusable` where its RoPE differs from them.
        growing: the cache grows with the sequence (``RuntimeNeeds(cache_layout="growing")``): the ``cache`` input
            holds ``[batch, kv_heads, past, head_dim]`` per layer (any ``past``, 0 included) and the output
            ``past + seq`` positions; ``attention_mask`` is ``int64 [batch, past + seq]``; there is no
            ``past_length``; attention is the model's own ``sdpa``; ``logits`` is ``[batch, 1, vocab]`` (the layout
            OpenVINO GenAI reads). ``cache_shapes`` is then unused.

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

    # the layers whose cache is a linear-attention layer's state: ``(conv_state [batch, channels, kernel],
    # recurrent_state)``, carried whole (kv_cache.state_layer); the recurrent state is ``[batch, heads, key_dim,
    # value_dim]`` in recurrent_layers (Qwen3-Next's gated delta rule), ``[batch, 1]`` unused otherwise (LFM2's
    # conv layers); set by plan_decoder
    state_layers: frozenset[int] = frozenset()
    recurrent_layers: frozenset[int] = frozenset()
    prefill_chunk = 1  # the bound of the seq dim, to which recurrent_layers' chunked rule pads (set by plan_decoder)
    # the patches of scope "dynamo.text_generation" that the forward leaves out (kv_cache.linear_attention_patches):
    # the export's disable=, set by the capture (stage 2)
    disabled_patches: tuple[str, ...] = ()

    def __init__(self, model: torch.nn.Module, cache_shapes: list[tuple[torch.Size, torch.Size]] | None = None,
                 dtype: torch.dtype = torch.float32, in_buffers: bool = False, fused_attention: Any = False,
                 fused_rotary: bool = False, growing: bool = False):
        super().__init__()
        self.growing_cache = growing
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
        # the token ids and search defaults a backend writes for its deployment engine (ORT GenAI's genai_config.json)
        self.generation_config = getattr(model, "generation_config", None)
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
        seq_len = next(iter(tokens.values())).shape[1]
        if self.growing_cache:
            from .growing_cache import growing_forward  # only a growing cache's step reads growing_cache.py

            return growing_forward(self, tokens, attention_mask, position_ids, cache)

        past_length = torch.zeros((), dtype=torch.long) if past_length is None else past_length
        if self.in_buffers:
            cache = tuple(self._held_states(i, past_length) if i in self.state_layers else
                          (getattr(self, f"cache_keys_{i}"), getattr(self, f"cache_values_{i}"))
                          for i in range(len(self.cache_shapes)))
        kv = step_cache([state_layer(k, v, i in self.recurrent_layers) if i in self.state_layers else
                         capacity_layer(k, v, past_length, self.in_buffers, shapes if self.in_buffers else None,
                                        fused=bool(self.fused_attention))
                         for i, ((k, v), shapes) in enumerate(zip(cache, self.cache_shapes, strict=True))])
        if self.in_buffers and self.fused_attention:
            start = past_length.item()  # the kernel's start position, a SymInt bounded by the capacity
            torch._check(start >= 0)
            torch._check(start + seq_len <= self.cache_shapes[0][0][2])
            for layer in kv.layers:
                layer.kernel, layer.start = self.fused_attention, start
        extra = {"position_ids": position_ids} if self.takes_position_ids else {}
        token = FUSED_CACHE.set(kv if self.fused_attention else None)
        rotary = contextlib.nullcontext()
        carried = linear_attention_patches(attention_mask, past_length, self.prefill_chunk, self.disabled_patches) \
            if self.state_layers else contextlib.nullcontext()
        if self.fused_rotary and position_ids is not None:
            rotary = recording_rotary(self.model, RotaryTables(self.rotary_cos, self.rotary_sin, position_ids))
        try:
            with grouped_sdpa(), rotary, carried:
                out = self.model(**tokens, attention_mask=attention_mask, cache=kv, use_cache=True,
                                 logits_to_keep=1, **extra)
        finally:
            FUSED_CACHE.reset(token)
        unwritten = [i for i, layer in enumerate(kv.layers) if getattr(layer, "pending", None) is not None]
        if unwritten:
            raise FusedAttentionUnused(f"layers {unwritten} of {type(self.model).__name__} attend without "
                                       "transformers' sdpa attention function; export without fused_attention")
        result = {"logits": out.logits[:, -1, :]}
        for i in self.state_layers if self.in_buffers else ():  # the new states written into their buffers
            getattr(self, f"cache_conv_{i}").copy_(kv.layers[i].conv_states[0])
            if i in self.recurrent_layers:
                getattr(self, f"cache_recurrent_{i}").copy_(kv.layers[i].recurrent_states[0])
        if not self.in_buffers:
            result["cache"] = tuple((layer.conv_states[0], layer.recurrent_states[0] if i in self.recurrent_layers
                                     else layer.recurrent_states[0].clone())
                                    if i in self.state_layers else (layer.keys, layer.values)
                                    for i, layer in enumerate(kv.layers))
        return result

    def carry_states(self, state_layers: frozenset[int], recurrent_layers: frozenset[int], prefill_chunk: int) -> None:
        """Set the layers whose cache is a linear-attention state (:attr:`state_layers`, :attr:`recurrent_layers`)
        and the ``seq`` bound. With ``in_buffers``, such a layer's states are buffers of their own, mutated in place:
        ``cache_conv_<i>`` ``[batch, channels, kernel]`` and, for a recurrent layer, ``cache_recurrent_<i>``
        ``[batch, heads, key_dim, value_dim]`` (zeros), instead of its key and value buffers."""
        self.state_layers, self.recurrent_layers, self.prefill_chunk = state_layers, recurrent_layers, prefill_chunk
        if not self.in_buffers:
            return
        for i in sorted(state_layers):
            conv, recurrent = self.cache_shapes[i]
            dtype = getattr(self, f"cache_keys_{i}").dtype
            delattr(self, f"cache_keys_{i}")
            delattr(self, f"cache_values_{i}")
            self.register_buffer(f"cache_conv_{i}", torch.zeros(conv, dtype=dtype), persistent=False)
            if i in recurrent_layers:
                self.register_buffer(f"cache_recurrent_{i}", torch.zeros(recurrent, dtype=dtype), persistent=False)

    def _held_states(self, i: int, past_length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s ``(conv_state, recurrent_state)`` from its buffers (:meth:`carry_states`), as zeros at
        ``past_length == 0``: a new sequence starts with no history whatever the last one left (the key and value
        buffers need no such reset: the mask hides their stale positions). LFM2's conv layers get a ``[batch, 1]``
        placeholder for the recurrent state (unused)."""
        conv = getattr(self, f"cache_conv_{i}")
        start = past_length == 0
        conv = torch.where(start, torch.zeros((), dtype=conv.dtype), conv)
        if i not in self.recurrent_layers:
            return conv, torch.zeros((conv.shape[0], 1), dtype=conv.dtype)
        recurrent = getattr(self, f"cache_recurrent_{i}")
        return conv, torch.where(start, torch.zeros((), dtype=recurrent.dtype), recurrent)


# ── planning ────────────────────────────────────────────────────────────────────────────────────────────
def plan_causal_lm(model: Any, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
                   max_batch: int | None = None, prefill_chunk: int | None = None, stateful: bool = False,
                   fused_cache_attention: Any = False, growing: bool = False) -> Any:
    """The one ``decoder`` program of a :class:`CausalLMStep` (see the module docstring for its inputs, outputs and
    cache; :func:`plan_decoder` for its dynamic dims) and the manifest's ``generation`` section.

    Args:
        model: a Transformers decoder with a generation head (``...ForCausalLM``).
        inputs: an example prompt (``input_ids``, ``attention_mask``); default: 2 x 6 seeded tokens.
        max_cache_len: the most positions a sequence may hold, prompt and new tokens: the cache's capacity
            (default: ``max_position_embeddings``, capped at 4,096 and at a sliding window).
        max_batch: the largest batch (default 1).
        prefill_chunk: the most tokens one call takes, the bound of the ``seq`` dim (default
            ``min(256, max_cache_len)``); a longer prompt is prefilled in chunks of this size.
        stateful: the backend's runtime keeps a program's mutated buffers between calls
            (``RuntimeNeeds(cache_layout="in_place")``): the cache then lives in the program's buffers and the batch
            is static.
        fused_cache_attention: ``_cache_attention.attention_for(RuntimeNeeds.attention)``: ``True``, the backend
            lowers ``hfexport::cache_attention`` (each layer's cache write and attention are traced as that one op);
            with ``stateful``, an :class:`~hfexport_dynamo.tasks.kv_cache.InPlaceCacheAttention`, the runtime's
            kernel over the cache buffers (used at ``max_batch=1``: it attends causally without a padding mask).
            Either applies where the model's attention allows it (checked by one eager forward; otherwise the write
            and the attention stay apart).
        growing: the cache grows with the sequence and the runtime keeps it (``RuntimeNeeds(cache_layout=
            "growing")``, :class:`CausalLMStep`'s ``growing``); ``max_cache_len`` is then the most positions a
            sequence may hold, not a capacity held.

    Raises:
        ValueError: bounds the model cannot take (says which).
        hfexport.InvalidInputError: the model cannot generate (says why and what to load instead).
    """
    from hfexport.plugin import TaskPlan

    check_generative(model, TEXT_GENERATION)
    max_cache_len, max_batch = checked_bounds(model, max_cache_len, max_batch)
    prefill_chunk = check_prefill_chunk(prefill_chunk, max_cache_len)
    ids, mask = example_prompt(model, inputs)
    if inputs is not None and ids.shape[0] > max_batch:
        raise InvalidInputError(f"the example prompt has a batch of {ids.shape[0]}, beyond max_batch={max_batch}")
    component, cache = plan_decoder(model, ids, mask, max_cache_len=max_cache_len, max_batch=max_batch,
                                    prefill_chunk=prefill_chunk, stateful=stateful,
                                    fused_cache_attention=fused_cache_attention, growing=growing)
    manifest = generation_manifest(model, max_cache_len, max_batch, len(cache["row_shapes"]))
    manifest.update(prefill_chunk=prefill_chunk, cache=cache)
    return TaskPlan(TEXT_GENERATION, [component], manifest={"generation": manifest}, model=model)


def plan_decoder(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, max_cache_len: int, max_batch: int,
                 prefill_chunk: int, stateful: bool = False, fused_cache_attention: Any = False,
                 embed: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None,
                 step_class: type[CausalLMStep] = CausalLMStep,
                 position_rows: int | None = None, growing: bool = False) -> tuple[Any, dict[str, Any]]:
    """The ``decoder`` component of a generation task and its manifest's ``cache`` section (see :func:`plan_causal_lm`
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
    probed = probe_cache(model, _tokens(ids, embed), mask, takes_position_ids)
    shapes = [(torch.Size((rows, *k[1:])), torch.Size((rows, *v[1:]))) if state else
              (torch.Size((rows, k[1], max_cache_len, k[3])), torch.Size((rows, v[1], max_cache_len, v[3])))
              for k, v, state in probed]
    state_layers = frozenset(i for i, (_, _, state) in enumerate(probed) if state)
    recurrent_layers = frozenset(i for i, (_, _, state) in enumerate(probed) if state == "recurrent")
    if state_layers and (embed is not None or position_rows or len(state_layers) == len(probed)):
        raise InvalidInputError(f"{type(model).__name__} holds linear-attention states (layers "
                                f"{sorted(state_layers)}): task='text-generation' carries them beside the attention "
                                "layers' KV cache of a text decoder only, not in an image- or audio-text decoder "
                                "nor in a model without attention layers")
    if state_layers:
        fused_cache_attention = False
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if growing and embed is None and position_rows is None:
        # imported here: only an export whose backend keeps a growing cache reads growing_cache.py
        from .growing_cache import plan_growing_decoder

        growing_step = CausalLMStep(model, shapes, dtype, growing=True)
        growing_step.carry_states(state_layers, recurrent_layers, prefill_chunk)
        return plan_growing_decoder(model, growing_step, ids, mask, shapes, dtype, rows, max_batch, max_cache_len,
                                    prefill_chunk, takes_position_ids)
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
    step.carry_states(state_layers, recurrent_layers, prefill_chunk)

    if in_place_kernel and embed is None and callable(step.fused_attention):
        # ExecuTorch's LLM kernels: the program takes ExecuTorch's LLM runner's inputs (tokens, input_pos) and carries
        # its metadata, so that the runner runs it as it is (LLMRunnerStep)
        # imported here: only an export whose backend declares ExecuTorch's LLM kernels reads llm_runner.py
        from .llm_runner import LLMRunnerStep

        runner_step = LLMRunnerStep(step, max_cache_len, prefill_chunk)
        example = {"input_ids": ids, "input_pos": torch.zeros(1, dtype=torch.long)}
        seq = Dim("seq", min=1, max=prefill_chunk)
        kv = {"layout": "[batch, max_cache_len, kv_heads, head_dim]", "in_program_buffers": True,
              "static_batch": True, "dtype": str(dtype).removeprefix("torch."), "fused_attention": True,
              "fused_rotary": step.fused_rotary, "ignores_padding": True, "signature": "llm_runner",
              "row_shapes": [[list(k[1:]), list(v[1:])] for k, v in shapes]}
        return ComponentPlan(DECODER, runner_step, example, {"input_ids": {1: seq}, "input_pos": None}), kv

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
    if state_layers:  # {layer: kind}: row_shapes holds (conv_state, recurrent_state) there, [1] for a conv layer's
        cache["state_layers"] = {str(i): "recurrent" if i in recurrent_layers else "conv" for i in sorted(state_layers)}
    return ComponentPlan(DECODER, step, example, dynamic_shapes), cache


def _tokens(ids: torch.Tensor, embed: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None
            ) -> dict[str, torch.Tensor]:
    if embed is None:
        return {"input_ids": ids}
    with torch.no_grad():
        return embed(ids)


# ── greedy decoding ─────────────────────────────────────────────────────────────────────────────────────
def prepare_decoder(exported: Any, section: Mapping[str, Any], config: Any, input_ids: Any, attention_mask: Any,
                    media: Mapping[str, Any]) -> GreedyRun:
    """``"text-generation"``'s part of :func:`hfexport_dynamo.tasks.decoding.generate`: the prompt checked against
    the export's bounds, then :func:`decoder_run`."""
    input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, section)
    return decoder_run(exported, section, config, input_ids, attention_mask)


def decoder_run(exported: Any, section: Mapping[str, Any], config: Any, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, prompt_embeds: torch.Tensor | None = None,
                embed_tokens: Callable[[torch.Tensor], torch.Tensor] | None = None,
                per_position: Mapping[str, torch.Tensor] | None = None,
                stats: Mapping[str, Any] | None = None) -> GreedyRun:
    """The greedy loop's run over the ``decoder`` program (:class:`DecoderPrograms`) from a checked prompt
    ``input_ids``, ``attention_mask`` ``[batch, prompt]``. Where the cache's kernel attends without a padding mask
    (``cache.ignores_padding``), the one row runs without its left padding, put back in front of the result.
    ``prompt_embeds``, ``embed_tokens``, ``per_position``: an image- or audio-text prompt (see
    :class:`DecoderPrograms`); ``stats``: what its encoding measured."""
    padding = None
    if section["cache"].get("ignores_padding"):  # a kernel without a padding mask: run the row without its padding
        padding, input_ids, attention_mask = _split_left_padding(input_ids, attention_mask)
        if prompt_embeds is not None:
            prompt_embeds = prompt_embeds[:, padding.shape[1]:]
            per_position = {k: v[..., padding.shape[1]:] for k, v in (per_position or {}).items()}
    if section["cache"].get("growing"):
        from .growing_cache import GrowingDecoderPrograms

        programs: Any = GrowingDecoderPrograms(exported, section, input_ids, attention_mask)
    else:
        programs = DecoderPrograms(exported, section, input_ids, attention_mask, prompt_embeds, embed_tokens,
                                   per_position)

    def finish(sequences: torch.Tensor, stats: GenerationStats) -> torch.Tensor:
        return torch.cat([padding, sequences], -1)

    return GreedyRun(programs, input_ids, config, attention_mask=attention_mask, stats=dict(stats or {}),
                     finish=None if padding is None else finish)


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


class DecoderPrograms:
    """The ``decoder`` program under the greedy loop (:class:`~hfexport_dynamo.tasks.decoding.TaskPrograms`): the
    prompt prefilled in chunks of ``prefill_chunk``, then one token per decode step, written at the next cache
    position; the mask over the cache, the positions, the past length and the cache (an input and output, or in
    the program's buffers) carried from call to call.

    A static batch (``max_batch`` rows in the program's buffers) runs the rows given plus copies of the last one,
    whose tokens are dropped. With ``prompt_embeds`` (``[batch, prompt, hidden]``, a decoder that takes
    ``inputs_embeds``), the prefill feeds them and each decode step feeds ``embed_tokens(ids)`` of the new ids
    (``[batch, 1]`` -> ``[batch, 1, hidden]``). ``per_position``: more inputs ``[batch, prompt]`` (``image_blocks``),
    sliced with the prefill's chunks; at the decode steps, :data:`DECODE_STEP_VALUES` (else 0). Its
    ``position_ids`` ``[rows, batch, prompt]`` (Qwen2-VL's 3-D RoPE positions), if any, replace the positions
    counted from the mask; each decode step's are then the prompt's largest position plus the steps, in every row
    (as the model's ``rope_deltas`` make them).

    The decode steps' inputs are tensors updated in place: a runner that binds its inputs (ONNX Runtime's IO
    binding) binds the cache, the mask and these once (:meth:`running`); once a decode step's cache came back
    written in place, the runner's ``rerun`` repeats that run without the checks and flattening of
    ``exported.run``.
    """

    def __init__(self, exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, prompt_embeds: torch.Tensor | None = None,
                 embed_tokens: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 per_position: Mapping[str, torch.Tensor] | None = None):
        self.exported, self.names = exported, input_names(exported, DECODER)
        self.runner = exported.components[DECODER].runner
        rows, prompt = input_ids.shape
        self.rows = rows
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
            positions = torch.cat([positions, positions[..., -1:, :].expand(*positions.shape[:-2], batch - rows,
                                                                           -1)], -2)
        self.prompt_tokens = input_ids if prompt_embeds is None else prompt_embeds
        self.token_name = "input_ids" if prompt_embeds is None else "inputs_embeds"
        self.positions, self.per_position, self.embed_tokens = positions, per_position, embed_tokens
        self.prefill_spans = [slice(past, past + section["prefill_chunk"])
                              for past in range(0, prompt, section["prefill_chunk"])]
        self.mask = torch.zeros(batch, section["max_cache_len"], dtype=torch.long)
        self.mask[:, :prompt] = attention_mask
        self.cache = new_cache(section, batch) if "cache" in self.names else None
        self.past_length = torch.zeros((), dtype=torch.long)
        self.input_pos = self.past_length.view(1)  # an LLM-runner program's input_pos [1]: the same memory
        self.rerun: Callable[[], list[Any]] | None = None  # the runner's repeat of the last decode step
        self.logits_leaf = 0
        # the decode steps' inputs: the next position (written at self.past), its ids, embeddings and other inputs
        self.past, self.position = prompt, positions[:, -1:].clone()
        if positions.dim() == 3:  # [rows, batch, 1]: each row of the next position is the prompt's largest + 1
            self.position = positions.amax((0, 2), keepdim=True).expand_as(positions[..., -1:]).clone()
        self.ids = torch.zeros(batch, 1, dtype=torch.long)
        self.token_embeds: torch.Tensor | None = None  # written in place (a runner may have bound them)
        self.step_inputs = {k: torch.full((batch, 1), DECODE_STEP_VALUES.get(k, 0), dtype=v.dtype)
                            for k, v in per_position.items()}

    def running(self) -> contextlib.AbstractContextManager[Any]:
        return getattr(self.runner, "reusing_bindings", contextlib.nullcontext)()

    def prefill(self, span: slice) -> torch.Tensor:
        return self._run(self.prompt_tokens[:, span], self.positions[..., span], span.start,
                         {k: v[..., span] for k, v in self.per_position.items()})

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask[:, self.past] = 1
        self.position += 1
        self.ids[:self.rows, 0] = tokens
        if self.ids.shape[0] > self.rows:
            self.ids[self.rows:, 0] = tokens[-1]  # a static batch's extra rows repeat the last one
        if self.embed_tokens is None:
            logits = self._run(self.ids, self.position, self.past, decoding=True)
        else:
            embeds = self.embed_tokens(self.ids)
            self.token_embeds = embeds.clone() if self.token_embeds is None else self.token_embeds.copy_(embeds)
            logits = self._run(self.token_embeds, self.position, self.past, self.step_inputs, decoding=True)
        self.past += 1
        return logits

    def _run(self, tokens: torch.Tensor, position_ids: torch.Tensor, past: int,
             extra: Mapping[str, torch.Tensor] | None = None, decoding: bool = False) -> torch.Tensor:
        """One call of the program on ``tokens`` at cache position ``past``; the real rows' logits."""
        self.past_length.fill_(past)
        if self.rerun is not None:
            return self.rerun()[self.logits_leaf][:self.rows]
        feed = {self.token_name: tokens, **(extra or {}), "attention_mask": self.mask, "position_ids": position_ids,
                "past_length": self.past_length, "input_pos": self.input_pos, "cache": self.cache}
        out = self.exported.run(DECODER, **{k: v for k, v in feed.items() if k in self.names})
        returned = out.get("cache", self.cache)
        if (decoding and hasattr(self.runner, "rerun") and returned is not None
                and all(a is b for a, b in zip(pytree.tree_leaves(returned), pytree.tree_leaves(self.cache),
                                               strict=True))):
            # a decode step whose cache was written in place: the next ones feed the same tensors (ids, position,
            # mask, past length, cache), updated in place, so the runner repeats this run
            self.rerun = self.runner.rerun
            self.logits_leaf = next(i for i, leaf in enumerate(pytree.tree_leaves(out)) if leaf is out["logits"])
        self.cache = returned
        return out["logits"][:self.rows]
