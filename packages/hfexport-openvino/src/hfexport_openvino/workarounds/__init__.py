"""The OpenVINO backend's registered workarounds, one module per kind (importing this package registers them all).

Each waits for an upstream fix or a model-side change and says **Why**, **Upstream** and **Remove when**; leave one
out with ``disable=("<function name>",)``. ``grep -rnE "^def (_patch_|_fix_)" hfexport_openvino/workarounds`` lists
them.

- ``node_fixes``: stage 2, Graph preparation (``@register_fx_node_fix("openvino")``).
- ``cpu_properties``: the CPU plugin's properties for the step ``Core.compile_model`` after stage 3 (the
  ``openvino_cpu_property`` kind).
"""

from . import cpu_properties, node_fixes

__all__ = ["cpu_properties", "node_fixes"]
