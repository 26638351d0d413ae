"""A vendor-style ExecuTorch variant, as a third party would publish it: ``hfexport-etportable``.

It declares one entry point (``executorch-portable``) in the ``hfexport.backends`` group and needs no change to
hfexport: its exporter subclasses ``ExecutorchExporter`` and registers the variant ``portable`` with
``@register_backend_prepare("portable")`` (no partitioner: every op runs on ExecuTorch's portable kernels).
Importing this package stays light: executorch is imported when the exporter is loaded.
"""

from hfexport.plugin import Backend

BACKEND = Backend(
    name="executorch-portable",
    exporter="hfexport_etportable.exporter_etportable:PortableExporter",
    description="test vendor variant: ExecuTorch program (.pte) on portable kernels only (no delegate)",
    requires=("executorch",),
    distribution="hfexport-etportable",
)

__all__ = ["BACKEND"]
