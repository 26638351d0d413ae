"""Exports that never race, dynamic dims that torch.export fixed are reported, and saved artifacts that copy
whole: on the dynamo backend (its .pt2 program is the one the others are lowered from)."""

from __future__ import annotations

import errno
import json
import threading
import time
import warnings

import pytest
import torch

import hfexport
from hfexport import _saving, cli
from hfexport._context import _model_lock
from hfexport._patching import patch_context
from hfexport_dynamo.export_step import SpecializedDimWarning


class _Dropper(torch.nn.Module):
    """A linear layer and dropout; forward coordinates two exporting threads named "first" and "second"."""

    def __init__(self, events: dict[str, threading.Event] | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)
        self.dropout = torch.nn.Dropout(0.5)
        self.events = events

    def forward(self, x):
        name = threading.current_thread().name
        if self.events is not None and name == "first":  # tracing: let the second export start meanwhile
            self.events["first_inside"].set()
            self.events["second_started"].wait(5)
            time.sleep(0.3)
        elif self.events is not None and name == "second":  # tracing after the first export has returned
            self.events["first_done"].wait(5)
        return self.dropout(self.linear(x))


def test_one_instance_exported_from_two_threads_gives_identical_programs_and_keeps_train_mode():
    events = {k: threading.Event() for k in ("first_inside", "second_started", "first_done")}
    model = _Dropper(events).train()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model.eval()(x)
    model.train()
    results: dict[str, object] = {}

    def export(name: str) -> None:
        try:
            if name == "second":
                events["second_started"].set()
            results[name] = hfexport.export(model, {"x": x})
        except Exception as exc:  # noqa: BLE001
            results[name] = exc
        finally:
            if name == "first":
                events["first_done"].set()

    first = threading.Thread(target=export, args=("first",), name="first")
    first.start()
    assert events["first_inside"].wait(30)
    second = threading.Thread(target=export, args=("second",), name="second")
    second.start()
    first.join(60)
    second.join(60)
    assert all(isinstance(r, hfexport.ExportedModel) for r in results.values()), results
    outputs = [results[n](x=x) for n in ("first", "second")]
    assert torch.equal(outputs[0], outputs[1])
    assert torch.allclose(outputs[0], expected) and torch.allclose(outputs[1], expected)  # no dropout baked in
    assert model.training and all(m.training for m in model.modules())


def test_different_instances_export_concurrently():
    models = [_Dropper().train() for _ in range(3)]
    x = torch.randn(2, 8)
    results: list[object] = [None] * len(models)

    def export(i: int) -> None:
        try:
            results[i] = hfexport.export(models[i], {"x": x})
        except Exception as exc:  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=export, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "exports of different instances deadlocked"
    assert all(isinstance(r, hfexport.ExportedModel) for r in results), results
    assert all(m.training for m in models)


def test_exporting_inside_the_patch_context_while_another_thread_exports_fails_instead_of_deadlocking():
    model = _Dropper()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # stands in for an export of the same instance that waits for the patch context
        with _model_lock(model):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with patch_context(("dynamo",)), pytest.raises(RuntimeError, match="would deadlock"):
            hfexport.export(model, {"x": torch.randn(2, 8)})
    finally:
        release.set()
        holder.join(30)


class _Reshaper(torch.nn.Module):
    def forward(self, x, y):
        return x.reshape(4, 8) + y.sum()


def test_dims_that_dynamic_asked_for_but_torch_export_fixed_are_warned_about_and_recorded(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = hfexport.export(_Reshaper(), {"x": torch.ones(4, 8), "y": torch.ones(1, 5)}, dynamic=True)
    messages = [str(w.message) for w in caught if issubclass(w.category, SpecializedDimWarning)]
    assert len(messages) == 3, messages
    assert any("input 'x' dim 0" in m and "fixed it to 4" in m and "guard Eq(x.size(0), 4)" in m for m in messages)
    assert any("input 'y' dim 0" in m and "always specializes sizes 0 and 1" in m for m in messages)
    fixed = {(e["input"], e["dim"]): e["size"] for e in exported.manifest["specialized_dims"]}
    assert fixed == {("x", 0): 4, ("x", 1): 8, ("y", 0): 1}
    assert sum("was asked to be dynamic" in n for n in exported.manifest["notes"]) == 3
    x_entry = next(i for i in exported.manifest["inputs"] if i["name"] == "x")
    assert x_entry["dynamic_dims"] == {} and x_entry["shape"] == [4, 8]  # a fixed dim is not listed as dynamic
    saved = json.loads((exported.save_pretrained(tmp_path / "out") / "export.json").read_text())
    assert saved["specialized_dims"] == exported.manifest["specialized_dims"]


def test_nothing_is_reported_when_every_dynamic_dim_stays_dynamic(bert):
    from hfexport_dynamo import dummy_inputs

    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecializedDimWarning)
        exported = hfexport.export(bert, dummy_inputs(bert, batch=2, seq=8), dynamic=True)
    assert exported.manifest["specialized_dims"] == []


def test_a_loaded_artifact_saves_every_file(bert, tmp_path):
    first = hfexport.export(bert).save_pretrained(tmp_path / "a")
    second = hfexport.load(first).save_pretrained(tmp_path / "b")
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir()) and "model.pt2" in files and "config.json" in files
    for name in files:
        if name != "export.json":
            assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert json.loads((second / "export.json").read_text())["files"] == files
    inputs = hfexport_inputs(bert)
    torch.testing.assert_close(hfexport.load(second)(**inputs), hfexport.load(first)(**inputs))


def hfexport_inputs(model):
    from hfexport_dynamo import dummy_inputs

    inputs = dummy_inputs(model)
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def test_a_pt2_save_that_cannot_fit_is_a_clean_oserror(bert, tmp_path, monkeypatch):
    exported = hfexport.export(bert)
    monkeypatch.setattr(_saving, "_free_bytes", lambda path: 1000)
    with pytest.raises(OSError, match="no space left on device saving the artifact to .*out: it needs at least") \
            as info:
        exported.save_pretrained(tmp_path / "out")
    weights = sum(p.numel() * p.element_size() for p in bert.parameters())
    assert info.value.errno == errno.ENOSPC and info.value.bytes_needed >= weights // 2
    assert list(tmp_path.iterdir()) == []


def test_cli_overwrite_refuses_a_directory_that_is_not_an_export(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep")
    try:
        code, err = cli.main(["export", "--demo", "--output", str(tmp_path), "--overwrite"]), capsys.readouterr().err
    except SystemExit as exc:  # a usage error raised rather than returned
        code, err = 2, str(exc.code)
    assert code == 2 and "--overwrite replaces only an earlier export" in err
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]

