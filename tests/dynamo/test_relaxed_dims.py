"""Named ``Dim(min=, max=)`` ranges that torch.export's solver cannot prove: the export traces again with
``Dim.DYNAMIC`` over the same ranges, keeps them as the program's checked bounds, warns and records them
(hfexport_dynamo/tracer.py ``_export_with_ranges_as_hints``; issue 25)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import hfexport


class PadToEvenSliceBack(torch.nn.Module):
    def forward(self, x):  # [b, h, w, c]
        b, h, w, c = x.shape
        padded = F.pad(x, (0, 0, 0, 2 * ((w + 1) // 2) - w, 0, 2 * ((h + 1) // 2) - h))
        return padded.roll((1, 1), dims=(1, 2))[:, :h, :w, :].contiguous() * 2.0


SHAPES = {"x": {1: Dim("h", min=2, max=16), 2: Dim("w", min=2, max=16)}}


def test_plain_torch_export_refuses_the_named_ranges():
    """What the retry is for: the guard ``h <= 2*((h + 1)//2)`` holds for every h, but the solver cannot show it."""
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(PadToEvenSliceBack(), (torch.randn(2, 5, 7, 3),), dynamic_shapes=SHAPES)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_named_ranges_are_kept_as_checked_bounds(backend, caplog):
    model, x = PadToEvenSliceBack().eval(), torch.randn(2, 5, 7, 3, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="hfexport"):
        exported = hfexport.export(model, {"x": x}, backend=backend, dynamic_shapes=copy.deepcopy(SHAPES))
    assert any("refused the named dims h, w" in r.getMessage() for r in caplog.records)
    relaxed = exported.manifest["relaxed_dims"]
    assert [(r["input"], r["dim"], r["name"], r["min"], r["max"], r["checked"]) for r in relaxed] == [
        ("x", 1, "h", 2, 16, [2, 16]), ("x", 2, "w", 2, 16, [2, 16])]
    for shape in ((2, 6, 8, 3), (2, 16, 3, 3), (2, 2, 2, 3)):  # both parities, the bounds
        y = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(exported(x=y), model(y), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="outside the program's range"):
        exported(x=torch.randn(2, 17, 8, 3))


class DownUpSampleSliceBack(torch.nn.Module):
    """Sibling: a grid padded to even sizes, pooled by 2 and upsampled back, sliced to the input's size."""

    def forward(self, x):  # [b, c, h, w]
        b, c, h, w = x.shape
        padded = F.pad(x, (0, 2 * ((w + 1) // 2) - w, 0, 2 * ((h + 1) // 2) - h))
        up = F.interpolate(F.avg_pool2d(padded, 2), scale_factor=2, mode="nearest")
        return (up + padded)[:, :, :h, :w]


class SequenceWindowsOfThree(torch.nn.Module):
    """Sibling: a sequence padded to a multiple of 3, averaged per window of 3, sliced back."""

    def forward(self, x):  # [b, s, d]
        b, s, d = x.shape
        padded = F.pad(x, (0, 0, 0, 3 * ((s + 2) // 3) - s))
        means = padded.view(b, -1, 3, d).mean(2, keepdim=True).expand(-1, -1, 3, -1).reshape(b, -1, d)
        return (means + padded)[:, :s]


@pytest.mark.parametrize("model,x,shapes,others", [
    # w from 4: at h = w = 2 the program's guard (the pooled grid's 1 x 1, specialized away) refuses the input,
    # which the smallest-shape check refuses at export (next test)
    (DownUpSampleSliceBack(), torch.randn(1, 2, 7, 9), {"x": {2: Dim("h", min=2, max=32), 3: Dim("w", min=4, max=32)}},
     [(1, 2, 8, 6), (1, 2, 2, 32), (1, 2, 31, 5)]),
    (SequenceWindowsOfThree(), torch.randn(2, 7, 4), {"x": {1: Dim("s", min=4, max=40)}},  # s <= 3: next test
     [(2, 9, 4), (2, 4, 4), (2, 40, 4), (2, 11, 4)]),
])
def test_sibling_patterns_keep_the_named_ranges(model, x, shapes, others):
    """Two more patterns whose guards hold for every size in the named range but that torch.export's solver
    refuses ("Constraints violated"): the retry keeps the whole named range, and every remainder runs."""
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(model, (x,), dynamic_shapes=copy.deepcopy(shapes))
    exported = hfexport.export(model, {"x": x}, backend="dynamo", dynamic_shapes=copy.deepcopy(shapes))
    named = [(dim, d.__name__, d.min, d.max) for dim, d in shapes["x"].items()]
    relaxed = exported.manifest["relaxed_dims"]
    assert [(r["dim"], r["name"], r["min"], r["max"]) for r in relaxed] == named
    assert all(r["checked"] == [r["min"], r["max"]] for r in relaxed)  # the whole range, checked
    for shape in others:
        y = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(exported(x=y), model(y), atol=1e-6, rtol=0)


def test_a_corner_of_the_named_ranges_that_the_program_refuses_fails_the_export():
    """h and w both at 2 pool to one cell, a size torch.export specialized away (its guard ``... != 1``): the
    ranges [2, 32] x [2, 32] claim a shape the program refuses, which the smallest-shape check finds at export."""
    shapes = {"x": {2: Dim("h", min=2, max=32), 3: Dim("w", min=2, max=32)}}
    with pytest.raises(hfexport.ExportError, match=r"verification at the smallest shape \(x=\[1, 2, 2, 2\]\).*"
                                                   r"Guard failed"):
        hfexport.export(DownUpSampleSliceBack(), {"x": torch.randn(1, 2, 7, 9)}, backend="dynamo",
                        dynamic_shapes=shapes)


def test_sizes_the_programs_guards_refuse_are_refused_by_range(caplog):
    """The solver's guard ``(s + 2) // 3 != 1`` (one window of 3: the view's inferred size specialized away from 1)
    does not hold for s <= 3: the retry's range is narrowed to the sizes the program's guards admit, [4, 40], so
    that s = 2 is refused by name and range before the program runs (it raised torch's "Guard failed"), and the
    warning names the guard and the narrowed range."""
    model, shapes = SequenceWindowsOfThree(), {"x": {1: Dim("s", min=2, max=40)}}
    with caplog.at_level(logging.WARNING, logger="hfexport"):
        exported = hfexport.export(model, {"x": torch.randn(2, 7, 4)}, backend="dynamo", dynamic_shapes=shapes)
    assert exported.manifest["relaxed_dims"][0]["checked"] == [4, 40]
    assert any("((2 + L['x'].size()[1]) // 3) != 1" in r.getMessage() and "narrowed s to [4, 40]" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ValueError, match="outside the program's range"):
        exported(x=torch.randn(2, 2, 4))
    y = torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(exported(x=y), model(y), atol=1e-6, rtol=0)
