"""Graph rewrites of traced programs that more than one backend applies.

:func:`complex_to_real_pairs` rewrites complex arithmetic (``view_as_complex``, ``polar``, complex ``mul``,
``view_as_real`` ...) into real arithmetic on ``[..., 2]`` (real, imaginary) pairs: ONNX, ExecuTorch and OpenVINO
have no usable complex dtype, every real op it emits is Core ATen or decomposes to it. It is registered here, once,
as the FX node fix ``_fix_complex_to_real_pairs`` of those backends' scopes (``_COMPLEX_FREE_SCOPES``).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import register_fx_node_fix

__all__ = ["ComplexRewriteError", "complex_to_real_pairs", "involves_complex", "squeeze_only_size_one_dims"]

# The workaround scopes of the backends without complex tensors: _fix_complex_to_real_pairs is registered for each
# (as FNet's Fourier mixing patch is, _model_patches.py); the dynamo backend keeps complex tensors in its .pt2.
_COMPLEX_FREE_SCOPES = ("onnx", "executorch", "openvino")

aten = torch.ops.aten
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


class ComplexRewriteError(NotImplementedError):
    """A complex tensor the real-pair rewrite cannot express (a graph input or output, or an op it does not know)."""


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _is_complex_val(val: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype.is_complex for v in pytree.tree_leaves(val))


def involves_complex(node: torch.fx.Node) -> bool:
    """Whether ``node`` produces a complex tensor or reads one (the trigger of the backends' fixes)."""
    if _is_complex_val(node.meta.get("val")):
        return True
    return any(_is_complex_val(_val(a)) for a in pytree.tree_leaves((node.args, node.kwargs))
               if isinstance(a, torch.fx.Node))


def _fake_mode(gm: torch.fx.GraphModule) -> Any:
    for node in gm.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            mode = getattr(v, "fake_mode", None)
            if mode is not None:
                return mode
    return None


class _Rewriter:
    """Emits the real-pair nodes of one complex node (``node``), before it."""

    def __init__(self, gm: torch.fx.GraphModule, backend: str):
        self.gm, self.backend = gm, backend
        self.pairs: dict[torch.fx.Node, torch.fx.Node] = {}  # complex node -> its [..., 2] real pair
        self.node: torch.fx.Node | None = None
        mode = _fake_mode(gm)
        self.mode = mode if mode is not None else contextlib.nullcontext()

    # ── emitting ──
    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        new = self.gm.graph.call_function(target, args, kwargs)
        new.meta = {k: v for k, v in self.node.meta.items() if k not in ("val", "tensor_meta")}
        values = pytree.tree_map(_val, (args, kwargs))
        with self.mode:
            new.meta["val"] = target(*values[0], **values[1])
        return new

    def is_complex(self, arg: Any) -> bool:
        return isinstance(arg, complex) or (isinstance(arg, torch.fx.Node) and arg in self.pairs)

    def pair(self, arg: Any) -> torch.fx.Node:
        """``arg`` as a ``[..., 2]`` real pair (a real tensor gets a zero imaginary part)."""
        if arg in self.pairs:
            return self.pairs[arg]
        return self.stack(arg, None)

    def parts(self, arg: Any) -> tuple[Any, Any]:
        """``(real, imaginary)`` of an operand; ``None`` stands for a zero imaginary part."""
        if isinstance(arg, complex):
            return arg.real, arg.imag
        if isinstance(arg, torch.fx.Node) and arg in self.pairs:
            p = self.pairs[arg]
            return self.call(aten.select.int, p, -1, 0), self.call(aten.select.int, p, -1, 1)
        return arg, None

    def stack(self, re: Any, im: Any) -> torch.fx.Node:
        """``stack([re, im], -1)``; operands of different (broadcastable) shapes are broadcast first."""
        if im is None:
            im = self.call(aten.zeros_like.default, re)
        if not isinstance(re, torch.fx.Node):
            re = self.call(aten.full_like.default, im, re)
        if not isinstance(im, torch.fx.Node):
            im = self.call(aten.full_like.default, re, im)
        if tuple(_val(re).shape) != tuple(_val(im).shape):
            re, im = (self.call(aten.add.Tensor, re, self.call(aten.zeros_like.default, im)),
                      self.call(aten.add.Tensor, im, self.call(aten.zeros_like.default, re)))
        return self.call(aten.stack.default, [re, im], -1)

    def binary(self, target: Any, a: Any, b: Any) -> Any:
        """``a <target> b`` for real parts where ``None`` is zero (``mul``, ``add``, ``sub``)."""
        if a is None or b is None:
            if target is aten.mul.Tensor:
                return None
            if b is None:
                return a
            return b if target is aten.add.Tensor else (self.call(aten.neg.default, b) if
                                                        isinstance(b, torch.fx.Node) else -b)
        if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return {aten.mul.Tensor: operator.mul, aten.add.Tensor: operator.add, aten.sub.Tensor: operator.sub}[
                target](a, b)
        if not isinstance(a, torch.fx.Node):  # number <op> tensor: keep the tensor first
            if target is aten.sub.Tensor:
                return self.call(aten.add.Tensor, self.call(aten.neg.default, b), a)
            a, b = b, a
        return self.call(target, a, b)

    def fail(self, why: str) -> ComplexRewriteError:
        return ComplexRewriteError(f"{why}: the {self.backend} backend has no complex dtype, so hfexport rewrites "
                                   "complex arithmetic into (real, imaginary) pairs (hfexport_dynamo.rewrites."
                                   "complex_to_real_pairs), and this cannot be rewritten. Compute in real pairs in "
                                   "the model (torch.view_as_real / torch.view_as_complex around the complex part "
                                   "only), or export with backend='dynamo'")


def _rank(arg: Any) -> int:
    return _val(arg).dim()


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(dims: Any, rank: int) -> list[int]:
    return [_dim(d, rank) for d in ([dims] if isinstance(dims, int) else dims)]


def _arg(node: torch.fx.Node, i: int, name: str, default: Any) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


# ── the rewrite of each complex op: (rewriter, node) -> real node (the pair of a complex result) ──
def _mul(r: _Rewriter, n: torch.fx.Node) -> Any:
    (a0, a1), (b0, b1) = r.parts(n.args[0]), r.parts(n.args[1])
    re = r.binary(aten.sub.Tensor, r.binary(aten.mul.Tensor, a0, b0), r.binary(aten.mul.Tensor, a1, b1))
    im = r.binary(aten.add.Tensor, r.binary(aten.mul.Tensor, a0, b1), r.binary(aten.mul.Tensor, a1, b0))
    return r.stack(re, im)


def _div(r: _Rewriter, n: torch.fx.Node) -> Any:
    a, b = n.args[0], n.args[1]
    if not r.is_complex(b):  # complex / real: both parts
        other = r.call(aten.unsqueeze.default, b, -1) if isinstance(b, torch.fx.Node) else b
        return r.call(aten.div.Tensor, r.pair(a), other)
    (a0, a1), (b0, b1) = r.parts(a), r.parts(b)
    den = r.binary(aten.add.Tensor, r.binary(aten.mul.Tensor, b0, b0), r.binary(aten.mul.Tensor, b1, b1))
    re = r.binary(aten.add.Tensor, r.binary(aten.mul.Tensor, a0, b0), r.binary(aten.mul.Tensor, a1, b1))
    im = r.binary(aten.sub.Tensor, r.binary(aten.mul.Tensor, a1, b0), r.binary(aten.mul.Tensor, a0, b1))
    return r.stack(r.call(aten.div.Tensor, re, den), r.call(aten.div.Tensor, im, den))


def _add_sub(r: _Rewriter, n: torch.fx.Node) -> Any:
    target = aten.add.Tensor if n.target in (aten.add.Tensor, aten.add.Scalar) else aten.sub.Tensor
    (a0, a1), (b0, b1) = r.parts(n.args[0]), r.parts(n.args[1])
    alpha = n.kwargs.get("alpha", 1)
    if alpha != 1:
        b0, b1 = r.binary(aten.mul.Tensor, b0, alpha), r.binary(aten.mul.Tensor, b1, alpha)
    return r.stack(r.binary(target, a0, b0), r.binary(target, a1, b1))


def _conj(r: _Rewriter, n: torch.fx.Node) -> Any:
    re, im = r.parts(n.args[0])
    return r.stack(re, r.call(aten.neg.default, im))


def _to(r: _Rewriter, n: torch.fx.Node) -> Any:
    src, out = n.args[0], n.meta["val"]
    if not r.is_complex(src):  # real -> complex: zero imaginary part
        real = r.call(aten._to_copy.default, src, dtype=_REAL_OF[out.dtype])
        return r.stack(real, None)
    if not out.dtype.is_complex:  # complex -> real drops the imaginary part, as eager does
        return r.call(aten._to_copy.default, r.parts(src)[0], dtype=out.dtype)
    p = r.pair(src)
    return p if _val(p).dtype == _REAL_OF[out.dtype] else r.call(aten._to_copy.default, p, dtype=_REAL_OF[out.dtype])


def _same(r: _Rewriter, n: torch.fx.Node) -> Any:  # clone, alias, detach, neg, ...: the op on the pair
    return r.call(n.target, r.pair(n.args[0]), *n.args[1:], **n.kwargs)


def _with_dim(position: int, name: str, default: Any, rank_of: str = "in") -> Callable[..., Any]:
    """An op with one dim argument at ``position``: negative dims count from the complex rank."""

    def rewrite(r: _Rewriter, n: torch.fx.Node) -> Any:
        rank = n.meta["val"].dim() if rank_of == "out" else _rank(n.args[0])
        args = list(n.args)
        kwargs = dict(n.kwargs)
        d = _dim(_arg(n, position, name, default), rank)
        if len(args) > position:
            args[position] = d
        else:
            kwargs[name] = d
        return r.call(n.target, r.pair(args[0]), *args[1:], **kwargs)

    return rewrite


def _with_dims(position: int) -> Callable[..., Any]:
    def rewrite(r: _Rewriter, n: torch.fx.Node) -> Any:
        args = list(n.args)
        args[position] = _dims(args[position], _rank(n.args[0]))
        return r.call(n.target, r.pair(args[0]), *args[1:], **n.kwargs)

    return rewrite


def _with_shape(extra: int) -> Callable[..., Any]:  # view/reshape/expand (extra 2), repeat (extra 1)
    def rewrite(r: _Rewriter, n: torch.fx.Node) -> Any:
        return r.call(n.target, r.pair(n.args[0]), [*n.args[1], extra], *n.args[2:], **n.kwargs)

    return rewrite


def _permute(r: _Rewriter, n: torch.fx.Node) -> Any:
    rank = _rank(n.args[0])
    return r.call(aten.permute.default, r.pair(n.args[0]), [*_dims(n.args[1], rank), rank])


def _transpose(r: _Rewriter, n: torch.fx.Node) -> Any:
    rank = _rank(n.args[0])
    return r.call(aten.transpose.int, r.pair(n.args[0]), _dim(n.args[1], rank), _dim(n.args[2], rank))


def _flatten(r: _Rewriter, n: torch.fx.Node) -> Any:
    rank = _rank(n.args[0])
    start, end = _dim(_arg(n, 1, "start_dim", 0), rank), _dim(_arg(n, 2, "end_dim", -1), rank)
    return r.call(aten.flatten.using_ints, r.pair(n.args[0]), start, end)


def _sequence(r: _Rewriter, n: torch.fx.Node) -> Any:  # cat / stack: dim from the output's rank for stack
    rank = n.meta["val"].dim() if n.target is aten.stack.default else _rank(n.args[0][0])
    d = _dim(_arg(n, 1, "dim", 0), rank)
    return r.call(n.target, [r.pair(t) for t in n.args[0]], d)


def _reduce(r: _Rewriter, n: torch.fx.Node) -> Any:  # sum.dim_IntList / mean.dim
    rank = _rank(n.args[0])
    args = list(n.args)
    if len(args) < 2 or not args[1]:
        raise r.fail(f"{n.target} over all dims of a complex tensor")
    args[1] = _dims(args[1], rank)
    return r.call(n.target, r.pair(args[0]), *args[1:], **n.kwargs)


def _getitem(r: _Rewriter, n: torch.fx.Node) -> Any:
    return r.call(operator.getitem, r.pairs[n.args[0]], n.args[1])


def _real_part(index: int) -> Callable[..., Any]:
    def rewrite(r: _Rewriter, n: torch.fx.Node) -> Any:
        return r.parts(n.args[0])[index]

    return rewrite


def _abs(r: _Rewriter, n: torch.fx.Node) -> Any:
    re, im = r.parts(n.args[0])
    return r.call(aten.sqrt.default, r.call(aten.add.Tensor, r.call(aten.mul.Tensor, re, re),
                                            r.call(aten.mul.Tensor, im, im)))


def _angle(r: _Rewriter, n: torch.fx.Node) -> Any:
    re, im = r.parts(n.args[0])
    return r.call(aten.atan2.default, im, re)


def _polar(r: _Rewriter, n: torch.fx.Node) -> Any:
    magnitude, angle = n.args[0], n.args[1]
    return r.stack(r.call(aten.mul.Tensor, magnitude, r.call(aten.cos.default, angle)),
                   r.call(aten.mul.Tensor, magnitude, r.call(aten.sin.default, angle)))


def _exp(r: _Rewriter, n: torch.fx.Node) -> Any:
    re, im = r.parts(n.args[0])
    scale = r.call(aten.exp.default, re)
    return r.stack(r.call(aten.mul.Tensor, scale, r.call(aten.cos.default, im)),
                   r.call(aten.mul.Tensor, scale, r.call(aten.sin.default, im)))


_REWRITES: dict[Any, Callable[[_Rewriter, torch.fx.Node], Any]] = {
    aten.view_as_complex.default: lambda r, n: n.args[0],  # the [..., 2] real tensor is the pair
    aten.view_as_real.default: lambda r, n: r.pair(n.args[0]),
    aten.polar.default: _polar,
    aten.complex.default: lambda r, n: r.stack(n.args[0], n.args[1]),
    aten.real.default: _real_part(0), aten.imag.default: _real_part(1),
    aten.abs.default: _abs, aten.angle.default: _angle, aten.exp.default: _exp,
    aten.mul.Tensor: _mul, aten.mul.Scalar: _mul, aten.div.Tensor: _div, aten.div.Scalar: _div,
    aten.add.Tensor: _add_sub, aten.add.Scalar: _add_sub, aten.sub.Tensor: _add_sub, aten.sub.Scalar: _add_sub,
    aten.conj.default: _conj, aten._conj.default: _conj, aten.conj_physical.default: _conj,
    aten.resolve_conj.default: lambda r, n: r.pair(n.args[0]), aten.resolve_neg.default: lambda r, n: r.pair(n.args[0]),
    aten.to.dtype: _to, aten.to.dtype_layout: _to, aten._to_copy.default: _to, aten.to.device: _to,
    **{op: _same for op in (aten.clone.default, aten.alias.default, aten.detach.default, aten.neg.default,
                            aten.lift_fresh_copy.default, aten.contiguous.default, aten.squeeze.default,
                            aten.index.Tensor)},
    aten.unsqueeze.default: _with_dim(1, "dim", 0, rank_of="out"),
    aten.squeeze.dim: _with_dim(1, "dim", 0), aten.squeeze.dims: _with_dims(1),
    aten.select.int: _with_dim(1, "dim", 0), aten.slice.Tensor: _with_dim(1, "dim", 0),
    aten.narrow.default: _with_dim(1, "dim", 0), aten.index_select.default: _with_dim(1, "dim", 0),
    aten.split.Tensor: _with_dim(2, "dim", 0), aten.split_with_sizes.default: _with_dim(2, "dim", 0),
    aten.unbind.int: _with_dim(1, "dim", 0), aten.unflatten.int: _with_dim(1, "dim", 0),
    aten.sym_size.int: _with_dim(1, "dim", 0),
    aten.flip.default: _with_dims(1),
    aten.view.default: _with_shape(2), aten.reshape.default: _with_shape(2), aten._unsafe_view.default: _with_shape(2),
    aten.expand.default: _with_shape(2), aten.repeat.default: _with_shape(1),
    aten.permute.default: _permute, aten.transpose.int: _transpose, aten.flatten.using_ints: _flatten,
    aten.cat.default: _sequence, aten.stack.default: _sequence,
    aten.sum.dim_IntList: _reduce, aten.mean.dim: _reduce,
    operator.getitem: _getitem,
    aten._assert_tensor_metadata.default: lambda r, n: None,  # checked at trace time; its dtype was the complex one
}


def _buffer_to_pair(program: Any, node: torch.fx.Node, r: _Rewriter) -> None:
    """A complex buffer or constant placeholder becomes its real pair: its tensor, and its ``meta["val"]``."""
    sig = program.graph_signature if program is not None else None
    fqn = None
    if sig is not None:
        fqn = sig.inputs_to_buffers.get(node.name) or sig.inputs_to_lifted_tensor_constants.get(node.name)
    if fqn is None:
        raise r.fail(f"graph input {node.name!r} is a complex tensor (the runtime takes no complex inputs: pass "
                     "torch.view_as_real(x) and call torch.view_as_complex inside forward)")
    table = program.state_dict if fqn in program.state_dict else program.constants
    table[fqn] = torch.view_as_real(table[fqn].detach()).clone()  # a copy: the model's buffer is untouched
    with r.mode:
        node.meta["val"] = torch.view_as_real(node.meta["val"]).clone()
    node.meta.pop("tensor_meta", None)


def complex_to_real_pairs(gm: torch.fx.GraphModule, program: Any = None, backend: str = "this") -> int:
    """Rewrite every complex tensor of ``gm`` as a real ``[..., 2]`` (real, imaginary) pair; returns nodes rewritten.

    ``view_as_complex(x)`` becomes ``x`` itself and ``view_as_real(z)`` becomes ``z``'s pair; ``polar``, complex
    ``mul``/``div``/``add``/``sub``, ``conj``, dtype casts and the layout ops (``unsqueeze``, ``view``,
    ``permute``, ``slice``, ``cat`` ...) get their real-pair form (``a*c - b*d, a*d + b*c`` for a product; negative
    dims count from the complex rank). A complex buffer or lifted constant of ``program`` (the
    ``ExportedProgram`` that owns ``gm``) is replaced by ``view_as_real`` of it in the program's state dict or
    constants (the model's own buffer is not touched).

    Raises:
        ComplexRewriteError: a complex graph input (not a buffer) or output, or an op on complex tensors without
            a real-pair form; the message names it and says what to change.
    """
    r = _Rewriter(gm, backend)
    rewritten: list[torch.fx.Node] = []
    for node in list(gm.graph.nodes):
        if node.op == "placeholder":
            if _is_complex_val(node.meta.get("val")):
                _buffer_to_pair(program, node, r)
                r.pairs[node] = node
            continue
        if node.op == "output":
            if any(isinstance(a, torch.fx.Node) and a in r.pairs for a in pytree.tree_leaves(node.args)):
                raise r.fail("the program returns a complex tensor (return torch.view_as_real(z) instead)")
            continue
        if not (involves_complex(node) or any(isinstance(a, torch.fx.Node) and a in r.pairs
                                              for a in pytree.tree_leaves((node.args, node.kwargs)))):
            continue
        if node.op != "call_function":
            raise r.fail(f"{node.op} {node.target} reads or makes a complex tensor")
        rewrite = _REWRITES.get(node.target)
        if rewrite is None:
            raise r.fail(f"{node.target} on complex tensors (node {node.name!r}) has no real-pair rewrite")
        r.node = node
        with gm.graph.inserting_before(node):
            result = rewrite(r, node)
        if _is_complex_val(node.meta.get("val")):
            r.pairs[node] = result
        elif result is not None:
            node.replace_all_uses_with(result)
        rewritten.append(node)
    for node in reversed(rewritten):  # users before producers; every user of a complex node was rewritten
        gm.graph.erase_node(node)
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return len(rewritten)


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
@register_fx_node_fix("openvino")
def _fix_complex_to_real_pairs(gm: torch.fx.GraphModule, node: torch.fx.Node, ctx: Any = None) -> bool:
    """Rewrites the program's complex arithmetic into real ``[..., 2]`` (real, imaginary) pairs, once, at its first
    complex node (:func:`complex_to_real_pairs`), for the backends without complex tensors (ONNX, ExecuTorch,
    OpenVINO: ``_COMPLEX_FREE_SCOPES``).

    ``view_as_complex(x)`` becomes ``x``, ``view_as_real(z)`` becomes ``z``'s pair, ``polar(r, t)`` becomes
    ``stack([r*cos(t), r*sin(t)], -1)`` and a complex product ``a*c - b*d, a*d + b*c``; a complex buffer or lifted
    constant (a precomputed ``freqs_cis``) of ``ctx.program``, when that program owns ``gm``, is stored as
    ``view_as_real`` of it. Complex graph inputs and outputs, and complex ops without a real-pair form, fail with
    an error that names them and the backend (the runtimes have no complex kernels, so they cannot work there).
    Returns whether it rewrote (False for a node without complex tensors).
    **Why**: complex rotary embeddings (Llama4's ``apply_rotary_emb``, DeepSeek-V2, Meta's reference Llama:
    ``view_as_real(view_as_complex(q) * freqs_cis)``; d14) fail on each of them. torch.onnx: ``DispatchError: No
    ONNX function found for <OpOverload(op='aten.unsqueeze', overload='default')>. Failure message: No
    decompositions registered for the complex-valued input`` (torchlib lowers a few complex ops itself as real
    pairs, ``view_as_complex``, ``mul``, a complex buffer, not the layout ops around them; rewriting the whole graph
    leaves nothing to that partial support). ExecuTorch's ``to_edge``: ``SpecViolationError: aten.polar.default is
    not in Core ATen, has no decomposition ... and no kernel``, with a precomputed buffer ``SpecViolationError:
    These operators are taking Tensor inputs with mismatched dtypes`` (complex ``mul``); the portable library and
    XNNPACK have no complex kernels either. OpenVINO's PyTorch frontend converts complex tensors only around a few
    ops: ``No conversion rule found for operations: aten.polar.default``, and ``view_as_real`` of a complex product
    ``aten::view_as_real is only supported for complex tensors`` (``complex.cpp``). The real pairs are plain float
    arithmetic (the same values within float rounding) that XNNPACK delegates.
    **Upstream**: pytorch/pytorch#126972 (ONNX exporter fails on complex tensors); pytorch/executorch#11404
    (Portable Library: Complex Support); none found for ``aten.polar`` in OpenVINO's FX decoder.
    **Remove when**: for a backend, ``tests/helpers.ComplexRope`` exports and runs on it with
    ``disable=("_fix_complex_to_real_pairs",)`` (torchlib translates complex ``unsqueeze``/``mul``/``view_as_real``
    and ONNX Runtime runs them; ExecuTorch lowers and runs them; OpenVINO converts ``aten.polar``); then drop its
    scope from ``_COMPLEX_FREE_SCOPES``.

    Raises:
        ComplexRewriteError: as :func:`complex_to_real_pairs`.
    """
    if not involves_complex(node):
        return False
    program = getattr(ctx, "program", None)
    scopes = getattr(getattr(ctx, "exporter", None), "scopes", ())
    backend = next((scope for scope in scopes if scope in _COMPLEX_FREE_SCOPES), "this")  # "executorch" for a variant
    complex_to_real_pairs(gm, program if getattr(program, "graph_module", None) is gm else None, backend=backend)
    return True


def squeeze_only_size_one_dims(node: torch.fx.Node) -> bool:
    """Drop from an ``aten.squeeze.dims`` (``aten.squeeze.dim``) node the dims that torch leaves in place: those
    whose traced size is not the integer 1 (a dynamic dim, or a static one above 1); a squeeze left with no dim
    becomes ``aten.alias``. The body of the ``_fix_squeeze_dims_torch_keeps`` FX node fixes (ONNX, OpenVINO), whose
    squeeze ops remove every axis they are given (and fail on one that is not 1) where torch's squeeze skips it.

    Returns:
        Whether the node changed.
    """
    if node.op != "call_function" or node.target not in (aten.squeeze.dims, aten.squeeze.dim) \
            or "val" not in node.args[0].meta:
        return False
    shape = node.args[0].meta["val"].shape
    asked = [node.args[1]] if node.target is aten.squeeze.dim else node.args[1]
    dims = [d % len(shape) for d in asked] if shape else []
    kept = [d for d in dims if isinstance(shape[d], int) and shape[d] == 1]
    if kept == dims:
        return False
    if kept:
        node.target, node.args = aten.squeeze.dims, (node.args[0], kept)
    else:
        node.target, node.args = aten.alias.default, (node.args[0],)
    return True


@register_fx_node_fix("onnx")
@register_fx_node_fix("openvino")
def _fix_squeeze_dims_torch_keeps(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Drops from ``aten.squeeze.dims`` the dims torch keeps (:func:`squeeze_only_size_one_dims`); none left: alias.

    **Why**: torch squeezes only the listed dims of size 1; torchlib squeezes every listed axis (ONNX Runtime refused
    Mistral3's ``squeeze(0)`` of ``[16, 64]``) and OpenVINO's ``Squeeze`` fails at inference on a dynamic one that
    is not 1 (MBart's ``shift_tokens_right`` at batch 10: ``Can not clone with new dims``).
    **Upstream**: microsoft/onnxscript#360 (closed; still unconditional in 0.7.2); openvinotoolkit/openvino#24715, #26989.
    **Remove when**: ``x.squeeze(0)`` of a ``[16, 4]`` tensor exports on ONNX, and a tiny dynamic MBart runs at another
    batch on OpenVINO, with ``disable=("_fix_squeeze_dims_torch_keeps",)``.
    """
    return squeeze_only_size_one_dims(node)
