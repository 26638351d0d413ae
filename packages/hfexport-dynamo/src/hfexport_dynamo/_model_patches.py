"""Model patches (stage 2, ``"dynamo"`` scope) for single model families whose forward torch.export cannot trace
with a dynamic sequence: each replaces one method for the duration of an export with the same computation in
tensor ops, so that every backend (all trace through hfexport-dynamo) gets the class. Each names the model-side
change it waits for; ``disable=("<patch name>",)`` brings the original failure back (the tests do).

Importing this module registers the patches (``exporter_dynamo`` imports it).
"""

from __future__ import annotations

from typing import Any

import torch

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask")
def _patch_cpmant_left_padding_mask(original: Any) -> Any:
    """Build CPM-Ant's left-padding mask from ``torch.arange`` instead of a Python list sized by the sequence.

    **Why**: ``CpmAntModel._prepare_attention_mask`` writes the positions ``seqlen - prompt_length - 1 ... 0`` as
    ``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])``: a Python list needs a concrete length, so
    torch.export specializes the sequence length to the traced one (``Guard failed: input_ids.size()[1] == 8`` at
    any other length). ``torch.arange(n - 1, -1, -1)`` is the same int64 tensor with a symbolic length.
    **Upstream**: model-side (transformers ``modeling_cpmant.py``), no issue filed.
    **Remove when**: transformers builds the mask with ``torch.arange``.
    """

    def _prepare_attention_mask(self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor,
                                length: torch.Tensor) -> torch.Tensor:
        batch, seqlen, device = input_ids.size(0), input_ids.size(1), input_ids.device
        directional_mask_2d = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(-1, 1)
        attention_mask = context[:, None, :] | (
            context[:, :, None].logical_not() & directional_mask_2d.view(1, seqlen, seqlen))
        attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
        positions = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)  # the reversed range
        mask_1d = positions[None, :].repeat(batch, 1) < length[:, None]
        mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
        return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask

    return _prepare_attention_mask


@register_patch("dynamo",
                "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersTop1Router"
                ".forward")
def _patch_switch_router_cast(original: Any) -> Any:
    """Route without ``self.classifier = self.classifier.to(self.dtype)`` inside ``forward``.

    **Why**: ``SwitchTransformersTop1Router.forward`` replaces its classifier submodule on every call to cast it to
    the router dtype; torch.export cannot trace a submodule being swapped mid-forward (``RuntimeError: Cannot swap
    t1 because it has weakref associated with it``). During an export the classifier already has the router dtype
    (else this raises and names the cast to do), so the cast is a no-op; the rest is the router's eval-mode
    computation (no jitter noise outside training).
    **Upstream**: model-side; the same in-forward cast as NLLB-MoE's router (``_patch_nllb_moe_cast_classifier``).
    **Remove when**: transformers casts the classifier at load time instead of in ``forward``.
    """

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.training:
            return original(self, hidden_states)  # jitter noise; never the case in an export (eval mode)
        weight = getattr(self.classifier, "weight", None)
        if weight is not None and weight.dtype != self.dtype:
            raise TypeError(f"the Switch Transformers router classifier is {weight.dtype} but the router runs in "
                            f"{self.dtype} (config.router_dtype): cast it before exporting, e.g. "
                            f"router.classifier.to({self.dtype})")
        self.input_dtype = hidden_states.dtype
        router_logits = self.classifier(hidden_states.to(self.dtype))
        router_probs = torch.softmax(router_logits, dim=-1, dtype=self.dtype).to(self.input_dtype)
        expert_index = torch.nn.functional.one_hot(torch.argmax(router_probs, dim=-1), num_classes=self.num_experts)
        token_priority = torch.cumsum(expert_index, dim=-2)
        expert_index = expert_index * (token_priority <= self.expert_capacity)  # tokens past capacity: no expert
        router_probs = torch.max(router_probs, dim=-1).values.unsqueeze(-1)
        return expert_index, router_probs, router_logits

    return forward


@register_patch("dynamo",
                "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts"
                ".forward")
def _patch_switch_experts_dense(original: Any) -> Any:
    """Run every Switch Transformers expert on every token, weighted by the router's (capacity-masked) choice.

    **Why**: ``SwitchTransformersExperts.forward`` loops in Python over ``nonzero()`` of the routing mask and
    gathers each expert's tokens with ``torch.where``: a data-dependent loop and data-dependent shapes, which
    torch.export rejects (``GuardOnDataDependentSymNode``). Its experts are separate modules, not the 3-D weights
    that ``_patch_moe_experts_dense`` handles (that patch declines this class). Here each expert runs on all tokens
    and its output is multiplied by ``one_hot(expert) * routing_weight`` (0 for the tokens it was not given, and
    for tokens past the expert capacity): each token's value is eager's exactly, since the other experts add 0.
    Cost: ``num_experts`` times the expert FLOPs of sparse dispatch (top-1 routing).
    **Upstream**: huggingface/transformers#38518 (MoE experts loops not exportable).
    **Remove when**: Switch Transformers moves to transformers' ``use_experts_implementation`` experts.
    """

    def forward(self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states [tokens, hidden]; selected_experts [tokens, 1, num_experts] one-hot; routing_weights [tokens, 1]
        output = torch.zeros_like(hidden_states)
        for index in range(self.num_experts):
            weight = selected_experts[:, 0, index, None].to(routing_weights.dtype) * routing_weights
            output = output + (self[f"expert_{index}"](hidden_states) * weight).to(hidden_states.dtype)
        return output

    return forward


def _pool_attention_mask(attention_mask: torch.Tensor, squeeze_factor: int) -> torch.Tensor:
    """SEW's frame mask pooled to the squeezed length (max over each window), as its encoders compute it."""
    return torch.nn.functional.max_pool1d(attention_mask.float().unsqueeze(1), kernel_size=squeeze_factor,
                                          stride=squeeze_factor).squeeze(1).long()


def _pad_to_input_length(hidden_states: torch.Tensor, n_input_timesteps: Any) -> torch.Tensor:
    """Right-pad the upsampled frames ``[batch, squeeze * (T // squeeze), hidden]`` with zeros to the ``T`` input
    frames: a pad of ``T % squeeze`` frames, 0 included, instead of the encoders' ``if shape[1] < T: pad``."""
    return torch.nn.functional.pad(hidden_states, (0, 0, 0, n_input_timesteps - hidden_states.shape[1]))


@register_patch("dynamo", "transformers.models.sew.modeling_sew.SEWEncoder.forward")
def _patch_sew_encoder_lengths(original: Any) -> Any:
    """SEW's encoder without Python branches on the number of frames (eval mode).

    **Why**: ``SEWEncoder.forward`` reconciles the pooled and positional lengths with a Python ``min()`` and pads
    the upsampled output with ``if hidden_states.shape[1] < n_input_timesteps``: both are decided for the traced
    number of frames, so torch.export specializes it (another input length fails a guard). The positional
    convolution (stride ``squeeze_factor``, same padding) gives ``ceil(T / s)`` or ``floor(T / s)`` frames and the
    average pool ``floor(T / s)``, so the minimum is always the pooled length; and the upsampled length
    ``s * floor(T / s)`` is never above ``T``, so padding by ``T - s * floor(T / s)`` (0 included) is the branch's
    value. The rest is the encoder's eval-mode computation (no LayerDrop).
    **Upstream**: model-side (``modeling_sew.py``; SEW-D already trims without ``min()``).
    **Remove when**: transformers trims and pads SEW's frames without size branches.
    """
    create_bidirectional_mask = original.__globals__["create_bidirectional_mask"]
    output_class = original.__globals__["BaseModelOutput"]

    def forward(self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        if self.training:
            return original(self, hidden_states, attention_mask, **kwargs)
        if attention_mask is not None:
            hidden_states[~attention_mask.unsqueeze(-1).repeat(1, 1, hidden_states.shape[2])] = 0.0  # padded frames
            attention_mask = _pool_attention_mask(attention_mask, self.config.squeeze_factor)
        n_input_timesteps = hidden_states.shape[1]
        hidden_states = hidden_states.transpose(1, 2)
        position_embeddings = self.pos_conv_embed(hidden_states)
        pooled = self.pool(hidden_states)
        hidden_states = (pooled + position_embeddings[..., :pooled.size(-1)]).transpose(1, 2)
        attention_mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states,
                                                   attention_mask=attention_mask)
        hidden_states = self.dropout(self.layer_norm(hidden_states))
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = _pad_to_input_length(self.upsample(hidden_states), n_input_timesteps)
        return output_class(last_hidden_state=hidden_states)

    return forward


@register_patch("dynamo", "transformers.models.sew_d.modeling_sew_d.SEWDEncoder.forward")
def _patch_sewd_encoder_lengths(original: Any) -> Any:
    """SEW-D's encoder without the Python branch on the number of frames (eval mode).

    **Why**: ``SEWDEncoder.forward`` pads the upsampled output with ``if hidden_states.shape[1] <
    n_input_timesteps``, decided for the traced number of frames, so torch.export specializes it (another input
    length fails a guard). The upsampled length ``s * floor(T / s)`` is never above ``T``: padding by the
    difference (0 included) is the branch's value (see ``_patch_sew_encoder_lengths``).
    **Upstream**: model-side (``modeling_sew_d.py``).
    **Remove when**: transformers pads SEW-D's frames without a size branch.
    """
    output_class = original.__globals__["BaseModelOutput"]

    def forward(self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        if self.training:
            return original(self, hidden_states, attention_mask, **kwargs)
        squeeze = self.config.squeeze_factor
        if attention_mask is None:
            attention_mask = torch.ones((hidden_states.shape[0], hidden_states.shape[1] // squeeze),
                                        dtype=torch.long, device=hidden_states.device)
        else:
            hidden_states[~attention_mask.unsqueeze(-1).repeat(1, 1, hidden_states.shape[2]).bool()] = 0.0
            attention_mask = _pool_attention_mask(attention_mask, squeeze)
        n_input_timesteps = hidden_states.shape[1]
        hidden_states = hidden_states.transpose(1, 2)
        position_embeddings = self.pos_conv_embed(hidden_states)
        pooled = self.pool(hidden_states)
        hidden_states = (pooled + position_embeddings[..., :pooled.size(-1)]).transpose(1, 2)
        encoder_outputs = self.encoder(hidden_states, attention_mask, **kwargs)
        hidden_states = _pad_to_input_length(self.upsample(encoder_outputs.last_hidden_state), n_input_timesteps)
        return output_class(last_hidden_state=hidden_states)

    return forward


def _real_dft_2d(hidden_states: torch.Tensor) -> torch.Tensor:
    """``torch.fft.fftn(x, dim=(1, 2)).real`` of a real ``[batch, seq, hidden]`` tensor, in real matmuls.

    With the DFT matrix ``W_N = C_N - i S_N`` (``C_N[k, n] = cos(2 pi k n / N)``, ``S_N`` the sine), the 2-D DFT
    is ``W_seq @ x @ W_hidden`` (both symmetric) and its real part is ``C_seq @ x @ C_hidden - S_seq @ x @ S_hidden``.
    The angles ``2 pi k n / N`` are computed in float64 (``k n`` reaches ``N^2``, where float32 would lose 1e-4
    of a radian at N = 512) and the matrices cast to the dtype of ``hidden_states``. The cost is
    ``O(seq^2 hidden + seq hidden^2)`` where the FFT's is ``O(seq hidden log)``: at FNet's sizes (sequence <= 512)
    a few matmuls per layer.
    """

    def cos_sin(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.arange(n, device=hidden_states.device, dtype=torch.float64)
        angle = index[:, None] * index[None, :] * (2 * torch.pi) / n
        return torch.cos(angle).to(hidden_states.dtype), torch.sin(angle).to(hidden_states.dtype)

    cos_seq, sin_seq = cos_sin(hidden_states.size(1))
    cos_hidden, sin_hidden = cos_sin(hidden_states.size(2))
    return cos_seq @ hidden_states @ cos_hidden - sin_seq @ hidden_states @ sin_hidden


def _patch_fnet_fourier_transform(original: Any) -> Any:
    """FNet's token mixing as the real part of a 2-D DFT in real matmuls, for backends without a complex dtype.

    **Why**: ``FNetBasicFourierTransform.forward`` returns ``torch.fft.fftn(hidden_states, dim=(1, 2)).real`` (or
    the same transform through ``fftn`` per axis or complex DFT matrices with ``use_tpu_fourier_optimizations``).
    The complex intermediate is fine for a ``.pt2`` program, so the ``dynamo`` backend keeps it, but ONNX has no
    complex dtype (hfexport's complex-to-real-pair rewrite has no ``aten.fft_fftn``: ``ComplexRewriteError``) and
    ExecuTorch has no FFT kernel. The real part of a 2-D DFT of a real input is two real matmul chains
    (:func:`_real_dft_2d`), with the sequence length symbolic. Registered for the ``onnx``, ``executorch`` and
    ``openvino`` scopes only (OpenVINO's frontend: ``aten::view_as_real is only supported for complex tensors``):
    the other backends trace the original.
    **Upstream**: model-side (transformers ``modeling_fnet.py``); ONNX's ``DFT`` op has no torch.onnx translation of
    ``fft_fftn`` on real input in the pinned torch.
    **Remove when**: torch.onnx translates ``aten.fft_fftn`` (and ExecuTorch has an FFT kernel), or FNet computes
    the real part without complex tensors.
    """

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor]:
        if hidden_states.dim() != 3 or hidden_states.is_complex():
            return original(self, hidden_states)
        return (_real_dft_2d(hidden_states),)

    return forward


for _scope in ("onnx", "executorch", "openvino"):  # the backends without complex tensors; dynamo keeps torch.fft
    register_patch(_scope, "transformers.models.fnet.modeling_fnet.FNetBasicFourierTransform.forward")(
        _patch_fnet_fourier_transform)


def _segment_attention(self: Any, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       cu_seqlens: torch.Tensor, scaling: float | None = None, **kwargs: Any) -> torch.Tensor:
    """One attention call over packed image patches where a patch sees the patches of its own image only.

    Args:
        self: the vision attention module (its ``config``, ``scaling``).
        module: the model's modeling module (its ``eager_attention_forward``).
        query, key, value: ``[1, heads, patches, head_dim]``, every image's patches in a row.
        cu_seqlens: ``[images + 1]`` int, the cumulative patch counts (``cu_seqlens[0] == 0``).
        scaling: the softmax scale, where the module names it otherwise than ``self.scaling``.

    Returns:
        ``[1, patches, heads, head_dim]``, as the attention interface returns it.
    """
    kwargs.pop("attention_mask", None)  # None where a block passes it on: the segment mask replaces it
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    seq_length = query.shape[2]
    positions = torch.arange(seq_length, device=query.device)
    # A patch's segment id: how many image starts it is at or past (cu_seqlens[0] == 0 counts for every patch). Not
    # cu_seqlens[1:]: the slice's fake kernel in ExecuTorch's view_copy pass guards on its unbacked length
    # (GuardOnDataDependentSymNode 'u33 < 1' in torch/_decomp slice_forward; EXAONE 4.5 with its image).
    segment = (positions[:, None] >= cu_seqlens[None, :].to(positions.dtype)).sum(-1)
    mask = torch.zeros(seq_length, seq_length, dtype=query.dtype, device=query.device).masked_fill(
        segment[:, None] != segment[None, :], torch.finfo(query.dtype).min)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, module.eager_attention_forward)
    output, _ = attention(self, query, key, value, attention_mask=mask[None, None],
                          scaling=self.scaling if scaling is None else scaling,
                          dropout=0.0, is_causal=False, **kwargs)
    return output


@register_patch("dynamo", "transformers.models.qwen2_vl.modeling_qwen2_vl.VisionAttention.forward",
                "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLVisionAttention.forward",
                # the same forward, copied (checked: identical source in transformers 5.24)
                "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionAttention.forward",
                "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe.Qwen3VLMoeVisionAttention.forward",
                "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5VisionAttention.forward",
                "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeVisionAttention.forward",
                "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeVisionAttention.forward",
                "transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpVisionAttention.forward",
                "transformers.models.glm4v.modeling_glm4v.Glm4vVisionAttention.forward",
                "transformers.models.glm4v_moe.modeling_glm4v_moe.Glm4vMoeVisionAttention.forward",
                "transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe.Ernie4_5_VLMoeVisionAttention.forward",
                "transformers.models.cohere_compass.modeling_cohere_compass.CohereCompassVisionAttention.forward",
                # the same with q_norm / k_norm after the projection
                "transformers.models.glm_ocr.modeling_glm_ocr.GlmOcrVisionAttention.forward",
                "transformers.models.glm5_next.modeling_glm5_next.Glm5NextVisionAttention.forward")
def _patch_qwen_vl_vision_segments(original: Any) -> Any:
    """Attend over Qwen2-VL's (and Qwen2.5-VL's) packed image patches with one block-diagonal mask instead of one
    attention call per image (:func:`_segment_attention`).

    **Why**: the vision attention's forward (outside flash attention) splits the packed patches of all images with
    ``torch.split(..., (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())`` and attends per image: the number of images
    and their lengths become data-dependent Python values, which torch.export cannot trace with a dynamic number of
    images (``GuardOnDataDependentSymNode``: ``Eq(u0, 0)`` in the split's list comprehension). The same attention
    is one call over the whole sequence with a mask that lets a patch see the patches of its own segment only
    (``segment(q) == segment(k)``, each patch's segment counted from ``cu_seqlens`` by comparisons). Masked keys
    get the dtype's minimum, so each row's softmax is its segment's (exact up to rounding of the longer
    reductions). The flash-attention path, which takes ``cu_seqlens`` itself, is left to the original.
    **Upstream**: model-side (transformers ``modeling_qwen2_vl.py``, copied to ``modeling_qwen2_5_vl.py`` and to the
    Qwen3-VL, Qwen3.5, Qwen3-Omni, GLM-4V, ERNIE-4.5-VL and Cohere Compass vision attentions patched here too;
    GLM-OCR's and GLM-5-Next's add ``q_norm``/``k_norm``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["apply_rotary_pos_emb_vision", "eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlen: int | None = None,
                **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        query, key, value = (self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1)
                             .permute(1, 0, 2, 3).unbind(0))
        if hasattr(self, "q_norm"):
            query, key = self.q_norm(query), self.k_norm(key)
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.proj(output.reshape(seq_length, -1).contiguous())

    return forward


@register_patch("dynamo", "transformers.models.paddleocr_vl.modeling_paddleocr_vl.PaddleOCRVisionAttention.forward",
                # the same forward, copied (checked: identical source in transformers 5.24)
                "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionAttention.forward")
def _patch_separate_projection_vision_segments(original: Any) -> Any:
    """Attend over PaddleOCR-VL's (and VideoLLaMA3's) packed image patches with one block-diagonal mask instead of
    one attention call per image (:func:`_segment_attention`); their attention projects with ``q_proj``/``k_proj``/
    ``v_proj`` and ``out_proj`` and returns ``(output, None)`` (no per-image weights).

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-image ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(u4, 0)`` in
    PaddleOCR-VL's list comprehension); one call with a segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_paddleocr_vl.py``, copied to ``modeling_video_llama_3.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["apply_rotary_pos_emb_vision", "eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor], max_seqlen: int | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        query, key, value = (proj(hidden_states).view(seq_length, self.num_heads, self.head_dim)
                             for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.out_proj(output.reshape(seq_length, -1).contiguous()), None

    return forward


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLVisionAttention.forward",
                # the same forward, copied (checked: identical source in transformers 5.24)
                "transformers.models.hy_v4_vl.modeling_hy_v4_vl.HYV4VLVisionAttention.forward")
def _patch_hunyuan_vl_vision_segments(original: Any) -> Any:
    """Attend over HunYuan-VL's packed image patches with one block-diagonal mask instead of one attention call per
    image (:func:`_segment_attention`); its attention is batch-first (``[1, patches, hidden]``), has no rotary
    embedding, projects with ``q_proj``/``k_proj``/``v_proj`` and ``o_proj`` and returns ``(output, None)``.

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-image ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(u3, 0)`` at
    ``modeling_hunyuan_vl.py:416``); one call with a segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_hunyuan_vl.py``, copied to ``modeling_hy_v4_vl.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        if is_flash_attention_requested(self.config) or hidden_states.shape[0] != 1:
            return original(self, hidden_states, cu_seqlens, max_seqlen, **kwargs)
        batch_size, seq_len, _ = hidden_states.shape
        query, key, value = (proj(hidden_states).view(batch_size, seq_len, self.num_heads, self.head_dim)
                             .transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.o_proj(output.reshape(batch_size, seq_len, -1).contiguous()), None

    return forward


@register_patch("dynamo", "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionAttention.forward")
def _patch_cosmos3_edge_vision_segments(original: Any) -> Any:
    """Attend over Cosmos3-Edge's packed image patches with one block-diagonal mask instead of one attention call
    per image (:func:`_segment_attention`); its attention has no rotary embedding, scales by ``self.scale`` and
    projects with ``q_proj``/``k_proj``/``v_proj`` and ``out_proj``.

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-image ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(u0, 0)`` at
    ``modeling_cosmos3_edge.py:494``); one call with a segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_cosmos3_edge.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None = None,
                **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        query, key, value = (proj(hidden_states).reshape(seq_length, -1, self.head_dim).transpose(0, 1).unsqueeze(0)
                             for proj in (self.q_proj, self.k_proj, self.v_proj))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, scaling=self.scale, **kwargs)
        return self.out_proj(output.reshape(seq_length, -1).contiguous())

    return forward


def _checked_placeholder_mask(mask: torch.Tensor, inputs_embeds: torch.Tensor, features: torch.Tensor | None,
                              message: str) -> torch.Tensor:
    """``mask`` (``[batch, seq]`` bool, the placeholder tokens) expanded to ``inputs_embeds``' shape, after a
    ``torch_compilable_check`` that the placeholders hold exactly ``features``' values (a graph assertion, not a
    Python branch on a data-dependent count)."""
    from transformers.utils.import_utils import torch_compilable_check

    if features is not None:
        torch_compilable_check(mask.sum() * inputs_embeds.shape[-1] == features.numel(), message)
    return mask.unsqueeze(-1).expand_as(inputs_embeds).to(inputs_embeds.device)


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask")
def _patch_hunyuan_vl_placeholder_check(original: Any) -> Any:
    """HunYuan-VL's placeholder mask with its token-count check as ``torch._check`` instead of a Python ``if``.

    **Why**: ``HunYuanVLModel.get_placeholder_mask`` checks ``if inputs_embeds[special_image_mask].numel() !=
    image_features.numel(): raise``: the boolean-mask index has a data-dependent size, so the ``if`` stops the
    trace (``GuardOnDataDependentSymNode``: ``Ne(u6, 1408)`` at ``modeling_hunyuan_vl.py:1029``). The same check as
    ``torch_compilable_check(placeholders * hidden == numel)`` (Qwen2-VL's form) is a runtime
    assertion of the exported program; the mask is the original's.
    **Upstream**: model-side (transformers ``modeling_hunyuan_vl.py``; the Qwen-VL family uses
    ``torch_compilable_check``).
    **Remove when**: transformers checks HunYuan-VL's placeholder count with ``torch_compilable_check``.
    """

    def get_placeholder_mask(self: Any, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor,
                             image_features: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids is None:
            return original(self, input_ids, inputs_embeds, image_features)
        return _checked_placeholder_mask(input_ids == self.config.image_token_id, inputs_embeds, image_features,
                                         "Image features and image tokens do not match")

    return get_placeholder_mask


@register_patch("dynamo", "transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward")
def _patch_ovis2_visual_indicators(original: Any) -> Any:
    """Ovis2's forward with its visual indicator embeddings written by ``torch.where`` instead of under ``if
    mask.any()``.

    **Why**: ``Ovis2Model.forward`` writes each visual indicator token's embedding with ``if mask.any():
    inputs_embeds[mask] = ...``: ``mask.any()`` on a tensor computed from ``input_ids`` is data-dependent, so the
    trace stops there as soon as the inputs carry an image (``GuardOnDataDependentSymNode``: ``Eq(u1, 1)`` at
    ``modeling_ovis2.py:566``). ``torch.where(mask, indicator, inputs_embeds)`` writes the same rows and leaves the
    others alone when no token matches (the ``if``'s other branch); the rest is the original forward.
    **Upstream**: model-side (transformers ``modeling_ovis2.py``).
    **Remove when**: transformers writes Ovis2's indicator embeddings without branching on ``mask.any()``.
    """
    module = __import__(original.__module__, fromlist=["Ovis2ModelOutputWithPast", "can_return_tuple"])

    def forward(self: Any, input_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                cache: Any = None, inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                use_cache: bool | None = None, mm_encoder_outputs: dict[str, Any] | None = None,
                **kwargs: Any) -> Any:
        if input_ids is None or pixel_values is None or mm_encoder_outputs is not None or "past_key_values" in kwargs:
            return original(self, input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask,
                            position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds, labels=labels,
                            use_cache=use_cache, mm_encoder_outputs=mm_encoder_outputs, **kwargs)
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        image = self.get_image_features(pixel_values=pixel_values, return_dict=True)
        special_image_mask = self.get_placeholder_mask(input_ids, inputs_embeds=inputs_embeds,
                                                       image_features=image.pooler_output)
        inputs_embeds = inputs_embeds.masked_scatter(
            special_image_mask, image.pooler_output.to(inputs_embeds.device, inputs_embeds.dtype))
        indicators = image.visual_indicator_features.to(inputs_embeds.device, inputs_embeds.dtype)
        for i, visual_indicator_id in enumerate(self.visual_indicator_token_ids):
            mask = (input_ids == visual_indicator_id).to(inputs_embeds.device)
            inputs_embeds = torch.where(mask[..., None], indicators[i], inputs_embeds)
        outputs = self.language_model(attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                                      inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        return module.Ovis2ModelOutputWithPast(**outputs, image_outputs=image)

    return module.can_return_tuple(forward)


def _bilinear_source(size: torch.Tensor, edge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(i0, i1, lambda)`` of ``size`` output positions sampled by bilinear ``F.interpolate`` (``align_corners=False``)
    from ``edge`` inputs at ``scale_factor = (size + 0.1) / edge``: source ``(dst + 0.5) * edge / (size + 0.1) - 0.5``,
    clamped at 0, between ``i0 = floor`` and ``i1 = min(i0 + 1, edge - 1)`` (PyTorch's
    ``area_pixel_compute_source_index``); ``size`` a 0-d integer tensor (a data-dependent count)."""
    count = size.item()
    torch._check(count >= 0)
    position = torch.arange(count, device=size.device, dtype=torch.float32)
    scale = (edge / (size.to(torch.float64) + 0.1)).to(torch.float32)
    source = ((position + 0.5) * scale - 0.5).clamp(min=0)
    low = source.floor().long().clamp(max=edge - 1)
    return low, (low + 1).clamp(max=edge - 1), (source - low).clamp(0, 1)


@register_patch("dynamo", "transformers.models.hy_v4_vl.modeling_hy_v4_vl.HYV4VLVisionPatchEmbed.forward")
def _patch_hy_v4_vl_position_interpolation(original: Any) -> Any:
    """HY-V4-VL's patch embedding with its learned position grid sampled bilinearly in tensor ops at each image's
    grid size, instead of ``F.interpolate`` at a ``scale_factor`` computed from ``int(height)``.

    **Why**: ``HYV4VLVisionPatchEmbed.interpolate_pos_encoding`` computes ``scale = (int(height) + 0.1) / edge`` from
    a row of ``image_grid_thw`` (an input tensor): a Python float of a data-dependent size, which torch.export
    cannot trace (``GuardOnDataDependentSymNode``: ``Could not extract specialized integer from data-dependent
    expression u0`` at ``modeling_hy_v4_vl.py:798``). Bilinear interpolation (``align_corners=False``) at that scale
    samples output row ``i`` at ``(i + 0.5) * edge / (h + 0.1) - 0.5`` between two grid rows
    (:func:`_bilinear_source`), and the same for columns: two gathers and weighted sums, the ``h`` and ``w`` output
    positions counted by ``arange`` of the data-dependent sizes (``floor(edge * scale) == h``, as in eager). Other
    interpolation modes than the default ``"bilinear"`` are left to the original.
    **Upstream**: model-side (transformers ``modeling_hy_v4_vl.py``).
    **Remove when**: transformers interpolates HY-V4-VL's position grid without a Python scale of the grid size.
    """

    def positions(self: Any, t: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        edge, width = self.position_edge, self.embed_dim
        grid = self.position_embedding.weight[1:, :].reshape(edge, edge, width).float()
        r0, r1, lr = _bilinear_source(h, edge)
        c0, c1, lc = _bilinear_source(w, edge)
        rows = grid[r0] * (1 - lr)[:, None, None] + grid[r1] * lr[:, None, None]  # [h, edge, width]
        sampled = rows[:, c0] * (1 - lc)[None, :, None] + rows[:, c1] * lc[None, :, None]  # [h, w, width]
        return sampled.reshape(-1, width).repeat(t.item(), 1)

    def forward(self: Any, pixel_values: torch.Tensor, grid_thw: Any) -> torch.Tensor:
        if self.config.interpolate_mode != "bilinear" or not isinstance(grid_thw, torch.Tensor):
            return original(self, pixel_values, grid_thw)
        num_patches, _ = pixel_values.shape
        pixel_values = pixel_values.reshape(num_patches, self.config.num_channels, self.patch_size, self.patch_size)
        patch_embeds = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
        embeddings = patch_embeds.flatten(-2).squeeze(-1).reshape(num_patches, -1)
        position_embeddings = torch.cat([positions(self, t, h, w) for t, h, w in grid_thw], dim=0)
        torch._check(position_embeddings.shape[0] == num_patches)
        return (embeddings + position_embeddings.to(embeddings.dtype)).unsqueeze(0)

    return forward


@register_patch("dynamo", "transformers.models.inkling2.modeling_inkling2.Inkling2Model.get_placeholder_mask",
                # the same method, copied (checked: identical source in transformers 5.24)
                "transformers.models.inkling2_loop.modeling_inkling2_loop.Inkling2LoopModel.get_placeholder_mask",
                "transformers.models.inkling.modeling_inkling.InklingModel.get_placeholder_mask")
def _patch_inkling2_placeholder_check(original: Any) -> Any:
    """Inkling2's placeholder mask with its token-count check on the count of placeholders instead of the ``numel()``
    of a boolean-mask index.

    **Why**: ``Inkling2Model.get_placeholder_mask`` checks ``torch_compilable_check(inputs_embeds[special_mask]
    .numel() == features.numel())``: the masked index has a data-dependent size ``u`` and torch.export's value-range
    refinement of ``u == features.numel()`` fails inside ``torch._check`` (``AssertionError: tgt_bound=VR[128,
    9223372036854775808] not a subset of src_bound=VR[128, 9223372036854775806]`` at ``modeling_inkling2.py:1653``).
    ``special_mask.sum() * hidden == features.numel()`` (the Qwen-VL form) is the same check without the index;
    the mask is the original's.
    **Upstream**: model-side (transformers ``modeling_inkling2.py``, copied to ``modeling_inkling2_loop.py`` and
    Inkling's ``modeling_inkling.py:1087``); the range refinement is torch's.
    **Remove when**: transformers checks Inkling2's placeholder count without indexing, or the test passes with
    ``disable=("_patch_inkling2_placeholder_check",)``.
    """
    def get_placeholder_mask(self: Any, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor,
                             features: torch.Tensor, token_id: int) -> torch.Tensor:
        if input_ids is None:
            return original(self, input_ids, inputs_embeds, features, token_id)
        return _checked_placeholder_mask(input_ids == token_id, inputs_embeds, features,
                                         "Multimodal features and placeholder tokens do not match")

    return get_placeholder_mask


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_temporal_merge_index")
def _patch_kimi_k25_merge_index_counts(original: Any) -> Any:
    """Kimi-K2.5's temporal-merge scatter index with its patch and token counts as ``.item()`` instead of ``int()``.

    **Why**: ``get_vision_temporal_merge_index`` counts the patches and merged tokens of ``grid_thw`` (an input
    tensor) with ``int(tensor.sum())``: under torch.export's non-strict tracing ``int()`` of a data-dependent value
    must be specialized and fails (``GuardOnDataDependentSymNode``: ``Could not extract specialized integer from
    data-dependent expression u10`` at ``modeling_kimi_k25.py:447``). ``.item()`` gives the same counts as unbacked
    sizes (checked non-negative); each patch's video is counted by comparisons with the cumulative patch counts
    instead of ``repeat_interleave(..., output_size=)`` (torch.onnx's ``aten_repeat_interleave_Tensor`` takes no
    ``output_size``); the rest is the original computation.
    **Upstream**: model-side (transformers ``modeling_kimi_k25.py``).
    **Remove when**: transformers counts them with ``.item()`` (or torch.export specializes ``int()`` to an unbacked
    size).
    """

    def get_vision_temporal_merge_index(grid_thw: torch.Tensor, kernel_height: int, kernel_width: int,
                                        kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, Any]:
        if kwargs is not None and "temporal_merge_index" in kwargs:
            return original(grid_thw, kernel_height, kernel_width, kwargs=kwargs)
        kernel_size = kernel_height * kernel_width
        num_frames, height, width = grid_thw.unbind(-1)
        merged_width = width // kernel_width
        patches_per_video = num_frames * height * width
        merged_tokens_per_video = (height // kernel_height) * merged_width
        patch_offset_per_video = torch.cumsum(patches_per_video, 0) - patches_per_video
        merged_offset_per_video = torch.cumsum(merged_tokens_per_video, 0) - merged_tokens_per_video
        num_patches, num_merged_tokens = patches_per_video.sum().item(), merged_tokens_per_video.sum().item()
        torch._check(num_patches >= 0)
        torch._check(num_merged_tokens >= 0)
        patch = torch.arange(num_patches, device=grid_thw.device)
        # each patch's video: how many videos end at or before it (repeat_interleave with output_size, which
        # torch.onnx's translation does not take)
        video_index = (patch[:, None] >= torch.cumsum(patches_per_video, 0)[None, :]).sum(-1)
        patch_index_in_video = patch - patch_offset_per_video[video_index]
        patch_height, patch_width = height[video_index], width[video_index]
        index_in_frame = patch_index_in_video % (patch_height * patch_width)
        row, col = index_in_frame // patch_width, index_in_frame % patch_width
        merged_index_in_video = (row // kernel_height) * merged_width[video_index] + (col // kernel_width)
        position_in_kernel = (row % kernel_height) * kernel_width + (col % kernel_width)
        destination_index = (merged_offset_per_video[video_index] + merged_index_in_video) * kernel_size \
            + position_in_kernel
        frame_weight = 1.0 / num_frames[video_index].to(torch.float32)
        return destination_index, frame_weight, num_merged_tokens

    return get_vision_temporal_merge_index


@register_patch("dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel"
                ".pixel_unshuffle")
def _patch_video_llama_3_pixel_unshuffle(original: Any) -> Any:
    """VideoLLaMA3's per-image bilinear downsampling by its merge size as one gather of each merge window's central
    patches, instead of a Python loop of ``view`` and ``F.interpolate`` at sizes read from ``grid_thw``.

    **Why**: ``VideoLlama3VisionModel.pixel_unshuffle`` splits the patches on ``grid_thw.prod(1).tolist()`` and, per
    image, views them as ``(t, h // m, w // m, m, m, c)`` and interpolates to ``(h // m, w // m)``: every size is a
    data-dependent value of the ``grid_thw`` and ``merge_sizes`` inputs, and torch.export stops at the view
    (``GuardOnDataDependentSymNode``: ``64*u2*u8*u9 < 2``). The patches come in merge windows of ``m * m`` rows
    (``dy``, ``dx``); bilinear interpolation (``align_corners=False``) by the exact factor ``m`` samples each output
    at the window's centre ``(m - 1) / 2``, i.e. the mean of the window's rows ``(a, a), (a, b), (b, a), (b, b)``
    with ``a = (m - 1) // 2`` and ``b = m // 2`` (the one centre patch for odd ``m``, the identity for ``m = 1``), in
    the window order ``(t, h // m, w // m)`` that the original's output has. Each output row finds its image and
    window by comparisons with the cumulative counts; the row count is ``.item()`` of their sum.
    **Upstream**: model-side (transformers ``modeling_video_llama_3.py``).
    **Remove when**: transformers downsamples VideoLLaMA3's features without per-image Python sizes.
    """

    def pixel_unshuffle(self: Any, hidden_states: torch.Tensor, grid_thw: torch.Tensor,
                        merge_sizes: torch.Tensor) -> torch.Tensor:
        device = hidden_states.device
        merge = merge_sizes.to(device=device, dtype=torch.long).reshape(-1)
        patches = grid_thw.to(device).prod(dim=1)
        windows = patches // (merge * merge)
        patch_start = torch.cumsum(patches, 0) - patches
        window_end = torch.cumsum(windows, 0)
        total = window_end[-1].item()
        torch._check(total >= 0)
        row = torch.arange(total, device=device)
        image = (row[:, None] >= window_end[None, :]).sum(-1)
        m = merge[image]
        base = patch_start[image] + (row - (window_end - windows)[image]) * m * m
        low, high = (m - 1) // 2, m // 2
        corners = [base + dy * m + dx for dy in (low, high) for dx in (low, high)]
        return sum(hidden_states[index] for index in corners) * 0.25

    return pixel_unshuffle


@register_patch("dynamo",
                "transformers.models.muse_glimmer.modeling_muse_glimmer.MuseGlimmerVisionAttention.forward",
                # the same forward, copied (checked: identical source in transformers 5.24)
                "transformers.models.muse_spark.modeling_muse_spark.MuseSparkVisionAttention.forward")
def _patch_muse_glimmer_vision_segments(original: Any) -> Any:
    """Attend over MuseGlimmer's packed image patches (and its attention windows) with one block-diagonal mask
    instead of one attention call per segment (:func:`_segment_attention`); its attention applies the rotary
    embedding batch-first (``[1, patches, heads, head_dim]``) and projects with ``q_proj``/``k_proj``/``v_proj``
    and ``proj``.

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-segment ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(Max(0, u3 - Min(1,
    u3)), 0)`` at ``modeling_muse_glimmer.py:591``, the same at ``modeling_muse_spark.py:735``); one call with a
    segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_muse_glimmer.py``, copied to ``modeling_muse_spark.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["apply_rotary_pos_emb_vision", "eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlen: int | None = None,
                **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        # the window reordering makes the patch count data-dependent: SDPA's `q_length > 1` would stop the trace; an
        # image is at least one merge window (merge_size ** 2 > 1 patches)
        torch._check(seq_length > 1)
        query, key, value = (proj(hidden_states).reshape(1, seq_length, -1, self.head_dim)
                             for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(2, 1) for t in (query, key, value))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.proj(output.reshape(seq_length, -1).contiguous())

    return forward


@register_patch("dynamo",
                "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniVisionAttention.forward")
def _patch_qwen2_5_omni_vision_segments(original: Any) -> Any:
    """Attend over Qwen2.5-Omni's packed image patches (and its attention windows) with one block-diagonal mask
    instead of one attention call per segment (:func:`_segment_attention`); its attention projects with ``q``/``k``/
    ``v`` and ``proj`` (Qwen2.5-VL's fuses them in ``qkv``).

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-segment ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(Max(0, u3 - Min(1,
    u3)), 0)`` at ``modeling_qwen2_5_omni.py:1061``); one call with a segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_qwen2_5_omni.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["apply_rotary_pos_emb_vision", "eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlen: int | None = None,
                **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        query, key, value = (proj(hidden_states).reshape(seq_length, self.num_heads, -1)
                             for proj in (self.q, self.k, self.v))
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.proj(output.reshape(seq_length, -1).contiguous())

    return forward


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings")
def _patch_udop_combine_image_text(original: Any) -> Any:
    """Combine UDOP's image patches with its text as a fixed-size gather: each row's patches that no word's box
    centre falls on, in order, then zeros, where the original selects them with a boolean mask per row and pads.

    **Why**: ``combine_image_text_embeddings`` marks the patches under the words with ``rows, cols = zip(*ind)``, a
    Python iteration over a tensor of ``batch * seq`` index pairs (``RuntimeError: The tensor has a non-zero number of
    elements, but its data is not allocated yet`` under torch.export), then keeps each row's other patches with
    ``image_embeddings[i][patch_inds[i]]`` (a data-dependent length) and pads them to the patch count. Here the marks
    are one ``scatter``; a stable sort of the unmarked patches first gives their order, a gather the patches, their
    boxes and mask, and the marked ones' slots are zeroed: the same values and dtypes (the boxes float64, as the
    original's ``torch.cat`` promotes them), the same fixed length (``max_len == 0``: the patch count).
    **Upstream**: model-side (transformers ``modeling_udop.py``).
    **Remove when**: transformers selects UDOP's patches without iterating over a tensor.
    """
    module = __import__(original.__module__, fromlist=["get_visual_bbox"])

    def combine_image_text_embeddings(image_embeddings: torch.Tensor, inputs_embeds: torch.Tensor,
                                      bbox: torch.Tensor, visual_bbox: torch.Tensor | None,
                                      attention_mask: torch.Tensor | None = None, num_patches: int = 14,
                                      max_len: int = 0, image_size: int = 224,
                                      patch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if max_len != 0:  # a length other than the patch count: never passed by UdopStack
            return original(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask, num_patches,
                            max_len, image_size, patch_size)
        sequence_length = num_patches
        ocr_points_x = torch.clip(torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * sequence_length).long(), 0,
                                  sequence_length - 1)
        ocr_points_y = torch.clip(torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * sequence_length).long(), 0,
                                  sequence_length - 1) * sequence_length
        ocr_points = ocr_points_x + ocr_points_y
        dtype = torch.float32 if bbox.device.type == "mps" else torch.float64
        bbox = bbox.to(dtype)
        target_seg = (bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0)
        repeated_vision_embeds = torch.gather(
            image_embeddings, 1, ocr_points.unsqueeze(-1).repeat(1, 1, image_embeddings.size(-1)))
        repeated_vision_embeds = repeated_vision_embeds.masked_fill(target_seg[..., None], 0.0)
        inputs_embeds += repeated_vision_embeds

        keep = torch.ones_like(image_embeddings[:, :, 0], dtype=torch.bool).scatter(1, ocr_points, False)
        order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices  # kept patches first, in order
        kept = torch.gather(keep, 1, order)
        if visual_bbox is None:
            visual_bbox = module.get_visual_bbox(image_size=image_size, patch_size=patch_size)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(image_embeddings.size(0), 1, 1)
            visual_bbox = visual_bbox.to(image_embeddings.device)

        def select(values: torch.Tensor) -> torch.Tensor:
            picked = torch.gather(values, 1, order[..., None].expand(-1, -1, values.shape[-1]))
            return picked * kept[..., None].to(picked.dtype)

        inputs_vision_patches = select(image_embeddings)
        visual_bbox = select(visual_bbox)
        inputs_embeds = torch.cat([inputs_embeds, inputs_vision_patches], 1)
        bbox = torch.cat([bbox, visual_bbox], 1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, kept.to(attention_mask.dtype)], 1)
        return inputs_embeds, bbox, attention_mask

    return combine_image_text_embeddings


@register_patch("dynamo", "transformers.models.exaone4_5.modeling_exaone4_5.Exaone4_5_VisionAttention.forward")
def _patch_exaone4_5_vision_segments(original: Any) -> Any:
    """Attend over EXAONE 4.5's packed image patches with one block-diagonal mask instead of one attention call per
    image (:func:`_segment_attention`); its fused ``qkv`` splits into fewer key/value heads than query heads
    (grouped-query attention, which the attention interface repeats).

    **Why**: as for Qwen2-VL (:func:`_patch_qwen_vl_vision_segments`): the per-image ``torch.split`` on
    ``.tolist()`` of ``cu_seqlens`` is data-dependent (``GuardOnDataDependentSymNode``: ``Eq(Max(0, u3 - Min(1,
    u3)), 0)`` at ``modeling_exaone4_5.py:301``); one call with a segment mask computes the same attention.
    **Upstream**: model-side (transformers ``modeling_exaone4_5.py``).
    **Remove when**: transformers' non-flash vision attention masks by segment instead of splitting on ``.tolist()``.
    """
    from transformers.utils.generic import is_flash_attention_requested

    module = __import__(original.__module__, fromlist=["apply_rotary_pos_emb_vision", "eager_attention_forward"])

    def forward(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlen: int | None = None,
                **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        query, key, value = (t.view(seq_length, -1, self.head_dim) for t in
                             self.qkv(hidden_states).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1))
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        output = _segment_attention(self, module, query, key, value, cu_seqlens, **kwargs)
        return self.proj(output.reshape(seq_length, -1).contiguous())

    return forward


@register_patch("dynamo", "transformers.models.apertus1p5.modeling_apertus1p5.Apertus1p5Model.get_image_tokens")
def _patch_apertus1p5_image_size_list(original: Any) -> Any:
    """Tokenize Apertus 1.5's images at the sizes the exporter gives as a list.

    **Why**: the dynamo exporter bakes ``image_sizes`` into the program and gives the traced model the nested list
    ``[[H, W], ...]`` (``IMAGE_SIZE_LISTS``: sizes read from a tensor, even a constant one, are data-dependent);
    ``get_image_tokens`` iterates ``image_sizes.tolist()``, which a list lacks (``AttributeError: 'list' object has
    no attribute 'tolist'``). The list is iterated as ``.tolist()`` would give it; a tensor goes to the original.
    **Upstream**: model-side (transformers ``modeling_apertus1p5.py``, ``Apertus1p5Model.get_image_tokens``).
    **Remove when**: the exporter stops giving ``image_sizes`` as a list, or the model iterates the sizes without
    ``.tolist()``: ``tests/dynamo/test_model_patches_vision.py`` exports with ``disable=("<this patch>",)``.
    """

    def get_image_tokens(self: Any, pixel_values: torch.Tensor, image_sizes: Any) -> list[torch.Tensor]:
        if isinstance(image_sizes, torch.Tensor):
            return original(self, pixel_values, image_sizes)
        image_tokens = []
        for image, (height, width) in zip(pixel_values, image_sizes, strict=True):
            codes = self.vision_tokenizer.encode(image[None, :, :height, :width]).image_tokens
            image_tokens.append(codes.flatten() + self.config.image_token_offset)
        return image_tokens

    return get_image_tokens


@register_patch("dynamo", "transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe"
                ".Ernie4_5_VLMoeVariableResolutionResamplerModel._temporal_slicing")
def _patch_ernie4_5_vl_temporal_slicing(original: Any) -> Any:
    """Pair ERNIE 4.5 VL's frames with index tensors computed from ``grid_thw`` instead of Python ranges over its values.

    **Why**: the resampler's ``_temporal_slicing`` loops over the values of ``grid_thw`` (``zip(grid_t, ...)``,
    ``range(0, temporal_size, 2)``) to build the indices of each video's even and odd frames (an image's one frame
    twice); the values of the baked grid are data-dependent in the trace (``Could not extract specialized integer
    from data-dependent expression u1`` at modeling_ernie4_5_vl_moe.py:1021). Here every row of ``hidden_states``
    gets its item, frame and position from the grid by tensor ops; the rows that start a pair (an image's every
    row; a video's even frames with an odd frame after them) are kept in the same order, each beside its partner
    (itself for an image, the next frame's row for a video): the same rows as the loops.
    **Upstream**: model-side (transformers ``modeling_ernie4_5_vl_moe.py``, ``_temporal_slicing``).
    **Remove when**: the resampler computes its offsets with tensor ops: ``tests/dynamo/test_model_patches_vision.py``
    exports ERNIE 4.5 VL with ``disable=("<this patch>",)``.
    """

    def _temporal_slicing(self: Any, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        device = hidden_states.device
        grid = grid_thw.to(device)
        frames = grid[:, 0]
        spatial = grid[:, 1:].prod(-1) // (self.spatial_merge_size ** 2)  # rows a frame
        rows = frames * spatial  # rows an item
        ends = rows.cumsum(0)
        row = torch.arange(hidden_states.shape[0], device=device)
        item = torch.bucketize(row, ends, right=True)  # the image or video each row belongs to
        local = row - (ends - rows)[item]
        t, s = frames[item], spatial[item]
        frame = local // s
        starts = (t == 1) | ((frame % 2 == 0) & (frame + 1 < t))
        first = row[starts]
        second = first + torch.where(t[starts] > 1, s[starts], 0)
        return torch.cat([hidden_states.index_select(0, first), hidden_states.index_select(0, second)], dim=-1)

    return _temporal_slicing
