"""The one tiny-model factory of the tests: seeded Transformers models built offline from small configs."""

from __future__ import annotations

from typing import Any

import torch

# kind -> (model class name, config class name, config kwargs). Sizes are tiny on purpose: 32 hidden units,
# 37 intermediate (not a multiple of anything, so no kernel gets a lucky shape), 100 tokens, 64 positions.
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=100,
                max_position_embeddings=64)
_DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=37, vocab_size=100, max_position_embeddings=64)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=100)
KINDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertModel", "BertConfig", _ENCODER),
    "roberta": ("RobertaModel", "RobertaConfig", dict(_ENCODER, pad_token_id=1)),
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                                                               vocab_size=100, max_position_embeddings=64)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _DECODER),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", _DECODER),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(_DECODER, sliding_window=None)),
    "phi": ("PhiForCausalLM", "PhiConfig", dict(_DECODER, num_key_value_heads=None)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_layer=2, n_head=2, n_inner=37, vocab_size=100,
                                                   n_positions=64, bos_token_id=1, eos_token_id=2)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                                          num_decoder_layers=2, num_heads=4, vocab_size=100,
                                                          decoder_start_token_id=0)),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(_SEQ2SEQ, max_position_embeddings=64)),
    "bart-base": ("BartModel", "BartConfig", dict(_SEQ2SEQ, max_position_embeddings=64)),
    "vit": ("ViTModel", "ViTConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=37, image_size=32, patch_size=8)),
    "convnext": ("ConvNextModel", "ConvNextConfig", dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                                         num_channels=3, image_size=32)),
    # a CLIP vision tower of 4x4 patches of 8 pixels (16 image tokens) and the Llama decoder above; image token 99
    "llava": ("LlavaForConditionalGeneration", "LlavaConfig", dict(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=dict(_DECODER, model_type="llama"), image_token_id=99, projector_hidden_act="gelu")),
    # LLaVA-NeXT: a CLIP tower on 16x16 crops of 8-pixel patches (2x2 tokens a crop, its class token dropped), each
    # image its base crop and the tiles of the best of four grid pinpoints for its image_sizes; image token 99
    "llava_next": ("LlavaNextForConditionalGeneration", "LlavaNextConfig", dict(
        vision_config=dict(model_type="clip_vision_model", hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                           num_attention_heads=2, image_size=16, patch_size=8),
        text_config=dict(_DECODER, model_type="llama"), image_token_index=99,
        image_grid_pinpoints=[[16, 32], [32, 16], [32, 32], [16, 48]])),
    # LLaVA-OneVision: the tiling above on a SigLIP tower and a Qwen2 decoder, downscaling an image's tiles beyond one
    # tile's worth of tokens (anyres_max_1, so that the tiny grids exercise it); in a prompt of several images
    # (batch_num_images) each image is its base crop
    "llava_onevision": ("LlavaOnevisionForConditionalGeneration", "LlavaOnevisionConfig", dict(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=24, intermediate_size=40,
                           num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8),
        text_config=dict(_DECODER, model_type="qwen2"), image_token_index=99,
        image_grid_pinpoints=[[16, 32], [32, 16], [32, 32], [16, 48]], vision_aspect_ratio="anyres_max_1")),
    # a SigLIP-style tower of 4x4 patches, pixel-shuffled by 2 (4 image tokens per 32x32 image), the Llama decoder
    "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMConfig", dict(
        vision_config=dict(model_type="smolvlm_vision", hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=dict(_DECODER, model_type="llama"), image_token_id=99, scale_factor=2)),
    # a SigLIP tower of 4x4 patches pooled to 4 image tokens, a Gemma 3 decoder of one sliding and one global layer
    "gemma3": ("Gemma3ForConditionalGeneration", "Gemma3Config", dict(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=dict(_DECODER, model_type="gemma3_text", head_dim=8, sliding_window=64,
                         layer_types=["sliding_attention", "full_attention"]),
        mm_tokens_per_image=4, image_token_index=99, boi_token_index=97, eoi_token_index=98)),
    # a Qwen2-VL vision tower of 4x4 patches of 4 pixels (16x16 images, 2 frames of a patch each), merged 2x2 into
    # 4 image tokens, and its text model with 3-D RoPE (mrope sections 2, 1, 1 of the 4 rotary pairs); image token 99
    "qwen2vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", dict(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
        text_config=dict(_DECODER, bos_token_id=1, eos_token_id=2,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1])),
        image_token_id=99, video_token_id=98, vision_start_token_id=97, vision_end_token_id=96)),
    # Qwen2.5-VL: the Qwen2-VL shapes above with RMSNorm/SwiGLU vision blocks, block 0 attending within windows of
    # 16 pixels (2x2 image tokens; a 24x24 image's 3x3 tokens fall into 4 windows, padded) and block 1 over the image
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", dict(
        vision_config=dict(depth=2, hidden_size=32, out_hidden_size=32, num_heads=2, intermediate_size=37,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2, in_channels=3, window_size=16,
                           fullatt_block_indexes=[1]),
        text_config=dict(_DECODER, bos_token_id=1, eos_token_id=2,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1])),
        image_token_id=99, video_token_id=98, vision_start_token_id=97, vision_end_token_id=96)),
    # a Voxtral (Whisper-style) audio encoder on chunks of 16 mel bins x 32 frames (16 positions, stacked by 4 into
    # 4 audio tokens per chunk), a projector and the Llama decoder above; audio token 99
    "voxtral": ("VoxtralForConditionalGeneration", "VoxtralConfig", dict(
        audio_config=dict(num_mel_bins=16, max_source_positions=16, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=128),
        text_config=dict(_DECODER, model_type="llama"), audio_token_id=99)),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Config", dict(
        vision_config=dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=dict(_DECODER, model_type="llama"), image_token_id=99, scale_factor=2)),
    "whisper": ("WhisperForConditionalGeneration", "WhisperConfig", dict(
        _SEQ2SEQ, num_mel_bins=16, max_source_positions=16, max_target_positions=32, decoder_start_token_id=1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, suppress_tokens=None, begin_suppress_tokens=None)),
}
_LAYER_KEYS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
               "decoder_layers")


def image_token_prompts(tokens: list[int], counts: tuple[int, ...], token: int, *, text: int,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of a left-padded batch, one row per count: the row's images (``tokens``: each
    image's token count, in the rows' order) as runs of ``token``, the first after two text ids and each next two
    text ids after the one before; ``text`` + 2 per image text ids in all, drawn in [3, 90), row ``r`` seeded
    ``seed + r``."""
    rows = []
    for row, count in enumerate(counts):
        mine, tokens = tokens[:count], tokens[count:]
        ids = torch.randint(3, 90, (text + sum(per + 2 for per in mine),),
                            generator=torch.Generator().manual_seed(seed + row))
        start = 2
        for per in mine:
            ids[start:start + per] = token
            start += per + 2
        rows.append(ids)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return ids, mask


def tiny_model(kind: str, *, layers: int | None = None, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A seeded tiny Transformers model of one architecture family, in eval mode.

    Args:
        kind: a key of :data:`KINDS` (``"bert"``, ``"llama"``, ``"t5"``, ...).
        layers: set every layer count of the config (1 halves lowering time where depth does not matter).
        seed: the ``torch.manual_seed`` the weights are drawn with.
        **overrides: config fields (``hidden_size=64``).

    Raises:
        KeyError: an unknown kind (the message lists the known ones).
    """
    import transformers as tf

    if kind not in KINDS:
        raise KeyError(f"unknown tiny model {kind!r}; known: {', '.join(KINDS)}")
    model_name, config_name, kwargs = KINDS[kind]
    kwargs = dict(kwargs)
    if layers is not None:
        kwargs.update({k: layers for k in _LAYER_KEYS if k in kwargs})
        if kind == "convnext":
            kwargs.update(hidden_sizes=kwargs["hidden_sizes"][:layers * 2], depths=[1] * layers * 2,
                          num_stages=layers * 2)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return getattr(tf, model_name)(getattr(tf, config_name)(**kwargs)).eval()


class ComplexRope(torch.nn.Module):
    """Llama4 / DeepSeek-V2's complex RoPE: ``polar`` in forward, ``unsqueeze`` of the complex ``freqs_cis``.

    The model of the ONNX and ExecuTorch tests of ``_fix_complex_to_real_pairs``."""

    def forward(self, x, positions):
        angles = positions[..., None] * torch.arange(1, 5, dtype=torch.float32)
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(z * freqs_cis.unsqueeze(1)).flatten(-2)


class WhileLoopRefine(torch.nn.Module):
    """``while_loop`` whose body calls a ``Linear(4, 4)``, the trip count from the ``iters`` input (field case f04's
    kind, small): ``forward(iters: int64 [], x: float32 [batch, 4]) -> float32 [batch, 4]``."""

    def __init__(self):
        super().__init__()
        self.refine = torch.nn.Linear(4, 4)

    def forward(self, iters, x):
        from torch._higher_order_ops import while_loop

        def cond_fn(it, h):
            return it > 0

        def body_fn(it, h):
            return it - 1, torch.tanh(self.refine(h)) + h

        return while_loop(cond_fn, body_fn, (iters, x))[1]


class Bf16Block(torch.nn.Module):
    """A bfloat16 model that takes a bfloat16 tensor (a bf16 ViT's ``pixel_values``, Whisper's ``input_features``,
    not token ids) and returns one: ``forward(x: bfloat16 [batch, 8]) -> bfloat16 [batch, 16]``, times ``scale``."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.norm = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)
        self.scale = scale
        self.to(torch.bfloat16)

    def forward(self, x):
        out = self.norm(torch.nn.functional.gelu(self.proj(x)))
        return out * self.scale if self.scale != 1.0 else out


class TinyMLP(torch.nn.Module):
    """A plain ``nn.Module`` (no Transformers): two linear layers, a tuple output."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden), hidden


_FRESH_PROCESS_SCRIPT = """
import sys
import torch
import torch.utils._pytree as pytree
import hfexport

families = ("transformers", "hfexport_dynamo", "hfexport_onnx", "hfexport_executorch")
preloaded = sorted(m for m in sys.modules if m.split(".")[0] in families)
assert not preloaded, f"imported before hfexport.load: {preloaded}"
inputs = torch.load(sys.argv[1], weights_only=True)
results = {}
for name, directory in zip(sys.argv[3::2], sys.argv[4::2]):
    with torch.no_grad():
        out = hfexport.load(directory)(**inputs[name])
    results[name] = (f"{type(out).__module__}.{type(out).__qualname__}", list(pytree.tree_leaves(out)))
torch.save(results, sys.argv[2])
"""


def load_in_fresh_process(artifacts: dict[str, tuple[Any, dict[str, torch.Tensor]]], workdir: Any,
                          timeout: float = 600) -> dict[str, tuple[str, list[torch.Tensor]]]:
    """Load and run saved artifacts the way a user's new script would: a new Python process that imports only
    ``hfexport`` and torch (no transformers, no backend) and calls ``hfexport.load(directory)(**inputs)``.

    Args:
        artifacts: name -> (artifact directory, inputs).
        workdir: a directory for the inputs and outputs files.

    Returns:
        name -> (the output's type as ``module.qualname``, its flat tensors).

    Raises:
        AssertionError: the process failed (its stderr's tail in the message).
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    workdir = Path(workdir)
    torch.save({name: dict(inputs) for name, (_, inputs) in artifacts.items()}, workdir / "fresh_inputs.pt")
    pairs = [str(x) for name, (directory, _) in artifacts.items() for x in (name, directory)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_SCRIPT, str(workdir / "fresh_inputs.pt"),
                           str(workdir / "fresh_outputs.pt"), *pairs], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=workdir)
    assert proc.returncode == 0, f"loading in a fresh process failed:\n{proc.stderr[-3000:]}"
    return torch.load(workdir / "fresh_outputs.pt", weights_only=True)


_FRESH_GENERATE_SCRIPT = """
import sys
import torch
import hfexport

runs = torch.load(sys.argv[1], weights_only=True)
results = {}
for name, (directory, prompts, options) in runs.items():
    exported = hfexport.load(directory)
    results[name] = [exported.generate(ids, mask, **options) for ids, mask in prompts]
torch.save(results, sys.argv[2])
"""


def generate_in_fresh_process(runs: dict[str, tuple[Any, list[tuple[torch.Tensor, Any]], dict[str, Any]]],
                              workdir: Any, timeout: float = 900) -> dict[str, list[torch.Tensor]]:
    """Load saved task artifacts in a new Python process (only ``hfexport`` and torch imported first) and run
    ``generate`` on each prompt, as a user's new script would.

    Args:
        runs: name -> (artifact directory, [(input_ids, attention_mask or None), ...], generate keyword options).
        workdir: a directory for the inputs and outputs files.

    Returns:
        name -> the token ids ``generate`` returned for each prompt.

    Raises:
        AssertionError: the process failed (its stderr's tail in the message).
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    workdir = Path(workdir)
    torch.save({name: (str(d), prompts, options) for name, (d, prompts, options) in runs.items()},
               workdir / "generate_inputs.pt")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _FRESH_GENERATE_SCRIPT, str(workdir / "generate_inputs.pt"),
                           str(workdir / "generate_outputs.pt")], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=workdir)
    assert proc.returncode == 0, f"generating in a fresh process failed:\n{proc.stderr[-3000:]}"
    return torch.load(workdir / "generate_outputs.pt", weights_only=True)


def selected_params(request: Any, test_name: str, *names: str) -> list[tuple[Any, ...]]:
    """The parameter tuples of ``test_name`` (in the requesting test's module) that this run selected (``-m``,
    ``-k``, node ids), in collection order: a module fixture prepares exactly those cases, at once.

    Args:
        request: the fixture's ``request``.
        test_name: the parametrized test function's name.
        *names: the parameter names, in the order of the returned tuples.
    """
    found = []
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and getattr(item, "originalname", None) == test_name:
            params = tuple(item.callspec.params[name] for name in names)
            if params not in found:
                found.append(params)
    return found


def word_tokenizer() -> Any:
    """A word-level tokenizer over the tiny models' 100 ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``w3`` ... ``w99``),
    built offline (a ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 100)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>", padding_side="left")
