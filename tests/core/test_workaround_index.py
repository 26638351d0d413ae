"""The workaround index: each backend distribution ships ``workaround_index.json``, what the registry says it
registers, so that ``hfexport workarounds`` lists every workaround without importing torch (issue 42).

``tests/core/test_registry.py`` checks the listing itself (read from the indexes, equal to the live registry's, with
no torch import); this file checks that the committed indexes are current and that a vendor's distribution without
one is listed by importing it."""

from __future__ import annotations

import textwrap
import tomllib

from hfexport import cli, list_backends
from hfexport.workaround_index import (
    INDEX_NAME,
    REGENERATE,
    build_index,
    describe_difference,
    indexed_workarounds,
    main,
)
from plugin_path import PLUGINS

TEST_PLUGINS = {tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"]
                for p in PLUGINS.iterdir() if (p / "pyproject.toml").is_file()}


def _usable_distributions() -> list[str]:
    return list(dict.fromkeys(i.distribution for i in list_backends() if i.status == "ok"))


def test_every_backend_distribution_ships_the_index_the_registry_says():
    """Regenerated in memory (every exporter imported, the registry read), each index equals the committed file.
    A workaround added, removed, moved (to ``workarounds/<kind>.py``, say) or re-documented without regenerating
    fails here, naming the command that regenerates."""
    distributions = _usable_distributions()
    assert {"hfexport-dynamo", "hfexport-onnx", "hfexport-executorch", "hfexport-openvino"} <= set(distributions)
    # in a new process, as a developer runs it: the registration order is the imports' of a plain export, not the
    # order in which this worker's other test files imported workaround modules
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hfexport.workaround_index", "--check", *distributions],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_a_stale_index_is_described_and_check_fails_naming_the_command(monkeypatch, capsys):
    fresh = build_index("hfexport-openvino")
    shipped = {**fresh, "workarounds": [dict(w) for w in fresh["workarounds"][1:]]}  # one registration missing
    shipped["workarounds"][0]["summary"] = "An old docstring."
    shipped["workarounds"].append({"kind": "fx_node_fix", "scope": "openvino", "module": "hfexport_openvino.gone",
                                   "name": "_fix_gone", "summary": "Moved away."})
    why = describe_difference(shipped, fresh)
    first, second = (_key(w) for w in fresh["workarounds"][:2])
    assert f"not in the index: {first}" in why
    assert "no longer registered: hfexport_openvino.gone._fix_gone (fx_node_fix, openvino)" in why
    assert f"recorded otherwise: {second}" in why
    assert describe_difference(None, fresh) == f"it ships no {INDEX_NAME}"

    monkeypatch.setattr("hfexport.workaround_index.read_index", lambda d, infos=None: shipped)
    assert main(["--check", "hfexport-openvino"]) == 1
    err = capsys.readouterr().err
    assert "hfexport-openvino: workaround_index.json is stale" in err and REGENERATE in err


def _key(entry: dict) -> str:
    """An entry as describe_difference names it."""
    return f"{entry['module']}.{entry['name']} ({entry['kind']}, {entry['scope']})"


def test_a_distribution_without_an_index_is_listed_by_importing_its_exporters(tmp_path, monkeypatch, capsys):
    """A vendor's distribution that ships no index: ``hfexport workarounds`` imports its exporter, lists what it
    registers and knows the scopes it activates; the others are still read from their indexes."""
    info = tmp_path / "hfexport_noindex-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hfexport-noindex\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[hfexport.backends]\nnoindex = hfexport_noindex:BACKEND\n")
    package = tmp_path / "hfexport_noindex"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""
        from hfexport.plugin import Backend

        BACKEND = Backend(name="noindex", exporter="hfexport_noindex.exporter_noindex:NoIndexExporter")
    """))
    (package / "exporter_noindex.py").write_text(textwrap.dedent('''
        from hfexport.plugin import register_fx_node_fix
        from hfexport_dynamo import DynamoExporter


        @register_fx_node_fix("test.noindex")
        def _fix_noindex(gm, node):
            """A vendor's fix, listed by importing its exporter."""
            return False


        class NoIndexExporter(DynamoExporter):
            name = "noindex"
            scopes = ("dynamo", "test.noindex", "test.noindex.empty")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))

    listed, scopes, errors = indexed_workarounds()
    assert not errors
    [vendor] = [r for r in listed if r.module == "hfexport_noindex.exporter_noindex"]
    assert (vendor.kind, vendor.scope, vendor.name, vendor.summary) == \
        ("fx_node_fix", "test.noindex", "_fix_noindex", "A vendor's fix, listed by importing its exporter.")
    assert {"test.noindex.empty", "onnx", "executorch.cuda"} <= scopes
    assert any(r.module.startswith("hfexport_onnx.") for r in listed)  # read from hfexport-onnx's index

    assert cli.main(["workarounds", "--scope", "test.noindex"]) == 0
    assert "hfexport_noindex.exporter_noindex._fix_noindex" in capsys.readouterr().out
    assert cli.main(["workarounds", "--scope", "test.noindex.empty"]) == 0  # activated, nothing registered
    assert capsys.readouterr().out == ""
