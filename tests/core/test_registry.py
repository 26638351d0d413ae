"""Registries: each decorator lists what it registered, with where it came from."""

import pytest

import hfexport
import hfexport.plugin
import hfexport.workarounds
from hfexport import register_patch
from hfexport._registry import list_fx_node_fixes, list_fx_program_fixes, list_patches
from hfexport.plugin import register_fx_node_fix, register_fx_program_fix


def test_register_patch_lists_entry_with_origin():
    @register_patch("test.registry", "torch.where", "torch.Tensor.view")
    def _patch_twice(original):
        """Wrap two torch ops with one factory."""
        return original

    [entry] = [r for r in list_patches("test.registry") if r.name.endswith("_patch_twice")]
    assert entry.kind == "patch"
    assert entry.paths == ("torch.where", "torch.Tensor.view")
    assert entry.module == __name__
    assert entry.summary == "Wrap two torch ops with one factory."
    assert entry.source.endswith(".py:" + entry.source.rsplit(":", 1)[1])


def test_register_fx_fixes_list_entries():
    @register_fx_node_fix("test.registry")
    def _fix_nothing(gm, node):
        """Never rewrites."""
        return False

    @register_fx_program_fix("test.registry")
    def _fix_program_nothing(ep):
        """Never rewrites the program."""

    assert [r.summary for r in list_fx_node_fixes("test.registry")] == ["Never rewrites."]
    assert [r.summary for r in list_fx_program_fixes("test.registry")] == ["Never rewrites the program."]
    assert {r.kind for r in hfexport.list_workarounds("test.registry")} >= {"fx_node_fix", "fx_program_fix"}


def test_reregistration_replaces_not_duplicates():
    for _ in range(2):
        @register_fx_node_fix("test.rereg")
        def _fix_same(gm, node):
            """Same function registered twice."""
            return False
    assert len(list_fx_node_fixes("test.rereg")) == 1


def test_disabled_workaround_is_left_out():
    @register_fx_node_fix("test.disable")
    def _fix_a(gm, node):
        """A."""
        return False

    @register_fx_node_fix("test.disable")
    def _fix_b(gm, node):
        """B."""
        return False

    names = [r.name for r in hfexport.workarounds.workarounds_for("fx_node_fix", ["test.disable"], disabled=["_fix_a"])]
    assert [n.rsplit(".", 1)[-1] for n in names] == ["_fix_b"]


@pytest.mark.parametrize("bad", ["", "a..b", None])
def test_bad_scope_is_rejected(bad):
    with pytest.raises(ValueError, match="scope"):
        register_fx_node_fix(bad)


def test_patch_without_dotted_path_is_rejected():
    with pytest.raises(ValueError, match="dotted paths"):
        register_patch("test.registry", "where")


def test_the_documented_grep_finds_every_registered_workaround():
    """docs/guide.md's grep over the packages' sources (functions named _patch_, _fix_, _aten_, prepare_for_, in every
    module, ``workarounds/<kind>.py`` included) finds exactly the workarounds the installed backends register (issue
    27: it read exporter_*.py only, 44 of 70)."""
    import re
    from pathlib import Path

    from hfexport import list_backends, list_workarounds

    for info in list_backends():
        if info.status == "ok" and info.backend is not None and info.distribution.startswith("hfexport-") \
                and not info.distribution.endswith(("testplugin", "etportable", "brokenplugin")):
            info.backend.load_exporter()
    root = Path(__file__).parents[2] / "packages"
    grepped = set()
    for file in root.glob("*/src/*/**/*.py"):
        module = ".".join(file.relative_to(root).with_suffix("").parts[2:])
        grepped |= {(module, name) for name in
                    re.findall(r"^def ((?:_patch_|_fix_|_aten_|prepare_for_)\w+)", file.read_text(), re.M)}
    ours = ("hfexport.", "hfexport_dynamo.", "hfexport_onnx.", "hfexport_executorch.", "hfexport_sweep.", "hfexport_openvino.")
    registered = {(r.module, r.name) for r in list_workarounds() if r.module.startswith(ours)}
    assert grepped == registered, (sorted(registered - grepped), sorted(grepped - registered))


def test_workarounds_command_reads_the_indexes_as_the_imported_backends_fill_the_registry():
    """``hfexport workarounds`` reads the registrations from each backend distribution's ``workaround_index.json`` (no
    torch, no toolchain); what it prints must equal the listing of the live registry once every backend's exporter
    is imported (``--import`` forces that path), in a new process. The test plugins are on PYTHONPATH, with their
    indexes: etportable registers its variant through ``hfexport_executorch``'s ``register_backend_prepare``."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from hfexport import cli\n"
        "static = io.StringIO()\n"
        "with contextlib.redirect_stdout(static): assert cli.main(['workarounds']) == 0\n"
        "heavy = [m for m in ('torch', 'onnx', 'executorch', 'openvino', 'hfexport_onnx.exporter_onnx') "
        "if m in sys.modules]\n"
        "live = io.StringIO()\n"
        "with contextlib.redirect_stdout(live): assert cli.main(['workarounds', '--import', 'hfexport.plugin']) == 0\n"
        "assert 'torch' in sys.modules\n"
        "print('heavy:', heavy, 'lines:', len(static.getvalue().splitlines()), 'same:', "
        "static.getvalue() == live.getvalue(), 'portable:', 'prepare_for_portable (variant=portable)' in "
        "static.getvalue())\n"
        "if static.getvalue() != live.getvalue(): print(static.getvalue(), '----', live.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("heavy: [] lines: ") and first.endswith(" same: True portable: True"), out.stdout
    assert int(first.split()[3]) >= 2 * 80  # two lines per registration (80 of hfexport's own on 2026-12-03)
