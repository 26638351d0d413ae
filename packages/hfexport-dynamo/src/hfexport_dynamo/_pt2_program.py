"""The program JSON of a ``.pt2``, checked in place before torch deserializes it (see :mod:`hfexport_dynamo._pt2`
for the whole reader; :func:`_check_program`): the shape expressions torch would ``sympify`` parsed by a small
grammar into sympy objects (:func:`parse_sym_expr`: no ``sympify``, no ``eval``), node targets admitted only when
they resolve to an operator (:func:`safe_target`), names of the characters a name has, pytree specs allow-listed,
node metadata dropped.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from typing import Any

import torch

from hfexport import UntrustedArtifactError
from hfexport.trust import load_treespec

from ._pt2_archive import _IDENTIFIER_TEXT, TRUST_HINT

__all__ = ["EXPR_MAX_CALLS", "EXPR_MAX_CHARS", "PROGRAM_MAX_EXPR_CALLS", "parse_sym_expr", "safe_target"]


# ── symbolic expressions: hfexport's own small grammar, sympy objects out (no sympify, no eval) ─────────────
EXPR_MAX_CHARS = 20_000
EXPR_MAX_DEPTH = 64
EXPR_MAX_INT = 2**64
EXPR_MAX_EXPONENT = 64
EXPR_MAX_POWERS = 4
# Function calls (Max, Mod, FloorDiv, ...; not Symbol or Integer) of one expression, and of a program's distinct
# expressions in all (an expression repeated is parsed once). sympy builds each call in 1-7 ms within a long sum
# or product: one 20,000-character product of 600 Max() took 11 s of CPU, a sum of 600 0.9 s (issue 43's bounds
# probe). torch's expressions are small: at most 5 calls in one, 56 in a program's distinct ones (Qwen2-VL's
# decoder; 35 programs of the test suite), the same for a deeper model (the expressions repeat per layer).
EXPR_MAX_CALLS = 64
PROGRAM_MAX_EXPR_CALLS = 512
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
        self.calls = 0
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
        import sympy

        # the terms added at once: one Add of n terms, not n Adds of 1..n (a 20,000-character sum of 600 Max()
        # terms took 0.92 s folded term by term, issue 43's bounds probe)
        terms = [self.term()]
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            right = self.term()
            terms.append(right if op == "+" else -right)
        return terms[0] if len(terms) == 1 else sympy.Add(*terms)

    def term(self) -> Any:
        import sympy

        functions = _expr_functions()
        value = self.unary()
        while self.peek() in (("op", "*"), ("op", "/"), ("op", "//"), ("op", "%")):
            op = self.take()[1]
            right = self.unary()
            if op == "*":  # a run of factors multiplied at once, as sum() adds its terms
                factors = [value, right]
                while self.peek() == ("op", "*"):
                    self.take()
                    factors.append(self.unary())
                value = sympy.Mul(*factors)
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

        if name not in ("Symbol", "Integer"):
            self.calls += 1
            if self.calls > EXPR_MAX_CALLS:
                raise self.fail(f"more than {EXPR_MAX_CALLS} function calls (hfexport_dynamo._pt2_program."
                                "EXPR_MAX_CALLS; torch's have at most a few)")
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


class _Expressions:
    """A program's expressions as :func:`_check_program` reads them: its size symbols, each distinct text parsed
    once, and the calls of the distinct ones counted against :data:`PROGRAM_MAX_EXPR_CALLS`."""

    def __init__(self, symbols: dict[str, Any]):
        self.symbols, self.parsed, self.calls = symbols, {}, 0

    def parse(self, text: Any) -> Any:
        if isinstance(text, str) and text in self.parsed:
            return self.parsed[text]
        if not isinstance(text, str) or len(text) > EXPR_MAX_CHARS:
            raise ValueError(f"a shape expression that is not a string of at most {EXPR_MAX_CHARS:,} characters")
        parser = _ExprParser(text, self.symbols)
        value = parser.parse()
        self.calls += parser.calls
        if self.calls > PROGRAM_MAX_EXPR_CALLS:
            raise ValueError(f"its distinct shape expressions make more than {PROGRAM_MAX_EXPR_CALLS:,} function calls "
                             "in all (hfexport_dynamo._pt2_program.PROGRAM_MAX_EXPR_CALLS; torch's make at most ~60)")
        self.parsed[text] = value
        return value


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


# ── the program JSON ──────────────────────────────────────────────────────────────────────────────────────
def _check_program(node: Any, what: str, symbols: dict[str, Any] | _Expressions, key: str = "") -> None:
    """Check the program JSON in place: every ``expr_str`` replaced by its sympy object (:func:`parse_sym_expr`),
    node targets operators, pytree specs allow-listed, every node's ``metadata`` dropped (stack traces reach the
    code torch.fx generates and ``exec``-s, and lookups resolve the rest; none is needed to run), and every name
    (``name``, ``*_name``, ``fqn``, graph signature strings) of the characters a name has: they reach that code
    too."""
    if not isinstance(symbols, _Expressions):
        symbols = _Expressions(symbols)
    if isinstance(node, dict):
        is_node = "target" in node and "inputs" in node
        if is_node and "metadata" in node:
            node["metadata"] = {}
        for child_key, value in list(node.items()):
            if child_key == "expr_str":
                try:
                    node[child_key] = symbols.parse(value)
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
