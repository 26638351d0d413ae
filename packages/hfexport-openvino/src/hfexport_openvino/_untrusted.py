"""Reading an OpenVINO IR file as untrusted input, before OpenVINO reads it.

OpenVINO runs no Python from an IR, but an IR may name operations of an *extension*: a shared library that a
caller registers with ``Core.add_extension`` and whose code then runs inside ``compile_model``. hfexport never
registers one, and refuses an IR that needs one before OpenVINO parses it: every ``<layer>``'s ``version`` must be
one of OpenVINO's own operation sets (``opset1`` ... ``opsetN`` of the installed openvino). XML that is not UTF-8
(UTF-16, UTF-32) and any declaration (``<!DOCTYPE``, ``<!ENTITY``: entity expansion) are refused too, as are more
layers, a longer path through them, longer runs of element-wise layers or larger static tensors than hfexport
compiles from an artifact (``compile_model``'s time grows with the square of the longest path and of a fused run,
and more; it folds constants); the loader also compiles it with the CPU plugin's snippets off. The
XML and the weights are handed to OpenVINO as the bytes that were hashed (``read_model`` from a string and a weights
tensor), never as paths.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

__all__ = ["ELEMENTWISE_TYPES", "IR_MAX_BYTES", "IR_MAX_DEPTH", "IR_MAX_DEPTH_SUM", "IR_MAX_ELEMENTWISE_RUN",
           "IR_MAX_LAYERS", "IR_MAX_TAGS", "IR_MIN_ELEMENT_BOUND", "check_ir_file", "elementwise_run", "path_lengths",
           "standard_opsets"]

IR_MAX_BYTES = 64 * 1024 * 1024  # the XML of a 70 B decoder is a few MB; its weights are in the .bin
# compile_model's time grows faster than the layers, and fastest with the longest path through the graph: on 2 shared
# cores (CPU seconds; issue 43's bounds probe) read_model took 0.05 s of a 4,999-layer chain of Negative and
# compile_model 9.3 s; chains of 1,000 layers compiled in 0.2 s (MatMul), 0.3 s (Negative), 2.0 s (Relu), 7.4 s
# (Swish), of 2,000 in 1.7 s (Negative) and 10.5 s (Relu), 5 paths of 1,536 Relu 67 s. A decoder's IR, as hfexport
# exports it, has 109 + 122 layers a block and a longest path of ~36 a block: an 8 B decoder (32 blocks) 4,013 layers,
# longest path 1,164, compiled in 0.9 s. The bounds keep it at half of them; a 70 B decoder (80 blocks, ~9,900
# layers, longest path ~2,900) loads with trust_remote_code=True only.
IR_MAX_LAYERS = 8_192
IR_MAX_DEPTH = 2_048
# Every layer's depth (the layers on its longest path from an input) summed, which tracks compile_model's time across
# shapes better than either bound alone (issue 43's bounds probe, CPU seconds at load 4 on 2 cores): a chain of 2,047
# Negative layers sums 2.1 M (1.6 s), 5 paths of 1,566 Negative 6.8 M (6.8 s); the 8 B decoder's IR sums 1.09 M
# (0.9 s), a 70 B one ~7 M.
IR_MAX_DEPTH_SUM = 2_500_000
# Tags (``<``) of the XML, counted before ElementTree builds it: a layer has ~12 elements (~23 tags), so 40 per layer
# of IR_MAX_LAYERS. 64 MiB of empty elements (16.7 M) were built into +1.56 GiB and accepted (131 s of load at load
# 7 on 2 cores: issue 43's bounds probe)
IR_MAX_TAGS = 40 * IR_MAX_LAYERS
# The most elements a static tensor of the IR (a layer's output port) may hold: 2**24, or as many as the .bin has
# bytes when that is more. compile_model folds constants: a 1 KB IR broadcasting a constant to 6e8 elements took 73 s
# and 2.3 GiB (issue 43); at 2**26 a float32 Broadcast folded in load took +264 MiB (issue 43's bounds probe). A real
# model's static tensors are no larger than its weights.
IR_MIN_ELEMENT_BOUND = 2**24
# The longest run of element-wise layers (ELEMENTWISE_TYPES) each fed by the one before it, whose output feeds
# nothing else: the CPU plugin fuses such a run into one element-wise node (and, with snippets on, one JIT subgraph),
# in time that grows with the square of the run and more. Measured with openvino's Python API on 2 shared cores (CPU
# seconds of compile_model, issue 43): 1,000 Relu 2.0-2.8 s, 2,000 10.5 s; 1,000 Swish 7.4 s; 500 Add of a second
# Parameter 7.8 s (0.27 s with SNIPPETS_MODE=DISABLE, 2,000 of them 2.9 s); 500 of Maximum, Power, PRelu,
# SquaredDifference or Mod with a constant 1.7-2.2 s. Runs of 64 cost little however many there are: 120 runs of 64
# Add (7,802 layers) compiled in 0.72 s (0.58 s without snippets), 120 of 64 Relu 0.42 s. Real decoders' IRs have
# runs of 1-3 whatever their depth (RMSNorm's Add-Sqrt-Divide; the residual Adds feed the next norm as well, which
# ends a run): hfexport's toy Llama, a 32-block (8 B-shaped) Llama and Qwen2.5-0.5B, and optimum-intel's Qwen2.5-0.5B.
IR_MAX_ELEMENTWISE_RUN = 64
ELEMENTWISE_TYPES = frozenset({
    "Abs", "Acos", "Acosh", "Add", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd", "BitwiseNot", "BitwiseOr",
    "BitwiseXor", "Ceiling", "Clamp", "Convert", "Cos", "Cosh", "Divide", "Elu", "Equal", "Erf", "Exp",
    "FakeQuantize", "Floor", "FloorMod", "Gelu", "Greater", "GreaterEqual", "HSigmoid", "HSwish", "IsFinite", "IsInf",
    "IsNaN", "Less", "LessEqual", "Log", "LogicalAnd", "LogicalNot", "LogicalOr", "LogicalXor", "Maximum", "Minimum",
    "Mish", "Mod", "Multiply", "Negative", "NotEqual", "Power", "PRelu", "Relu", "Round", "Select", "Selu",
    "Sigmoid", "Sign", "Sin", "Sinh", "SoftPlus", "SoftSign", "Sqrt", "SquaredDifference", "Subtract", "Swish", "Tan",
    "Tanh"})
# Element-wise layers whose runs compile as fast as any layers' (they become the plugin's scale-shift): these count
# only with a second input that is not a constant. 2,000 of each with a constant: Multiply 0.45 s, Divide 0.44 s,
# Add 1.6 s, Subtract 1.8 s, Negative 1.4 s (the longest path's cost, as 2,000 of any layer: IR_MAX_DEPTH).
_SCALE_SHIFT_TYPES = frozenset({"Add", "Convert", "Divide", "Multiply", "Negative", "Subtract"})
_OPSET = re.compile(r"opset[0-9]{1,3}")
_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}
_DECLARED_ENCODING = re.compile(rb"""^(?:\xef\xbb\xbf)?<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")


def standard_opsets() -> set[str]:
    """The operation-set names of the installed openvino (``{"opset1", ..., "opset16"}``)."""
    import openvino

    names = {name for name in dir(openvino) if _OPSET.fullmatch(name)}
    return names or {f"opset{i}" for i in range(1, 17)}


def _refuse_encoding_and_declarations(name: str, text: bytes) -> None:
    """UTF-8 (or ASCII) only, and no declaration (``<!DOCTYPE``, ``<!ENTITY``, any ``<!`` but a comment), whatever the
    encoding: a UTF-16 IR passed a ``<!DOCTYPE`` byte test and its entities expanded (+1.2 GiB, issue 43)."""
    for bom, encoding in _BOMS.items():
        if text.startswith(bom):
            raise ValueError(f"{name} is {encoding} (byte order mark {bom!r}); an OpenVINO IR hfexport reads is UTF-8: "
                             "the artifact is damaged or crafted")
    if b"\x00" in text:
        raise ValueError(f"{name} holds NUL bytes (UTF-16 or UTF-32 without a byte order mark, or binary); an OpenVINO "
                         "IR hfexport reads is UTF-8: the artifact is damaged or crafted")
    declared = _DECLARED_ENCODING.match(text)
    if declared and declared.group(1).lower() not in (b"utf-8", b"utf8", b"us-ascii", b"ascii"):
        raise ValueError(f"{name} declares encoding {declared.group(1).decode()!r}; an OpenVINO IR hfexport reads is "
                         "UTF-8: the artifact is damaged or crafted")
    for match in re.finditer(rb"<!", text):
        if not text.startswith(b"<!--", match.start()):
            what = text[match.start():match.start() + 10].decode("utf-8", "replace")
            raise ValueError(f"{name} declares {what!r}... (a document type, an entity or a section), which no "
                             "OpenVINO IR has: the artifact is damaged or crafted")


def check_ir_file(xml_path: str | Path, data: bytes | None = None, weights_bytes: int = 0, *,
                  trust_remote_code: bool = False) -> None:
    """Refuse an ``openvino_model.xml`` that needs an extension, is not UTF-8, declares entities, is not OpenVINO IR,
    or is larger than hfexport compiles from an artifact: more than :data:`IR_MAX_LAYERS` layers, a path through its
    edges longer than :data:`IR_MAX_DEPTH` layers (both lifted by ``trust_remote_code=True``), or a static tensor of
    more elements than ``max(IR_MIN_ELEMENT_BOUND, weights_bytes)`` (counted before ``compile_model`` folds
    anything), layers deeper in all than :data:`IR_MAX_DEPTH_SUM`, or a run of element-wise layers the CPU plugin
    fuses longer than :data:`IR_MAX_ELEMENTWISE_RUN` (both lifted likewise).

    Args:
        xml_path: the file (names it in messages; read only when ``data`` is not given).
        data: the XML's bytes as they were checked (``hfexport.trust.artifact_bytes``).
        weights_bytes: the size of the ``.bin``.
        trust_remote_code: the caller trusts the artifact's source: the layer and depth bounds (which bound
            ``compile_model``'s time, not what runs) are not applied.

    Raises:
        ValueError: what is refused, with the bound and the value.
    """
    path = Path(xml_path)
    size = len(data) if data is not None else path.stat().st_size
    if size > IR_MAX_BYTES:
        raise ValueError(f"{path.name} is {size:,} bytes, over the {IR_MAX_BYTES:,} an OpenVINO IR's XML is allowed "
                         "(its weights belong in the .bin): the artifact is damaged or crafted")
    text = data if data is not None else path.read_bytes()
    _refuse_encoding_and_declarations(path.name, text)
    tags = text.count(b"<")
    if tags > IR_MAX_TAGS and not trust_remote_code:
        raise ValueError(f"{path.name} has {tags:,} tags, over the bound of {IR_MAX_TAGS:,} (hfexport_openvino."
                         f"_untrusted.IR_MAX_TAGS: 40 per layer of IR_MAX_LAYERS), counted before it is parsed{_LIFT}")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise ValueError(f"{path.name} is not XML ElementTree can read ({exc}): the artifact is damaged or "
                         "crafted") from None
    if root.tag != "net":
        raise ValueError(f"{path.name} is not an OpenVINO IR (its root element is <{root.tag}>, not <net>)")
    allowed = standard_opsets()
    layers = 0
    bound = max(IR_MIN_ELEMENT_BOUND, weights_bytes)
    for layer in root.iter("layer"):
        layers += 1
        if layers > IR_MAX_LAYERS and not trust_remote_code:
            raise ValueError(f"{path.name} has more than {IR_MAX_LAYERS:,} layers, the bound "
                             "(hfexport_openvino._untrusted.IR_MAX_LAYERS: compile_model's time grows faster than the "
                             f"layers; an 8 B decoder has ~4,000){_LIFT}")
        version = layer.get("version", "")
        if version not in allowed:
            raise ValueError(f"{path.name}: layer {layer.get('name')!r} (type {layer.get('type')!r}) is of the "
                             f"operation set {version!r}, which is not one of OpenVINO's own "
                             f"({min(allowed)} ... {max(allowed, key=lambda s: int(s[5:]))}); an IR that needs an "
                             "extension library is refused: hfexport loads no code from an artifact")
        for output in layer.iter("output"):
            for port in output.iter("port"):
                elements = 1
                for dim in port.iter("dim"):
                    value = (dim.text or "").strip()
                    if value.isdigit():
                        elements *= int(value)
                if elements > bound:
                    raise ValueError(f"{path.name}: layer {layer.get('name')!r:.60} (type {layer.get('type')!r}) "
                                     f"outputs a tensor of {elements:,} elements, over the bound of {bound:,} (the "
                                     ".bin's bytes, at least IR_MIN_ELEMENT_BOUND): compile_model would fold or "
                                     "allocate it; the artifact is damaged or crafted")
    if not trust_remote_code:
        depth, total = path_lengths(root, path.name)
        if depth > IR_MAX_DEPTH:
            raise ValueError(f"{path.name} has a path of {depth:,} layers through its edges, over the bound of "
                             f"{IR_MAX_DEPTH:,} (hfexport_openvino._untrusted.IR_MAX_DEPTH: compile_model's time grows "
                             f"with the square of it and more; an 8 B decoder's is ~1,200){_LIFT}")
        if total > IR_MAX_DEPTH_SUM:
            raise ValueError(f"{path.name}'s layers lie {total:,} layers deep in all (each layer's longest path from an "
                             f"input, summed), over the bound of {IR_MAX_DEPTH_SUM:,} (hfexport_openvino._untrusted."
                             "IR_MAX_DEPTH_SUM: compile_model's time grows with it; an 8 B decoder's is ~1.1 M)"
                             f"{_LIFT}")
        run, last = elementwise_run(root)
        if run > IR_MAX_ELEMENTWISE_RUN:
            raise ValueError(f"{path.name} has a run of {run:,} element-wise layers (ending at layer {last!r:.60}), "
                             f"over the bound of {IR_MAX_ELEMENTWISE_RUN:,} (hfexport_openvino._untrusted."
                             "IR_MAX_ELEMENTWISE_RUN: the CPU plugin fuses such a run in time that grows with its "
                             f"square and more; a decoder's runs are of 1-3 layers){_LIFT}")


_LIFT = (": the artifact is damaged or crafted, or a model larger than hfexport loads untrusted; one from a source "
         "you trust loads with trust_remote_code=True (CLI: --trust-remote-code)")


def _topological(root: ElementTree.Element) -> tuple[list[str | None], dict[str | None, list[tuple[str | None, str | None]]]]:
    """The layers' ids in an order where every edge goes forward (Kahn's; a cycle's layers are left out), and each
    layer's incoming edges as ``(source layer, target port)``. Edges that name no layer are skipped."""
    ids = [layer.get("id") for layer in root.iter("layer")]
    known = set(ids)
    successors: dict[str | None, list[str | None]] = {}
    sources: dict[str | None, list[tuple[str | None, str | None]]] = {}
    incoming = dict.fromkeys(ids, 0)
    for edges in root.iter("edges"):
        for edge in edges.iter("edge"):
            source, target = edge.get("from-layer"), edge.get("to-layer")
            if source in known and target in known:
                successors.setdefault(source, []).append(target)
                sources.setdefault(target, []).append((source, edge.get("to-port")))
                incoming[target] += 1
    ready = [layer for layer, count in incoming.items() if count == 0]
    order = []
    while ready:
        layer = ready.pop()
        order.append(layer)
        for target in successors.get(layer, ()):
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    return order, sources


def elementwise_run(root: ElementTree.Element) -> tuple[int, str | None]:
    """``(length, name of its last layer)``: the longest run of element-wise layers (:data:`ELEMENTWISE_TYPES`;
    Add, Subtract, Multiply, Divide, Negative and Convert only with a second input that is not a ``Const``) in which
    each layer takes an input from the one before it and that one's output feeds nothing else (one edge out), as
    the CPU plugin fuses them. From the parsed XML, in one pass over the layers in topological order."""
    layers = {layer.get("id"): layer for layer in root.iter("layer")}
    order, sources = _topological(root)
    consumers: dict[str | None, int] = {}
    for edges in sources.values():
        for source, _ in edges:
            consumers[source] = consumers.get(source, 0) + 1
    run: dict[str | None, int] = {}
    best, last = 0, None
    for layer_id in order:
        layer = layers[layer_id]
        kind = layer.get("type")
        if kind not in ELEMENTWISE_TYPES:
            continue
        inputs = sources.get(layer_id, [])
        data = [source for source, _ in inputs if layers[source].get("type") != "Const"]
        if kind in _SCALE_SHIFT_TYPES and len(data) <= 1:
            continue
        length = 1 + max((run[source] for source in data if source in run and consumers.get(source) == 1), default=0)
        run[layer_id] = length
        if length > best:
            best, last = length, layer.get("name")
    return best, last


def path_lengths(root: ElementTree.Element, name: str = "the IR") -> tuple[int, int]:
    """``(longest, summed)``: the most layers on a path along the IR's ``<edges>``, and every layer's depth (the
    layers on its longest path from a layer without inputs, itself included) summed; from the parsed XML, in one pass
    over the layers and edges (Kahn's order). Edges that name no layer are skipped (``read_model`` refuses them).

    Raises:
        ValueError: the edges form a cycle.
    """
    ids = {layer.get("id") for layer in root.iter("layer")}
    order, sources = _topological(root)
    depth: dict[str | None, int] = {}
    for layer in order:  # every source of a layer comes before it
        depth[layer] = 1 + max((depth[source] for source, _ in sources.get(layer, ())), default=0)
    done = len(order)
    if done < len(ids):
        raise ValueError(f"{name}'s edges form a cycle ({len(ids) - done:,} layers on or after it): the artifact is "
                         "damaged or crafted")
    return max(depth.values(), default=0), sum(depth.values())
