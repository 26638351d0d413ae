"""The runners of a component: the :class:`Runner` protocol and :class:`FileRunner`, the base of runners whose runtime
reads a program file (written once to a temporary directory for an in-memory export, so that the runtime reads it as
it would read a saved artifact)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

__all__ = ["FileRunner", "Runner"]


class Runner(Protocol):
    """Runs an exported program on its runtime.

    ``run(args)`` takes the top-level inputs in signature order (tensors or pytrees of tensors) and
    returns the flat list of output tensors, in the order of the program's output spec.

    A runner whose runs change its state (a program that mutates buffers, as eager ``forward`` would) also
    implements ``reset()``, which returns that state to the program's initial value: an export's verification
    run calls it, so that the artifact an export returns starts where the model did.

    A runner whose runtime keeps a generation program's growing cache as its own state
    (``RuntimeNeeds(cache_layout="growing")``) still takes and returns the cache in ``run`` (setting its state
    from the inputs), and also implements ``run_keeping_cache(inputs)``: ``{name: tensor}`` of the other inputs, the
    cache kept from the last call (``reset()`` empties it); returns the ``logits`` tensor.
    """

    def run(self, args: tuple[Any, ...]) -> list[Any]: ...


def _link_or_copy(source: Path, target: Path, *, link: bool) -> None:
    """``target`` as a hard link to ``source`` where ``link`` is set and the file system allows (a runner's own
    temporary file, which nothing writes again: a 2 GB ``model.onnx.data`` saved in no time and stored once on
    disk), else as a copy."""
    if link:
        try:
            os.link(source, target)
            return
        except OSError:  # another file system (EXDEV), or one without hard links
            pass
    shutil.copyfile(source, target)


class FileRunner:
    """Base of runners whose runtime reads a program file (ONNX Runtime, ExecuTorch, OpenVINO).

    An in-memory export is written once into a temporary directory owned by the runner (removed when the
    runner is garbage-collected), so the runtime reads the file exactly as it would read a saved artifact;
    saving copies the files. Subclasses set ``program_file``, open the runtime in their own ``__init__`` (after
    this one: the base never calls back into a subclass) and implement :meth:`run`::

        with FileRunner.temporary_directory("onnx") as directory:   # removed if writing or opening fails
            write_the_program(directory)
            runner = MyRunner(directory / MyRunner.program_file).owning(directory)

    Args:
        path: the program file.
        data_path: a file of weights kept beside the program (``model.onnx.data``, ``.ptd``), if any.
    """

    program_file: ClassVar[str] = "model.bin"

    def __init__(self, path: str | os.PathLike[str], data_path: str | os.PathLike[str] | None = None):
        self.path = Path(path)
        self.data_path = Path(data_path) if data_path else None
        self._cleanup: Any = None

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    @staticmethod
    @contextlib.contextmanager
    def temporary_directory(name: str) -> Iterator[Path]:
        """A fresh temporary directory for an in-memory export's files, removed when the ``with`` body raises;
        otherwise the runner made in the body takes it over (:meth:`owning`)."""
        directory = Path(tempfile.mkdtemp(prefix=f"hfexport-{name}-"))
        try:
            yield directory
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def owning(self, directory: Path) -> Any:
        """This runner, which now owns ``directory`` (removed when the runner is garbage-collected); returns self."""
        self._cleanup = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        return self

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.path, self.data_path) if p is not None]

    @property
    def data_file(self) -> str | None:
        return self.data_path.name if self.data_path else None

    def write_files(self, directory: Path) -> list[str]:
        """Copy the program file (as ``program_file``) and its data file into ``directory``; their names."""
        names = []
        for source in self.files:
            name = self.program_file if source == self.path else source.name
            _link_or_copy(source, Path(directory) / name, link=self._cleanup is not None)
            names.append(name)
        return names

    @staticmethod
    def flat_inputs(args: Sequence[Any], dtypes: Sequence[Any] = ()) -> list[Any]:
        """The pytree leaves of ``args``; tensors detached, on the CPU, contiguous, and cast to ``dtypes[i]``
        when both are floating point."""
        import torch
        import torch.utils._pytree as pytree

        flat = []
        for i, leaf in enumerate(pytree.tree_leaves(tuple(args))):
            if isinstance(leaf, torch.Tensor):  # each call only where it changes something: a decode step's inputs
                if leaf.requires_grad:          # are ~20 tensors, and each no-op call costs microseconds
                    leaf = leaf.detach()
                if leaf.device.type != "cpu":
                    leaf = leaf.to("cpu")
                dtype = dtypes[i] if i < len(dtypes) else None
                if dtype is not None and leaf.dtype != dtype and leaf.is_floating_point() and dtype.is_floating_point:
                    leaf = leaf.to(dtype)
                if not leaf.is_contiguous():
                    leaf = leaf.contiguous()
            flat.append(leaf)
        return flat
