"""What runs where in a lowered program: the delegation report, the portable kernels linked into the runtime and
the memory ExecuTorch plans (executorch is imported inside the functions). A report only: the XNNPACK partitioner
checks that decide what is delegated are workarounds, in ``workarounds/xnnpack_patches.py``."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hfexport.plugin import ExportContext

__all__ = ["DelegationReport", "delegation_report", "planned_memory_bytes",
           "portable_kernel_for", "portable_kernel_names", "rejected_by_edge", "report_planned_memory"]

logger = logging.getLogger("hfexport")

# Planned memory above this gets a note in the manifest and a warning that says how to lower it.
PLANNED_MEMORY_WARNING_BYTES = 1 << 30

_NOT_COMPUTE = ("sym_size", "sym_numel", "sym_stride", "executorch_prim", "_assert", "sym_constrain_range",
                "_local_scalar_dense", "torch.sym_")


# ── kernels ────────────────────────────────────────────────────────────────────────────────────────────
@functools.cache
def portable_kernel_names() -> frozenset[str]:
    """The kernels linked into the ExecuTorch Python runtime (``aten::topk.values``, ...)."""
    from executorch.extension.pybindings import portable_lib

    return frozenset(portable_lib._get_operator_names())


def portable_kernel_for(op: Any) -> str | None:
    """The portable kernel that would run ``op`` (``aten::repeat_interleave.Tensor_out``), or None."""
    from executorch.exir.operator.convert import to_out_variant

    kernels = portable_kernel_names()
    try:
        out, _ = to_out_variant(op)
    except Exception:  # e.g. pow: its int overloads break the lookup; any kernel of the op's name then
        base = f"{op._schema.name}."
        return next((k for k in sorted(kernels) if k.startswith(base)), None)
    name = f"{out._schema.name}.{out._overloadname}"
    return name if name in kernels else None


# Set while we ask the verifier ourselves: then ``_patch_aten_dialect_verifier`` admits nothing.
STRICT = threading.local()


def rejected_by_edge(op: Any) -> bool:
    """Whether ExecuTorch's ATen-dialect verifier raises "is not in Core ATen opset" for ``op``."""
    from executorch.exir.verification.verifier import EXIRATenDialectVerifier
    from torch._export.verifier import SpecViolationError

    STRICT.on = True
    try:
        EXIRATenDialectVerifier().check_valid_op(op)
    except SpecViolationError:
        return True
    finally:
        STRICT.on = False
    return False


# ── delegation ─────────────────────────────────────────────────────────────────────────────────────────
def _is_compute(node: torch.fx.Node) -> bool:
    """A call that runs a kernel: not getitem, not Python/``executorch_prim`` sym arithmetic, not an assert."""
    if node.op != "call_function" or getattr(node.target, "__module__", None) in ("_operator", "math", "builtins"):
        return False
    name = str(node.target)
    return not any(k in name for k in _NOT_COMPUTE)


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    schema = getattr(target, "_schema", None)
    if schema is not None:  # aten::native_layer_norm + overload
        overload = schema.overload_name or "default"
        return f"{schema.name}.{overload}"
    return name


@dataclass
class DelegationReport:
    """How much of a lowered program runs inside delegates.

    Attributes:
        delegated_nodes: compute nodes inside delegates (``lowered_module_N.original_module``).
        portable_nodes: compute nodes left outside every delegate (portable kernels).
        num_delegates: ``executorch_call_delegate`` calls.
        portable_ops: op name (``aten::native_layer_norm.default``) -> count, for the nodes left out.
        missing_kernels: ops left out whose out-variant kernel is not linked into the runtime (the program would
            fail at load with ``Missing operator``).
    """

    delegated_nodes: int
    portable_nodes: int
    num_delegates: int
    portable_ops: Counter = field(default_factory=Counter)
    missing_kernels: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        """Delegated compute nodes / all compute nodes (1.0 for an empty program)."""
        total = self.delegated_nodes + self.portable_nodes
        return self.delegated_nodes / total if total else 1.0

    def check_kernels(self) -> None:
        """Raise when an op left outside every delegate has no portable kernel (it would fail at load)."""
        if self.missing_kernels:
            raise RuntimeError(f"ops left outside every delegate have no kernel in the ExecuTorch portable library: "
                               f"{', '.join(self.missing_kernels)}; the program would fail at load with "
                               "'Missing operator'")

    def as_manifest(self) -> dict[str, Any]:
        """The manifest keys (``manifest["executorch"]``) of this report."""
        return {"delegated_fraction": round(self.fraction, 4), "delegated_nodes": self.delegated_nodes,
                "portable_nodes": self.portable_nodes, "delegates": self.num_delegates,
                "portable_ops": dict(self.portable_ops.most_common())}

    def note(self, ctx: ExportContext) -> None:
        """Say in the manifest's notes which ops a partitioner left on portable kernels."""
        if self.portable_ops:
            ctx.note(f"{self.portable_nodes} of {self.portable_nodes + self.delegated_nodes} compute nodes "
                     f"run on portable kernels: {', '.join(self.portable_ops)}")


def delegation_report(edge_program: Any) -> DelegationReport:
    """Count compute nodes inside delegates and left on portable kernels.

    Args:
        edge_program: the ``EdgeProgramManager`` that ``to_edge_transform_and_lower`` returns (or its
            ``exported_program()``), before ``to_executorch``.
    """
    from executorch.exir.delegate import executorch_call_delegate

    program = edge_program.exported_program() if hasattr(edge_program, "exported_program") else edge_program
    gm = program.graph_module
    delegated = portable = delegates = 0
    ops: Counter = Counter()
    missing: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is executorch_call_delegate:
            delegates += 1
            lowered = getattr(gm, node.args[0].target)
            delegated += sum(_is_compute(n) for n in lowered.original_module.graph.nodes)
        elif _is_compute(node):
            portable += 1
            ops[_op_name(node.target)] += 1
            op = getattr(node.target, "_op", node.target)  # EdgeOpOverload -> the aten OpOverload
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and portable_kernel_for(op) is None:
                missing.add(_op_name(node.target))
    return DelegationReport(delegated, portable, delegates, ops, sorted(missing))


# ── memory planning ────────────────────────────────────────────────────────────────────────────────────
def planned_memory_bytes(manager: Any) -> int:
    """Bytes the runtime allocates for the planned (non-constant) buffers of every method of ``manager``."""
    plans = manager.executorch_program.execution_plan
    return sum(sum(plan.non_const_buffer_sizes[1:]) for plan in plans)  # [0] is reserved by ExecuTorch


def report_planned_memory(ctx: ExportContext, planned: int, bounds: Any) -> None:
    """Say which upper bounds the dynamic dims got and the memory they plan: noted in the manifest, and logged as
    a warning where a bound was chosen for the user (a default, the config: the program refuses larger inputs)
    or the plan exceeds 1 GiB (naming the largest bound chosen for the user and the option that lowers it).
    ``bounds`` is a ``_bounds.DimBounds``.
    """
    if not bounds.roles and not bounds.bounded:
        return
    size = f"{planned / 2**20:.1f} MiB"
    if not bounds.roles:
        # Every bound is one the caller gave (an explicit Dim(max=...), a task export's max_batch, prefill_chunk and
        # max_cache_len, which generate checks before it runs): said in those terms, not by torch's symbols (the
        # manifest's note "dynamic dims given a finite upper bound" keeps them), and a warning only when the plan
        # is large enough to matter where the program loads.
        message = (f"ExecuTorch plans {size} for the upper bounds given to the dynamic dims (a task export's "
                   "--max-batch, --prefill-chunk and --max-cache-len; an explicit Dim(name, max=...) in "
                   "dynamic_shapes)")
        if planned > PLANNED_MEMORY_WARNING_BYTES:
            message += ("; the runtime allocates it when it loads the program: lower --prefill-chunk, --max-batch "
                        "or --max-cache-len (or the Dim max) to shrink it")
        ctx.note(message)
        (logger.warning if planned > PLANNED_MEMORY_WARNING_BYTES else logger.info)(message)
        return
    message = f"ExecuTorch plans {size} for the upper bounds of the dynamic dims: {bounds.summary()}"
    if planned > PLANNED_MEMORY_WARNING_BYTES:
        message += "; the runtime allocates it when it loads the program. " + _how_to_lower(bounds)
    else:
        message += f"; larger inputs are refused (raise {raise_options(bounds.roles)})"
    ctx.note(message)
    log = logger.info if bounds.user_given() and planned <= PLANNED_MEMORY_WARNING_BYTES else logger.warning
    log(message)


# a role's bound -> the ExecutorchConfig field that sets it (a role not named: dim_upper_bound)
_ROLE_OPTION = {"batch": "max_batch", "sequence": "max_seq_len", "decoder_sequence": "max_seq_len",
                "audio": "max_seq_len", "frames": "max_seq_len"}


def _options_in_user_terms(fields: list[str]) -> str:
    """``fields`` (``ExecutorchConfig`` fields) as the user sets them on either path: the CLI's flags of a
    ``--dynamic`` export (``--max-batch`` from hfexport-dynamo, the others from this package's ``_cli.py``) and
    ``hfexport.export``'s keyword arguments (config fields)."""
    flags = " / ".join(f"--{f.replace('_', '-')} N" for f in fields)
    kwargs = ", ".join(f"{f}=N" for f in fields)
    return f"`hfexport export --dynamic {flags}`, or {kwargs} in hfexport.export"


def raise_options(roles: Mapping[str, Any]) -> str:
    """How the user raises the bounds of ``roles`` (``DimBounds.roles``): the options of those roles, on the command
    line and in Python, and ``dynamic_shapes`` for any dim."""
    fields = list(dict.fromkeys(_ROLE_OPTION.get(role, "dim_upper_bound") for role in roles)) or ["dim_upper_bound"]
    return f"with {_options_in_user_terms(fields)}; or give explicit Dim(name, max=...) bounds in dynamic_shapes"


def _how_to_lower(bounds: Any) -> str:
    """What lowers the plan: the largest bound chosen for the user (by its role's option), or the generic advice."""
    chosen = [(info["max"], role) for role, info in bounds.roles.items()
              if info["source"] not in ("max_batch", "max_seq_len", "dim_upper_bound", "torch.export")]
    if chosen:
        size, role = max(chosen)
        return (f"The largest bound chosen for you is {role} <= {size} "
                f"({bounds.roles[role]['source']}): lower it with "
                f"{_options_in_user_terms([_ROLE_OPTION.get(role, 'dim_upper_bound')])}")
    return (f"Lower the bounds with {_options_in_user_terms(['max_batch', 'max_seq_len', 'dim_upper_bound'])}, or "
            "give explicit Dim(name, max=...) bounds in dynamic_shapes")
