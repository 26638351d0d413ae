"""Registries: each decorator lists what it registered, with where it came from."""

import pytest

import hfexport
import hfexport.plugin
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

    names = [r.name for r in hfexport.plugin.workarounds_for("fx_node_fix", ["test.disable"], disabled=["_fix_a"])]
    assert [n.rsplit(".", 1)[-1] for n in names] == ["_fix_b"]


@pytest.mark.parametrize("bad", ["", "a..b", None])
def test_bad_scope_is_rejected(bad):
    with pytest.raises(ValueError, match="scope"):
        register_fx_node_fix(bad)


def test_patch_without_dotted_path_is_rejected():
    with pytest.raises(ValueError, match="dotted paths"):
        register_patch("test.registry", "where")


def test_the_documented_grep_finds_every_registered_workaround():
    """docs/guide.md's grep over the packages' sources (functions named _patch_, _fix_, _aten_, prepare_for_) finds
    exactly the workarounds the installed backends register (issue 27: it read exporter_*.py only, 44 of 70)."""
    import re
    from pathlib import Path

    from hfexport import list_backends, list_workarounds

    for info in list_backends():
        if info.status == "ok" and info.backend is not None and info.distribution.startswith("hfexport-") \
                and not info.distribution.endswith(("testplugin", "etportable", "brokenplugin")):
            info.backend.load_exporter()
    root = Path(__file__).parents[2] / "packages"
    grepped = set()
    for file in root.glob("*/src/*/*.py"):
        module = ".".join(file.relative_to(root).with_suffix("").parts[2:])
        grepped |= {(module, name) for name in
                    re.findall(r"^def ((?:_patch_|_fix_|_aten_|prepare_for_)\w+)", file.read_text(), re.M)}
    ours = ("hfexport.", "hfexport_dynamo.", "hfexport_onnx.", "hfexport_executorch.", "hfexport_sweep.", "hfexport_openvino.")
    registered = {(r.module, r.name) for r in list_workarounds() if r.module.startswith(ours)}
    assert grepped == registered, (sorted(registered - grepped), sorted(grepped - registered))


def test_workarounds_command_reads_the_registry_from_source_as_the_imported_backends_fill_it():
    """``hfexport workarounds`` reads the registrations from the backends' sources (no torch, no toolchain); what it
    prints must equal the listing of the live registry once every backend's exporter is imported (``--import``
    forces that path), in a new process. The test plugins are on PYTHONPATH: etportable registers its variant
    through ``hfexport_executorch``'s lazily imported ``register_backend_prepare``."""
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


def _write_package(root, body, name="hfexport_srctest"):
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text('_LAZY = {"register_variant": "_factory"}\n\n\ndef __getattr__(name):\n'
                                         '    import importlib\n\n'
                                         '    return getattr(importlib.import_module(f"{__name__}._factory"), name)\n')
    (package / "_factory.py").write_text(
        "from hfexport.plugin import register_workaround\n\n\n"
        "def register_variant(variant, scope='test.src'):\n"
        "    def decorator(prepare):\n"
        "        return register_workaround('test_variant', scope, variant=variant)(prepare)\n\n"
        "    return decorator\n")
    (package / "exporter_srctest.py").write_text(body.replace("hfexport_srctest", name))
    return f"{name}.exporter_srctest:SrcExporter"


def test_workarounds_read_from_source_follow_constants_loops_and_decorator_factories(tmp_path, monkeypatch):
    """The source reader gives what importing gives, in the same order, for the forms the backends use: constants
    and f-string comprehensions as patch paths, a module-level loop, stacked registrations (innermost first), a
    backend's own decorator factory reached through a package's lazy name map, an object as data."""
    import importlib

    from hfexport._registry import list_workarounds
    from hfexport._workaround_source import workarounds_from_source

    exporter = _write_package(tmp_path, '''
"""A module that registers as the backends do."""
from hfexport.plugin import register_fx_node_fix, register_patch, register_workaround
from hfexport_srctest import register_variant

_MODELS = ("llama", "qwen2")
_PATHS = tuple(f"transformers.models.{m}.modeling_{m}.apply" for m in _MODELS)


class _Op:  # as torch.ops.aten: str() of an op is its dotted name
    def __init__(self, name):
        self.name = name

    def __getattr__(self, part):
        return _Op(f"{self.name}.{part}")

    def __str__(self):
        return self.name


aten = _Op("aten")


@register_patch("test.src", *_PATHS, "torch.where")
def _patch_paths(original):
    """Patch every path.

    More text that is not the summary.
    """
    return original


@register_fx_node_fix("test.src.b")
@register_fx_node_fix("test.src")
def _fix_twice(gm, node):
    """Fix in two scopes."""
    return False


def _patch_looped(original):
    """Installed for two scopes."""
    return original


for _scope in ("test.src", "test.src.c"):
    register_patch(_scope, "torch.nonzero")(_patch_looped)


@register_workaround("test_translation", "test.src", target=aten.gelu.default, below=20)
def _translate(x):
    """Translate."""
    return x


@register_variant("fast")
def prepare_for_fast(model):
    """A variant."""
    return model


class SrcExporter:
    pass
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    read = workarounds_from_source([exporter])
    assert read is not None
    before = len(list_workarounds())
    importlib.import_module("hfexport_srctest.exporter_srctest")
    live = [r for r in list_workarounds() if r.module.startswith("hfexport_srctest")]
    assert len(list_workarounds()) - before == len(live) == len(read) == 7
    assert [(r.kind, r.scope, r.paths, r.qualified_name, r.summary, r.data) for r in read] == \
        [(r.kind, r.scope, r.paths, r.qualified_name, r.summary, {k: str(v) for k, v in r.data.items()})
         for r in live]
    assert read[0].paths == ("transformers.models.llama.modeling_llama.apply",
                             "transformers.models.qwen2.modeling_qwen2.apply", "torch.where")
    assert [r.scope for r in read[1:3]] == ["test.src", "test.src.b"]  # the innermost decorator registers first
    assert read[5].data == {"target": "aten.gelu.default", "below": "20"}
    assert read[6].data == {"variant": "fast"} and read[6].kind == "test_variant"


@pytest.mark.parametrize("form", [
    "if SOMETHING:\n    @register_fx_node_fix('test.src')\n    def _fix(gm, node):\n        return False\n",
    "@functools.cache\n@register_fx_node_fix('test.src')\ndef _fix(gm, node):\n    return False\n",
    "@register_patch('test.src', *computed())\ndef _patch(original):\n    return original\n",
    "class Holder:\n    @register_fx_node_fix('test.src')\n    def _fix(gm, node):\n        return False\n",
])
def test_workarounds_read_from_source_give_up_where_they_cannot_be_exact(tmp_path, monkeypatch, form):
    """A registration the reader cannot follow exactly (under an ``if``, beside a decorator of another kind, with
    an argument a call computes, in a class) returns None: the command then imports the exporters."""
    from hfexport._workaround_source import workarounds_from_source

    exporter = _write_package(tmp_path, "import functools\n\nfrom hfexport.plugin import register_fx_node_fix, "
                                        "register_patch\n\nSOMETHING = True\n\n\n" + form,
                              name=f"hfexport_srctest_{abs(hash(form))}")  # find_spec answers from sys.modules
    monkeypatch.syspath_prepend(str(tmp_path))
    assert workarounds_from_source([exporter]) is None
