"""ONNX Runtime GenAI files for a text-generation decoder: ``genai_model.onnx`` and ``genai_config.json``.

ORT GenAI (``onnxruntime_genai``, and its C, C#, Java and mobile runtimes) runs a decoder whose graph has the inputs
``input_ids [batch, seq]``, ``attention_mask [batch, total_sequence_length]`` (1 at every position that holds a
token, the past ones included), ``position_ids [batch, seq]``, ``past_key_values.<i>.key`` / ``.value`` and the
outputs ``logits [batch, seq or 1, vocab]``, ``present.<i>.key`` / ``.value``, as its model builder writes them, and a
``genai_config.json`` beside it (``model.decoder``: file, names, head counts; ``search``: defaults; token ids).

hfexport's ``decoder`` program (``hfexport_dynamo.tasks.causal_lm.CausalLMStep``) keeps a cache of fixed capacity,
``[batch, kv_heads, max_cache_len, head_dim]``, written in place at ``past_length``, with a mask over that whole
capacity. ORT GenAI takes such a cache as is: a static sequence dim in the past inputs makes it share one buffer for
past and present (``past_present_share_buffer``), and a ``logits`` output whose dim 1 is 1 is read as the last
position's. So ``genai_model.onnx`` is the decoder's graph with:

* ``past_length`` computed, ``attention_mask.shape[1] - input_ids.shape[1]``, instead of taken;
* the mask ORT GenAI passes (``[batch, total]``) padded with zeros to ``max_cache_len``;
* the cache inputs and outputs renamed, and ``logits`` unsqueezed to ``[batch, 1, vocab]``.

Its weights are the decoder's: the initializers keep pointing into ``model.onnx.data`` (stored once). The files are
written by the component's writer when the artifact is saved (planned by ``OnnxExporter.package``'s step
``genai``: ``onnx.save of genai_model.onnx + genai_config.json for onnxruntime-genai``); the component then lies at
the artifact's root (``Component.at_root``), so ``onnxruntime_genai.Model("<artifact>")`` runs it and
``onnxruntime_genai.Tokenizer(model)`` reads the ``tokenizer.json`` / ``tokenizer_config.json`` there (what
``hfexport export`` copies from the model's folder). ``genai_config.json`` could also sit above the decoder's
folder: ORT GenAI (0.18) joins ``model.decoder.filename`` to the config's folder, and ``"decoder/genai_model.onnx"``
loads (its external data read beside it); the root layout keeps one rule for ORT GenAI and OpenVINO GenAI, whose
``LLMPipeline`` reads ``openvino_model.xml`` and its ``.bin`` only at the folder it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENAI_CONFIG", "GENAI_MODEL", "GenaiDecoder", "genai_decoder"]

GENAI_CONFIG = "genai_config.json"
GENAI_MODEL = "genai_model.onnx"
_CACHE = re.compile(r"^cache\.(\d+)\.([01])$")
_KIND = {"0": "key", "1": "value"}


@dataclass(frozen=True)
class GenaiDecoder:
    """What ORT GenAI's files of one decoder say.

    Attributes:
        layers: the decoder's layers (cache pairs).
        max_cache_len: the cache's capacity in positions (the graph's past/present sequence dim; ``search.max_length``).
        config: ``genai_config.json``'s content.
        renames: the decoder graph's input and output names -> ORT GenAI's.
    """

    layers: int
    max_cache_len: int
    config: dict[str, Any]
    renames: dict[str, str]

    @property
    def manifest(self) -> dict[str, Any]:
        """The component's manifest section ``genai``: the files (relative to the component's folder) and the
        cache's capacity."""
        return {"config_file": GENAI_CONFIG, "model_file": GENAI_MODEL, "max_length": self.max_cache_len}

    def writer(self, write: Callable[[Path], Any]) -> Callable[[Path], list[str]]:
        """``write`` (the component's writer of ``model.onnx`` and its data) followed by the ORT GenAI files."""
        def write_with_genai(directory: Path) -> list[str]:
            written = list(write(directory) or [])
            return [*written, *self.write(Path(directory))]

        return write_with_genai

    def write(self, directory: Path, model_file: str = "model.onnx") -> list[str]:
        """Write ``genai_model.onnx`` (``model_file``'s graph, rewired; its weights not copied) and
        ``genai_config.json`` into ``directory``; their names."""
        import onnx

        model = onnx.load(str(directory / model_file), load_external_data=False)
        rewire(model.graph, self.renames, self.max_cache_len)
        onnx.save(model, str(directory / GENAI_MODEL))
        (directory / GENAI_CONFIG).write_text(json.dumps(self.config, indent=2) + "\n")
        return [GENAI_MODEL, GENAI_CONFIG]


def genai_decoder(io: Mapping[str, Any], cache_shapes: Sequence[Sequence[int]], *, vocab_size: int,
                  num_attention_heads: int, hidden_size: int, generation: Mapping[str, Any]) -> GenaiDecoder | None:
    """The ORT GenAI files of a decoder program, or ``None`` when the program is not one ORT GenAI can run.

    Args:
        io: the ONNX section's ``input_leaves`` and ``output_leaves`` (``input_ids``, ``attention_mask``,
            ``position_ids``, ``past_length``, ``cache.<i>.<0|1>``; ``logits``, ``cache.<i>.<0|1>_1``).
        cache_shapes: the graph's cache input shapes, ``[batch, kv_heads, max_cache_len, head_dim]`` each.
        vocab_size, num_attention_heads, hidden_size: the model's.
        generation: the generation config's fields (``eos_token_id`` int or list, ``bos_token_id``, ``pad_token_id``,
            ``do_sample``, ``top_k``, ``top_p``, ``temperature``, ``repetition_penalty``).

    Returns:
        ``None`` for a program ORT GenAI has no names for: not ``input_ids`` + ``attention_mask`` + ``past_length``
        + per-layer key/value pairs in, ``logits`` + the same pairs out (``inputs_embeds`` decoders, caches kept in
        buffers, encoder-decoders).
    """
    inputs = [n for n in io.get("input_leaves", []) if n is not None]
    outputs = [n for n in io.get("output_leaves", []) if n is not None]
    caches = [n for n in inputs if _CACHE.match(n)]
    plain = [n for n in inputs if not _CACHE.match(n)]
    if (not caches or len(caches) % 2 or len(cache_shapes) != len(caches)
            or not {"input_ids", "attention_mask", "past_length"} <= set(plain)
            or not set(plain) <= {"input_ids", "attention_mask", "position_ids", "past_length"}
            or outputs != ["logits", *(f"{n}_1" for n in caches)]):
        return None
    shapes = {tuple(int(d) for d in shape) for shape in cache_shapes}
    if len(shapes) != 1 or len(next(iter(shapes))) != 4:
        return None  # per-layer capacities or head dims differ: ORT GenAI's share-buffer cache has one shape
    _, kv_heads, max_cache_len, head_size = next(iter(shapes))
    layers = len(caches) // 2
    renames: dict[str, str] = {}
    for name in caches:
        layer, kind = _CACHE.match(name).groups()  # type: ignore[union-attr]
        renames[name] = f"past_key_values.{layer}.{_KIND[kind]}"
        renames[f"{name}_1"] = f"present.{layer}.{_KIND[kind]}"

    eos = generation.get("eos_token_id")
    eos_ids = [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])]
    pad = generation.get("pad_token_id")
    decoder_inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
                      "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    if "position_ids" in plain:
        decoder_inputs["position_ids"] = "position_ids"

    def number(key: str, default: float) -> float:
        value = generation.get(key)
        return default if value is None else value

    config = {
        "model": {
            "type": "decoder",  # ORT GenAI's generic decoder-only model (its LLM types share its code path)
            "bos_token_id": generation.get("bos_token_id"),
            # ORT GenAI has no "no eos": it needs ids in [0, vocab) and stops at the pad id when the list is empty; a
            # model without an eos id (a test's tiny config) stops there at its pad id, or 0
            "eos_token_id": eos_ids if len(eos_ids) != 1 else eos_ids[0],
            "pad_token_id": int(pad) if pad is not None else (eos_ids[0] if eos_ids else 0),
            "context_length": max_cache_len,
            "vocab_size": int(vocab_size),
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": GENAI_MODEL,
                "head_size": int(head_size),
                "hidden_size": int(hidden_size),
                "num_attention_heads": int(num_attention_heads),
                "num_key_value_heads": int(kv_heads),
                "num_hidden_layers": layers,
                "inputs": decoder_inputs,
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {
            "batch_size": 1,
            "do_sample": bool(generation.get("do_sample", False)),
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": max_cache_len,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,  # a cache of fixed capacity: ORT GenAI refuses beams with it
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": number("repetition_penalty", 1.0),
            "temperature": number("temperature", 1.0),
            "top_k": int(number("top_k", 50)),
            "top_p": number("top_p", 1.0),
        },
    }
    if config["model"]["bos_token_id"] is None:
        del config["model"]["bos_token_id"]
    return GenaiDecoder(layers, int(max_cache_len), config, renames)


def rewire(graph: Any, renames: Mapping[str, str], max_cache_len: int) -> None:
    """Rewrite the decoder ``graph`` (an ``onnx.GraphProto``) in place into ORT GenAI's: see the module docstring."""
    from onnx import TensorProto, helper

    def rename_everywhere(old: str, new: str) -> None:
        for node in graph.node:
            node.input[:] = [new if n == old else n for n in node.input]
            node.output[:] = [new if n == old else n for n in node.output]
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.name == old:
                value.name = new

    # the mask ORT GenAI passes, [batch, total], becomes the decoder's [batch, max_cache_len] one
    full_mask = "hfexport_genai.attention_mask_full"
    for node in graph.node:
        node.input[:] = [full_mask if n == "attention_mask" else n for n in node.input]
    mask = next(v for v in graph.input if v.name == "attention_mask")
    mask.type.tensor_type.shape.dim[1].ClearField("dim_value")
    mask.type.tensor_type.shape.dim[1].dim_param = "total_sequence_length"
    past = next(v for v in graph.input if v.name == "past_length")
    graph.input.remove(past)

    def name(suffix: str) -> str:
        return f"hfexport_genai.{suffix}"

    const = helper.make_tensor
    new_nodes = [
        helper.make_node("Constant", [], [name("one")], value=const(name("one_v"), TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], [name("capacity")],
                         value=const(name("capacity_v"), TensorProto.INT64, [1], [max_cache_len])),
        helper.make_node("Constant", [], [name("zeros3")],
                         value=const(name("zeros3_v"), TensorProto.INT64, [3], [0, 0, 0])),
        helper.make_node("Shape", ["attention_mask"], [name("total")], start=1, end=2),
        helper.make_node("Shape", ["input_ids"], [name("seq")], start=1, end=2),
        helper.make_node("Sub", [name("total"), name("seq")], [name("past")]),
        helper.make_node("Squeeze", [name("past")], ["past_length"]),
        helper.make_node("Sub", [name("capacity"), name("total")], [name("pad")]),
        helper.make_node("Concat", [name("zeros3"), name("pad")], [name("pads")], axis=0),
        helper.make_node("Pad", ["attention_mask", name("pads")], [full_mask], mode="constant"),
    ]
    # logits [batch, vocab] -> [batch, 1, vocab]: ORT GenAI reads a dim 1 of 1 as the last position's logits
    last = name("logits_last")
    for node in graph.node:
        node.output[:] = [last if n == "logits" else n for n in node.output]
        node.input[:] = [last if n == "logits" else n for n in node.input]
    logits = next(v for v in graph.output if v.name == "logits")
    dims = list(logits.type.tensor_type.shape.dim)
    new_shape = [dims[0].dim_value or dims[0].dim_param, 1, dims[-1].dim_value or dims[-1].dim_param]
    graph.output.remove(logits)
    graph.output.insert(0, helper.make_tensor_value_info("logits", logits.type.tensor_type.elem_type, new_shape))
    tail = [helper.make_node("Constant", [], [name("axis1")],
                             value=const(name("axis1_v"), TensorProto.INT64, [1], [1])),
            helper.make_node("Unsqueeze", [last, name("axis1")], ["logits"])]
    nodes = [*new_nodes, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)
    for old, new in renames.items():
        rename_everywhere(old, new)
