"""The payload transport: whole state dicts through Ray's object store (or an HTTP body for remote engines); LoRA
adapters travel as a payload too (only the adapter tensors, `weights.lora`).

Ray keeps numpy arrays in shared memory and hands readers a view, where a pickled torch tensor is
copied on every get. Packing a state dict as numpy arrays (bf16/fp16 as their raw 16-bit words) lets
an engine read the trainer's weights without a copy in between.
"""

from __future__ import annotations

import warnings

import torch

_RAW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def pack(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """name -> (numpy array, torch dtype name, shape) of CPU tensors, for the object store."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.view(_RAW[t.dtype]) if t.dtype in _RAW else t
        out[name] = (raw.numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
    return out


def unpack(packed: dict) -> dict[str, torch.Tensor]:
    """The tensors of `pack`, viewing the arrays' memory (read-only when it is the object store's)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # from_numpy of a read-only array: we only read it
        for name, value in packed.items():
            if torch.is_tensor(value):
                out[name] = value
                continue
            array, dtype, shape = value
            t = torch.from_numpy(array)
            dt = getattr(torch, dtype)
            out[name] = (t.view(dt) if dt in _RAW else t).reshape(shape)
    return out
