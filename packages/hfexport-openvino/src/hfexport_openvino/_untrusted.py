"""Reading an OpenVINO IR file as untrusted input, before OpenVINO reads it.

OpenVINO runs no Python from an IR, but an IR may name operations of an *extension*: a shared library that a
caller registers with ``Core.add_extension`` and whose code then runs inside ``compile_model``. hfexport never
registers one, and refuses an IR that needs one before OpenVINO parses it: every ``<layer>``'s ``version`` must be
one of OpenVINO's own operation sets (``opset1`` ... ``opsetN`` of the installed openvino). An XML document type
declaration (``<!DOCTYPE``, ``<!ENTITY``: entity expansion) is refused too, and the weights are read only from the
``.bin`` file the manifest lists (its SHA-256 checked on load), never from a path the XML names.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

__all__ = ["IR_MAX_BYTES", "check_ir_file", "standard_opsets"]

IR_MAX_BYTES = 512 * 1024 * 1024  # the XML of a 70 B decoder is a few MB; its weights are in the .bin
_OPSET = re.compile(r"opset[0-9]{1,3}")


def standard_opsets() -> set[str]:
    """The operation-set names of the installed openvino (``{"opset1", ..., "opset16"}``)."""
    import openvino

    names = {name for name in dir(openvino) if _OPSET.fullmatch(name)}
    return names or {f"opset{i}" for i in range(1, 17)}


def check_ir_file(xml_path: str | Path) -> None:
    """Refuse an ``openvino_model.xml`` that needs an extension, declares entities or is not OpenVINO IR.

    Raises:
        ValueError: the file is not an IR hfexport reads, naming the layer and operation set it refused.
    """
    path = Path(xml_path)
    size = path.stat().st_size
    if size > IR_MAX_BYTES:
        raise ValueError(f"{path.name} is {size} bytes, over the {IR_MAX_BYTES} an OpenVINO IR's XML is allowed "
                         "(its weights belong in the .bin): the artifact is damaged or crafted")
    text = path.read_bytes()
    if b"<!DOCTYPE" in text or b"<!ENTITY" in text:
        raise ValueError(f"{path.name} declares a document type or entities, which no OpenVINO IR has: the artifact "
                         "is damaged or crafted")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise ValueError(f"{path.name} is not XML ElementTree can read ({exc}): the artifact is damaged or "
                         "crafted") from None
    if root.tag != "net":
        raise ValueError(f"{path.name} is not an OpenVINO IR (its root element is <{root.tag}>, not <net>)")
    allowed = standard_opsets()
    for layer in root.iter("layer"):
        version = layer.get("version", "")
        if version not in allowed:
            raise ValueError(f"{path.name}: layer {layer.get('name')!r} (type {layer.get('type')!r}) is of the "
                             f"operation set {version!r}, which is not one of OpenVINO's own "
                             f"({min(allowed)} ... {max(allowed, key=lambda s: int(s[5:]))}); an IR that needs an "
                             "extension library is refused: hfexport loads no code from an artifact")
