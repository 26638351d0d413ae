"""Capture installs the dynamo workarounds for every backend, in a process that never loads the dynamo backend: they
are registered by the capture module itself, not as a side effect of importing ``exporter_dynamo``."""

import json
import subprocess
import sys
import textwrap


def test_an_onnx_export_in_a_new_process_installs_the_dynamo_patches_and_fixes():
    script = textwrap.dedent("""
        import json, sys
        import torch
        import hfexport

        exported = hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)}, backend="onnx")
        hfexport.get_backend("executorch-xnnpack").load_exporter()
        installed = [p["name"].rpartition(".")[2] for p in exported.manifest["workarounds"]["patches"]]
        skipped = [p["name"].rpartition(".")[2] for p in exported.manifest["workarounds"]["skipped_patches"]]
        complex_scopes = sorted(r.scope for r in hfexport.list_workarounds() if r.name == "_fix_complex_to_real_pairs")
        print(json.dumps({"installed": installed, "skipped": skipped, "complex": complex_scopes,
                          "dynamo_backend_loaded": "hfexport_dynamo.exporter_dynamo" in sys.modules}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["dynamo_backend_loaded"]
    assert {"_patch_masked_select", "_patch_conv_memory_format_without_guards"} <= set(result["installed"])
    assert "_patch_nllb_moe_cast_classifier" in result["installed"] + result["skipped"]  # a model not imported here
    assert result["complex"] == ["executorch", "onnx", "openvino"]
