"""A backend's stages read from its exporter's source, without importing it (``hfexport stages`` answers in well under
a second where importing an exporter imports torch and its toolchain: 2-4 s).

An exporter declares its stages and steps as data, ``stages = (Stage(1, "Title", "extension point"), ...)`` and
``steps = (Step(1, "name", "toolchain call"), ...)`` in its class body (or in a base class of the same module). Only that form is read, with every argument a
literal; anything else (a computed tuple, a base class from another module) returns None and the caller imports
the exporter instead. ``tests/core/test_stage_reference.py`` checks that both ways give the same stages.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["stages_from_source"]

_FIELDS = {"Stage": ("number", "title", "extension_point"), "Step": ("after", "name", "runs")}


def stages_from_source(exporter: str) -> list[dict[str, Any]] | None:
    """The stages of the exporter class ``"module:Class"`` as :meth:`Exporter.describe_stages` gives them
    (the stages, and the steps in running order between them), read from its module's source; None when they cannot be read so."""
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
    return _class_stages(classes, class_name, lambda name: _module_value(tree, Path(spec.origin), name))


def _class_stages(classes: dict[str, ast.ClassDef], name: str,
                  resolve: Callable[[str], ast.expr | None]) -> list[dict[str, Any]] | None:
    """The class's stages and steps in running order, as :meth:`Exporter.describe_stages` gives them."""
    stages, steps = _class_literal(classes, name, "stages", "Stage", resolve, set()), \
        _class_literal(classes, name, "steps", "Step", resolve, set())
    if stages is None:
        return None
    steps = steps or []
    out = [{"step": s["name"], "runs": s["runs"]} for s in steps if s["after"] == 0]
    for stage in stages:
        out.append(stage)
        out.extend({"step": s["name"], "runs": s["runs"]} for s in steps if s["after"] == stage["number"])
    return out


def _class_literal(classes: dict[str, ast.ClassDef], name: str, attribute: str, call: str,
                   resolve: Callable[[str], ast.expr | None], seen: set[str]) -> list[dict[str, Any]] | None:
    node = classes.get(name)
    if node is None or name in seen:
        return None
    seen.add(name)
    for statement in node.body:
        target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
            else statement.target if isinstance(statement, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == attribute:
            value = statement.value
            if isinstance(value, ast.Name):  # a module-level name (dynamo: stages = CAPTURE_STAGES, imported)
                value = resolve(value.id)
            return _literal_calls(value, call)
    for base in node.bases:  # inherited: a base class of the same module
        if isinstance(base, ast.Name):
            found = _class_literal(classes, base.id, attribute, call, resolve, seen)
            if found is not None:
                return found
    return None


def _literal_calls(value: ast.expr | None, name: str) -> list[dict[str, Any]] | None:
    if not isinstance(value, ast.Tuple | ast.List):
        return None
    fields_of = _FIELDS[name]
    out = []
    for call in value.elts:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == name):
            return None
        try:
            fields = dict(zip(fields_of, (ast.literal_eval(a) for a in call.args), strict=False))
            fields.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in fields_of})
        except ValueError:  # not a literal
            return None
        if set(fields) != set(fields_of):
            return None
        out.append(fields)
    return out


def _module_value(tree: ast.Module, path: Path, name: str) -> ast.expr | None:
    """The value assigned to ``name`` at module level: in the exporter's module, or in the sibling module it imports
    the name from (``from .capture import CAPTURE_STAGES``)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module and \
                any(a.name == name for a in node.names):
            try:
                tree = ast.parse((path.parent / f"{node.module}.py").read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError):
                return None
            break
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            else node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == name:
            return node.value
    return None
