"""Reports of ``hfexport sweep``: ``report.md`` and a static ``index.html`` per results directory.

Both are generated from ``results.jsonl`` and ``meta.json`` alone (no torch), so they can be rebuilt at any
time (``hfexport sweep --backend B --report-only``). Every results directory found beside the one being
reported (the *reports root*, e.g. ``reports/dynamo``, ``reports/onnx``) feeds the coverage matrix:
one row per architecture (model type), one column per backend, each cell coloured by status.

When the benchmark ``benchmarks/bench_sweep.py`` has written ``peer.json`` into a results directory (the
same cases run through the peer ``transformers.exporters``), the report compares the ok counts and lists
the cases that the peer passes and hfexport does not, with their causes.
"""

from __future__ import annotations

import datetime
import html
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .results import (
    COMMON_ARCHITECTURES,
    META_FILE,
    META_KIND,
    RESULTS_FILE,
    STATUSES,
    TRACED_STATUSES,
    default_zoo_shapes,
    load_results,
)

__all__ = ["PEER_FILE", "cause_key", "find_sweeps", "render_html", "render_markdown", "summarize", "vision_traced",
           "write_reports"]

PEER_FILE = "peer.json"
FAILURES = ("export_error", "runtime_error", "mismatch", "timeout")
COLORS = {
    "ok": "#2da44e", "partial": "#a6d96a", "mismatch": "#fdae61", "runtime_error": "#f46d43",
    "export_error": "#d73027", "timeout": "#8e6bb8", "skipped": "#9aa0a6", "not_instantiable": "#e4e4e4",
    "not run": "#ffffff",
}
LEGEND = {
    "ok": "every instantiable class exports and verifies", "partial": "some classes ok",
    "mismatch": "none ok; mostly outputs differ", "runtime_error": "none ok; mostly the artifact fails to run",
    "export_error": "none ok; mostly the export fails", "timeout": "none ok; mostly timeouts",
    "skipped": "in EXPORT_SKIPS", "not_instantiable": "no class builds from a tiny config", "not run": "not swept",
}


def cause_key(record: Mapping[str, Any]) -> str:
    """The group a failure belongs to: its cause with numbers, sizes and model names blanked out.

    Args:
        record: a results record.

    Returns:
        ``"<stage> | <normalised cause>"`` (the stage is left out for ``not_instantiable`` and ``skipped``).
    """
    cause = str(record.get("cause") or record.get("reason") or "unknown")
    cause = re.sub(r"0x[0-9a-fA-F]+", "0x_", cause)
    cause = re.sub(r"\b[A-Z][A-Za-z0-9]*(?:Model|For[A-Za-z]+|Config|Attention|Layer|Encoder|Decoder|Embeddings?|"
                   r"Block|Module|MLP|Router|Experts?)\b", "<Class>", cause)
    cause = re.sub(r"(?<![A-Za-z_])[us]\d+\b", "uN", cause)
    cause = re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", cause)
    cause = re.sub(r"\[(?:N, )*N\]|\((?:N, )*N\)", "[shape]", cause)
    cause = re.sub(r"\s+", " ", cause).strip()
    if len(cause) > 160:
        cause = cause[:157] + "..."
    stage = record.get("stage") if record.get("status") in FAILURES else None
    return f"{stage} | {cause}" if stage else cause


def find_sweeps(root: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Results directories of every backend under ``root`` (one level deep).

    Args:
        root: the reports root (``reports/``).

    Returns:
        ``{backend: (directory, meta)}``, sorted by backend name.
    """
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    if not root.is_dir():
        return found
    for meta_path in sorted(root.glob(f"*/{META_FILE}")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("kind") == META_KIND and (meta_path.parent / RESULTS_FILE).exists():
            found.setdefault(meta["backend"], (meta_path.parent, meta))
    return dict(sorted(found.items()))


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Headline figures of a set of records.

    Args:
        records: results records of one backend.

    Returns:
        ``tried``, ``instantiable``, ``ok``, ``ok_pct`` (of instantiable) and ``by_status`` (a Counter).
    """
    by_status = Counter(r["status"] for r in records)
    tried = len(records)
    instantiable = tried - by_status["not_instantiable"]
    ok = by_status["ok"]
    return {"tried": tried, "instantiable": instantiable, "ok": ok,
            "ok_pct": round(100 * ok / instantiable, 1) if instantiable else 0.0, "by_status": by_status}


def _arch_status(records: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """Cell status and text of one architecture on one backend."""
    recs = list(records)
    if not recs:
        return "not run", ""
    statuses = Counter(r["status"] for r in recs)
    inst = [r for r in recs if r["status"] != "not_instantiable"]
    ok = statuses["ok"]
    text = f"{ok}/{len(inst)}" if inst else "n/i"
    if not inst:
        return "not_instantiable", text
    if ok == len(inst):
        return "ok", text
    if ok:
        return "partial", text
    failing = Counter(r["status"] for r in inst if r["status"] != "ok")
    return failing.most_common(1)[0][0], text


def _groups(records: Sequence[Mapping[str, Any]], statuses: Sequence[str]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r["status"] in statuses:
            groups[cause_key(r)].append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _examples(records: Sequence[Mapping[str, Any]], n: int) -> str:
    more = f" (+{len(records) - n})" if len(records) > n else ""
    return ", ".join(f"`{r['case_id']}`" for r in records[:n]) + more


def _md(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def _fmt_diff(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, int | float) else "–"


def _load_peer(directory: Path) -> dict[str, Any] | None:
    path = directory / PEER_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def peer_comparison(records: Sequence[Mapping[str, Any]], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Compare our records with the peer's on the cases both ran.

    Args:
        records: our records.
        peer: ``peer.json`` as written by ``benchmarks/bench_sweep.py`` (``records`` and the run's details).

    Returns:
        ``cases`` (compared), ``ours_ok``, ``peer_ok``, ``peer_only`` (records of ours where the peer is ok and
        we are not, with the peer's record under ``"peer"``) and ``ours_only`` (case ids we pass and it fails).
    """
    ours = {r["case_id"]: r for r in records}
    theirs = {r["case_id"]: r for r in peer.get("records", [])}
    common = sorted(set(ours) & set(theirs))
    peer_only = [{**ours[c], "peer": theirs[c]} for c in common
                 if theirs[c]["status"] == "ok" and ours[c]["status"] != "ok"]
    ours_only = [c for c in common if ours[c]["status"] == "ok" and theirs[c]["status"] != "ok"]
    return {"cases": len(common), "ours_ok": sum(ours[c]["status"] == "ok" for c in common),
            "peer_ok": sum(theirs[c]["status"] == "ok" for c in common), "peer_only": peer_only,
            "ours_only": ours_only}


def _coverage(meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    runs = meta.get("runs", [])
    total = next((r.get("zoo_cases") for r in reversed(runs) if r.get("zoo_cases")), None)
    filters = sorted({r.get("filter") or "" for r in runs if not r.get("recheck_skips")})
    zoo = "tester-zoo" if meta.get("zoo") == "testers" else "zoo"
    what = f"{len(records)} of {total} {zoo} cases" if total else f"{len(records)} {zoo} cases"
    selections = [r for r in runs if not r.get("recheck_skips")]
    if selections and all(r.get("common") for r in selections):  # a wider run (the whole sample) covers them
        what += (f": a stratified subset, every case of the {len(COMMON_ARCHITECTURES)} common architectures of "
                 f"`hfexport sweep --common` ({', '.join(COMMON_ARCHITECTURES)})")
    sampled = [r for r in runs if not r.get("recheck_skips") and r.get("sample_seed") is not None]
    if sampled:
        seeds = sorted({r["sample_seed"] for r in sampled})
        families = len({r.get("model_type") for r in records})
        size = next((r.get("sample_cases") for r in reversed(sampled) if r.get("sample_cases")), None)
        what += (f" ({families} model types): a seeded sample of one class per model type "
                 f"(`hfexport sweep --sample --seed {', '.join(map(str, seeds))}`"
                 f"{f', {size} cases in the whole sample' if size else ''})")
        if len(seeds) > 1 or len(sampled) < len([r for r in runs if not r.get("recheck_skips")]):
            what += " mixed with other selections"
    if filters and filters != [""]:
        what += " (filters: " + ", ".join(f"`{f}`" if f else "none" for f in filters) + ")"
    elif total and len(records) == total:
        what += ": the whole zoo"
    return what


def _observed(history: Mapping[str, Sequence[Mapping[str, Any]]], case_id: str) -> str:
    """What the sweep saw of a case before it was skipped (its last other record in results.jsonl)."""
    earlier = [r for r in history.get(case_id, []) if r["status"] != "skipped"]
    if not earlier:
        return ""
    last = earlier[-1]
    return f"{last['status']}: {last.get('cause') or ''}"


def load_history(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every record of every case in a ``results.jsonl``, oldest first (reruns and skips keep the old lines).

    Args:
        path: the ``results.jsonl`` file.

    Returns:
        ``{case_id: [record, ...]}``.
    """
    history: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "case_id" in record:
                history[record["case_id"]].append(record)
    return history


def _criterion(meta: Mapping[str, Any]) -> str:
    if meta.get("zoo") == "testers":
        return ("- Criterion: `hfexport.export(model, inputs, backend=..., dynamic=True)` on the model as its "
                "Transformers model tester builds it (the tester's config and inputs: `hfexport sweep --zoo testers`, "
                "`hfexport_sweep.tester_zoo`), then `exported.verify(..., atol=1e-4, rtol=1e-3)` at the tester's "
                "shape and at a second one: batch + 1 and another sequence length, an image twice the size where "
                "the model takes other sizes (`shapes_checked` in results.jsonl).")
    return ("- Criterion: `hfexport.export(model, inputs, backend=..., dynamic=True)` on the tiny zoo model, then "
            "`exported.verify(alt_inputs, atol=1e-4, rtol=1e-3)` at the next batch and another sequence length: "
            f"{default_zoo_shapes(meta.get('zoo_inputs'))}.")


UPSTREAM_REASONS: tuple[tuple[str, str, str], ...] = (
    ("^dinov2/", "Guard failed|ONNXRuntimeError|execute\\(\\) failed",
     "transformers' Dinov2 interpolate_pos_encoding returns the position table as is when the patch count is the "
     "config's (`num_patches == num_positions and height == width`), a branch on the size: traced at the tester's "
     "30 pixels, the program keeps that branch and 60 pixels fails its guard (the peer fails it too)"),
    ("^mobilenet_v2/", "is static", "transformers' MobileNetV2 apply_tf_padding reads `int(features.shape[-2])`, so "
     "torch.export fixes H and W at the traced 32: hfexport refuses other sizes; the peer's ONNX runs them "
     "unchecked and is right only where the TF padding happens to be the same (64x64; 93% off eager at 33x33)"),
    ("^mobilevit/", "Guard failed|ONNXRuntimeError|execute\\(\\) failed",
     "transformers' MobileViT unfolding interpolates only when the feature map does not divide into patches, a "
     "Python branch on the size (the guard ceil(h / patch) * patch == 4): traced at 32 pixels, 64 takes the other "
     "branch"),
    ("^sew/", "Guard failed", "transformers' SEW upsampling pads to the input's length in a Python branch on the "
     "lengths (`if pad_length > 0`); the .pt2 program checks the traced branch's guard (the ONNX program, "
     "unchecked, matches eager)"),
    ("^mamba2/", "Guard failed|INVALID_ARGUMENT|execute\\(\\) failed",
     "transformers' Mamba2 torch_forward pads the sequence to whole chunks (chunk_size 8) and branches on the "
     "chunk count: traced at 7 tokens (one chunk), the program keeps the one-chunk path (guard: padded length <= 8)"),
    ("^minicpm(_ocr|v4_6|v4_7)/", "possible memo disaster", "torch's run_decompositions, which ExecuTorch's "
     "to_edge retraces the program through, makes the unbacked size of the vision merger's per-image slice again "
     "(`hidden_states[0, start:start + num_patches]`, bounds read from `target_sizes`) and asserts on the recreated "
     "symbol (pytorch/pytorch#154647, open); torch.export and the dynamo and ONNX backends pass"),
    ("^bit/", "differ beyond", "the lowered program (XNNPACK's fp32 kernels for the convolutions, portable ones "
     "for the rest) rounds differently from ATen: at 224x224 the error is 1e-4 to 3e-4 at every position of BiT's "
     "last hidden state (|eager| up to 5.2), and 13 of its 62,720 values fall outside atol 1e-4 + rtol 1e-3 (ONNX "
     "Runtime: 2.8e-5). Spread evenly, not one wrong place; the same with the standardized weights computed in "
     "eager, and no op without an XNNPACK kernel can be left out of the delegate to compare (max_pool2d has no "
     "portable kernel)"),
    ("^llava/", "is static|static shape", "transformers' LLaVA get_image_features makes a list of one tensor per "
     "image (`list(image_features)`), which fixes the number of images, so the batch, at the traced 3"),
)
"""``(regular expression searched in the case id, one searched in the failure's cause, the reason)``: failures
whose fix is not hfexport's (the model's code in transformers, a toolchain), named in the report: beside the
cases that pass on dynamo and fail on another backend (each has such a reason or is hfexport's to fix) and beside
the cases the peer passes and hfexport does not."""


def upstream_reason(record: Mapping[str, Any]) -> str | None:
    """The named upstream reason of a failed record (:data:`UPSTREAM_REASONS`), or None."""
    text = f"{record.get('cause') or ''} {record.get('error') or ''} {record.get('dynamic_error') or ''}"
    return next((why for case, pattern, why in UPSTREAM_REASONS
                 if re.search(case, record.get("case_id", "")) and re.search(pattern, text)), None)


def _against_dynamo(backend: str, records: Sequence[Mapping[str, Any]],
                    sweeps: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Markdown lines: the cases ok on dynamo (the sweep beside this one) that are not ok here, each with its
    cause and named upstream reason."""
    if backend == "dynamo" or "dynamo" not in sweeps:
        return []
    dynamo_ok = {r["case_id"] for r in sweeps["dynamo"] if r["status"] == "ok"}
    here = {r["case_id"]: r for r in records}
    compared = sorted(dynamo_ok & set(here))
    missing = [here[c] for c in compared if here[c]["status"] != "ok"]
    static = sum(here[c].get("shapes") == "static" and here[c]["status"] == "ok" for c in compared)
    lines = ["", "## Against dynamo", "",
             f"Of the {len(compared)} cases ok on dynamo beside this sweep, {len(compared) - len(missing)} are ok here"
             + (f" ({static} of them as static exports)" if static else "") + "."]
    if missing:
        named = sum(upstream_reason(r) is not None for r in missing)
        lines += [f"The {len(missing)} others ({named} with a named upstream reason):", "",
                  "| case | status | cause | upstream reason |", "|---|---|---|---|"]
        lines += [f"| `{r['case_id']}` | {r['status']} | {_md((r.get('cause') or '')[:200])} | "
                  f"{_md(upstream_reason(r) or 'none named: hfexport to look at')} |" for r in missing]
    return lines


def _stage(record: Mapping[str, Any]) -> str:
    return record.get("stage") or {"mismatch": "verify", "runtime_error": "verify"}.get(record["status"], "?")



def vision_traced(record: Mapping[str, Any]) -> bool:
    """Whether a multimodal record's export traced its vision (or audio) tower: its inputs held images (audio) and
    the export produced a program (``vision_traced`` in the record; derived for records written before it was)."""
    if "vision_traced" in record:
        return bool(record["vision_traced"])
    images = record.get("images")
    return bool(images) and not str(images).startswith("text only") and record.get("status") in TRACED_STATUSES


def _multimodal_lines(records: Sequence[Mapping[str, Any]],
                      sweeps: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Markdown lines on the multimodal cases: how many had images or audio, how many traced their vision (audio)
    tower, per backend under the reports root, and the cases still traced text-only, each with its reason."""
    multimodal = [r for r in records if r.get("modality") == "multimodal"]
    if not multimodal:
        return []
    lines = ["", "### Multimodal cases: vision (audio) towers traced", "",
             "A multimodal case gets one image (or audio clip) laid out as its processor would, from the config "
             "(`images` in results.jsonl says which kind); `vision traced`: its export, with those inputs, produced a "
             "program (ok, mismatch or runtime_error).", "",
             "| backend | multimodal cases | with images or audio | vision traced | of them ok |",
             "|---|---:|---:|---:|---:|"]
    for name, recs in {**sweeps, **({} if sweeps else {"this sweep": records})}.items():
        mm = [r for r in recs if r.get("modality") == "multimodal"]
        if not mm:
            continue
        media = [r for r in mm if r.get("images") and not str(r["images"]).startswith("text only")]
        traced = [r for r in mm if vision_traced(r)]
        lines.append(f"| {name} | {len(mm)} | {len(media)} | {len(traced)} | "
                     f"{sum(r['status'] == 'ok' for r in traced)} |")
    text_only = [r for r in multimodal if not vision_traced(r)]
    if text_only:
        lines += ["", f"The {len(text_only)} multimodal cases of this sweep whose vision (audio) tower was not traced, "
                  "and why:", "", "| case | status | why |", "|---|---|---|"]
        for r in sorted(text_only, key=lambda r: r["case_id"]):
            images = str(r.get("images") or "")
            why = (images if images.startswith("text only") else f"export with {images}: {r.get('cause') or ''}"
                   if images else f"not built: {r.get('reason') or r.get('cause') or ''}")
            lines.append(f"| `{r['case_id']}` | {r['status']} | {_md(why[:220])} |")
    return lines


def render_markdown(backend: str, meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                    sweeps: Mapping[str, Sequence[Mapping[str, Any]]], peer: Mapping[str, Any] | None = None,
                    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> str:
    """The markdown report of one backend's sweep.

    Args:
        backend: the backend reported on.
        meta: its ``meta.json``.
        records: its records.
        sweeps: records of every backend found under the reports root (for the cross-backend summary).
        peer: its ``peer.json``, if the peer benchmark wrote one.
        history: every record of every case (:func:`load_history`), to show what a skipped case did before.

    Returns:
        The markdown text.
    """
    s = summarize(records)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
    lines = [f"# hfexport sweep: `{backend}`", "",
             f"Generated {now} from `{RESULTS_FILE}`: {_coverage(meta, records)}.", "",
             f"- Backend: `{backend}` from {meta.get('backend_distribution', '?')}",
             f"- Tested versions: {versions}, Python {meta.get('python', '?')}",
             _criterion(meta),
             "- Commands that produced these results (run from the repository root):", ""]
    for run in meta.get("runs", []):
        if run.get("recheck_skips"):
            continue
        lines.append(f"  - `{run.get('command', '?')}` — started {run.get('started', '?')}, finished "
                     f"{run.get('finished', '?')}, {run.get('ran', '?')} cases run"
                     f"{' (interrupted, resumed later)' if run.get('interrupted') else ''}")
    lines += ["", "## Summary", "", "| tried | instantiable | ok | ok % of instantiable |", "|---:|---:|---:|---:|",
              f"| {s['tried']} | {s['instantiable']} | {s['ok']} | {s['ok_pct']}% |", "",
              "| status | cases |", "|---|---:|"]
    lines += [f"| {st} | {s['by_status'][st]} |" for st in STATUSES if s["by_status"][st]]
    static = [r for r in records if r.get("shapes") == "static"]
    if static:  # ExecuTorch: the dynamic export failed and a static one was verified at the traced shape
        static_ok = sum(r["status"] == "ok" for r in static)
        lines += ["", f"{static_ok} of the ok cases are static exports (and {len(static) - static_ok} static exports "
                  "failed their check): the dynamic export failed, so the case was exported with `dynamic=False` and "
                  "verified at the traced shape (`shapes: \"static\"` and `dynamic_error` in results.jsonl). "
                  "Why the dynamic export failed:", "", "| cases | dynamic export error | examples |",
                  "|---:|---|---|"]
        by_error: dict[str, list[str]] = defaultdict(list)
        for r in static:
            by_error[cause_key({"cause": r.get("dynamic_error")})].append(r["case_id"])  # dynamic_error has the stage
        for error, cases in sorted(by_error.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"| {len(cases)} | {_md(error[:200])} | {', '.join(f'`{c}`' for c in cases[:3])} |")
    lines += _multimodal_lines(records, sweeps)
    # per modality
    lines += ["", "### By modality", "", "| modality | tried | instantiable | ok | export_error | runtime_error | "
              "mismatch | timeout | skipped |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_mod: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_mod[r.get("modality", "?")].append(r)
    for mod, recs in sorted(by_mod.items(), key=lambda kv: -len(kv[1])):
        m = summarize(recs)
        c = m["by_status"]
        lines.append(f"| {mod} | {m['tried']} | {m['instantiable']} | {m['ok']} | {c['export_error']} | "
                     f"{c['runtime_error']} | {c['mismatch']} | {c['timeout']} | {c['skipped']} |")
    # other backends
    if len(sweeps) > 1:
        lines += ["", "### Every backend under the reports root", "", "| backend | tried | instantiable | ok | ok % |",
                  "|---|---:|---:|---:|---:|"]
        for name, recs in sweeps.items():
            m = summarize(recs)
            lines.append(f"| {name} | {m['tried']} | {m['instantiable']} | {m['ok']} | {m['ok_pct']}% |")
    lines += _against_dynamo(backend, records, sweeps)
    # failures by stage
    stages = Counter(_stage(r) for r in records if r["status"] in FAILURES)
    if stages:
        lines += ["", "## Failures by stage", "", "| stage | cases |", "|---|---:|"]
        lines += [f"| {_md(st)} | {n} |" for st, n in stages.most_common()]
    # failures grouped by cause
    groups = _groups(records, FAILURES)
    if groups:
        lines += ["", "## Failures grouped by cause", "",
                  "Causes with numbers, shapes and model class names blanked out; `where` is the innermost "
                  "Transformers frame of the first case.", "",
                  "| cases | status | stage \\| cause | where | examples |", "|---:|---|---|---|---|"]
        for key, recs in groups:
            statuses = "/".join(sorted({r["status"] for r in recs}))
            where = next((r.get("where") for r in recs if r.get("where")), "")
            examples = _examples(recs, 4)
            lines.append(f"| {len(recs)} | {statuses} | {_md(key)} | {_md(where)} | {examples} |")
        named = [(r["case_id"], why) for r in records if r["status"] in FAILURES and (why := upstream_reason(r))]
        if named:
            lines += ["", f"Failures with a named upstream reason ({len(named)}):", ""]
            lines += [f"- `{case}`: {_md(why)}" for case, why in sorted(named)]
    # peer
    if peer:
        cmp_ = peer_comparison(records, peer)
        lines += ["", "## Peer comparison (`transformers.exporters`)", "",
                  f"Run by `{peer.get('command', 'benchmarks/bench_sweep.py')}` on {peer.get('date', '?')}"
                  f"{' — ' + peer['note'] if peer.get('note') else ''}.", "",
                  "| cases compared | hfexport ok | peer ok |", "|---:|---:|---:|",
                  f"| {cmp_['cases']} | {cmp_['ours_ok']} | {cmp_['peer_ok']} |", ""]
        if cmp_["peer_only"]:
            lines += [f"Cases the peer passes and hfexport does not ({len(cmp_['peer_only'])}):", "",
                      "| case | our status | our stage | our cause | named reason |", "|---|---|---|---|---|"]
            lines += [f"| `{r['case_id']}` | {r['status']} | {_md(r.get('stage'))} | {_md(r.get('cause'))} | "
                      f"{_md(upstream_reason(r) or '')} |" for r in cmp_["peer_only"]]
        else:
            lines.append("The peer passes no case that hfexport fails.")
        if cmp_["ours_only"]:
            theirs = {r["case_id"]: r for r in peer.get("records", [])}
            lines += ["", f"Cases hfexport passes and the peer does not ({len(cmp_['ours_only'])}):", "",
                      "| case | peer status | peer cause |", "|---|---|---|"]
            lines += [f"| `{c}` | {theirs[c]['status']} | {_md((theirs[c].get('cause') or '')[:200])} |"
                      for c in cmp_["ours_only"]]
        noted = [r for r in peer.get("records", []) if r.get("note")]
        if noted:
            lines += ["", f"In the peer's favour: for {len(noted)} cases it returned more outputs than eager "
                          f"(e.g. `{noted[0]['case_id']}`: {_md(noted[0]['note'])}); only the outputs eager returns "
                          "were compared."]
    # mismatches, timeouts, skipped
    mism = sorted((r for r in records if r["status"] == "mismatch"), key=lambda r: r["case_id"])
    if mism:
        lines += ["", "## Mismatches", "", "| case | max abs diff | cause |", "|---|---:|---|"]
        lines += [f"| `{r['case_id']}` | {_fmt_diff(r.get('max_abs_diff'))} | {_md(r.get('cause'))} |" for r in mism]
    timeouts = sorted((r for r in records if r["status"] == "timeout"), key=lambda r: r["case_id"])
    if timeouts:
        lines += ["", "## Timeouts", "", ", ".join(f"`{r['case_id']}` ({r.get('stage')})" for r in timeouts)]
    skipped = sorted((r for r in records if r["status"] == "skipped"), key=lambda r: r["case_id"])
    if skipped:
        by_reason: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in skipped:
            by_reason[r.get("reason") or ""].append(r)
        lines += ["", "## Skipped (`EXPORT_SKIPS`)", "",
                  f"{len(skipped)} cases whose model class is listed in `hfexport_dynamo.EXPORT_SKIPS`, with the "
                  "model-side change that would make it exportable; `hfexport sweep --recheck-skips` runs them "
                  "again. *Observed* is what this sweep recorded before the class was listed.", "",
                  "| cases | reason | observed |", "|---|---|---|"]
        for reason, recs in sorted(by_reason.items(), key=lambda kv: kv[1][0]["case_id"]):
            observed = sorted({o for r in recs if (o := _observed(history or {}, r["case_id"]))})
            cases = ", ".join(f"`{r['case_id']}`" for r in recs)
            lines.append(f"| {cases} | {_md(reason)} | {_md('; '.join(observed)) or '–'} |")
    # not instantiable
    ni = _groups(records, ("not_instantiable",))
    if ni:
        lines += ["", "## Not instantiable, grouped by reason", "",
                  "Recorded without exporting: the tiny config, the model or its eager forward fails "
                  "(a zoo limitation, not an export failure).", "",
                  "<details><summary>" + f"{s['by_status']['not_instantiable']} cases, {len(ni)} reasons" +
                  "</summary>", "", "| cases | reason | examples |", "|---:|---|---|"]
        for key, recs in ni:
            examples = _examples(recs, 3)
            lines.append(f"| {len(recs)} | {_md(key)} | {examples} |")
        lines += ["", "</details>"]
    # slowest exports
    timed = sorted((r for r in records if isinstance(r.get("export_s"), int | float)), key=lambda r: -r["export_s"])
    if timed:
        total = sum(r["export_s"] for r in timed)
        lines += ["", "## Export time", "",
                  f"{len(timed)} exports, {total:.0f} s in all, median "
                  f"{sorted(r['export_s'] for r in timed)[len(timed) // 2]:.2f} s. Slowest:", "",
                  "| case | status | export s |", "|---|---|---:|"]
        lines += [f"| `{r['case_id']}` | {r['status']} | {r['export_s']:.1f} |" for r in timed[:10]]
    lines += ["", "The coverage matrix (architecture × backend) and every case are in `index.html`.", ""]
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top} th{background:#f6f8fa}
td.num,th.num{text-align:right} .cell{text-align:center;min-width:70px;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;padding:2px 8px;margin:2px;border:1px solid #d0d7de;font-size:12px}
code{font-size:12px} .muted{color:#57606a;font-size:13px} details{margin:8px 0}
.matrix td:first-child{white-space:nowrap}
"""


def _e(text: Any) -> str:
    return html.escape(str(text if text is not None else ""))


def render_html(backend: str, meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                sweeps: Mapping[str, Sequence[Mapping[str, Any]]], peer: Mapping[str, Any] | None = None) -> str:
    """The static HTML page of one backend's sweep, with the coverage matrix of every backend.

    Args:
        backend: the backend reported on.
        meta: its ``meta.json``.
        records: its records.
        sweeps: records of every backend found under the reports root (columns of the matrix).
        peer: its ``peer.json``, if the peer benchmark wrote one.

    Returns:
        A self-contained HTML document (inline CSS, no scripts).
    """
    s = summarize(records)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>hfexport sweep: {_e(backend)}</title><style>{_CSS}</style></head><body>",
           f"<h1>hfexport sweep: <code>{_e(backend)}</code></h1>",
           f"<p class='muted'>Generated {now} — {_e(_coverage(meta, records)).replace('`', '')} — backend from "
           f"{_e(meta.get('backend_distribution'))} — {_e(versions)}, Python {_e(meta.get('python'))}</p>",
           "<p class='muted'>Commands:<br>" + "<br>".join(
               f"<code>{_e(r.get('command'))}</code> (started {_e(r.get('started'))}, {_e(r.get('ran'))} cases run)"
               for r in meta.get("runs", []) if not r.get("recheck_skips")) + "</p>",
           "<h2>Summary</h2><table><tr><th class='num'>tried</th><th class='num'>instantiable</th>"
           "<th class='num'>ok</th><th class='num'>ok % of instantiable</th>"
           + "".join(f"<th class='num'>{st}</th>" for st in STATUSES[1:]) + "</tr>",
           f"<tr><td class='num'>{s['tried']}</td><td class='num'>{s['instantiable']}</td><td class='num'>{s['ok']}</td>"
           f"<td class='num'>{s['ok_pct']}%</td>"
           + "".join(f"<td class='num'>{s['by_status'][st]}</td>" for st in STATUSES[1:]) + "</tr></table>"]
    # coverage matrix
    backends = list(sweeps)
    by_arch: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for name, recs in sweeps.items():
        for r in recs:
            by_arch[r["model_type"]][name].append(r)
    out.append("<h2>Coverage matrix (architecture × backend)</h2><p class='legend'>"
               + "".join(f"<span style='background:{COLORS[k]}' title='{_e(v)}'>{_e(k)}</span>" for k, v in LEGEND.items())
               + "</p><p class='muted'>A cell shows ok / instantiable classes of the architecture; hover for each "
                 "class's status.</p>")
    out.append("<table class='matrix'><tr><th>architecture</th>" + "".join(
        f"<th class='cell'>{_e(b)}<br><span class='muted'>{summarize(sweeps[b])['ok']} ok</span></th>" for b in backends)
        + "</tr>")
    for arch in sorted(by_arch):
        row = [f"<tr><td>{_e(arch)}</td>"]
        for b in backends:
            recs = by_arch[arch].get(b, [])
            status, text = _arch_status(recs)
            tip = "&#10;".join(f"{_e(r['class_name'])}: {_e(r['status'])}"
                               + (f" — {_e((r.get('cause') or '')[:140])}" if r["status"] != "ok" else "")
                               for r in sorted(recs, key=lambda r: r["class_name"]))
            row.append(f"<td class='cell' style='background:{COLORS[status]}' title='{tip}'>{_e(text)}</td>")
        out.append("".join(row) + "</tr>")
    out.append("</table>")
    # failures grouped by cause
    groups = _groups(records, FAILURES)
    if groups:
        out.append(f"<h2>Failures grouped by cause ({sum(len(g) for _, g in groups)} cases, {len(groups)} causes)</h2>"
                   "<table><tr><th class='num'>cases</th><th>status</th><th>stage | cause</th><th>where</th>"
                   "<th>cases</th></tr>")
        for key, recs in groups:
            statuses = "/".join(sorted({r["status"] for r in recs}))
            where = next((r.get("where") for r in recs if r.get("where")), "")
            ids = ", ".join(_e(r["case_id"]) for r in recs[:12]) + (f" (+{len(recs) - 12})" if len(recs) > 12 else "")
            out.append(f"<tr><td class='num'>{len(recs)}</td><td style='background:{COLORS.get(statuses, '#fff')}'>"
                       f"{_e(statuses)}</td><td>{_e(key)}</td><td><code>{_e(where)}</code></td><td>{ids}</td></tr>")
        out.append("</table>")
    if peer:
        cmp_ = peer_comparison(records, peer)
        out.append("<h2>Peer comparison (transformers.exporters)</h2>"
                   f"<p>{cmp_['cases']} cases compared: hfexport ok {cmp_['ours_ok']}, peer ok {cmp_['peer_ok']}. "
                   f"Run by <code>{_e(peer.get('command'))}</code> on {_e(peer.get('date'))}.</p>")
        if cmp_["peer_only"]:
            out.append("<table><tr><th>case the peer passes, hfexport fails</th><th>status</th><th>stage</th>"
                       "<th>cause</th></tr>" + "".join(
                           f"<tr><td>{_e(r['case_id'])}</td><td>{_e(r['status'])}</td><td>{_e(r.get('stage'))}</td>"
                           f"<td>{_e(r.get('cause'))}</td></tr>" for r in cmp_["peer_only"]) + "</table>")
    # every case
    out.append(f"<h2>Every case</h2><details><summary>{len(records)} cases</summary><table><tr><th>case</th>"
               "<th>status</th><th>stage</th><th class='num'>export s</th><th class='num'>max abs diff</th>"
               "<th>cause / reason</th></tr>")
    for r in sorted(records, key=lambda r: r["case_id"]):
        export_s = f"{r['export_s']:.2f}" if isinstance(r.get("export_s"), int | float) else ""
        cause = "" if r["status"] == "ok" else r.get("cause") or r.get("reason") or ""
        out.append(f"<tr><td>{_e(r['case_id'])}</td><td style='background:{COLORS[r['status']]}'>{_e(r['status'])}</td>"
                   f"<td>{_e(r.get('stage') or '')}</td><td class='num'>{export_s}</td>"
                   f"<td class='num'>{_fmt_diff(r.get('max_abs_diff'))}</td><td>{_e(cause)}</td></tr>")
    out.append("</table></details></body></html>\n")
    return "\n".join(out)


def write_reports(output: Path, *, siblings: bool = True) -> list[Path]:
    """Write ``report.md`` and ``index.html`` into a results directory (and refresh its siblings' matrices).

    Args:
        output: the results directory (``reports/dynamo``).
        siblings: also rewrite the reports of the other backends under the same root, so that every page's
            coverage matrix shows every backend.

    Returns:
        The paths written.

    Raises:
        FileNotFoundError: ``output`` has no ``meta.json``.
    """
    output = Path(output)
    meta = json.loads((output / META_FILE).read_text())
    sweeps_found = find_sweeps(output.parent)
    sweeps_found.setdefault(meta["backend"], (output, meta))
    if sweeps_found[meta["backend"]][0].resolve() != output.resolve():
        sweeps_found[meta["backend"]] = (output, meta)  # two directories of one backend: this one wins
    sweeps = {name: load_results(d / RESULTS_FILE) for name, (d, _) in sweeps_found.items()}
    targets = [(meta["backend"], output, meta)]
    if siblings:
        targets += [(name, d, m) for name, (d, m) in sweeps_found.items() if d.resolve() != output.resolve()]
    written = []
    for name, directory, m in targets:
        records = sweeps[name]
        peer = _load_peer(directory)
        history = load_history(directory / RESULTS_FILE)
        for filename, text in (("report.md", render_markdown(name, m, records, sweeps, peer, history)),
                               ("index.html", render_html(name, m, records, sweeps, peer))):
            path = directory / filename
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            written.append(path)
    return written
