"""The verification an export stores: its inputs and eager outputs in ``verification.safetensors``, described in
the component's manifest section, so that ``hfexport verify DIR`` re-runs them on the runtime without the model.

The file holds flat tensors keyed ``inputs.<input name>.<leaf index>`` and ``outputs.<output name>``; the section
``verification.stored`` says how to rebuild them::

    {"data_file": "verification.safetensors",
     "inputs": [{"name": "input_ids", "leaves": 1},
                {"name": "cache", "leaves": 4, "spec": "<treespec JSON>",
                 "zero_leaves": {"0": {"shape": [1, 2, 4096, 64], "dtype": "float32"}, ...}}],
     "outputs": ["logits"], "state_outputs": ["cache"]}

Two things are left out of the file, so that a generation artifact stays the size of its weights: an input leaf
of zeros (a KV cache of fixed capacity before its first write) is described by its shape and dtype
(``zero_leaves``) and rebuilt as zeros; an output that carries an input's state forward (its name is an input's:
the ``cache`` a decoder returns) is compared when the model is exported but not stored (``state_outputs``): the
stored outputs computed from it (the logits) check it on a re-run.

Loading it runs no code: safetensors holds only tensors; a pytree input's structure is a ``treespec_dumps`` string
read by hfexport's own reader (:func:`hfexport._named_types.load_treespec`: allow-listed types, nothing imported); every key, input name and
output name is checked against the manifest before the runtime runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._named_types import load_treespec, torch_dtype

__all__ = ["VERIFICATION_FILE", "read_stored", "stored_inputs_and_outputs", "verification_tensors", "write_stored"]

VERIFICATION_FILE = "verification.safetensors"
_ZERO_LEAF_MIN_NUMEL = 256  # smaller zero leaves are stored as they are
_ZERO_LEAVES_MAX_BYTES = 8 * 2**30  # a 0.5-8 B model's KV cache of 4,096 positions fits
# what verification may build beyond the artifact's own size: 512 MiB let a 0.5 MB artifact's zero leaves take
# +1,026 MiB of verify_stored (issue 43's bounds probe: the leaves and a copy); a real model's cache is far under
# its weights, which count too
_BUILT_INPUTS_BASE_BYTES = 64 * 2**20
STORED_MAX_TENSORS = 4096  # tensors of a verification.safetensors (a 100-layer model's cache is 200 leaves)
STORED_MAX_HEADER_BYTES = 4 * 2**20  # its JSON header


def built_inputs_budget(manifest: Mapping[str, Any]) -> int:
    """The most bytes of inputs a verification builds from an artifact's manifest (zero leaves, inputs at the recorded
    shapes): 64 MiB plus the size of the artifact's hashed files (checked before any load), at most 8 GiB. An
    artifact under 1 MB cannot make ``hfexport verify`` allocate 256 MiB; a model's cache stays far under its weights."""
    hashed = manifest.get("files_sha256")
    size = sum(e["size"] for e in hashed.values() if isinstance(e, dict) and isinstance(e.get("size"), int)) \
        if isinstance(hashed, dict) else 0
    return min(_ZERO_LEAVES_MAX_BYTES, _BUILT_INPUTS_BASE_BYTES + size)


def _zero_dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool)


def verification_tensors(inputs: Mapping[str, Any], input_names: list[str], named_outputs: list[tuple[str, Any]]
                         ) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """``(tensors, stored)``: the flat tensors to save and the manifest's description of them; or why they cannot
    be stored (an input leaf that is not a tensor, a structure with no serialized form)."""
    import torch
    import torch.utils._pytree as pytree

    tensors: dict[str, Any] = {}
    entries = []
    for name in input_names:
        if name not in inputs:
            return f"input {name!r} of the program was not among the verified inputs"
        value = inputs[name]
        leaves, spec = pytree.tree_flatten(value)
        bad = [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)]
        if bad:
            return f"input {name!r} holds {', '.join(bad)} leaves (safetensors stores tensors only)"
        entry: dict[str, Any] = {"name": name, "leaves": len(leaves)}
        if not isinstance(value, torch.Tensor):
            try:
                entry["spec"] = pytree.treespec_dumps(spec)
            except Exception as exc:  # a pytree type registered without a serialized name
                return f"input {name!r} is a {type(value).__name__} whose structure has no serialized form ({exc})"
        for i, leaf in enumerate(leaves):
            if leaf.numel() >= _ZERO_LEAF_MIN_NUMEL and leaf.dtype in _zero_dtypes() and not bool(leaf.any()):
                entry.setdefault("zero_leaves", {})[str(i)] = {"shape": list(leaf.shape),
                                                              "dtype": str(leaf.dtype).removeprefix("torch.")}
            else:
                tensors[f"inputs.{name}.{i}"] = leaf.detach().to("cpu").clone().contiguous()
        entries.append(entry)
    outputs, state = [], []
    for name, leaf in named_outputs:
        if name.split(".", 1)[0] in input_names:  # the state an input carries, updated: compared, not stored
            state.append(name)
        elif isinstance(leaf, torch.Tensor):
            tensors[f"outputs.{name}"] = leaf.detach().to("cpu").clone().contiguous()
            outputs.append(name)
    stored = {"data_file": VERIFICATION_FILE, "inputs": entries, "outputs": outputs}
    if state:
        stored["state_outputs"] = sorted({n.split(".", 1)[0] for n in state})
    return tensors, stored


def _zero_leaves(entry: Mapping[str, Any], where: str, budget: list[int]) -> dict[int, Any]:
    """The zero leaves an input entry describes (``zero_leaves``) as ``{leaf index: (shape, dtype)}``, each checked
    before anything is allocated: a leaf index of the entry, a shape of non-negative ints, a dtype of
    :func:`_zero_dtypes`, and their bytes taken from ``budget[0]`` (shared by all the entries of a component: a
    crafted manifest cannot make a verification allocate without bound)."""

    described = entry.get("zero_leaves", {})
    if not isinstance(described, dict):
        raise ValueError(f"{where}: stored input {entry['name']!r} has zero_leaves that are not an object")
    zeros = {}
    dtypes = {str(d).removeprefix("torch."): d for d in _zero_dtypes()}
    for key, spec in described.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < entry["leaves"] and isinstance(spec, dict)
                and isinstance(spec.get("shape"), list) and spec.get("dtype") in dtypes
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec["shape"])):
            raise ValueError(f"{where}: stored input {entry['name']!r} has a malformed zero leaf {key!r}: {spec!r}")
        dtype = dtypes[spec["dtype"]]
        numel = 1
        for d in spec["shape"]:
            numel *= d
        budget[0] -= numel * dtype.itemsize
        if budget[0] < 0:
            raise ValueError(f"{where}: stored input {entry['name']!r} describes more than {budget[1]} bytes of "
                             "zeros (with the inputs before it): the artifact is damaged or crafted")
        zeros[int(key)] = (spec["shape"], dtype)
    return zeros


def write_stored(tensors: Mapping[str, Any], path: Path) -> None:
    """Write ``tensors`` to ``path`` with safetensors (no pickle), with the mode a plain ``open`` gives (safetensors'
    ``save_file`` creates ``-rw-------``, unlike the artifact's other files)."""
    from safetensors.torch import save

    path.parent.mkdir(parents=True, exist_ok=True)
    data = save(dict(tensors))
    with open(path, "wb") as file:  # mode 0o666 less the umask, as every other file of the artifact
        file.write(data)


def read_stored(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """The tensors of a ``verification.safetensors`` (safetensors runs no code: header JSON and raw bytes).

    Raises:
        hfexport.IntegrityError: safetensors cannot read it (names the file).
    """
    import io

    from safetensors.torch import load, load_file

    from ._trust import IntegrityError, parse_json

    name = Path(path).name
    # data: the bytes artifact_bytes read and checked (the path is not opened again)
    with (io.BytesIO(data) if data is not None else open(path, "rb")) as file:  # the tensor count, before safetensors
        head = file.read(8)                                                      # builds a tensor per entry
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= STORED_MAX_HEADER_BYTES:
            raise IntegrityError(f"{name} has a header of {length:,} bytes where a safetensors file has 1 to "
                                 f"{STORED_MAX_HEADER_BYTES:,} (hfexport._stored.STORED_MAX_HEADER_BYTES): the file "
                                 "is damaged or crafted", [name])
        try:
            header = parse_json(file.read(length))
        except ValueError as exc:
            raise IntegrityError(f"{name}'s safetensors header is not JSON hfexport reads ({exc}): the file is "
                                 "damaged or crafted", [name]) from None
    count = len(header) - ("__metadata__" in header) if isinstance(header, dict) else -1
    if count > STORED_MAX_TENSORS:
        raise IntegrityError(f"{name} holds {count:,} tensors, over the bound of {STORED_MAX_TENSORS:,} "
                             "(hfexport._stored.STORED_MAX_TENSORS): the file is damaged or crafted", [name])
    try:
        return load(data) if data is not None else load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError on a malformed file
        raise IntegrityError(f"{Path(path).name} is not a safetensors file safetensors can read ({exc}): the file is "
                             "damaged or crafted", [Path(path).name]) from None


def _some(names: list[str], shown: int = 8) -> str:
    """``names`` for a message: the first ``shown`` and how many more (a crafted file may hold thousands)."""
    return str(names) if len(names) <= shown else f"{names[:shown]} and {len(names) - shown:,} more"


def stored_inputs_and_outputs(stored: Mapping[str, Any], tensors: Mapping[str, Any], section: Mapping[str, Any],
                              where: str, *, max_zero_bytes: int = _ZERO_LEAVES_MAX_BYTES
                              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rebuild the stored keyword inputs and the eager outputs (``{output name: tensor}``) of a component, after
    checking the file's keys, the input names and leaf counts, and the output names and dtypes against the
    manifest section (the input shapes and dtypes are checked by ``ExportedModel.run`` before the runtime runs).
    The zero leaves the manifest describes (a cache) take at most ``max_zero_bytes`` in all.

    Raises:
        ValueError: the file and the manifest disagree (names what differs).
    """
    import torch
    import torch.utils._pytree as pytree

    entries, outputs = stored.get("inputs"), stored.get("outputs")
    if not isinstance(entries, list) or not isinstance(outputs, list) \
            or not all(isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("leaves"), int)
                       and not isinstance(e.get("leaves"), bool) and e["leaves"] >= 0 for e in entries) \
            or not all(isinstance(o, str) for o in outputs):
        raise ValueError(f"{where}: verification.stored must list inputs as {{'name', 'leaves'}} objects and "
                         "outputs as names")
    program_inputs = [i["name"] for i in section.get("inputs", [])]
    names = [e["name"] for e in entries]
    if names != program_inputs:
        raise ValueError(f"{where}: the stored inputs {names} are not the program's inputs {program_inputs}")
    recorded = {o["name"]: o for o in section.get("outputs", [])}
    unknown = [o for o in outputs if o not in recorded]
    if unknown:
        raise ValueError(f"{where}: the stored outputs {unknown} are not outputs of the program "
                         f"({list(recorded)})")
    budget = [max_zero_bytes, max_zero_bytes]
    zero_leaves = {e["name"]: _zero_leaves(e, where, budget) for e in entries}  # all checked, nothing allocated
    expected_keys = {f"inputs.{e['name']}.{i}" for e in entries for i in range(e["leaves"])
                     if i not in zero_leaves[e["name"]]}
    expected_keys |= {f"outputs.{o}" for o in outputs}
    missing, extra = sorted(expected_keys - set(tensors)), sorted(set(tensors) - expected_keys)
    if missing or extra:
        raise ValueError(f"{where}: the stored tensors do not match the manifest: "
                         + "; ".join(part for part in (f"missing {_some(missing)}" if missing else "",
                                                       f"not named by it {_some(extra)}" if extra else "") if part))
    inputs: dict[str, Any] = {}
    for entry in entries:
        zeros = zero_leaves[entry["name"]]
        leaves = [torch.zeros(zeros[i][0], dtype=zeros[i][1]) if i in zeros
                  else tensors[f"inputs.{entry['name']}.{i}"] for i in range(entry["leaves"])]
        spec = entry.get("spec")
        if spec is None:
            if len(leaves) != 1:
                raise ValueError(f"{where}: stored input {entry['name']!r} has {len(leaves)} leaves but no "
                                 "structure (spec)")
            inputs[entry["name"]] = leaves[0]
            continue
        if not isinstance(spec, str):
            raise ValueError(f"{where}: stored input {entry['name']!r} has a spec that is not a string")
        treespec = load_treespec(spec, f"{where}: the structure of stored input {entry['name']!r}")
        if treespec.num_leaves != len(leaves):
            raise ValueError(f"{where}: stored input {entry['name']!r} has {len(leaves)} leaves where its "
                             f"structure has {treespec.num_leaves}")
        inputs[entry["name"]] = pytree.tree_unflatten(leaves, treespec)
    expected = {}
    for name in outputs:
        tensor = tensors[f"outputs.{name}"]
        dtype = recorded[name].get("dtype")
        if isinstance(dtype, str) and str(tensor.dtype).removeprefix("torch.") != dtype \
                and not (torch_dtype(dtype) is not None and tensor.is_floating_point()
                         and torch_dtype(dtype).is_floating_point):
            raise ValueError(f"{where}: stored output {name!r} is {str(tensor.dtype).removeprefix('torch.')} where "
                             f"the program returns {dtype}")
        expected[name] = tensor
    return inputs, expected
