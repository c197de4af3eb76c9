"""The critic under Megatron-Core (strategy `megatron`): the policy's GPTModel with a value head on the last stage.

The head is one output per token, `Linear(hidden, 1)` replicated on every tensor rank, in place of GPTModel's
vocabulary layer (so the model returns [rows, seq, 1]); it starts at zero, as fsdp2's `ValueModel` head does. The
decoder loads from the Hugging Face checkpoint through rlc's conversion and trains with the same clipped value loss
as fsdp2's critic (`workers.common.critic_objective`). A Hugging Face export is fsdp2's critic's: `critic.pt`, the
decoder as `backbone.*` and the head under `value_head_prefix`, which `fsdp.ValueModel` loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlc.runtime.batch import TrainBatch
from rlc.runtime.workers import megatron_cp as cp_utils
from rlc.runtime.workers.common import WorkerSettings, critic_objective
from rlc.runtime.workers.megatron import MegatronWorker

__all__ = ["MegatronCriticWorker", "ValueHead"]

HEAD = "output_layer"  # GPTModel calls whatever sits there on the final hidden states


class ValueHead(torch.nn.Module):
    """A value per token from the final hidden states, [seq, rows, hidden] -> [seq, rows, 1], called as GPTModel calls
    its output layer. Under sequence parallelism each tensor rank holds part of the sequence: the head sees the whole
    of it, and each rank's backward keeps its own part of the gradient (the head's own gradient is the same on every
    tensor rank, so Megatron counts it once in the gradient norm)."""

    def __init__(self, hidden_size: int, sequence_parallel: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        if self.sequence_parallel:
            # deferred: Megatron-Core, optional (FSDP jobs lack it)
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


class MegatronCriticWorker(MegatronWorker):
    """One rank of the critic under Megatron-Core. `config` is trainer.critic."""

    roles = ("critic",)

    def __init__(self, settings: WorkerSettings, config: Any, algorithm: Any, rank: int, world_size: int):
        super().__init__(settings, config, algorithm, rank, world_size)
        self.head_name = algorithm.value_head_prefix

    def _gpt_kwargs(self) -> dict:
        # A tied model's last stage would share its embedding with the head (and sum their gradients across stages).
        return {**super()._gpt_kwargs(), "share_embeddings_and_output_weights": False}

    def _build_with_bridge(self):
        raise RuntimeError(
            "a critic under the megatron strategy needs a model rlc's conversion covers (Llama, Qwen2, Mistral); "
            "train this one's critic with fsdp2 (trainer.critic.strategy: fsdp2)"
        )

    def _fit_chunk(self, model, state: dict) -> dict:
        """The last stage's chunk gets the value head; the converted LM head is no use to a critic."""
        if model.post_process:
            setattr(model, HEAD, ValueHead(self.arch.hidden_size, bool(self.tconfig.sequence_parallel)))
        return {k: v for k, v in state.items() if not k.startswith(f"{HEAD}.")}

    def _own_weight(self, name: str) -> bool:
        return name.startswith(f"{HEAD}.")

    # -- values and the value loss ------------------------------------------------------------------------

    def _response_logprobs(self, output, mb: TrainBatch, want_entropy: bool, want_sum_pi_squared: bool = False):
        """The critic's per-token outputs: the value at the position before each response token, [rows, response
        length] (no second output); with context parallelism the group sums its ranks' positions."""
        values = output[..., 0].float()
        start, length = mb.prompt_len - 1, mb.response_ids.shape[1]
        if self.cp == 1:
            return values[:, start : start + length], None
        # deferred: Megatron-Core, optional (FSDP jobs lack it)
        from megatron.core import parallel_state as ps

        held = cp_utils.local_positions(self._seq_len(mb), self.cp, self.cp_rank).to(values.device)
        scoring = (held >= start) & (held < start + length)
        group = ps.get_context_parallel_group()
        return cp_utils.response_values(values[:, scoring], held[scoring], start, length, group), None

    def _objective(self, mb: TrainBatch, output: torch.Tensor, totals: dict) -> tuple[torch.Tensor, dict]:
        values, _ = self._response_logprobs(output, mb, False)
        return critic_objective(self.algorithm, values, mb.to(values.device), totals)

    # -- weights out ----------------------------------------------------------------------------------------

    def _named_params(self) -> list[tuple[str, torch.Tensor]]:
        """The decoder's weights (the Hugging Face conversion's); the head leaves through `_head`."""
        return [(n, p) for n, p in super()._named_params() if not n.startswith(f"{HEAD}.")]

    def _head(self) -> dict[str, torch.Tensor] | None:
        """The value head's weight and bias on global rank 0 (None elsewhere): the last stage's tensor rank 0 of the
        first data-parallel and context replica sends them down the pipeline. Every rank must call it."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it)
        from megatron.core import parallel_state as ps

        if self.dp_rank != 0 or self.cp_rank != 0 or self.tp_rank != 0:
            return None
        dev = "cuda" if self.s.device == "cuda" else "cpu"
        hidden = self.arch.hidden_size
        last = self.pp_rank == self.pp - 1
        head = getattr(self.chunks[-1], HEAD) if last else None
        flat = (
            torch.cat([head.weight.detach().flatten(), head.bias.detach()]).float()
            if head is not None
            else torch.empty(hidden + 1, device=dev)
        )
        if self.pp > 1:
            group = ps.get_pipeline_model_parallel_group()
            dist.broadcast(flat, src=dist.get_global_rank(group, self.pp - 1), group=group)
        if self.rank != 0:
            return None
        flat = flat.cpu()
        return {f"{self.head_name}.weight": flat[:hidden].view(1, hidden), f"{self.head_name}.bias": flat[hidden:]}

    @torch.no_grad()
    def full_state_dict(self, dtype: str | None = None, adapters_only: bool = False) -> dict[str, torch.Tensor] | None:
        """fsdp2's critic's state dict (`fsdp.ValueModel`: `backbone.*` and the head) on global rank 0."""
        decoder = super().full_state_dict(dtype)
        with self._device():
            head = self._head()
        if self.rank != 0:
            return None
        assert decoder is not None and head is not None
        out = {f"backbone.{n.removeprefix('model.')}": t for n, t in decoder.items() if not n.startswith("lm_head.")}
        return {**out, **head}

    def weight_metas(self, dtype: str | None = None) -> list:
        raise RuntimeError("the critic sends no weights to the inference engines")

    def broadcast_weights(self, dtype: str | None = None) -> int:
        raise RuntimeError("the critic sends no weights to the inference engines")

    def export_hf(self, directory: str, tokenizer_path: str) -> None:
        """`critic.pt` in `directory`, as fsdp2's critic writes it."""
        full = self.full_state_dict()
        if self.rank == 0:
            assert full is not None
            os.makedirs(directory, exist_ok=True)
            torch.save(full, Path(directory) / "critic.pt")
        dist.barrier()
