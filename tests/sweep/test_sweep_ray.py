"""``hfexport sweep --executor ray``: the same sweep as one Ray task per case, on a local Ray instance.

The CLI runs as the user runs it, in a subprocess: once with the local process pool, once with
``--executor ray`` (a local Ray instance, started and stopped by the sweep), on four cheap cases whose statuses
differ. The Ray run resumes a results directory the local run started, so resume across executors is
checked in the same run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from hfexport import cli
from hfexport_sweep.sweep import RESULTS_FILE, load_results

# Cheap cases of every kind the dynamo sweep still records: two tiny families that export, a model type without
# an input recipe, a class in EXPORT_SKIPS. (Its last mismatch, ViTMAE's random masking, is fixed: dummy_inputs
# gives it `noise`.)
CASES = {
    "bert/BertModel": "ok",
    "openai-gpt/OpenAIGPTModel": "ok",
    "d_fine/DFineModel": "not_instantiable",
    "funnel/FunnelModel": "skipped",
}
FILTER = "^(?:" + "|".join(c.replace(".", r"\.") for c in CASES) + ")$"


def _sweep(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Ray's `uv run` integration is off for a local instance (the sweep sets it so); spelled out here as well so
    # that the result does not depend on how pytest was started.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    code = "import sys; from hfexport import cli; sys.exit(cli.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "sweep", "--backend", "dynamo", "--filter", FILTER,
                           "--timeout", "120", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # about 100 s on a loaded 2-core machine: Ray's start (~15 s) and a torch import per worker
def test_ray_executor_gives_the_local_statuses_and_resumes_a_local_sweep(tmp_path):
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    start = time.perf_counter()
    done = _sweep("--jobs", "2", "--output", str(local))
    local_s = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    local_records = {r["case_id"]: r for r in load_results(local / RESULTS_FILE)}
    assert {c: r["status"] for c, r in local_records.items()} == CASES

    # The Ray run resumes from two of the local run's records: it must run the two others only (ok and
    # not_instantiable: statuses decided in the case process).
    kept = {"bert/BertModel", "funnel/FunnelModel"}
    on_ray.mkdir()
    shutil.copy(local / "meta.json", on_ray / "meta.json")
    lines = (local / RESULTS_FILE).read_text().splitlines(keepends=True)
    (on_ray / RESULTS_FILE).write_text("".join(line for line in lines if json.loads(line)["case_id"] in kept))
    start = time.perf_counter()
    done = _sweep("--executor", "ray", "--output", str(on_ray))
    ray_s = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"2 of {len(CASES)} selected cases already recorded; 2 to run" in done.stderr
    ray_records = {r["case_id"]: r for r in load_results(on_ray / RESULTS_FILE)}
    assert {c: r["status"] for c, r in ray_records.items()} == CASES
    for case_id in kept:  # resumed, not run again
        assert ray_records[case_id] == local_records[case_id]
    ran_on_ray = [r for c, r in ray_records.items() if c not in kept]
    assert sorted(r["status"] for r in ran_on_ray) == ["not_instantiable", "ok"]
    assert all(r["seconds"] > 0 and r["finished"] for r in ran_on_ray)
    assert len((on_ray / RESULTS_FILE).read_text().splitlines()) == len(CASES)  # appended to the resumed file
    for case_id, record in ray_records.items():  # the same findings, not only the same statuses
        assert record.get("reason") == local_records[case_id].get("reason")
        assert record.get("stage") == local_records[case_id].get("stage")
    runs = json.loads((on_ray / "meta.json").read_text())["runs"]
    assert [r["executor"] for r in runs] == ["local", "ray"] and runs[-1]["ran"] == len(ran_on_ray)
    assert "dynamo: tried 4, instantiable 3, ok 2" in done.stdout
    print(f"local run {local_s:.0f} s, Ray run {ray_s:.0f} s ({len(ran_on_ray)} cases)")


def test_ray_executor_without_ray_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is not installed
    assert cli.main(["sweep", "--backend", "dynamo", "--filter", "^bert/BertModel$", "--executor", "ray",
                     "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--executor ray needs Ray" in err and "pip install 'hfexport-sweep[ray]'" in err
    assert not (tmp_path / "o").exists()


def test_address_belongs_to_the_ray_executor(tmp_path, capsys):
    assert cli.main(["sweep", "--backend", "dynamo", "--filter", "^bert/BertModel$", "--address", "127.0.0.1:6379",
                     "--output", str(tmp_path / "o")]) == 2
    assert "--address is the Ray cluster of --executor ray" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
