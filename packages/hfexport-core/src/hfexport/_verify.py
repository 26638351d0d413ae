"""``hfexport verify DIR``: check a saved artifact as :func:`hfexport.load` does, say what was checked, re-run it.

1. the manifest against its schema, and every file it names inside the directory;
2. every file's size and SHA-256 against the manifest;
3. every component opened on its runtime with no code run from the artifact;
4. the default component run on inputs built from the manifest's input descriptions (vocabulary from the saved
   ``config.json``): outputs finite and of the recorded shapes;
5. every component's stored verification inputs (``verification.safetensors``, written by the export's own
   verification) re-run on the runtime and compared with the stored eager outputs, with the stored tolerances:
   no model needed (:meth:`ExportedModel.verify_stored`);
6. with ``--model DIR`` (the exported model), the backend's sample inputs compared with eager PyTorch.

A check that fails raises (the CLI prints one line and exits 1); a mismatch of 5 or 6 exits 3.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["inputs_from_manifest", "verify_artifact"]


def _shape_text(inputs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={list(v.shape)}" for k, v in inputs.items() if hasattr(v, "shape"))


def inputs_from_manifest(section: Mapping[str, Any], config: Mapping[str, Any] | None = None, *,
                         max_bytes: int | None = None) -> dict[str, Any] | None:
    """Inputs of the traced shapes and dtypes a component's manifest section describes: token ids below the
    config's ``vocab_size``, masks of ones, positions ``0 .. seq - 1``, a scalar count (a decoder's
    ``past_length``, an LLM runner's ``input_pos``) of 0, floats from a seeded normal. ``None`` when an input is a pytree (a cache) or its shape is
    not known.

    Raises:
        ValueError: the shapes describe more than ``max_bytes`` of inputs (checked before anything is allocated).
    """
    import torch

    from ._named_types import torch_dtype

    generator = torch.Generator().manual_seed(0)
    vocab = int((config or {}).get("vocab_size") or 2)
    described, total = [], 0
    for entry in section.get("inputs", []):
        shape = entry.get("example_shape") or entry.get("shape")
        dtype = torch_dtype(entry.get("dtype"))
        if entry.get("leaves", 1) != 1 or not isinstance(dtype, torch.dtype) or not isinstance(shape, list) \
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            return None
        numel = 1
        for d in shape:
            numel *= d
        total += numel * dtype.itemsize
        if max_bytes is not None and total > max_bytes:
            raise ValueError(f"the manifest describes inputs of more than {max_bytes:,} bytes (at {entry['name']!r}: "
                             f"{shape}): the artifact is damaged or crafted")
        described.append((entry, shape, dtype))
    inputs: dict[str, Any] = {}
    for entry, shape, dtype in described:
        name = entry["name"]
        if dtype == torch.bool:
            value = torch.ones(shape, dtype=dtype)
        elif dtype.is_floating_point:
            value = torch.randn(shape, generator=generator).to(dtype)
        elif "mask" in name:
            value = torch.ones(shape, dtype=dtype)
        elif not shape or name in ("past_length", "input_pos"):  # cached positions (a decoder's; ExecuTorch's LLM
            # runner's first position): none yet
            value = torch.zeros(shape, dtype=dtype)
        elif "position" in name:  # positions 0 .. seq - 1 (random ids would index past the position table)
            value = torch.arange(shape[-1], dtype=dtype).expand(shape).contiguous()
        elif name == "token_type_ids":  # ids of a segment vocabulary (BERT's has 2), not of the token vocabulary
            segments = int((config or {}).get("type_vocab_size") or 1)
            value = torch.randint(0, max(1, segments), shape, generator=generator, dtype=dtype)
        else:
            value = torch.randint(0, max(1, min(vocab, 1000)), shape, generator=generator, dtype=dtype)
        inputs[name] = value
    return inputs


def _run_check(loaded: Any, config: Mapping[str, Any] | None) -> str | None:
    """Run the default component on inputs from its manifest; what it found (raises on a bad output); None when
    the manifest does not fix its inputs' shapes (nothing ran)."""
    import torch

    component = loaded.default_component
    section = loaded._section(component)
    from ._stored import built_inputs_budget

    inputs = inputs_from_manifest(section, config, max_bytes=built_inputs_budget(loaded.manifest))
    if inputs is None:
        return None
    with torch.no_grad():
        outputs = loaded.run(component.name, **inputs)
    from ._artifact import flatten_with_names

    names, leaves, _ = flatten_with_names(outputs)
    recorded = {o["name"]: o.get("shape") for o in section.get("outputs", [])}
    problems = []
    for name, leaf in zip(names, leaves, strict=True):
        if not isinstance(leaf, torch.Tensor):
            continue
        if (leaf.is_floating_point() or leaf.is_complex()) and not bool(torch.isfinite(leaf).all()):
            problems.append(f"{name} holds NaN or Inf")
        shape = recorded.get(name)
        if isinstance(shape, list) and all(isinstance(d, int) for d in shape) and list(leaf.shape) != shape:
            problems.append(f"{name} has shape {list(leaf.shape)} where the manifest records {shape}")
    if problems:
        raise ValueError(f"component {component.name!r} ran at {_shape_text(inputs)} but: {'; '.join(problems)}")
    return (f"component {component.name!r} at {_shape_text(inputs)}: {len(leaves)} outputs, finite, "
            "shapes as recorded")


def verify_artifact(path: str | Path, *, model: str | Path | None = None, atol: float | None = None,
                    rtol: float | None = None,
                    trust_remote_code: bool = False, run: bool = True,
                    out: Callable[[str], None] = print) -> int:
    """Check the artifact at ``path`` and print one line per check; return the exit status (0, or 3 when the
    eager comparison fails). ``atol``/``rtol`` of the eager comparison default to those the export verified with
    (the manifest's ``verification``), else 1e-4 / 1e-3.

    Raises:
        hfexport.ManifestError, ValueError, FileNotFoundError, hfexport.IntegrityError,
        hfexport.UntrustedArtifactError: a check failed (the lines before say what passed).
    """
    from ._api import open_artifact
    from ._artifact import read_manifest
    from ._artifact_files import check_integrity
    from ._trust import manifest_file_refs

    path = Path(path)
    manifest = read_manifest(path)
    components = list(manifest.get("components") or {"model": manifest})
    out(f"✅ manifest  schema {manifest['schema_version']}, backend {manifest['backend']}, "
        f"{manifest.get('model_class', '?')}, components: {', '.join(components)}")
    out(f"✅ paths     {len({n for _, n in manifest_file_refs(manifest)})} files named, all inside {path}")
    checked = check_integrity(path, manifest, trust_remote_code=trust_remote_code)
    if checked["files"]:
        out(f"✅ hashes    {checked['files']} files, {checked['bytes']:,} bytes: sizes and SHA-256 match the manifest")
    else:
        out(f"·  hashes    none recorded (schema {manifest['schema_version']}): contents not checked")
    loaded = open_artifact(path, manifest, trust_remote_code=trust_remote_code)
    out(f"✅ loading   {len(loaded.components)} component(s) opened on {loaded.backend}"
        + (" with trust_remote_code" if trust_remote_code else ", no code run from the artifact"))
    config = None
    if (path / "config.json").is_file() and "config.json" in manifest.get("files", []):
        try:
            config = json.loads((path / "config.json").read_text())
        except ValueError:
            config = None
    status = 0
    if run:
        ran = _run_check(loaded, config)
        out(f"✅ run       {ran}" if ran is not None else
            f"·  run       not run: component {loaded.default_component.name!r} takes inputs whose shapes the "
            "manifest does not fix (a cache, a pytree)")
        status = _stored_check(loaded, out)
    stored = manifest.get("verification")
    if isinstance(stored, dict):
        out(f"·  recorded  {_recorded_text(stored)}")
    if model is None:
        out("·  eager     not compared: pass --model DIR (the exported model) to compare with eager PyTorch")
        return status
    from ._discovery import get_backend

    exporter_class = get_backend(manifest["backend"]).load_exporter()
    reference = exporter_class.load_model(model)
    inputs = exporter_class.sample_inputs(reference, loaded.manifest)
    if inputs is not None:  # the sample inputs of a full export; this one may take fewer (only input_ids)
        inputs = {k: v for k, v in inputs.items() if k in loaded.input_names}
    if inputs is None or set(inputs) != set(loaded.input_names):
        out(f"·  eager     not compared: backend {manifest['backend']!r} gives no sample inputs for this model's "
            f"program inputs {loaded.input_names}")
        return status
    recorded = stored if isinstance(stored, dict) else {}
    atol = _tolerance(recorded.get("atol"), 1e-4) if atol is None else atol
    rtol = _tolerance(recorded.get("rtol"), 1e-3) if rtol is None else rtol
    report = loaded.verify(inputs, atol=atol, rtol=rtol, reference=reference)
    out(f"{'✅' if report.passed else '❌'} eager     at {_shape_text(inputs)}:")
    out(str(report))
    return status if report.passed else 3


def _recorded_text(stored: Mapping[str, Any]) -> str:
    """The export's own verification as export.json records it, in words: its verdict and what it measured (a max
    abs diff, token ids against eager generation, a quantized export's cosine), nothing it did not measure."""
    verdict = "PASSED" if stored.get("passed") else "FAILED"
    shapes = ", ".join(f"{k}={v}" for k, v in (stored.get("inputs") or {}).items()
                       if isinstance(v, list))
    what = ""
    diff = stored.get("max_abs_diff")
    if stored.get("kind") == "generation":
        difference = stored.get("first_difference")
        what = (f"greedy token ids {'equal' if difference is None else 'differ from'} "
                f"{stored.get('reference') or 'eager generate'}"
                + (f" ({difference})" if difference is not None else ""))
        if isinstance(stored.get("token_agreement"), int | float):
            what += f", {stored['token_agreement']:.0%} of the new tokens agree (quantized)"
    elif isinstance(diff, int | float) and not isinstance(diff, bool):
        what = f"max abs diff {diff:.3e}"
    return f"verification {verdict}" + (f", {what}" if what else "") + (f" at {shapes}" if shapes else "")


def _tolerance(recorded: Any, default: float) -> float:
    """A tolerance the manifest records (untrusted input): a non-negative number, else ``default``."""
    if isinstance(recorded, int | float) and not isinstance(recorded, bool) and 0 <= recorded < float("inf"):
        return float(recorded)
    return default


def _stored_check(loaded: Any, out: Callable[[str], None]) -> int:
    """Re-run every component's stored verification inputs; print what happened; 3 on a mismatch, else 0."""
    stores = [c for c in loaded.components.values()
              if isinstance((loaded._section(c).get("verification") or {}).get("stored"), dict)]
    if not stores:
        out("·  stored    no stored verification inputs (exported before hfexport stored them, or inputs that are "
            "not plain tensors): pass --model DIR to compare with eager PyTorch")
        return 0
    status = 0
    for name, report in loaded.verify_stored().items():
        outputs = f"{len(report.outputs)} output{'s' if len(report.outputs) != 1 else ''}"
        if report.passed:
            out(f"✅ stored    component {name!r} re-ran its stored inputs ({_shape_text_of(report.inputs)}): "
                f"{outputs} within atol={report.atol:g}, rtol={report.rtol:g} of the stored eager outputs, max abs "
                f"diff {report.max_abs_diff:.3e}")
        else:
            status = 3
            out(f"❌ stored    component {name!r} re-ran its stored inputs ({_shape_text_of(report.inputs)}): "
                "outputs differ from the stored eager outputs")
            out(str(report))
    return status


def _shape_text_of(shapes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shapes.items())
