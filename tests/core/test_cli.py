"""The hfexport console script: help teaches, backends lists, export refuses to clobber."""

import json
import re
import subprocess
import sys

import pytest

from hfexport import cli


def _run(*args):
    return subprocess.run([sys.executable, "-m", "hfexport.cli", *args], capture_output=True, text=True)


def test_help_teaches_by_example():
    out = _run("--help")
    assert out.returncode == 0
    assert "hfexport export --demo" in out.stdout and "--backend onnx" in out.stdout
    export_help = _run("export", "--help").stdout
    for flag in ("--demo", "--backend", "--output", "--dynamic", "--no-verify", "--overwrite"):
        assert flag in export_help


def test_backends_lists_name_distribution_version_status():
    """The version column is the distribution's, and says so; the toolchain's version beside it (issue 48)."""
    from importlib import metadata

    out = _run("backends", "--json")
    assert out.returncode == 0
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["openvino"]["toolchain"] == f"openvino {metadata.version('openvino')}"
    assert rows["dynamo"]["toolchain"] == f"torch {metadata.version('torch')}"
    assert rows["dynamo"]["distribution"] == "hfexport-dynamo" and rows["dynamo"]["status"] == "ok"
    assert rows["broken"]["status"] == "error" and "vendor_sdk" in rows["broken"]["error"]


def test_stages_lists_the_dynamo_reference():
    out = _run("stages", "dynamo").stdout.splitlines()[1:]
    assert [line.split(".", 1)[1].split("extension")[0].strip() for line in out if "→" not in line] == [
        "Forward signature patch", "Model patches", "Pytree registration", "Dynamic shapes", "State cleanup"]
    assert out[-1].split() == ["→", "capture", "runs", "torch.export.export"]  # the step after the stages


def test_stages_lists_the_steps_between_the_stages_in_running_order():
    out = [line.split()[:2] for line in _run("stages", "onnx").stdout.splitlines()[1:]]
    assert out == [["1.", "Torch"], ["2.", "ONNX"], ["→", "capture"], ["3.", "FX"], ["4.", "ONNX"],
                   ["→", "decompose"], ["→", "convert"], ["5.", "ONNX"], ["→", "optimize"], ["→", "fuse"],
                   ["→", "quantize"], ["→", "open"], ["→", "genai"]]


def test_export_refuses_non_empty_output_without_overwrite(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep")
    assert cli.main(["export", "--demo", "--output", str(tmp_path)]) == 2  # a usage error
    assert "error: output directory" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]


def test_export_unknown_backend_exits_2_and_names_the_distribution(tmp_path, capsys):
    assert cli.main(["export", "--demo", "--backend", "executorch-foo", "--output", str(tmp_path / "o")]) == 2
    assert "pip install --upgrade hfexport-executorch" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# What the demo may print on stderr: hfexport's own lines only (issue 27: no third-party warning or progress bar).
_OWN_LINE = re.compile(r"^(exporting |saved to |verifying |\[hfexport \d+\.\ds\] |warning: )")


def test_demo_export_end_to_end(tmp_path):
    """The README's first command as a user runs it (a new process, stderr a log), where an earlier run left its
    artifact (``out/dynamo``): the demo replaces its own default directory (an earlier export: it has
    ``export.json``) instead of refusing, and prints no third-party warning or progress bar."""
    earlier = tmp_path / "out" / "dynamo"
    earlier.mkdir(parents=True)
    (earlier / "export.json").write_text("{}")
    (earlier / "stale.bin").write_bytes(b"from the earlier run")
    run = subprocess.run([sys.executable, "-m", "hfexport.cli", "export", "--demo"], capture_output=True, text=True,
                         cwd=tmp_path)
    out, err = run.stdout, run.stderr
    assert run.returncode == 0, err
    foreign = [line for line in err.splitlines() if not _OWN_LINE.match(line)]
    assert not foreign, f"third-party lines in the demo's output: {foreign}"
    assert not (earlier / "stale.bin").exists()
    # stderr is no terminal here (a log): a plain line per stage start and end and per toolchain step, with the
    # seconds since the export began; transformers' per-weight loading bar is off inside hfexport's own loading
    assert re.search(r"^\[hfexport \d+\.\ds\] \[dynamo 5/5\] State cleanup done in \d+\.\d\ds$", err, re.M), err
    assert re.search(r"^\[hfexport \d+\.\ds\] → torch\.export\.export \.\.\.$", err, re.M), err
    assert re.search(r"^\[hfexport \d+\.\ds\] → torch\.export\.export done in \d+\.\d\ds$", err, re.M), err
    assert re.search(r"^\[hfexport \d+\.\ds\] \[dynamo 5/5\] State cleanup done in \d+\.\d\ds$", err, re.M), err
    assert "Loading weights" not in err
    assert "last_hidden_state" in out and "PASSED" in out
    assert (earlier / "model.pt2").exists()
    # export.json keeps the report of the verification of the saved files (written after it, atomically)
    report = json.loads((earlier / "export.json").read_text())["verification"]
    # the backend's tolerances (dynamo: 1e-4 / 1e-3), as the library's export and the sweep use
    assert report["passed"] is True and report["inputs"]["input_ids"] and (report["atol"], report["rtol"]) == (1e-4, 1e-3)
    assert report["outputs"][0]["name"] == "last_hidden_state" and isinstance(report["outputs"][0]["max_abs_diff"],
                                                                              float)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no lock, staging, retired or temporary manifest
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["dynamo"]


def test_demo_and_a_model_directory_together_are_a_usage_error(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path), "--demo", "--output", str(tmp_path / "o")]) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where,message", [("missing/report.md", "directory {parent} does not exist"),
                                           (".", "is a directory: give a file name")])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_export(tmp_path, capsys, where, message):
    report = tmp_path / where
    assert cli.main(["export", "--demo", "--output", str(tmp_path / "o"), "--report", str(report)]) == 2
    assert message.format(parent=report.parent) in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before any export


def test_a_quantize_recipe_the_backend_refuses_is_refused_before_the_model_loads(tmp_path, capsys):
    assert cli.main(["export", "--demo", "--backend", "dynamo", "--quantize", "int4", "-o", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    assert "backend 'dynamo' does not quantize (--quantize int4)" in captured.err
    assert "exporting" not in captured.out  # the line printed once the model is loaded


def test_hfexport_warnings_print_as_one_line_and_others_keep_their_format(capsys):
    """Inside a command, hfexport's warning classes and its ``hfexport`` logger print ``warning: ...`` on stderr,
    as its errors print ``error: ...``; another library's warning keeps Python's format; all is restored after."""
    import logging
    import warnings

    from hfexport._patching import UnresolvedPatchWarning

    shown = []  # what the previous showwarning gets: the other libraries' warnings

    def showwarning(message, category, *args):
        shown.append((category, str(message)))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        with cli._warnings_in_hfexport_format():
            warnings.warn("a patch matched nothing", UnresolvedPatchWarning, stacklevel=1)
            logging.getLogger("hfexport").warning("two patches on %s", "Foo.forward")
            warnings.warn("a third party's", UserWarning, stacklevel=1)
        assert warnings.showwarning is showwarning and logging.getLogger("hfexport").propagate
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: a patch matched nothing", "warning: two patches on Foo.forward"]
    assert shown == [(UserWarning, "a third party's")]


def test_verbose_shows_what_is_filtered_by_default(monkeypatch, capsys):
    """``--verbose`` (HFEXPORT_VERBOSE=1): transformers' loading bar stays on inside hfexport's loading, and the
    ``hfexport`` logger's info lines (patches installed, fixes applied) print; without it, neither."""
    import logging

    from transformers.utils import logging as transformers_logging

    from hfexport_dynamo._quiet import no_loading_bar

    monkeypatch.setenv(cli.VERBOSE_ENV, "")  # restored after the test, whatever main() sets
    assert not cli.verbose()
    assert cli.main(["--verbose", "backends", "--no-load"]) == 0  # the flag sets the variable the filters ask
    assert cli.verbose()
    with no_loading_bar():
        assert transformers_logging.is_progress_bar_enabled()
    with cli._warnings_in_hfexport_format():
        logging.getLogger("hfexport.test").info("patch p installed on torch.t")
    assert "info: patch p installed on torch.t" in capsys.readouterr().err
    monkeypatch.delenv(cli.VERBOSE_ENV)
    with no_loading_bar():
        assert not transformers_logging.is_progress_bar_enabled()
    with cli._warnings_in_hfexport_format():
        logging.getLogger("hfexport.test").info("patch p installed on torch.t")
    assert "info:" not in capsys.readouterr().err


def test_workarounds_refuses_a_scope_or_kind_it_does_not_know_with_a_suggestion(capsys):
    """A misspelled --scope or --kind listed nothing and exited 0; now exit 2 with "did you mean" (a fresh user's
    finding). A scope a backend activates without workarounds of its own (executorch.cuda) still lists, empty.
    The --kind typo runs as the console script; the two --scope cases import every backend's exporter (about 3 s
    of CPU in a new process), so they run in this process, where the backends are imported once."""
    out = _run("workarounds", "--kind", "pach")
    assert out.returncode == 2 and "did you mean 'patch'?" in out.stderr, out.stderr
    assert cli.main(["workarounds", "--scope", "onxx"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'onnx'?" in err, err
    assert cli.main(["workarounds", "--scope", "executorch.cuda"]) == 0, capsys.readouterr().err


# ── quantization knobs (issue 48): --group-size, --ratio, --sym/--no-sym, --qembedding ─────────────────────────────
def test_quantize_help_lists_every_recipe_of_every_backend():
    from hfexport_executorch._quantize import recipes_for
    from hfexport_onnx._quantize import ONNX_QUANTIZATION_RECIPES
    from hfexport_openvino._quantize import OPENVINO_QUANTIZATION_RECIPES

    assert cli.QUANTIZE_RECIPES == {"onnx": tuple(ONNX_QUANTIZATION_RECIPES),
                                    "executorch-xnnpack": tuple(recipes_for("xnnpack")),
                                    "openvino": tuple(OPENVINO_QUANTIZATION_RECIPES)}
    text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["export"].format_help().split())
    for backend, recipes in cli.QUANTIZE_RECIPES.items():
        assert f"{backend}: {', '.join(recipes)}" in text
    for flag in ("--group-size", "--ratio", "--sym, --no-sym", "--qembedding"):
        assert flag in text


@pytest.mark.parametrize(("argv", "backend", "expected"), [
    (["--quantize", "int4-weights", "--group-size", "64", "--ratio", "0.8", "--sym"], "openvino",
     {"group_size": 64, "ratio": 0.8, "symmetric": True}),
    (["--quantize", "int4", "--group-size", "16", "--no-sym"], "onnx", {"group_size": 16, "symmetric": False}),
    (["--quantize", "8da4w", "--group-size", "64", "--qembedding", "4w"], "executorch-xnnpack",
     {"group_size": 64, "embedding": "4w"}),
])
def test_quantization_knobs_map_onto_each_backends_quantizer(argv, backend, expected):
    from hfexport import Quantization
    from hfexport.commands import quantization_knobs
    from hfexport_executorch._quantize import resolve_executorch_quantization
    from hfexport_onnx._quantize import resolve_onnx_quantization
    from hfexport_openvino._quantize import resolve_openvino_quantization

    args = cli.build_parser().parse_args(["export", "--demo", "--backend", backend, *argv])
    resolve = {"openvino": resolve_openvino_quantization, "onnx": resolve_onnx_quantization,
               "executorch-xnnpack": lambda q: resolve_executorch_quantization(q, "xnnpack")}[backend]
    resolved = resolve(Quantization(args.quantize, **quantization_knobs(args)))
    assert {name: getattr(resolved, name) for name in expected} == expected


@pytest.mark.parametrize(("argv", "message"), [
    (["--group-size", "64"], "--group-size tunes a quantization recipe: pass --quantize RECIPE too"),
    (["--backend", "onnx", "--quantize", "int4", "--ratio", "0.5"], "takes no ratio"),
    (["--backend", "executorch-xnnpack", "--quantize", "8da4w", "--no-sym"], "8da4w quantizes weights symmetrically"),
    (["--backend", "onnx", "--quantize", "int4", "--qembedding", "4w"], "takes no embedding"),
    (["--backend", "openvino", "--quantize", "int4-weights", "--ratio", "1.5"], "ratio must be a number in (0, 1]"),
])
def test_a_quantization_knob_a_recipe_does_not_take_is_refused_before_the_model_loads(tmp_path, capsys, argv,
                                                                                      message):
    assert cli.main(["export", "--demo", "-o", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_third_party_noise_is_dropped_inside_commands(monkeypatch, capsys):
    """torch.utils.cpp_extension's "No CUDA runtime is found" (NNCF imports it in OpenVINO's quantized exports) and
    torch's pytree deprecations about torchao's enums are dropped by filters on their loggers, set before the
    module that logs is imported; other lines of those loggers pass."""
    import logging

    from hfexport.commands import VERBOSE_ENV, _DropNoise, quiet_third_party_logs

    logger = logging.getLogger("torch.utils.cpp_extension")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    saved, propagate, logger.propagate = list(logger.filters), logger.propagate, False
    logger.filters[:] = [f for f in saved if not isinstance(f, _DropNoise)]  # an earlier command's, in this process
    try:
        monkeypatch.delenv(VERBOSE_ENV, raising=False)
        quiet_third_party_logs()
        quiet_third_party_logs()  # idempotent
        assert sum(isinstance(f, _DropNoise) for f in logger.filters) == 1
        logger.warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
        logger.warning("something else")
        assert capsys.readouterr().err == "something else\n"
    finally:
        logger.filters[:] = saved
        logger.removeHandler(handler)
        logger.propagate = propagate


def test_backends_table_labels_its_version_columns(capsys):
    assert cli.main(["backends"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "distribution", "dist", "version", "toolchain", "status"]
    onnx = next(row for row in rows if row.startswith("onnx "))
    assert "hfexport-onnx" in onnx and "onnxruntime " in onnx


def test_export_help_lists_every_task_and_the_new_options():
    from hfexport_dynamo import TASKS

    text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["export"].format_help().split())
    text = text.replace("- ", "-")  # argparse wraps lines at hyphens
    for task in TASKS:
        assert task in text, task
    for flag in ("--dtype {fp32,fp16,bf16}", "--trust-remote-code", "--no-task", "--revision", "Hub model id"):
        assert flag in text, flag
