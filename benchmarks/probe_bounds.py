"""Bounds probe (issue 43): every bound the loader enforces, crafted AT its limit, measured in a fresh process.

Issue 43's acceptance: "for each backend: peak memory of ``load`` + first call + ``generate`` on any crafted
artifact under 1 MB stays within 256 MiB of a warm process and under 5 s, at every limit the loader allows". For
each bound below, the probe crafts an artifact that sits just at it (the most the loader lets through, or the
least it refuses where the check is what costs), from a seeded tiny Llama exported with ``task="text-generation"``
per backend (cached under ``--work``), then in a fresh worker process per case:

  warm         imports done, the pristine artifact of that backend loaded, ``generate`` and ``verify_stored`` run
               once, ``gc.collect()``; then ``/proc/self/clear_refs`` resets the peak (``VmHWM``) to ``VmRSS``.
  measured     ``hfexport.load(crafted)``, then (if it loaded) ``generate(ids, max_new_tokens=4)`` for a
               text-generation artifact (the first call) and ``verify_stored()``, or the op the case names
               (``verify_artifact``: ``hfexport verify``'s run at the recorded shapes); each refusal is recorded and
               the next step still runs where it can.

It prints, per case: the bound, its value, the files' size, seconds, MiB of peak RSS over the warm process, how it
ended (the steps that ran, the first refusal) and the verdict against 5 s / 256 MiB. Results go to a JSON-lines file
(``--results``) as they come, so an interrupted run resumes (``--fresh`` starts over).

    uv run python benchmarks/probe_bounds.py                      # every case (~15-30 min on 2 busy cores)
    uv run python benchmarks/probe_bounds.py --case onnx-nodes --fresh
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(1, str(ROOT / "tests"))  # crafting.py: the IR chains tests/openvino crafts too
BACKENDS = ("dynamo", "onnx", "executorch-xnnpack", "openvino")
PROMPT = [[3, 17, 42, 9, 100]]
SECONDS, MIB = 5.0, 256
MAX_NEW = 4


# ── crafting helpers ─────────────────────────────────────────────────────────────────────────────────────────
def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "export.json").read_text())


def _write_manifest(directory: Path, manifest: Any) -> None:
    (directory / "export.json").write_text(json.dumps(manifest, separators=(",", ":")))


def _rehash(directory: Path) -> None:
    import hashlib

    manifest = _manifest(directory)
    manifest["files_sha256"] = {name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
                                       "size": (directory / name).stat().st_size}
                                for name in manifest["files_sha256"]}
    _write_manifest(directory, manifest)


def _hashed_bytes(directory: Path) -> int:
    return sum(entry["size"] for entry in _manifest(directory)["files_sha256"].values())


def _decoder_file(directory: Path, suffix: str) -> Path:
    names = [n for n in _manifest(directory)["files"] if n.endswith(suffix) and "genai" not in n]
    return directory / names[0]


# ── the cases: (name, backend(s), bound, crafter(dir) -> value text, steps) ─────────────────────────────────────
def _pad_manifest(unit: str, first: str | None = None) -> Callable[[Path], str]:
    """Fill ``export.json`` to just under ``MANIFEST_MAX_BYTES`` with a JSON list of ``unit`` (inside ``config``,
    a key hfexport reads as data: the manifest stays accepted)."""

    def craft(directory: Path) -> str:
        from hfexport._trust import MANIFEST_MAX_BYTES

        manifest = _manifest(directory)
        manifest["config"]["probe_pad"] = "@PAD@"
        text = json.dumps(manifest, separators=(",", ":"))
        room = MANIFEST_MAX_BYTES - (len(text.encode()) - len('"@PAD@"')) - 2
        count = room // (len(unit) + 1)
        pad = "[" + ",".join([unit] * count) + "]"
        (directory / "export.json").write_text(text.replace('"@PAD@"', pad))
        size = (directory / "export.json").stat().st_size
        return f"{size:,} B of {count:,} x {unit[:24]!s}{'...' if len(unit) > 24 else ''}"

    return craft


def _nested_unit() -> str:
    from hfexport._trust import JSON_MAX_DEPTH

    depth = JSON_MAX_DEPTH - 4  # the manifest object, config and the pad list hold it; the leaf is a level
    return "[" * depth + "0" + "]" * depth


def _paths(component_bytes: int) -> Callable[[Path], str]:
    """As many file names as a manifest may name, each as long as allowed, each a real 1-byte file, hashed."""

    def craft(directory: Path) -> str:
        from hfexport._trust import MANIFEST_MAX_FILES, PATH_MAX_CHARS, PATH_MAX_PARTS

        manifest = _manifest(directory)
        extra = MANIFEST_MAX_FILES - len(set(manifest["files"]) | set(manifest["files_sha256"]))
        parts = min(PATH_MAX_PARTS, (PATH_MAX_CHARS + 1) // (component_bytes + 1))
        names = []
        for i in range(extra):
            head = f"p{i:03d}"
            components = [(head + "d" * component_bytes)[:component_bytes] for _ in range(parts - 1)]
            name = "/".join(components + [(head + "f" * component_bytes)[:component_bytes]])
            name = name[:PATH_MAX_CHARS]
            file = directory / name
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(b"x")
            names.append(name)
        manifest["files"] += names
        manifest["files_sha256"].update({n: {"sha256": "", "size": 1} for n in names})
        _write_manifest(directory, manifest)
        _rehash(directory)
        return (f"{MANIFEST_MAX_FILES} names, {len(names[0]):,} chars, {names[0].count('/') + 1} components of "
                f"{component_bytes} B")

    return craft


def _verification(names: str) -> Callable[[Path], str]:
    def craft(directory: Path) -> str:
        import torch
        from safetensors.torch import save_file

        from hfexport._stored import STORED_MAX_HEADER_BYTES, STORED_MAX_TENSORS

        file = _decoder_file(directory, "verification.safetensors")
        if names == "short":
            tensors = {f"outputs.t{i}": torch.zeros(48) for i in range(STORED_MAX_TENSORS)}
        else:  # names as long as keep the header just under its bound
            length = STORED_MAX_HEADER_BYTES // STORED_MAX_TENSORS - 80
            tensors = {f"outputs.{i:05d}".ljust(length, "x"): torch.zeros(1) for i in range(STORED_MAX_TENSORS)}
        save_file(tensors, file)
        header = int.from_bytes(file.read_bytes()[:8], "little")
        _rehash(directory)
        return f"{len(tensors):,} tensors, header {header:,} B"

    return craft


def _zero_leaves(directory: Path) -> str:
    from hfexport._stored import built_inputs_budget

    manifest = _manifest(directory)
    budget = built_inputs_budget(manifest)
    stored = manifest["components"]["decoder"]["verification"]["stored"]
    leaves = stored["inputs"][-1]["zero_leaves"]
    other = sum(math.prod(leaf["shape"]) * 4 for key, leaf in leaves.items() if key != "0")
    shape = list(leaves["0"]["shape"])
    per = math.prod(shape[:-1]) * 4
    shape[-1] = (budget - other) // per
    leaves["0"]["shape"] = shape
    _write_manifest(directory, manifest)
    total = other + math.prod(shape) * 4
    return f"zero leaves of {total / 2**20:,.1f} MiB (budget {budget / 2**20:,.1f} MiB)"


def _example_shape(directory: Path) -> str:
    from hfexport._stored import built_inputs_budget

    manifest = _manifest(directory)
    budget = built_inputs_budget(manifest)
    inputs = manifest["components"]["decoder"]["inputs"]
    used = sum(math.prod(e.get("example_shape", [1])) * 8 for e in inputs[1:] if "example_shape" in e)
    inputs[0]["example_shape"] = [1, (budget - used - 4 * 2048) // 8 - 1024]
    _write_manifest(directory, manifest)
    return f"input_ids example_shape {inputs[0]['example_shape']} (budget {budget / 2**20:,.1f} MiB)"


def _generation_rows(directory: Path) -> str:
    """The cache rows as large as the generation budget lets through (each keeps a dim of max_cache_len)."""
    from hfexport_dynamo.tasks.decoding import _SECTION_BASE_BYTES, _SECTION_MAX_BYTES

    manifest = _manifest(directory)
    section = manifest["generation"]
    budget = min(_SECTION_MAX_BYTES, _SECTION_BASE_BYTES + _hashed_bytes(directory))
    batch, length = section["max_batch"], section["max_cache_len"]
    rows = section["cache"]["row_shapes"]
    shapes = sum(len(layer) for layer in rows)
    room = budget - 2 * batch * length * 8
    head = rows[0][0][0]
    last = room // (shapes * batch * head * length * 4)
    section["cache"]["row_shapes"] = [[[head, length, last] for _ in layer] for layer in rows]
    _write_manifest(directory, manifest)
    total = 2 * batch * length * 8 + shapes * batch * head * length * last * 4
    return f"{shapes} rows [{head}, {length}, {last:,}]: {total / 2**20:,.1f} MiB (budget {budget / 2**20:,.1f})"


def _onnx_chain(functions: bool) -> Callable[[Path], str]:
    """The logits pass through an even chain of ``Neg`` (outputs unchanged) up to ONNX_MAX_NODES nodes written, or,
    with ``functions``, through calls of a local function of 100 ``Neg`` until the inlined size is at its bound."""

    def craft(directory: Path) -> str:
        import onnx
        from onnx import helper

        from hfexport_onnx._untrusted import ONNX_MAX_NODES, _written_nodes

        file = _decoder_file(directory, "model.onnx")
        model = onnx.load(str(file), load_external_data=False)
        written = _written_nodes(model)
        graph = model.graph
        out = graph.output[0].name
        producer = next(n for n in graph.node if out in n.output)
        producer.output[list(producer.output).index(out)] = "probe_t0"
        if functions:
            body = [helper.make_node("Neg", [f"x{i}" if i else "x"], [f"x{i + 1}" if i < 99 else "y"])
                    for i in range(100)]
            model.functions.append(helper.make_function("probe", "F", ["x"], ["y"], body,
                                                        [helper.make_opsetid("", 17)]))
            model.opset_import.append(helper.make_opsetid("probe", 1))
            calls = (ONNX_MAX_NODES - written) // 101
            calls -= calls % 2
            for i in range(calls):
                graph.node.append(helper.make_node("F", [f"probe_t{i}"], [f"probe_t{i + 1}" if i < calls - 1
                                                                         else out], domain="probe"))
            value = f"{written + 100 + calls:,} written, {written + 100 * calls:,} inlined ({calls} calls)"
        else:
            count = ONNX_MAX_NODES - written
            count -= count % 2
            for i in range(count):
                graph.node.append(helper.make_node("Neg", [f"probe_t{i}"], [f"probe_t{i + 1}" if i < count - 1
                                                                           else out]))
            value = f"{_written_nodes(model):,} nodes written"
        onnx.save(model, str(file))
        _rehash(directory)
        return value + f", {file.stat().st_size / 2**20:.2f} MiB"

    return craft


def _onnx_empty_nodes(size: int | None) -> Callable[[Path], str]:
    """An .onnx of ``size`` bytes, mostly empty nodes (2 bytes each), or (None) as many as keep the graph's entries
    at ONNX_MAX_GRAPH_ENTRIES: protobuf parses them before the node count refuses them."""

    def craft(directory: Path) -> str:
        import onnx as onnx_module

        file = _decoder_file(directory, "model.onnx")
        data = file.read_bytes()
        if size is None:
            from hfexport_onnx._untrusted import ONNX_MAX_GRAPH_ENTRIES

            graph = onnx_module.load_model_from_string(data).graph
            existing = sum(len(getattr(graph, name)) for name in (
                "node", "initializer", "sparse_initializer", "input", "output", "value_info",
                "quantization_annotation"))
            count = ONNX_MAX_GRAPH_ENTRIES - existing - 16  # the wire count also sees the graph's name, doc
        else:
            count = (size - len(data)) // 2
        # GraphProto field 1 (node), empty: 0x0a 0x00, appended to the graph (ModelProto field 7)
        import onnx

        model = onnx.load_model_from_string(data)
        graph = model.graph.SerializeToString() + b"\x0a\x00" * count
        model.ClearField("graph")
        body = model.SerializeToString()
        length = len(graph)
        varint = bytearray()
        while True:
            byte, length = length & 0x7F, length >> 7
            varint.append(byte | (0x80 if length else 0))
            if not length:
                break
        file.write_bytes(body + b"\x3a" + bytes(varint) + graph)
        _rehash(directory)
        return f"{count:,} empty nodes, {file.stat().st_size / 2**20:.1f} MiB"

    return craft


def _ir_layers(layers_total: int | None = None, depth: int | None = None, op: str = "Negative",
               paths: int = 1) -> Callable[[Path], str]:
    """The logits pass through ``paths`` (odd) parallel chains of ``op`` (``Negative``: an even count per chain;
    ``Relu``: any), joined by Add, Subtract, Add, ... (the logits unchanged), up to ``layers_total`` layers (None:
    IR_MAX_LAYERS) with a longest path of at most ``depth`` layers (None: IR_MAX_DEPTH)."""
    return lambda directory: _ir_chain(directory, layers_total, depth, op, paths)


def _ir_chain(directory: Path, layers_total: int | None, depth: int | None, op: str, paths: int) -> str:
    from xml.etree import ElementTree

    from crafting import add_ir_chains

    from hfexport_openvino._untrusted import IR_MAX_DEPTH, IR_MAX_DEPTH_SUM, IR_MAX_LAYERS, path_lengths

    assert paths % 2 == 1
    file = _decoder_file(directory, "openvino_model.xml")
    root = ElementTree.fromstring(file.read_bytes())
    existing, (base_depth, base_sum) = len(list(root.iter("layer"))), path_lengths(root)
    joins = paths - 1
    budget = (layers_total or IR_MAX_LAYERS) - existing - joins
    per = min(budget // paths, (depth or IR_MAX_DEPTH) - base_depth - joins)
    # each chain from a layer of depth <= base_depth adds about per * (per + 1) / 2 + per * base_depth
    while paths * (per * (per + 1) // 2 + per * base_depth) + base_sum > IR_MAX_DEPTH_SUM:
        per -= 2
    per -= per % 2 if op == "Negative" else 0
    add_ir_chains(root, paths, per, op, result_inputs=3)  # the logits' Result (rank 3)
    file.write_bytes(ElementTree.tostring(root))
    _rehash(directory)
    total = existing + paths * per + joins
    longest, summed = path_lengths(root)
    return (f"{total:,} layers ({paths} x {per:,} {op}), longest path {longest:,}, depths summed {summed:,}, "
            f"{file.stat().st_size / 2**20:.1f} MiB")


def _ir_folded_constant(directory: Path) -> str:
    """The logits plus ReduceMax(Broadcast(0.0, [8192, 8192])): a static tensor of exactly 2**26 elements."""
    from xml.etree import ElementTree

    import numpy as np

    from hfexport_openvino._untrusted import IR_MIN_ELEMENT_BOUND

    file = _decoder_file(directory, "openvino_model.xml")
    weights = _decoder_file(directory, "openvino_model.bin")
    side = int(math.isqrt(IR_MIN_ELEMENT_BOUND))
    assert side * side == IR_MIN_ELEMENT_BOUND
    blob = weights.read_bytes()
    offsets = {}
    extra = b""
    for key, array in (("scalar", np.zeros((), np.float32)), ("shape", np.array([side, side], np.int64)),
                       ("axes", np.array([0, 1], np.int64))):
        offsets[key] = len(blob) + len(extra)
        extra += array.tobytes()
    weights.write_bytes(blob + extra)
    root = ElementTree.fromstring(file.read_bytes())
    layers, edges = root.find("layers"), root.find("edges")
    result = next(layer for layer in layers if layer.get("type") == "Result"
                  and layer.find("input/port") is not None and len(layer.find("input/port")) == 3)
    dims = [d.text for d in result.find("input/port").iter("dim")]
    edge = next(e for e in edges if e.get("to-layer") == result.get("id"))
    base = max(int(layer.get("id")) for layer in layers) + 1
    ids = {k: str(base + i) for i, k in enumerate(("scalar", "shape", "axes", "broadcast", "reduce", "add"))}

    def layer(key: str, kind: str, version: str, data: dict | None, inputs: list[list], outputs: list[tuple]) -> None:
        element = ElementTree.SubElement(layers, "layer", id=ids[key], name=f"probe_{key}", type=kind,
                                         version=version)
        if data is not None:
            ElementTree.SubElement(element, "data", data)
        port_id = 0
        if inputs:
            section = ElementTree.SubElement(element, "input")
            for shape in inputs:
                port = ElementTree.SubElement(section, "port", id=str(port_id), precision="FP32")
                for d in shape:
                    ElementTree.SubElement(port, "dim").text = str(d)
                port_id += 1
        section = ElementTree.SubElement(element, "output")
        for shape, precision in outputs:
            port = ElementTree.SubElement(section, "port", id=str(port_id), precision=precision)
            for d in shape:
                ElementTree.SubElement(port, "dim").text = str(d)

    layer("scalar", "Const", "opset1", {"element_type": "f32", "shape": "", "offset": str(offsets["scalar"]),
                                        "size": "4"}, [], [([], "FP32")])
    layer("shape", "Const", "opset1", {"element_type": "i64", "shape": "2", "offset": str(offsets["shape"]),
                                       "size": "16"}, [], [([2], "I64")])
    layer("axes", "Const", "opset1", {"element_type": "i64", "shape": "2", "offset": str(offsets["axes"]),
                                      "size": "16"}, [], [([2], "I64")])
    layer("broadcast", "Broadcast", "opset3", {"mode": "numpy"}, [[], [2]], [([side, side], "FP32")])
    layer("reduce", "ReduceMax", "opset1", {"keep_dims": "false"}, [[side, side], [2]], [([], "FP32")])
    layer("add", "Add", "opset1", {"auto_broadcast": "numpy"}, [dims, []], [(dims, "FP32")])

    def connect(a: str, ap: int, b: str, bp: int) -> None:
        ElementTree.SubElement(edges, "edge", {"from-layer": a, "from-port": str(ap), "to-layer": b,
                                               "to-port": str(bp)})

    edges.remove(edge)
    connect(ids["scalar"], 0, ids["broadcast"], 0)
    connect(ids["shape"], 0, ids["broadcast"], 1)
    connect(ids["broadcast"], 2, ids["reduce"], 0)
    connect(ids["axes"], 0, ids["reduce"], 1)
    connect(edge.get("from-layer"), int(edge.get("from-port")), ids["add"], 0)
    connect(ids["reduce"], 2, ids["add"], 1)
    connect(ids["add"], 2, result.get("id"), int(edge.get("to-port")))
    file.write_bytes(ElementTree.tostring(root))
    _rehash(directory)
    return f"Broadcast to [{side}, {side}] f32 ({IR_MIN_ELEMENT_BOUND:,} elements, {IR_MIN_ELEMENT_BOUND * 4 >> 20} MiB)"


def _ir_elementwise_runs(op: str) -> Callable[[Path], str]:
    """As many runs of IR_MAX_ELEMENTWISE_RUN ``op`` layers as IR_MAX_LAYERS lets through, each from the logits
    (``Maximum``: of the run's last layer and the logits, a side input on every layer), joined by one Concat along
    the batch and a ReduceSum over it (not element-wise: no run grows past its bound) into the logits' Result."""

    def craft(directory: Path) -> str:
        from xml.etree import ElementTree

        import numpy as np

        from hfexport_openvino._untrusted import (
            IR_MAX_ELEMENTWISE_RUN,
            IR_MAX_LAYERS,
            elementwise_run,
            path_lengths,
        )

        file = _decoder_file(directory, "openvino_model.xml")
        weights = _decoder_file(directory, "openvino_model.bin")
        blob = weights.read_bytes()
        weights.write_bytes(blob + np.array([0], np.int64).tobytes())
        root = ElementTree.fromstring(file.read_bytes())
        layers, edges = root.find("layers"), root.find("edges")
        result = next(layer for layer in layers if layer.get("type") == "Result"
                      and len(layer.find("input/port")) == 3)
        dims = [d.text for d in result.find("input/port").iter("dim")]
        edge = next(e for e in edges if e.get("to-layer") == result.get("id"))
        edges.remove(edge)
        source, source_port = edge.get("from-layer"), edge.get("from-port")
        next_id = max(int(layer.get("id")) for layer in layers) + 1
        runs = (IR_MAX_LAYERS - len(layers) - 4) // IR_MAX_ELEMENTWISE_RUN

        def add(kind: str, version: str, inputs: list[list[str]], outputs: list[list[str]], data: dict | None = None,
                precision: str = "FP32") -> str:
            nonlocal next_id
            layer = ElementTree.SubElement(layers, "layer", id=str(next_id), name=f"probe_{next_id}", type=kind,
                                           version=version)
            if data is not None:
                ElementTree.SubElement(layer, "data", data)
            port_id = 0
            for tag, shapes in (("input", inputs), ("output", outputs)):
                if shapes:
                    section = ElementTree.SubElement(layer, tag)
                for shape in shapes:
                    port = ElementTree.SubElement(section, "port", id=str(port_id), precision=precision)
                    for d in shape:
                        ElementTree.SubElement(port, "dim").text = d
                    port_id += 1
            next_id += 1
            return layer.get("id")

        def connect(a: str, a_port: str, b: str, b_port: str) -> None:
            ElementTree.SubElement(edges, "edge", {"from-layer": a, "from-port": a_port, "to-layer": b,
                                                   "to-port": b_port})

        # the runs start at a Softmax of the logits: a MatMul takes a run as post-ops, up to a limit ("could not
        # append an elementwise post-op"), which would refuse the IR before any run is compiled on its own
        softmax = add("SoftMax", "opset1", [dims], [dims], {"axis": "2"})
        connect(source, source_port, softmax, "0")
        source, source_port = softmax, "1"
        ends = []
        for _ in range(runs):
            last, last_port = source, source_port
            for _ in range(IR_MAX_ELEMENTWISE_RUN):
                if op == "Maximum":
                    layer = add("Maximum", "opset1", [dims, dims], [dims], {"auto_broadcast": "numpy"})
                    connect(last, last_port, layer, "0")
                    connect(source, source_port, layer, "1")
                    last, last_port = layer, "2"
                else:
                    layer = add(op, "opset4", [dims], [dims])
                    connect(last, last_port, layer, "0")
                    last, last_port = layer, "1"
            ends.append((last, last_port))
        concat = add("Concat", "opset1", [dims] * runs, [["-1", *dims[1:]]], {"axis": "0"})
        for i, (end, end_port) in enumerate(ends):
            connect(end, end_port, concat, str(i))
        axes = add("Const", "opset1", [], [["1"]], {"element_type": "i64", "shape": "1", "offset": str(len(blob)),
                                                   "size": "8"}, precision="I64")
        reduce = add("ReduceSum", "opset1", [["-1", *dims[1:]], ["1"]], [["1", *dims[1:]]], {"keep_dims": "true"})
        connect(concat, str(runs), reduce, "0")
        connect(axes, "0", reduce, "1")
        connect(reduce, "2", result.get("id"), edge.get("to-port"))
        file.write_bytes(ElementTree.tostring(root))
        _rehash(directory)
        run, _ = elementwise_run(root)
        longest, summed = path_lengths(root)
        return (f"{len(list(root.iter('layer'))):,} layers ({runs} runs of {run} {op}), longest path {longest:,}, "
                f"depths summed {summed:,}, {file.stat().st_size / 2**20:.1f} MiB")

    return craft


def _ir_elements(size: int | None) -> Callable[[Path], str]:
    """An IR XML of ``size`` bytes, mostly empty elements (``<x/>``) that ElementTree builds before any bound, or
    (None) as many as keep its tags at IR_MAX_TAGS."""

    def craft(directory: Path) -> str:
        file = _decoder_file(directory, "openvino_model.xml")
        text = file.read_bytes()
        end = text.rindex(b"</net>")
        if size is None:
            from hfexport_openvino._untrusted import IR_MAX_TAGS

            count = IR_MAX_TAGS - text.count(b"<")
        else:
            count = (size - len(text)) // 4
        file.write_bytes(text[:end] + b"<x/>" * count + text[end:])
        _rehash(directory)
        return f"{count:,} empty elements, {file.stat().st_size / 2**20:.1f} MiB"

    return craft


def _pt2_members(count: int | None) -> Callable[[Path], str]:
    """``count`` extra zip members (None: as many as keep the .pt2 at 1 MB), each an empty stored file."""

    def craft(directory: Path) -> str:
        import zipfile

        from hfexport_dynamo._pt2_archive import PT2_MAX_MEMBERS

        file = _decoder_file(directory, "model.pt2")
        with zipfile.ZipFile(file) as source:
            existing = len(source.infolist())
            root = source.infolist()[0].filename.split("/")[0]
        n = (PT2_MAX_MEMBERS - existing) if count is None else count
        with zipfile.ZipFile(file, "a", zipfile.ZIP_STORED) as archive:
            for i in range(n):
                archive.writestr(f"{root}/x/{i}", b"")
        _rehash(directory)
        return f"{existing + n:,} members, {file.stat().st_size / 2**20:.1f} MiB"

    return craft


def _planned_bytes(pte: Path) -> int:
    """The bytes the ``.pte``'s check counts as planned (read from its refusal under a budget of 0)."""
    import re

    from hfexport_executorch import _pte_check

    budget = _pte_check._memory_budget
    _pte_check._memory_budget = lambda size: 0
    try:
        _pte_check.check_pte(pte, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - the refusal carries the figure
        found = re.search(r"plans ([0-9,]+) bytes", str(error))
        return int(found.group(1).replace(",", "")) if found else -1
    finally:
        _pte_check._memory_budget = budget
    return 0


def _expanded_weight(n: int, alive: int = 0) -> Any:
    """A plain module with a 0.9 MB weight that expands its 1-element input to ``n`` float32 (planned buffers of
    ``n``); with ``alive``, its XNNPACK graph keeps that many values of ``n`` alive at once (each read by the sum
    after), else it returns ``(y * 2).sum(0, keepdim=True)``."""
    import torch

    class ExpandedWeight(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(230_000))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.expand(n).contiguous() + self.weight.sum()
            if not alive:
                return (y * 2.0).sum(0, keepdim=True)
            values = [y * float(i + 2) for i in range(alive)]  # all alive until the sum below reads them
            total = values[0]
            for value in values[1:]:
                total = total + value
            return total[:1]

    return ExpandedWeight()


def _pte_planned(directory: Path) -> str:
    """A plain module (a 0.9 MB weight) whose program plans non-constant buffers just under their bound (64 MiB + 4 B
    per byte of the .pte and .ptd)."""
    import torch

    import hfexport
    from hfexport_executorch._pte_check import _buffer_budget, _memory_budget

    shutil.rmtree(directory)
    # the program plans 8 bytes of buffers an element (385,876,048 for 46 Mi; ~20 bytes in all): just under the
    # buffer bound of its ~0.92 MB
    elements = int(_buffer_budget(922_592) / 8 * 0.98)
    hfexport.export(_expanded_weight(elements).eval(), {"x": torch.ones(1)},
                    backend="executorch-xnnpack").save_pretrained(directory)
    pte = next(directory.rglob("*.pte"))
    size = sum(f.stat().st_size for f in pte.parent.iterdir() if f.suffix in (".pte", ".ptd"))
    buffers = elements * 8
    return (f".pte {pte.stat().st_size:,} B, buffers ~{buffers / 2**20:,.1f} MiB (bound "
            f"{_buffer_budget(size) / 2**20:,.1f} MiB), planned {_planned_bytes(pte) / 2**20:,.1f} MiB "
            f"(bound {_memory_budget(size) / 2**20:,.1f} MiB)")


def _pt2_expressions(directory: Path) -> str:
    """The program's distinct shape expressions (the first PROGRAM_MAX_EXPR_CALLS / EXPR_MAX_CALLS) rewritten, to the
    same value, as ``E + P - P`` with P a product of distinct ``Max`` calls (the costliest kind measured) that brings
    each to EXPR_MAX_CALLS calls."""
    import re

    from crafting import rewrite_zip

    from hfexport_dynamo._pt2_program import EXPR_MAX_CALLS, PROGRAM_MAX_EXPR_CALLS

    file = _decoder_file(directory, "model.pt2")
    count = PROGRAM_MAX_EXPR_CALLS // EXPR_MAX_CALLS - 1  # room for the calls of the program's other expressions
    done: dict[str, str] = {}

    def edit(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        out = []
        for name, data in members:
            if name.endswith("models/model.json"):
                text = data.decode()
                found = list(dict.fromkeys(re.findall(r'"expr_str": "((?:[^"\\]|\\.)*)"', text)))
                symbol = re.search(r"Symbol\('([a-z]+[0-9]+)'", text).group(1)
                for i, expr in enumerate(found[:count]):
                    own = len(re.findall(r"\b(?!Symbol\b|Integer\b)[A-Za-z_]\w*\(", expr))  # its own calls
                    product = "*".join(f"Max({symbol}, {1000 * i + k + 2})" for k in range((EXPR_MAX_CALLS - own) // 2))
                    done[expr] = f"({expr}) + {product} - {product}"
                for old, new in done.items():
                    text = text.replace(f'"expr_str": "{old}"', f'"expr_str": "{new}"')
                data = text.encode()
            out.append((name, data))
        return out

    rewrite_zip(file, edit)
    _rehash(directory)
    calls = sum(len(re.findall(r"\b(?!Symbol\b|Integer\b)[A-Za-z_]\w*\(", new)) for new in done.values())
    return (f"the program's {len(done)} distinct expressions at up to {EXPR_MAX_CALLS} calls each ({calls:,} calls), "
            f"{file.stat().st_size / 2**20:.2f} MiB")


def _treespec_nodes(directory: Path) -> str:
    """The decoder's output spec with as many empty tuples (nodes without leaves) appended to its first cache
    layer as keep the manifest under MANIFEST_MAX_BYTES (the spec is a string in it: ~60 bytes a node) or the spec
    at TREESPEC_MAX_NODES, whichever comes first."""
    from hfexport._named_types import TREESPEC_MAX_NODES
    from hfexport._trust import MANIFEST_MAX_BYTES

    manifest = _manifest(directory)
    section = manifest["components"]["decoder"]
    protocol, spec = json.loads(section["output_spec"])
    layer = spec["children_spec"][1]["children_spec"][0]
    empty = {"type": "builtins.tuple", "context": "null", "children_spec": []}
    base = len(json.dumps(manifest, separators=(",", ":")).encode())
    per = len(json.dumps(json.dumps(empty))) - 1  # escaped in the manifest's string, with its comma
    existing = json.dumps(spec).count('"children_spec"')
    count = min((MANIFEST_MAX_BYTES - base - 64) // per, TREESPEC_MAX_NODES - existing)
    children = list(layer["children_spec"])
    while True:
        layer["children_spec"] = children + [empty] * count
        section["output_spec"] = json.dumps([protocol, spec])
        size = len(json.dumps(manifest, separators=(",", ":")).encode())
        if size <= MANIFEST_MAX_BYTES - 16:
            break
        count -= (size - MANIFEST_MAX_BYTES + 16) // per + 1
    _write_manifest(directory, manifest)
    return f"{existing + count:,} nodes ({count:,} empty tuples), manifest {(directory / 'export.json').stat().st_size:,} B"


def _planned_figures(pte: Path) -> tuple[int, int]:
    """``(buffers, planned)``: the .pte's non-constant buffers and its planned memory in all (buffers and XNNPACK's
    values alive at once), as its check counts them (read from its refusal under a memory budget of 0)."""
    import re

    from hfexport_executorch import _pte_check

    budgets = _pte_check._buffer_budget, _pte_check._memory_budget
    _pte_check._buffer_budget, _pte_check._memory_budget = (lambda size: 1 << 62), (lambda size: 0)
    try:
        _pte_check.check_pte(pte, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - the refusal carries the figures
        found = re.search(r"plans ([0-9,]+) bytes of memory for its values \(([0-9,]+) of buffers", str(error))
        if found:
            return int(found.group(2).replace(",", "")), int(found.group(1).replace(",", ""))
        raise
    finally:
        _pte_check._buffer_budget, _pte_check._memory_budget = budgets
    return 0, 0


def _pte_xnnpack_values(directory: Path) -> str:
    """A plain module (a 0.9 MB weight) whose XNNPACK graph keeps 24 values of n float32 alive at once (a static
    program: the runtime plans them at these dims), n fitted so that the planned memory in all (buffers and
    XNNPACK's peak) is just under its bound (192 MiB + 64 B per byte of the .pte and .ptd), or as large as the
    buffers' bound lets the input to the delegate be."""
    import torch

    import hfexport
    from hfexport_executorch._pte_check import _buffer_budget, _memory_budget

    n = 1 << 20
    for _ in range(4):
        shutil.rmtree(directory, ignore_errors=True)
        hfexport.export(_expanded_weight(n, alive=24).eval(), {"x": torch.ones(1)}, backend="executorch-xnnpack",
                        verify=False).save_pretrained(directory)  # float32 sums of n differ from eager
        pte = next(directory.rglob("*.pte"))
        size = sum(f.stat().st_size for f in pte.parent.iterdir() if f.suffix in (".pte", ".ptd"))
        buffers, planned = _planned_figures(pte)
        bound = _memory_budget(size)
        cap = int(_buffer_budget(size) * 0.97 * n / buffers)  # the buffers grow with n as well
        if 0.95 * bound <= planned <= bound or (n >= cap * 0.99 and planned <= bound):
            break
        n = min(int(n * 0.975 * bound / planned), cap)
    return (f".pte {pte.stat().st_size:,} B, 24 x {n:,}-element values: buffers {buffers / 2**20:,.1f} MiB, planned "
            f"{planned / 2**20:,.1f} MiB (bound {bound / 2**20:,.1f} MiB)")


# ── tokenizer files that `hfexport generate DIR --prompt TEXT` reads (tokenizer.json, tokenizer_config.json) ──
PROMPT_TEXT = "hello world"
_LETTERS = "abcdefghijklmnopqrstuvwxyz "  # ids 0..26: the prompt's tokens, all under the tiny Llama's vocabulary of 128


def _tokenizer_json(vocab: dict[str, int] | None = None, merges: list[str] | None = None,
                    added: list[dict[str, Any]] | None = None, normalizer: Any = None, pre_tokenizer: Any = None,
                    decoder: Any = None) -> str:
    """A BPE tokenizer.json of the letters (and space), plus ``vocab`` entries, ``merges`` and ``added`` tokens."""
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {**{c: i for i, c in enumerate(_LETTERS)}, **(vocab or {})}, "merges": merges or []}
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added or [],
                       "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
                       "decoder": decoder, "model": model}, ensure_ascii=False, separators=(",", ":"))


def _add_tokenizer(directory: Path, tokenizer_json: str) -> None:
    """Write ``tokenizer.json`` and a ``tokenizer_config.json`` into the artifact, both hashed in its manifest."""
    (directory / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                 "model_max_length": 64}))
    manifest = _manifest(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        manifest["files_sha256"][name] = {"sha256": "", "size": 0}
    _write_manifest(directory, manifest)
    _rehash(directory)


_TOKENIZER_BYTES = 2**20 - 2**14  # the crafted tokenizer.json: under 1 MB with the rest of the artifact


def _fill(make: Callable[[int], str], per_item: int) -> int:
    """The most items ``make(n)`` may hold with the tokenizer.json under _TOKENIZER_BYTES (``per_item``: a guess)."""
    n = _TOKENIZER_BYTES // per_item
    while len(make(n).encode()) > _TOKENIZER_BYTES:
        n = int(n * 0.97)
    return n


def _tokenizer_vocab(directory: Path) -> str:
    def make(n: int) -> str:
        return _tokenizer_json(vocab={f"v{i:x}": 27 + i for i in range(n)})
    n = _fill(make, 12)
    _add_tokenizer(directory, make(n))
    return f"{27 + n:,} vocabulary entries, tokenizer.json {len(make(n).encode()):,} B"


def _tokenizer_merges(directory: Path) -> str:
    alphabet = [chr(0x4E00 + i) for i in range(400)]  # CJK: never in the prompt

    def make(n: int) -> str:
        pairs = [(alphabet[i // 400], alphabet[i % 400]) for i in range(n)]
        vocab = {c: 27 + i for i, c in enumerate(alphabet)}
        vocab.update({a + b: 427 + i for i, (a, b) in enumerate(pairs)})
        return _tokenizer_json(vocab=vocab, merges=[f"{a} {b}" for a, b in pairs])
    n = _fill(make, 20)
    _add_tokenizer(directory, make(n))
    return f"{n:,} merges, tokenizer.json {len(make(n).encode()):,} B"


def _tokenizer_added(directory: Path) -> str:
    def make(n: int) -> str:
        return _tokenizer_json(added=[{"id": 27 + i, "content": f"<{i:x}>", "single_word": False, "lstrip": False,
                                       "rstrip": False, "normalized": False, "special": i % 2 == 0}
                                      for i in range(n)])
    n = _fill(make, 100)
    _add_tokenizer(directory, make(n))
    return f"{n:,} added tokens (half special), tokenizer.json {len(make(n).encode()):,} B"


def _tokenizer_regex(directory: Path) -> str:
    """A pre-tokenizer regex that backtracks catastrophically on a run of letters (nested quantifiers)."""
    pattern = "(?:(?:[a-z]|[a-z][a-z])+)+!"
    _add_tokenizer(directory, _tokenizer_json(pre_tokenizer={"type": "Split", "pattern": {"Regex": pattern},
                                                             "behavior": "Isolated", "invert": False}))
    return f"Split pre-tokenizer {pattern!r} on {PROMPT_TEXT!r}"


def _tokenizer_expansion(replaces: int, factor: int) -> Callable[[Path], str]:
    """A normalizer Sequence of ``replaces`` Replace("o" -> "o" x factor): each "o" of the prompt becomes
    factor**replaces characters (or as many as the loader's bound lets through)."""
    def craft(directory: Path) -> str:
        step = {"type": "Replace", "pattern": {"String": "o"}, "content": "o" * factor}
        _add_tokenizer(directory, _tokenizer_json(normalizer={"type": "Sequence", "normalizers": [step] * replaces}))
        return (f"{replaces} x Replace('o' -> {factor} x 'o'): {PROMPT_TEXT.count('o')} x {factor ** replaces:,} "
                "characters")
    return craft


# (name, backends, bound, crafter, steps): steps ⊆ load, generate, verify_stored, verify_artifact, call
CASES: list[tuple[str, tuple[str, ...], str, Callable[[Path], str], tuple[str, ...]]] = [
    ("pristine", BACKENDS, "(none: the artifact as exported)", lambda d: "as exported", ("load", "generate", "verify_stored")),
    ("manifest-small-ints", ("dynamo",), "MANIFEST_MAX_BYTES 2 MiB (small ints)", _pad_manifest("0"), ("load", "generate", "verify_stored")),
    ("manifest-empty-objects", ("dynamo",), "MANIFEST_MAX_BYTES 2 MiB (empty objects)", _pad_manifest("{}"), ("load", "generate", "verify_stored")),
    ("manifest-nesting", ("dynamo",), "JSON_MAX_DEPTH 64", lambda d: _pad_manifest(_nested_unit())(d), ("load", "generate", "verify_stored")),
    ("manifest-24-digit-ints", ("dynamo",), "JSON_MAX_INT_DIGITS 24", _pad_manifest("9" * 24), ("load", "generate", "verify_stored")),
    ("paths-long", BACKENDS, "MANIFEST_MAX_FILES 256, PATH_MAX_CHARS 1,024, PATH_MAX_PARTS 16", _paths(63), ("load", "generate", "verify_stored")),
    ("paths-255-byte-parts", ("dynamo",), "PATH_PART_MAX_BYTES 255", _paths(255), ("load", "generate", "verify_stored")),
    ("treespec-nodes", ("dynamo", "onnx"), "TREESPEC_MAX_NODES 100,000 (MANIFEST_MAX_BYTES first)", _treespec_nodes, ("load", "generate", "verify_stored")),
    ("verification-tensors", ("dynamo",), "STORED_MAX_TENSORS 4,096", _verification("short"), ("load", "generate", "verify_stored")),
    ("verification-header", ("dynamo",), "STORED_MAX_HEADER_BYTES 4 MiB", _verification("long"), ("load", "generate", "verify_stored")),
    ("verify-zero-leaves", ("dynamo", "onnx"), "built_inputs_budget 64 MiB + hashed bytes", _zero_leaves, ("load", "verify_stored")),
    ("verify-example-shape", ("dynamo",), "built_inputs_budget 64 MiB + hashed bytes", _example_shape, ("verify_artifact",)),
    ("generate-cache-rows", BACKENDS, "generation budget 64 MiB + hashed bytes", _generation_rows, ("load", "generate")),
    ("onnx-nodes", ("onnx",), "ONNX_MAX_NODES 25,000", _onnx_chain(False), ("load", "generate", "verify_stored")),
    ("onnx-inlined", ("onnx",), "inlined nodes 25,000", _onnx_chain(True), ("load", "generate", "verify_stored")),
    ("onnx-entries-at-bound", ("onnx",), "ONNX_MAX_GRAPH_ENTRIES 200,000", _onnx_empty_nodes(None), ("load",)),
    ("onnx-empty-nodes-1mb", ("onnx",), "ONNX_MAX_GRAPH_ENTRIES (1 MB)", _onnx_empty_nodes(2**20), ("load",)),
    ("onnx-empty-nodes-64mb", ("onnx",), "ONNX_MAX_GRAPH_ENTRIES (64 MiB)", _onnx_empty_nodes(64 * 2**20), ("load",)),
    ("ir-tags-at-bound", ("openvino",), "IR_MAX_TAGS 327,680", _ir_elements(None), ("load", "generate")),
    ("ir-depth", ("openvino",), "IR_MAX_DEPTH 2,048, IR_MAX_DEPTH_SUM (Negative)", _ir_layers(), ("load", "generate", "verify_stored")),
    ("ir-depth-relu", ("openvino",), "IR_MAX_DEPTH 2,048 (Relu)", _ir_layers(op="Relu"), ("load", "generate")),
    ("ir-elementwise-swish", ("openvino",), "IR_MAX_ELEMENTWISE_RUN 64 (Swish runs to IR_MAX_LAYERS)", _ir_elementwise_runs("Swish"), ("load", "generate")),
    ("ir-elementwise-maximum", ("openvino",), "IR_MAX_ELEMENTWISE_RUN 64 (Maximum with a side input)", _ir_elementwise_runs("Maximum"), ("load", "generate")),
    ("ir-layers", ("openvino",), "IR_MAX_LAYERS 8,192 (5 paths)", _ir_layers(paths=5), ("load", "generate", "verify_stored")),
    ("ir-depth-sum", ("openvino",), "IR_MAX_DEPTH_SUM 2,500,000 (3 paths)", _ir_layers(paths=3), ("load", "generate", "verify_stored")),
    ("ir-static-tensor", ("openvino",), "IR_MIN_ELEMENT_BOUND 2**24", _ir_folded_constant, ("load", "generate", "verify_stored")),
    ("ir-elements-1mb", ("openvino",), "IR_MAX_TAGS (1 MB of elements)", _ir_elements(2**20), ("load", "generate")),
    ("ir-elements-64mb", ("openvino",), "IR_MAX_BYTES 64 MiB of elements", _ir_elements(64 * 2**20 - 2**16), ("load", "generate")),
    ("pt2-expressions", ("dynamo",), "EXPR_MAX_CALLS 64, PROGRAM_MAX_EXPR_CALLS 512", _pt2_expressions, ("load", "generate", "verify_stored")),
    ("pt2-members-1mb", ("dynamo",), "PT2_MAX_MEMBERS (1 MB of members)", _pt2_members(12_000), ("load",)),
    ("pt2-members-max", ("dynamo",), "PT2_MAX_MEMBERS 100,000", _pt2_members(None), ("load",)),
    ("pte-planned-memory", ("executorch-xnnpack",), "planned buffers 64 MiB + 4 B/byte", _pte_planned, ("load", "call")),
    ("pte-xnnpack-values", ("executorch-xnnpack",), "planned memory 160 MiB + 64 B/byte (XNNPACK's peak)", _pte_xnnpack_values, ("load", "call")),
    ("tokenizer-vocab", ("dynamo",), "(none: the file's size)", _tokenizer_vocab, ("generate_prompt",)),
    ("tokenizer-merges", ("dynamo",), "(none: the file's size)", _tokenizer_merges, ("generate_prompt",)),
    ("tokenizer-added-tokens", ("dynamo",), "(none: the file's size)", _tokenizer_added, ("generate_prompt",)),
    ("tokenizer-regex", ("dynamo",), "(none: Oniguruma's retry limit)", _tokenizer_regex, ("generate_prompt",)),
    ("tokenizer-expansion-at-bound", ("dynamo",), "TOKENIZER_MAX_EXPANSION 256", _tokenizer_expansion(2, 16), ("generate_prompt",)),
    ("tokenizer-expansion", ("dynamo",), "TOKENIZER_MAX_EXPANSION 256", _tokenizer_expansion(7, 10), ("generate_prompt",)),
]


# ── the worker: one case in a fresh process ─────────────────────────────────────────────────────────────────
def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _generate_prompt(directory: Path) -> None:
    """``hfexport generate DIR --prompt TEXT --max-new-tokens 4`` in this process (its output dropped)."""
    import contextlib
    import io

    from hfexport.cli import main as cli

    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = cli(["generate", str(directory), "--prompt", PROMPT_TEXT, "--max-new-tokens", str(MAX_NEW)])
    if code:
        raise RuntimeError(f"hfexport generate exited {code}: {errors.getvalue().strip()[-300:]}")


def measure(pristine: Path, crafted: Path, steps: tuple[str, ...]) -> dict[str, Any]:
    import torch

    import hfexport

    prompt = torch.tensor(PROMPT)
    if "generate_prompt" in steps:  # the CLI's path, its tokenizer imports and a small tokenizer's load warmed too
        _generate_prompt(pristine)
    warm = hfexport.load(pristine)
    warm.generate(prompt, max_new_tokens=MAX_NEW)
    warm.verify_stored()
    del warm
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    outcome: list[str] = []
    cpu = time.process_time()  # all the process's threads (ONNX Runtime's, OpenVINO's): less sensitive to load
    start = time.perf_counter()
    loaded = None
    for step in steps:
        began = time.perf_counter()
        try:
            if step == "load":
                loaded = hfexport.load(crafted)
            elif step == "generate_prompt":
                _generate_prompt(crafted)
            elif step == "verify_artifact":
                from hfexport._verify import verify_artifact

                verify_artifact(crafted, out=lambda line: None)
            elif loaded is None:
                outcome.append(f"{step}: not loaded")
                continue
            elif step == "generate":
                loaded.generate(prompt, max_new_tokens=MAX_NEW)
            elif step == "verify_stored":
                reports = loaded.verify_stored()
                if not all(r.passed for r in reports.values()):
                    outcome.append(f"{step}: ran, flagged")
                    continue
            elif step == "call":
                loaded(x=torch.ones(1))
            outcome.append(f"{step}: ok ({time.perf_counter() - began:.2f} s)")
        except Exception as error:  # noqa: BLE001 - every refusal is recorded with its type
            outcome.append(f"{step} ({time.perf_counter() - began:.2f} s): {type(error).__name__}: "
                           f"{' '.join(str(error).split())[:160]}")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": round(seconds, 2), "cpu_s": round(cpu, 2), "mib": round((_status("VmHWM") - before) / 2**20, 1),
            "warm_mib": round(before / 2**20), "outcome": outcome}


# ── the driver ──────────────────────────────────────────────────────────────────────────────────────────────
def base_artifact(backend: str, work: Path) -> Path:
    from probe_concurrent_writer import export_tiny_llama

    target = work / "base" / backend
    if not (target / "export.json").is_file():
        shutil.rmtree(target, ignore_errors=True)
        export_tiny_llama(backend, 0, target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", nargs="+", help="run only these cases (names in CASES)")
    parser.add_argument("--backend", nargs="+", choices=BACKENDS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/hfexport-probe-bounds"))
    parser.add_argument("--results", type=Path, help="JSON lines, appended as cases finish (default: WORK/results.jsonl)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--table", nargs="+", type=Path, metavar="JSONL",
                        help="only print the table of these results files (a later row of a case replaces an "
                             "earlier one, which is listed after the table as measured before)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)  # pristine crafted steps
    args = parser.parse_args()
    if args.table:
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        earlier: list[dict[str, Any]] = []
        for file in args.table:
            for line in file.read_text().splitlines():
                row = json.loads(line)
                if (row["case"], row["backend"]) in rows:
                    earlier.append(rows[(row["case"], row["backend"])])
                rows[(row["case"], row["backend"])] = row
        print_table(list(rows.values()))
        if earlier:
            print("\nmeasured before (superseded above: an earlier bound or check of this branch, or a rerun)")
            print_table(earlier, relabel=False)
        return 0
    if args.worker:
        pristine, crafted, steps = args.worker
        print("RESULT " + json.dumps(measure(Path(pristine), Path(crafted), tuple(steps.split(",")))), flush=True)
        return 0

    import hfexport

    installed = {info.name for info in hfexport.list_backends()}
    args.work.mkdir(parents=True, exist_ok=True)
    results_file = args.results or args.work / "results.jsonl"
    if args.fresh and results_file.exists():
        results_file.unlink()
    done = {}
    if results_file.exists():
        for line in results_file.read_text().splitlines():
            row = json.loads(line)
            done[(row["case"], row["backend"])] = row
    print(f"load average at start: {os.getloadavg()[0]:.2f} (on {os.cpu_count()} cores)", flush=True)
    for name, backends, bound, craft, steps in CASES:
        if args.case and name not in args.case:
            continue
        for backend in backends:
            if backend not in installed or (args.backend and backend not in args.backend):
                continue
            if (name, backend) in done:
                continue
            base = base_artifact(backend, args.work)
            if "generate_prompt" in steps:  # the warm process runs the CLI on a small tokenizer
                warm = args.work / "base" / f"{backend}-tokenizer"
                if not (warm / "tokenizer.json").is_file():
                    shutil.rmtree(warm, ignore_errors=True)
                    shutil.copytree(base, warm)
                    _add_tokenizer(warm, _tokenizer_json())
                base = warm
            crafted = args.work / "crafted" / f"{name}-{backend}"
            shutil.rmtree(crafted, ignore_errors=True)
            shutil.copytree(base, crafted)
            try:
                value = craft(crafted)
            except Exception as error:  # noqa: BLE001 - a crafting failure is reported, the probe goes on
                value = f"crafting failed: {type(error).__name__}: {error}"[:300]
                row = {"case": name, "backend": backend, "bound": bound, "value": value}
                print(json.dumps(row), flush=True)
                continue
            size = sum(f.stat().st_size for f in crafted.rglob("*") if f.is_file())
            load = os.getloadavg()[0]
            try:
                run = subprocess.run(["nice", "-n", "10", sys.executable, __file__, "--worker", str(base),
                                      str(crafted), ",".join(steps)], capture_output=True, text=True,
                                     timeout=args.timeout)
                lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
                measured = json.loads(lines[-1][7:]) if lines else {
                    "crash": f"exit {run.returncode}", "stderr": run.stderr[-600:]}
            except subprocess.TimeoutExpired:
                measured = {"crash": f"timeout after {args.timeout:.0f} s"}
            row = {"case": name, "backend": backend, "bound": bound, "value": value, "files_bytes": size,
                   "load_avg": round(load, 2), **measured}
            with results_file.open("a") as out:
                out.write(json.dumps(row) + "\n")
            done[(name, backend)] = row
            print(json.dumps(row), flush=True)
            shutil.rmtree(crafted, ignore_errors=True)
    print_table(list(done.values()))
    return 0


def verdict(row: dict[str, Any]) -> str:
    if "crash" in row:
        return "FAIL (" + row["crash"] + ")"
    if "seconds" not in row:
        return "not measured"
    over = [f"{row['seconds']} s > {SECONDS:.0f} s"] if row["seconds"] > SECONDS else []
    over += [f"+{row['mib']} MiB > {MIB}"] if row["mib"] > MIB else []
    return "ok" if not over else "OVER: " + ", ".join(over)


def print_table(rows: list[dict[str, Any]], relabel: bool = True) -> None:
    order = {name: i for i, (name, *_) in enumerate(CASES)}
    bounds = {name: bound for name, _, bound, *_ in CASES}  # the bound as the loader has it now
    rows = [{**row, "bound": bounds.get(row["case"], row["bound"]) if relabel else row["bound"]} for row in rows]
    rows = sorted(rows, key=lambda r: (order.get(r["case"], 99), BACKENDS.index(r["backend"])))
    print(f"\n{'case':<24} {'backend':<19} {'s':>6} {'cpu s':>6} {'MiB':>7} {'files':>9}  verdict; bound = value; "
          "outcome (load average when it ran)")
    for row in rows:
        size = f"{row.get('files_bytes', 0) / 2**20:.2f}M"
        print(f"{row['case']:<24} {row['backend']:<19} {row.get('seconds', '-'):>6} {row.get('cpu_s', '-'):>6} "
              f"{row.get('mib', '-'):>7} "
              f"{size:>9}  {verdict(row)}; {row['bound']} = {row['value']}; "
              f"{' | '.join(row.get('outcome', [])) or row.get('stderr', '')[-200:]} (load {row.get('load_avg')})")


if __name__ == "__main__":
    sys.exit(main())
