"""Who holds the GPU when: the colocation state machine (colocate_all), as pure bookkeeping.

With colocate_all the policy, ref and critic ranks and the inference engines share the same GPUs, so
at any moment only what the current phase needs may sit there. `Colocation` knows where every role's
model and optimizer state are and whether the engines are awake, and returns, per phase, the ordered
actions that get there (in the order of SkyRL's `_ensure_on_gpu` and its weight sync):

- generate: engines awake (weights and KV cache), every trainer role on the CPU;
- after generate: engines reset their prefix cache and sleep (level 2: weights and KV dropped);
- a forward pass of a role: every other role off the GPU first, then that role's model on it;
- training a role: the same, with its optimizer state too;
- weight sync: the policy's optimizer off, engines wake their weights, the weights are sent, the policy
  model off, then the engines wake their KV cache and reset the prefix cache.

Without colocation nothing moves: each role keeps its own GPUs, and a sync only resets the prefix cache
(the engines' KV was computed with the old weights). Engines that keep no prefix cache (hf) get no reset. The driver carries the actions out; the order is
what this module decides and what its tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Action:
    target: str  # a role name, or "engines"
    op: str  # offload | backload | sleep | wake_up | reset_prefix_cache | send_weights
    model: bool = False
    optimizer: bool = False
    tags: tuple[str, ...] = ()

    def __str__(self) -> str:
        what = [w for w, on in (("model", self.model), ("optimizer", self.optimizer)) if on] + list(self.tags)
        return f"{self.target}.{self.op}({', '.join(what)})"


@dataclass
class _Place:
    model: bool  # on the GPU
    optimizer: bool


@dataclass
class Colocation:
    """Residency of every role and of the engines; methods return the actions for the next phase.

    `roles` maps each trainer role to whether it has an optimizer (ref has none). `offload_after_step`
    (the optimizer config's) lets a trained role keep its optimizer state on the GPU between steps when
    false, as SkyRL does. `prefix_cache` says whether the engines keep a prefix cache to reset (the hf engine
    keeps none, so no action is spent on it).
    """

    roles: dict[str, bool]
    colocated: bool = True
    offload_after_step: dict[str, bool] = field(default_factory=dict)
    prefix_cache: bool = True
    places: dict[str, _Place] = field(init=False)
    engines_awake: bool = field(init=False, default=True)

    def __post_init__(self):
        # Engines are built first and the trainers offloaded right after they are built (vLLM profiles free
        # GPU memory when it starts), so every role starts on the CPU.
        self.places = {role: _Place(False, False) for role in self.roles}

    # -- phases ---------------------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """Right after the trainers are built (on the GPUs): every role's state off them."""
        if not self.colocated:
            return []
        actions = [
            Action(role, "offload", model=True, optimizer=has_optimizer) for role, has_optimizer in self.roles.items()
        ]
        self.places = {role: _Place(False, False) for role in self.roles}
        return actions

    def before_generate(self) -> list[Action]:
        if not self.colocated:
            return []
        if not self.engines_awake:
            # Level-2 sleep dropped the weights: only a weight sync brings the engines back.
            raise RuntimeError("the engines sleep without weights: sync the policy's weights before generating")
        return self._evict(keep=None)

    def after_generate(self) -> list[Action]:
        if not self.colocated or not self.engines_awake:
            return []
        self.engines_awake = False
        # A prefix cache that outlives sleep serves KV of freed memory (vLLM issue #17103).
        return self._reset_prefix_cache() + [Action("engines", "sleep")]

    def before_forward(self, role: str) -> list[Action]:
        return self._ensure(role, model=True, optimizer=False)

    def before_train(self, role: str) -> list[Action]:
        return self._ensure(role, model=True, optimizer=self.roles[role])

    def after_train(self, role: str) -> list[Action]:
        """A trained role's optimizer leaves the GPU when offload_after_step says so."""
        place = self.places[role]
        if not self.colocated or not place.optimizer or not self.offload_after_step.get(role, True):
            return []
        place.optimizer = False
        return [Action(role, "offload", optimizer=True)]

    def sync_weights(self) -> list[Action]:
        """The policy's weights into the engines, with at most one copy of the weights on each side."""
        if not self.colocated:
            return [Action("policy", "send_weights")] + self._reset_prefix_cache()
        actions = self._evict(keep="policy")
        policy = self.places["policy"]
        if policy.optimizer:
            actions.append(Action("policy", "offload", optimizer=True))
            policy.optimizer = False
        if not policy.model:
            actions.append(Action("policy", "backload", model=True))
            policy.model = True
        actions += [
            Action("engines", "wake_up", tags=("weights",)),
            Action("policy", "send_weights"),
            Action("policy", "offload", model=True),
            Action("engines", "wake_up", tags=("kv_cache",)),
        ]
        actions += self._reset_prefix_cache()
        policy.model = False
        self.engines_awake = True
        return actions

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _reset_prefix_cache(self) -> list[Action]:
        return [Action("engines", "reset_prefix_cache")] if self.prefix_cache else []

    def _ensure(self, role: str, *, model: bool, optimizer: bool) -> list[Action]:
        if role not in self.places:
            raise KeyError(f"unknown role {role!r}; roles are {', '.join(self.places)}")
        if not self.colocated:
            return []
        if self.engines_awake:
            raise RuntimeError(f"the engines are awake: put them to sleep (after_generate) before {role} uses the GPUs")
        actions = self._evict(keep=role)
        place = self.places[role]
        need_model, need_optimizer = model and not place.model, optimizer and not place.optimizer
        if need_model or need_optimizer:
            actions.append(Action(role, "backload", model=need_model, optimizer=need_optimizer))
            place.model |= need_model
            place.optimizer |= need_optimizer
        return actions

    def _evict(self, keep: str | None) -> list[Action]:
        """Offload every role but `keep` that still holds something on the GPU."""
        actions = []
        for role, place in self.places.items():
            if role != keep and (place.model or place.optimizer):
                actions.append(Action(role, "offload", model=place.model, optimizer=place.optimizer))
                place.model = place.optimizer = False
        return actions
