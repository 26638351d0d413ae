"""Known failures of the dynamo trace: model classes not exportable as they are (``EXPORT_SKIPS``).

Every backend traces with hfexport-dynamo, so a class listed here fails on every backend; the sweep marks
these cases ``skipped`` and ``hfexport sweep --recheck-skips`` re-runs them. The list should shrink: each
reason names the model-side change that would make the class exportable.
"""

from __future__ import annotations

__all__ = ["EXPORT_SKIPS"]

# Model classes that are not exportable as they are: class name -> the model-side change that would make
# them exportable. `hfexport sweep --recheck-skips` re-runs them; the list should shrink.
# Every entry was investigated on the tiny zoo case (transformers 5.24, torch 2.15, dynamic=True): the
# `TORCH_LOGS=+dynamic` guard that specializes the sequence, or the data-dependent op, is named in the reason.
# A class whose sequence length gets specialized exports, but only for the traced length ("runtime_error:
# Guard failed: input_ids.size()[1] == 8" at any other length), which is not a usable dynamic export.
EXPORT_SKIPS: dict[str, str] = {
    **dict.fromkeys(
        ("xLSTMModel", "xLSTMForCausalLM"),
        "the native mLSTM kernels loop in Python over the chunks and the time steps of the sequence "
        "(mlstm_chunkwise_recurrent_fw_C: `for key in range(0, num_chunks)`; mlstm_recurrent_sequence_native: "
        "`for t in range(sequence_length)`): unrolled, the sequence length is specialized (and the trace takes "
        "~200 s for 2 tiny layers). Exportable once the inter-chunk recurrence is a scan op "
        "(torch._higher_order_ops.scan)."),
    **dict.fromkeys(
        ("FunnelModel", "FunnelBaseModel", "FunnelForMaskedLM", "FunnelForQuestionAnswering",
         "FunnelForSequenceClassification", "FunnelForTokenClassification"),
        "FunnelAttentionStructure.get_position_embeds keeps positions as Python lists from range(seq_len) "
        "(static on purpose, says its comment) and pools them in Python: the sequence length is specialized. "
        "Exportable with a dynamic sequence once positions and their pooling use torch.arange and tensor slicing."),
    **dict.fromkeys(
        ("LongformerModel", "LongformerForMaskedLM", "LongformerForSequenceClassification",
         "LongformerForTokenClassification", "LEDModel", "LEDForConditionalGeneration", "LEDForQuestionAnswering"),
        "`_chunk` (LongformerSelfAttention / LEDEncoderSelfAttention) counts chunks with "
        "torch.div(hidden_states.size(1), 2 * window_overlap, rounding_mode='trunc'), a tensor, so view() gets a "
        "data-dependent size (GuardOnDataDependentSymNode: Eq(u1, 1)). With the count made the int "
        "hidden_states.size(1) // (2 * window_overlap) (tried by swapping torch.div for floor division in both "
        "modules), the trace stops at the next one: the self-attention branches in Python on "
        "is_index_global_attn.flatten().any().item() (whether any token attends globally; Eq(u0, 1)). Exportable "
        "once both are tensor-only (integer chunk count; the global-attention path computed unconditionally and "
        "masked)."),
}


