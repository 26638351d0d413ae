"""Reading a ``.pt2`` as untrusted input: hfexport reads the archive, and torch builds the program from what
hfexport parsed. torch never opens the file.

Measured in torch 2.15 (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``), its own
``torch.export.load`` can run code from a file: it unpickles sample inputs with ``weights_only=True`` and, when
that fails, again with ``weights_only=False``; pickled weights and constants with ``weights_only=False``;
``custom_obj_*`` through the TorchScript unpickler and ``opaque_obj_*`` through ``pickle.loads``; it parses shape
expressions with ``sympy.sympify`` (``eval``), and ``program.module()`` ``exec``-s ``guards_code``. Its zip reader
matches names case-insensitively and takes any member under ``models/`` as a program. So :func:`read_pt2`:

- reads the zip once, with ``zipfile``: every member stored (not compressed), in the layout ``torch.export.save``
  writes (:data:`_LAYOUT`) below one root folder, no name twice (nor twice up to case), sizes that fit the file,
  each member used exactly once (CRC-checked on read);
- builds weights and constants from their raw bytes (``torch.frombuffer``, ``as_strided`` bounds-checked); a
  pickled weight or constant, a TorchScript or opaque object is refused;
- unpickles the sample inputs with :class:`RestrictedUnpickler` (an allow-list ``find_class``, torch's storages
  read from the same archive, no ``BUILD``/``INST``/``OBJ``/``NEWOBJ``/extension opcodes), never ``torch.load``;
- reads the program JSON with bounds (:func:`hfexport.trust.parse_json`), parses every shape expression with its
  own small grammar into sympy objects (:func:`parse_sym_expr`: size symbols, integers below 2**64,
  ``+ - * / // %``, comparisons, ``Min``/``Max`` and torch's size functions, a bounded ``Pow``; torch's
  ``sympify`` then returns them as they are: nothing is parsed or evaluated from text), drops ``guards_code``
  (hfexport checks inputs against the manifest itself) and every node's metadata (stack traces reach the code
  torch.fx generates), refuses a name with characters a name has not, a node target that is not an operator
  (:func:`safe_target`) and a pytree spec outside the allow-list (:func:`hfexport.trust.load_treespec`);
- and hands those objects to torch's ``ExportedProgramDeserializer``.

``trust_remote_code=True`` hands the file to ``torch.export.load`` instead (what it runs is then the caller's
choice).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import logging
import math
import operator
import pickle
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hfexport import IntegrityError, UntrustedArtifactError
from hfexport.trust import import_type_modules, load_treespec, parse_json, unregistered

from ._pytree import register_transformers_pytrees

__all__ = ["PT2_MAX_MEMBERS", "RestrictedUnpickler", "admit_types", "allowed_type_module", "parse_sym_expr",
           "load_program", "mutated_buffer_names", "own_mutated_buffers", "read_pt2", "runnable_module",
           "safe_target", "save_program"]

logger = logging.getLogger("hfexport")

TRUST_HINT = ("hfexport runs no code from an artifact: pass trust_remote_code=True (CLI: --trust-remote-code) only "
              "for an artifact from a source you trust")


# ── the pytree types a saved program or manifest names: an allow-list, never an import by a given name ───────
_TRANSFORMERS_MODULE = re.compile(r"transformers\.(modeling_outputs|cache_utils|models\.[a-z0-9_]{1,64}\.modeling_"
                                  r"[a-z0-9_]{1,64})")


def allowed_type_module(module: str) -> bool:
    """Modules whose types an artifact may name and hfexport imports to register them: transformers'
    ``modeling_outputs``, ``cache_utils`` and ``models.<name>.modeling_<name>`` (their ``ModelOutput`` classes
    register themselves on import; importing one is what transformers' own auto classes do for a config's
    ``model_type``). Nothing else: another module must be imported by the caller first."""
    return bool(_TRANSFORMERS_MODULE.fullmatch(module))


def admit_types(types: set[str], enum_modules: set[str] = frozenset(), *,  # type: ignore[assignment]
                trust_remote_code: bool = False) -> list[str]:
    """Register the pytree types in ``types`` that the allow-list admits; return those still unregistered.

    Transformers' caches are registered (:func:`register_transformers_pytrees`), and a ``ModelOutput`` name's
    module is imported when :func:`allowed_type_module` admits it. With ``trust_remote_code`` the module of any
    other name (and of an enum) is imported too. Without it, enum modules are never imported: the spec reader
    refuses contexts that name them.
    """
    if any(t.startswith("transformers.") for t in types):
        register_transformers_pytrees()
    allowed = None if trust_remote_code else allowed_type_module
    import_type_modules(unregistered(types), allowed=allowed)
    if trust_remote_code:
        import importlib

        for module in sorted(m for m in enum_modules if m not in sys.modules):
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # reading the spec fails with torch's message
    return unregistered(types)


# ── symbolic expressions: hfexport's own small grammar, sympy objects out (no sympify, no eval) ─────────────
EXPR_MAX_CHARS = 20_000
EXPR_MAX_DEPTH = 64
EXPR_MAX_INT = 2**64
EXPR_MAX_EXPONENT = 64
EXPR_MAX_POWERS = 4
_SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,12}")  # s0, u3, zuf0, ps1: torch's size symbols
_SYMBOL_ASSUMPTIONS = frozenset({"integer", "positive", "nonnegative", "real", "finite", "negative", "nonpositive"})
_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]{1,24})|(?P<name>[A-Za-z_][A-Za-z0-9_]{0,40})|'(?P<str>[a-z0-9]{1,24})'"
                    r"|(?P<op>\*\*|//|==|!=|<=|>=|[-+*/%(),=<>]))")


@functools.cache
def _expr_functions() -> dict[str, Any]:
    """The calls the grammar admits: sympy's arithmetic, comparison and logic, and torch's size functions."""
    import sympy
    import torch.utils._sympy.functions as functions

    table: dict[str, Any] = {name: getattr(sympy, name) for name in (
        "Integer", "Rational", "Add", "Mul", "Max", "Min", "Abs", "Pow", "Mod", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
        "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Unequality", "Equality", "And", "Or",
        "Not")}
    table.update({name: getattr(functions, name) for name in (
        "FloorDiv", "PythonMod", "CleanDiv", "CeilDiv", "ModularIndexing", "TruncToInt", "FloorToInt", "CeilToInt",
        "PowByNatural", "Mod") if hasattr(functions, name)})
    return table


def _expr_constants() -> dict[str, Any]:
    import sympy
    from torch.utils._sympy.numbers import int_oo

    return {"oo": sympy.oo, "int_oo": int_oo, "true": sympy.true, "false": sympy.false, "True": sympy.true,
            "False": sympy.false}


class _ExprParser:
    """A recursive-descent parser of the shape expressions torch serializes (``srepr`` or ``str`` of sympy):
    ``expr := cmp; cmp := sum [(== != < <= > >=) sum]; sum := term {(+ -) term}; term := unary {(* / // %) unary};
    unary := - unary | power; power := atom [** int]; atom := int | name | name(args) | (expr)``. Calls only of
    :func:`_expr_functions`, plus ``Symbol('s7', integer=True, ...)``; integers below 2**64; exponents of at most 64,
    at most 4 powers; at most 64 levels deep. It builds sympy objects directly: nothing is evaluated from text."""

    def __init__(self, text: str, symbols: dict[str, Any]):
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                if not text[position:].strip():
                    break
                raise ValueError(f"shape expression {text!r:.120} has a character outside hfexport's grammar at "
                                 f"{position}")
            kind = match.lastgroup or "op"
            self.tokens.append((kind, match.group(kind)))
            position = match.end()
        self.at = 0
        self.depth = 0
        self.powers = 0
        self.symbols = symbols

    def fail(self, what: str) -> ValueError:
        return ValueError(f"shape expression {self.text!r:.120} is outside hfexport's grammar: {what}")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (op is not None and token != ("op", op)):
            raise self.fail(f"expected {op or 'more'} at token {self.at}")
        self.at += 1
        return token

    def parse(self) -> Any:
        value = self.comparison()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return value

    def comparison(self) -> Any:
        import sympy

        left = self.sum()
        token = self.peek()
        ops = {"==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge}
        if token is not None and token[0] == "op" and token[1] in ops:
            self.take()
            return ops[token[1]](left, self.sum())
        return left

    def sum(self) -> Any:
        value = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            right = self.term()
            value = value + right if op == "+" else value - right
        return value

    def term(self) -> Any:
        import sympy

        functions = _expr_functions()
        value = self.unary()
        while self.peek() in (("op", "*"), ("op", "/"), ("op", "//"), ("op", "%")):
            op = self.take()[1]
            right = self.unary()
            if op == "*":
                value = value * right
            elif op == "/":
                value = value / right
            elif op == "//":
                value = functions["FloorDiv"](value, right)
            else:
                value = sympy.Mod(value, right)
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "-"):
            self.take()
            return -self.nested(self.unary)
        if self.peek() == ("op", "+"):
            self.take()
            return self.nested(self.unary)
        return self.power()

    def nested(self, parse: Any) -> Any:
        self.depth += 1
        if self.depth > EXPR_MAX_DEPTH:
            raise self.fail(f"nested deeper than {EXPR_MAX_DEPTH}")
        try:
            return parse()
        finally:
            self.depth -= 1

    def power(self) -> Any:
        base = self.atom()
        if self.peek() == ("op", "**"):
            self.take()
            return self.raise_to(base, self.atom())
        return base

    def raise_to(self, base: Any, exponent: Any) -> Any:
        import sympy

        self.powers += 1
        if self.powers > EXPR_MAX_POWERS:
            raise self.fail(f"more than {EXPR_MAX_POWERS} powers")
        if not (isinstance(exponent, sympy.Integer) and 0 <= int(exponent) <= EXPR_MAX_EXPONENT) \
                or not (isinstance(base, sympy.Symbol) or (isinstance(base, sympy.Integer)
                                                           and abs(int(base)) <= EXPR_MAX_INT)):
            raise self.fail(f"a power other than an integer or a symbol to at most {EXPR_MAX_EXPONENT}")
        return sympy.Pow(base, exponent)

    def integer(self, text: str) -> Any:
        import sympy

        value = int(text)
        if value > EXPR_MAX_INT:
            raise self.fail(f"an integer over 2**64 ({len(text)} digits)")
        return sympy.Integer(value)

    def atom(self) -> Any:
        kind, text = self.take()
        if kind == "int":
            return self.integer(text)
        if (kind, text) == ("op", "("):
            value = self.nested(self.comparison)
            self.take(")")
            return value
        if kind != "name":
            raise self.fail(f"unexpected {text!r}")
        if self.peek() == ("op", "("):
            self.take()
            return self.nested(lambda: self.call(text))
        constants = _expr_constants()
        if text in constants:
            return constants[text]
        if _SYMBOL.fullmatch(text):
            import sympy

            return self.symbols.get(text) or sympy.Symbol(text)
        raise self.fail(f"name {text!r}")

    def call(self, name: str) -> Any:
        import sympy

        args: list[Any] = []
        keywords: dict[str, bool] = {}
        while self.peek() != ("op", ")"):
            token = self.peek()
            if token is not None and token[0] == "str" and name == "Symbol" and not args:
                self.take()
                args.append(token[1])
            elif token is not None and token[0] == "name" and self.at + 1 < len(self.tokens) \
                    and self.tokens[self.at + 1] == ("op", "="):
                self.take()
                self.take("=")
                value = self.take()
                if token[1] not in _SYMBOL_ASSUMPTIONS or value not in (("name", "True"), ("name", "False")) \
                        or name != "Symbol":
                    raise self.fail(f"keyword {token[1]}={value[1]} of {name}")
                keywords[token[1]] = value[1] == "True"
            else:
                args.append(self.comparison())
            if self.peek() == ("op", ","):
                self.take()
            elif self.peek() != ("op", ")"):
                raise self.fail(f"arguments of {name}")
        self.take(")")
        if name == "Symbol":
            if len(args) != 1 or not isinstance(args[0], str) or not _SYMBOL.fullmatch(args[0]):
                raise self.fail("Symbol of a name other than a size symbol's")
            symbol = sympy.Symbol(args[0], **keywords)
            self.symbols.setdefault(args[0], symbol)
            return symbol
        if any(isinstance(a, str) for a in args):
            raise self.fail(f"a string argument of {name}")
        if name in ("Integer", "Rational"):
            if not args or len(args) > (1 if name == "Integer" else 2) \
                    or not all(isinstance(a, sympy.Integer) for a in args):
                raise self.fail(f"{name} of other than integers")
            return args[0] if name == "Integer" else sympy.Rational(*args)
        if name in ("Pow", "PowByNatural"):
            if len(args) != 2:
                raise self.fail(f"{name} of {len(args)} arguments")
            base = self.raise_to(*args)
            return base if name == "Pow" else _expr_functions()["PowByNatural"](*args)
        function = _expr_functions().get(name)
        if function is None:
            raise self.fail(f"a call of {name}")
        try:
            return function(*args)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise self.fail(f"{name}{tuple(args)!r:.80} ({exc})") from None


def parse_sym_expr(text: Any, symbols: dict[str, Any] | None = None) -> Any:
    """The sympy expression of ``text``, a shape expression as torch serializes it, built by :class:`_ExprParser`
    (hfexport's grammar; no ``sympify``, no ``eval``). torch's deserializer takes the object as it is (``sympify``
    returns a sympy object unchanged).

    Args:
        text: the ``expr_str``, at most 20,000 characters.
        symbols: size symbols already built for this program, by name (a plain ``s7`` reuses ``Symbol('s7', ...)``
            as torch's locals do); filled in.

    Raises:
        ValueError: outside the grammar or its bounds (names what).
    """
    if not isinstance(text, str) or len(text) > EXPR_MAX_CHARS:
        raise ValueError(f"a shape expression that is not a string of at most {EXPR_MAX_CHARS:,} characters")
    return _ExprParser(text, {} if symbols is None else symbols).parse()


# ── node targets: operators only ──────────────────────────────────────────────────────────────────────────
_SAFE_CALLABLES = (operator.eq, operator.ne, operator.le, operator.ge, operator.lt, operator.gt, operator.neg,
                   operator.pos, operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod,
                   operator.pow, operator.truediv, operator.and_, operator.or_, operator.xor, operator.lshift,
                   operator.rshift, operator.not_, operator.invert, operator.abs, operator.getitem, math.trunc,
                   math.ceil, math.floor, math.sqrt, torch.sym_not, torch.sym_int, torch.sym_float, torch.sym_ite,
                   torch.sym_max, torch.sym_min, torch.sym_sqrt, torch.sym_sum, torch._assert)
_TARGET = re.compile(r"(_operator|torch|math)(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,8}|#[A-Za-z0-9_.:]{1,200}")


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
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        return False
    resolved = _resolve_target(target)
    if isinstance(resolved, str) or not callable(resolved):
        return True
    if isinstance(resolved, torch._ops.OpOverload | torch._ops.OpOverloadPacket | torch._ops.HigherOrderOperator):
        return True
    return any(resolved is f for f in _SAFE_CALLABLES)


# ── the archive: one reader, the layout torch writes ──────────────────────────────────────────────────────
PT2_MAX_MEMBERS = 1_000_000
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,99}"
_ROOT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_PT2_FIXED = frozenset({"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"})
_LAYOUT = re.compile(rf"models/{_NAME}\.json|data/weights/{_NAME}_weights_config\.json|data/weights/weight_[0-9]{{1,9}}"
                     rf"|data/constants/{_NAME}_constants_config\.json|data/constants/tensor_[0-9]{{1,9}}"
                     rf"|data/sample_inputs/{_NAME}\.pt")
# torch.save's zip (the sample inputs)
_SAVE_FIXED = frozenset({"data.pkl", ".format_version", ".storage_alignment", "byteorder", "version",
                         ".data/serialization_id", ".data/version"})
_SAVE_LAYOUT = re.compile(r"data/[0-9]{1,9}")


class _Members:
    """The members of a zip archive read with ``zipfile`` as the only reader, checked against a layout."""

    def __init__(self, source: Any, what: str, fixed: frozenset[str], layout: re.Pattern[str], size: int):
        self.what = what
        try:
            # Names are read as UTF-8 whether or not their UTF-8 flag is set (torch writes ASCII names): zipfile would
            # otherwise decode an unflagged name as cp437, importing that codec while an artifact is read.
            self.zip = zipfile.ZipFile(source, metadata_encoding="utf-8")
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
                NotImplementedError) as exc:  # NotImplementedError: "zip file version 22.6" (a flipped byte)
            raise IntegrityError(f"{what} is not a zip archive ({exc}): the file is damaged or crafted",
                                 [what.split(":")[0]]) from None
        if len(infos) > PT2_MAX_MEMBERS:
            raise ValueError(f"{what} has {len(infos):,} members (at most {PT2_MAX_MEMBERS:,})")
        self.records: dict[str, zipfile.ZipInfo] = {}
        folded: dict[str, str] = {}
        roots = set()
        total = 0
        for info in infos:
            name = info.filename
            root, _, record = name.partition("/")
            if info.flag_bits & 0x1 or info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{what}: member {name!r:.120} is encrypted or compressed; torch writes stored "
                                 "members only")
            if not _ROOT.fullmatch(root) or root in (".", "..") or not (record in fixed or layout.fullmatch(record)):
                raise ValueError(f"{what}: member {name!r:.120} is outside the layout torch writes")
            if record in self.records:
                raise ValueError(f"{what}: member {name!r:.120} appears twice")
            if record.casefold() in folded:
                raise ValueError(f"{what}: members {folded[record.casefold()]!r} and {record!r} differ only in case")
            folded[record.casefold()] = record
            roots.add(root)
            total += info.file_size
            self.records[record] = info
        if len(roots) > 1:
            raise ValueError(f"{what} has members under several root folders: {sorted(roots)[:4]}")
        if total > size:
            raise ValueError(f"{what}: its members hold {total:,} bytes, more than the archive's {size:,}")
        self.used: set[str] = set()

    def read(self, record: str) -> bytes:
        if record not in self.records:
            raise ValueError(f"{self.what} has no member {record!r}")
        if record in self.used:
            raise ValueError(f"{self.what}: member {record!r} is read twice")
        self.used.add(record)
        try:
            return self.zip.read(self.records[record])
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            raise IntegrityError(f"{self.what}: member {record!r} is damaged ({exc}): the file is damaged or crafted",
                                 [self.what.split(":")[0]]) from None

    def unused(self) -> list[str]:
        return sorted(set(self.records) - self.used)


# ── the sample inputs: a restricted unpickler ───────────────────────────────────────────────────────────
_DTYPE_OF_STORAGE = {f"{name}Storage": dtype for name, dtype in (
    ("Double", torch.float64), ("Float", torch.float32), ("Half", torch.float16), ("BFloat16", torch.bfloat16),
    ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8),
    ("Byte", torch.uint8), ("Bool", torch.bool), ("ComplexFloat", torch.complex64),
    ("ComplexDouble", torch.complex128))}


class _StorageType:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


class _Storage:
    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor  # flat, on the CPU


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    hooks: Any = None, metadata: Any = None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` with its arguments checked: a storage of this archive, int sizes."""
    ints = (offset, *size, *stride) if isinstance(size, tuple) and isinstance(stride, tuple) else None
    if not isinstance(storage, _Storage) or ints is None or len(size) != len(stride) or len(size) > 64 \
            or not all(type(i) is int and 0 <= i < 2**62 for i in ints) or type(requires_grad) is not bool \
            or not (hooks is None or (isinstance(hooks, dict) and not hooks)) or metadata is not None:
        raise pickle.UnpicklingError("a tensor rebuilt from arguments torch.save does not write")
    try:
        return torch.as_strided(storage.tensor, size, stride, offset).requires_grad_(requires_grad)
    except RuntimeError as exc:
        raise pickle.UnpicklingError(f"a tensor outside its storage ({exc})") from None


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): _StorageType(dtype) for name, dtype in _DTYPE_OF_STORAGE.items()},
}
# opcodes that call something other than an allow-listed global, or reach the copyreg extension registry
_REFUSED_OPCODES = (pickle.BUILD, pickle.INST, pickle.OBJ, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2,
                    pickle.EXT4, pickle.PERSID)


class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: its opcode table can be narrowed
    """Unpickles ``torch.save`` output of tensors and containers only: ``find_class`` admits the globals of
    :data:`_ALLOWED_GLOBALS` (a tensor rebuilder of hfexport's, typed storages as markers, ``OrderedDict``) and
    nothing else; ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``EXT1/2/4`` and text ``PERSID`` are not
    in its opcode table; a storage comes from the archive's own ``data/<key>`` member."""

    dispatch = {k: v for k, v in pickle._Unpickler.dispatch.items() if k not in
                {op[0] for op in _REFUSED_OPCODES}}

    def __init__(self, data: bytes, members: _Members):
        super().__init__(io.BytesIO(data))
        self.members = members
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not among the globals torch.save writes for "
                                         "tensors")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and isinstance(pid[2], str) and re.fullmatch(r"[0-9]{1,9}", pid[2]) and type(pid[4]) is int):
            raise pickle.UnpicklingError(f"a persistent id torch.save does not write: {pid!r:.120}")
        _, storage_type, key, _, numel = pid
        if key not in self.storages:
            data = bytearray(self.members.read(f"data/{key}"))
            if len(data) != numel * storage_type.dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key} holds {len(data)} bytes, not {numel} elements")
            tensor = torch.frombuffer(data, dtype=storage_type.dtype) if data else torch.empty(
                0, dtype=storage_type.dtype)
            self.storages[key] = _Storage(tensor)
        storage = self.storages[key]
        if storage.tensor.dtype != storage_type.dtype:
            raise pickle.UnpicklingError(f"storage {key} is read with two dtypes")
        return storage


def _leaves_are_tensors(value: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if isinstance(value, torch.Tensor) or value is None or type(value) in (int, float, bool, str):
        return True
    if type(value) in (tuple, list):
        return all(_leaves_are_tensors(v, depth + 1) for v in value)
    if type(value) in (dict, collections.OrderedDict):
        return all(type(k) is str and _leaves_are_tensors(v, depth + 1) for k, v in value.items())
    return False


def unpickle_sample_inputs(data: bytes, what: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` a ``torch.save`` zip holds, through :class:`RestrictedUnpickler`.

    Raises:
        UntrustedArtifactError: the pickle asks for anything else (names what).
        ValueError: not a ``torch.save`` zip of that layout.
    """
    members = _Members(io.BytesIO(data), what, _SAVE_FIXED, _SAVE_LAYOUT, len(data))
    for record in sorted(members.records):
        if record not in ("data.pkl",) and not record.startswith("data/"):
            members.read(record)  # version and byte-order records: checked below where they matter
    try:
        value = RestrictedUnpickler(members.read("data.pkl"), members).load()
    except (pickle.UnpicklingError, KeyError, IndexError, TypeError, AttributeError, EOFError, ValueError,
            RecursionError, MemoryError, OverflowError) as exc:
        raise UntrustedArtifactError(f"{what}: unpickling it would need what hfexport's restricted unpickler "
                                     f"refuses ({type(exc).__name__}: {exc}). {TRUST_HINT}") from None
    if members.unused():
        raise ValueError(f"{what}: members no tensor uses: {members.unused()[:8]}")
    if not (isinstance(value, tuple) and len(value) == 2 and type(value[0]) is tuple and type(value[1]) is dict
            and _leaves_are_tensors(value)):
        raise UntrustedArtifactError(f"{what} holds a {type(value).__name__}, not (args, kwargs) of tensors")
    return value


# ── weights and constants: raw bytes, never a pickle ─────────────────────────────────────────────────────
def _payloads(members: _Members, config_record: str, directory: str, prefix: str, what: str) -> dict[str, Any]:
    from torch._export.serde import schema
    from torch._export.serde.serialize import (
        _dict_to_dataclass,
        deserialize_device,
        deserialize_scalar_type,
        deserialize_size,
        deserialize_storage_offset,
        deserialize_stride,
    )

    if config_record not in members.records:
        raise ValueError(f"{what} has no {config_record}")
    raw = parse_json(members.read(config_record))
    config = _dict_to_dataclass(schema.PayloadConfig, raw)
    files: dict[str, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for fqn, meta in config.config.items():
        if not _IDENTIFIER_TEXT.fullmatch(fqn):
            raise UntrustedArtifactError(f"{what}: {config_record} names {fqn!r:.120}, which is not a name. {TRUST_HINT}")
        path_name = meta.path_name
        if meta.use_pickle or not isinstance(path_name, str) or not re.fullmatch(rf"{prefix}[0-9]{{1,9}}", path_name):
            kind = ("a pickle (torch.load with weights_only=False)" if meta.use_pickle
                    else f"{path_name!r:.60}, not a raw tensor ({prefix}N)")
            raise UntrustedArtifactError(f"{what}: {fqn!r:.80} in {config_record} is {kind}; hfexport reads raw "
                                         f"tensors only. {TRUST_HINT}")
        tensor_meta = meta.tensor_meta
        if tensor_meta is None:
            raise ValueError(f"{what}: {fqn!r:.80} has no tensor_meta")
        dtype = deserialize_scalar_type(tensor_meta.dtype)
        device = deserialize_device(tensor_meta.device)
        if path_name not in files:
            data = bytearray(members.read(f"{directory}{path_name}"))
            if len(data) % dtype.itemsize:
                raise ValueError(f"{what}: {directory}{path_name} holds {len(data)} bytes, not whole {dtype}")
            files[path_name] = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        flat = files[path_name]
        if flat.dtype != dtype:
            raise ValueError(f"{what}: {directory}{path_name} is read with two dtypes")
        try:
            tensor = torch.as_strided(flat, deserialize_size(tensor_meta.sizes), deserialize_stride(tensor_meta.strides),
                                      deserialize_storage_offset(tensor_meta.storage_offset))
        except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
            raise ValueError(f"{what}: {fqn!r:.80} does not fit its bytes ({exc})") from None
        if device.type != "cpu":
            tensor = tensor.to(device)
        if meta.is_param:
            out[fqn] = torch.nn.Parameter(tensor, requires_grad=tensor_meta.requires_grad)
        else:
            out[fqn] = tensor.requires_grad_(bool(tensor_meta.requires_grad)) if tensor.is_floating_point() else tensor
    return out


# ── the program JSON ──────────────────────────────────────────────────────────────────────────────────────
_IDENTIFIER_TEXT = re.compile(r"[A-Za-z0-9_.:#@+\-]{0,1000}")  # names, FQNs, targets, versions


def _check_program(node: Any, what: str, symbols: dict[str, Any], key: str = "") -> None:
    """Check the program JSON in place: every ``expr_str`` replaced by its sympy object (:func:`parse_sym_expr`),
    node targets operators, pytree specs allow-listed, every node's ``metadata`` dropped (stack traces reach the
    code torch.fx generates and ``exec``-s, and lookups resolve the rest; none is needed to run), and every name
    (``name``, ``*_name``, ``fqn``, graph signature strings) of the characters a name has: they reach that code
    too."""
    if isinstance(node, dict):
        is_node = "target" in node and "inputs" in node
        if is_node and "metadata" in node:
            node["metadata"] = {}
        for child_key, value in list(node.items()):
            if child_key == "expr_str":
                try:
                    node[child_key] = parse_sym_expr(value, symbols)
                except ValueError as exc:
                    raise UntrustedArtifactError(f"{what}: {exc} (torch would sympify it: eval). "
                                                 f"{TRUST_HINT}") from None
            elif (child_key == "target" and is_node) or child_key == "as_operator":
                if not safe_target(value):
                    raise UntrustedArtifactError(f"{what}: node target {value!r:.120} is not an operator (running "
                                                 f"the program would call it). {TRUST_HINT}")
            elif child_key in ("in_spec", "out_spec") and isinstance(value, str) and value:
                load_treespec(value, f"{what}: a module call {child_key}")
            elif (child_key in ("name", "fqn") or child_key.endswith(("_name", "_names")) or key == "graph_signature") \
                    and any(isinstance(v, str) and not _IDENTIFIER_TEXT.fullmatch(v)
                            for v in (value if isinstance(value, list) else [value])):
                raise UntrustedArtifactError(f"{what}: {child_key} {value!r:.120} is not a name (torch writes names into "
                                             f"the code it generates: fx's forward, the input guards). {TRUST_HINT}")
            else:
                _check_program(value, what, symbols, key if key == "graph_signature" else child_key)
    elif isinstance(node, list):
        for value in node:
            _check_program(value, what, symbols, key)


def read_pt2(file: str | Path, data: bytes | None = None) -> torch.export.ExportedProgram:
    """The ``ExportedProgram`` of a ``.pt2``, read as untrusted input (see the module docstring): hfexport's zip
    reader, raw weights, a restricted unpickler, a checked and canonical program JSON without guards, then torch's
    deserializer on those objects.

    Raises:
        hfexport.UntrustedArtifactError: it holds what would run code (a pickle beyond tensors, an expression
            outside the grammar, a target that is not an operator, a pytree type outside the allow-list).
        ValueError: not a ``.pt2`` in the layout torch writes, or damaged (names the member).
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass
    from torch.export.pt2_archive.constants import ARCHIVE_FORMAT_VALUE, ARCHIVE_VERSION_VALUE

    file = Path(file)
    what = file.name
    size = len(data) if data is not None else file.stat().st_size
    with (io.BytesIO(data) if data is not None else open(file, "rb")) as stream:
        members = _Members(stream, what, _PT2_FIXED, _LAYOUT, size)
        fixed = {record: members.read(record) for record in _PT2_FIXED if record in members.records}
        if fixed.get("archive_format", b"").decode(errors="replace") != ARCHIVE_FORMAT_VALUE \
                or fixed.get("archive_version", b"").decode(errors="replace") != str(ARCHIVE_VERSION_VALUE):
            raise ValueError(f"{what} is not a .pt2 of archive version {ARCHIVE_VERSION_VALUE} (it records "
                             f"{fixed.get('archive_format')!r:.20}, {fixed.get('archive_version')!r:.20})")
        if fixed.get("byteorder", b"little") != sys.byteorder.encode():
            raise ValueError(f"{what} is {fixed.get('byteorder')!r:.20}-endian; this machine is {sys.byteorder}")
        models = [r for r in members.records if r.startswith("models/")]
        if len(models) != 1:
            raise ValueError(f"{what} holds {len(models)} programs; an hfexport .pt2 holds one")
        model = models[0][len("models/"):-len(".json")]
        program = parse_json(members.read(models[0]), max_depth=256)
        if not isinstance(program, dict):
            raise ValueError(f"{what}: models/{model}.json is not an object")
        program["guards_code"] = []  # exec-ed by program.module(); hfexport checks inputs against the manifest
        _check_program(program, what, {})
        state_dict = _payloads(members, f"data/weights/{model}_weights_config.json", "data/weights/", "weight_", what)
        constants = _payloads(members, f"data/constants/{model}_constants_config.json", "data/constants/",
                              "tensor_", what)
        sample = f"data/sample_inputs/{model}.pt"
        example_inputs = unpickle_sample_inputs(members.read(sample), f"{what}: {sample}") \
            if sample in members.records else ((), {})
        if members.unused():
            raise ValueError(f"{what}: members the program does not use: {members.unused()[:8]}")
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, program)
        return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, example_inputs)
    except UntrustedArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch's deserializer raises many kinds on a malformed program
        raise ValueError(f"torch cannot build the program of {what} ({type(exc).__name__}: {exc}); it was written "
                         "by another torch version, or is damaged") from exc


class _FailSoftWriter(io.RawIOBase):
    """The file object ``torch.export.save`` writes to: the first failed write (a full disk) is kept, and later
    writes are counted and dropped, so torch's C++ archive writer never sees a write fail (it aborts the
    interpreter when one does: SIGABRT from ``PyTorchStreamWriter``'s destructor, measured in torch 2.15)."""

    def __init__(self, stream: Any):
        super().__init__()
        self.stream = stream
        self.error: OSError | None = None
        self.written = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:  # torch warns ("Expect archive file to be a file ending in .pt2") otherwise
        return True

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B"))
        if self.error is None:
            try:
                self.stream.write(data)
            except OSError as exc:
                self.error = exc
        self.written += size
        return size

    def seek(self, offset: int, whence: int = 0) -> int:  # torch seeks to 0 after writing; nothing to re-read
        return 0


@contextlib.contextmanager
def _without_stack_traces(program: torch.export.ExportedProgram) -> Iterator[None]:
    """The program's nodes without their ``stack_trace`` meta (the Python stack of each op, absolute paths of the
    exporting machine's checkout and site-packages) while the body runs; restored afterwards."""
    kept = []
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if "stack_trace" in node.meta:
                    kept.append((node, node.meta.pop("stack_trace")))
    try:
        yield
    finally:
        for node, trace in kept:
            node.meta["stack_trace"] = trace


def save_program(program: torch.export.ExportedProgram, file: str | Path) -> None:
    """``torch.export.save(program, file)`` that raises a failed write (``OSError``, ``ENOSPC`` on a full disk)
    instead of letting torch's writer abort the interpreter. The file carries no node's Python stack: an artifact
    travels to other machines and should not name the exporting machine's files (the program in memory keeps them).

    Raises:
        OSError: a write failed (the file is left partial: the caller's save removes its staging directory).
    """
    with open(file, "wb") as stream, _without_stack_traces(program):
        sink = _FailSoftWriter(stream)
        torch.export.save(program, sink)
        if sink.error is not None:
            raise sink.error
        stream.flush()


def load_program(file: str | Path, *, trust_remote_code: bool = False, data: bytes | None = None
                 ) -> torch.export.ExportedProgram:
    """The program of a ``.pt2``: :func:`read_pt2` (nothing from the file runs), or ``torch.export.load(file)``
    with ``trust_remote_code`` (the caller trusts the file: torch may unpickle anything in it).

    Args:
        file: the ``.pt2`` (its name names it in messages when ``data`` is given).
        data: the file's bytes as they were checked (``hfexport.trust.artifact_bytes``): read from memory, the
            path is not opened again.

    Raises:
        hfexport.UntrustedArtifactError: what would run, and how to opt in.
        ValueError: not a ``.pt2`` archive, or torch cannot read it.
    """
    file = Path(file)
    if not trust_remote_code:
        return read_pt2(file, data=data)
    logger.warning("loading %s with trust_remote_code=True: torch.export.load may unpickle anything in it", file)
    try:
        return torch.export.load(io.BytesIO(data) if data is not None else file)
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
