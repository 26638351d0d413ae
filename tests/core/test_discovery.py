"""Backend discovery through real entry points of installed distributions (the test plugins in tests/plugins)."""

import subprocess
import sys

import pytest
import torch

import hfexport
from hfexport import UnknownBackendError, get_backend, list_backends


def _by_name():
    return {i.name: i for i in list_backends()}


def test_first_party_and_plugin_backends_are_listed_with_distributions():
    infos = _by_name()
    assert infos["dynamo"].distribution == "hfexport-dynamo" and infos["dynamo"].status == "ok"
    assert infos["onnx"].distribution == "hfexport-onnx"
    assert infos["executorch-xnnpack"].distribution == "hfexport-executorch"
    assert infos["testplugin"].distribution == "hfexport-testplugin"
    assert infos["testplugin"].version == "0.0.1"


def test_broken_plugin_is_reported_and_others_keep_working():
    infos = _by_name()
    broken = infos["broken"]
    assert broken.status == "error"
    assert "ImportError" in broken.error and "vendor_sdk" in broken.error
    assert infos["dynamo"].status == "ok"
    with pytest.raises(UnknownBackendError, match="hfexport-brokenplugin 0.0.1 is not usable.*vendor_sdk"):
        get_backend("broken")


def test_listing_without_load_reads_metadata_only():
    code = ("import sys, hfexport; infos = hfexport.list_backends(load=False); "
            "assert {i.status for i in infos} == {'unloaded'}; "
            "heavy = [m for m in ('torch', 'onnx', 'onnxscript', 'executorch', 'hfexport_onnx') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_loaded_listing_imports_no_toolchain():
    code = ("import sys, hfexport; hfexport.list_backends(); "
            "print([m for m in ('torch', 'onnx', 'onnxscript', 'onnxruntime', 'executorch', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plugin_backend_is_found_by_name_and_exports():
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x) @ x.transpose(-1, -2)

    x = torch.randn(2, 3, 4)
    exported = hfexport.export(Tiny(), {"x": x}, backend="testplugin", dynamic=True)
    assert exported.backend == "testplugin"
    # The vendor's own stage ran: the program is Core ATen (gelu decomposed away from aten.gelu? no: gelu is core)
    ops = {str(n.target) for n in exported.runner.program.graph.nodes if n.op == "call_function"}
    assert "aten.matmul.default" not in ops  # matmul is not Core ATen: decomposed into bmm/mm
    x2 = torch.randn(3, 5, 4)
    report = exported.verify({"x": x2}, atol=1e-6, rtol=1e-6)
    assert report.passed, report


def test_unknown_backend_lists_installed_and_names_distribution():
    with pytest.raises(UnknownBackendError) as info:
        get_backend("executorch-foo")
    message = str(info.value)
    assert "unknown backend 'executorch-foo'" in message
    assert "dynamo" in message and "testplugin" in message
    assert "pip install --upgrade hfexport-executorch" in message  # the family exists: its distribution


def test_blocked_backend_is_disabled_and_unknown_names_say_what_to_install(monkeypatch):
    monkeypatch.setenv("HFEXPORT_BLOCK_PLUGINS", "onnx")
    infos = _by_name()
    assert infos["onnx"].status == "disabled"
    with pytest.raises(UnknownBackendError, match="hfexport-onnx 0.1.0 is not usable.*HFEXPORT_BLOCK_PLUGINS"):
        get_backend("onnx")
    with pytest.raises(UnknownBackendError, match="Installed backends: .*dynamo") as info:
        get_backend("tensorrt")
    assert "pip install" not in str(info.value)  # no distribution made up from the name


def test_get_backend_imports_only_that_plugin():
    code = ("import sys, hfexport; hfexport.get_backend('onnx'); "
            "print(sorted(m for m in ('hfexport_executorch', 'hfexport_testplugin', 'hfexport_etportable', "
            "'hfexport_brokenplugin') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_fresh_environment_lists_the_product_backends_only():
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no test plugins on the path
    out = subprocess.run([sys.executable, "-m", "hfexport.cli", "backends", "--json"], capture_output=True,
                         text=True, check=True, env=env).stdout
    import json

    rows = {r["name"]: r["distribution"] for r in json.loads(out)}
    assert rows == {"dynamo": "hfexport-dynamo", "onnx": "hfexport-onnx", "executorch": "hfexport-executorch",
                    "executorch-xnnpack": "hfexport-executorch", "executorch-cuda": "hfexport-executorch",
                    "openvino": "hfexport-openvino"}


def test_the_listing_says_a_cuda_backend_needs_a_gpu_where_none_is_visible(monkeypatch):
    """``hfexport backends`` (a new process, no toolchain imported) marks ``executorch-cuda`` where the process sees
    no GPU (``CUDA_VISIBLE_DEVICES=-1`` hides every device), and no CPU backend; where a GPU is visible, no note."""
    import json
    import os

    from hfexport import _discovery

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}
    out = subprocess.run([sys.executable, "-m", "hfexport.cli", "backends", "--json"], capture_output=True,
                         text=True, check=True, env=env).stdout
    notes = {r["name"]: r["note"] for r in json.loads(out)}
    assert notes["executorch-cuda"] == "needs a GPU; none is visible"
    assert notes["executorch-xnnpack"] == notes["onnx"] == notes["dynamo"] == ""
    assert notes["executorch"] == "another name of executorch-xnnpack"  # its entry point's second name
    table = subprocess.run([sys.executable, "-m", "hfexport.cli", "backends"], capture_output=True, text=True,
                           check=True, env=env).stdout
    assert "ok (needs a GPU; none is visible)" in next(line for line in table.splitlines()
                                                       if line.startswith("executorch-cuda "))
    monkeypatch.setattr(_discovery, "cuda_visible", lambda: True)
    assert _by_name()["executorch-cuda"].note == ""


def test_plugin_autoload_can_be_disabled_with_an_allow_list(monkeypatch):
    monkeypatch.setenv("HFEXPORT_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("HFEXPORT_PLUGINS", "dynamo,onnx")
    infos = _by_name()
    assert infos["testplugin"].status == "disabled" and infos["executorch-xnnpack"].status == "disabled"
    assert infos["dynamo"].status == "ok" and infos["onnx"].status == "ok"


def test_export_with_unknown_backend_changes_nothing(bert):
    before = {k: v.clone() for k, v in bert.state_dict().items()}
    with pytest.raises(UnknownBackendError):
        hfexport.export(bert, backend="nope")
    assert all(torch.equal(before[k], v) for k, v in bert.state_dict().items())


def test_an_exporter_without_name_stages_or_package_is_refused_when_it_loads(monkeypatch):
    import types

    from hfexport.plugin import Backend, Exporter, Stage

    module = types.ModuleType("vendor_half_done")

    from hfexport_dynamo import DYNAMO_TRACER

    class NoName(Exporter):
        stages = (Stage(1, "Trace", "internal"),)
        tracer = DYNAMO_TRACER

    class NoPackage(Exporter):
        name = "half"
        stages = (Stage(1, "Trace", "internal"),)
        tracer = DYNAMO_TRACER

    class NoTracer(Exporter):
        name = "half"
        stages = ("Trace",)

    module.NoName, module.NoPackage = NoName, NoPackage
    monkeypatch.setitem(sys.modules, "vendor_half_done", module)
    with pytest.raises(TypeError, match="must set `name`"):
        Backend("half", "vendor_half_done:NoName").load_exporter()
    with pytest.raises(TypeError, match="must implement package"):
        Backend("half", "vendor_half_done:NoPackage").load_exporter()
    module.NoTracer = NoTracer
    with pytest.raises(TypeError) as info:
        Backend("half", "vendor_half_done:NoTracer", distribution="hfexport-half").load_exporter()
    message = str(info.value)  # names the entry point, its distribution and each thing missing
    assert "(entry point of group hfexport.backends, distribution hfexport-half): its exporter " \
           "vendor_half_done:NoTracer" in message
    assert "must hold hfexport.plugin.Stage objects" in message and "must set `tracer`" in message

    class Misnumbered(Exporter):
        name = "half"
        stages = (Stage(2, "Lower", "internal"),)
        tracer = DYNAMO_TRACER

    module.Misnumbered = Misnumbered
    with pytest.raises(TypeError, match=r"`stages` must be numbered 1 to 1 in order, got \[2\]"):
        Backend("half", "vendor_half_done:Misnumbered").load_exporter()
