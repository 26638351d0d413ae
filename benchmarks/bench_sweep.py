"""Sweep benchmark: hfexport against the peer ``transformers.exporters`` on the same zoo cases, in one run.

For each ``--backend`` it runs ``hfexport sweep``'s machinery twice over the same tiny-zoo cases — once with
hfexport (``hfexport.export(..., dynamic=True)`` + ``verify``), once with the peer
(``transformers.exporters.<X>Exporter().export(model, inputs, <X>Config(dynamic=True))``, run on the peer's
runtime at the same alt inputs and compared with eager PyTorch with the same tolerances, atol 1e-4 /
rtol 1e-3) — each case in its own process with the same timeout, and prints both ok counts and the cases
the peer passes that hfexport fails (goal: hfexport ok >= peer ok on every backend).

Run from the repository root:

    uv run python benchmarks/bench_sweep.py --backend dynamo --filter '^(bert|llama|t5)/' --jobs 2
    uv run python benchmarks/bench_sweep.py --backend dynamo --ours-from reports/dynamo --write-peer
    uv run python benchmarks/bench_sweep.py --backend onnx --sample --seed 0 --ours-from reports/onnx --write-peer
    uv run python benchmarks/bench_sweep.py --zoo testers --backend dynamo --backend onnx --write-peer \
        --work /tmp/bench-testers

``--zoo testers`` runs both exporters on the tester zoo (``hfexport sweep --zoo testers``: each architecture as
Transformers' own model tester builds it, checked at the tester's shape and at a second one); hfexport's side
goes straight into ``reports/testers/<backend>`` (resumable, with its report), the peer's into ``--work``.

``--sample [--seed N]`` selects the same seeded sample as ``hfexport sweep --sample --seed N`` (one class per
model type), so that both sides run the same cases as the committed sample sweeps.

``--ours-from DIR`` takes hfexport's side from a finished sweep (``DIR/results.jsonl``) instead of running
it again, and runs the peer only on the cases that sweep found instantiable (the zoo build is the same for
both). ``--write-peer`` stores the peer's records as ``reports/<backend>/peer.json``, which the sweep report
turns into its "Peer comparison" section.

This script may import the peer; the product (``hfexport*``) never does.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # so that case processes import this module

# backend -> (peer exporter, peer config, config options, module to preload)
PEER_BACKENDS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "dynamo": ("DynamoExporter", "DynamoConfig", {}, "transformers.exporters.exporter_dynamo"),
    "onnx": ("OnnxExporter", "OnnxConfig", {}, "transformers.exporters.exporter_onnx"),
    "executorch-xnnpack": ("ExecutorchExporter", "ExecutorchConfig", {"backend": "xnnpack"},
                           "transformers.exporters.exporter_executorch"),
    "openvino": ("OpenVINOExporter", "OpenVINOConfig", {}, "transformers.exporters.exporter_openvino"),
}
PEER_RUNNER = "bench_sweep:peer_export_and_verify"


def peer_export_and_verify(model: Any, inputs: dict[str, Any], alt_inputs: dict[str, Any], backend: str,
                           atol: float, rtol: float, verify_traced: bool = False) -> dict[str, Any]:
    """Export one case with the peer and verify it like hfexport's sweep does (a sweep runner).

    Args:
        model: the tiny eval-mode model.
        inputs: forward kwargs to trace with.
        alt_inputs: forward kwargs to verify with (another batch and sequence length).
        backend: the hfexport backend name the peer backend is matched to.
        atol: absolute tolerance.
        rtol: relative tolerance.
        verify_traced: compare at ``inputs`` too, before ``alt_inputs`` (the tester zoo's criterion, as for
            hfexport's runner).

    Returns:
        The outcome fields of a sweep record (``status``, ``export_s``, ``max_abs_diff``, ``cause`` ...).
    """
    import transformers.exporters as peer

    from hfexport_sweep.sweep import failure_record

    exporter_name, config_name, options, _ = PEER_BACKENDS[backend]
    exporter, config = getattr(peer, exporter_name), getattr(peer, config_name)
    start = time.perf_counter()
    try:
        exported = exporter().export(model, dict(inputs), config(dynamic=True, **options))
    except Exception as exc:
        return failure_record("export_error", exc, stage="peer export",
                              export_s=round(time.perf_counter() - start, 3))
    export_s = round(time.perf_counter() - start, 3)
    if verify_traced:
        traced = _peer_compare(model, exported, inputs, backend, atol, rtol, export_s)
        if traced["status"] != "ok":
            return {**traced, "cause": f"at the traced shape: {traced.get('cause') or ''}"}
        return {**_peer_compare(model, exported, alt_inputs, backend, atol, rtol, export_s),
                "traced_max_abs_diff": traced.get("max_abs_diff")}
    return _peer_compare(model, exported, alt_inputs, backend, atol, rtol, export_s)


def _peer_compare(model: Any, exported: Any, alt_inputs: dict[str, Any], backend: str, atol: float, rtol: float,
                  export_s: float) -> dict[str, Any]:
    """Run the peer's program and eager PyTorch at ``alt_inputs`` and compare them (a sweep record's outcome)."""
    import torch

    from hfexport.artifact import compare_outputs, flatten_with_names
    from hfexport_sweep.sweep import failure_record

    start = time.perf_counter()
    note = ""
    try:
        with torch.no_grad():
            expected = model(**copy.deepcopy(alt_inputs))
            actual = exported(**copy.deepcopy(alt_inputs))
        names, leaves, _ = flatten_with_names(expected)
        act_names, act_leaves, _ = flatten_with_names(actual)
        if names != act_names and set(names) <= set(act_names):
            # The peer may return more than eager (a cache the call did not ask for): compare what eager returns.
            extra = sorted(set(act_names) - set(names))
            note = f"peer returned {len(extra)} extra outputs ({', '.join(extra[:3])}...), not compared"
            by_name = dict(zip(act_names, act_leaves, strict=True))
            expected, actual = dict(zip(names, leaves, strict=True)), {n: by_name[n] for n in names}
        report = compare_outputs(f"peer-{backend}", expected, actual, atol, rtol)
    except Exception as exc:
        return failure_record("runtime_error", exc, export_s=export_s)
    diff = report.max_abs_diff
    result = {"export_s": export_s, "verify_s": round(time.perf_counter() - start, 3),
              "max_abs_diff": diff if diff == diff and diff != float("inf") else None}
    if note:
        result["note"] = note
    if report.passed:
        return {"status": "ok", **result}
    return {"status": "mismatch", "cause": f"max abs diff {diff:.3g}", **result}


def _case_regex(case_ids: list[str]) -> str:
    return "^(?:" + "|".join(re.escape(c) for c in case_ids) + ")$"


def main() -> int:
    """Run the benchmark; print ok counts per backend and the cases only the peer passes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", action="append", choices=sorted(PEER_BACKENDS),
                        help="backend(s) to compare (repeatable; default dynamo)")
    parser.add_argument("--filter", help="regular expression searched in zoo case ids")
    parser.add_argument("--limit", type=int, help="only the first N matching cases")
    parser.add_argument("--common", action="store_true",
                        help="only the cases of the 60 common architectures (hfexport sweep --common)")
    parser.add_argument("--sample", action="store_true",
                        help="the seeded sample of one class per model type (hfexport sweep --sample)")
    parser.add_argument("--seed", type=int, default=None, help="the seed of --sample (default 0)")
    parser.add_argument("--with-our-failures", action="store_true",
                        help="with --ours-from: also run the peer on every instantiable case hfexport does not pass, "
                             "whatever --filter/--common select, so that no case the peer passes and we fail is missed")
    parser.add_argument("--jobs", type=int, default=2, help="case processes at once (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    parser.add_argument("--memory-limit", type=float, metavar="GIB",
                        help="kill a case process whose resident memory exceeds GIB, on both sides (hfexport sweep "
                             "--memory-limit; an ExecuTorch program planned for large default bounds allocates its "
                             "plan when it loads)")
    parser.add_argument("--ours-from", type=Path,
                        help="take hfexport's results from this sweep directory (with one backend) instead of "
                             "running them; the peer runs on its instantiable cases")
    parser.add_argument("--write-peer", action="store_true",
                        help="write the peer's records to reports/<backend>/peer.json for the sweep report")
    parser.add_argument("--zoo", choices=("default", "testers"), default="default",
                        help="the zoo (hfexport sweep --zoo): testers builds each architecture from Transformers' "
                             "model tester and checks both exporters at the tester's shape and at a second one; "
                             "hfexport's side then runs into <reports>/<backend> (resumable, with its report)")
    parser.add_argument("--reports", type=Path, default=None,
                        help="reports root (default reports/, reports/testers/ with --zoo testers)")
    parser.add_argument("--work", type=Path,
                        help="keep the sweeps' results here (ours-<backend>/, peer-<backend>/) instead of a temporary "
                             "directory, so that an interrupted comparison resumes where it stopped (run the same "
                             "command again; --limit N compares the first N cases, and a larger N later extends it)")
    args = parser.parse_args()
    if args.reports is None:
        args.reports = Path("reports") / ("testers" if args.zoo == "testers" else "")
    backends = args.backend or ["dynamo"]
    if args.ours_from and len(backends) > 1:
        parser.error("--ours-from takes one --backend")
    if args.seed is not None and not args.sample:
        parser.error("--seed is the seed of --sample; pass --sample --seed N")
    sample = (args.seed or 0) if args.sample else None

    from hfexport_sweep.results import COMMON_ARCHITECTURES, RESULTS_FILE, load_results
    from hfexport_sweep.sweep import SweepError, run_sweep
    from hfexport_sweep.zoo import sample_cases

    in_sample = {c.case_id for c in sample_cases(sample)} if sample is not None else None

    command = shlex.join(["python", "benchmarks/bench_sweep.py", *sys.argv[1:]])
    preload = [PEER_BACKENDS[b][3] for b in backends] + ["bench_sweep"]
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        tmp = str(args.work) if args.work else scratch
        for backend in backends:
            started = time.perf_counter()
            try:
                if args.ours_from:
                    everything = load_results(args.ours_from / RESULTS_FILE)
                    ours = [r for r in everything if (not args.filter or re.search(args.filter, r["case_id"]))
                            and (not args.common or r["model_type"] in COMMON_ARCHITECTURES)
                            and (in_sample is None or r["case_id"] in in_sample)]
                    ours = sorted(ours, key=lambda r: r["case_id"])[:args.limit] if args.limit else ours
                    if args.with_our_failures:
                        chosen = {r["case_id"] for r in ours}
                        ours += [r for r in everything if r["case_id"] not in chosen
                                 and r["status"] not in ("ok", "not_instantiable")]
                    runnable = sorted(r["case_id"] for r in ours if r["status"] != "not_instantiable")
                    peer_filter, peer_limit, peer_common, peer_sample = _case_regex(runnable), None, False, None
                    ours_how = f"from {args.ours_from / RESULTS_FILE}"
                else:
                    ours_out = args.reports / backend if args.zoo == "testers" else Path(tmp) / f"ours-{backend}"
                    summary = run_sweep(backend, filter=args.filter, limit=args.limit, common=args.common,
                                        sample=sample, jobs=args.jobs, timeout=args.timeout, output=ours_out,
                                        report=args.zoo == "testers", command=command, preload=preload, zoo=args.zoo,
                                        memory_limit=args.memory_limit)
                    ours = summary.records
                    peer_filter, peer_limit, peer_common, peer_sample = args.filter, args.limit, args.common, sample
                    ours_how = "run now"
                ours_s = time.perf_counter() - started
                started = time.perf_counter()
                peer = run_sweep(backend, filter=peer_filter, limit=peer_limit, common=peer_common,
                                 sample=peer_sample, jobs=args.jobs,
                                 timeout=args.timeout,
                                 output=Path(tmp) / f"peer-{backend}", report=False, runner=PEER_RUNNER,
                                 command=command, preload=preload, apply_skips=False, zoo=args.zoo,
                                 memory_limit=args.memory_limit).records
                peer_s = time.perf_counter() - started
            except SweepError as exc:
                print(f"error: {exc}", file=sys.stderr)
                failed = True
                continue
            ours_by = {r["case_id"]: r for r in ours}
            peer_by = {r["case_id"]: r for r in peer}
            common = sorted(set(ours_by) & set(peer_by))
            ours_ok = sum(ours_by[c]["status"] == "ok" for c in common)
            peer_ok = sum(peer_by[c]["status"] == "ok" for c in common)
            only_peer = [c for c in common if peer_by[c]["status"] == "ok" and ours_by[c]["status"] != "ok"]
            only_ours = [c for c in common if ours_by[c]["status"] == "ok" and peer_by[c]["status"] != "ok"]
            verdict = "goal met" if ours_ok >= peer_ok else "GOAL MISSED"
            print(f"\n{backend}: {len(common)} cases compared — hfexport ok {ours_ok} ({ours_how}, {ours_s:.0f} s), "
                  f"peer transformers.exporters ok {peer_ok} ({peer_s:.0f} s): {verdict}")
            print(f"  only hfexport ok: {len(only_ours)}; only the peer ok: {len(only_peer)}")
            for case in only_peer:
                r = ours_by[case]
                print(f"    {case}: ours {r['status']} at {r.get('stage')}: {(r.get('cause') or '')[:160]}")
            if args.write_peer:
                target = args.reports / backend
                target.mkdir(parents=True, exist_ok=True)
                selection = ("the cases of the 60 common architectures (--common)" if args.common else
                             f"the cases matching {args.filter!r}" if args.filter else "every zoo case")
                if args.zoo == "testers":
                    selection += (" of the tester zoo (--zoo testers: Transformers' model testers' configs and "
                                  "inputs, each case checked at the tester's shape and at a second one)")
                if sample is not None:
                    selection += (f" in the seeded sample of one class per model type (--sample --seed {sample}, "
                                  f"{len(in_sample)} cases)")
                if args.limit:
                    selection = f"the first {args.limit} (by case id) of {selection}"
                if args.with_our_failures:
                    selection += ", plus every instantiable case hfexport does not pass"
                note = (f"compared on {selection}; hfexport's side " +
                        ("read from this directory's results.jsonl, the peer run on its instantiable cases"
                         if args.ours_from else "ran in the same run"))
                (target / "peer.json").write_text(json.dumps({
                    "command": command, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "note": note, "peer": "transformers.exporters", "backend": backend, "cases": len(common),
                    "ours_ok": ours_ok, "peer_ok": peer_ok, "only_peer_ok": only_peer, "only_ours_ok": only_ours,
                    "records": peer}, indent=1) + "\n")
                print(f"  wrote {target / 'peer.json'}")
                if (target / RESULTS_FILE).exists():  # the sweep report gains its "Peer comparison" section
                    from hfexport_sweep.sweep_report import write_reports

                    write_reports(target)
                    print(f"  rewrote {target / 'report.md'} and {target / 'index.html'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
