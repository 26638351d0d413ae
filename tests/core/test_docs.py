"""The documents a new user reads first: a README of at most 170 lines, and every relative link of the README,
CONTRIBUTING.md and docs/ resolving to a file of the repository (and a heading there, for an anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)  # no headings inside code blocks
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 170


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(document):
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... leave the repository by intent
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if ROOT.resolve() not in resolved.parents and resolved != ROOT.resolve():
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{document.name}: " + "; ".join(broken)


def test_ci_runs_the_readmes_test_command():
    """`.ci/run` runs the test command the README gives a new user, with the same arguments (the workers and their
    distribution come from pyproject.toml's ``addopts``, for both)."""
    ci = re.search(r"^[^#\n]*\brun --frozen (pytest[^\n]*)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert ci, ".ci/run runs no `uv run --frozen pytest ...` line"
    readme = (ROOT / "README.md").read_text()
    assert f"uv run {ci.group(1).strip()}" in readme, f"the README does not give .ci/run's `{ci.group(1)}`"
