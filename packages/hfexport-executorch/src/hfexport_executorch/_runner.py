"""ExecutorchRunner: runs ``model.pte`` on the ExecuTorch runtime (``executorch.runtime``)."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from hfexport import IntegrityError, ManifestError
from hfexport.memory import anonymous_mappings, collapse_in_background, new_memory
from hfexport.plugin import FileRunner
from hfexport.trust import descriptor_path, torch_dtype

from ._attention import register_llm_kernels
from ._pte_check import check_pte
from ._quiet import without_cpuinfo_lines, without_temp_allocator_lines

__all__ = ["DATA_FILE_SUFFIX", "ExecutorchRunner", "PROGRAM_FILE", "check_pte_header", "input_dtypes",
           "input_mutations", "program_writer"]

PROGRAM_FILE = "model.pte"
DATA_FILE_SUFFIX = ".ptd"
# A program (.pte + .ptd) at least this large is collected before the runtime loads it, and before a reset loads it
# again: its lowered graphs and their weights' bytes would otherwise be held beside the runtime's copy (the size of
# the model twice). A full collection costs 0.2-0.5 s in a process holding torch, transformers and ExecuTorch (about
# 500,000 objects), the whole of a small model's lowering budget; below this size the doubled memory is harmless.
COLLECT_FROM_BYTES = 64 * 2**20


def _collect_if_large(files: Sequence[Path]) -> None:
    """``gc.collect()`` and hand free heap pages back, where ``files`` hold ``COLLECT_FROM_BYTES`` or more."""
    if sum(p.stat().st_size for p in files if p.is_file()) >= COLLECT_FROM_BYTES:
        gc.collect()  # fx graphs hold reference cycles: their lowered modules go only with a collection
        release_free_memory()


def input_mutations(program: Any) -> list[int]:
    """The input leaf index of each input that the lowered ``program`` (an ``ExportedProgram`` after
    ``to_executorch``) mutates, in the order of the outputs that carry their new values: ExecuTorch's emitter drops
    the outputs of mutated buffers but keeps those of mutated user inputs, before the user outputs.

    Raises:
        NotImplementedError: such an output comes after a user output (not seen; the runner could not tell them).
    """
    signature = program.graph_signature
    user_inputs = [spec.arg.name for spec in signature.input_specs if spec.kind.name == "USER_INPUT"]
    kinds = [spec for spec in signature.output_specs if spec.kind.name != "BUFFER_MUTATION"]
    mutated = [spec for spec in kinds if spec.kind.name == "USER_INPUT_MUTATION"]
    if kinds[:len(mutated)] != mutated:
        raise NotImplementedError("the lowered program returns the new value of a mutated input after a user output")
    return [user_inputs.index(spec.target) for spec in mutated]


def input_dtypes(inputs: Mapping[str, Any]) -> list[str | None]:
    """The dtype of every input leaf, in the order the runner flattens them (``None`` for non-tensor leaves)."""
    return [str(leaf.dtype).removeprefix("torch.") if isinstance(leaf, torch.Tensor) else None
            for leaf in pytree.tree_leaves(tuple(inputs.values()))]


_PTE_IDENTIFIER = re.compile(rb"ET[0-9]{2}")


def check_pte_header(path: Path, data: bytes | None = None) -> None:
    """Check a ``.pte``'s headers before the runtime reads it: a crafted header aborts the interpreter inside the
    runtime (``0xff`` over the first 16 bytes: SIGABRT, measured on executorch 1.5.1). The flatbuffer's root offset
    lies inside the program, its file identifier is ``ET<nn>``, and the extended header (``eh00``, written by
    ``executorch.exir._serialize._program`` when the program has segments: delegates or constants outside the
    flatbuffer) gives a program size, a segment offset and a segment size that fit the file.

    Raises:
        hfexport.IntegrityError: names the file and what does not fit.
    """
    if data is not None:  # the checked bytes the runtime is handed
        size, head = len(data), data[:40]
    else:
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(40)
    problem = None
    if len(head) < 40:
        problem = f"{size} bytes, shorter than its headers"
    else:
        root = int.from_bytes(head[0:4], "little")
        length = int.from_bytes(head[12:16], "little")
        program_size = int.from_bytes(head[16:24], "little")
        segment_base = int.from_bytes(head[24:32], "little")
        segment_size = int.from_bytes(head[32:40], "little") if length > 24 else 0
        if not _PTE_IDENTIFIER.fullmatch(head[4:8]):
            problem = f"file identifier {bytes(head[4:8])!r}, not ET<nn>"
        elif head[8:12] != b"eh00":  # no extended header: a program without segments (nothing delegated)
            if not 8 <= root < size:
                problem = f"a root offset of {root:,} in a file of {size:,}"
        elif not 24 <= length <= 64:
            problem = f"an extended header of {length} bytes"
        elif not (40 <= program_size <= size and root < program_size):
            problem = f"a program of {program_size:,} bytes (root at {root:,}) in a file of {size:,}"
        elif segment_size and not (program_size <= segment_base and segment_base + segment_size <= size):
            problem = f"segments at {segment_base:,} of {segment_size:,} bytes in a file of {size:,}"
    if problem is not None:
        raise IntegrityError(f"{path.name} is not a .pte the ExecuTorch runtime can read safely: {problem}; the file "
                             "is damaged or crafted", [path.name])


class ExecutorchRunner(FileRunner):
    """Runs ``model.pte`` on the ExecuTorch runtime: flat input leaves in, flat outputs out.

    Args:
        path: the ``.pte`` file.
        data_path: the ``.ptd`` file holding the weights, for variants that keep them outside the program (CUDA).
        input_dtypes: the dtype of each input leaf (float inputs are cast to it, e.g. bfloat16 for CUDA).
        method: the method to run.
        program_bytes: the ``.pte``'s bytes as a loaded artifact's check read them (``hfexport.trust.
            artifact_bytes``): checked and handed to the runtime from memory, the path not opened again.
        data_fd: an open descriptor of the ``.ptd`` whose bytes a loaded artifact's check hashed
            (``hfexport.trust.artifact_descriptor``); the runner owns it. The runtime's API takes a path and maps
            the file: it and ``check_pte`` get ``hfexport.trust.descriptor_path(data_fd)``, the hashed file itself,
            never ``data_path`` again (a ``.ptd`` renamed over the artifact's after the check is not read).
        untrusted: read the files as untrusted input before the runtime does (:func:`check_pte`): ``True`` for a
            loaded artifact, ``"trusted"`` for one loaded with ``trust_remote_code=True`` (delegates other than
            XNNPACK allowed), ``False`` for a program hfexport has just written itself.

    Inputs are passed as contiguous CPU tensors (the ExecuTorch Python runtime takes host memory; a delegate copies
    to its device).
    """

    program_file: ClassVar[str] = PROGRAM_FILE
    # A loaded artifact's program (untrusted set) moves the memory its method allocated when it loaded (XNNPACK's
    # packed weights, which every decode step reads) into transparent huge pages where Linux allows it, on a
    # background thread (hfexport/memory.py); False: never. The seeded 58 M-parameter Llama's 8da4w decode step,
    # one thread, CPU time per step (load ~7): 3.25 ms in 4 KiB pages, 2.10 ms collapsed (optimum-executorch's
    # program on the same runtime: 2.48 and 1.81). A program the export just lowered (its verification) is not
    # collapsed: it runs a few times and is dropped.
    huge_pages: ClassVar[bool] = True

    def __init__(self, path: str | Path, data_path: str | Path | None = None, *,
                 input_dtypes: Sequence[str | None] | None = None, method: str = "forward",
                 untrusted: bool | str = False, input_mutations: Sequence[int] = (),
                 program_bytes: bytes | None = None, data_fd: int | None = None):
        self.data_fd = data_fd  # a loaded artifact's checked .ptd, open: the runtime maps that file, not the path's
        if data_fd is not None:  # the runner's from here, closed with it (reset() opens the program again from it)
            weakref.finalize(self, os.close, data_fd)
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in input_mutations):
            raise ManifestError("export.json", [f"executorch.input_mutations {list(input_mutations)!r:.200} is not a "
                                                "list of input leaf indices"])
        self.input_mutations = list(input_mutations)
        self.program_bytes = program_bytes  # a loaded artifact's checked .pte bytes: the runtime reads these
        self.input_dtypes = [torch_dtype(d) if d else None for d in (input_dtypes or [])]
        if any(d and t is None for d, t in zip(input_dtypes or [], self.input_dtypes, strict=True)):
            raise ManifestError("export.json", [f"executorch.input_dtypes {list(input_dtypes or [])} names a dtype "
                                                "torch does not have"])
        self.method_name = method
        self.untrusted = untrusted
        super().__init__(path, data_path)
        self.open()

    def open(self) -> None:
        from executorch.runtime import Runtime

        register_llm_kernels()  # generation programs call ExecuTorch's LLM kernels (_attention.py)
        check_pte_header(self.path, self.program_bytes)
        # the .ptd the check hashed, by its descriptor: the runtime maps a path, and the path may now name another file
        data_source = descriptor_path(self.data_fd) if self.data_fd is not None else self.data_path
        if self.untrusted:
            check_pte(self.path, self.data_path, trust_remote_code=self.untrusted == "trusted", data=self.program_bytes,
                      data_fd=self.data_fd)
        source = self.program_bytes if self.program_bytes is not None else self.path
        collapse = self.huge_pages and bool(self.untrusted)
        before = anonymous_mappings() if collapse else set()
        try:  # the runtime verifies the flatbuffer (Verification.InternalConsistency, its default) before use
            self.program = Runtime.get().load_program(source, data_path=data_source)
            if self.method_name not in self.program.method_names:  # load_method would raise a bare KeyError
                raise IntegrityError(f"{self.path.name} has no method {self.method_name!r} (it has "
                                     f"{sorted(self.program.method_names)}): the file is damaged or crafted, or "
                                     "is not this artifact's program", [p.name for p in self.files])
            with without_cpuinfo_lines():  # the threadpool's /sys report, printed when the first method loads
                self.method = self.program.load_method(self.method_name)
        except (RuntimeError, MemoryError) as exc:  # "Failed to load program, error: 0x23" names no file
            files = [p.name for p in self.files]
            if not self.untrusted:  # the program this process just lowered: the lowering is at fault, not the file
                raise RuntimeError(f"the ExecuTorch runtime cannot load the program it was just lowered to "
                                   f"({exc}): a delegate or kernel refused it at load time; the runtime's log "
                                   "lines above name which") from None
            raise IntegrityError(f"the ExecuTorch runtime cannot load {' with '.join(files)} ({exc}): the file is "
                                 "damaged or crafted, or was written by another ExecuTorch version", files) from None
        if self.method is None:
            raise ValueError(f"{self.path} has no method {self.method_name!r}; it has "
                             f"{sorted(self.program.method_names)}")
        self.huge_page_bytes: int | None = None  # set when the collapse has run (0: nothing it could collapse)
        if collapse:  # what loading the method mapped: the delegates' packed weights
            thread = collapse_in_background(new_memory(before, anonymous_mappings()),
                                            done=lambda collapsed: setattr(self, "huge_page_bytes", collapsed),
                                            name="hfexport-executorch-huge-pages")
            if thread is None:  # no new mapping (the allocator reused freed memory) or no huge pages here
                self.huge_page_bytes = 0

    def reset(self) -> None:
        """Open the program again: its mutable buffers start from their initial value (the runtime initializes
        them when a program's method loads into fresh memory; reloading only the method would keep the values
        of buffers the program serializes without one). The old program goes first: the runtime would otherwise
        hold both while the new one loads (its delegates' packed weights: the size of the model)."""
        self.method = self.program = None
        _collect_if_large(self.files)
        self.open()

    @classmethod
    def from_writer(cls, write: Callable[[Path], Path | None], **kwargs: Any) -> ExecutorchRunner:
        """``write(directory)`` (:func:`program_writer`) into a temporary directory owned by the runner, then the
        program opened from there (the runtime reads the file as a saved artifact would be read)."""
        with cls.temporary_directory("executorch") as directory:
            data_path = write(directory)
            return cls(directory / cls.program_file, data_path=data_path, **kwargs).owning(directory)

    @classmethod
    def from_program_manager(cls, manager: Any, **kwargs: Any) -> ExecutorchRunner:
        """Write an ``ExecutorchProgramManager``'s ``.pte`` (and ``.ptd``) into a temporary directory owned by the
        runner, and open it from there."""
        return cls.from_writer(program_writer(manager), **kwargs)

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        flat = self.flat_inputs(args, self.input_dtypes)
        if self.input_dtypes and len(flat) != len(self.input_dtypes):
            raise TypeError(f"expected {len(self.input_dtypes)} input leaves after flattening, got {len(flat)}")
        with without_temp_allocator_lines():
            outputs = self.method.execute(flat)
        # The outputs live in the method's planned memory: copy them out before the next call reuses it.
        outputs = [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]
        return self.write_back_input_mutations(args, outputs)

    def write_back_input_mutations(self, args: tuple[Any, ...], outputs: list[Any]) -> list[Any]:
        """The method's outputs without its leading new values of the inputs the program mutates in place
        (``input_mutations``: their input leaf indices), which are copied into the caller's input tensors, as eager
        ``forward`` would have changed them (a cache's conv state updated with ``copy_``: LFM2)."""
        count = len(self.input_mutations)
        if not count:
            return outputs
        if len(outputs) < count:
            raise RuntimeError(f"the program returned {len(outputs)} outputs; it mutates {count} inputs, whose new "
                               "values come first")
        import torch.utils._pytree as pytree

        leaves = pytree.tree_leaves(tuple(args))
        for index, value in zip(self.input_mutations, outputs[:count], strict=True):
            leaf = leaves[index] if index < len(leaves) else None
            if isinstance(leaf, torch.Tensor) and isinstance(value, torch.Tensor) and leaf.shape == value.shape:
                with torch.no_grad():
                    leaf.copy_(value)
        return outputs[count:]


def program_writer(manager: Any) -> Callable[[Path], Path | None]:
    """``write(directory)`` for :meth:`ExecutorchRunner.from_writer`: writes ``manager``'s ``.pte`` (and ``.ptd``), then
    lets go of the manager and, for a program of ``COLLECT_FROM_BYTES`` or more, collects it, so that the runtime does not load the program while the lowered
    programs and the bytes of their weights (the size of the model) are still held. The caller drops its own
    references first."""
    held = [manager]
    del manager

    def write(directory: Path) -> Path | None:
        manager = held.pop()
        with open(directory / PROGRAM_FILE, "wb") as file:
            manager.write_to_file(file)
        data_files: list[Path] = []
        if getattr(manager, "_tensor_data", None):  # set by write_to_file: weights kept outside the .pte
            manager.write_tensor_data_to_file(directory)
            data_files = sorted(directory.glob(f"*{DATA_FILE_SUFFIX}"))
        del manager
        _collect_if_large([directory / PROGRAM_FILE, *data_files])
        if len(data_files) > 1:
            raise ValueError(f"the program has {len(data_files)} data files ({[p.name for p in data_files]}); "
                             "the ExecuTorch runtime loads one")
        return data_files[0] if data_files else None

    return write


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    The bytes of the weights that the lowering serializes are freed in pieces below glibc's mmap threshold (it rises
    to 32 MiB after the first large free), so they stay in the heap: the process's resident size does not drop
    when they go, and the runtime then loads the program on top of them.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    libc.malloc_trim(0)
