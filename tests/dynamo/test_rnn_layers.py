"""The patch of ``hfexport_dynamo._rnn_layers``: ``nn.RNN``/``nn.GRU``/``nn.LSTM`` run as one scan op per layer and
direction, so that the time axis stays dynamic; disabling the patch brings back the original failure (the time axis
is specialized: ``Constraints violated``). A ``PackedSequence`` is refused with the layer's name, and cells stepped in a Python loop (which torch.export unrolls) with
a dynamic time axis are refused naming the cells."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.export import Dim

import hfexport
from hfexport_dynamo._rnn_layers import rnn_forward_as_scan


def _layouts(cls: type) -> list:
    return [(cls, *layout) for layout in itertools.product([1, 2], [False, True], [False, True], [0, 3],
                                                           [False, True], [False, True])
            if not layout[3] or cls is torch.nn.LSTM]


# (class, layers, bidirectional, batch_first, proj_size, unbatched, initial state given): a few in the default set,
# every combination in the full suite
_FEW = [(torch.nn.GRU, 2, True, False, 0, False, True), (torch.nn.LSTM, 2, True, True, 3, False, False),
        (torch.nn.RNN, 1, False, True, 0, True, True)]


@pytest.mark.parametrize("layout", [*_FEW, *(pytest.param(layout, marks=pytest.mark.slow)
                                             for cls in (torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM)
                                             for layout in _layouts(cls) if layout not in _FEW)])
def test_scan_form_matches_the_fused_op(layout):
    """Every layout the rewrite covers, against eager's fused op (within 1e-6)."""
    cls, layers, bidirectional, batch_first, proj, unbatched, given = layout
    torch.manual_seed(0)
    kwargs = {"proj_size": proj} if proj else {}
    m = cls(4, 6, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **kwargs).eval()
    d = 2 if bidirectional else 1
    x = torch.randn(7, 4) if unbatched else torch.randn(*((2, 7) if batch_first else (7, 2)), 4)
    state = None
    if given:
        shape = (layers * d,) if unbatched else (layers * d, 2)
        h0 = torch.randn(*shape, proj or 6)
        state = (h0, torch.randn(*shape, 6)) if cls is torch.nn.LSTM else h0
    with torch.no_grad():
        expected, actual = m(x, state), rnn_forward_as_scan(m, x, state)
    for e, a in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual), strict=True):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=0)


class _Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(3, 5, batch_first=True)

    def forward(self, x):
        return self.gru(x)


def test_gru_exports_with_a_dynamic_time_axis_and_not_without_the_patch():
    torch.manual_seed(0)
    model = _Tagger().eval()
    shapes = {"x": {1: Dim("time", min=2, max=32)}}
    exported = hfexport.export(model, {"x": torch.randn(2, 6, 3)}, backend="dynamo", dynamic_shapes=shapes)
    x = torch.randn(2, 11, 3)
    with torch.no_grad():
        expected = model(x)
    for e, a in zip(expected, exported(x=x), strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)
    with pytest.raises(hfexport.ExportError, match="time"):
        hfexport.export(model, {"x": torch.randn(2, 6, 3)}, backend="dynamo", dynamic_shapes=shapes,
                        disable=("_patch_rnn_layers_as_scan",))


def test_a_packed_sequence_is_refused_with_the_layer_name():
    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.LSTM(3, 4, batch_first=True)

        def forward(self, x, lengths):
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            return self.encoder(packed)[1][0]

    inputs = {"x": torch.randn(2, 5, 3), "lengths": torch.tensor([5, 3])}
    with pytest.raises(hfexport.ExportError, match=r"nn\.LSTM 'encoder' got a PackedSequence.*padded"):
        hfexport.export(Packed().eval(), inputs, backend="dynamo")


def test_cells_in_a_python_loop_with_a_dynamic_time_axis_are_refused_by_name():
    class CellLoop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.step = torch.nn.GRUCell(3, 4)

        def forward(self, x):
            h = x.new_zeros(x.shape[0], 4)
            for t in range(x.shape[1]):
                h = self.step(x[:, t], h)
            return h

    with pytest.raises(hfexport.ExportError, match=r"nn\.GRUCell 'step' in a Python loop.*nn\.GRU"):
        hfexport.export(CellLoop().eval(), {"x": torch.randn(2, 5, 3)}, backend="dynamo",
                        dynamic_shapes={"x": {1: Dim("time", min=2, max=32)}})
