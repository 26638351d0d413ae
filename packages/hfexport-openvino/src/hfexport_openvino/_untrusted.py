"""Reading an OpenVINO IR file as untrusted input, before OpenVINO reads it.

OpenVINO runs no Python from an IR, but an IR may name operations of an *extension*: a shared library that a
caller registers with ``Core.add_extension`` and whose code then runs inside ``compile_model``. hfexport never
registers one, and refuses an IR that needs one before OpenVINO parses it: every ``<layer>``'s ``version`` must be
one of OpenVINO's own operation sets (``opset1`` ... ``opsetN`` of the installed openvino). XML that is not UTF-8
(UTF-16, UTF-32) and any declaration (``<!DOCTYPE``, ``<!ENTITY``: entity expansion) are refused too, as are more
layers or larger static tensors than hfexport compiles from an artifact (``compile_model`` folds constants). The
XML and the weights are handed to OpenVINO as the bytes that were hashed (``read_model`` from a string and a weights
tensor), never as paths.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

__all__ = ["IR_MAX_BYTES", "IR_MAX_LAYERS", "IR_MAX_TAGS", "IR_MIN_ELEMENT_BOUND", "check_ir_file", "standard_opsets"]

IR_MAX_BYTES = 64 * 1024 * 1024  # the XML of a 70 B decoder is a few MB; its weights are in the .bin
IR_MAX_LAYERS = 50_000  # a 70 B decoder's IR has ~10-20k layers; compile time grows with them
# Tags (``<``) of the XML, counted before ElementTree builds it: a layer has ~12 elements (~23 tags), so 40 per layer
# of IR_MAX_LAYERS. 64 MiB of empty elements (16.7 M) were built into +1.56 GiB and accepted (131 s of load at load
# 7 on 2 cores: issue 43's bounds probe)
IR_MAX_TAGS = 40 * IR_MAX_LAYERS
# The most elements a static tensor of the IR (a layer's output port) may hold: 2**24, or as many as the .bin has
# bytes when that is more. compile_model folds constants: a 1 KB IR broadcasting a constant to 6e8 elements took 73 s
# and 2.3 GiB (issue 43); at 2**26 a float32 Broadcast folded in load took +264 MiB (issue 43's bounds probe). A real
# model's static tensors are no larger than its weights.
IR_MIN_ELEMENT_BOUND = 2**24
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


def check_ir_file(xml_path: str | Path, data: bytes | None = None, weights_bytes: int = 0) -> None:
    """Refuse an ``openvino_model.xml`` that needs an extension, is not UTF-8, declares entities, is not OpenVINO IR,
    or is larger than hfexport compiles from an artifact: more than :data:`IR_MAX_LAYERS` layers, or a static
    tensor of more elements than ``max(IR_MIN_ELEMENT_BOUND, weights_bytes)`` (counted before ``compile_model``
    folds anything).

    Args:
        xml_path: the file (names it in messages; read only when ``data`` is not given).
        data: the XML's bytes as they were checked (``hfexport.trust.artifact_bytes``).
        weights_bytes: the size of the ``.bin``.

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
    if tags > IR_MAX_TAGS:
        raise ValueError(f"{path.name} has {tags:,} tags, over the bound of {IR_MAX_TAGS:,} (hfexport_openvino."
                         "_untrusted.IR_MAX_TAGS: 40 per layer of IR_MAX_LAYERS), counted before it is parsed: the "
                         "artifact is damaged or crafted")
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
        if layers > IR_MAX_LAYERS:
            raise ValueError(f"{path.name} has more than {IR_MAX_LAYERS:,} layers (hfexport_openvino._untrusted."
                             "IR_MAX_LAYERS): the artifact is damaged or crafted")
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
