"""Bad input gets a clear error that names what was wrong and what to do, before any work: options of the wrong
type, a config of another backend, unknown ``disable=`` names, misspelled backends, user patches that resolve to
nothing, calls outside what a program takes, and the CLI's one-line errors and exit codes.

docs/guide.md's table "Bad input and what hfexport says" lists what these tests cover.
"""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import hfexport
from hfexport import UnknownBackendError, UnresolvedPatchWarning, get_backend, register_patch
from hfexport._input_check import check_call_inputs
from hfexport.plugin import ExportConfig

LINEAR_INPUTS = {"input": torch.ones(2, 3)}


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


class _NoStage:
    """A progress callback that fails the test if any stage starts: the error must come before any work."""

    def __call__(self, event):
        raise AssertionError(f"stage {event.stage.title} ran before the error")


# ── options ────────────────────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("options,match", [
    ({"dynamic": "no"}, r"dynamic must be True or False, got 'no' \(str\)"),
    ({"dynamic": 1}, r"dynamic must be True or False, got 1 \(int\)"),
    ({"strict": "no"}, r"strict must be True or False, got 'no' \(str\)"),
    ({"fixed_kwargs": [("output_hidden_states", True)]}, r"fixed_kwargs must map forward keyword names.*got list"),
    ({"dynamic_shapes": ["input"]}, r"dynamic_shapes must map input names.*got list"),
    ({"dynamic_shapes": {"input": "batch"}}, r"dynamic_shapes\['input'\] is 'batch' \(str\); a dim is given a "
                                             r"torch.export.Dim"),
    ({"dynamic_shapes": {"input": {0: "batch"}}}, r"dynamic_shapes\['input'\]\[0\] is 'batch' \(str\)"),
    ({"dynamic_shapes": {"input": {-1: None}}}, r"dynamic_shapes\['input'\] has dim index -1"),
    ({"disable": [3]}, r"disable holds workaround names \(str\)"),
])
def test_options_of_the_wrong_type_are_refused_not_truthy(options, match):
    with pytest.raises(TypeError, match=match):
        hfexport.export(_linear(), LINEAR_INPUTS, progress=_NoStage(), **options)


def test_dynamic_no_is_refused_by_the_config_too():
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        ExportConfig(dynamic="no")


def test_a_config_of_another_backend_is_refused_naming_both():
    from hfexport_dynamo import DynamoConfig, DynamoExporter
    from hfexport_onnx import OnnxConfig

    message = (r"backend 'dynamo' takes a config of type DynamoConfig, got OnnxConfig \(the config of backend "
               r"'onnx'\); backend 'dynamo' would ignore its options opset_version, .*export with backend='onnx'")
    with pytest.raises(TypeError, match=message):
        hfexport.export(_linear(), LINEAR_INPUTS, backend="dynamo", config=OnnxConfig(opset_version=17))
    with pytest.raises(TypeError, match=message):
        DynamoExporter(OnnxConfig())
    with pytest.raises(TypeError, match=r"backend 'onnx' takes a config of type OnnxConfig, got DynamoConfig "
                                        r"\(the config of backend 'dynamo'"):
        hfexport.export(_linear(), LINEAR_INPUTS, backend="onnx", config=DynamoConfig())


@pytest.mark.filterwarnings("ignore:.*asked to be dynamic")  # Linear's feature dim is fixed by its weight
def test_a_config_subclass_with_no_new_option_is_accepted():
    from dataclasses import dataclass

    from hfexport_dynamo import DynamoConfig

    @dataclass
    class Mine(DynamoConfig):
        dynamic: bool = True  # another default, no new option

    exported = hfexport.export(_linear(), LINEAR_INPUTS, config=Mine())
    assert exported.manifest["inputs"][0]["dynamic_dims"]["0"]["symbol"].startswith("s")


def test_the_onnx_backend_runs_the_dynamo_stages_with_its_own_config():
    from hfexport_onnx import OnnxConfig

    exported = hfexport.export(_linear(), LINEAR_INPUTS, backend="onnx", config=OnnxConfig(optimize=False))
    assert exported.verify({"input": torch.ones(2, 3)}, atol=1e-5).passed


# ── disable= ───────────────────────────────────────────────────────────────────────────────────────────────
def test_a_misspelled_disable_name_is_refused_with_close_matches():
    with pytest.raises(ValueError, match=r"disable names no workaround of backend 'dynamo': "
                                         r"'_patch_nllb_moe_cast_clasifier' \(did you mean "
                                         r"'_patch_nllb_moe_cast_classifier'\?\)"):
        hfexport.export(_linear(), LINEAR_INPUTS, disable=("_patch_nllb_moe_cast_clasifier",), progress=_NoStage())


def test_disable_names_are_checked_against_every_kind_of_the_backends_scopes():
    # An ONNX IR fix is a name of the onnx backend, not of the dynamo one.
    with pytest.raises(ValueError, match=r"'_fix_ir_topk_sorted'; its \d+ workarounds .* scopes dynamo"):
        hfexport.export(_linear(), LINEAR_INPUTS, disable=("_fix_ir_topk_sorted",))
    with pytest.raises(ValueError, match=r"'_fix_ir_topk_sortd' \(did you mean '_fix_ir_topk_sorted'\?\), 'zzz'"):
        hfexport.export(_linear(), LINEAR_INPUTS, backend="onnx", disable=("_fix_ir_topk_sortd", "zzz"))
    # Names of every kind, short or qualified, are accepted (a translation, the dynamo scope's patch).
    exported = hfexport.export(_linear(), LINEAR_INPUTS, backend="onnx", optimize=False, disable=(
        "_aten_gelu", "hfexport_dynamo._common_patches._patch_dynamic_rope_update"))
    assert exported.verify(LINEAR_INPUTS, atol=1e-5).passed


# ── backends ───────────────────────────────────────────────────────────────────────────────────────────────
def test_a_misspelled_backend_gets_did_you_mean_and_no_made_up_distribution():
    with pytest.raises(UnknownBackendError) as info:
        get_backend("dynamoo")
    message = str(info.value)
    assert "Did you mean 'dynamo'?" in message and "Installed backends: " in message and " dynamo," in message
    assert "pip install" not in message and "hfexport-dynamoo" not in message
    with pytest.raises(UnknownBackendError) as info:
        get_backend("tensorrt")
    assert "hfexport-tensorrt" not in str(info.value) and "Did you mean" not in str(info.value)


def test_a_new_name_of_a_known_family_points_at_that_familys_distribution():
    with pytest.raises(UnknownBackendError, match=r"Did you mean 'executorch'.*Backends named executorch-\* come "
                                                  r"from .*hfexport-executorch: pip install --upgrade "
                                                  r".*hfexport-executorch"):
        get_backend("executorch-foo")


def test_a_backend_that_is_not_a_name_is_refused():
    with pytest.raises(TypeError, match="backend must be a backend name"):
        hfexport.export(_linear(), LINEAR_INPUTS, backend=None)


# ── user patches that resolve to nothing ───────────────────────────────────────────────────────────────────
class _Target:
    def ping(self):
        return "ping"


@pytest.fixture
def user_patches():
    """Three user patches that resolve to nothing, removed from the registry afterwards."""
    from hfexport import _registry

    before = list(_registry._REGISTRY)

    @register_patch("dynamo", f"{__name__}._Target.pong")
    def _patch_missing_attribute(original):
        return original

    @register_patch("dynamo", "transformers.models.*.modeling_*.NoSuchClass*.forward")
    def _patch_wildcard_nothing(original):
        return original

    @register_patch("dynamoo", f"{__name__}._Target.ping")
    def _patch_misspelled_scope(original):
        return original

    yield
    _registry._REGISTRY[:] = before


def test_user_patches_that_resolve_to_nothing_are_warned_about(user_patches):
    with pytest.warns(UnresolvedPatchWarning) as record:
        exported = hfexport.export(_linear(), LINEAR_INPUTS)
    messages = [str(w.message) for w in record if issubclass(w.category, UnresolvedPatchWarning)]
    assert any("_patch_missing_attribute is not applied to" in m and "has no attribute 'pong'" in m for m in messages)
    assert any("_patch_wildcard_nothing is not applied" in m and "wildcard matches no class" in m for m in messages)
    assert any("_patch_misspelled_scope is never applied: no installed backend installs scope 'dynamoo' "
               "(did you mean 'dynamo'" in m for m in messages)  # the closest first ('dynamo.trace' may follow)
    skipped = {p["name"].rsplit(".", 1)[1] for p in exported.manifest["workarounds"]["skipped_patches"]}
    assert {"_patch_missing_attribute", "_patch_wildcard_nothing"} <= skipped


def test_hfexports_own_patches_do_not_warn():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hfexport.export(_linear(), LINEAR_INPUTS)
    ours = [w for w in record if issubclass(w.category, UnresolvedPatchWarning)
            and str(w.message).split()[1].startswith("hfexport")]  # "patch <qualified name> is not applied ..."
    assert not ours


@pytest.mark.slow  # a CLI subprocess that imports torch and the backends: 10-25 s on 2 cores
def test_workarounds_check_shows_unresolved_targets_without_installing(tmp_path):
    (tmp_path / "my_patches.py").write_text(textwrap.dedent("""
        from hfexport import register_patch

        @register_patch("dynamo", "torch.nn.Linear.no_such_method")
        def _patch_typo(original):
            '''A target that does not exist.'''
            return original

        @register_patch("dynamo", "transformers.models.llama.modeling_lama.*.forward")
        def _patch_wildcard_typo(original):
            '''A wildcard whose module part matches nothing.'''
            return original

        @register_patch("onnxx", "torch.where")
        def _patch_scope_typo(original):
            '''A scope no backend installs.'''
            return original
    """))
    out = _cli("workarounds", "--check", "--import", "my_patches", pythonpath=tmp_path)
    assert out.returncode == 1, out.stderr
    unresolved = [line.strip() for line in out.stdout.splitlines() if "UNRESOLVED" in line]
    assert len(unresolved) == 3, out.stdout[-3000:]
    assert "torch.nn.Linear.no_such_method: 'torch.nn.Linear' has no attribute 'no_such_method'" in unresolved[0]
    assert "no installed module matches 'transformers.models.llama.modeling_lama'" in unresolved[1]
    assert "scope: no installed backend installs scope 'onnxx' (did you mean 'onnx'?" in unresolved[2]
    assert "3 unresolved" in out.stderr
    assert "my_patches._patch_typo" in out.stdout
    import torch.nn

    assert not hasattr(torch.nn.Linear, "no_such_method")


# ── calls outside what a program takes (the kernel's check, from a manifest) ─────────────────────────────
MANIFEST_INPUTS = [
    {"name": "input_ids", "leaves": 1, "dtype": "int64", "shape": ["s0", "s1"],
     "dynamic_dims": {"0": {"symbol": "s0", "min": 2, "max": None}, "1": {"symbol": "s1", "min": 2, "max": 64}}},
    {"name": "attention_mask", "leaves": 1, "dtype": "int64", "shape": ["s0", "s1"],
     "dynamic_dims": {"0": {"symbol": "s0", "min": 2, "max": None}, "1": {"symbol": "s1", "min": 2, "max": 64}}},
    {"name": "pixel_values", "leaves": 1, "dtype": "float32", "shape": ["s0", 3, "4"],
     "dynamic_dims": {"0": {"symbol": "s0", "min": 2, "max": None}, "2": {"symbol": "4"}}},
    {"name": "cache", "leaves": 4, "type": "DynamicCache"},
]


def _call(**changes):
    inputs = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long),
              "pixel_values": torch.ones(2, 3, 4), "cache": object()}
    return check_call_inputs(MANIFEST_INPUTS, {**inputs, **changes}, "this dynamo export")


@pytest.mark.parametrize("changes,error,match", [
    ({"input_ids": torch.ones(2, 8)}, TypeError, r"input 'input_ids' is float32; this dynamo export takes input_ids "
     r"as int64 \[s0, s1\] with s0 in \[1, inf\), s1 in \[1, 64\]: pass input_ids.to\(torch.int64\)"),
    ({"input_ids": [[1, 2]]}, TypeError, r"input 'input_ids' is a list, not a tensor;.*torch.as_tensor"),
    ({"input_ids": torch.ones(8, dtype=torch.long)}, ValueError, r"input 'input_ids' has 1 dims \(shape \[8\]\)"),
    ({"input_ids": torch.ones(2, 65, dtype=torch.long), "attention_mask": torch.ones(2, 65, dtype=torch.long)},
     ValueError, r"input 'input_ids' has size 65 in dim 1 .*outside the program's range for s1"),
    ({"attention_mask": torch.ones(2, 7, dtype=torch.long)}, ValueError,
     r"input 'attention_mask' has size 7 in dim 1, but 'input_ids' dim 1 is 8: both are s1"),
    ({"pixel_values": torch.ones(2, 3, 5)}, ValueError, r"input 'pixel_values' has size 5 in dim 2 .* dim 2 is "
     r"static \(4\); re-export with dynamic=True"),
])
def test_a_call_outside_the_programs_inputs_is_named(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_a_call_inside_the_range_passes_and_floats_are_cast():
    out = _call(pixel_values=torch.ones(1, 3, 4, dtype=torch.float64),  # batch 1: torch's 0/1 rule allows it
                input_ids=torch.ones(1, 64, dtype=torch.long), attention_mask=torch.ones(1, 64, dtype=torch.long))
    assert out["pixel_values"].dtype == torch.float32


# ── the command line ───────────────────────────────────────────────────────────────────────────────────────
def _cli(*args, pythonpath=None, patch=""):
    import os

    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    code = f"import sys\n{patch}\nfrom hfexport import cli\nsys.exit(cli.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def _error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from helpers import tiny_model

    path = tmp_path_factory.mktemp("model") / "bert"
    tiny_model("bert", layers=1).save_pretrained(path)
    return path


def test_help_says_the_exit_codes_and_debug():
    out = _cli("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert ("Exit status: 0 ok, 1 export error (or any other failure), 2 bad usage" in text
            and "3 verification mismatch" in text and "--debug shows the traceback" in text)


@pytest.mark.parametrize("args,match", [
    (("export", "{model}", "--backend", "dynamoo"), "error: unknown backend 'dynamoo'. Did you mean 'dynamo'?"),
    (("export", "{missing}"), "error: model directory {missing} does not exist"),
    (("export", "{empty}"), "error: {empty} has no config.json"),
    (("stages", "onnxx"), "error: unknown backend 'onnxx'. Did you mean 'onnx'?"),
])
def test_usage_errors_exit_2_on_one_line(args, match, model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    paths = {"model": model_dir, "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    out = _cli(*(a.format(**paths) for a in args))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    [line] = _error_lines(out.stderr)
    assert line.startswith(match.format(**paths)), line


FAILING_STAGE = ("import hfexport_dynamo.capture as capture\n"  # capture() calls its stage 4 by this name
                 "def boom(ctx):\n    raise RuntimeError('boom in stage 4')\n"
                 "capture.dynamic_shapes = boom\n")


@pytest.mark.slow  # a CLI subprocess that imports torch and the backends: 10-25 s on 2 cores
def test_an_export_error_exits_1_on_one_line_and_debug_shows_the_traceback(model_dir, tmp_path):
    out = _cli("export", model_dir, "--output", tmp_path / "a", patch=FAILING_STAGE)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    [line] = _error_lines(out.stderr)
    assert line.startswith("error: dynamo export: stage 4/5 (Dynamic shapes) failed for BertModel: RuntimeError: "
                           "boom in stage 4 Next steps: - ")
    assert line.endswith("(--debug shows the traceback)")
    out = _cli("export", model_dir, "--output", tmp_path / "b", "--traceback", patch=FAILING_STAGE)  # --debug's alias
    assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
    assert "RuntimeError: boom in stage 4" in out.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("args", [("--debug", "stages", "onnxx"), ("stages", "onnxx", "--debug")])
def test_debug_shows_the_traceback_of_any_command_and_keeps_the_exit_code(args):
    out = _cli(*args)
    assert out.returncode == 2
    assert "Traceback (most recent call last)" in out.stderr and "UnknownBackendError" in out.stderr
    assert _error_lines(out.stderr)[-1].startswith("error: unknown backend 'onnxx'")


@pytest.mark.slow  # a CLI subprocess that imports torch and the backends: 10-25 s on 2 cores
def test_a_verification_mismatch_exits_3(model_dir, tmp_path):
    patch = ("from hfexport._artifact import VerificationReport\n"
             "VerificationReport.passed = property(lambda self: False)\n")
    out = _cli("export", model_dir, "--output", tmp_path / "out", patch=patch)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "FAILED" in out.stdout
