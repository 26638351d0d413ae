"""The tokenizer and processor files of a model directory or an artifact: those a task export copies into the
artifact (:data:`_TOKENIZER_FILES`, :data:`_PROCESSOR_FILES`), those that mark a tokenizer (:func:`_has_tokenizer`),
and the checks that keep reading an artifact's copies from running its code (:func:`check_configs_run_no_code`:
``auto_map`` and class names transformers does not define; :func:`check_resize_bound`: an image processor that
resizes past :data:`IMAGE_MAX_PIXELS`; :func:`_tokenizer_call`: a panic of the Rust tokenizers library as an
error that names the files), and :func:`checked_copy`: the artifact's copies as the bytes its manifest hashes, in a
private directory, so that what transformers reads is what was checked.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hfexport.commands import UsageError

# Config files of a tokenizer or processor that transformers reads from the artifact's directory.
_CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                 "image_processor_config.json", "video_preprocessor_config.json", "feature_extractor_config.json")
# keys that name a class transformers would look up (a custom one is the artifact's own Python)
_CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type", "feature_extractor_type",
               "video_processor_type")
IMAGE_MAX_PIXELS = 2**24  # a processor may resize an image to at most 4,096 x 4,096 (float32 RGB: 192 MiB)
# The most characters a tokenizer's normalizer (or decoder) may make of one: a Sequence of Replace steps multiplies
# (7 x Replace("o" -> 10 x "o") made each "o" 10,000,000 characters). Real ones: Llama 2's 2, XLM-R's 36 (a Unicode
# normalization counted as 18, NFKC's most: U+FDFA), BERT's 3, Llama 3's and Qwen2.5's 1 (NFC or none).
TOKENIZER_MAX_EXPANSION = 256
_UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD", "Precompiled")  # each at most 18 characters of one, once in all
_EXPANDS = {"BertNormalizer": 3, "ByteLevel": 4}  # spaces around a CJK character; a character's UTF-8 bytes


def _expansion(step: Any, key: str) -> tuple[float, bool]:
    """``(factor, unicode)``: the most characters ``step`` (a normalizer's or decoder's JSON) makes of one, Unicode
    normalization left out (``unicode``: whether it has one)."""
    if not isinstance(step, dict):
        return 1.0, False
    kind = step.get("type")
    if kind == "Sequence":
        factor, unicode = 1.0, False
        for inner in step.get(key) or []:
            f, u = _expansion(inner, key)
            factor, unicode = factor * f, unicode or u
        return factor, unicode
    if kind == "Replace":
        pattern, content = step.get("pattern") or {}, str(step.get("content") or "")
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        if isinstance(literal, str) and literal:  # each match of len(literal) characters becomes len(content)
            return max(1.0, len(content) / len(literal)), False
        return 1.0 + len(content), False  # a regex may match the empty string: content at every position
    if kind == "Prepend":  # once, at the front: at most 1 + len(prepend) times a character
        return 1.0 + len(str(step.get("prepend") or "")), False
    return float(_EXPANDS.get(kind, 1)), kind in _UNICODE_FORMS


def check_tokenizer_expansion(backend: Any, shown: Path) -> None:
    """Refuse, before it encodes or decodes anything, a ``tokenizers.Tokenizer`` (``backend``: a fast tokenizer's
    ``backend_tokenizer``, or one read from ``tokenizer.json``) whose normalizer or decoder makes more than
    :data:`TOKENIZER_MAX_EXPANSION` characters of one (:func:`_expansion`): the prompt's length is checked only
    after tokenizing, and a crafted normalizer made 11 characters 20,000,000 (GiBs, in the Rust library).

    Raises:
        UsageError: the part, its factor and the bound.
    """
    for part, key in (("normalizer", "normalizers"), ("decoder", "decoders")):
        step = getattr(backend, part, None)
        if step is None:
            continue
        try:
            factor, unicode = _expansion(json.loads(step.__getstate__()), key)
        except (AttributeError, TypeError, ValueError, RecursionError):
            continue  # not a tokenizers object this version can describe: nothing to bound
        factor *= 18 if unicode else 1
        if factor > TOKENIZER_MAX_EXPANSION:
            raise UsageError(f"the tokenizer of {shown} has a {part} that makes up to {factor:,.0f} characters of one"
                             f", over the bound of {TOKENIZER_MAX_EXPANSION} (hfexport_dynamo.tasks.tokenizer_files."
                             "TOKENIZER_MAX_EXPANSION): its tokenizer.json is damaged or crafted; give another with "
                             "--tokenizer DIR, or the prompt as --input-ids")


def check_configs_run_no_code(directory: Path, trust_remote_code: bool = False, shown: Path | None = None) -> None:
    """Refuse, unless ``trust_remote_code``, a tokenizer or processor config of ``directory`` that would make
    transformers run the artifact's own Python: an ``auto_map`` (``AutoTokenizer``/``AutoProcessor`` import the
    module it names, after asking on standard input), or a class name (``tokenizer_class``, ``processor_class``,
    ``image_processor_type``, ...) that transformers does not define. Every ``from_pretrained`` on artifact files
    also passes ``trust_remote_code=False``, so transformers itself refuses rather than prompts.

    Messages name the files in ``shown`` (the artifact, where ``directory`` is its checked copy).

    Raises:
        UsageError: the file, the key and the name; and that ``--trust-remote-code`` allows it.
    """
    if trust_remote_code:
        return
    import transformers

    for name in _CONFIG_FILES:
        file, named = Path(directory) / name, Path(shown or directory) / name
        if not file.is_file():
            continue
        if file.stat().st_size > 2**22:
            raise UsageError(f"{named} is {file.stat().st_size:,} bytes, over the 4 MiB a config may have: the "
                             "artifact is damaged or crafted")
        try:  # json, not parse_json: tokenizer configs hold 31-digit ints (model_max_length = 1e30); size-bounded
            config = json.loads(file.read_bytes().decode("utf-8"))  # UTF-8 only: no codec module imported
        except RecursionError:
            raise UsageError(f"{named} is JSON nested too deeply for Python: the artifact is damaged or "
                             "crafted") from None
        except ValueError as exc:
            raise UsageError(f"{named} is not JSON hfexport reads ({exc}): the artifact is damaged or crafted") from None
        if not isinstance(config, dict):
            continue
        found = [(f"{name}:auto_map", config["auto_map"])] if "auto_map" in config else []
        for key in _CLASS_KEYS:
            value = config.get(key)
            if value is not None and not (isinstance(value, str) and value.isidentifier()
                                          and isinstance(getattr(transformers, value, None), type)):
                found.append((f"{name}:{key}", value))
        if found:
            where, value = found[0]
            raise UsageError(f"{where} names {value!r:.120}, code of the artifact's own (transformers defines no "
                             "such class): hfexport runs no code from an artifact; pass --trust-remote-code only "
                             "for an artifact from a source you trust")


def _tokenizer_call(call: Any, directory: Path, what: str) -> Any:
    """``call()``, with a panic of the Rust tokenizers library (``pyo3_runtime.PanicException``, a
    ``BaseException``: a crafted ``tokenizer.json``, a catastrophic regex) turned into an error that names the
    files."""
    try:
        return call()
    except Exception as exc:
        if what == "load":
            raise UsageError(f"the tokenizer or processor files of {directory} do not load ({type(exc).__name__}: "
                             f"{str(exc)[:200]}): the artifact is damaged or crafted") from None
        raise
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise UsageError(f"the tokenizer of {directory} failed to {what} ({str(exc)[:200]}): its tokenizer.json is "
                         "damaged or crafted; give another with --tokenizer DIR, or the prompt as --input-ids") from None


def check_resize_bound(image_processor: Any, sizes: list[tuple[int, int]], directory: Path) -> None:
    """Refuse, before the processor runs, an image processor config that resizes an image past
    :data:`IMAGE_MAX_PIXELS` (a crafted ``size`` of 12,000 px grew the process by 5.5 GiB in 112 s): the fixed
    target sizes it names (``size``: ``height`` x ``width``, ``shortest_edge`` / ``longest_edge``, ``crop_size``),
    the least it upscales to (``min_pixels``), and what ``shortest_edge`` makes of the given images' aspect ratios.

    Raises:
        UsageError: the key, the pixels it asks for, and the bound.
    """
    if image_processor is None:
        return
    widest = max((max(w, h) / max(1, min(w, h)) for w, h in sizes), default=1.0)
    targets: list[tuple[str, float]] = []
    for key in ("size", "crop_size"):
        size = getattr(image_processor, key, None)
        if isinstance(size, int) and not isinstance(size, bool):
            size = {"height": size, "width": size}
        elif not isinstance(size, dict):  # transformers' SizeDict: attributes
            size = {k: getattr(size, k, None) for k in ("height", "width", "shortest_edge", "longest_edge",
                                                        "min_pixels", "max_pixels")}
        numbers = {k: v for k, v in size.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if "height" in numbers and "width" in numbers:
            targets.append((f"{key}.height x {key}.width", numbers["height"] * numbers["width"]))
        if "shortest_edge" in numbers:
            longest = numbers.get("longest_edge", numbers["shortest_edge"] * widest)
            targets.append((f"{key}.shortest_edge", numbers["shortest_edge"] * longest))
        elif "longest_edge" in numbers:
            targets.append((f"{key}.longest_edge", numbers["longest_edge"] ** 2))
        if "min_pixels" in numbers:  # max_pixels only shrinks an image; min_pixels grows a small one
            targets.append((f"{key}.min_pixels", numbers["min_pixels"]))
    least = getattr(image_processor, "min_pixels", None)
    if isinstance(least, int | float) and not isinstance(least, bool):
        targets.append(("min_pixels", least))
    for where, pixels in targets:
        if pixels > IMAGE_MAX_PIXELS:
            raise UsageError(f"the image processor of {directory} resizes images to {int(pixels):,} pixels "
                             f"({where}), over the bound of {IMAGE_MAX_PIXELS:,} (hfexport_dynamo.tasks."
                             "tokenizer_files.IMAGE_MAX_PIXELS): the artifact is damaged or crafted")


# The tokenizer files an export for a task copies from the model directory into the artifact (hashed in its
# manifest like every file), so that `hfexport generate DIR --prompt TEXT` finds its tokenizer there.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


# and the processor's, for `hfexport generate DIR --image PATH` (image-text-to-text)
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                      "vocab.txt")


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_MARKERS)


# Every file of an artifact that transformers' AutoTokenizer, AutoProcessor or AutoFeatureExtractor may read: those
# the export copies, the configs that name a class, and the chat templates
_LOADED_FILES = tuple(dict.fromkeys((*_TOKENIZER_FILES, *_PROCESSOR_FILES, *_CONFIG_FILES, "chat_template.json")))


@contextlib.contextmanager
def checked_copy(directory: Path, manifest: Mapping[str, Any], trust_remote_code: bool = False) -> Iterator[Path]:
    """A fresh private directory (``tempfile``'s, mode 0700, removed on exit) holding the tokenizer and processor
    files of artifact ``directory`` (:data:`_LOADED_FILES`) as the bytes its manifest hashes: each read once from a
    descriptor and checked on those very bytes (``hfexport.trust.artifact_bytes``), then written there. Transformers
    reads only directories, by path: reading them from the artifact after its check let a file swapped in between
    (a concurrent writer) be read unchecked (issue 43); the copies cannot change under it. With
    ``trust_remote_code`` the Python files the manifest hashes beside them (an ``auto_map``'s modules) are copied too.

    Raises:
        UsageError: a tokenizer or processor file in ``directory`` that the manifest does not hash (transformers
            would have read it unchecked).
        hfexport.IntegrityError: a file's bytes differ from the manifest's size or SHA-256 (it changed since ``load``).
        ValueError: a file that is a symlink or not a regular file (``hfexport.trust.open_beneath``).
    """
    import tempfile

    from hfexport.trust import artifact_bytes

    hashed = manifest.get("files_sha256")
    known = set(hashed) if isinstance(hashed, dict) else {f for f in manifest.get("files") or () if isinstance(f, str)}
    unhashed = [name for name in _LOADED_FILES if name not in known and os.path.lexists(Path(directory) / name)]
    if unhashed:
        raise UsageError(f"{Path(directory) / unhashed[0]} is a tokenizer or processor file that {directory}/export.json"
                         " does not hash, so hfexport cannot check it: the artifact is damaged or crafted (re-export "
                         "it, or give the tokenizer with --tokenizer DIR)")
    code = sorted(n for n in known if trust_remote_code and n.endswith(".py") and "/" not in n)
    with tempfile.TemporaryDirectory(prefix="hfexport-tokenizer-") as private:  # mkdtemp: 0700, a new name
        for name in (*_LOADED_FILES, *code):
            if name not in known:
                continue
            data = artifact_bytes(Path(directory), manifest, name, f"the tokenizer file {name}")
            fd = os.open(Path(private) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
        yield Path(private)
