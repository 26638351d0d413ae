"""``hfexport sweep``: export every tiny-zoo model with one backend and record what works.

Every case of :mod:`hfexport_sweep.zoo` (``"<model_type>/<ClassName>"``) runs in its own process, forked
from a server that has imported torch, transformers and the backend once, so a case costs its own work
only. A case that crashes the interpreter or hangs past ``--timeout`` is recorded and the sweep goes on.

Each case ends in one status:

============================  ===================================================================
``ok``                        exported with ``dynamic=True`` and verified at the alt input shape
                              (batch 3, other sequence length) with atol 1e-4, rtol 1e-3
``not_instantiable``          the tiny config, the model or its eager forward fails (not exported)
``export_error``              ``hfexport.export`` raised (the failing stage path is recorded, from the
                              ``ExportError``'s fields: ``path``, ``step``, ``internal``)
``runtime_error``             the artifact raised when run at the alt input shape
``mismatch``                  the artifact ran, but differs from eager beyond the tolerances
``timeout``                   the case took more than ``--timeout`` seconds (the phase is recorded)
``skipped``                   the model class is in ``hfexport_dynamo.EXPORT_SKIPS`` (the reason is recorded)
============================  ===================================================================

Results are appended to ``<output>/results.jsonl`` as they come, so an interrupted sweep resumes where
it stopped: cases already recorded are not run again. ``<output>/meta.json`` records the backend and the
versions (hfexport, backend distribution, torch, transformers); a directory written with other ones is
refused rather than mixed (``--overwrite`` starts it afresh). When the sweep ends, ``report.md`` and
``index.html`` are written (see :mod:`hfexport_sweep.sweep_report`).

``--recheck-skips`` runs the classes of the known-failure lists again: ``EXPORT_SKIPS`` as they are, and the
lists the swept backend declares through its exporter class (``known_failures()``: list name -> {model class:
reason}) with the config options its ``recheck_options(list name, model class)`` gives (for the ONNX
``ONNX_DISABLE_OPTIMIZE``: the optimizer on, its crash an error). The sweep never imports a backend's module
nor changes its tables: the backend is found by name like any other.

Importing this module is light (no torch, no transformers): ``hfexport --help`` loads it to add the
``sweep`` subcommand.

Example::

    hfexport sweep --backend dynamo --filter '^(bert|llama)/' --jobs 2 --timeout 120
    hfexport sweep --backend onnx --recheck-skips
    hfexport sweep --backend executorch-xnnpack --sample --seed 0 --jobs 2

``--executor ray [--address ADDR]`` runs the same sweep as one Ray task per case (``hfexport_sweep._ray``):
each task runs the case process of the local executor (:func:`run_one_case`), with its timeout and memory
limit, and the driver appends each record to the same ``results.jsonl`` as its task finishes, so a sweep
resumes across executors. Ray is optional: ``pip install 'hfexport-sweep[ray]'``; every node needs hfexport
and the backend installed.

``--sample [--seed N]`` sweeps a seeded sample of the zoo: for every model type (family), one class among
those with an input recipe, drawn by an RNG seeded with ``N`` (default 0) and the model type
(:func:`hfexport_sweep.zoo.sample_cases`): the same cases on every run and machine for one transformers
version. ``meta.json`` records the seed of each run and the reports say which sample was swept.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .results import (
    COMMON_ARCHITECTURES,
    META_FILE,
    META_KIND,
    META_SCHEMA,
    RESULTS_FILE,
    STATUSES,
    TRACED_STATUSES,
    default_zoo_shapes,
    load_results,
)
from .sweep_report import write_reports

__all__ = [
    "ATOL",
    "COMMON_ARCHITECTURES",
    "KnownFailures",
    "RTOL",
    "SKIP_LIST",
    "STATUSES",
    "SweepError",
    "SweepSummary",
    "ZOOS",
    "default_output",
    "export_and_verify",
    "export_skips",
    "failure_record",
    "known_failures",
    "load_results",
    "register_cli",
    "run_case",
    "run_sweep",
    "stage_label",
    "zoo_module",
]

ATOL, RTOL = 1e-4, 1e-3
"""Tolerances of the verification at the alt input shape."""

DEFAULT_TIMEOUT_S = 180.0
DEFAULT_RUNNER = "hfexport_sweep.sweep:export_and_verify"
# Results written while the zoo and the sweep lived in hfexport-dynamo (the same cases and inputs): still theirs.
_LEGACY_RUNNERS = {"hfexport_dynamo.sweep:export_and_verify": DEFAULT_RUNNER}
# Versions that make two sweeps comparable: a results directory written with other values is not mixed in.
_META_KEYS = ("backend", "backend_distribution", "runner", "versions", "zoo", "zoo_inputs")
# Imported once by the fork server so that every case process starts with them in memory.
# (Imports only: no tensor work runs in the server, so no thread pool exists when it forks.)
_PRELOAD = ("torch", "torch.export", "torch.export._trace", "torch._dynamo", "torch._functorch.aot_autograd",
            "torch._functorch.partitioners", "torch._export.passes", "torch._export.serde.serialize",
            "torch.fx.experimental.validator", "sympy", "networkx", "transformers", "transformers.modeling_utils",
            "transformers.generation", "hfexport", "hfexport_dynamo", "hfexport_sweep.zoo",
            "hfexport_sweep.tester_zoo")

EXAMPLES = """\
examples:
  hfexport sweep --backend dynamo                              every zoo case, results in reports/dynamo/
  hfexport sweep --backend onnx --filter '^(bert|llama|t5)/' --jobs 2 --timeout 120
  hfexport sweep --backend dynamo --recheck-skips              re-run the EXPORT_SKIPS classes
  hfexport sweep --backend onnx --sample --seed 0 --jobs 2     one seeded class per model type (~450 cases)
  hfexport sweep --backend dynamo --zoo testers --jobs 2       Transformers' model testers' configs and inputs
  hfexport sweep --backend onnx --executor ray --address HEAD:6379 --memory-limit 8
                                                               the zoo on a Ray cluster, one task per case

Statuses: ok, not_instantiable, export_error, runtime_error, mismatch, timeout, skipped. Results are appended to
<output>/results.jsonl as they come: run the same command again to resume an interrupted sweep.
Exit status: 0 the sweep ran (whatever the statuses), 2 bad usage, 130 interrupted.
"""


class SweepError(Exception):
    """Bad input to a sweep (unknown backend, a filter matching no case, a foreign results directory).

    Raised before any case runs; the message says what to do instead.
    """


@dataclass
class SweepSummary:
    """What a sweep run found.

    Attributes:
        backend: the backend name.
        output: the results directory.
        records: every record in ``results.jsonl`` for the selected cases (resumed ones included).
        ran: the number of cases run by this invocation (the others were already recorded).
        interrupted: the sweep was stopped (Ctrl-C) before every case ran.
        recheck: for ``--recheck-skips``, ``(list name, class name, status, cause)`` per rechecked entry.
    """

    backend: str
    output: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    ran: int = 0
    interrupted: bool = False
    recheck: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def counts(self) -> Counter[str]:
        """Cases per status."""
        return Counter(r["status"] for r in self.records)

    @property
    def tried(self) -> int:
        """Cases with a record."""
        return len(self.records)

    @property
    def instantiable(self) -> int:
        """Cases whose model builds and runs eagerly (all but ``not_instantiable``)."""
        return self.tried - self.counts["not_instantiable"]

    @property
    def ok(self) -> int:
        """Cases exported and verified."""
        return self.counts["ok"]

    def headline(self) -> str:
        """``tried N, instantiable M, ok K (P% of instantiable)`` and the count of every other status."""
        pct = f" ({100 * self.ok / self.instantiable:.1f}% of instantiable)" if self.instantiable else ""
        others = ", ".join(f"{s} {self.counts[s]}" for s in STATUSES[1:] if self.counts[s])
        return f"{self.backend}: tried {self.tried}, instantiable {self.instantiable}, ok {self.ok}{pct}" + \
            (f"; {others}" if others else "")


# ── bad input: checked before any work ─────────────────────────────────────────────────────────────────
def resolve_backend(name: str) -> tuple[str, str]:
    """Check that ``name`` is an installed backend whose exporter imports.

    Args:
        name: a backend name (``hfexport backends``).

    Returns:
        ``(exporter module, distribution "name version")`` of the backend.

    Raises:
        SweepError: the backend is unknown, not usable, or its exporter fails to import.
    """
    from hfexport import UnknownBackendError, get_backend, list_backends

    try:
        backend = get_backend(name)
        backend.load_exporter()
    except UnknownBackendError as exc:
        raise SweepError(str(exc)) from exc
    except (ImportError, TypeError, AttributeError) as exc:
        raise SweepError(f"backend {name!r} is installed but its exporter does not load: "
                         f"{type(exc).__name__}: {exc}") from exc
    info = next(i for i in list_backends(load=False) if i.name == name)
    return backend.exporter.partition(":")[0], f"{info.distribution} {info.version}"


ZOOS = ("default", "testers")
"""``--zoo``: ``default`` is :mod:`hfexport_sweep.zoo` (every auto-mapped class, shrunk configs, at the sizes of
:func:`~hfexport_sweep.results.default_zoo_shapes`);
``testers`` is :mod:`hfexport_sweep.tester_zoo` (configs and inputs of Transformers' own model testers, checked at
the tester's shape and at a second one)."""


def zoo_module(zoo: str = "default") -> Any:
    """The module of a zoo: it has ``list_cases(filter)`` and ``build_case(case_id)``.

    Raises:
        SweepError: ``zoo`` is not one of :data:`ZOOS`.
    """
    if zoo not in ZOOS:
        raise SweepError(f"--zoo takes one of {', '.join(ZOOS)}; got {zoo!r}")
    if zoo == "testers":
        from . import tester_zoo

        return tester_zoo
    from . import zoo as default_zoo

    return default_zoo


def select_cases(filter: str | None = None, limit: int | None = None,  # noqa: A002 - CLI name
                 common: bool = False, sample: int | None = None, zoo: str = "default") -> list[Any]:
    """The zoo cases to sweep, sorted by id.

    Args:
        filter: a regular expression searched in each ``case_id`` (``"^llama/"``, ``"ForCausalLM$"``).
        limit: keep the first ``limit`` matching cases.
        common: keep only the cases of :data:`COMMON_ARCHITECTURES`.
        sample: a seed: start from :func:`hfexport_sweep.zoo.sample_cases` (one case per model type, drawn
            with this seed) instead of the whole zoo; ``filter``, ``common`` and ``limit`` then narrow it.
        zoo: ``"default"`` or ``"testers"`` (:data:`ZOOS`); ``sample`` is the default zoo's only.

    Returns:
        The :class:`~hfexport_sweep.zoo.ZooCase` list.

    Raises:
        SweepError: the filter is not a valid regular expression or matches no case; ``limit`` < 1.
    """
    from .zoo import sample_cases

    list_cases = zoo_module(zoo).list_cases
    if limit is not None and limit < 1:
        raise SweepError(f"--limit must be at least 1, got {limit}")
    if sample is not None and zoo != "default":
        raise SweepError(f"--sample draws from the default zoo; the {zoo} zoo is swept whole (narrow it with --filter)")
    try:
        cases = list_cases(filter)
    except re.error as exc:
        raise SweepError(f"--filter {filter!r} is not a valid regular expression: {exc}") from exc
    if sample is not None:
        chosen = {c.case_id for c in sample_cases(sample)}
        cases = [c for c in cases if c.case_id in chosen]
    if common:
        cases = [c for c in cases if c.model_type in COMMON_ARCHITECTURES]
    if not cases:
        where = (f"--filter {filter!r}{' with --common' if common else ''}"
                 f"{f' with --sample --seed {sample}' if sample is not None else ''}")
        raise SweepError(f"{where} matches none of the {len(list_cases())} {zoo} zoo cases; ids look like "
                         "'llama/LlamaForCausalLM' (see hfexport_sweep.zoo.list_cases)")
    return cases[:limit] if limit else cases


def _all_cases(zoo: str = "default") -> list[Any]:
    return zoo_module(zoo).list_cases()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def sweep_meta(backend: str, distribution: str, runner: str = DEFAULT_RUNNER, zoo: str = "default") -> dict[str, Any]:
    """The identity of a results directory: backend, runner and the versions that decide the results.

    Args:
        backend: the backend name.
        distribution: ``"name version"`` of the distribution that declares it.
        runner: ``"module:function"`` that exports and verifies one case.
        zoo: the zoo swept (:data:`ZOOS`); recorded when it is not the default one. The default zoo's inputs
            version (``zoo.ZOO_INPUTS_VERSION``) is recorded as ``zoo_inputs``: results built from other inputs
            (a directory without it holds version 1's) are not mixed in.

    Returns:
        The ``meta.json`` content (without the run history).
    """
    from .zoo import ZOO_INPUTS_VERSION

    return {
        **({"zoo": zoo} if zoo != "default" else {"zoo_inputs": ZOO_INPUTS_VERSION}),
        "kind": META_KIND,
        "schema": META_SCHEMA,
        "backend": backend,
        "backend_distribution": distribution,
        "runner": runner,
        "versions": {d: _version(d) for d in ("hfexport-core", "hfexport-dynamo", "hfexport-sweep", "torch",
                                              "transformers")},
        "python": sys.version.split()[0],
    }


def _upgrade_meta(old: Mapping[str, Any]) -> dict[str, Any]:
    """A ``meta.json`` written while the zoo and the sweep were part of hfexport-dynamo, as written now.

    The cases, their inputs and the runner are the same (the zoo's inputs are bit-for-bit those it built
    then), so such results resume rather than being refused.
    """
    old = dict(old)
    old["runner"] = _LEGACY_RUNNERS.get(old.get("runner"), old.get("runner"))
    versions = old.get("versions")
    if isinstance(versions, dict) and "hfexport-sweep" not in versions and "hfexport-dynamo" in versions:
        old["versions"] = {**versions, "hfexport-sweep": versions["hfexport-dynamo"]}
    return old


def _describe_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    old = _upgrade_meta(old)
    diffs = []
    for key in _META_KEYS:
        a, b = old.get(key), new.get(key)
        if key == "zoo":  # a directory of the default zoo has no "zoo" key
            a, b = a or "default", b or "default"
        if key == "zoo_inputs" and (old.get("zoo") or "default") == "default":  # before it was recorded: 1
            a = a or 1
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{k} {a.get(k)} there, {b.get(k)} here" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            diffs.append(f"{key} {a!r} there, {b!r} here")
    return "; ".join(diffs)


def prepare_output(output: Path, meta: dict[str, Any], overwrite: bool) -> dict[str, dict[str, Any]]:
    """Open a results directory: check that it belongs to this sweep, and read what it already holds.

    Args:
        output: the results directory; created if missing.
        meta: :func:`sweep_meta` of this sweep.
        overwrite: delete the results of another backend or version instead of refusing.

    Returns:
        The records already in ``results.jsonl``, by case id (empty for a new or overwritten directory).

    Raises:
        SweepError: the directory holds results of another backend, runner or version (the message names the
            difference), or files that are not a sweep's, and ``overwrite`` is false.
    """
    meta_path, results_path = output / META_FILE, output / RESULTS_FILE
    if output.exists() and not output.is_dir():
        raise SweepError(f"--output {output} is a file, not a directory")
    problem = ""
    if meta_path.exists():
        try:
            old = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            old, problem = {}, f"its {META_FILE} is unreadable ({exc})"
        if not problem and old.get("kind") != META_KIND:
            problem = f"its {META_FILE} is not an hfexport sweep's"
        elif not problem:
            difference = _describe_difference(old, meta)
            if difference:
                problem = f"it holds results of another sweep: {difference}"
    elif output.exists() and any(output.iterdir()):
        problem = f"it is not empty and has no {META_FILE} (not an hfexport sweep's results)"
    if problem and not overwrite:
        raise SweepError(f"refusing to mix results in {output}: {problem}. Pass --overwrite to start it afresh, or "
                         "choose another --output")
    if problem:
        for name in (RESULTS_FILE, META_FILE, "report.md", "index.html", "recheck.json"):
            with contextlib.suppress(FileNotFoundError):
                (output / name).unlink()
    output.mkdir(parents=True, exist_ok=True)
    history: list[Any] = []
    if meta_path.exists():
        history = json.loads(meta_path.read_text()).get("runs", [])
    _write_json(meta_path, {**meta, "runs": history})
    if results_path.exists() and results_path.stat().st_size:
        with results_path.open("rb+") as f:  # a line cut short by an interruption: end it, it is ignored
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
    return {r["case_id"]: r for r in load_results(results_path)}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _append_record(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _record_run(output: Path, entry: dict[str, Any]) -> None:
    meta_path = output / META_FILE
    meta = json.loads(meta_path.read_text())
    # One entry per run, updated as the run goes; keyed by run_id (two runs can start within one second).
    runs = [r for r in meta.get("runs", []) if r.get("run_id", r.get("started")) != entry["run_id"]]
    meta["runs"] = [*runs, entry]
    _write_json(meta_path, meta)


# ── one case, in its own process ───────────────────────────────────────────────────────────────────────
def _one_line(exc: BaseException, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _where(exc: BaseException) -> str | None:
    """The innermost frame of ``exc``'s traceback in a Transformers model file: ``modeling_x.py:123 in f``."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/transformers/models/" in frame.filename.replace(os.sep, "/"):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    chain = [exc]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    return chain


def _level(entry: Any) -> tuple[str, int, int, str]:
    """One level of an ``ExportError.path``: a ``(backend, number, total, title)`` tuple or an object with
    those attributes."""
    if hasattr(entry, "number"):
        return entry.backend, entry.number, entry.total, entry.title
    backend, number, total, title = tuple(entry)[:4]
    return backend, number, total, title


def stage_label(exc: Any, backend: str) -> str:
    """Where an export failed, from the ``ExportError``'s fields (never from its message).

    Args:
        exc: a ``hfexport.ExportError``.
        backend: the backend swept; the first level is named without it.

    Returns:
        ``"3/5 FX node fixes -> dynamo 5/5 State cleanup -> torch.export.export"``: the stage path outer to
        inner (a level of another backend is prefixed with its name), then the toolchain step that raised;
        ``"step torch.onnx.export"`` for a step between the stages; ``"before the first stage"`` (or the error's
        ``where``) when neither ran.
    """
    path = getattr(exc, "path", None)
    if path is not None:
        levels = [_level(entry) for entry in path]
    elif getattr(exc, "stage_number", 0):  # an ExportError without a path: its one stage
        levels = [(getattr(exc, "backend", backend), exc.stage_number, getattr(exc, "total", 0),
                   getattr(exc, "stage_title", ""))]
    else:
        levels = []
    parts = [f"{'' if i == 0 and name == backend else name + ' '}{number}/{total or '?'} {title}".rstrip()
             for i, (name, number, total, title) in enumerate(levels)]
    step = getattr(exc, "step", "")
    if not parts and step:  # a toolchain step between the stages (capture's torch.export.export, a conversion)
        return f"step {step}"
    label = " -> ".join(parts) if parts else (getattr(exc, "where", "") or "before the first stage")
    return f"{label} -> {step}" if step else label


def failure_record(status: str, exc: BaseException, **fields: Any) -> dict[str, Any]:
    """The outcome fields of a failed case: ``status``, ``cause`` (the root exception's first line), ``where``
    (the innermost Transformers model frame), ``error`` (the root exception, up to 800 characters) and
    ``fields``.

    Args:
        status: the case's status (``export_error``, ``runtime_error`` ...).
        exc: the exception raised (its ``__cause__`` chain is followed to the root).
        **fields: more fields of the record (``stage``, ``export_s`` ...).

    Returns:
        A dict to merge into the case's record.
    """
    chain = _chain(exc)
    root = chain[-1]
    text = " ".join(str(root).split())
    where = next((w for e in reversed(chain) if (w := _where(e))), None)
    return {"status": status, "cause": _one_line(root), "where": where, "error": text[:800], **fields}


def export_and_verify(model: Any, inputs: dict[str, Any], alt_inputs: dict[str, Any], backend: str,
                      atol: float = ATOL, rtol: float = RTOL, options: Mapping[str, Any] | None = None,
                      verify_traced: bool = False) -> dict[str, Any]:
    """The default case runner: ``hfexport.export(dynamic=True)``, then verify at the alt input shape.

    On an ExecuTorch backend (:data:`STATIC_FALLBACK_PREFIXES`), a dynamic export that fails is tried again with
    ``dynamic=False`` and, when that one exports, verified at the traced shape instead (a static program takes
    no other); so is a dynamic export whose program came out with every dim static. The record says so with
    ``shapes: "static"`` and ``dynamic_error`` (why the dynamic export is not possible), and the report counts
    those cases apart. Other backends have no such fallback: their criterion is the dynamic export only.

    Args:
        model: the tiny eval-mode model.
        inputs: forward kwargs to trace with.
        alt_inputs: forward kwargs to verify with (the next batch, another sequence length where there is one).
        backend: the backend name.
        atol: absolute tolerance of the verification.
        rtol: relative tolerance of the verification.
        options: more config options of the export (a known-failure recheck's ``recheck_options``).
        verify_traced: verify at ``inputs`` too, before ``alt_inputs`` (the tester zoo's criterion: both shapes);
            a failure there is the case's status, its cause prefixed with ``at the traced shape:``, and the
            record gains ``traced_max_abs_diff``.

    Returns:
        The case's outcome: ``status`` (``ok``, ``export_error``, ``runtime_error`` or ``mismatch``) and, as
        they apply, ``export_s``, ``verify_s``, ``max_abs_diff``, ``stage``, ``step``, ``internal``, ``cause``,
        ``where``, ``error``.
    """
    import hfexport

    start = time.perf_counter()
    try:
        # verify=False: the case's criterion is the check at the alt shape below (a mismatch there is "mismatch",
        # not an export error); the export's own check at the traced shape is only recorded in its manifest.
        exported = hfexport.export(model, inputs, backend=backend, dynamic=True, verify=False, **dict(options or {}))
    except hfexport.ExportError as exc:
        facts = {"step": getattr(exc, "step", "") or None, "internal": getattr(exc, "internal", None)}
        failed = failure_record("export_error", exc, stage=stage_label(exc, backend),
                                **{k: v for k, v in facts.items() if v is not None},
                                export_s=round(time.perf_counter() - start, 3))
        if not backend.startswith(STATIC_FALLBACK_PREFIXES):
            return failed
        return _static_fallback(model, inputs, backend, failed, atol=atol, rtol=rtol, options=options)
    except Exception as exc:  # input checks before the first stage (InvalidInputError, TypeError)
        return failure_record("export_error", exc, stage="before the first stage",
                              export_s=round(time.perf_counter() - start, 3))
    export_s = round(time.perf_counter() - start, 3)
    if backend.startswith(STATIC_FALLBACK_PREFIXES) and not _has_dynamic_dim(exported):
        # torch.export specialized every dim (its Dim.AUTO retrace): the program is static, checked as such
        _phase("verify (static)")
        return _verify_at(exported, inputs, export_s, atol=atol, rtol=rtol, shapes="static", dynamic_error=(
            "the dynamic export specialized every input dim to the traced shape (no dynamic dim left)"))
    if verify_traced:
        _phase("verify (traced shape)")
        traced = _verify_at(exported, inputs, export_s, atol=atol, rtol=rtol)
        if traced["status"] != "ok":
            return {**traced, "cause": f"at the traced shape: {traced.get('cause') or ''}"}
        _phase("verify")
        return {**_verify_at(exported, alt_inputs, export_s, atol=atol, rtol=rtol),
                "traced_max_abs_diff": traced.get("max_abs_diff")}
    _phase("verify")
    return _verify_at(exported, alt_inputs, export_s, atol=atol, rtol=rtol)


def _verify_at(exported: Any, inputs: dict[str, Any], export_s: float, *, atol: float, rtol: float,
               **fields: Any) -> dict[str, Any]:
    """The record fields of ``exported.verify(inputs)`` (``ok``, ``mismatch`` or ``runtime_error``), plus ``fields``."""
    # Constants baked into the program (use_cache=False; image_grid_thw, as nested lists) are added to the eager call
    # by the artifact.
    fixed = exported.manifest.get("fixed_kwargs", {})
    checked = {k: v for k, v in inputs.items()
               if not (k in fixed and (v.tolist() if hasattr(v, "tolist") else v) == fixed[k])}
    start = time.perf_counter()
    try:
        report = exported.verify(checked, atol=atol, rtol=rtol)
    except Exception as exc:
        return failure_record("runtime_error", exc, export_s=export_s, verify_s=round(time.perf_counter() - start, 3),
                              **fields)
    return {**_verified(report, export_s, round(time.perf_counter() - start, 3), atol=atol, rtol=rtol), **fields}


# Backends whose sweep criterion falls back to a static export when the dynamic one fails (issue 12: "ExecuTorch
# as static where dynamic is not possible, and said so"): a phone app often runs one fixed shape.
STATIC_FALLBACK_PREFIXES = ("executorch-",)


def _static_fallback(model: Any, inputs: dict[str, Any], backend: str, dynamic_failure: dict[str, Any], *,
                     atol: float, rtol: float, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Export ``model`` again with ``dynamic=False`` after the dynamic export failed with ``dynamic_failure``,
    and verify it at the traced shape. A static export that fails too returns ``dynamic_failure`` (the criterion's
    error) with the static one's cause as ``static_error``."""
    import hfexport

    dynamic_error = f"{dynamic_failure.get('stage') or '?'}: {dynamic_failure.get('cause') or ''}"
    _phase("export (static, after the dynamic export failed)")
    start = time.perf_counter()
    try:
        exported = hfexport.export(model, inputs, backend=backend, dynamic=False, verify=False,
                                   **dict(options or {}))
    except Exception as exc:
        static = failure_record("export_error", exc)
        return {**dynamic_failure, "static_error": f"{stage_label(exc, backend)}: {static['cause']}"}
    _phase("verify (static)")
    return _verify_at(exported, inputs, round(time.perf_counter() - start, 3), atol=atol, rtol=rtol, shapes="static",
                      dynamic_error=dynamic_error)


def _has_dynamic_dim(exported: Any) -> bool:
    """Whether any tensor input of the export has a dynamic dim: a symbol (``"s0"``) in a manifest input's shape,
    where static dims are ints (or digits). A manifest without input shapes counts as dynamic (nothing to say)."""
    shapes = [entry["shape"] for entry in exported.manifest.get("inputs") or [] if entry.get("shape") is not None]
    if not shapes:
        return True
    return any(not (isinstance(dim, int) or str(dim).isdigit()) for shape in shapes for dim in shape)


def _verified(report: Any, export_s: float, verify_s: float, *, atol: float, rtol: float) -> dict[str, Any]:
    """The record fields of a verification report: ``ok`` or ``mismatch`` with its cause."""
    max_diff = report.max_abs_diff
    result: dict[str, Any] = {"export_s": export_s, "verify_s": verify_s,
                              "max_abs_diff": max_diff if max_diff == max_diff and max_diff != float("inf") else None}
    if report.passed:
        return {"status": "ok", **result}
    bad = [o for o in report.outputs if not o.ok]
    worst = max(bad, key=lambda o: o.max_abs_diff) if bad else None
    if worst is None:
        cause = "the artifact returned no outputs"
    elif worst.max_abs_diff == float("inf"):
        cause = f"{len(bad)} of {len(report.outputs)} outputs differ: {worst.name} has another shape or value type"
    else:
        cause = (f"{len(bad)} of {len(report.outputs)} outputs differ beyond atol={atol:g} rtol={rtol:g}: "
                 f"{worst.name} max abs diff {worst.max_abs_diff:.3g}")
    return {"status": "mismatch", "cause": cause, **result}


_PHASE_FILE: Path | None = None


def _phase(name: str) -> None:
    """Note the phase a case process is in, so that a crash or a timeout says where it happened."""
    if _PHASE_FILE is not None:
        _PHASE_FILE.write_text(name)


def _load_runner(runner: str) -> Callable[..., dict[str, Any]]:
    import importlib

    module, _, name = runner.partition(":")
    return getattr(importlib.import_module(module), name)


def run_case(case_id: str, backend: str, *, runner: str = DEFAULT_RUNNER, atol: float = ATOL,
             rtol: float = RTOL, options: Mapping[str, Any] | None = None, zoo: str = "default") -> dict[str, Any]:
    """Build one zoo case, run it eagerly, then export and verify it (in the calling process).

    Args:
        case_id: ``"<model_type>/<ClassName>"``.
        backend: the backend name.
        runner: ``"module:function"`` called as ``runner(model, inputs, alt_inputs, backend, atol, rtol)``
            (plus ``options=`` when there are options); the default is :func:`export_and_verify`.
        atol: absolute tolerance of the verification.
        rtol: relative tolerance of the verification.
        options: config options of the export (a known-failure list's ``recheck_options``).
        zoo: the case's zoo (:data:`ZOOS`); for ``"testers"`` the runner also gets ``verify_traced=True`` (both
            shapes are the criterion).

    Returns:
        The outcome fields of the case's record (``status`` and what applies of ``reason``, ``stage``,
        ``cause``, ``where``, ``error``, ``export_s``, ``verify_s``, ``max_abs_diff``).

    Raises:
        hfexport_sweep.zoo.UnknownCaseError: the case is not in the zoo.
    """
    from . import zoo as default_zoo

    _phase("build")
    try:
        model, inputs, alt_inputs = zoo_module(zoo).build_case(case_id)
        default_zoo.check_eager(model, inputs, alt_inputs)
    except default_zoo.NotInstantiable as exc:
        return {"status": "not_instantiable", "reason": exc.reason, "cause": exc.reason, "where": _where(exc)}
    _phase("export")
    extra: dict[str, Any] = {"options": dict(options)} if options else {}
    if zoo == "testers":
        extra["verify_traced"] = True
    outcome = _load_runner(runner)(model, inputs, alt_inputs, backend, atol, rtol, **extra)
    if zoo == "testers" and isinstance(outcome, dict):
        outcome["shapes_checked"] = _shapes(inputs, alt_inputs)
    images = default_zoo.image_inputs(model)
    if images is not None and isinstance(outcome, dict):  # a multimodal case: whether its vision tower was traced
        outcome["images"] = images.describe()
        outcome["vision_traced"] = images.used and outcome.get("status") in TRACED_STATUSES
    return outcome


def _shapes(*kwargs_sets: Mapping[str, Any]) -> list[str]:
    """``["input_ids 13x7, attention_mask 13x7", ...]``: the tensor shapes of each set of forward kwargs."""
    return [", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in kw.items() if hasattr(v, "shape"))
            for kw in kwargs_sets]


def _case_process(job: dict[str, Any], result_path: str, log_path: str) -> None:
    """Entry point of a case process: run the case with output sent to a log, write the outcome as JSON."""
    global _PHASE_FILE
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    _PHASE_FILE = Path(result_path + ".phase")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(job["threads"])
    try:
        outcome = run_case(job["case_id"], job["backend"], runner=job["runner"], atol=job["atol"],
                           rtol=job["rtol"], options=job.get("options"), zoo=job.get("zoo", "default"))
    except BaseException as exc:  # the sweep records every failure as a status
        traceback.print_exc()
        phase = _PHASE_FILE.read_text() if _PHASE_FILE.exists() else "build"
        status = {"build": "not_instantiable", "export": "export_error"}.get(phase, "runtime_error")
        outcome = failure_record(status, exc, stage=f"sweep runner ({phase})")
        if status == "not_instantiable":
            outcome["reason"] = outcome["cause"]
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(outcome, f, default=str)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()


# ── the sweep ──────────────────────────────────────────────────────────────────────────────────────────
def _mp_context(preload: Iterable[str]) -> Any:
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        # The server's imports print warnings (torch, transformers): started with stdout and stderr on
        # /dev/null, they do not break the progress bar. Case processes send theirs to their own log.
        saved = [os.dup(1), os.dup(2)]
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            forkserver.ensure_running()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, devnull):
                os.close(fd)
        return ctx
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows: each case imports on its own


@dataclass
class _Running:
    case: Any
    process: Any
    started: float
    result_path: str
    log_path: str
    job: dict[str, Any]


def _log_tail(path: str, lines: int = 3) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    tail = [ln.strip() for ln in text if ln.strip() and not ln.startswith((" ", "W1", "I1"))][-lines:]
    return " | ".join(tail)[:300]


def _rss_bytes(pid: int) -> int | None:
    """The resident memory of a process in bytes (``VmRSS`` in ``/proc``), or ``None`` where unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _finish(run: _Running, timed_out: bool, timeout: float, over_memory: int | None = None) -> dict[str, Any]:
    phase_file = Path(run.result_path + ".phase")
    phase = phase_file.read_text() if phase_file.exists() else "start"
    if timed_out:
        return {"status": "timeout", "stage": phase, "cause": f"timed out after {timeout:g} s during {phase}"}
    if over_memory is not None:  # killed by the sweep: a status of the phase, as for a crash
        status = {"build": "not_instantiable", "export": "export_error"}.get(phase, "runtime_error")
        cause = (f"killed at {over_memory / 2**30:.2f} GiB resident, over the memory limit of "
                 f"{run.job['memory_limit'] / 2**30:g} GiB, during {phase}")
        return {"status": status, "stage": f"memory limit ({phase})", "cause": cause,
                **({"reason": cause} if status == "not_instantiable" else {})}
    try:
        return json.loads(Path(run.result_path).read_text())
    except (OSError, ValueError):
        pass
    code = run.process.exitcode
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    try:
        import signal

        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else how
    except ValueError:
        pass
    tail = _log_tail(run.log_path)
    cause = f"case process died ({how}) during {phase}" + (f": {tail}" if tail else "")
    status = {"build": "not_instantiable", "export": "export_error"}.get(phase, "runtime_error")
    return {"status": status, "stage": f"process crash ({phase})", "cause": cause[:400],
            **({"reason": cause[:400]} if status == "not_instantiable" else {})}


class _Display:
    """A rich progress bar on a TTY; one line per finished case otherwise."""

    def __init__(self, total: int, backend: str, enabled: bool | None = None):
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.tty = self.console.is_terminal if enabled is None else enabled
        self.total, self.done, self.backend = total, 0, backend
        self.counts: Counter[str] = Counter()
        self._progress: Any = None
        if self.tty and total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[counts]}"),
                                      console=self.console, transient=False)
            self._task = self._progress.add_task(f"sweep {backend}", total=total, counts="")
            self._progress.start()

    def update(self, record: Mapping[str, Any]) -> None:
        self.done += 1
        self.counts[record["status"]] += 1
        if self._progress is not None:
            counts = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
            self._progress.update(self._task, advance=1, counts=counts)
            if record["status"] not in ("ok", "not_instantiable", "skipped"):
                self._progress.console.print(f"  {record['status']:<16} {record['case_id']}: "
                                             f"{(record.get('cause') or '')[:150]}")
        else:
            detail = (record.get("cause") or "") if record["status"] != "ok" else ""
            seconds = record.get("seconds")
            timing = f" {seconds:.1f}s" if seconds is not None else ""
            print(f"[{self.done}/{self.total}] {record['status']:<16} {record['case_id']}{timing}"
                  f"{'  ' + detail[:160] if detail else ''}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _base_record(case: Any, backend: str) -> dict[str, Any]:
    return {"case_id": case.case_id, "model_type": case.model_type, "class_name": case.class_name,
            "task": case.task, "modality": case.modality, "backend": backend}


SKIP_LIST = "EXPORT_SKIPS"
"""The list of model classes every backend fails (the dynamo trace's): recorded ``skipped``, rechecked as is."""


def export_skips() -> dict[str, str]:
    """``hfexport_dynamo.EXPORT_SKIPS``: model class -> the model-side change that would make it exportable."""
    import hfexport_dynamo

    return dict(hfexport_dynamo.EXPORT_SKIPS)


@dataclass(frozen=True)
class KnownFailures:
    """The known-failure lists a backend declares through its exporter class.

    Attributes:
        lists: list name -> {model class: reason} (``{"ONNX_DISABLE_OPTIMIZE": {...}}``), from the exporter's
            ``known_failures()``; ``EXPORT_SKIPS`` is not among them (see :func:`export_skips`).
        recheck_options: the exporter's ``recheck_options(list name, model class)`` -> config options that
            re-check one entry, or ``None`` when it has none (its lists cannot be rechecked then).
        notes: why a list was not read or cannot be rechecked.
    """

    lists: dict[str, dict[str, str]] = field(default_factory=dict)
    recheck_options: Callable[[str, str], Mapping[str, Any]] | None = None
    notes: tuple[str, ...] = ()


def known_failures(backend: str) -> KnownFailures:
    """The known-failure lists of ``backend``, read from its exporter class (never from the backend's module).

    Args:
        backend: an installed backend name.

    Returns:
        Its :class:`KnownFailures` (empty, with a note, when the exporter declares none).
    """
    from hfexport import get_backend

    exporter_class = get_backend(backend).load_exporter()
    declared = getattr(exporter_class, "known_failures", None)
    if declared is None:
        return KnownFailures()
    try:
        lists = {str(name): {str(cls): str(why) for cls, why in dict(entries).items()}
                 for name, entries in dict(declared()).items() if name != SKIP_LIST}
    except Exception as exc:  # a plugin's bug must not stop the sweep
        return KnownFailures(notes=(f"{exporter_class.__name__}.known_failures() failed: {_one_line(exc)}",))
    recheck = getattr(exporter_class, "recheck_options", None)
    notes = tuple(f"{name} ({len(entries)} entries) not rechecked: {exporter_class.__name__} has no "
                  "recheck_options()" for name, entries in lists.items()) if recheck is None and lists else ()
    return KnownFailures(lists, recheck, notes)


def _run_jobs(jobs_list: list[tuple[Any, dict[str, Any]]], jobs: int, timeout: float, preload: Iterable[str],
              on_record: Callable[[dict[str, Any]], None]) -> None:
    """Run the case processes, ``jobs`` at a time, calling ``on_record`` with each record as it finishes.

    A case process is killed past ``timeout`` seconds, and when its resident memory exceeds its job's
    ``memory_limit`` (bytes; polled every 0.2 s from ``/proc``, so Linux only).
    """
    from multiprocessing.connection import wait

    if not jobs_list:
        return
    ctx = _mp_context(preload)
    pending = list(reversed(jobs_list))
    running: list[_Running] = []
    with tempfile.TemporaryDirectory(prefix="hfexport-sweep-") as tmp:
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    case, job = pending.pop()
                    stem = os.path.join(tmp, f"{len(pending)}-{case.case_id.replace('/', '__')}")
                    process = ctx.Process(target=_case_process, args=(job, stem + ".json", stem + ".log"),
                                          name=f"sweep:{case.case_id}", daemon=True)
                    process.start()
                    running.append(_Running(case, process, time.monotonic(), stem + ".json", stem + ".log", job))
                now = time.monotonic()
                next_deadline = min(r.started + timeout for r in running)
                poll = 0.2 if any(r.job.get("memory_limit") for r in running) else float("inf")
                wait([r.process.sentinel for r in running], timeout=max(0.05, min(poll, next_deadline - now)))
                now = time.monotonic()
                for run in list(running):
                    timed_out = run.process.is_alive() and now - run.started > timeout
                    limit, rss = run.job.get("memory_limit"), None
                    if limit and run.process.is_alive() and not timed_out:
                        rss = _rss_bytes(run.process.pid)
                        rss = rss if rss is not None and rss > limit else None
                    if run.process.is_alive() and not timed_out and rss is None:
                        continue
                    if run.process.is_alive():
                        run.process.kill()
                    run.process.join()
                    running.remove(run)
                    record = {**_base_record(run.case, run.job["backend"]), **_finish(run, timed_out, timeout, rss)}
                    if "list" in run.job:  # --recheck-skips: the skip list the case's class is in
                        record["list"] = run.job["list"]
                    record["seconds"] = round(now - run.started, 2)
                    record["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
                    on_record(record)
        finally:
            for run in running:  # interrupted: stop what still runs; its case runs again on resume
                if run.process.is_alive():
                    run.process.kill()
                run.process.join()


def run_one_case(case: Any, job: dict[str, Any], timeout: float, preload: Iterable[str]) -> dict[str, Any]:
    """Run one case in its own process, as the local executor does, and return its record.

    What a Ray task of ``--executor ray`` runs: the same case process (forked from a server that imported
    ``preload``), the same timeout and memory limit, the same record.

    Args:
        case: a :class:`~hfexport_sweep.zoo.ZooCase`.
        job: its job (``backend``, ``runner``, ``atol``, ``rtol``, ``threads``, ``case_id``, and as they apply
            ``memory_limit`` in bytes, ``options``, ``list``).
        timeout: seconds the case may take.
        preload: modules the case process's server imports once.

    Returns:
        The case's record, as written to ``results.jsonl``.
    """
    records: list[dict[str, Any]] = []
    _run_jobs([(case, job)], 1, timeout, preload, records.append)
    return records[0]


EXECUTORS = ("local", "ray")
"""``--executor``: ``local`` runs the case processes on this machine (``--jobs`` at a time); ``ray`` runs one
Ray task per case on a Ray instance or cluster, each task running the case process as :func:`run_one_case`."""
RAY_EXTRA = "pip install 'hfexport-sweep[ray]'"


def _check_executor(executor: str, address: str | None) -> None:
    if executor not in EXECUTORS:
        raise SweepError(f"--executor takes one of {', '.join(EXECUTORS)}; got {executor!r}")
    if address is not None and executor != "ray":
        raise SweepError("--address is the Ray cluster of --executor ray; pass --executor ray --address ADDR")
    if executor == "ray":
        from ._ray import import_ray

        try:
            import_ray(address)
        except ImportError as exc:
            raise SweepError(f"--executor ray needs Ray, which does not import ({type(exc).__name__}: {exc}); "
                             f"install the extra: {RAY_EXTRA}") from exc


def _execute(items: list[tuple[Any, dict[str, Any]]], jobs: int | None, timeout: float, preload: list[str],
             on_record: Callable[[dict[str, Any]], None], executor: str, address: str | None) -> None:
    """Run the cases with the chosen executor, calling ``on_record`` with each record as it finishes."""
    if not items:
        return
    if executor == "ray":
        from ._ray import RayClusterError, run_on_ray

        try:
            run_on_ray(items, run_one_case, on_record, _task_failure, timeout=timeout, preload=preload,
                       address=address, max_in_flight=jobs)
        except RayClusterError as exc:
            raise SweepError(str(exc)) from exc
    else:
        _run_jobs(items, jobs or 1, timeout, preload, on_record)


def _task_failure(case: Any, job: dict[str, Any], exc: BaseException) -> None:
    """A case whose Ray task failed (its worker or node died past Ray's retries): not a result of the export,
    so nothing is recorded and the case runs again when the sweep is resumed."""
    print(f"ray task of {case.case_id} failed, not recorded (it runs again on resume): {_one_line(exc)}",
          file=sys.stderr, flush=True)


def run_sweep(backend: str, *, filter: str | None = None, jobs: int | None = None,  # noqa: A002 - CLI name
              timeout: float = DEFAULT_TIMEOUT_S, output: str | os.PathLike[str] | None = None,
              overwrite: bool = False, recheck_skips: bool = False, limit: int | None = None, common: bool = False,
              rerun: Iterable[str] = (), runner: str = DEFAULT_RUNNER, command: str | None = None,
              progress: bool | None = None, report: bool = True, preload: Iterable[str] = (),
              apply_skips: bool = True, sample: int | None = None, executor: str = "local",
              address: str | None = None, memory_limit: float | None = None, zoo: str = "default") -> SweepSummary:
    """Export every selected zoo case with ``backend``, one process per case, and write the results.

    Args:
        backend: the backend name (``hfexport backends``).
        filter: a regular expression searched in each case id.
        jobs: case processes run at once (each gets ``cpu_count // jobs`` torch threads; default 1); with
            ``executor="ray"``, at most this many cases submitted at once (default: all; the cluster's CPUs
            decide how many run, one CPU and one torch thread each).
        timeout: seconds a case may take (build, eager run, export, verify) before it is killed.
        output: the results directory (default ``reports/<backend>``).
        overwrite: start afresh a directory holding another backend's or version's results.
        recheck_skips: run only the classes of the known-failure lists — ``EXPORT_SKIPS``, and those the
            backend's exporter declares (``known_failures()``), with its ``recheck_options()`` — and report the
            entries that now pass; results go to ``recheck.json``, not ``results.jsonl``.
        limit: run only the first ``limit`` matching cases.
        common: run only the cases of the 60 :data:`COMMON_ARCHITECTURES` (a stratified sweep).
        sample: a seed: run a seeded sample of one case per model type (:func:`hfexport_sweep.zoo.sample_cases`,
            about 450 cases), narrowed by ``filter``/``common``/``limit``; ``None``: every matching case.
        rerun: statuses whose recorded cases run again (``("timeout",)`` with a longer ``timeout``); the new
            record replaces the old one.
        runner: ``"module:function"`` that exports and verifies one case (see :func:`run_case`).
        command: the command line recorded in ``meta.json`` (default: ``sys.argv``).
        progress: force the progress bar on or off (default: on a TTY).
        report: write ``report.md`` and ``index.html`` when the sweep ends.
        apply_skips: record the ``EXPORT_SKIPS`` classes as ``skipped`` (``False`` runs them like any other,
            e.g. for a runner that is not hfexport's).
        executor: ``"local"`` (a process pool on this machine) or ``"ray"`` (one Ray task per case, each still in
            its own process with its timeout and memory limit; needs ``hfexport-sweep[ray]``). Records go to the
            same ``results.jsonl`` either way, so a sweep resumes across executors.
        address: with ``executor="ray"``, the cluster to connect to (``ray.init(address=...)``); ``None``:
            ``RAY_ADDRESS`` if set, else a new local Ray instance for the sweep.
        memory_limit: GiB of resident memory a case process may use before it is killed (its record then has the
            status of its phase, like a crash, with stage ``memory limit (phase)``); on Ray also the task's
            ``memory`` request. ``None``: no limit.
        preload: more modules for the fork server to import once (only the first sweep of a process starts
            the server: a caller running several sweeps passes the union to the first).
        zoo: ``"default"`` (:mod:`hfexport_sweep.zoo`) or ``"testers"`` (:mod:`hfexport_sweep.tester_zoo`: the
            configs and inputs of Transformers' model testers, each case verified at the tester's shape and at a
            second one; default output ``reports/testers/<backend>``).

    Returns:
        A :class:`SweepSummary`.

    Raises:
        SweepError: unknown backend, a filter matching no case, a bad option, or a results directory of
            another sweep (see :func:`prepare_output`) — all before any case runs.
    """
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs must be at least 1, got {jobs}")
    if timeout <= 0:
        raise SweepError(f"--timeout must be positive, got {timeout}")
    if memory_limit is not None and memory_limit <= 0:
        raise SweepError(f"--memory-limit must be positive (GiB), got {memory_limit:g}")
    _check_executor(executor, address)
    rerun = tuple(rerun)
    unknown = [s for s in rerun if s not in STATUSES]
    if unknown:
        raise SweepError(f"--rerun takes statuses among {', '.join(STATUSES)}; got {', '.join(unknown)}")
    exporter_module, distribution = resolve_backend(backend)
    cases = select_cases(filter, limit, common, sample, zoo)
    out = Path(output) if output is not None else default_output(backend, zoo)
    meta = sweep_meta(backend, distribution, runner, zoo)
    done = prepare_output(out, meta, overwrite)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run_entry: dict[str, Any] = {
        "run_id": uuid.uuid4().hex, "started": started,
        "command": command or shlex.join(["hfexport", *sys.argv[1:]]), "filter": filter, "limit": limit,
        "common": common, "sample_seed": sample, "rerun": list(rerun), "jobs": jobs, "timeout_s": timeout,
        "recheck_skips": recheck_skips, "zoo": zoo, "selected": len(cases), "zoo_cases": len(_all_cases(zoo)),
        "executor": executor, "address": address, "memory_limit_gib": memory_limit}
    if sample is not None:
        from .zoo import sample_cases

        run_entry["sample_cases"] = len(sample_cases(sample))
    threads = 1 if executor == "ray" else max(1, (os.cpu_count() or 1) // (jobs or 1))
    job_base = {"backend": backend, "runner": runner, "atol": ATOL, "rtol": RTOL, "threads": threads, "zoo": zoo}
    if memory_limit is not None:
        job_base["memory_limit"] = int(memory_limit * 2**30)
    preload = [*_PRELOAD, exporter_module, runner.partition(":")[0], *preload]
    skips = export_skips() if apply_skips else {}
    summary = SweepSummary(backend, out)

    if recheck_skips:
        return _recheck(cases, skips, backend, job_base, jobs, timeout, preload, out, run_entry, summary, progress,
                        executor, address)

    to_run: list[tuple[Any, dict[str, Any]]] = []
    records = dict(done)
    new_skips = []
    for case in cases:
        previous = done.get(case.case_id)
        # A record stands unless the skip list changed since: a newly listed class is recorded as skipped,
        # a class taken off the list runs again.
        if previous is not None and (previous["status"] == "skipped") == (case.class_name in skips) \
                and previous["status"] not in rerun:
            continue
        if case.class_name in skips:
            new_skips.append({**_base_record(case, backend), "status": "skipped", "reason": skips[case.class_name],
                              "cause": skips[case.class_name], "seconds": 0.0})
            continue
        to_run.append((case, {**job_base, "case_id": case.case_id}))
    results_path = out / RESULTS_FILE
    display = _Display(len(to_run) + len(new_skips), backend, progress)
    if len(done):
        print(f"resuming {out}: {sum(c.case_id in done for c in cases)} of {len(cases)} selected cases already "
              f"recorded; {len(to_run)} to run", file=sys.stderr)

    def on_record(record: dict[str, Any]) -> None:
        _append_record(results_path, record)
        records[record["case_id"]] = record
        summary.ran += 1
        display.update(record)

    try:
        for record in new_skips:
            on_record(record)
        _execute(to_run, jobs, timeout, preload, on_record, executor, address)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        display.stop()
        selected = {c.case_id for c in cases}
        summary.records = [r for r in records.values() if r["case_id"] in selected]
        run_entry.update(finished=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                         ran=summary.ran, interrupted=summary.interrupted)
        _record_run(out, run_entry)
        if report:
            write_reports(out)
    return summary


def _recheck(cases: list[Any], skips: dict[str, str], backend: str, job_base: dict[str, Any], jobs: int | None,
             timeout: float, preload: list[str], out: Path, run_entry: dict[str, Any], summary: SweepSummary,
             progress: bool | None, executor: str, address: str | None) -> SweepSummary:
    """Run the classes of the known-failure lists and record which entries now pass."""
    listed: list[tuple[str, Any, dict[str, Any]]] = []
    for case in cases:
        if case.class_name in skips:
            listed.append((SKIP_LIST, case, {**job_base, "case_id": case.case_id}))
    declared = known_failures(backend)
    notes = list(declared.notes)
    lists = {SKIP_LIST: skips, **declared.lists}
    if declared.recheck_options is not None:
        for name, entries in declared.lists.items():
            for case in cases:
                if case.class_name in entries:
                    options = dict(declared.recheck_options(name, case.class_name))
                    listed.append((name, case, {**job_base, "case_id": case.case_id, "options": options}))
    for note in notes:
        print(note, file=sys.stderr)
    in_zoo = {c.class_name for c in _all_cases(job_base.get("zoo", "default"))}
    missing = [(name, cls) for name, entries in lists.items() for cls in entries if cls not in in_zoo]
    display = _Display(len(listed), backend, progress)
    records: list[dict[str, Any]] = []

    def on_record(record: dict[str, Any]) -> None:
        records.append(record)
        display.update(record)

    try:
        _execute([(case, {**job, "list": name}) for name, case, job in listed], jobs, timeout, preload, on_record,
                 executor, address)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        display.stop()
    options_of = {(name, job["case_id"]): job.get("options") for name, _, job in listed}
    per_class: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        if options_of.get((record["list"], record["case_id"])):
            record["options"] = options_of[(record["list"], record["case_id"])]
        per_class.setdefault((record["list"], record["class_name"]), []).append(record)
    for (name, cls), recs in sorted(per_class.items()):
        failed = [r for r in recs if r["status"] != "ok"]
        status = ",".join(sorted({r["status"] for r in failed})) if failed else "ok"
        summary.recheck.append((name, cls, status, (failed[0].get("cause") or "") if failed else ""))
    summary.records = records
    summary.ran = len(records)
    _write_json(out / "recheck.json", {
        "started": run_entry["started"], "command": run_entry["command"], "backend": backend, "notes": notes,
        "not_in_zoo": [f"{n}: {c}" for n, c in missing],
        "entries": [{"list": n, "class_name": c, "status": s, "cause": why, "can_be_removed": s == "ok"}
                    for n, c, s, why in summary.recheck],
        "records": summary.records})
    run_entry.update(finished=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), ran=summary.ran)
    _record_run(out, run_entry)
    return summary


# ── the CLI ────────────────────────────────────────────────────────────────────────────────────────────
def register_cli(subparsers: Any) -> None:
    """Add ``hfexport sweep`` to the ``hfexport`` command line (entry point group ``hfexport.commands``).

    Args:
        subparsers: the ``argparse`` sub-parsers action of the ``hfexport`` parser.
    """
    p = subparsers.add_parser(
        "sweep", help="export every tiny-zoo model with one backend and report what works",
        description="Export every case of the offline tiny-model zoo (one model class per case) with one backend, "
                    "each in its own process, verify it against eager PyTorch at another input shape, and write "
                    "results.jsonl, report.md and index.html.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("--backend", "-b", required=True, help="backend name, see `hfexport backends`")
    p.add_argument("--filter", "-k", help="regular expression searched in case ids ('^llama/', 'ForCausalLM$')")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="cases run at once, one process each (default 1); with --executor ray, at most N cases "
                        "submitted at once (default all: the cluster's CPUs decide, one CPU per case)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds one case may take before it is killed (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--output", "-o", help="results directory (default reports/<backend>); reports of every backend "
                                          "found beside it feed the coverage matrix")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh a results directory of another backend or version (refused otherwise)")
    p.add_argument("--recheck-skips", action="store_true",
                   help="run only the classes of the known-failure lists (EXPORT_SKIPS, and the backend's own, such "
                        "as ONNX_DISABLE_OPTIMIZE with --backend onnx) and report the entries that now pass")
    p.add_argument("--limit", type=int, help="only the first N matching cases")
    p.add_argument("--common", action="store_true",
                   help=f"only the cases of {len(COMMON_ARCHITECTURES)} widely used architectures (a stratified "
                        "sweep, for slow backends)")
    p.add_argument("--zoo", choices=ZOOS, default="default",
                   help=f"default: every auto-mapped class with shrunk configs ({default_zoo_shapes()}); testers: ~90 "
                        "architectures built with the configs and inputs of Transformers' own model testers (batch "
                        "13-14, 7 tokens, 1024 audio samples, 30-pixel images), each verified at the tester's shape "
                        "and at batch + 1 with another length (a larger image where the model allows); results in "
                        "reports/testers/<backend> (see hfexport_sweep.tester_zoo)")
    p.add_argument("--sample", action="store_true",
                   help="a seeded sample: one class per model type (family), drawn among the classes that have an "
                        "input recipe by an RNG seeded with --seed and the model type (the same on every run and "
                        "machine; about 450 cases); --filter, --common and --limit narrow it")
    p.add_argument("--seed", type=int, default=None, metavar="N", help="the seed of --sample (default 0)")
    p.add_argument("--rerun", metavar="STATUS[,STATUS]", default="",
                   help="run again the recorded cases with these statuses (e.g. timeout, with a longer --timeout)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: a process pool on this machine (default); ray: one Ray task per case on a Ray "
                        f"cluster, each case still in its own process with its timeout and memory limit; results "
                        f"go to the same resumable results.jsonl (needs Ray: {RAY_EXTRA})")
    p.add_argument("--address", metavar="ADDR",
                   help="with --executor ray: the Ray cluster to connect to (HOST:PORT, ray://HOST:PORT, auto); "
                        "default: RAY_ADDRESS if set, else a new local Ray instance for the sweep")
    p.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="kill a case process whose resident memory exceeds GIB (recorded with stage "
                        "'memory limit'); with --executor ray also each task's Ray memory request (default: none)")
    p.add_argument("--report-only", action="store_true", help="rewrite report.md and index.html from the results")
    p.set_defaults(func=_cmd_sweep)


def default_output(backend: str, zoo: str = "default") -> Path:
    """The results directory of a sweep without ``--output``: ``reports/<backend>``, ``reports/testers/<backend>``
    for the tester zoo (a reports root of its own, so that its coverage matrix holds tester sweeps only)."""
    return Path("reports") / ("testers" if zoo == "testers" else "") / backend


def _cmd_sweep(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    output = Path(args.output) if args.output else default_output(args.backend, args.zoo)
    if args.report_only:
        if not (output / RESULTS_FILE).exists():
            print(f"error: no {RESULTS_FILE} in {output}", file=sys.stderr)
            return 2
        for path in write_reports(output):
            print(f"wrote {path}")
        return 0
    if args.seed is not None and not args.sample:
        print("error: --seed is the seed of --sample; pass --sample --seed N", file=sys.stderr)
        return 2
    sample = (0 if args.seed is None else args.seed) if args.sample else None
    try:
        summary = run_sweep(args.backend, filter=args.filter, jobs=args.jobs, timeout=args.timeout, output=output,
                            overwrite=args.overwrite, recheck_skips=args.recheck_skips, limit=args.limit,
                            common=args.common, rerun=[s for s in args.rerun.split(",") if s], sample=sample,
                            executor=args.executor, address=args.address, memory_limit=args.memory_limit,
                            zoo=args.zoo)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.recheck_skips:
        if not summary.recheck:
            print("no listed class among the selected cases")
        for name, cls, status, cause in summary.recheck:
            verdict = "passes now: remove the entry" if status == "ok" else f"still {status}: {cause[:120]}"
            print(f"{name:<22} {cls:<45} {verdict}")
        print(f"wrote {output / 'recheck.json'}")
        return 130 if summary.interrupted else 0
    print(summary.headline())
    if summary.interrupted:
        print(f"interrupted: {summary.tried} results kept in {output / RESULTS_FILE}; run the same command to resume",
              file=sys.stderr)
        return 130
    print(f"results in {output / RESULTS_FILE}, report in {output / 'report.md'} and {output / 'index.html'}")
    return 0
