"""Sample packing: a padded micro-batch as one padding-free row of its real tokens.

`pack` concatenates the real tokens (attention_mask == 1) of every row into a (1, T) row with positions that
restart at 0 for each sequence; `unpack` scatters per-position outputs (values) back into the
(rows, response_len) layout of `runtime/batch.py`, so the loss code is unchanged; logits are scored where they
are, at `response_rows` (`score_tokens(..., rows=...)`), without a copy of them in that layout.

How the model keeps the sequences apart (transformers 5.23; verified in the installed source):

* sdpa / eager / flex: call the model with `attention_mask=None` and the restarting `position_ids`.
  `masking_utils._preprocess_mask_arguments` then runs `find_packed_sequence_indices(position_ids)` (a new
  sequence wherever the position does not grow by 1) and `create_causal_mask` /
  `create_sliding_window_causal_mask` AND the causal mask with `packed_sequence_mask_function`: a block-diagonal
  causal (4D) mask. Detection only happens when the 2D mask is None *and* `past_key_values` is None, hence
  `attention_mask=None` and `use_cache=False`: a 2D all-ones mask, or a model left with `config.use_cache=True`
  (it then builds a `DynamicCache` in forward, even in training), silently turns packing off and the sequences
  attend to each other.
* flash_attention_2/3: `modeling_flash_attention_utils._flash_attention_forward` takes the varlen path either from
  explicit `cu_seq_lens_q/k` + `max_length_q/k` kwargs (`packed_kwargs(..., varlen=True)`; computed once here) or,
  without them, by inferring them from `position_ids` (`_is_packed_sequence` + `prepare_fa_kwargs_from_position_ids`,
  a device sync in every layer). Both are correct; the explicit kwargs are cheaper but the callable must forward
  `**kwargs` to the decoder (HF models do; a wrapper must too). (Read in the source; not yet run on a GPU.)

Not valid for models whose sequence mixing is not (only) masked attention with 1D positions: linear-attention /
state-space layers (their recurrent state flows across sequences), multimodal RoPE (3D `position_ids`), or an
attention implementation without a mask function (`_preprocess_mask_arguments` then returns no mask at all);
see `packing_unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Attention implementations whose packed-sequence handling is the one described above.
PACKABLE_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")


@dataclass
class Packed:
    input_ids: torch.Tensor  # (1, T) the real tokens of every row, row after row
    position_ids: torch.Tensor  # (1, T) 0.. for each sequence
    starts: torch.Tensor  # (rows,) offset of each row's first token in the packed row
    lengths: torch.Tensor  # (rows,) real tokens of each row (prompt + response)
    prompt_lens: torch.Tensor  # (rows,) real prompt tokens: offset of the first response token within the row
    cu_seqlens: torch.Tensor  # (sequences + 1,) int32 boundaries of the non-empty rows (flash varlen)
    max_len: int  # longest row


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> Packed:
    """The real tokens of a [left-padded prompt | right-padded response] batch, packed into one row."""
    real = attention_mask.bool()
    lengths = real.sum(-1)
    starts = lengths.cumsum(0) - lengths
    # Restarting positions are the padded worker's cumsum positions at the real tokens.
    positions = real.long().cumsum(-1) - 1
    nonempty = lengths[lengths > 0]
    cu = torch.zeros(nonempty.numel() + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = nonempty.cumsum(0)
    return Packed(
        input_ids=input_ids[real].unsqueeze(0),
        position_ids=positions[real].unsqueeze(0),
        starts=starts,
        lengths=lengths,
        prompt_lens=real[:, :prompt_len].sum(-1),
        cu_seqlens=cu,
        max_len=int(lengths.max()) if lengths.numel() else 0,
    )


def response_rows(packed: Packed, response_len: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response token is predicted in the packed row: (rows, response_len) positions (the token before
    it; clamped into the row where there is none) and whether there is one (False past a row's response)."""
    j = torch.arange(response_len, device=device)
    prompt = packed.prompt_lens.to(device)[:, None]
    response = packed.lengths.to(device)[:, None] - prompt
    index = packed.starts.to(device)[:, None] + prompt - 1 + j
    valid = (j < response) & (prompt + j >= 1)
    return index.clamp(min=0, max=max(int(packed.input_ids.shape[1]) - 1, 0)), valid


def unpack(per_token: torch.Tensor, packed: Packed, response_len: int, fill: float = 0.0) -> torch.Tensor:
    """(1, T, ...) outputs by packed position -> (rows, response_len, ...), entry [i, j] taken at the position that
    predicts response token j of row i (the token before it); entries past a row's response (or with no
    preceding token) get `fill`. Differentiable with respect to `per_token`. (Logits are better scored in place
    at `response_rows` with `score_tokens`: this copies them.)"""
    index, valid = response_rows(packed, response_len, per_token.device)
    out = per_token[0][index.clamp(max=max(per_token.shape[1] - 1, 0))]
    return out.masked_fill(~valid.view(*valid.shape, *[1] * (out.dim() - 2)), fill)


def packed_kwargs(packed: Packed, varlen: bool = False, no_cache: bool = True) -> dict[str, Any]:
    """Model kwargs for a packed row: no 2D mask, restarting positions, `use_cache=False` (`no_cache=False` leaves
    it out, for a callable without that parameter whose config already has use_cache off); `varlen` adds the
    flash-attention `cu_seq_lens_q/k` and `max_length_q/k` (ignored by sdpa/eager, saves flash a per-layer sync)."""
    kwargs: dict[str, Any] = {
        "input_ids": packed.input_ids,
        "attention_mask": None,
        "position_ids": packed.position_ids,
    }
    if no_cache:
        kwargs["use_cache"] = False
    if varlen:
        cu = packed.cu_seqlens.to(packed.input_ids.device)
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=packed.max_len, max_length_k=packed.max_len)
    return kwargs


def packed_forward(
    model: Callable[..., Any], packed: Packed, varlen: bool = False, no_cache: bool = True, **kwargs: Any
) -> Any:
    """`model` (a causal LM, a decoder, or the critic) on the packed row, sequences kept apart; its output as is."""
    return model(**packed_kwargs(packed, varlen, no_cache), **kwargs)


def packing_unsupported(config: Any) -> str | None:
    """Why packing would let sequences see each other with this model config, or None when it is safe."""
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in PACKABLE_ATTENTION:
        return f"attention implementation {attn!r} has no known packed-sequence handling"
    layer_types = set(getattr(config, "layer_types", None) or ())
    other = layer_types - {"full_attention", "sliding_attention", "chunked_attention"}
    if other:
        return f"layer types {sorted(other)} mix tokens outside the attention mask"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    ropes = [rope, *rope.values()] if isinstance(rope, dict) else []  # flat, or one per layer type
    if any(isinstance(r, dict) and ("mrope_section" in r or r.get("rope_type") == "mrope") for r in ropes):
        return "multimodal RoPE takes 3D position_ids"
    if getattr(config, "is_encoder_decoder", False) or not getattr(config, "is_causal", True):
        return "not a causal decoder"
    return None
