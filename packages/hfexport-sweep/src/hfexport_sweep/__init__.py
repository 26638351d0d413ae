"""hfexport-sweep: the tiny-model zoo, ``hfexport sweep`` and its reports.

- :mod:`hfexport_sweep.zoo` — every Transformers model class as a seeded tiny model built offline, with dummy
  inputs at two shapes (``"llama/LlamaForCausalLM"``).
- :mod:`hfexport_sweep.sweep` — export every zoo case with one backend, one process per case, and record what
  works; ``hfexport sweep`` (registered through the ``hfexport.commands`` entry point).
- :mod:`hfexport_sweep.sweep_report` — ``report.md`` and ``index.html`` from a results directory.
- :mod:`hfexport_sweep.results` — the results directory's format, shared by the sweep and its reports.

The sweep depends on hfexport-core and hfexport-dynamo only: a backend is found by name like any other, and
declares its own known-failure lists through its exporter class (``known_failures()``, ``recheck_options()``).
Importing this package is light (no torch).
"""

__version__ = "0.1.0"
