"""Model patches (``"dynamo"`` scope): ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` as one scan op per layer and direction.

torch's recurrent layers run as one fused ATen op (``aten.gru.input``, ``aten.lstm.input``, ``aten.rnn_tanh.input``)
whose fake kernel unrolls the time axis: ``torch.export`` specializes the sequence length to the traced one
(``Constraints violated (time)``), on every backend. The replacement computes, per layer and direction, the input
projection of every step at once (as ATen's CPU path does), then the recurrence as ``torch.ops.higher_order.scan``
over the time axis, with the gates in ATen's cell order (GRU: ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
the reset gate applied after the recurrent matmul, ONNX's ``linear_before_reset=1``; LSTM: ``i, f, g, o`` and the
projection ``W_hr`` when ``proj_size > 0``). Bidirectional, multi-layer, ``batch_first``, unbatched (2-D) input and
a given or absent initial state are covered; a ``PackedSequence`` is refused with the layer's name (its
``batch_sizes`` are data: pad it and pass the padded tensor, with the lengths applied to the outputs).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch._higher_order_ops.scan import scan

from hfexport.plugin import register_patch

__all__ = ["rnn_forward_as_scan"]


def _weights(module: torch.nn.RNNBase, layer: int, reverse: bool) -> tuple[torch.Tensor | None, ...]:
    suffix = f"_l{layer}{'_reverse' if reverse else ''}"
    get = lambda name: getattr(module, f"{name}{suffix}", None)  # noqa: E731
    return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"), get("weight_hr")


def _direction(module: torch.nn.RNNBase, x: torch.Tensor, layer: int, reverse: bool, h0: torch.Tensor,
               c0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One layer in one direction over ``x`` ``[time, batch, features]``: outputs ``[time, batch, hidden]`` and
    the final ``h`` (and ``c``)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = _weights(module, layer, reverse)
    gates_x = F.linear(x, w_ih, b_ih)  # every step's input projection at once, as ATen's CPU path
    mode = module.mode

    def step(carry: Any, gx: torch.Tensor) -> tuple[Any, torch.Tensor]:
        if mode == "LSTM":
            h, c = carry
            gates = gx + F.linear(h, w_hh, b_hh)
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            if w_hr is not None:
                h = F.linear(h, w_hr)
            return (h, c), h.clone()
        h = carry
        gh = F.linear(h, w_hh, b_hh)
        if mode == "GRU":
            xr, xz, xn = gx.chunk(3, 1)
            hr, hz, hn = gh.chunk(3, 1)
            r = torch.sigmoid(hr + xr)
            z = torch.sigmoid(hz + xz)
            n = torch.tanh(xn + hn * r)
            h = (h - n) * z + n
        else:
            h = torch.tanh(gx + gh) if mode == "RNN_TANH" else torch.relu(gx + gh)
        return h, h.clone()

    init = (h0, c0) if mode == "LSTM" else h0
    final, outputs = scan(step, init, gates_x, reverse=reverse)
    return (outputs, *final) if mode == "LSTM" else (outputs, final, None)


def rnn_forward_as_scan(module: torch.nn.RNNBase, input: torch.Tensor, hx: Any = None) -> tuple[torch.Tensor, Any]:
    """``module(input, hx)`` for an ``nn.RNN``/``nn.GRU``/``nn.LSTM`` in eval, each layer and direction a scan op.

    Args:
        module: the recurrent layer (any ``num_layers``, ``bidirectional``, ``batch_first``, ``bias``,
            ``proj_size``); dropout between layers is not applied (eval).
        input: ``[batch, time, input_size]`` (``batch_first``), ``[time, batch, input_size]``, or unbatched
            ``[time, input_size]``.
        hx: ``h_0`` ``[layers * directions, batch, hidden]`` (``(h_0, c_0)`` for an LSTM; unbatched: without the
            batch dim), or ``None`` for zeros.

    Returns:
        ``(output, h_n)`` (LSTM: ``(output, (h_n, c_n))``) as the module returns them: output
        ``[.., time, directions * hidden]`` (``proj_size`` for an LSTM's h), in the input's layout.
    """
    unbatched = input.dim() == 2
    x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if module.batch_first else input)
    directions = 2 if module.bidirectional else 1
    lstm = module.mode == "LSTM"
    h_size = module.proj_size if lstm and module.proj_size > 0 else module.hidden_size
    batch = x.shape[1]
    h0, c0 = (hx if lstm else (hx, None)) if hx is not None else (None, None)
    if h0 is None:
        h0 = x.new_zeros(module.num_layers * directions, batch, h_size)
        c0 = x.new_zeros(module.num_layers * directions, batch, module.hidden_size) if lstm else None
    elif unbatched:
        h0, c0 = h0.unsqueeze(1), (c0.unsqueeze(1) if c0 is not None else None)
    h_n, c_n = [], []
    for layer in range(module.num_layers):
        outputs = []
        for d in range(directions):
            k = layer * directions + d
            out, h, c = _direction(module, x, layer, d == 1, h0[k], c0[k] if c0 is not None else None)
            outputs.append(out)
            h_n.append(h)
            c_n.append(c)
        x = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
    output = x.squeeze(1) if unbatched else (x.transpose(0, 1) if module.batch_first else x)
    h_out = torch.stack(h_n)
    c_out = torch.stack(c_n) if lstm else None
    if unbatched:
        h_out, c_out = h_out.squeeze(1), (c_out.squeeze(1) if c_out is not None else None)
    return (output, (h_out, c_out)) if lstm else (output, h_out)


@register_patch("dynamo", "torch.nn.modules.rnn.RNN.forward", "torch.nn.modules.rnn.GRU.forward",
                "torch.nn.modules.rnn.LSTM.forward")
def _patch_rnn_layers_as_scan(original: Any, ctx: Any = None) -> Any:
    """Run ``nn.RNN``/``nn.GRU``/``nn.LSTM`` as a scan op over the time axis instead of ATen's fused op.

    **Why**: the fused ops (``aten.gru.input``, ``aten.lstm.input``, ``aten.rnn_tanh.input``) trace as one
    unrolled step per time step: the time axis is specialized to the traced length on every backend (``UserError:
    Constraints violated (time)``), and torch.onnx's translation of the dynamo GRU was reported to get the reset
    gate's place wrong (pytorch/pytorch#189225). The replacement runs the same cells (see the module docstring) as
    ``torch.ops.higher_order.scan`` per layer and direction, which every backend lowers as a loop. A
    ``PackedSequence`` is refused with the layer's name; training-mode dropout between layers runs the original.
    **Upstream**: pytorch/pytorch#189225 (GRU's ``linear_before_reset``); torch.export unrolls the fused RNN ops (no
    issue found for a symbolic time axis).
    **Remove when**: torch.export keeps the recurrent ops with a symbolic time axis and every backend lowers them
    (f01 passes with ``disable=("_patch_rnn_layers_as_scan",)``).
    """
    model = getattr(ctx, "model", None)  # the layers' names, for the refusal: a scan of the model, nothing else
    names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary(
        {m: n for n, m in model.named_modules() if isinstance(m, torch.nn.RNNBase)} if model is not None else {})

    def forward(self: Any, input: Any, hx: Any = None) -> Any:
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            name = names.get(self, type(self).__name__)
            raise ValueError(
                f"nn.{type(self).__name__} {name!r} got a PackedSequence: its batch_sizes are data, which an "
                "exported program cannot loop over. Export the padded tensor instead (pad_packed_sequence before "
                "the layer, the lengths applied to its outputs with a mask), which hfexport runs as a scan over a "
                "dynamic time axis")
        if (self.training and self.dropout > 0 and self.num_layers > 1) or not isinstance(input, torch.Tensor):
            return original(self, input, hx)
        return rnn_forward_as_scan(self, input, hx)

    return forward
