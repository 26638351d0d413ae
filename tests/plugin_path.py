"""Test plugin distributions on a temporary path, never installed into the environment.

Each directory under ``tests/plugins`` is a real distribution (``pyproject.toml`` with entry points, and a
``src/<module>``). Like pytest's own plugin tests (``pytester``), the tests make them importable and
discoverable by writing their metadata (``<name>-<version>.dist-info`` with ``METADATA`` and
``entry_points.txt``) and their module into a temporary directory on ``sys.path`` (and ``PYTHONPATH``, for
the subprocesses the tests start). ``importlib.metadata`` finds them there as it finds installed ones, so
discovery runs exactly as for a distribution a vendor publishes, while ``uv run hfexport backends`` in the
project's environment lists the product's backends only.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

PLUGINS = Path(__file__).parent / "plugins"


def write_distribution(source: Path, target: Path) -> str:
    """Write the distribution at ``source`` (pyproject.toml + src/) into ``target``; return its name."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        for group, entries in groups.items()))
    for module in (source / "src").iterdir():
        if module.is_dir():
            shutil.copytree(module, target / module.name, ignore=shutil.ignore_patterns("__pycache__"))
    return name


def install_on_temporary_path(target: Path) -> list[str]:
    """Put every test plugin distribution on ``target`` and ``target`` on ``sys.path`` and ``PYTHONPATH``."""
    names = [write_distribution(source, target) for source in sorted(PLUGINS.iterdir())
             if (source / "pyproject.toml").is_file()]
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])])
    return names


def write_workaround_indexes() -> list[Path]:
    """Regenerate the ``workaround_index.json`` of each test plugin whose backends load (as a vendor ships one, so
    that ``hfexport workarounds`` lists it without importing torch): ``uv run python tests/plugin_path.py``."""
    import tempfile

    from hfexport.workaround_index import INDEX_NAME, build_index, index_text

    written = []
    with tempfile.TemporaryDirectory(prefix="hfexport-test-plugins-") as target:
        sources = {write_distribution(source, Path(target)): source for source in sorted(PLUGINS.iterdir())
                   if (source / "pyproject.toml").is_file()}
        sys.path.insert(0, target)
        for name, source in sources.items():
            try:
                index = build_index(name)
            except RuntimeError as exc:  # hfexport-brokenplugin: nothing to index
                print(f"skipped {name}: {exc}")
                continue
            [package] = [p for p in (source / "src").iterdir() if p.is_dir()]
            (package / INDEX_NAME).write_text(index_text(index), encoding="utf-8")
            written.append(package / INDEX_NAME)
    return written


if __name__ == "__main__":
    for path in write_workaround_indexes():
        print(f"wrote {path}")
