"""Reading a ``.pt2`` as untrusted input: what ``torch.export.load`` would run, found before it runs.

Measured in torch 2.15 (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``,
``torch/export/_unlift.py``), loading a ``.pt2`` and calling ``program.module()`` can run code from the file:

- ``data/sample_inputs/<model>.pt`` is ``torch.load``-ed with ``weights_only=True`` and, when that fails, again
  with ``weights_only=False``: any pickle runs. Weights and constants saved with ``use_pickle`` (tensor
  subclasses) and the legacy ``<model>.pt`` weight and constant files are ``torch.load``-ed with
  ``weights_only=False``; ``custom_obj_*`` constants go through the TorchScript unpickler, ``opaque_obj_*``
  through ``pickle.loads``; ``data/aotinductor/`` holds shared libraries that ``load_pt2`` loads.
- Symbolic shape expressions of the program JSON (``expr_str``) are parsed with ``sympy.sympify``, which is
  ``eval``.
- ``guards_code`` strings are ``exec``-ed by ``program.module()`` to build the input guards.
- A node target (or an ``as_operator`` argument) ``torch.<any attribute path>`` is resolved by attribute lookup
  and called when the program runs (``torch.os.system`` resolves).
- Pytree type names (module call graph specs) must be registered; an enum in a spec context imports its module.

:func:`inspect_pt2` reads all of that with ``zipfile``, ``json``, ``ast`` and ``pickletools`` (nothing is
unpickled, evaluated or imported) and returns what it found; :func:`load_program` refuses a file with findings
unless the caller trusts it. A ``.pt2`` that ``torch.export.save`` writes for a Transformers model holds one
pickle, the sample inputs, whose globals are ``torch._utils._rebuild_tensor_v2``, ``torch.<dtype>Storage`` and
``collections.OrderedDict``; its expressions are ``srepr`` of sizes (``Mul(Integer(32), Symbol('s53', ...))``)
and its guards compare sizes (``L['input_ids'].size()[1] <= 64``).
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import logging
import math
import operator
import re
import sys
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hfexport.plugin import (
    UntrustedArtifactError,
    import_type_modules,
    treespec_names,
    unregistered,
    unsafe_pickle_globals,
)

from ._pytree import register_transformers_pytrees

__all__ = ["Pt2Findings", "admit_types", "allowed_type_module", "inspect_pt2", "load_program", "mutated_buffer_names",
           "own_mutated_buffers", "runnable_module"]

logger = logging.getLogger("hfexport")

TRUST_HINT = ("hfexport runs no code from an artifact: pass trust_remote_code=True (CLI: --trust-remote-code) only "
              "for an artifact from a source you trust")


@dataclass
class Pt2Findings:
    """What :func:`inspect_pt2` found in a ``.pt2``.

    Attributes:
        problems: what loading or running it would execute from the file (empty for a plain program).
        types: the pytree type names its module call graph specs use.
        enum_modules: modules that the specs' enum contexts would import.
    """

    problems: list[str] = field(default_factory=list)
    types: set[str] = field(default_factory=set)
    enum_modules: set[str] = field(default_factory=set)


# ── the pytree types a saved program or manifest names: an allow-list, never an import by name ─────────────
def allowed_type_module(module: str) -> bool:
    """Modules whose types an artifact may name: transformers' (its ``ModelOutput`` and cache types register
    themselves on import) and torch's. Anything else must be imported (registered) by the caller first."""
    return module in ("transformers", "torch") or module.startswith(("transformers.", "torch."))


def admit_types(types: set[str], enum_modules: set[str] = frozenset(), *,  # type: ignore[assignment]
                trust_remote_code: bool = False) -> list[str]:
    """Register the pytree types in ``types`` that the allow-list admits; return those still unregistered.

    Transformers' caches are registered (:func:`register_transformers_pytrees`), and the transformers module a
    ``ModelOutput`` name lives in is imported (its classes register on definition). With ``trust_remote_code``
    the module of any other name is imported too (what ``output_modules`` used to do unconditionally).
    """
    if any(t.startswith("transformers.") for t in types):
        register_transformers_pytrees()
    allowed = None if trust_remote_code else allowed_type_module
    import_type_modules(unregistered(types), allowed=allowed)
    for module in sorted(m for m in enum_modules if m not in sys.modules):
        if trust_remote_code or allowed_type_module(module):
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # reading the spec fails with torch's message
    return unregistered(types)


# ── symbolic expressions and guards: parsed with ast, never evaluated ───────────────────────────────────────
_TORCH_SYMPY = ("FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
                "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
                "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
                "ToFloat", "Identity")
_SYMPY = ("Symbol", "Integer", "Rational", "Float", "Mul", "Add", "Pow", "Max", "Min", "Eq", "Ne", "Lt", "Le", "Gt",
          "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Unequality", "Equality", "And",
          "Or", "Not", "Abs", "Piecewise", "ExprCondPair", "floor", "ceiling", "sqrt", "BooleanTrue", "BooleanFalse",
          "Tuple", "Zero", "One", "NegativeOne", "Half", "Infinity", "NegativeInfinity", "NaN", "ComplexInfinity",
          "IntInfinity", "NegativeIntInfinity")
_EXPR_CALLS = frozenset(_TORCH_SYMPY + _SYMPY)
_EXPR_NAMES = _EXPR_CALLS | {"oo", "zoo", "nan", "pi", "E", "true", "false", "int_oo"}
_SYMBOL = re.compile(r"[a-z]+[0-9]+")  # s0, u3, zuf0, ps1: torch's size symbols
_PLAIN_STRING = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}|[-+]?[0-9]{1,40}(\.[0-9]*)?([eE][-+]?[0-9]{1,4})?")
_KEYWORD = re.compile(r"[a-z][a-z_]{0,40}")
_EXPR_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Tuple, ast.Load, ast.operator,
               ast.unaryop, ast.cmpop, ast.boolop)

# Guards (``L['x'].size()[1] <= 64``) run in a namespace of math, torch and a sympy helper, with builtins.
_GUARD_NAMES = frozenset({"L", "math", "torch", "inf", "max", "min", "abs", "float", "int", "round", "bool", "pow",
                          "IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"})
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "log", "log2", "exp", "pow", "fabs", "inf", "isnan",
                         "isinf"})
_GUARD_TORCH = frozenset({"sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt", "sym_sum",
                          "_sym_sqrt"})


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool | int | float))


def _parse(text: Any) -> ast.Expression | None:
    if not isinstance(text, str) or len(text) > 100_000 or "__" in text:
        return None
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def safe_sym_expr(text: Any) -> bool:
    """Whether ``text`` is a shape expression as torch serializes it (sympy ``srepr`` or ``str``): calls of sympy
    and torch shape functions, size symbols, numbers, plain-name strings, arithmetic and comparisons. Anything
    else is refused: ``sympy.sympify`` would ``eval`` it."""
    tree = _parse(text)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, _EXPR_NODES):
            continue
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _EXPR_CALLS):
                return False
        elif isinstance(node, ast.keyword):
            if node.arg is None or not _KEYWORD.fullmatch(node.arg):
                return False
        elif isinstance(node, ast.Name):
            if node.id not in _EXPR_NAMES and not _SYMBOL.fullmatch(node.id):
                return False
        elif isinstance(node, ast.Constant):
            if not (_number(node) or (isinstance(node.value, str) and _PLAIN_STRING.fullmatch(node.value))):
                return False
        else:
            return False
    return True


def _guard_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Expression):
        return _guard_ok(node.body)
    if _number(node):
        return True
    if isinstance(node, ast.Name):
        return node.id in _GUARD_NAMES or bool(_SYMBOL.fullmatch(node.id))
    if isinstance(node, ast.BinOp):
        return _guard_ok(node.left) and _guard_ok(node.right)
    if isinstance(node, ast.UnaryOp):
        return _guard_ok(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(_guard_ok(v) for v in node.values)
    if isinstance(node, ast.Compare):
        return _guard_ok(node.left) and all(_guard_ok(c) for c in node.comparators)
    if isinstance(node, ast.Tuple | ast.List):
        return all(_guard_ok(e) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _guard_ok(node.test) and _guard_ok(node.body) and _guard_ok(node.orelse)
    if isinstance(node, ast.Subscript):  # L['x'], L['x'][0], L['x'].size()[1]
        key = node.slice
        key_ok = isinstance(key, ast.Constant) and (
            (isinstance(key.value, str) and _PLAIN_STRING.fullmatch(key.value)) or _number(key))
        return key_ok and _guard_ok(node.value)
    if isinstance(node, ast.Call):
        if node.keywords or not all(_guard_ok(a) for a in node.args):
            return False
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in _GUARD_NAMES - {"L", "math", "torch", "inf"}
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "math":
                return func.attr in _GUARD_MATH
            if isinstance(func.value, ast.Name) and func.value.id == "torch":
                return func.attr in _GUARD_TORCH
            return func.attr in _GUARD_METHODS and isinstance(func.value, ast.Subscript) and _guard_ok(func.value)
        return False
    if isinstance(node, ast.Attribute):  # math.inf
        return isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in _GUARD_MATH
    return False


def safe_guard(text: Any) -> bool:
    """Whether ``text`` is an input guard as torch writes it (sizes and strides of ``L[...]`` inputs compared
    with numbers, through arithmetic and a few math and sym functions). ``program.module()`` ``exec``-s them."""
    tree = _parse(text)
    return tree is not None and _guard_ok(tree)


# ── node targets: operators only ──────────────────────────────────────────────────────────────────────────
_SAFE_CALLABLES = (operator.eq, operator.ne, operator.le, operator.ge, operator.lt, operator.gt, operator.neg,
                   operator.pos, operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod,
                   operator.pow, operator.truediv, operator.and_, operator.or_, operator.xor, operator.lshift,
                   operator.rshift, operator.not_, operator.invert, operator.abs, operator.getitem, math.trunc,
                   math.ceil, math.floor, math.sqrt, torch.sym_not, torch.sym_int, torch.sym_float, torch.sym_ite,
                   torch.sym_max, torch.sym_min, torch.sym_sqrt, torch.sym_sum, torch._assert)


def _resolve_target(target: str) -> Any:
    """What torch's deserializer resolves ``target`` to (its prefix rules), by attribute lookup only."""
    if target.startswith("_operator"):
        root: Any = operator
    elif target.startswith("torch"):
        root = torch
    elif target.startswith("math"):
        root = math
    else:
        return target  # "#namespace:op" (a registered extension) or a string torch keeps as it is
    for name in target.split(".")[1:]:
        try:
            if not hasattr(root, name):
                return target
        except Exception:  # noqa: BLE001 - an attribute that raises is not resolved by torch either
            return target
        root = getattr(root, name)
    return root


def safe_target(target: Any) -> bool:
    """Whether a node target resolves to an operator (an ``OpOverload``, a packet, a higher-order op, a sym or
    ``operator`` function) or to nothing callable. Any other callable would be called when the program runs."""
    if not isinstance(target, str):
        return False
    resolved = _resolve_target(target)
    if isinstance(resolved, str) or not callable(resolved):
        return True
    if isinstance(resolved, torch._ops.OpOverload | torch._ops.OpOverloadPacket | torch._ops.HigherOrderOperator):
        return True
    return any(resolved is f for f in _SAFE_CALLABLES)


# ── the archive ───────────────────────────────────────────────────────────────────────────────────────────
def _record(name: str) -> str:
    """A member's record name as torch reads it (below the archive's root folder)."""
    return name.split("/", 1)[1] if "/" in name else name


def _torch_file_problems(data: bytes) -> list[str]:
    """Why ``torch.load`` of ``data`` could run code: globals outside the allow-list in any ``.pkl`` of a
    ``torch.save`` zip; any pickle in another (legacy) format."""
    if not data:
        return []
    if not data.startswith(b"PK\x03\x04"):
        return ["a pickle in torch's legacy (non-zip) format"]
    try:
        inner = zipfile.ZipFile(io.BytesIO(data))
        infos = inner.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        return [f"an unreadable torch.save archive ({exc})"]
    bad: list[str] = []
    for info in infos:
        if info.filename.endswith(".pkl"):
            bad += unsafe_pickle_globals(inner.read(info))
    return sorted(set(bad))


def _json_problems(record: str, node: Any, found: Pt2Findings) -> None:
    if isinstance(node, dict):
        is_node = "target" in node and "inputs" in node
        for key, value in node.items():
            if key == "expr_str" and isinstance(value, str):
                if not safe_sym_expr(value):
                    found.problems.append(f"{record}: shape expression {value!r:.120} is not one torch writes "
                                          "(sympy would eval it)")
            elif key == "guards_code" and isinstance(value, list):
                for guard in value:
                    if not safe_guard(guard):
                        found.problems.append(f"{record}: guard {guard!r:.120} is not one torch writes "
                                              "(program.module() would exec it)")
            elif (key == "target" and is_node or key == "as_operator") and isinstance(value, str):
                if not safe_target(value):
                    found.problems.append(f"{record}: node target {value!r:.120} is not an operator (running the "
                                          "program would call it)")
            elif key in ("in_spec", "out_spec") and isinstance(value, str) and value:
                try:
                    types, enums = treespec_names(value)
                except ValueError:
                    continue  # torch fails to read it too
                found.types |= types
                found.enum_modules |= enums
            else:
                _json_problems(record, value, found)
    elif isinstance(node, list):
        for value in node:
            _json_problems(record, value, found)


def inspect_pt2(file: str | Path) -> Pt2Findings:
    """Read a ``.pt2`` without running any of it and report what ``torch.export.load`` and ``program.module()``
    would execute from it (see the module docstring), and the pytree types its specs name.

    Raises:
        ValueError: ``file`` is not a zip archive.
    """
    found = Pt2Findings()
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{file} is not a .pt2 archive: {exc}") from exc
    with archive:
        records: dict[str, list[zipfile.ZipInfo]] = defaultdict(list)
        for info in archive.infolist():
            records[_record(info.filename)].append(info)
        pickled = set()
        for record in records:
            base = record.rsplit("/", 1)[-1]
            if record.startswith("data/aotinductor/"):
                found.problems.append(f"{record}: compiled native code (AOTInductor), loaded as a shared library")
            elif record.startswith("data/constants/") and base.startswith("custom_obj_"):
                found.problems.append(f"{record}: a TorchScript object (its class's code runs on load)")
            elif record.startswith("data/constants/") and base.startswith("opaque_obj_"):
                found.problems.append(f"{record}: an opaque Python object (pickle.loads)")
            elif record.startswith("data/sample_inputs/") or record.endswith((".pt", ".pkl")):
                pickled.add(record)
            elif record.startswith(("data/weights/", "data/constants/")) and record.endswith("_config.json"):
                directory = "data/weights/" if record.startswith("data/weights/") else "data/constants/"
                for info in records[record]:
                    try:
                        config = json.loads(archive.read(info))["config"]
                        entries = [(k, v) for k, v in config.items() if isinstance(v, dict) and v.get("use_pickle")]
                    except (ValueError, KeyError, TypeError, AttributeError):
                        found.problems.append(f"{record}: an unreadable payload config")
                        continue
                    for fqn, meta in entries:
                        target = f"{directory}{meta.get('path_name')}"
                        if target in records:
                            pickled.add(target)
                        else:
                            found.problems.append(f"{record}: {fqn} is a pickle at {target!r}, which is not an "
                                                  "archive member this check can read")
        for record in sorted(pickled):
            for info in records[record]:
                bad = _torch_file_problems(archive.read(info))
                if bad:
                    found.problems.append(f"{record}: unpickling it would import {', '.join(bad)}")
        for record, infos in records.items():
            if record.endswith(".json"):
                for info in infos:
                    try:
                        data = json.loads(archive.read(info))
                    except (ValueError, UnicodeDecodeError):
                        continue  # torch cannot read it either
                    _json_problems(record, data, found)
    for module in sorted(found.enum_modules):
        if module not in sys.modules and not allowed_type_module(module):
            found.problems.append(f"a pytree spec names an enum of module {module!r}, which reading it would import")
    return found


def load_program(file: str | Path, *, trust_remote_code: bool = False) -> torch.export.ExportedProgram:
    """``torch.export.load(file)`` after :func:`inspect_pt2` found nothing that would run code from it (or the
    caller trusts it), with the pytree types it names admitted by the allow-list.

    Raises:
        hfexport.UntrustedArtifactError: what would run, and how to opt in; or a type that is not registered.
        ValueError: not a ``.pt2`` archive, or torch cannot read it.
    """
    file = Path(file)
    found = inspect_pt2(file)
    if found.problems:
        if not trust_remote_code:
            raise UntrustedArtifactError(f"{file.name} would run code from the artifact when loaded: "
                                         f"{'; '.join(found.problems)}. {TRUST_HINT}")
        logger.warning("loading %s with trust_remote_code=True although: %s", file, "; ".join(found.problems))
    missing = admit_types(found.types, found.enum_modules, trust_remote_code=trust_remote_code)
    if missing:
        raise UntrustedArtifactError(
            f"{file.name} uses types that are not registered pytree nodes in this process: {', '.join(missing)}. "
            "hfexport imports no module an artifact names (only transformers' and torch's): import the package "
            "that defines them before hfexport.load, or pass trust_remote_code=True")
    try:
        return torch.export.load(file)
    except Exception as exc:
        raise ValueError(f"torch.export.load cannot read {file} ({type(exc).__name__}: {exc}); it was written by "
                         "another torch version, or is damaged") from exc


# ── mutated buffers ──────────────────────────────────────────────────────────────────────────────────
# Buffers a program mutates: the program owns their export-time value, and a runner runs on copies of it.
#
# ``torch.export`` keeps the model's own buffer tensors in ``ExportedProgram.state_dict`` / ``constants``, and
# ``program.module()`` registers those same tensors. For a buffer that ``forward`` mutates in place (a pre-filled
# cache, running statistics) that means three silent losses of its initial value: running the export mutates the
# user's model, running the model eagerly after export changes what the export starts from, and saving after a run
# writes the mutated state as the initial value. ExecuTorch serializes the initial value and each loaded program
# starts from it; these helpers give the ``dynamo`` backend the same contract.


def mutated_buffer_names(program: torch.export.ExportedProgram) -> list[str]:
    """The fully qualified names of the buffers ``program`` may mutate: every buffer. ``torch.export.export``'s
    training IR keeps in-place ops in the graph (``buffers_to_mutate`` is then empty), and a mutation may reach a
    buffer through views, so every buffer counts (parameters and lifted constants do not)."""
    return sorted(set(program.graph_signature.inputs_to_buffers.values())
                  | set(program.graph_signature.buffers_to_mutate.values()))


def own_mutated_buffers(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Replace, in place, each mutated buffer of ``program`` by a copy: later changes of the model's tensor (an
    eager call) no longer change the program's initial value, and the program's runs no longer change the model."""
    for name in mutated_buffer_names(program):
        for table in (program.state_dict, program.constants):
            if isinstance(table.get(name), torch.Tensor):
                table[name] = table[name].detach().clone()
    return program


def runnable_module(program: torch.export.ExportedProgram) -> Any:
    """``program.module()`` whose buffers are copies: its calls carry the state from call to call without touching
    the program, so a save after a run still writes the initial value."""
    module = program.module()
    for name in mutated_buffer_names(program):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if isinstance(getattr(owner, leaf, None), torch.Tensor):
            setattr(owner, leaf, getattr(owner, leaf).detach().clone())
    return module
