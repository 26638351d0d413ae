"""A backend's stages read from its exporter's source, without importing it (``hfexport stages`` answers in well under
a second where importing an exporter imports torch and its toolchain: 2-4 s).

An exporter declares its stages as data, ``stages = (Stage(1, "Title", "extension point", "method", runs="..."),
...)`` in its class body (or in a base class of the same module). Only that form is read, with every argument a
literal; anything else (a computed tuple, a base class from another module) returns None and the caller imports
the exporter instead. ``tests/core/test_stage_reference.py`` checks that both ways give the same stages.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["stages_from_source"]

_FIELDS = ("number", "title", "extension_point", "method", "runs")


def stages_from_source(exporter: str) -> list[dict[str, Any]] | None:
    """The stages of the exporter class ``"module:Class"`` as :meth:`Exporter.describe_stages` gives them
    (number, title, extension point, runs), read from its module's source; None when they cannot be read so."""
    module_name, _, class_name = exporter.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)  # imports the parent package only (light by design)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    return _class_stages(classes, class_name, seen=set())


def _class_stages(classes: dict[str, ast.ClassDef], name: str, seen: set[str]) -> list[dict[str, Any]] | None:
    node = classes.get(name)
    if node is None or name in seen:
        return None
    seen.add(name)
    for statement in node.body:
        target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
            else statement.target if isinstance(statement, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "stages":
            return _literal_stages(statement.value)
    for base in node.bases:  # inherited: a base class of the same module
        if isinstance(base, ast.Name):
            found = _class_stages(classes, base.id, seen)
            if found is not None:
                return found
    return None


def _literal_stages(value: ast.expr | None) -> list[dict[str, Any]] | None:
    if not isinstance(value, ast.Tuple | ast.List):
        return None
    stages = []
    for call in value.elts:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Stage"):
            return None
        try:
            fields = dict(zip(_FIELDS, (ast.literal_eval(a) for a in call.args), strict=False))
            fields.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in _FIELDS})
        except ValueError:  # not a literal
            return None
        if not {"number", "title", "extension_point", "method"} <= set(fields):
            return None
        stages.append({"number": fields["number"], "title": fields["title"],
                       "extension_point": fields["extension_point"], "runs": fields.get("runs", "")})
    return stages
