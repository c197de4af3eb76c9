"""The `hf` inference engine: batched sampling with a transformers model and its KV cache.

It has the interface the vLLM engine has (generate, sleep / wake_up, the weight-update paths), so the driver
does not care which one runs. Sampling is written out here rather than delegated to `generate()` so
the log-probability of every sampled token is the one the trainer computes: log_softmax(logits / T)
before top-k / top-p / min-p filtering and the repetition penalty.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from rlc.runtime.host import cpu_threads, pin_gloo_interface
from rlc.runtime.inference.base import Completion, Sampling
from rlc.runtime.inference.decode import LeanDecoder, unsupported
from rlc.runtime.inference.routes import RouteRecorder
from rlc.runtime.models import accepts, cache_keyword, load_causal_lm, returned_cache
from rlc.runtime.stopping import leave_sigterm_to_the_driver
from rlc.runtime.weights.broadcast import GroupSeat, group_device, receive_weights
from rlc.runtime.weights.delta import receiver
from rlc.runtime.weights.ipc import open_bucket
from rlc.runtime.weights.lora import adapter_names, with_lora
from rlc.runtime.weights.payload import unpack
from transformers import DynamicCache


def _filter_logits(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Top-k, then top-p, then min-p; removed tokens get -inf."""
    neg_inf = torch.finfo(logits.dtype).min
    if 0 < s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, neg_inf)
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= s.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, neg_inf)
    if s.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * s.min_p
        logits = logits.masked_fill(probs < floor, neg_inf)
    return logits


def _draw(weights: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One index per row, drawn with probability proportional to the row's non-negative `weights`.

    The running sum (in float64) is inverted at one uniform draw per row; torch.multinomial draws a random number for
    every entry instead, which at a vocabulary of 50k costs more than the rest of a small model's sampling step.
    `right=True` lands on the first entry whose running sum exceeds the draw, so an entry of weight 0 is never drawn.
    """
    cumulative = weights.cumsum(-1, dtype=torch.float64)
    draw = torch.rand((weights.shape[0], 1), dtype=torch.float64, generator=gen, device=weights.device)
    picked = torch.searchsorted(cumulative, draw * cumulative[:, -1:], right=True)
    return picked.clamp_(max=weights.shape[-1] - 1).squeeze(-1)


def _penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty on every token id already in the sequence."""
    scores = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scores, logits)


class HFEngine:
    """One engine replica: a causal LM on one device that samples completions for batches of prompts."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        tokenizer=None,
        cpu_slots_per_node: int | None = None,
        lora=None,
        prompt_cache_bytes: int = 0,
        language_model_only: bool = False,
        routed_experts: bool = False,
    ):
        leave_sigterm_to_the_driver()
        self.device = torch.device(device)
        if cpu_slots_per_node and self.device.type == "cpu":
            cpu_threads(cpu_slots_per_node)
        self.dtype = _DTYPES[dtype]
        self.model_path = model_path
        # language_model_only: a multimodal checkpoint's text model, as the trainer loads it (the same weight names)
        self.model = load_causal_lm(model_path, language_model_only=language_model_only, dtype=self.dtype)
        self.lora = lora is not None and lora.rank > 0
        if self.lora:  # the trainer's adapters, refreshed by every sync; the base weights stay as loaded
            self.model = with_lora(self.model, lora)
        self.model = self.model.to(self.device).eval()
        # routed_experts (routing replay): each completion carries the experts its tokens were routed to
        self.routes = RouteRecorder(self.model) if routed_experts else None
        # Why decode steps go through the transformers forward (None: they run on LeanDecoder).
        self.lean_decode_off = unsupported(self.model)
        self.lean_decode = self.lean_decode_off is None
        config = self.model.config
        self.eos_token_id = eos_token_id if eos_token_id is not None else config.eos_token_id
        self.pad_token_id = (
            pad_token_id
            if pad_token_id is not None
            else (config.pad_token_id if config.pad_token_id is not None else self.eos_token_id)
        )
        self.tokenizer = tokenizer
        self.weights_on = True
        self.weight_version = 0
        self.seat = GroupSeat()  # the weight-update group this engine is in (the broadcast transport)
        self._buffers: dict | None = None  # kept across a level-2 sleep (see sleep)
        # The last call's prompts' keys and values (multi-turn: the next turn's prompts continue them); 0 keeps none.
        self.prompts = PromptCache(prompt_cache_bytes)

    # -- the engine interface ------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: Sampling, n: int = 1, seed: int = 0
    ) -> list[list[Completion]]:
        """`n` completions for each prompt (token ids), in prompt order."""
        if not self.weights_on:
            raise RuntimeError("the engine is asleep: wake_up(['weights']) before generate")
        if not prompts:
            return []
        out = self._sample(prompts, n, sampling, torch.Generator(device=self.device).manual_seed(seed))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def sleep(self, level: int = 1) -> None:
        """Level 1 keeps the weights on the CPU; level 2 drops them (the next update_weights refills them).

        With LoRA a sync brings only the adapters, so the base weights are kept (level 1) whatever the level.
        """
        self.prompts.clear()
        if level >= 2 and not self.lora:
            # Buffers (rotary frequencies) are not in the trainer's state dict: keep them to restore on wake.
            self._buffers = {n: b.detach().to("cpu", copy=True) for n, b in self.model.named_buffers()}
            self.model.to_empty(device="meta")
            self.weights_on = False
        elif self.device.type != "cpu":
            self.model.to("cpu")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back the weights (level 1) or re-allocate them empty (level 2, before update_weights)."""
        if tags is not None and "weights" not in tags:
            return  # the hf engine allocates its KV cache per call; there is nothing else to wake
        if not self.weights_on:
            self._materialize()
        else:
            self.model.to(self.device)

    def node_ip(self) -> str:
        """The address of the node this process runs on (as Ray sees it)."""
        import ray  # deferred: Ray, not needed by an engine served over HTTP (python -m rlc.runtime.inference.http)

        return ray.util.get_node_ip_address()

    def reset_prefix_cache(self) -> None:
        """Nothing to drop: the hf engine builds its KV cache per generate call and keeps no prefix cache."""

    def _materialize(self) -> None:
        """Fresh storage for dropped weights, with the saved buffers put back; weights are filled by update_weights."""
        if getattr(self, "_buffers", None) is None:
            return  # already materialized by an earlier wake_up
        self.model.to_empty(device=self.device)
        with torch.no_grad():
            for name, buf in self.model.named_buffers():
                if self._buffers is not None and name in self._buffers:
                    buf.copy_(self._buffers[name].to(self.device))
        self._buffers = None

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Load a full (unsharded) state dict from the trainer (tensors or `weights.payload.pack`ed), cast to the engine dtype."""
        state_dict = unpack(state_dict)
        buffers = {n for n, _ in self.model.named_buffers()}
        expected = list(self.model.state_dict())
        if self.lora:
            expected = adapter_names(expected)
        missing = [k for k in expected if k not in state_dict and k not in buffers]
        if missing:
            raise ValueError(f"weight sync is missing {len(missing)} tensors, e.g. {missing[:3]}")
        if not self.weights_on:
            self._materialize()
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                if name in state_dict:
                    tensor.copy_(state_dict[name].to(device=self.device, dtype=tensor.dtype))
        return self.finish_weight_update(version)

    @torch.no_grad()
    def update_weights_delta(self, update: dict, settings: dict, version: int | None = None) -> int:
        """Patch this engine's copy of the checkpoint to the version the trainer published (`weights.delta`) and
        load it; `settings` is the receiving half of the job's delta settings."""
        checkpoint = receiver(self.model_path, settings)
        checkpoint.fetch(update)
        if not self.weights_on:
            self._materialize()
        params = self.model.state_dict()
        loaded = dict(checkpoint.tensors())
        unknown = [name for name in loaded if name not in params and not name.startswith(MTP_HEADS)]
        if unknown:
            raise ValueError(
                f"the published checkpoint has {len(unknown)} tensors this engine lacks, e.g. {unknown[:3]}"
            )
        for name, tensor in loaded.items():  # a tied head the checkpoint leaves out shares its storage with another
            if name in params:
                params[name].copy_(tensor.to(device=self.device, dtype=params[name].dtype))
        return self.finish_weight_update(version)

    # -- weights over a broadcast group (weight_sync_backend gloo / nccl) --------------------------------

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        override_existing: bool = False,
    ) -> None:
        """Join the trainer's weight-sync group as `rank` (rank 0 is the trainer's first rank).

        An engine already in a group leaves it first with `override_existing`, and raises
        `WeightGroupExists` without.
        """
        self.seat.vacate(override_existing, self.close_weight_group)
        pin_gloo_interface()
        self.seat.join(master_address, master_port, rank, world_size, backend)

    @property
    def weight_group(self):
        """The weight-sync group this engine is in, or None."""
        return self.seat.group

    @property
    def weight_group_info(self) -> dict | None:
        """Where the group's master is (and this engine's rank, the size, the backend), for whoever asks to replace it."""
        return self.seat.info

    def close_weight_group(self) -> None:
        """Leave the weight-sync group, if any."""
        self.seat.leave()

    @torch.no_grad()
    def receive_weights(self, metas: list, version: int | None = None) -> int:
        """Receive the weights the trainer broadcasts (same names as its state dict) and load them."""
        if self.weight_group is None:
            raise RuntimeError("this engine is in no weight-sync group: init_weight_group first")
        if not self.weights_on:
            self._materialize()
        params = self.model.state_dict()
        unknown = [m.name for m in metas if m.name not in params and not m.name.startswith(MTP_HEADS)]
        if unknown:
            raise ValueError(f"weight sync sends {len(unknown)} tensors this engine lacks, e.g. {unknown[:3]}")
        receive_weights(
            self.weight_group,
            metas,
            group_device(self.weight_group),  # gloo: CPU, nccl: GPU
            lambda chunk: _copy_into(params, chunk),
        )
        return self.finish_weight_update(version)

    # -- weights through CUDA IPC (colocated on one GPU) -------------------------------------------------

    @torch.no_grad()
    def update_weights_ipc(self, handles_by_gpu_uuid: dict, entries: list) -> int:
        """CUDA only. Copy one bucket a trainer rank on this GPU shares (`weights.ipc.ipc_buckets`) into the
        model; returns the tensors loaded, once the copies are done (the sender may then free the bucket).

        `handles_by_gpu_uuid` maps each trainer GPU's `weights.ipc.gpu_uuid` to its bucket's `ipc_handle`;
        call `finish_weight_update` after the last bucket.
        """
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        if not self.weights_on:
            self._materialize()
        params = self.model.state_dict()
        bucket = open_bucket(handles_by_gpu_uuid, entries, index)
        unknown = [name for name, _ in bucket if name not in params and not name.startswith(MTP_HEADS)]
        if unknown:
            raise ValueError(f"weight sync sends {len(unknown)} tensors this engine lacks, e.g. {unknown[:3]}")
        _copy_into(params, bucket)
        torch.cuda.synchronize(index)
        del bucket  # with no view left, the sender may free the bucket once this returns
        return len(entries)

    def finish_weight_update(self, version: int | None = None) -> int:
        """End a sync: the weights are on and their version is `version` (or the next)."""
        self.prompts.clear()  # computed with the old weights
        self.weights_on = True
        self.weight_version = version if version is not None else self.weight_version + 1
        return self.weight_version

    # -- sampling --------------------------------------------------------------------------------------

    def _prefill(self, prompts: list[list[int]], n: int):
        """Run the prompts once, then give each of the n samples of a prompt its own copy of the KV cache.

        The samples of a group share their prompt, so the prompt pass costs 1/n of running every row. A prompt that
        continues one of the last call's prompts (a trajectory's next turn) runs only its new tokens.
        """
        # A continued prompt's cached tokens were routed in an earlier call: with routes captured, prompts run whole.
        continuing = n == 1 and self.prompts.entries and self.routes is None
        found = [self.prompts.lookup(p) for p in prompts] if continuing else []
        if any(f is not None for f in found):
            return self._prefill_continuing(prompts, found)
        return self._prefill_whole(prompts, n)

    def _prefill_whole(self, prompts: list[list[int]], n: int):
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)

        shared = n > 1 and hasattr(DynamicCache, "batch_repeat_interleave")
        if n > 1 and not shared:
            ids, mask, positions = (t.repeat_interleave(n, dim=0) for t in (ids, mask, positions))
        # Prompts of one length have no padding: every step then attends to the whole cache, and the model needs
        # no mask (building one per decode step is a good part of a small model's decode time).
        if bool(mask.all()):
            mask = None
        # Only the last position's logits are used: the output projection of the other prompt positions (a vocabulary
        # of 50k makes it a good part of the prompt pass) is left out where the model can.
        last = {"logits_to_keep": 1} if accepts(self.model, "logits_to_keep") else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **last)
        cache, logits = returned_cache(out), out.logits[:, -1, :].float()
        self.prompts.store(prompts, cache, mask)
        if shared:
            cache.batch_repeat_interleave(n)
            logits, positions = (t.repeat_interleave(n, dim=0) for t in (logits, positions))
            if mask is not None:
                mask = mask.repeat_interleave(n, dim=0)
        return cache, logits, mask, positions[:, -1] + 1

    def _prefill_continuing(self, prompts: list[list[int]], found: list):
        """The prompt pass when some prompts continue cached ones: each row's cached keys and values (left-padded
        to the longest), then its new tokens (left-padded too) run against them; rows without a cached prefix run
        whole. Positions follow each row's real tokens, so the result is the whole prompt's pass."""
        some = next(f for f in found if f is not None)  # per layer (keys, values), each (kv_heads, length, dim)
        cached = [f[0][0].shape[1] if f is not None else 0 for f in found]
        old, new = max(cached), max(len(p) - c for p, c in zip(prompts, cached))
        heads, _, dim = some[0][0].shape
        shape, dtype = (len(prompts), heads, old, dim), some[0][0].dtype
        past = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in some
        ]
        mask = torch.zeros((len(prompts), old + new), dtype=torch.long)
        ids = torch.full((len(prompts), new), self.pad_token_id, dtype=torch.long)
        for b, (p, c, f) in enumerate(zip(prompts, cached, found)):
            if f is not None:
                for (k, v), (pk, pv) in zip(f, past):
                    pk[b, :, old - c :] = k
                    pv[b, :, old - c :] = v
            mask[b, old - c : old] = 1
            suffix = p[c:]
            ids[b, new - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[b, old + new - len(suffix) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = ((mask.cumsum(-1) - 1).clamp(min=0))[:, old:]
        last = {"logits_to_keep": 1} if accepts(self.model, "logits_to_keep") else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_keyword(self.model): DynamicCache(ddp_cache_data=past, config=self.model.config)},
            **last,
        )
        cache, logits = returned_cache(out), out.logits[:, -1, :].float()
        self.prompts.store(prompts, cache, mask)
        return cache, logits, mask, positions[:, -1] + 1

    def _sample(self, prompts: list[list[int]], n: int, s: Sampling, gen: torch.Generator) -> list[Completion]:
        """Sample every row until EOS, a stop string or max_generate_length.

        Finished rows stay in the batch (and the KV cache) until an eighth of it has finished, then leave it
        together: moving the cache is a copy of all of it, while a finished row's decode steps only cost
        arithmetic whose result is thrown away.
        """
        dev = self.device
        if self.routes is not None:
            self.routes.clear()
        cache, logits, mask, next_pos = self._prefill(prompts, n)
        batch, steps = logits.shape[0], s.max_generate_length
        prompt_routes = self._prompt_routes(prompts, n) if self.routes is not None else None
        # routes of each generated token but the last, written as each is fed back (the last never is)
        decoded = (
            torch.zeros((batch, max(steps - 1, 0), *prompt_routes.shape[2:]), dtype=prompt_routes.dtype, device=dev)
            if prompt_routes is not None
            else None
        )
        # Decode steps on the model's modules directly where the architecture allows (decode.py); the prompt pass
        # above is the model's own forward either way.
        lean = LeanDecoder(self.model, cache, mask, steps) if self.lean_decode and steps > 1 else None
        vocab = self.model.config.vocab_size
        rows = [p for p in prompts for _ in range(n)]
        seen = None
        if s.repetition_penalty != 1.0:
            seen = torch.zeros((batch, vocab), dtype=torch.bool, device=dev)
            for i, r in enumerate(rows):
                seen[i, torch.tensor([t for t in r if t < vocab], dtype=torch.long)] = True
        filtered = 0 < s.top_k < vocab or s.top_p < 1.0 or s.min_p > 0.0 or seen is not None
        tokens = torch.full((batch, max(steps, 1)), self.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros((batch, max(steps, 1)), dtype=torch.float32, device=dev)
        lengths = torch.zeros(batch, dtype=torch.long, device=dev)
        stopped = torch.zeros(batch, dtype=torch.bool, device=dev)
        live = torch.arange(batch, device=dev)  # full-batch index of each row in the decode batch
        going = torch.ones(batch, dtype=torch.bool, device=dev)  # which of those rows are still decoding
        for step in range(steps):
            if s.temperature > 0:
                scaled = logits / s.temperature if s.temperature != 1.0 else logits
                logprob_all = torch.log_softmax(scaled, dim=-1)
                if filtered:
                    if seen is not None:
                        scaled = _penalize_repeats(scaled, seen, s.repetition_penalty)
                    probs = torch.softmax(_filter_logits(scaled, s), dim=-1)
                else:
                    probs = logprob_all.exp()
                picked = _draw(probs, gen)
            else:
                logprob_all = torch.log_softmax(logits, dim=-1)
                picked = (_penalize_repeats(logits, seen, s.repetition_penalty) if seen is not None else logits).argmax(
                    dim=-1
                )
            # A row that finished earlier writes past its length here (cut off below): its tokens no longer count.
            tokens[live, step] = picked
            logps[live, step] = logprob_all.gather(-1, picked[:, None]).squeeze(-1)
            lengths[live] += going
            ends = going & (picked == self.eos_token_id)
            if s.stop:
                for j in torch.nonzero(going & ~ends).flatten().tolist():
                    row = int(live[j])
                    ends[j] = self._hits_stop(tokens[row, : step + 1].tolist(), s.stop)
            stopped[live[ends]] = True
            going = going & ~ends
            done = len(live) - int(going.sum())
            if step == steps - 1 or done == len(live):
                break
            if done * 8 >= len(live):
                keep = torch.nonzero(going).flatten()
                if lean is not None:
                    lean.select(keep)
                else:
                    cache.batch_select_indices(keep)
                live, going, picked, next_pos = live[keep], going[keep], picked[keep], next_pos[keep]
                if mask is not None:
                    mask = mask[keep]
                if seen is not None:
                    seen = seen[keep]
            if seen is not None:
                seen[torch.arange(len(live), device=dev), picked] = True
            if lean is not None:
                logits = lean.step(picked, next_pos, step)
            else:
                if mask is not None:
                    mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=dev)], dim=1)
                out = self.model(
                    input_ids=picked[:, None],
                    attention_mask=mask,
                    position_ids=next_pos[:, None],
                    use_cache=True,
                    **{cache_keyword(self.model): cache},
                )
                cache, logits = returned_cache(out), out.logits[:, -1, :].float()
                if decoded is not None and self.routes is not None:
                    decoded[live, step] = self.routes.take(len(live), 1)[:, 0]
            next_pos = next_pos + 1
        token_lists, logp_lists = tokens.cpu().tolist(), logps.cpu().tolist()
        counts, ended = lengths.cpu().tolist(), stopped.cpu().tolist()
        return [
            Completion(
                token_lists[i][: counts[i]],
                logp_lists[i][: counts[i]] if s.logprobs else None,
                "stop" if ended[i] else "length",
                routed_experts=_row_routes(prompt_routes, decoded, i, len(rows[i]), counts[i])
                if prompt_routes is not None and decoded is not None
                else None,
            )
            for i in range(batch)
        ]

    def _prompt_routes(self, prompts: list[list[int]], n: int) -> torch.Tensor:
        """The prompt pass's routes, one row per sample: (rows x n, width, layers, k) over the left-padded prompts."""
        assert self.routes is not None
        routes = self.routes.take(-1, max(len(p) for p in prompts))
        return routes.repeat_interleave(n, dim=0) if routes.shape[0] != len(prompts) * n else routes

    def _hits_stop(self, token_ids: list[int], stop: Sequence[str]) -> bool:
        if self.tokenizer is None:
            raise RuntimeError("stop strings need the engine's tokenizer")
        text = self.tokenizer.decode(token_ids[-16:], skip_special_tokens=True)
        return any(s in text for s in stop)


def _row_routes(prompt_routes: torch.Tensor, decoded: torch.Tensor, i: int, prompt: int, count: int) -> torch.Tensor:
    """Row i's routes (prompt + count - 1 tokens, layers, k): its prompt's real tokens, then the generated ones fed
    back."""
    width = prompt_routes.shape[1]
    return torch.cat([prompt_routes[i, width - prompt :], decoded[i, : max(count - 1, 0)]]).cpu()


class PromptCache:
    """Keys and values of the last call's prompts, each prompt's own positions (no padding), up to `budget` bytes.

    A multi-turn trajectory's next prompt is its last prompt, the sampled turn and the environment's answer, so
    the engine runs only the turn and the answer again. Kept for one call (the next one replaces it) and dropped
    when the weights change or the engine sleeps.
    """

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.lengths: list[int] = []  # of the entries, longest first

    def clear(self) -> None:
        self.entries, self.lengths = {}, []

    def lookup(self, prompt: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The longest cached prompt that `prompt` continues (with at least one token more), per layer (keys,
        values) of shape (kv_heads, length, head_dim)."""
        for length in self.lengths:
            if length < len(prompt):
                hit = self.entries.get(tuple(prompt[:length]))
                if hit is not None:
                    return hit
        return None

    def store(self, prompts: list[list[int]], cache, mask: torch.Tensor | None) -> None:
        self.clear()
        if self.budget <= 0:
            return
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        keys = layers[0][0]
        per_token = 2 * len(layers) * keys.shape[1] * keys.shape[3] * keys.element_size()
        if sum(len(p) for p in prompts) * per_token > self.budget:
            return
        width = keys.shape[2]
        for b, p in enumerate(prompts):
            where = (
                torch.nonzero(mask[b, -width:]).flatten()
                if mask is not None
                else torch.arange(width - len(p), width, device=keys.device)
            )
            self.entries[tuple(p)] = [(k[b][:, where].clone(), v[b][:, where].clone()) for k, v in layers]
        self.lengths = sorted({len(p) for p in prompts}, reverse=True)


def _copy_into(params: dict[str, torch.Tensor], named_tensors) -> None:
    for name, tensor in named_tensors:
        if name.startswith(MTP_HEADS):
            continue  # trained MTP heads (trainer.mtp) draft for vLLM; the hf engine drafts nothing
        params[name].copy_(tensor)


MTP_HEADS = "model.mtp_layers."  # MiMo's MTP heads' weights (runtime/workers/megatron_mtp.py)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
