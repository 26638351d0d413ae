"""Model patches (``"dynamo"`` scope): Python loops over the sequence rewritten with tensor ops.

Transformers' reference (CPU) paths of several models step through the sequence in a Python ``for`` loop.
``torch.export`` unrolls such a loop for the traced length, so the program is specialized to it (a dynamic
sequence dim is refused, or fails a guard at any other length), on every backend.

- Recurrences (Mamba's selective scan, RWKV's WKV, RecurrentGemma's RG-LRU) run the same update, with the same
  arithmetic in the same order, as one ``torch.ops.higher_order.scan`` over the sequence, which torch.export
  keeps as a loop of symbolic length. Memory is that of the original (the per-step inputs it already builds)
  plus one carry; no quadratic closed form is built. The scan op lowers on every backend: the dynamo program
  runs it with eager kernels, torch.onnx translates it to an ONNX ``Scan`` and ExecuTorch emits it as a loop
  of jump instructions.
- CANINE's local attention cuts its chunks with a pad and a reshape instead of a list of slices.

Each patch is only active inside an export; the model's modules are left as they were.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch._higher_order_ops.scan import scan

from hfexport.plugin import register_patch

__all__: list[str] = []

# The four copies of Mamba's reference selective scan (``# Copied from`` one another in transformers).
_MAMBA_SCANS = tuple(f"transformers.models.{m}.modeling_{m}.mamba_selective_scan"
                     for m in ("mamba", "falcon_mamba", "jamba", "zamba"))


def _mamba_selective_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
                          B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None,  # noqa: N803
                          z: torch.Tensor | None = None, delta_bias: torch.Tensor | None = None,
                          delta_softplus: bool = False, return_last_state: bool = False,
                          **unused: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan (the reference ``mamba_selective_scan``) with the state recurrence as a scan op.

    Args:
        hidden_states: ``[batch, intermediate, seq]``, the SSM input ``u``.
        dt: ``[batch, intermediate, seq]``, the time step before ``delta_bias`` and softplus.
        A: ``[intermediate, state]`` float32, the (negative) state matrix diagonal.
        B: ``[batch, state, seq]``; C: ``[batch, state, seq]``.
        D: ``[intermediate]`` skip weights; z: ``[batch, intermediate, seq]`` gate; delta_bias: ``[intermediate]``.
        delta_softplus: apply softplus to ``dt + delta_bias``.
        return_last_state: also return the final state ``[batch, intermediate, state]`` (float32).
        unused: ``use_mambapy`` and ``use_associative_scan`` (eager-only alternatives, not exportable).

    Returns:
        ``[batch, intermediate, seq]`` in ``hidden_states``' dtype, and the final state when asked.
    """
    batch_size, intermediate_size, _ = hidden_states.shape
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)  # noqa: N806  [batch, seq, state]
    discrete_A = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # noqa: N806  [batch, inter, seq, state]
    deltaB_u = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()  # noqa: N806

    def step(state: torch.Tensor, x: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        a, bu, c = x  # [batch, inter, state], [batch, inter, state], [batch, state]
        state = a * state + bu
        # y = state @ c as a product and a sum: elementwise ops and a reduction in the loop body, no batched
        # matmul whose reshapes of symbolic sizes torch.onnx's re-run of the body trips on (SymInt leaves).
        return state.clone(), (state.to(input_dtype) * c[:, None, :]).sum(-1)

    init = torch.zeros(batch_size, intermediate_size, A.shape[-1], dtype=deltaB_u.dtype, device=hidden_states.device)
    ssm_state, outputs = scan(step, init, (discrete_A.movedim(2, 0), deltaB_u.movedim(2, 0), C.transpose(0, 1)))
    scan_output = outputs.permute(1, 2, 0)  # [seq, batch, inter] -> [batch, inter, seq]
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    return (scan_output, ssm_state) if return_last_state else scan_output


@register_patch("dynamo", *_MAMBA_SCANS)
def _patch_mamba_selective_scan(original: Any) -> Any:
    """Run Mamba's reference selective scan as a scan op instead of a Python loop over the sequence.

    **Why**: ``mamba_selective_scan`` (Mamba, FalconMamba, Jamba, Zamba; the path taken without the CUDA
    kernels, and always while exporting) updates the SSM state in ``for index in range(seq_len)``: unrolled by
    torch.export, the sequence length is specialized to the traced one on every backend. Its alternatives do
    not export either: ``use_associative_scan`` is switched off while exporting (no ONNX translation) and
    mambapy's ``pscan`` loops over ``log2(seq_len)``. The replacement computes the same discretization and
    runs ``state = exp(dt A) * state + dt B u; y = state @ C`` as ``torch.ops.higher_order.scan`` over the
    sequence (float32 state, as the original after its first step), then the ``D`` skip and the ``silu(z)``
    gate. A closed form with cumulative sums was declined: Mamba 1's ``A`` is per (channel, state), so the
    SSD chunked form of Mamba 2 does not apply, and ``exp(cumsum)`` ratios overflow float32 within a few
    hundred steps of large ``dt * A``.
    **Upstream**: model-side; transformers keeps the loop in its reference path (``mamba_selective_scan``).
    pytorch/pytorch#130150 (Mamba's kernels need a custom op to export).
    **Remove when**: transformers' reference selective scan uses a scan op (or another loop-free form) while
    exporting.
    """
    return _mamba_selective_scan


def _rwkv_linear_attention_cpu(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, state: Any = None,
                               return_state: bool = False) -> tuple[torch.Tensor, Any]:
    """RWKV's WKV recurrence (the reference ``rwkv_linear_attention_cpu``) as a scan op over the sequence.

    Args:
        time_decay: ``[attention_hidden]``, the log of minus the per-channel decay (``w = -exp(time_decay)``).
        time_first: ``[attention_hidden]``, the bonus ``u`` of the current token.
        key: ``[batch, seq, attention_hidden]``; value: ``[batch, seq, attention_hidden]``.
        state: ``(numerator, denominator, max)`` float32 ``[batch, attention_hidden]`` each, or ``None``
            (zeros, and ``-1e38`` for the running max).
        return_state: also return the final state.

    Returns:
        ``(output, state)``: ``[batch, seq, attention_hidden]`` in ``key``'s dtype, and the final
        ``[numerator, denominator, max]`` when asked or when a state was given (else ``None``).
    """
    given = state is not None
    if state is None:
        zeros = torch.zeros_like(key[:, 0], dtype=torch.float32)
        state = (zeros, zeros.clone(), zeros - 1e38)
    decay = -torch.exp(time_decay)

    def step(carry: tuple[torch.Tensor, ...], x: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, torch.Tensor]:
        num_state, den_state, max_state = carry
        current_key, current_value = x[0].float(), x[1]
        max_for_output = torch.maximum(max_state, current_key + time_first)
        e1 = torch.exp(max_state - max_for_output)
        e2 = torch.exp(current_key + time_first - max_for_output)
        output = ((e1 * num_state + e2 * current_value) / (e1 * den_state + e2)).to(key.dtype)
        max_for_state = torch.maximum(max_state + decay, current_key)
        e1 = torch.exp(max_state + decay - max_for_state)
        e2 = torch.exp(current_key - max_for_state)
        return (e1 * num_state + e2 * current_value, e1 * den_state + e2, max_for_state), output

    final, outputs = scan(step, tuple(state), (key.transpose(0, 1), value.transpose(0, 1)))
    return outputs.transpose(0, 1), (list(final) if return_state or given else None)


@register_patch("dynamo", "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu")
def _patch_rwkv_linear_attention_cpu(original: Any) -> Any:
    """Run RWKV's WKV recurrence as a scan op instead of a Python loop over the sequence.

    **Why**: ``rwkv_linear_attention_cpu`` (the path of RWKV without its CUDA kernel, and for every CPU
    export) updates the numerator, denominator and running-max states in ``for current_index in
    range(seq_length)``: unrolled by torch.export, the sequence length is specialized to the traced one on
    every backend. The replacement runs the same numerically stable update (the running max keeps every
    ``exp`` at or below 1) as ``torch.ops.higher_order.scan`` over the sequence, with the same state in and
    out. A parallel (cumulative-sum) WKV was declined: it needs ``exp`` of decay sums that over- or underflow
    float32 over long sequences, which the running max exists to avoid.
    **Upstream**: model-side; transformers keeps the loop in ``rwkv_linear_attention_cpu``.
    **Remove when**: transformers' reference WKV uses a scan op (or another loop-free form).
    """
    return _rwkv_linear_attention_cpu


def _patched_rnn_scan(original: Any) -> Any:
    def _rnn_scan(self: Any, hidden_states: torch.Tensor, recurrent_gate: torch.Tensor, reset: torch.Tensor,
                  recurrent_states: torch.Tensor | None,
                  acc_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        if hidden_states.shape[1] == 1:  # one token (decoding): the original has no loop there
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        recurrent_gate = recurrent_gate * ~reset
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)

        def step(state: torch.Tensor, x: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            gate, inputs = x  # [batch, lru_width] each
            state = gate.type(acc_dtype) * state + inputs.type(acc_dtype)
            return state.clone(), state.type(hidden_states.dtype)

        final, outputs = scan(step, recurrent_states.to(device=recurrent_gate.device, dtype=acc_dtype),
                              (recurrent_gate.transpose(0, 1), hidden_states.transpose(0, 1)))
        return outputs.transpose(0, 1), final

    return _rnn_scan


@register_patch("dynamo", "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan")
def _patch_recurrent_gemma_rnn_scan(original: Any) -> Any:
    """Run RecurrentGemma's RG-LRU recurrence as a scan op instead of a Python loop over the sequence.

    **Why**: ``RecurrentGemmaRglru._rnn_scan`` computes ``h_t = a_t * h_{t-1} + x_t`` (float32 accumulation)
    in ``for t in range(hidden_states.shape[1])``: unrolled by torch.export, the sequence length is
    specialized to the traced one on every backend. The replacement runs the same update as
    ``torch.ops.higher_order.scan`` over the sequence and returns the same outputs and final state; a single
    token (decoding) still takes the original, which has no loop. A closed form (``h_t = P_t * cumsum(x_s /
    P_s)`` with ``P`` the running product of gates) was declined: ``P`` underflows to 0 within a few hundred
    tokens, and document resets (``a = 0``) make ``1 / P`` infinite.
    **Upstream**: model-side; transformers' ``_rnn_scan`` carries a ``# TODO refactor``.
    **Remove when**: transformers runs the RG-LRU with a scan op (or an associative scan that exports).
    """
    return _patched_rnn_scan(original)


def _fits_block_local_attention(module: Any, attention_mask: torch.Tensor | None, output_attentions: bool) -> bool:
    """Whether ``CanineAttention`` runs non-overlapping local attention that :func:`_canine_block_attention`
    computes: chunks of one width, strided by that width, no first-position extras, a 0/1 ``[b, L, L]`` mask."""
    width = module.attend_from_chunk_width
    return (module.local and not output_attentions and not module.always_attend_to_first_position
            and not module.first_position_attends_to_all and attention_mask is not None and attention_mask.ndim == 3
            and width == module.attend_from_chunk_stride == module.attend_to_chunk_width
            == module.attend_to_chunk_stride)


def _canine_block_attention(module: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """CANINE's local self-attention with chunks cut by a pad and a reshape instead of a Python list.

    Args:
        module: the ``CanineAttention`` (its ``self`` is the ``CanineSelfAttention`` each chunk runs through).
        hidden_states: ``[batch, seq, hidden]``.
        attention_mask: ``[batch, seq, seq]``, 1.0 where a position may attend to another, else 0.0.

    Returns:
        ``[batch, seq, hidden]``: the attention output before ``CanineSelfOutput``.
    """
    batch, seq, hidden = hidden_states.shape
    torch._check(attention_mask.shape[1] == seq and attention_mask.shape[2] == seq)  # one symbol for both lengths
    width = module.attend_from_chunk_width
    chunks = (seq + width - 1) // width
    pad = chunks * width - seq  # the last chunk is padded to the full width
    x = F.pad(hidden_states, (0, 0, 0, pad)).reshape(batch * chunks, width, hidden)
    # The diagonal blocks of the mask, [batch, chunks, width (from), width (to)], made additive as the original
    # does for a 3-D mask; padded keys get -inf, so that a query whose real keys are all masked spreads its
    # weight over the real keys of its chunk only, as over the original's shorter last chunk.
    # Indexed with one arange on both chunk dims ([chunks, batch, width, width]), not torch.diagonal, which
    # OpenVINO's frontend does not convert (aten.diagonal).
    blocks = F.pad(attention_mask, (0, pad, 0, pad), value=1.0).reshape(batch, chunks, width, chunks, width)
    chunk = torch.arange(chunks, device=attention_mask.device)
    blocks = blocks[:, chunk, :, chunk].permute(1, 0, 2, 3)
    scores_dtype = hidden_states.dtype
    additive = (1.0 - blocks.float()) * torch.finfo(scores_dtype).min
    padded_key = (torch.arange(chunks * width, device=hidden_states.device) >= seq).reshape(1, chunks, 1, width)
    additive = torch.where(padded_key, float("-inf"), additive).to(scores_dtype)
    context = module.self(x, x, additive.reshape(batch * chunks, 1, width, width), False)[0]
    # Gathered, not sliced: a view's contiguity check would branch on seq % width.
    return context.reshape(batch, chunks * width, hidden)[:, torch.arange(seq, device=context.device)]


@register_patch("dynamo", "transformers.models.canine.modeling_canine.CanineAttention.forward")
def _patch_canine_local_attention(original: Any) -> Any:
    """Cut CANINE's local-attention chunks with a pad and a reshape instead of a Python loop over the sequence.

    **Why**: ``CanineAttention.forward`` with ``local=True`` (CanineModel's initial character encoder) lists
    its chunks with ``for chunk_start in range(0, seq_len, stride)`` and runs attention once per chunk:
    unrolled by torch.export, the sequence length is specialized to the traced one on every backend. With
    chunks of one width strided by that width (how CanineModel builds it) the chunks are the blocks of a
    reshape: the replacement pads the sequence to a whole number of chunks, runs the same
    ``CanineSelfAttention`` on ``[batch * chunks, width, hidden]`` with the mask's diagonal blocks (padded keys
    at ``-inf``, so they get no weight) and drops the padding. Compute and memory stay those of the chunks
    (``seq * width`` scores, not ``seq ** 2``). Other configurations (overlapping chunks, a first position that
    attends to all or is always attended to, ``output_attentions``) run the original. Traced with at most one
    chunk of characters (``local_transformer_stride``, 128 in released checkpoints), the program keeps one
    chunk (torch.export specializes a size of 1) and takes up to ``width`` characters: trace with more.
    **Upstream**: huggingface/transformers#47491 (CANINE not exportable with a dynamic sequence; PRs #47617,
    #47987 closed unmerged).
    **Remove when**: transformers cuts CANINE's local-attention chunks with tensor ops.
    """

    def forward(self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_attentions: bool | None = False) -> tuple[torch.Tensor, ...]:
        if not _fits_block_local_attention(self, attention_mask, bool(output_attentions)):
            return original(self, hidden_states, attention_mask, output_attentions)
        return (self.output(_canine_block_attention(self, hidden_states, attention_mask), hidden_states),)

    return forward


@register_patch("dynamo", "transformers.models.canine.modeling_canine.CanineModel._downsample_attention_mask")
def _patch_canine_downsample_attention_mask(original: Any) -> Any:
    """Pool CANINE's character mask to molecules with a reshape and ``amax`` instead of ``nn.MaxPool1d``.

    **Why**: ``CanineModel._downsample_attention_mask`` pools the ``[batch, seq]`` mask with
    ``MaxPool1d(kernel_size=rate, stride=rate)``, whose trace fixes the mask's length to the traced one
    (``Eq(attention_mask.size(1), 8)``), on every backend. The replacement keeps the first
    ``seq // rate * rate`` positions (MaxPool1d's floor mode drops the rest), as
    ``[batch, seq // rate, rate]`` windows, and takes their max: the same values.
    **Upstream**: huggingface/transformers#47491 (the same change is in the closed PRs #47617 and #47987).
    **Remove when**: transformers pools the mask with tensor ops.
    """

    def downsample(self: Any, char_attention_mask: torch.Tensor, downsampling_rate: int) -> torch.Tensor:
        batch, seq = char_attention_mask.shape
        molecules = seq // downsampling_rate
        # Gathered, not a view (a slice or unfold): a view's contiguity check would branch on seq % rate.
        index = torch.arange(molecules * downsampling_rate, device=char_attention_mask.device)
        windows = char_attention_mask.float()[:, index].reshape(batch, molecules, downsampling_rate)
        return windows.amax(dim=-1)  # [batch, seq // rate]

    return downsample


@register_patch("dynamo", "transformers.models.canine.modeling_canine.CanineModel._repeat_molecules")
def _patch_canine_repeat_molecules(original: Any) -> Any:
    """Upsample CANINE's molecules without slicing off the CLS molecule first.

    **Why**: ``CanineModel._repeat_molecules`` drops the CLS molecule with ``molecules[:, 1:]`` before
    repeating each molecule ``rate`` times. For a sequence shorter than ``3 * rate`` characters (the zoo traces
    8 with rate 4) that slice has one molecule, and torch.export specializes a size of 1 (``Eq(s // 4 - 1,
    1)``): the program then refuses 12 characters. The replacement repeats every molecule and drops the first
    ``rate`` rows (never a single row), then appends the last molecule ``seq % rate + rate`` times as the
    original does: the same tensor.
    **Upstream**: model-side, with huggingface/transformers#47491 (CANINE with a dynamic sequence).
    **Remove when**: transformers upsamples without a size-1 slice, or CANINE exports with a dynamic sequence.
    """

    def repeat_molecules(self: Any, molecules: torch.Tensor, char_seq_length: int) -> torch.Tensor:
        rate = self.config.downsampling_rate
        repeated = torch.repeat_interleave(molecules, repeats=rate, dim=-2)[:, rate:, :]
        remainder = torch.repeat_interleave(molecules[:, -1:, :], repeats=char_seq_length % rate + rate, dim=-2)
        return torch.cat([repeated, remainder], dim=-2)

    return repeat_molecules
