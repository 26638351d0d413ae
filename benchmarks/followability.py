"""How hard one export is to follow: six figures measured on the call stacks it runs (issue 42's yardsticks).

Profiles ``hfexport.export`` of a tiny seeded Llama (vocab 128, hidden 32, 1 layer, 4 heads, 2 kv heads) with
``sys.setprofile``, once per backend (dynamo, onnx, executorch-xnnpack, openvino: those installed) and kind
(``text-generation``: ``task="text-generation", max_cache_len=32``; ``forward``: one forward pass on
``input_ids`` of shape (1, 8)), each in a fresh subprocess so that the imports and registrations of one export do
not leak into the next. Only frames of hfexport's own packages count (a package is the ``src/<pkg>`` directory
a file lies in; third-party frames are skipped); the layers are hfexport 0, hfexport_dynamo 1, every other
hfexport_* package 2, and a call is *upward* when it goes from a lower layer number to a higher one.

  bounce depth     the most package changes on one call stack (consecutive frames of one package collapsed).
  hidden upward    distinct callees reached by an upward call that are not declared extension points.
  interfaces       distinct cross-package callees, the declared extension points counted as one per kind
                   (every workaround of one registration kind) or per class (all declared methods of a class).
  files read       distinct source files with a frame that is not a workaround's.
  lines read       the lines (``def`` to end, decorators excluded) of the distinct functions that ran, without
                   workarounds, comprehensions and lambdas (nested functions count on their own, as in
                   /work/shared/tools/followability.py).
  depth to export  hfexport frames on the stack when ``torch.export.export`` is first called.

Declared extension points (issue 42): registered workarounds (every function of
``hfexport.plugin.list_workarounds()`` and the functions defined inside them, such as the replacements a patch
factory returns); stage and step methods (``stage_*``, ``step_*``, on any class); every method defined on a
subclass of ``hfexport.plugin.Exporter`` or on its ``config_class`` (the typed Exporter protocol and its typed
options); ``run``, ``reset``, ``write_files`` and ``close`` on a class whose name ends with ``Runner`` (the Runner
protocol); every method of an exporter's tracer class (``type(exporter_class.tracer)``: the Tracer protocol) and of
the options classes its ``task_options`` gives; and the functions defined inside any of those methods (the callable
``Tracer.reference`` returns, a ``Component``'s writer made in ``package``).

Prints one table, a row per backend and kind, the six figures with ``*`` on each one over its acceptance limit
(bounce <= 3, upward <= 3, interfaces <= 20, files <= 15, lines <= 1,800, depth <= 6), and a last column that
names the figures over their limits.

    HF_HUB_OFFLINE=1 uv run python benchmarks/followability.py                 # every installed backend, both kinds
    uv run python benchmarks/followability.py --backend onnx --kind text-generation --verbose
    uv run python benchmarks/followability.py --jobs 2 --json followability.json
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BACKENDS = ("dynamo", "onnx", "executorch-xnnpack", "openvino")
KINDS = ("text-generation", "forward")
LAYER = {"hfexport": 0, "hfexport_dynamo": 1}  # every other hfexport_* package is a backend or tool: layer 2
RUNNER_METHODS = frozenset({"run", "reset", "write_files", "close"})  # hfexport.plugin.Runner's protocol
DECLARED_PREFIXES = ("stage_", "step_")
# figure -> (column title, acceptance limit): issue 42's targets
LIMITS = {
    "bounce_depth": ("bounce", 3),
    "upward_calls": ("upward", 3),
    "interfaces": ("interfaces", 20),
    "files": ("files", 15),
    "lines": ("lines", 1800),
    "depth_to_torch_export": ("depth", 6),
}
SKIPPED_QUALNAMES = ("<genexpr>", "<listcomp>", "<lambda>", "<dictcomp>", "<setcomp>")


# ── classification (pure: tests call these with made-up keys) ─────────────────────────────────────────────────────

def package_of(filename: str) -> str | None:
    """The hfexport package ``filename`` lies in (the ``src/<pkg>`` directory), else None."""
    parts = filename.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "src" and parts[i + 1].startswith("hfexport"):
            return parts[i + 1]
    return None


def layer(package: str) -> int:
    return LAYER.get(package, 2)


def is_upward(caller: str, callee: str) -> bool:
    """A call from a lower layer number into a higher one (the kernel calling a backend)."""
    return layer(caller) < layer(callee)


def short(filename: str) -> str:
    """``filename`` from its package directory on (``hfexport_onnx/exporter_onnx.py``)."""
    parts = filename.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "src" and parts[i + 1].startswith("hfexport"):
            return "/".join(parts[i + 1:])
    return filename


def frame_key(filename: str, firstlineno: int, qualname: str) -> str:
    return f"{filename}:{firstlineno}:{qualname}"


def split_key(key: str) -> tuple[str, int, str]:
    filename, line, qualname = key.rsplit(":", 2)
    return filename, int(line), qualname


@dataclass
class Declared:
    """The declared extension points of one process, by where their code is.

    Attributes:
        workarounds: ``(file, first line)`` of each registered workaround -> its registration kind.
        workaround_qualnames: ``(file, qualname)`` of each registered workaround -> its kind (what is defined
            inside it is declared too).
        classes: ``(file, class qualname)`` -> the protocol all its methods belong to (``"Exporter"``,
            ``"Tracer"``).
    """

    workarounds: dict[tuple[str, int], str] = field(default_factory=dict)
    workaround_qualnames: dict[tuple[str, str], str] = field(default_factory=dict)
    classes: dict[tuple[str, str], str] = field(default_factory=dict)
    functions: dict[tuple[str, int], str] = field(default_factory=dict)


def workaround_kind(key: str, declared: Declared) -> str | None:
    """The registration kind when ``key`` is a registered workaround or a function defined inside one."""
    filename, line, qualname = split_key(key)
    hit = declared.workarounds.get((filename, line))
    if hit:
        return hit
    parts = qualname.split(".<locals>.")
    for i in range(len(parts) - 1, 0, -1):  # the innermost enclosing function first
        hit = declared.workaround_qualnames.get((filename, ".<locals>.".join(parts[:i])))
        if hit:
            return hit
    return None


def declared_interface(key: str, declared: Declared) -> str | None:
    """The interface a declared extension point belongs to (``workaround:patch``, ``class:pkg.Cls``), or None
    for a function a reader has to discover.

    One interface per workaround kind, and one per class for its declared methods (stage and step methods,
    the Exporter, Runner and Tracer protocols' methods).
    """
    kind = workaround_kind(key, declared)
    if kind:
        return f"workaround:{kind}"
    filename, line, qualname = split_key(key)
    if (filename, line) in declared.functions:
        return f"class:{declared.functions[filename, line]}"
    if ".<locals>." in qualname:  # a function made inside a declared method (the callable it returns) is declared
        outer = qualname.split(".<locals>.")[0]
        return declared_interface(frame_key(filename, 0, outer), declared) if "." in outer else None
    owner, dot, method = qualname.rpartition(".")
    if not dot:
        return None  # a module-level function
    where = f"class:{short(filename)}:{owner}"
    if method.startswith(DECLARED_PREFIXES) or (filename, owner) in declared.classes:
        return where
    if owner.rpartition(".")[2].endswith("Runner") and method in RUNNER_METHODS:
        return where
    return None


def declared_now() -> Declared:
    """The extension points declared in this process: call it after the export (plugins register on import)."""
    import inspect

    from hfexport import list_workarounds
    from hfexport.plugin import Exporter

    declared = Declared()
    for registration in list_workarounds():
        func = inspect.unwrap(registration.func)
        code = getattr(func, "__code__", None)
        if code is None:
            continue
        declared.workarounds[code.co_filename, code.co_firstlineno] = registration.kind
        declared.workaround_qualnames[code.co_filename, code.co_qualname] = registration.kind

    def add_class(cls: type, protocol: str) -> None:
        for value in vars(cls).values():
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            code = getattr(inspect.unwrap(func) if callable(func) else func, "__code__", None)
            if code is not None:  # where the methods are, by the file their code lies in
                declared.classes.setdefault((code.co_filename, cls.__qualname__), protocol)
                # a function bound as a protocol method (``capture = staticmethod(capture)``) is declared as itself
                declared.functions[code.co_filename, code.co_firstlineno] = f"{short(code.co_filename)}:{cls.__qualname__}"

    from hfexport import list_backends

    tasks = {t for info in list_backends() if info.backend is not None for t in (info.backend.tasks or ())}
    seen, todo = set(), [Exporter]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        add_class(cls, "Exporter")
        config_class = getattr(cls, "config_class", None)
        for base in getattr(config_class, "__mro__", ()):  # the exporter's typed options (Exporter.config_class)
            if base is not object:
                add_class(base, "Exporter")
        tracer = getattr(cls, "tracer", None)
        if tracer is not None:
            add_class(type(tracer), "Tracer")
            for task in tasks:  # the tracer's typed task options (Tracer.task_options)
                try:
                    options_class = tracer.task_options(task)
                except Exception:  # noqa: BLE001 - a task this tracer does not plan
                    continue
                for base in options_class.__mro__:
                    if base is not object:
                        add_class(base, "Tracer")
    return declared


# ── profiling ─────────────────────────────────────────────────────────────────────────────────────────────────────

@dataclass
class Trace:
    """What one profiled call ran, over hfexport's frames.

    Attributes:
        frames: the keys (``file:first line:qualname``) of the functions that ran.
        edges: ``(caller package, callee package, callee key)`` of each cross-package call.
        bounce: the most package changes on one stack, and that stack (``pkg:qualname`` from the entry down).
        depth_to_torch_export: hfexport frames on the stack at the first ``torch.export.export``.
    """

    frames: set[str] = field(default_factory=set)
    edges: set[tuple[str, str, str]] = field(default_factory=set)
    bounce: int = 0
    bounce_stack: list[str] = field(default_factory=list)
    depth_to_torch_export: int | None = None


def profile_call(call) -> Trace:
    """Run ``call()`` under ``sys.setprofile`` (and ``threading.setprofile``) and record its hfexport frames."""
    trace = Trace()

    def pkg_stack(frame):
        out = []
        while frame is not None:
            package = package_of(frame.f_code.co_filename)
            if package is not None:
                out.append((package, frame.f_code.co_qualname))
            frame = frame.f_back
        return out[::-1]

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if (trace.depth_to_torch_export is None and code.co_name == "export"
                and code.co_filename.replace("\\", "/").endswith("torch/export/__init__.py")):
            trace.depth_to_torch_export = len(pkg_stack(frame))
        callee = package_of(code.co_filename)
        if callee is None or code.co_name == "<module>":  # imports are not the export's flow
            return
        key = frame_key(code.co_filename, code.co_firstlineno, code.co_qualname)
        trace.frames.add(key)
        caller_frame = frame.f_back
        while caller_frame is not None and package_of(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back  # through third-party frames (torch calling a patch)
        if caller_frame is None:
            return
        caller = package_of(caller_frame.f_code.co_filename)
        if caller != callee:
            trace.edges.add((caller, callee, key))
        stack = pkg_stack(frame)
        collapsed = [p for i, (p, _) in enumerate(stack) if i == 0 or stack[i - 1][0] != p]
        if len(collapsed) - 1 > trace.bounce:
            trace.bounce, trace.bounce_stack = len(collapsed) - 1, [f"{p}:{q}" for p, q in stack]

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return trace


def function_spans(filename: str, cache: dict[str, dict[int, int]] = {}) -> dict[int, int]:  # noqa: B006
    """first line of each def -> its number of lines (decorators excluded)."""
    if filename not in cache:
        try:
            with open(filename, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError):
            cache[filename] = {}
        else:
            cache[filename] = {n.lineno: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
                               if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return cache[filename]


def figures(trace: Trace, declared: Declared) -> dict:
    """The six figures of ``trace`` (and what they count: the lists ``--verbose`` prints)."""
    interfaces = {declared_interface(key, declared) or key for _, _, key in trace.edges}
    upward = {key for caller, callee, key in trace.edges
              if is_upward(caller, callee) and declared_interface(key, declared) is None}
    readable = {key for key in trace.frames
                if workaround_kind(key, declared) is None and not any(s in key for s in SKIPPED_QUALNAMES)}
    spans = {}
    for key in readable:
        filename, line, _ = split_key(key)
        spans[key] = function_spans(filename).get(line, 0)
    largest = sorted(spans.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "bounce_depth": trace.bounce,
        "upward_calls": len(upward),
        "interfaces": len(interfaces),
        "files": len({split_key(key)[0] for key in readable}),
        "lines": sum(spans.values()),
        "depth_to_torch_export": trace.depth_to_torch_export,
        "details": {
            "deepest_bounce_stack": trace.bounce_stack,
            "upward_calls": sorted(upward),
            "interfaces": sorted(interfaces),
            "files": sorted({split_key(key)[0] for key in readable}),
            "largest_functions": [[key, n] for key, n in largest[:40]],
        },
    }


# ── one export (run in its own subprocess) ────────────────────────────────────────────────────────────────────────

def profile_export(backend: str, kind: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hfexport

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()
    if kind == "text-generation":
        inputs, options = None, {"task": "text-generation", "max_cache_len": 32}
    else:
        inputs, options = {"input_ids": torch.randint(0, 128, (1, 8))}, {}
    trace = profile_call(lambda: hfexport.export(model, inputs, backend=backend, **options))
    return figures(trace, declared_now())


def run_child(backend: str, kind: str, timeout: float) -> dict:
    """Profile one export in a fresh interpreter; the figures, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix="followability-") as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", backend, kind, out]
        started = time.monotonic()
        try:
            process = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if process.returncode != 0 or not os.path.exists(out):
            tail = (process.stdout + process.stderr).strip().splitlines()[-15:]
            return {"error": f"exit {process.returncode}: " + "\n".join(tail)}
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
        result["seconds"] = round(time.monotonic() - started, 1)
        return result


def installed_backends() -> list[str]:
    import hfexport

    ok = {info.name for info in hfexport.list_backends() if info.status == "ok"}
    return [name for name in BACKENDS if name in ok]


# ── the table ─────────────────────────────────────────────────────────────────────────────────────────────────────

def over_limits(result: dict) -> list[str]:
    return [f"{title} {result[name]:,}>{limit:,}" for name, (title, limit) in LIMITS.items()
            if isinstance(result.get(name), int) and result[name] > limit]


def table(rows: list[tuple[str, str, dict]]) -> str:
    head = ["backend", "kind", *(title for title, _ in LIMITS.values()), "over limit (of the six)"]
    body = [["limit", "", *(f"<= {limit:,}" for _, limit in LIMITS.values()), ""]]
    for backend, kind, result in rows:
        if "error" in result:
            body.append([backend, kind, *(["-"] * len(LIMITS)), "error: " + result["error"].splitlines()[0][:60]])
            continue
        cells = []
        for name, (_, limit) in LIMITS.items():
            value = result.get(name)
            cells.append("-" if value is None else f"{value:,}" + ("*" if value > limit else " "))
        over = over_limits(result)
        body.append([backend, kind, *cells, f"{len(over)}: " + ", ".join(over) if over else "0"])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells):
        return " | ".join(c.ljust(w) if i < 2 or i == len(cells) - 1 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(head), "-+-".join("-" * w for w in widths), *(line(r) for r in body)]
    return "\n".join(out) + "\n(* over its limit)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, help="default: every installed one of these")
    parser.add_argument("--kind", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="profiles run at once (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the results (with the lists) as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="print the deepest bounce stack, the upward calls, the interfaces and files of each row")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per profile (default 1200)")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "KIND", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        backend, kind, out = args.child
        result = profile_export(backend, kind)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return

    installed = installed_backends()
    backends = args.backend or installed
    missing = [b for b in backends if b not in installed]
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (installed: {', '.join(installed) or 'none'})")
    jobs = [(backend, kind) for backend in backends for kind in args.kind]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: run_child(*job, args.timeout), jobs))
    rows = [(backend, kind, result) for (backend, kind), result in zip(jobs, results, strict=True)]

    print(table(rows))
    if args.verbose:
        for backend, kind, result in rows:
            print(f"\n## {backend}, {kind}")
            if "error" in result:
                print(result["error"])
                continue
            details = result["details"]
            for name in ("deepest_bounce_stack", "upward_calls", "interfaces", "files"):
                print(f"\n{name} ({len(details[name])}):")
                for item in details[name]:
                    print("  ", item)
            print("\nlargest functions read (lines):")
            for key, n in details["largest_functions"][:15]:
                print(f"   {n:5d}  {key}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"limits": {name: limit for name, (_, limit) in LIMITS.items()},
                       "rows": [{"backend": b, "kind": k, **r} for b, k, r in rows]}, f, indent=1)
    if any("error" in result for _, _, result in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
