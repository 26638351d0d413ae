"""Each ExecuTorch workaround, left out with ``disable=("<its function name>",)``: what goes wrong without it, and
the eager value with it. Small modules, one export per side, all on ``executorch-xnnpack``."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

from helpers import ComplexRope, tiny_model  # noqa: E402

ATOL = 1e-4


def export(model, inputs, disable=(), **options):
    return hfexport.export(model.eval(), copy.deepcopy(inputs), backend="executorch-xnnpack", disable=disable,
                           **options)


def assert_matches(exported, model, inputs):
    """Run on the ExecuTorch runtime; floats within ATOL of eager, integers exactly."""
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs))
    actual = exported(**copy.deepcopy(inputs))
    expected = expected if isinstance(expected, tuple | list) else (expected,)
    actual = actual if isinstance(actual, tuple | list) else (actual,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape, a.dtype, e.dtype)
        if e.is_floating_point():
            torch.testing.assert_close(a, e, atol=ATOL, rtol=0, equal_nan=True)
        else:
            assert torch.equal(a, e), (a, e)


def fixes(exported) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name in exported.manifest["workarounds"]["fixes"]}


def patches(exported) -> set[str]:
    return {p["name"].rsplit(".", 1)[-1] for p in exported.manifest["workarounds"]["patches"]}


# ── stage 1 ────────────────────────────────────────────────────────────────────────────────────────────
class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_prepare_for_xnnpack():
    """Disabled like any workaround: no device/dtype move and no partitioner, so nothing is delegated."""
    torch.manual_seed(0)
    model, inputs = Mlp(), {"x": torch.randn(2, 8)}
    without = export(model, inputs, disable=("prepare_for_xnnpack",))
    assert without.manifest["executorch"]["delegated_fraction"] == 0.0
    assert without.manifest["executorch"]["partitioners"] == []
    assert any("prepare_for_xnnpack disabled" in n for n in without.manifest["notes"])
    with_it = export(model, inputs)
    assert with_it.manifest["executorch"]["delegated_fraction"] == 1.0
    assert with_it.manifest["executorch"]["partitioners"] == ["XnnpackPartitioner"]
    assert_matches(without, model, inputs)
    assert_matches(with_it, model, inputs)


# ── stage 2: torch patches ─────────────────────────────────────────────────────────────────────────────
class KeepRows(torch.nn.Module):
    def forward(self, x, keep):
        rows = torch.nonzero(keep).squeeze(-1)
        return x.index_select(0, rows) * 2, torch.nonzero(x > 0) * 2, torch.argwhere(keep.view(2, 2))


def test_patch_nonzero():
    torch.manual_seed(0)
    model = KeepRows()
    inputs = {"x": torch.randn(4, 3), "keep": torch.tensor([False, True, True, False])}
    without = export(model, inputs, disable=("_patch_nonzero",), verify=False)  # its verification cannot run:
    assert "0x12" in without.manifest["verification"]["error"]  # recorded, not raised
    with pytest.raises(RuntimeError, match="0x12"):  # "2 input tensors have different dim orders"
        without(**inputs)
    with_it = export(model, inputs)
    assert "_patch_nonzero" in patches(with_it)
    assert_matches(with_it, model, inputs)
    other = {"x": torch.randn(4, 3), "keep": torch.tensor([True, True, False, True])}
    assert_matches(with_it, model, other)


# ── stage 3: ExecuTorch patches ────────────────────────────────────────────────────────────────────────
class SelectThenAttend(torch.nn.Module):
    """c10: attention over a batch selected with a boolean mask (unbacked batch)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x, keep, mask):
        x, mask = x[keep], mask[keep]
        b, s = x.shape[0], x.shape[1]
        q, k, v = (p(x).view(b, s, 2, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 16)


def test_patch_dim_order_from_stride():
    model = SelectThenAttend()
    inputs = {"x": torch.randn(3, 4, 16), "keep": torch.tensor([True, False, True]),
              "mask": torch.ones(3, 1, 4, 4, dtype=torch.bool)}
    # torch's SDPA decomposition has the unbacked strides; XNNPACK_DECOMPOSITIONS' bmm form does not, so the bug
    # shows where that one does not run (no partitioner: portable kernels only)
    with pytest.raises(hfexport.ExportError, match="GuardOnDataDependentSymNode"):
        export(model, inputs, disable=("_patch_dim_order_from_stride", "prepare_for_xnnpack"))
    assert_matches(export(model, inputs, disable=("prepare_for_xnnpack",)), model, inputs)
    with_it = export(model, inputs)
    assert_matches(with_it, model, inputs)
    assert_matches(with_it, model, dict(inputs, keep=torch.tensor([True, True, True])))


class Rank(torch.nn.Module):
    def forward(self, scores):
        values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
        return values, indices, torch.argsort(scores, dim=0)


class ArgsortOnly(torch.nn.Module):
    def forward(self, scores):
        return torch.argsort(scores, dim=-1)


def test_patch_default_decomposition_table():
    inputs = {"scores": torch.tensor([[0.3, 0.9, 0.3, float("nan"), -1.0], [0.2, 0.2, 0.8, 0.4, 0.2]])}
    with pytest.raises(hfexport.ExportError, match="sort.stable is not in Core ATen"):
        export(Rank(), inputs, disable=("_patch_default_decomposition_table",))
    # sort.default is Core ATen but has no portable kernel: caught before the runtime says "Missing operator".
    with pytest.raises(hfexport.ExportError, match="no kernel in the ExecuTorch portable library: aten::sort"):
        export(ArgsortOnly(), inputs, disable=("_patch_default_decomposition_table",))
    with_it = export(Rank(), inputs)
    assert "_patch_default_decomposition_table" in patches(with_it)
    assert_matches(with_it, Rank(), inputs)  # ties in input order, NaN sorted as eager, indices exact


class RepeatRows(torch.nn.Module):
    def forward(self, x, counts):
        return torch.repeat_interleave(x, counts, dim=0) * 2.0


def test_patch_aten_dialect_verifier():
    inputs = {"x": torch.randn(3, 4), "counts": torch.tensor([2, 1, 3])}
    with pytest.raises(hfexport.ExportError, match="repeat_interleave.Tensor is not in Core ATen opset"):
        export(RepeatRows(), inputs, disable=("_patch_aten_dialect_verifier",))
    with_it = export(RepeatRows(), inputs)
    assert with_it.manifest["executorch"]["non_core_aten_on_portable_kernels"] == ["aten.repeat_interleave.Tensor"]
    assert_matches(with_it, RepeatRows(), inputs)
    assert_matches(with_it, RepeatRows(), dict(inputs, counts=torch.tensor([5, 0, 7])))  # 12 rows, unbacked


class Positions(torch.nn.Module):
    def forward(self, x, boundaries, sequence):
        return (torch.bucketize(x, boundaries, right=True), torch.searchsorted(sequence, x, side="right"),
                torch.searchsorted(sequence, x, out_int32=True))


class RunningMax(torch.nn.Module):
    def forward(self, x):
        return torch.cummax(x, dim=-1).values  # not Core ATen, no decomposition, no portable kernel


def test_non_core_aten_policy_decomposes_or_names_the_op():
    """d04's kind: bucketize and searchsorted lower through our comparison-and-sum decompositions; an op with
    neither a decomposition nor a kernel fails with an error that names it and says what to do."""
    x = torch.tensor([[-1.0, 0.0, 0.5, 1.0], [1.5, 2.0, 3.0, float("nan")]])
    inputs = {"x": x, "boundaries": torch.tensor([0.0, 1.0, 1.0, 2.0]), "sequence": torch.tensor([0.0, 0.5, 2.0])}
    assert_matches(export(Positions(), inputs), Positions(), inputs)  # NaN in the last bucket, as eager
    with pytest.raises(hfexport.ExportError, match=r"aten.cummax.default is not in Core ATen, has no decomposition"
                                                   r".*no kernel in the ExecuTorch portable library") as info:
        export(RunningMax(), {"x": x})
    assert "Rewrite that step of the model" in str(info.value) and "ET_DECOMPOSITIONS" in str(info.value)


class CheckedPlaceholders(torch.nn.Module):
    """LLaVA's placeholder check (transformers' ``torch_compilable_check`` on a tensor condition)."""

    def forward(self, embeds, ids, features):
        mask = (ids == 7).unsqueeze(-1)
        torch._check_tensor_all(mask.sum() * embeds.shape[-1] == features.numel())
        return embeds.masked_scatter(mask, features), torch.ops.aten._is_all_true(ids >= 0)


def test_fix_sym_ite_of_tensor_check_and_is_all_true():
    """A tensor check traces to ``_is_all_true``, ``item`` and ``torch.sym_ite``: the edge verifier rejects the
    ``sym_ite`` with a bare AssertionError, and ``_is_all_true`` lowers through ET_DECOMPOSITIONS (not any(not t))."""
    inputs = {"embeds": torch.randn(2, 6, 4), "ids": torch.tensor([[7, 7, 1, 2, 3, 4], [0, 7, 1, 1, 1, 1]]),
              "features": torch.randn(3, 4)}
    with pytest.raises(hfexport.ExportError, match=r"step to_edge_transform_and_lower failed for CheckedPlaceholders: "
                                                   r"AssertionError"):
        export(CheckedPlaceholders(), inputs, disable=("_fix_sym_ite_of_tensor_check",), dynamic=True)
    exported = export(CheckedPlaceholders(), inputs, dynamic=True)
    assert_matches(exported, CheckedPlaceholders(), inputs)  # all ids >= 0: True
    other = {"embeds": torch.randn(3, 5, 4), "ids": torch.tensor([[7, -1, 1, 2, 3], [0, 1, 1, 7, 1], [1] * 5]),
             "features": torch.randn(2, 4)}
    assert exported(**copy.deepcopy(other))[1].item() is False  # a negative id: False, at another shape
    assert_matches(exported, CheckedPlaceholders(), other)


class LastEosPooling(torch.nn.Module):
    """The BART family's sequence-classification pooling: each row's hidden state at its last <eos> (id 2), after
    checking that every row has as many of them (MBart, PLBart, UMT5)."""

    def forward(self, hidden, ids):
        eos_mask = ids.eq(2)
        torch._check(torch.unique_consecutive(eos_mask.sum(1)).numel() == 1)
        selected = hidden[eos_mask, :]
        torch._check(selected.shape[0] // hidden.shape[0] >= 1)
        return selected.view(hidden.shape[0], -1, hidden.shape[-1])[:, -1, :]


LAST_EOS_INPUTS = {"hidden": torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0)),
                   "ids": torch.tensor([[5, 2, 7, 7, 2, 1], [2, 9, 9, 2, 1, 1]])}


@pytest.fixture(scope="module")
def last_eos_pooling():
    """``LastEosPooling`` exported with every workaround (dynamic): the "with it" half of the two tests below."""
    return export(LastEosPooling(), LAST_EOS_INPUTS, dynamic=True)


def test_fix_assertion_only_non_core_op(last_eos_pooling):
    """``unique_consecutive`` (not Core ATen, no portable kernel) feeds only assertions on its size: they go, as
    ExecuTorch removes every graph assertion before emission, and the op goes with them. Its decomposition
    (``ET_DECOMPOSITIONS``, added through ``_patch_default_decomposition_table``) is left out too, to show the fix
    alone: an op with no decomposition fails the same way."""
    inputs = LAST_EOS_INPUTS
    with pytest.raises(hfexport.ExportError, match=r"aten.unique_consecutive.default is not in Core ATen"):
        export(LastEosPooling(), inputs, disable=("_fix_assertion_only_non_core_op",
                                                  "_patch_default_decomposition_table"), dynamic=True)
    exported = last_eos_pooling
    assert "_fix_assertion_only_non_core_op" in fixes(exported)
    assert_matches(exported, LastEosPooling(), inputs)
    other = {"hidden": torch.randn(3, 5, 4), "ids": torch.tensor([[2, 1, 1, 1, 1], [1, 1, 1, 1, 2], [1, 2, 1, 1, 1]])}
    assert_matches(exported, LastEosPooling(), other)  # another batch, sequence and <eos> count


class RealImages(torch.nn.Module):
    """Idefics3's selection of the real images: a boolean index, then ``torch._check`` that one is left, which
    torch.export records as ``_assert_scalar(torch.sym_not(n == 0))``."""

    def forward(self, pixels, real):
        selected = pixels[real]
        torch._check(torch.sym_not(selected.shape[0] == 0))
        return selected * 2


def test_patch_assertions_on_python_sym_functions():
    """The edge verifier rejects ``torch.sym_not`` as a target with a bare AssertionError; the assertion it feeds
    goes, as ExecuTorch removes it before emission, and the ``sym_not`` with it."""
    inputs = {"pixels": torch.randn(5, 3), "real": torch.tensor([True, False, True, True, False])}
    with pytest.raises(hfexport.ExportError, match=r"step to_edge_transform_and_lower failed for RealImages: AssertionError"):
        export(RealImages(), inputs, disable=("_patch_assertions_on_python_sym_functions",), dynamic=True)
    exported = export(RealImages(), inputs, dynamic=True)
    assert "_patch_assertions_on_python_sym_functions" in patches(exported)
    assert_matches(exported, RealImages(), inputs)
    assert_matches(exported, RealImages(), {"pixels": torch.randn(7, 3), "real": torch.tensor([1, 1, 0, 1, 1, 1, 0]).bool()})


class LengthAndLiteralRanges(torch.nn.Module):
    """``arange`` of a dynamic length beside ``arange`` of the literals 1..8: one literal equals the number
    ``CSEPass`` gives the length's ``sym_size`` node."""

    def forward(self, x):
        return (x + torch.arange(x.shape[1]), *(torch.arange(k) + x.shape[0] for k in range(1, 9)))


def test_patch_cse_keys_nodes_apart_from_ints():
    """Without the patch one ``arange(k)`` is merged into ``arange(x.shape[1])``: verification finds it."""
    inputs = {"x": torch.zeros(2, 5, dtype=torch.long)}
    with pytest.raises(hfexport.VerificationError, match=r"1 of 9 outputs differ from eager"):
        export(LengthAndLiteralRanges(), inputs, disable=("_patch_cse_keys_nodes_apart_from_ints",), dynamic=True)
    exported = export(LengthAndLiteralRanges(), inputs, dynamic=True)
    assert_matches(exported, LengthAndLiteralRanges(), inputs)
    assert_matches(exported, LengthAndLiteralRanges(), {"x": torch.zeros(3, 7, dtype=torch.long)})


def test_patch_view_larger_than_base(last_eos_pooling):
    """``selected.view(batch, -1, h)`` of a boolean index ``[u, h]`` is bounded by ``8 x (u_max // 2) x h``, more
    than its base: as a view sharing the base's memory, the program does not load."""
    with pytest.raises(hfexport.ExportError, match=r"cannot load the program it was just lowered to \(Failed to "
                                                   r"load method forward, error: 0x:?21"):  # not "damaged or crafted"
        export(LastEosPooling(), LAST_EOS_INPUTS, disable=("_patch_view_larger_than_base",), dynamic=True)
    exported = last_eos_pooling
    assert "_patch_view_larger_than_base" in patches(exported)
    assert_matches(exported, LastEosPooling(), {"hidden": torch.randn(8, 3, 4), "ids": torch.full((8, 3), 2)})


class PrefilledCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.ones(1, 6, 4), persistent=False)
        self.register_buffer("steps", torch.zeros(1))  # mutated, all zeros: not serialized

    def forward(self, k_val, cache_position):
        self.k_cache.index_copy_(1, cache_position, k_val)
        self.steps.add_(1.0)
        return self.k_cache * 2.0 + self.steps


def test_patch_mutable_buffer_initial_state():
    inputs = {"k_val": torch.full((1, 2, 4), -3.0), "cache_position": torch.tensor([2, 3])}
    expected = PrefilledCache()(**copy.deepcopy(inputs))
    without = export(PrefilledCache(), inputs, disable=("_patch_mutable_buffer_initial_state",), verify=False)
    assert without.manifest["verification"]["passed"] is False  # by default: VerificationError
    wrong = without(**copy.deepcopy(inputs))  # the verification's run was undone (reset): this is a first call
    assert torch.equal(wrong[0, 0], torch.full((4,), 1.0))  # untouched rows read 0 (0 * 2 + 1), not 1 * 2 + 1
    with_it = export(PrefilledCache(), inputs)
    assert [n.rsplit(".", 1)[-1] for n in with_it.manifest["executorch"]["initialized_mutable_buffers"]] == ["k_cache"]
    torch.testing.assert_close(with_it(**copy.deepcopy(inputs)), expected, atol=ATOL, rtol=0)
    with pytest.raises(hfexport.ExportError, match="k_cache' is mutated by the program and has a non-zero initial"):
        export(PrefilledCache(), inputs, alloc_mutable_buffers=False)


class SplitPacked(torch.nn.Module):
    def forward(self, x):
        a, b = x.split(4, dim=2)  # split_with_sizes_copy returns Tensor[]; its pieces lead with the batch
        return a * b + torch.arange(x.shape[0]).view(-1, 1, 1)


def test_patch_arg_validator_list_return():
    inputs, other = {"x": torch.randn(2, 3, 8)}, {"x": torch.randn(3, 5, 8)}
    without = export(SplitPacked(), inputs, disable=("_patch_arg_validator_list_return",), dynamic=True)
    assert_matches(without, SplitPacked(), inputs)
    # the batch was specialized to 2 inside to_edge: the manifest says so, and the call is refused by name before
    # the runtime would fail with error 0x12
    with pytest.raises(ValueError, match="dim 0 is static"):
        without(**other)
    with_it = export(SplitPacked(), inputs, dynamic=True)
    assert_matches(with_it, SplitPacked(), other)


# ── the step after stage 4: bound dynamic dims (memory budget) ───────────────────────────────────────────
class AddPositions(torch.nn.Module):
    def forward(self, x):
        return x + torch.arange(x.shape[1])


def test_every_dynamic_dim_gets_a_finite_bound():
    """Pipeline code, not a workaround: ``Dim.AUTO`` leaves the sequence unbounded, and ExecuTorch would plan it at
    the trace size (a longer input then fails at run time). The step bounds it (``dim_upper_bound``, 64 by default),
    says so in the manifest and the notes, and an input longer than the example runs."""
    inputs, longer = {"x": torch.randn(2, 4)}, {"x": torch.randn(2, 9)}
    with pytest.raises(ValueError, match=r"disable names no workaround.*_fix_unbounded_range_constraints"):
        export(AddPositions(), inputs, disable=("_fix_unbounded_range_constraints",), dynamic=True)
    events = []
    exported = hfexport.export(AddPositions(), copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True,
                               progress=lambda e: events.append(e.step) if e.status == "done" else None)
    assert "bound dynamic dims (memory budget)" in events
    assert "_fix_unbounded_range_constraints" not in fixes(exported)  # no longer a registered fix
    section = exported.manifest["executorch"]
    assert section["bounded_dims"] and all(v == [2, 64] for v in section["bounded_dims"].values())
    assert {d["max"] for d in exported.manifest["inputs"][0]["dynamic_dims"].values()} == {64}
    assert any(n.startswith("dynamic dims given a finite upper bound: ") and "in [2, 64]" in n
               for n in exported.manifest["notes"])
    assert section["planned_memory_bytes"] > 0  # planned at the bounds (no role here: no budget to fit)
    assert_matches(exported, AddPositions(), inputs)
    assert_matches(exported, AddPositions(), longer)  # 9 > the example's 4: planned for 64
    assert_matches(exported, AddPositions(), {"x": torch.randn(2, 64)})
    # the bound is the user's setting: past it the input is refused, by name, before the runtime
    small = export(AddPositions(), inputs, dynamic=True, dim_upper_bound=8)
    assert small.manifest["executorch"]["dim_upper_bound"] == 8
    assert_matches(small, AddPositions(), {"x": torch.randn(2, 8)})
    with pytest.raises(ValueError, match=r"size 9 in dim 1 .*outside the program's range.*in \[1, 8\]"):
        small(**longer)


def test_an_explicit_dim_bound_is_kept():
    exported = export(AddPositions(), {"x": torch.randn(2, 4)},
                      dynamic_shapes={"x": {1: Dim("seq", min=2, max=16)}})
    assert exported.manifest["executorch"]["bounded_dims"] == {}
    assert exported.manifest["inputs"][0]["dynamic_dims"]["1"]["max"] == 16
    assert_matches(exported, AddPositions(), {"x": torch.randn(2, 16)})
    with pytest.raises(ValueError, match="outside the program's range"):
        exported(**{"x": torch.randn(2, 17)})


# ── stage 5: FX node fixes ─────────────────────────────────────────────────────────────────────────────
SEQ = Dim("s", min=2, max=32)


class SquaredZeros(torch.nn.Module):
    def forward(self, x):
        return x.new_zeros(x.shape[1] ** 2) + x.sum()


class SumOfSizes(torch.nn.Module):
    def forward(self, x, y):
        return torch.zeros(torch.sym_sum([x.shape[1], y.shape[1], 1]))


class NotFour(torch.nn.Module):
    def forward(self, x):
        return torch.full((1,), x.shape[1] != 4).float() * x.sum()


@pytest.mark.parametrize("name, model, inputs, other, shapes, error", [
    ("_fix_sym_pow", SquaredZeros(), {"x": torch.randn(1, 6)}, {"x": torch.randn(1, 3)}, {"x": {1: SEQ}},
     "invalid target for call_function <built-in function pow>"),
    ("_fix_sym_sum", SumOfSizes(), {"x": torch.randn(1, 6), "y": torch.randn(1, 5)},
     {"x": torch.randn(1, 3), "y": torch.randn(1, 9)}, {"x": {1: SEQ}, "y": {1: Dim("t", min=2, max=32)}},
     "Unsupported target type: <function sym_sum"),
    ("_fix_sym_ne", NotFour(), {"x": torch.randn(1, 6)}, {"x": torch.randn(1, 4)}, {"x": {1: SEQ}},
     "invalid target for call_function <built-in function ne>"),
], ids=["pow", "sym_sum", "ne"])
def test_fix_sym_ops(name, model, inputs, other, shapes, error):
    with pytest.raises(hfexport.ExportError, match=error):
        export(model, inputs, disable=(name,), dynamic_shapes=shapes)
    with_it = export(model, inputs, dynamic_shapes=shapes)
    assert name in fixes(with_it)
    assert_matches(with_it, model, inputs)
    assert_matches(with_it, model, other)  # ne: False at 4, True at 6 (not specialised on the trace)


class PadByNegativeRemainder(torch.nn.Module):
    """ViTDet's ``window_partition``: pad ``[b, h, w, c]`` by ``(-h) % 2`` to even sizes, pool 2x2 windows."""

    def forward(self, x):
        b, h, w, c = x.shape
        pad_h, pad_w = (-h) % 2, (-w) % 2
        padded = torch.nn.functional.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        return padded.view(b, (h + pad_h) // 2, 2, (w + pad_w) // 2, 2, c).sum((2, 4))


def test_fix_sym_floor_mod():
    """The runtime's remainder truncates (``-7 % 2 == -1``): without the fix an odd size pads by -1 and fails."""
    inputs = {"x": torch.randn(1, 6, 8, 3)}
    shapes = {"x": {1: Dim("h", min=2, max=16), 2: Dim("w", min=2, max=16)}}
    odd = {"x": torch.randn(1, 7, 9, 3)}
    without = export(PadByNegativeRemainder(), inputs, dynamic_shapes=shapes, disable=("_fix_sym_floor_mod",),
                     verify=False)
    with pytest.raises(RuntimeError, match="0x12"):  # constant_pad_nd: "Padding values must be non-negative"
        without(**odd)
    with_it = export(PadByNegativeRemainder(), inputs, dynamic_shapes=shapes)
    assert "_fix_sym_floor_mod" in fixes(with_it)
    for sample in (inputs, odd, {"x": torch.randn(1, 5, 4, 3)}):
        assert_matches(with_it, PadByNegativeRemainder(), sample)


class PatchEmbed3d(torch.nn.Module):
    """Qwen2-VL's ``PatchEmbed``: packed patches ``[n, 3 * 2 * 4 * 4]`` through a ``Conv3d`` whose kernel is the
    whole patch (2 frames of 4x4 pixels), one output position each."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=False)

    def forward(self, x):
        return self.proj(x.view(-1, 3, 2, 4, 4)).view(-1, 8)


def test_fix_patchify_conv3d_as_linear():
    torch.manual_seed(0)
    model, inputs = PatchEmbed3d().eval(), {"x": torch.randn(6, 96)}
    shapes = {"x": {0: Dim("patches", min=2, max=64)}}
    without = export(model, inputs, dynamic_shapes=shapes, disable=("_fix_patchify_conv3d_as_linear",), verify=False)
    with pytest.raises(RuntimeError, match="0x12"):  # convolution.out: "Expect input tensor to be 3-D or 4-D"
        without(**inputs)
    with_it = export(model, inputs, dynamic_shapes=shapes)
    assert "_fix_patchify_conv3d_as_linear" in fixes(with_it)
    for sample in (inputs, {"x": torch.randn(17, 96)}):
        assert_matches(with_it, model, sample)


class Cubes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(h.pow(2) + h ** 3 + h.pow(4.0)) + h.abs().pow(0.5)


def test_fix_pow_small_int_exponent():
    torch.manual_seed(0)
    model, inputs = Cubes(), {"x": torch.randn(2, 8)}
    without = export(model, inputs, disable=("_fix_pow_small_int_exponent",))
    with_it = export(model, inputs)
    pow_op = "aten::pow.Tensor_Scalar"
    assert without.manifest["executorch"]["portable_ops"][pow_op] == 3  # ** 3, 4.0, 0.5 (XNNPACK takes int 2)
    assert with_it.manifest["executorch"]["portable_ops"][pow_op] == 1  # only ** 0.5 is left
    assert with_it.manifest["executorch"]["delegated_fraction"] > without.manifest["executorch"]["delegated_fraction"]
    assert_matches(without, model, inputs)  # a delegation fix: both are right
    assert_matches(with_it, model, inputs)


class PackedAttention(torch.nn.Module):
    """GPT-2's pattern: SDPA output reshaped/transposed/reshaped, then ``view(-1, size)`` (Conv1D)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.reshape(b, -1, s, 8).transpose(1, 2).reshape(b, s, -1)
        return self.proj(out.view(-1, out.size(-1)))


def test_fix_sdpa_contiguous_output():
    model, inputs = PackedAttention(), {"x": torch.randn(2, 8, 16)}
    with pytest.raises(hfexport.ExportError, match="Cannot view a tensor with shape"):
        export(model, inputs, disable=("_fix_sdpa_contiguous_output",))
    with_it = export(model, inputs)
    assert "_fix_sdpa_contiguous_output" in fixes(with_it)
    assert_matches(with_it, model, inputs)


# ── _fix_complex_to_real_pairs (d14) ───────────────────────────────────────────────────────────────────
class ComplexBufferRope(torch.nn.Module):
    """Meta's reference Llama: ``freqs_cis`` precomputed as a complex buffer, sliced to the sequence."""

    def __init__(self):
        super().__init__()
        t = torch.outer(torch.arange(16.0), torch.arange(1, 5, dtype=torch.float32) / 4)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(t), t), persistent=False)

    def forward(self, x):
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(z * self.freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, -1)).flatten(-2)


class ComplexOutput(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x) * 2


@pytest.mark.parametrize("model,inputs,error", [
    (ComplexRope(), {"x": torch.randn(2, 3, 5, 8), "positions": torch.arange(5.0).repeat(2, 1)},
     "aten.polar.default is not in Core ATen"),
    (ComplexBufferRope(), {"x": torch.randn(2, 5, 3, 8)},
     "SpecViolationError: These operators are taking Tensor inputs with mismatched dtypes"),
])
def test_fix_complex_to_real_pairs(model, inputs, error):
    with pytest.raises(hfexport.ExportError, match=error):
        export(model, inputs, disable=("_fix_complex_to_real_pairs",))
    with_it = export(model, inputs)
    assert "_fix_complex_to_real_pairs" in fixes(with_it)
    assert_matches(with_it, model, inputs)


def test_fix_complex_to_real_pairs_refuses_a_complex_output():
    """The runtime has no complex kernels: a program that returns a complex tensor fails, saying what to return."""
    with pytest.raises(hfexport.ExportError, match=r"ComplexRewriteError: the program returns a complex tensor "
                                                   r"\(return torch.view_as_real\(z\) instead\): the executorch "
                                                   r"backend has no complex dtype"):
        export(ComplexOutput(), {"x": torch.randn(3, 2)})


def test_patch_xnnpack_quantizer_integer_scalars(tiny_bert_int8):
    """quantize="int8": the XNNPACK quantizer makes `arange(n) + 0` (BERT's mask positions) a float add; the index
    it feeds fails at calibration without the patch."""
    with pytest.raises(hfexport.ExportError, match=r"step prepare_pt2e, calibration, convert_pt2e failed"
                                                   r".*tensors used as indices must be long"):
        hfexport.export(tiny_model("bert", layers=1), backend="executorch-xnnpack", quantize="int8",
                        disable=("_patch_xnnpack_quantizer_integer_scalars",))
    _, exported = tiny_bert_int8  # the same export with the patch (tests/executorch/conftest.py)
    assert "_patch_xnnpack_quantizer_integer_scalars" in patches(exported)
    assert exported.manifest["verification"]["passed"]


def test_every_workaround_has_a_test_here():
    """Every workaround hfexport_executorch registers (variants, workarounds/*.py) is tested: here by its name, or by
    the named test of another file."""
    import hfexport_executorch.exporter_executorch  # noqa: F401 - imports workarounds/*.py, which register them

    tested = {"prepare_for_xnnpack", "_patch_nonzero", "_patch_dim_order_from_stride",
              "_patch_default_decomposition_table", "_patch_aten_dialect_verifier",
              "_patch_arg_validator_list_return", "_patch_mutable_buffer_initial_state", "_fix_sym_pow", "_fix_sym_sum",
              "_fix_sym_ne", "_fix_pow_small_int_exponent", "_fix_sdpa_contiguous_output", "_fix_view_as_reshape",
              "_patch_xnnpack_quantizer_integer_scalars", "_fix_sym_ite_of_tensor_check",
              "_fix_assertion_only_non_core_op", "_patch_view_larger_than_base", "_fix_float_casts_to_variant_dtype",
              "_fix_decompose_inside_control_flow", "_fix_sym_floor_mod", "_fix_patchify_conv3d_as_linear",
              "_patch_unbacked_size_upper_bound", "_patch_assertions_on_python_sym_functions",
              "_patch_cse_keys_nodes_apart_from_ints", "_patch_exact_quotient_upper_bound",
              "_patch_unsqueeze_one_dynamic_dim", "_patch_gelu_tanh_not_delegated",
              "_patch_rank_above_xnnpack_limit_not_delegated", "_patch_max_dim_serializable",
              "_patch_pass_through_outputs_copied"}
    registered = {r.name for r in hfexport.list_workarounds() if r.module.startswith("hfexport_executorch.")}
    untestable_here = {"prepare_for_cuda"}  # needs a GPU: test_executorch.py checks its error without one
    tested_elsewhere = {
        "_patch_scan_buffers_resized": ("test_executorch_scan", "test_patch_scan_buffers_resized"),
        "_fix_negative_constant_pad": ("test_executorch_bounds", "test_fix_negative_constant_pad"),
        "_patch_conv1d_one_dynamic_dim": ("test_executorch_bounds", "test_patch_conv1d_one_dynamic_dim"),
        "_patch_is_nhwc_without_size_guards": ("test_executorch_bounds", "test_patch_is_nhwc_without_size_guards"),
        "_patch_preprocess_copy_shares_weights": ("test_executorch_export_cost",
                                                  "test_patch_preprocess_copy_shares_weights"),
        "_patch_partition_without_regenerating_the_graph": ("test_executorch_export_cost",
                                                            "test_patch_partition_without_regenerating_the_graph"),
        "_patch_duplicated_constant_shares_its_tensor": ("test_executorch_export_cost",
                                                         "test_patch_duplicated_constant_shares_its_tensor"),
        "_patch_linear_conversion_through_reshapes": ("test_xnnpack_linear",
                                                      "test_patch_linear_conversion_through_reshapes"),
        "_patch_linear_partition_exact": ("test_xnnpack_linear", "test_patch_linear_partition_exact"),
        "_fix_last_dim_mean_as_average_pooling": ("test_xnnpack_partitions",
                                                  "test_a_norms_mean_stays_in_the_xnnpack_partition"),
        "_fix_reshape_one_dynamic_dim_inferred": ("test_xnnpack_partitions",
                                                  "test_rotary_embedding_and_head_reshapes_stay_in_one_xnnpack_partition"),
        "_fix_rotary_cat_as_linear": ("test_xnnpack_partitions", "test_the_rotary_linear_is_exact"),
    }
    for name, (test_module, test) in tested_elsewhere.items():
        assert callable(getattr(importlib.import_module(test_module), test, None)), (name, test_module, test)
    assert registered == tested | untestable_here | set(tested_elsewhere)


class LinearThenUnsqueeze(torch.nn.Module):
    """``unsqueeze(-1)`` of a ``[batch, seq, 8]`` activation: an ``unsqueeze_copy`` with two dynamic dims."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x).unsqueeze(-1)
        return (y * y).sum(-1)


def test_unsqueeze_with_two_dynamic_dims_stays_on_portable_kernels():
    model = LinearThenUnsqueeze().eval()
    traced = {"x": torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))}
    exported = export(model, traced, dynamic=True)
    assert exported.manifest["executorch"]["delegated_fraction"] > 0  # the Linear and the multiply stay delegated
    for shape in ((3, 7, 8), (1, 2, 8)):
        assert_matches(exported, model, {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(1))})

    with pytest.raises(hfexport.ExportError, match="XNNPACK reshape only supports 1 dynamic dimension"):
        export(model, traced, disable=("_patch_unsqueeze_one_dynamic_dim",), dynamic=True)


class TanhGelu(torch.nn.Module):
    def forward(self, x):
        return F.gelu(x * 1.0, approximate="tanh") + F.gelu(x)  # transformers' gelu_pytorch_tanh, and exact GELU


def test_patch_gelu_tanh_not_delegated():
    """XNNPACK runs every gelu as the erf form: the tanh form differs by up to 4.7e-4 (near x = -2.7)."""
    inputs = {"x": torch.linspace(-4.0, 4.0, 96).reshape(3, 32)}
    expected = TanhGelu()(**inputs)
    without = export(TanhGelu(), inputs, disable=("_patch_gelu_tanh_not_delegated",), verify=False)
    assert (without(**inputs) - expected).abs().max() > 4e-4
    with_it = export(TanhGelu(), inputs)
    torch.testing.assert_close(with_it(**inputs), expected, atol=1e-6, rtol=0)
    section = with_it.manifest["executorch"]
    assert "aten::gelu.default" in section["portable_ops"], section  # the tanh form, on the portable kernel
    assert section["delegates"] == 2, section  # the multiply before it, the exact GELU and the add after it


class EightDimFold(torch.nn.Module):
    """Inkling's fold of a temporal patch: an 8-dim reshape and permute between two Linears."""

    def __init__(self):
        super().__init__()
        self.embed, self.proj = torch.nn.Linear(8, 64), torch.nn.Linear(16, 8)

    def forward(self, x):
        y = self.embed(x).reshape(x.shape[0], 1, 2, 2, 2, 2, 2, 2).permute(0, 1, 3, 2, 5, 4, 7, 6)
        return self.proj(y.reshape(x.shape[0], 4, 16))


def test_patch_rank_above_xnnpack_limit_not_delegated():
    """XNNPACK defines no tensor of more than 6 dims: delegated, the program does not load; the 8-dim nodes stay
    on portable kernels and the Linears are delegated."""
    model, inputs = EightDimFold(), {"x": torch.randn(2, 8, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(hfexport.ExportError, match=r"cannot load the program it was just lowered to"):
        export(model, inputs, disable=("_patch_rank_above_xnnpack_limit_not_delegated",), dynamic=True)
    exported = export(model, inputs, dynamic=True)
    assert exported.manifest["executorch"]["delegated_fraction"] > 0
    assert_matches(exported, model, {"x": torch.randn(5, 8)})


class PatchesIntoPixelShuffle(torch.nn.Module):
    """SigLIP's patch embedding (``flatten(2).transpose(1, 2)``: the patch dim has stride 1) into a LayerNorm, then
    Cohere2-Vision's pixel shuffle: two reshapes, the second merging dims that only a contiguous tensor can view."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 16, 2, stride=2)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, pixels):
        patches = self.embed(pixels).flatten(2).transpose(1, 2)  # [b, n, 16]
        h = self.norm(patches + 1.0)
        b, n, c = h.shape
        return h.reshape(b, 4, n // 4, c).reshape(b, 4, n // 8, 2 * c).permute(0, 2, 1, 3)


def test_layer_norm_decomposition_is_contiguous_like_eager():
    """Eager's layer norm returns a contiguous tensor for a transposed input; XNNPACK_DECOMPOSITIONS' elementwise
    form would keep the transposed layout, and the pixel shuffle's view (made when ``to_edge`` first
    decomposes the reshape) failed with "Cannot view a tensor" on the next re-trace."""
    from hfexport_executorch._decompositions import layer_norm_delegable

    transposed = torch.randn(2, 16, 6).transpose(1, 2)
    weight, bias = torch.randn(16), torch.randn(16)
    out, _, _ = layer_norm_delegable(transposed, [16], weight, bias)
    assert out.is_contiguous()
    torch.testing.assert_close(out, F.layer_norm(transposed, [16], weight, bias), atol=1e-5, rtol=0)
    model, inputs = PatchesIntoPixelShuffle(), {"pixels": torch.randn(1, 3, 8, 8)}
    assert_matches(export(model, inputs), model, inputs)


class MaxOverDims(torch.nn.Module):
    def forward(self, x):  # x [b, c, h, w]
        return (x.max(dim=-1).values.sum() + x.max(dim=1, keepdim=True).values
                + x.max(dim=-1, keepdim=True).values * 2.0 + x.max(dim=3, keepdim=True).values)


def test_patch_max_dim_serializable():
    """XNNPACK's partitioner takes any 4-D ``max.dim``; its serializer only dims 2 or 3 (as given) with keepdim."""
    model, inputs = MaxOverDims(), {"x": torch.randn(2, 3, 4, 5)}
    with pytest.raises(hfexport.ExportError, match="amax.default only supports keep_dim == True"):
        export(model, inputs, disable=("_patch_max_dim_serializable",))
    exported = export(model, inputs)
    assert_matches(exported, model, inputs)
    assert exported.manifest["executorch"]["portable_ops"]["aten::max.dim"] == 3  # dim 3 with keepdim: delegated


class VmappedMask(torch.nn.Module):
    """transformers' mask construction with a custom mask function (Gemma3's): vmapped over the indices."""

    def forward(self, x):
        n = x.shape[1]

        def causal_or_near(q, k):
            return (k <= q) | ((q - k).abs() < 2)

        mask = torch.vmap(torch.vmap(causal_or_near, in_dims=(None, 0)), in_dims=(0, None))(torch.arange(n),
                                                                                             torch.arange(n))
        return (x.view(x.shape[0], n, -1) * mask.sum(-1, keepdim=True)).view(x.shape)


def test_dead_code_elimination_keeps_vmap_levels():
    """The FX node fixes' dead-code elimination (hfexport/_fx.py) keeps the pre-dispatch vmap level calls: without
    them ``to_edge``'s re-trace failed with "your tensor may have escaped from inside a function being vmapped"
    (Gemma3 in the sample sweep). ``_fix_view_as_reshape`` fires here, so the elimination runs."""
    model, inputs = VmappedMask(), {"x": torch.randn(2, 6, 4)}
    exported = export(model, inputs, dynamic=True)
    assert exported.manifest["workarounds"]["fixes"]["hfexport_executorch.workarounds.node_fixes._fix_view_as_reshape"]
    assert_matches(exported, model, {"x": torch.randn(3, 9, 4)})  # 9 x 9 mask, not the traced 6 x 6


@pytest.mark.slow  # two ExecuTorch exports of the zoo's tiny Data2Vec-Vision; about 40 s
def test_views_after_attention_survive_the_edge_retrace():
    from hfexport_sweep.zoo import build_case

    model, inputs, alt_inputs = build_case("data2vec-vision/Data2VecVisionForImageClassification")
    exported = hfexport.export(model, inputs, backend="executorch-xnnpack", dynamic=True)
    report = exported.verify(alt_inputs, atol=ATOL, rtol=1e-3)  # batch 3
    assert report.passed, str(report)

    with pytest.raises(hfexport.ExportError, match="Cannot view a tensor with shape"):
        hfexport.export(model, inputs, backend="executorch-xnnpack", dynamic=True,
                        disable=("_fix_view_as_reshape",))


class UnpackNibbles(torch.nn.Module):
    """e06's pattern: int4 weights packed two to a uint8, unpacked with ``>>`` and ``&``, and the other spellings."""

    def forward(self, packed, amounts):
        lo, hi = packed & 0xF, packed >> 4
        return (torch.stack([lo, hi], -1), (packed << 4) | (packed >> 4), packed >> amounts, 1 << amounts,
                torch.bitwise_right_shift(-96, amounts.to(torch.int32)), torch.bitwise_left_shift(packed, 1))


def test_bitwise_decompositions_cover_every_shift_spelling():
    inputs = {"packed": torch.tensor([[0x00, 0x1F, 0xA7, 0xFF]], dtype=torch.uint8),
              "amounts": torch.tensor([[0, 1, 4, 7]], dtype=torch.uint8)}
    # the decompositions are entries of the table _patch_default_decomposition_table gives to_edge
    with pytest.raises(hfexport.ExportError, match=r"__rshift__\.Scalar is not in Core ATen, has no decomposition"):
        export(UnpackNibbles(), inputs, disable=("_patch_default_decomposition_table",))
    with_it = export(UnpackNibbles(), inputs)
    assert {"aten.bitwise_right_shift.Tensor", "aten.bitwise_left_shift.Tensor_Scalar"} <= set(
        with_it.manifest["executorch"]["non_core_aten_on_portable_kernels"])
    assert_matches(with_it, UnpackNibbles(), inputs)  # uint8 kept, wraps as eager, arithmetic >> on int32


class WhereGather(torch.nn.Module):
    """s53: ``torch.where(cond)`` (``nonzero(as_tuple=True)`` in torch) as indices of a gather."""

    def forward(self, x, cond):
        rows, cols = torch.where(cond)
        return x[rows, cols] + rows.to(x.dtype), torch.where(cond, x, 0.0)


def test_patch_nonzero_covers_one_argument_where():
    inputs = {"x": torch.randn(3, 4), "cond": torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])}
    without = export(WhereGather(), inputs, disable=("_patch_nonzero",), verify=False)
    with pytest.raises(RuntimeError, match="0x12"):  # slice_copy: "2 input tensors have different dim orders"
        without(**inputs)
    assert_matches(export(WhereGather(), inputs), WhereGather(), inputs)


class Bf16Island(torch.nn.Module):
    """s54: a bfloat16 projection inside a float32 model (the XNNPACK variant moves the weights to float32)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(8, 16).to(torch.bfloat16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.inner(x.to(torch.bfloat16))).float())


def test_fix_float_casts_to_variant_dtype():
    inputs = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(hfexport.ExportError, match="mismatched dtypes"):
        export(Bf16Island(), inputs, disable=("_fix_float_casts_to_variant_dtype",))
    with_it = export(Bf16Island(), inputs, atol=1e-2, rtol=1e-2)
    assert "_fix_float_casts_to_variant_dtype" in fixes(with_it)
    torch.testing.assert_close(with_it(**inputs), Bf16Island()(**inputs), atol=1e-2, rtol=1e-2)


class EarlyExit(torch.nn.Module):
    """e12: ``torch.cond`` whose branches call ``nn.Linear`` (kept whole for XNNPACK, which skips the branches)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.exit_head, self.last_head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.stem(x)
        return torch.cond(h.mean() > 0, lambda h: self.exit_head(h), lambda h: self.last_head(torch.relu(h)), (h,))


def test_fix_decompose_inside_control_flow():
    inputs = {"x": torch.randn(3, 8, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(hfexport.ExportError, match="aten_linear_default .* was not decomposed or delegated"):
        export(EarlyExit(), inputs, disable=("_fix_decompose_inside_control_flow",))
    with_it = export(EarlyExit(), inputs, dynamic_shapes={"x": {0: Dim("batch", min=2, max=8)}})
    assert "_fix_decompose_inside_control_flow" in fixes(with_it)
    assert_matches(with_it, EarlyExit(), inputs)
    direction = EarlyExit().stem.weight.sum(0).detach()
    for shift in (-3.0, 3.0):  # both branches, another batch
        assert_matches(with_it, EarlyExit(), {"x": torch.randn(5, 8) + shift * direction})


def test_lowering_notices_are_kept_out_unless_verbose(monkeypatch):
    """An ExecuTorch task export printed eleven ``_check_is_size will be removed`` FutureWarnings (ExecuTorch's LLM
    custom ops) and the emitter's ``Mutation on a buffer`` UserWarning (a fresh user's finding): inside the export's
    stages those two are not shown, any other warning is, and ``--verbose`` shows them all."""
    import warnings

    from hfexport_executorch._quiet import without_lowering_notices

    def shown() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with without_lowering_notices():
                warnings.warn("_check_is_size will be removed in a future PyTorch release", FutureWarning,
                              stacklevel=1)
                warnings.warn("Mutation on a buffer in the model is detected. ExecuTorch assumes ...", UserWarning,
                              stacklevel=1)
                warnings.warn("something else", UserWarning, stacklevel=1)
        return [str(w.message)[:14] for w in caught]

    monkeypatch.delenv("HFEXPORT_VERBOSE", raising=False)
    assert shown() == ["something else"]
    monkeypatch.setenv("HFEXPORT_VERBOSE", "1")
    assert shown() == ["_check_is_size", "Mutation on a ", "something else"]


# ── ET_DECOMPOSITIONS[unique_consecutive], _patch_unbacked_size_upper_bound ──
class WindowBoundaries(torch.nn.Module):
    """Qwen2.5-VL's vision windows: repeated cumulative boundaries dropped with ``unique_consecutive``, and the
    inverse and counts beside them."""

    def forward(self, boundaries):
        kept, inverse, counts = torch.unique_consecutive(boundaries, return_inverse=True, return_counts=True)
        return kept * 2, inverse, counts


def test_unique_consecutive_decomposes_into_ops_with_portable_kernels():
    inputs = {"boundaries": torch.tensor([0, 4, 4, 8, 8, 8, 12])}
    exported = export(WindowBoundaries(), inputs, dynamic=True)
    assert_matches(exported, WindowBoundaries(), inputs)
    assert_matches(exported, WindowBoundaries(), {"boundaries": torch.tensor([0, 0, 3, 5, 5])})


class WeightedBags(torch.nn.Module):
    """Kimi-K2.5's position resampling: each row a weighted sum of 4 table rows (``embedding_bag``, ``sum``), and
    ``mean`` bags of a flat index list cut at ``offsets``."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(12, 5, generator=torch.Generator().manual_seed(0)))

    def forward(self, rows, weights, flat, offsets):
        summed = F.embedding_bag(rows, self.table, per_sample_weights=weights, mode="sum")
        return summed, F.embedding_bag(flat, self.table, offsets, mode="mean")


def test_embedding_bag_decomposes_into_ops_with_portable_kernels():
    """Core ATen, no portable kernel: ``sum`` with per-sample weights and ``mean`` with offsets (an empty bag
    among them gives zeros, as eager), at two shapes."""
    def inputs(n, seed):
        g = torch.Generator().manual_seed(seed)
        flat = torch.randint(0, 12, (n + 3,), generator=g)
        return {"rows": torch.randint(0, 12, (n, 4), generator=g), "weights": torch.rand(n, 4, generator=g),
                "flat": flat, "offsets": torch.tensor([0, 2, 2, n])}
    exported = export(WeightedBags(), inputs(3, 0), dynamic=True)
    assert_matches(exported, WeightedBags(), inputs(3, 0))
    assert_matches(exported, WeightedBags(), inputs(6, 1))


class ResizedPositions(torch.nn.Module):
    """Unlimited-OCR's position embeddings: a learned grid resized with antialiased bicubic interpolation, down and
    up, and added to the input."""

    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        down = F.interpolate(self.grid, size=(5, 7), mode="bicubic", antialias=True)
        up = F.interpolate(self.grid[..., :4, :3], size=(5, 7), mode="bicubic", antialias=True, align_corners=True)
        return x + down + up


def test_upsample_bicubic2d_aa_decomposes_into_matrix_products():
    exported = export(ResizedPositions(), {"x": torch.randn(2, 3, 5, 7)}, dynamic=True)
    assert_matches(exported, ResizedPositions(), {"x": torch.randn(2, 3, 5, 7)})
    assert_matches(exported, ResizedPositions(), {"x": torch.randn(4, 3, 5, 7)})


def test_patch_unbacked_size_upper_bound_plans_a_data_dependent_length():
    """A size that lowering's retrace made anew (``u137 + 1``, ``[0, int_oo]``): ExecuTorch's own evaluation fails,
    the patched one plans it at the default ``dim_upper_bound`` (64); a backed size is left to the original."""
    from executorch.exir.sym_util import eval_upper_bound
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from hfexport_executorch.workarounds.executorch_patches import _patch_unbacked_size_upper_bound

    size = ShapeEnv().create_unbacked_symint()
    with pytest.raises(RuntimeError, match="finite upper bound"):
        eval_upper_bound(size + 1)
    patched = _patch_unbacked_size_upper_bound(eval_upper_bound)
    assert patched(size + 1) == 65 and patched(size * 2) == 128 and patched(7) == 7


def test_patch_exact_quotient_upper_bound_plans_a_view_at_the_largest_batch():
    """SEW-D's ``view(-1, 4, T, T)`` of a ``[4*b, T, T]`` tensor, ``T`` an audio length after strided convolutions:
    the inferred size is ``(4*b*T**2) // (T*(4*T' + 4))``, which torch does not cancel. ExecuTorch bounds it at
    2,248,500 for ``b <= 16`` and 30 s of audio; patched, at 16."""
    from executorch.exir import sym_util
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.value_ranges import ValueRanges

    from hfexport.workarounds import patch_context
    from hfexport_executorch.workarounds import executorch_patches  # noqa: F401 - registers the patch

    env = ShapeEnv()
    batch, samples = (env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
                      for hint, name in ((9, "batch"), (16_000, "samples")))
    env.var_to_range[batch], env.var_to_range[samples] = ValueRanges(2, 16), ValueRanges(1360, 480_000)
    frames = FloorDiv(FloorDiv(samples, 80) - 3, 2) + 1
    inferred = env.create_symintnode(FloorDiv(4 * batch * frames**2, frames * (4 * frames)), hint=9)
    loose = frames // 2  # no exact quotient: left as ExecuTorch bounds it
    with patch_context(("executorch.internals",), disabled=("_patch_exact_quotient_upper_bound",)):
        assert sym_util.eval_upper_bound(inferred) == 2_248_500
    with patch_context(("executorch.internals",)):
        assert sym_util.eval_upper_bound(inferred) == 16
        # (6000 - 3) // 2 + 1 = 2999 frames at most, halved
        assert sym_util.eval_upper_bound(env.create_symintnode(loose, hint=49)) == 1499


class ChunkRows(torch.nn.Module):
    """The row updates of Qwen3-Next's chunked gated delta rule (``torch_chunk_gated_delta_rule``), in place."""

    def forward(self, x):
        a = -(x @ x.transpose(-1, -2)).tril(-1)
        for i in range(1, a.shape[-1]):
            row = a[..., i, :i].clone()
            sub = a[..., :i, :i].clone()
            a[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        return a + torch.eye(a.shape[-1])


def test_patch_pass_through_outputs_copied():
    """``_patch_pass_through_outputs_copied``: a partition that returns one slice twice (f12's kind)."""
    inputs = {"x": torch.randn(1, 2, 4, 3, generator=torch.Generator().manual_seed(0)) * 0.3}
    with pytest.raises(hfexport.ExportError, match="is already in the inputs"):
        export(ChunkRows(), inputs, disable=("_patch_pass_through_outputs_copied",))
    assert_matches(export(ChunkRows(), inputs), ChunkRows(), inputs)
