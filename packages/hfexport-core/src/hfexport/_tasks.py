"""Task exports: the programs of a task from one model (a decoder's one ``decoder`` program; an encoder-decoder's
encoder, first decoder step and decode step), run through the same backend one by one and packaged as one artifact
of named components.

The kernel knows no task: the exporter's tracer plans one (:meth:`Tracer.plan_task` returns a :class:`TaskPlan`
of modules, example inputs and dynamic shapes) and runs it (:meth:`Tracer.generate`). The pipeline
(:func:`hfexport._pipeline.export`) exports each planned component and :func:`merge_components` makes one
artifact of them; each component's files go into a folder of its own name, so that backends keep their fixed
file names (a task's only component whose deployment engine loads the artifact's root stays at the root).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._artifact import Component, ExportedModel

__all__ = ["ComponentPlan", "TaskPlan", "merge_components", "prefix_files"]


@dataclass
class ComponentPlan:
    """One program of a task export.

    Attributes:
        name: the component name (``"decoder"``, ``"encoder"``, ``"prefill"``, ``"decode"``); also its folder in the
            artifact.
        module: the ``nn.Module`` to export (a wrapper that calls the model and flattens its cache).
        inputs: example forward keyword arguments to trace with.
        dynamic_shapes: ``torch.export`` dynamic shapes keyed by input name (``Dim`` objects with bounds).
    """

    name: str
    module: Any
    inputs: dict[str, Any]
    dynamic_shapes: Mapping[str, Any] | None = None


@dataclass
class TaskPlan:
    """What a tracer plans for a task: the components in export order, and what the manifest records.

    Attributes:
        task: the task name (``"text-generation"``).
        components: the programs to export, in order.
        manifest: top-level manifest keys (``{"generation": {...}}``: token ids, cache layout, bounds).
        model: the model the components wrap (its class goes into the manifest; its config beside it).
    """

    task: str
    components: list[ComponentPlan]
    manifest: dict[str, Any] = field(default_factory=dict)
    model: Any = None


def prefix_files(section: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """``section`` with every ``*_file`` value (at any depth) prefixed by ``folder/``: the component's files
    lie in a folder of the artifact, and backends open ``path / section["program_file"]``. ``folder`` ``""``: the
    artifact's root, names unchanged."""
    if not folder:
        return dict(section)

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key.endswith("_file") and isinstance(value, str):
            return f"{folder}/{value}"
        return value

    return walk(section)


def _in_folder(component: Component, folder: str) -> Callable[[Path], list[str]] | None:
    """The component's writer, writing into ``directory / folder``; returns names relative to ``directory``."""
    write = component.write
    if write is None or not folder:
        return write

    def write_in_folder(directory: Path) -> list[str]:
        (directory / folder).mkdir(parents=True, exist_ok=True)
        written = write(directory / folder)
        return [f"{folder}/{name}" for name in (written if isinstance(written, list | tuple) else [])]

    return write_in_folder


def merge_components(exporter: Any, plan: TaskPlan, exported: list[tuple[ComponentPlan, ExportedModel]],
                     model: Any, seconds: float) -> ExportedModel:
    """One artifact of a task's exported components (:func:`hfexport._pipeline.export` exports them in turn).

    The manifest gets ``task``, the plan's keys, one section per component (its ``*_file`` names under the
    component's folder, its verification report) and the timings of each; the first component's keys also at the
    top level, as for one program. ``config.json`` is written once, by the first component's tracer files. A
    task's only component whose backend asks for it (``Component.at_root``: its deployment engine loads the
    artifact's root) keeps its files at the root.
    """
    components, sections, timings = [], {}, {}
    for part, artifact in exported:
        component = artifact.default_component
        folder = "" if component.at_root and len(exported) == 1 else part.name
        section = prefix_files(artifact.manifest["components"][component.name], folder)
        components.append(Component(part.name, component.runner, component.out_spec, _in_folder(component, folder),
                                    section, component.program, component.verification, component.at_root))
        sections[part.name] = section
        timings[part.name] = artifact.manifest.get("timings_s", {})
    first_name, first = exported[0][0].name, exported[0][1]
    model = plan.model if plan.model is not None else model
    workarounds: dict[str, Any] = {"patches": [], "skipped_patches": [], "fixes": {}}
    for _, artifact in exported:
        for key in ("patches", "skipped_patches"):
            workarounds[key].extend(p for p in artifact.manifest["workarounds"][key] if p not in workarounds[key])
        for fix, count in artifact.manifest["workarounds"]["fixes"].items():
            workarounds["fixes"][fix] = workarounds["fixes"].get(fix, 0) + count
    manifest = {
        **{k: v for k, v in first.manifest.items() if k not in ("components", "verification")},
        # the first component's keys at the top level, as for one program (each component's verification
        # stays in its own section)
        **{k: v for k, v in sections[first_name].items() if k != "verification"},
        "model_class": type(model).__name__,
        "model_module": type(model).__module__,
        "task": plan.task,
        "components": sections,
        "workarounds": workarounds,
        "notes": [f"{part.name}: {note}" for part, artifact in exported for note in artifact.manifest.get("notes", [])],
        "timings_s": {**timings, "total": round(seconds, 4)},
        **plan.manifest,
    }
    config = getattr(model, "config", None)
    extra_files = {}
    if config is not None and hasattr(config, "to_json_file"):
        extra_files["config.json"] = lambda d: config.to_json_file(d / "config.json")
    return ExportedModel(exporter.name, components, manifest, extra_files=extra_files,
                         generator=getattr(exporter.tracer, "generate", None))
