"""Reading an ONNX file as untrusted input, before ONNX Runtime opens it.

ONNX Runtime runs no Python from a model, but it reads two things a crafted file controls: external-data files,
named by any tensor (an initializer, a sparse initializer, a node attribute's ``t``/``tensors``/``sparse_tensor``/
``sparse_tensors``, in the main graph, in every subgraph and in every local function), and local functions, which
it inlines at session creation (nested calls grow exponentially: a file of a few KB can ask for billions of
nodes). :func:`check_onnx_file` reads the file once with ``onnx`` (no external data loaded) and refuses:

- an external-data location that is not a file the artifact's manifest hashes (so every byte ORT reads was
  checked on load);
- more than :data:`ONNX_MAX_NODES` nodes written in the file, or an inlined size (every function call replaced
  by its body, recursively) over :data:`ONNX_INLINE_FACTOR` times the nodes written plus
  :data:`ONNX_INLINE_SLACK`; a function that calls itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ONNX_INLINE_FACTOR", "ONNX_INLINE_SLACK", "ONNX_MAX_GRAPH_ENTRIES", "ONNX_MAX_NODES", "check_external_data", "check_onnx_file",
           "external_data_files", "onnx_tensors"]

# ONNX Runtime's session creation is what costs (issue 43's bounds probe, 2 shared cores): of a 49,999-node chain,
# protobuf's parse took 0.05 s of CPU, hfexport's checks 0.19 s, the session 3.2 s (2.6 s of wall idle, 7-9 s at load
# 6-9); ~65 us a node. A decoder as hfexport exports it has 25 + 16-19 nodes a block (ONNX Runtime's fusions), 43 + 65
# unfused, 101 + 233 unoptimized (optimize=False, or the optimizer's fallback): an 8 B decoder (32 blocks) 537, 2,123
# or 7,557 nodes, a 70 B one (80 blocks) at most ~18,700. The bound keeps a crafted file near that; it bounds the
# nodes written and the nodes after inlining alike, and trust_remote_code=True lifts it.
ONNX_MAX_NODES = 25_000
ONNX_INLINE_FACTOR = 16
ONNX_INLINE_SLACK = 100_000
# Entries of the main graph (nodes, initializers, value_info, inputs, outputs, ...) and nodes of the local functions,
# counted on the protobuf wire before onnx parses the file: protobuf builds every message first (an empty node is 2
# bytes of the file and ~150 bytes parsed: 64 MiB of them took 183 s and +4.9 GiB before the node count refused
# them, issue 43's bounds probe; counting all of them on the wire first still took 14 s of CPU: the count stops at the
# bound). A real graph has about one value_info per node and far fewer initializers.
ONNX_MAX_GRAPH_ENTRIES = 8 * ONNX_MAX_NODES


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _messages(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(field number, start, end)`` of each length-delimited field of the message in ``data[start:end]``; other
    fields skipped. Stops (leaving the verdict to protobuf) at a group or a field past the end."""
    at = start
    while at < end:
        key, at = _varint(data, at)
        wire = key & 7
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > end:
                return
            yield key >> 3, at, at + length
            at += length
        else:
            return


def _count_graph_entries(name: str, data: bytes) -> None:
    """Refuse a file whose main graph holds more than :data:`ONNX_MAX_GRAPH_ENTRIES` entries, or whose local
    functions more nodes, counted on the wire before protobuf builds a message (ModelProto: ``graph`` = 7,
    ``functions`` = 25; FunctionProto: ``node`` = 7)."""
    entries = 0
    try:
        for field, start, end in _messages(data, 0, len(data)):
            if field in (7, 25):  # the graph: every entry (a node, an initializer, ...); a function: its nodes
                for inner, _, _ in _messages(data, start, end):
                    entries += field == 7 or inner == 7
                    if entries > ONNX_MAX_GRAPH_ENTRIES:
                        break
            if entries > ONNX_MAX_GRAPH_ENTRIES:
                break
    except ValueError:  # a truncated varint: not a message this scan walks; onnx's parser says what is wrong
        return
    if entries > ONNX_MAX_GRAPH_ENTRIES:
        raise ValueError(f"{name} holds more than {ONNX_MAX_GRAPH_ENTRIES:,} graph entries (nodes, initializers, "
                         f"value infos; hfexport_onnx._untrusted.ONNX_MAX_GRAPH_ENTRIES), counted before parsing{_LIFT}")


_LIFT = (": the artifact is damaged or crafted, or a model larger than hfexport loads untrusted; one from a source "
         "you trust loads with trust_remote_code=True (CLI: --trust-remote-code)")


def _load(model_path: str | Path, data: bytes | None = None, *, bounded: bool = True) -> Any:
    import onnx

    if data is None:
        data = Path(model_path).read_bytes()
    if bounded:
        _count_graph_entries(Path(model_path).name, data)

    try:
        return onnx.load_model_from_string(data)  # the checked bytes: the path is not opened again
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, RecursionError, ...
        raise ValueError(f"{Path(model_path).name} is not an ONNX model onnx can read ({type(exc).__name__}: "
                         f"{exc}): the artifact is damaged or crafted") from None


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        if attribute.HasField("sparse_tensor"):
            yield attribute.sparse_tensor.values
            yield attribute.sparse_tensor.indices
        for sparse in attribute.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)


def onnx_tensors(model: Any) -> Iterator[Any]:
    """Every ``TensorProto`` of a ``ModelProto``: initializers, sparse initializers (values and indices), node
    attributes (``t``, ``tensors``, ``sparse_tensor``, ``sparse_tensors``), in the main graph, every subgraph and
    every local function."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _locations(model: Any) -> set[str]:
    locations: set[str] = set()
    for tensor in onnx_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":  # protobuf gives bytes for a value that is not UTF-8: refused below
                locations.add(entry.value if isinstance(entry.value, str) else repr(entry.value))
        if tensor.data_location == 1 and not any(e.key == "location" for e in tensor.external_data):
            locations.add("")  # EXTERNAL without a location: refused below
    return locations


def external_data_files(model_path: str | Path) -> set[str]:
    """The external-data locations every tensor of an ONNX file names (:func:`onnx_tensors`), read without loading
    the data."""
    return _locations(_load(model_path))


def _check_locations(model: Any, model_path: Path, root: str | Path, listed: Sequence[str]) -> None:
    """Every external-data location is a file the manifest hashes, as the OS will open it: no ``..`` or ``.``
    component and no symlink on the way (walked from the artifact directory's descriptor with ``O_NOFOLLOW``,
    :func:`hfexport.trust.open_beneath`), not text normalised to a hashed name (``a/../model.onnx.data`` with ``a``
    a symlink read another file, issue 43)."""
    from hfexport.trust import open_beneath

    folder = os.path.relpath(model_path.parent, root)
    prefix = "" if folder == "." else folder.replace(os.sep, "/") + "/"
    known = set(listed)
    unlisted, linked = [], []
    for location in sorted(_locations(model)):
        parts = location.split("/")
        name = prefix + location
        if not location or os.path.isabs(location) or "\\" in location \
                or any(p in ("", ".", "..") for p in parts) or name not in known:
            unlisted.append(location)
            continue
        try:
            os.close(open_beneath(Path(root), name))
        except FileNotFoundError:
            continue  # the manifest check names a missing file
        except ValueError as exc:
            linked.append(f"{location!r} ({str(exc).split(' names ', 1)[-1]})")
    if unlisted:
        raise ValueError(f"{model_path.name} reads external data from {unlisted}, which the artifact's "
                         f"manifest does not hash as such (it hashes {sorted(listed)}; a location is a plain path, "
                         "no '.' or '..'): the artifact is damaged or crafted")
    if linked:
        raise ValueError(f"{model_path.name} reads external data through a symlink: {'; '.join(linked)}")


def check_external_data(model_path: str | Path, root: str | Path, listed: Sequence[str]) -> None:
    """Refuse an ONNX file whose tensors name external-data files that the artifact's manifest does not hash.

    Raises:
        ValueError: the names, and the files the manifest hashes.
    """
    _check_locations(_load(model_path), Path(model_path), root, listed)


def _inlined_size(model: Any, bound: int, name: str) -> int:
    """Nodes after ORT inlines every local function call (recursively, subgraphs included); stops counting past
    ``bound``. Raises ValueError on a function that calls itself."""
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    sizes: dict[tuple[str, str, str], int] = {}
    active: set[tuple[str, str, str]] = set()

    def nodes(node_list: Any) -> int:
        total = 0
        for node in node_list:
            key = (node.domain, node.op_type, getattr(node, "overload", ""))
            total += function_size(key) if key in functions else 1
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    total += nodes(attribute.g.node)
                for graph in attribute.graphs:
                    total += nodes(graph.node)
            if total > bound:
                return total
        return total

    def function_size(key: tuple[str, str, str]) -> int:
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ValueError(f"{name}: local function {key[0]}::{key[1]} calls itself: the artifact is damaged or "
                             "crafted")
        active.add(key)
        sizes[key] = nodes(functions[key].node)
        active.discard(key)
        return sizes[key]

    return nodes(model.graph.node)


def _written_nodes(model: Any) -> int:
    count = 0
    todo = [model.graph, *model.functions]
    while todo:
        graph = todo.pop()
        for node in graph.node:
            count += 1
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    todo.append(attribute.g)
                todo.extend(attribute.graphs)
    return count


def check_onnx_file(model_path: str | Path, root: str | Path, listed: Sequence[str], data: bytes | None = None, *,
                    trust_remote_code: bool = False) -> set[str]:
    """Check an ONNX file of an artifact before ONNX Runtime opens it (see the module docstring): external data
    only from files the manifest hashes, at most :data:`ONNX_MAX_NODES` nodes written, and an inlined size of at
    most ``ONNX_INLINE_FACTOR * nodes written + ONNX_INLINE_SLACK``.

    Args:
        model_path: the ONNX file, inside ``root``.
        root: the artifact directory.
        listed: the files the manifest hashes (``files_sha256``'s names), relative to ``root``.
        trust_remote_code: the caller trusts the artifact's source: the bounds on its size (graph entries, nodes,
            :data:`ONNX_MAX_NODES` after inlining; they bound the session's time) are not applied; the inlining
            factor and the external-data checks are.

    Returns:
        The external-data locations its tensors name.

    Raises:
        ValueError: what is refused, with the bound it exceeds.
    """
    model_path = Path(model_path)
    model = _load(model_path, data, bounded=not trust_remote_code)
    _check_locations(model, model_path, root, listed)
    locations = _locations(model)
    written = _written_nodes(model)
    if written > ONNX_MAX_NODES and not trust_remote_code:
        raise ValueError(f"{model_path.name} has {written:,} nodes, over the bound of {ONNX_MAX_NODES:,} "
                         "(hfexport_onnx._untrusted.ONNX_MAX_NODES: ONNX Runtime's session takes ~65 us a node; an "
                         f"8 B decoder has at most ~7,600){_LIFT}")
    bound = ONNX_INLINE_FACTOR * written + ONNX_INLINE_SLACK
    bound = bound if trust_remote_code else min(bound, ONNX_MAX_NODES)
    inlined = _inlined_size(model, bound, model_path.name)
    if inlined > bound:
        raise ValueError(f"{model_path.name}'s local functions inline to over {bound:,} nodes (the lesser of "
                         f"{ONNX_INLINE_FACTOR} x the {written:,} nodes it holds + {ONNX_INLINE_SLACK:,} and "
                         f"ONNX_MAX_NODES={ONNX_MAX_NODES:,}; hfexport_onnx._untrusted): ONNX Runtime would build them "
                         "at session creation; the artifact is damaged or crafted")
    return locations
