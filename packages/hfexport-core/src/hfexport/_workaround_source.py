"""The workaround registry read from the backends' sources, without importing them (``hfexport workarounds``
answers in well under a second where importing every exporter imports torch and each toolchain: 2.5-3 s idle).

The registry is filled as a side effect of importing the exporter modules: each ``@register_patch(...)``,
``@register_fx_node_fix(...)``, ``@register_fx_program_fix(...)`` or ``@register_workaround(...)`` decorator (or a
decorator factory of a backend's own that ends in one of them, e.g. ``@register_backend_prepare("xnnpack")``) adds
an entry when its module runs. This module replays that: starting at each exporter module it follows the module-level
imports within the backends' own packages (``import``, ``from x import y``, a package's ``_LAZY`` name map), in the
order Python runs them, and reads each registration's arguments (literals, module-level constants made of literals,
f-strings and comprehensions over them) and its function's docstring.

Anything it cannot read exactly (a registration under an ``if``, in a class body, beside a decorator of another kind,
an argument computed by a call, a lazy package attribute it cannot resolve) makes it return None, and the caller
imports the exporters instead. A data argument that is an object (``target=aten.gelu.default``) is shown as written,
as ``str()`` of the op shows it. ``tests/core/test_registry.py`` checks that the listing equals the live registry.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ListedWorkaround", "workarounds_from_source"]

_KERNEL = "hfexport"
_FORMS = {"register_patch", "register_fx_node_fix", "register_fx_program_fix", "register_workaround"}
_SAFE_CALLS = {"tuple": tuple, "list": list, "sorted": sorted, "frozenset": frozenset, "set": set, "range": range}
_SAFE_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Tuple, ast.List, ast.Set, ast.Dict,
               ast.JoinedStr, ast.FormattedValue, ast.Starred, ast.GeneratorExp, ast.ListComp, ast.SetComp,
               ast.comprehension, ast.BinOp, ast.Add, ast.Mod, ast.Call, ast.keyword)


class _Unreadable(Exception):
    """A registration (or the import that reaches it) cannot be read exactly from source."""


@dataclass(frozen=True)
class ListedWorkaround:
    """One registration as ``hfexport workarounds`` prints it: the fields of :class:`hfexport.plugin.Registration`
    but ``func`` (``data`` values are strings, as the listing shows them)."""

    kind: str
    scope: str
    paths: tuple[str, ...] = ()
    module: str = ""
    name: str = ""
    summary: str = ""
    data: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}"


def workarounds_from_source(exporters: Iterable[str]) -> list[ListedWorkaround] | None:
    """The registrations that importing the exporter classes ``"module:Class"`` (in this order) makes, in
    registration order, read from their packages' sources; None when any of them cannot be read so."""
    modules = [e.partition(":")[0] for e in exporters]
    reader = _Reader({m.split(".")[0] for m in modules})
    try:
        for module in modules:
            reader.import_module(module)
    except _Unreadable:
        return None
    return reader.registry


class _Module:
    def __init__(self, name: str, path: Path, is_package: bool) -> None:
        self.name, self.path, self.is_package = name, path, is_package
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.defs = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        self.env: dict[str, Any] = {}  # module-level constants read so far
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (module, attribute) it was imported as


class _Reader:
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots | {_KERNEL}
        self.locations: dict[str, list[str]] = {}
        self.modules: dict[str, _Module | None] = {}
        self.done: set[str] = set()
        self.registry: list[ListedWorkaround] = []

    # ── finding and running modules ──
    def load(self, name: str) -> _Module | None:
        if name in self.modules:
            return self.modules[name]
        root, *rest = name.split(".")
        if root not in self.locations:
            try:
                spec = importlib.util.find_spec(root)  # a top-level name: nothing is imported
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                raise _Unreadable(name)
            self.locations[root] = list(spec.submodule_search_locations)
        module = None
        for base in self.locations[root]:
            stem = Path(base, *rest)
            for path, is_package in ((stem / "__init__.py", True), (stem.with_suffix(".py"), False)):
                if path.is_file():
                    module = _Module(name, path, is_package)
                    break
            if module is not None:
                break
        self.modules[name] = module
        return module

    def import_module(self, name: str) -> None:
        if name.split(".")[0] not in self.roots:
            return  # torch, transformers, ...: they register no hfexport workaround
        parts = name.split(".")
        for i in range(1, len(parts)):  # parents first, as Python does
            self.import_module(".".join(parts[:i]))
        if name in self.done:
            return
        self.done.add(name)
        module = self.load(name)
        if module is None:
            raise _Unreadable(f"no source for {name}")
        if name.split(".")[0] == _KERNEL:
            return  # the kernel registers nothing at import; its modules are read only to resolve names
        self.run(module, module.tree.body, {})

    def absolute(self, module: _Module, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        return ".".join(package + ([node.module] if node.module else []))

    def import_from(self, module: _Module, node: ast.ImportFrom) -> None:
        source = self.absolute(module, node)
        self.import_module(source)
        for alias in node.names:
            if alias.name == "*":
                raise _Unreadable(f"from {source} import * in {module.name}")
            module.names[alias.asname or alias.name] = (source, alias.name)
            if source.split(".")[0] not in self.roots - {_KERNEL}:
                continue
            target = self.resolve_attribute(source, alias.name)
            if target is not None and target[1] is None:  # a submodule, imported by this statement
                self.import_module(target[0])

    def resolve_attribute(self, module_name: str, attr: str) -> tuple[str, str | None] | None:
        """Where ``module_name.attr`` comes from: (module, None) for a submodule, (module, name) for a function
        defined or imported there; None for anything else. Imports a lazily mapped module, as ``__getattr__`` does."""
        module = self.load(module_name)
        if module is None:
            return None
        if module.is_package and self.load(f"{module_name}.{attr}") is not None:
            bound = any(isinstance(n, ast.ImportFrom | ast.Import | ast.FunctionDef | ast.ClassDef | ast.Assign)
                        and attr in _bound_names(n) for n in module.tree.body)
            if not bound:
                return f"{module_name}.{attr}", None
        if attr in module.defs:
            return module_name, attr
        for node in module.tree.body:
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == attr for a in node.names):
                alias = next(a for a in node.names if (a.asname or a.name) == attr)
                return self.resolve_attribute(self.absolute(module, node), alias.name)
        lazy = _lazy_map(module.tree)
        if attr in lazy:
            target = f"{module_name}.{lazy[attr]}"
            self.import_module(target)
            return self.resolve_attribute(target, attr)
        return None

    def run(self, module: _Module, body: list[ast.stmt], bound: dict[str, Any]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                self.import_from(module, node)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                self.run(module, node.orelse, bound)
            elif isinstance(node, ast.Try):
                self.run(module, node.body + node.orelse + node.finalbody, bound)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.function(module, node, bound)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                self.assign(module, node)
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and not node.orelse:
                if not self.registers(module, node):
                    continue
                for value in _evaluate(node.iter, module.env | bound):
                    self.run(module, node.body, {**bound, node.target.id: value})
            elif isinstance(node, ast.Expr) and _is_applied(node.value):
                call = node.value
                assert isinstance(call, ast.Call) and isinstance(call.func, ast.Call)
                entry = self.registration(module, call.func, bound)
                if entry is None:
                    continue  # f(x)(y) of another kind
                target = call.args[0]
                if not (isinstance(target, ast.Name) and target.id in module.defs):
                    raise _Unreadable(f"a registration applied to {ast.unparse(target)} in {module.name}")
                self.add(module, module.defs[target.id], *entry)
            elif self.registers(module, node):  # a registration somewhere this reader does not follow
                raise _Unreadable(f"line {node.lineno} of {module.name}")

    def assign(self, module: _Module, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        try:
            value = _evaluate(node.value, module.env) if node.value is not None else None
        except _Unreadable:
            for name in names:
                module.env.pop(name, None)
            if node.value is not None and self.registers(module, node):
                raise
            return
        for name in names:
            module.env[name] = value

    def registers(self, module: _Module, node: ast.AST) -> bool:
        """Whether a registration call appears in ``node`` outside function bodies."""
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Call) and self.registration(module, current, {}, check=True) is not None:
                return True
            for child in ast.iter_child_nodes(current):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    stack.extend(child.decorator_list)  # the body runs only when called
                elif not isinstance(child, ast.Lambda):
                    stack.append(child)
        return False

    def function(self, module: _Module, node: ast.FunctionDef | ast.AsyncFunctionDef, bound: dict[str, Any]) -> None:
        entries = []
        others = False
        for decorator in reversed(node.decorator_list):  # the innermost decorator runs first
            entry = self.registration(module, decorator, bound) if isinstance(decorator, ast.Call) else None
            if entry is None:
                others = True
            else:
                entries.append(entry)
        if entries and others:  # another decorator may wrap what is registered
            raise _Unreadable(f"{node.name} in {module.name} has decorators of other kinds")
        for entry in entries:
            self.add(module, node, *entry)

    def registration(self, module: _Module, call: ast.expr, bound: dict[str, Any],
                     check: bool = False) -> tuple[str, str, tuple[str, ...], dict[str, str]] | None:
        """(kind, scope, paths, data) of the registration decorator ``call``; None when it is not one."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            return None
        origin = self.origin(module, call.func.id)
        if origin is None:
            return None
        origin_module, name = origin
        if origin_module.split(".")[0] == _KERNEL and name in _FORMS:
            return (name, "", (), {}) if check else _kernel_form(name, call, module.env | bound)
        factory = self.load(origin_module)
        definition = factory.defs.get(name) if factory is not None else None
        if definition is None:
            return None
        inner = [c for c in ast.walk(definition) if isinstance(c, ast.Call) and _is_applied(c)
                 and isinstance(c.func, ast.Call) and isinstance(c.func.func, ast.Name)
                 and (self.origin(factory, c.func.func.id) or ("", ""))[1] in _FORMS]
        if not inner:
            return None
        if check:
            return ("", "", (), {})
        if len(inner) > 1 or call.keywords and any(k.arg is None for k in call.keywords):
            raise _Unreadable(f"the decorator factory {name} of {origin_module}")
        params = [a.arg for a in definition.args.posonlyargs + definition.args.args]
        if len(call.args) > len(params):
            raise _Unreadable(f"{ast.unparse(call)} in {module.name}")
        positional = definition.args.posonlyargs + definition.args.args
        given = {a.arg: _evaluate(d, factory.env)  # the factory's defaults, then what the call gives
                 for a, d in zip(positional[len(positional) - len(definition.args.defaults):],
                                 definition.args.defaults, strict=True)}
        env = module.env | bound
        given.update({p: _evaluate(a, env) for p, a in zip(params, call.args, strict=False)})
        given.update({k.arg: _evaluate(k.value, env) for k in call.keywords if k.arg is not None})
        self.import_module(origin_module)
        kernel_call = inner[0].func
        assert isinstance(kernel_call, ast.Call) and isinstance(kernel_call.func, ast.Name)
        form = self.origin(factory, kernel_call.func.id)
        assert form is not None and factory is not None
        return _kernel_form(form[1], kernel_call, factory.env | given)

    def origin(self, module: _Module, name: str) -> tuple[str, str] | None:
        """The (module, function) a local name refers to: defined here, or imported (followed to its definition)."""
        if name in module.defs:
            return module.name, name
        if name not in module.names:
            return None
        source, attr = module.names[name]
        if source.split(".")[0] == _KERNEL:
            return source, attr
        if source.split(".")[0] not in self.roots:
            return None
        resolved = self.resolve_attribute(source, attr)
        if resolved is None or resolved[1] is None:
            return None
        return resolved[0], resolved[1]

    def add(self, module: _Module, node: ast.FunctionDef | ast.AsyncFunctionDef, kind: str, scope: str,
            paths: tuple[str, ...], data: dict[str, str]) -> None:
        doc = (ast.get_docstring(node, clean=True) or "").strip()
        entry = ListedWorkaround(kind, scope, paths, module.name, node.name, doc.splitlines()[0] if doc else "",
                                 data)
        # as the registry does: registering the same function again for a kind and scope replaces the entry
        self.registry[:] = [r for r in self.registry
                            if not (r.kind == kind and r.qualified_name == entry.qualified_name and r.scope == scope)]
        self.registry.append(entry)


def _kernel_form(name: str, call: ast.Call, env: dict[str, Any]) -> tuple[str, str, tuple[str, ...], dict[str, str]]:
    if any(k.arg is None for k in call.keywords):
        raise _Unreadable(ast.unparse(call))
    args = _evaluate(ast.Tuple(elts=list(call.args), ctx=ast.Load()), env)
    if name == "register_patch":
        return "patch", args[0], tuple(args[1:]), {}
    if name in ("register_fx_node_fix", "register_fx_program_fix"):
        return name.removeprefix("register_"), args[0], (), {}
    data = {}
    for keyword in call.keywords:
        assert keyword.arg is not None
        try:
            data[keyword.arg] = str(_evaluate(keyword.value, env))
        except _Unreadable:  # an object (an op): shown as str() shows it
            if any(not isinstance(n, ast.Name | ast.Attribute | ast.Load) for n in ast.walk(keyword.value)):
                raise
            data[keyword.arg] = ast.unparse(keyword.value).removeprefix("torch.ops.")
    return args[0], args[1], (), data


def _evaluate(node: ast.expr, env: dict[str, Any]) -> Any:
    """The value of a literal expression over ``env`` (constants, f-strings, comprehensions, tuple()/list() calls);
    no attribute, subscript or other call is evaluated."""
    for child in ast.walk(node):
        if not isinstance(child, _SAFE_NODES):
            raise _Unreadable(ast.unparse(node))
        if isinstance(child, ast.Call) and not (isinstance(child.func, ast.Name) and child.func.id in _SAFE_CALLS):
            raise _Unreadable(ast.unparse(node))
    expression = ast.fix_missing_locations(ast.Expression(body=node))
    try:
        code = compile(expression, "<registration>", "eval")
        return eval(code, {**env, "__builtins__": dict(_SAFE_CALLS)})  # noqa: S307 (checked nodes only)
    except Exception as exc:  # a name that is not a constant
        raise _Unreadable(ast.unparse(node)) from exc


def _is_applied(node: ast.expr) -> bool:
    """``factory(...)(function)``: a decorator applied by a call."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and len(node.args) == 1 \
        and not node.keywords


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _lazy_map(tree: ast.Module) -> dict[str, str]:
    """A package's ``_LAZY = {"Name": "submodule", ...}`` map, which its ``__getattr__`` imports from."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}
