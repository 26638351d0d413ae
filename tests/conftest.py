"""Shared fixtures: offline, seeded tiny models; the test plugin distributions on a temporary path.

Nothing here touches the network.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread, in pytest and in the processes the tests start (torch reads OMP_NUM_THREADS when it loads): the
# tiny models' ops gain nothing from a second thread, and where another process holds a core OpenMP makes each op
# wait for its second thread (three greedy generations of the tiny Whisper on the loaded 2-core machine: 0.24 s of
# wall and 0.12 s of CPU on one thread, 8.9 s and 5.8 s on two).
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))  # helpers, plugin_path

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tiny_model  # noqa: E402
from plugin_path import install_on_temporary_path  # noqa: E402

torch.set_num_threads(1)

# Before collection, so that test modules may import the plugins; removed when the session ends.
_PLUGIN_DIR = Path(tempfile.mkdtemp(prefix="hfexport-test-plugins-"))
atexit.register(shutil.rmtree, _PLUGIN_DIR, ignore_errors=True)
TEST_PLUGINS = install_on_temporary_path(_PLUGIN_DIR)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say so when every new Python process of the run compiles torch from source: no bytecode next to it and none
    to be written (PYTHONDONTWRITEBYTECODE). Importing the stack then takes twice the CPU (12 s, 5.6 s from
    bytecode), in pytest and in each of the subprocesses the tests start."""
    import importlib.util

    cached = importlib.util.cache_from_source(torch.__file__)
    if sys.flags.dont_write_bytecode and not os.path.exists(cached):
        return (
            "bytecode: none cached for torch and none written (PYTHONDONTWRITEBYTECODE): each new process compiles "
            "the stack from source; `uv sync --frozen --all-packages --compile-bytecode` compiles it once"
        )
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers ``-n auto`` (the ``addopts`` of pyproject.toml) starts: none for one test file
    or test id (``pytest tests/core/test_docs.py``: the run stays in this process, where ``-s`` and ``--pdb`` work
    and no worker imports torch for it); otherwise one per CPU this process may use, at most one per 4 GiB of
    memory (a worker holds its module's tiny exports; a slow test's real MiniLM lowering peaks near 2 GiB).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or an explicit ``-n N`` decides instead."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if len(config.args) == 1 and (config.args[0].endswith(".py") or "::" in config.args[0]):
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): the CPUs decide
        memory_gib = 4 * cpus
    return max(1, min(cpus, int(memory_gib // 4)))


@pytest.fixture
def bert() -> torch.nn.Module:
    return tiny_model("bert")
