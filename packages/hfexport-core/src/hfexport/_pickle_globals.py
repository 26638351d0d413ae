"""Pickled bytes read without unpickling (see :mod:`hfexport._trust` for the whole list of checks): the globals a
pickle would import, read with ``pickletools`` (:func:`pickle_globals`), and those outside what ``torch.save``
writes for tensors (:data:`SAFE_PICKLE_GLOBALS`, :func:`unsafe_pickle_globals`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SAFE_PICKLE_GLOBALS", "pickle_globals", "unsafe_pickle_globals"]


# ── pickles, read without unpickling ──────────────────────────────────────────────────────────────────────
_STORAGES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
             "ComplexDouble", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4")
_DTYPES = ("float32", "float", "float64", "double", "float16", "half", "bfloat16", "complex32", "chalf", "complex64",
           "cfloat", "complex128", "cdouble", "uint8", "int8", "int16", "short", "int32", "int", "int64", "long",
           "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
           "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8", "qint32", "quint4x2", "quint2x4")
# What ``torch.save`` writes for tensors, parameters and containers of them (measured): tensor rebuilders, typed
# storages (loaded through torch's persistent ids), dtypes, devices, sizes, and a few plain containers.
SAFE_PICKLE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("collections", "OrderedDict"),
     ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
     ("torch", "Size"), ("torch", "device")]
    + [("torch", f"{s}Storage") for s in _STORAGES] + [("torch", d) for d in _DTYPES]
    + [(m, n) for m in ("builtins", "__builtin__") for n in ("set", "frozenset", "slice")])

_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_UNKNOWN = object()


def _stream_globals(data: bytes, start: int) -> tuple[list[tuple[str, str]], int]:
    """The globals one pickle (starting at ``start``) loads, and where it ends. Raises ValueError if malformed
    or if a global's name cannot be read statically (``STACK_GLOBAL`` of computed strings, extension codes)."""
    import io
    import pickletools

    found: list[tuple[str, str]] = []
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[Any, Any] = {}
    stream = io.BytesIO(data)
    stream.seek(start)
    end = start
    try:
        for op, arg, pos in pickletools.genops(stream):
            name = op.name
            if name in ("EXT1", "EXT2", "EXT4"):
                raise ValueError(f"opcode {name} at byte {pos} loads a global through the copyreg extension registry")
            if name in ("GLOBAL", "INST"):
                module, _, qualname = str(arg).partition(" ")
                found.append((module, qualname))
            if name in _STRING_OPS:
                stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg, _UNKNOWN))
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "STACK_GLOBAL":
                qualname, module = stack.pop(), stack.pop()
                if not isinstance(module, str) or not isinstance(qualname, str):
                    raise ValueError(f"STACK_GLOBAL at byte {pos} loads a global whose name is computed")
                found.append((module, qualname))
                stack.append(_UNKNOWN)
            else:
                before = op.stack_before
                if pickletools.markobject in before:
                    if not marks:
                        raise ValueError(f"{name} at byte {pos} without a MARK")
                    del stack[marks.pop():]
                    count = before.index(pickletools.markobject)
                else:
                    count = len(before)
                if count > len(stack):
                    raise ValueError(f"{name} at byte {pos} pops more than the stack holds")
                if count:
                    del stack[-count:]
                stack.extend(_UNKNOWN for _ in op.stack_after)
            end = pos
            if name == "STOP":
                return found, stream.tell()
    except (IndexError, KeyError) as exc:
        raise ValueError(f"malformed pickle near byte {end}: {exc!r}") from exc
    raise ValueError("pickle without STOP")


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """Every ``(module, name)`` global that unpickling ``data`` would import, read with ``pickletools`` (nothing
    is unpickled). ``data`` may hold several pickles back to back.

    Raises:
        ValueError: malformed, trailing bytes that are not a pickle, or a global whose name only unpickling
            could tell (``STACK_GLOBAL`` of computed strings, copyreg extension codes).
    """
    found: list[tuple[str, str]] = []
    position = 0
    while position < len(data):
        try:
            more, position = _stream_globals(data, position)
        except ValueError:
            raise
        except Exception as exc:  # pickletools raises ValueError mostly, but also others on garbage
            raise ValueError(f"not a pickle at byte {position}: {exc}") from exc
        found += more
    if not data:
        raise ValueError("empty pickle")
    return found


def unsafe_pickle_globals(data: bytes, allowed: frozenset[tuple[str, str]] = SAFE_PICKLE_GLOBALS) -> list[str]:
    """The globals of ``data`` outside ``allowed`` (``"module.name"``), or the reason it cannot be read."""
    try:
        found = pickle_globals(data)
    except ValueError as exc:
        return [f"(unreadable pickle: {exc})"]
    return sorted({f"{m}.{n}" for m, n in found if (m, n) not in allowed})


