"""A vendor-style backend, as a third party would publish it: ``hfexport-testplugin``.

It declares one entry point in the ``hfexport.backends`` group and needs no change to hfexport. The
backend, ``testplugin``, traces with the dynamo pipeline, decomposes the program to Core ATen (what a
hardware vendor's compiler usually consumes) and saves it as a ``.pt2``.
"""

from hfexport.plugin import Backend

BACKEND = Backend(
    name="testplugin",
    exporter="hfexport_testplugin.exporter_testplugin:CoreAtenExporter",
    description="test vendor backend: Core ATen .pt2 (torch.export + run_decompositions)",
    requires=("torch",),
)
