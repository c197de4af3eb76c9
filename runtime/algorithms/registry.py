"""Policy losses, advantage estimators and KL estimators by their spec name, built-in or from an extension.

A name is looked up in rlc's built-ins (the catalog's cards, rlc.core.algorithms, each naming its function as
"module:function"), then among functions registered in this process, then in the installed entry points of the
groups below (entry-point name = spec value, object = function).
An extension package makes a new value usable in two parts, the spec value and the function::

    [project.entry-points."rlc.extensions"]
    my_pkg = "my_pkg.rlc_ext:register"  # ext.add_values("trainer.algorithm.policy_loss_type", ["my_loss"])

    [project.entry-points."rlc.policy_losses"]
    my_loss = "my_pkg.losses:my_loss"

Calling conventions (tensors are (batch, response_len); see losses.py and advantages.py):

* policy loss: ``fn(log_probs, old_log_probs, advantages, mask, **options) -> (token_loss, metrics)``,
  token_loss per token (zero outside `mask`), metrics detached 0-d tensors that are masked token
  means. ``options`` come from ``get_policy_loss_options``: a built-in's card's options; for a custom loss, its options callable
  ``(algorithm) -> dict`` (``register_policy_loss(options=...)``, or an ``rlc_options`` attribute
  on an entry-point function), else eps_clip_low, eps_clip_high and clip_ratio_c.
* advantage estimator: ``fn(rewards, mask, *, index, values, algorithm) -> (advantages, returns)``:
  rewards (batch,) or (batch, response_len); index the prompt key of each sample (group of
  GRPO/RLOO); values the critic's (None without a critic); algorithm the trainer.algorithm config.
  A built-in whose card lists `inputs` (remax's greedy `reward_baselines`, the optimal token baselines'
  `old_logprobs`, `sum_pi_squared`, `is_weight`) gets those batch fields as keywords too.
  Both results are (batch, response_len), zero outside the mask, with no gradient.

Registration is per process: a Ray worker runs in its own process and sees only entry points and
what code it imports registers.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

import torch
from rlc.core import algorithms

POLICY_LOSS_GROUP = "rlc.policy_losses"
ADVANTAGE_ESTIMATOR_GROUP = "rlc.advantage_estimators"

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
LossOptions = Callable[[Any], dict[str, Any]]
AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# The built-ins a name is looked up in first: the cards with a function (an extension's has none).
BUILTIN_POLICY_LOSSES = {card.id: card for card in algorithms.POLICY_LOSSES if card.function}
BUILTIN_ADVANTAGE_ESTIMATORS = algorithms.ESTIMATORS


class UnknownNameError(KeyError):
    """A policy loss or advantage estimator that neither rlc nor an installed extension provides."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@functools.cache
def resolve(path: str) -> Callable:
    """The function a card names, "module:function": cards are strings, so that core never imports torch."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def functions(cards: Iterable) -> dict[str, Callable]:
    """Each card's function by the card's id, the cards without one left out."""
    return {card.id: resolve(card.function) for card in cards if card.function}


def policy_loss_options(name: str, algorithm: Any) -> dict[str, Any]:
    """Keyword options of built-in policy loss `name`, read from a trainer.algorithm config by its card."""
    if name not in BUILTIN_POLICY_LOSSES:
        raise KeyError(f"{name!r} is not a built-in policy loss; built-ins: {', '.join(BUILTIN_POLICY_LOSSES)}")
    return {
        path.rpartition(".")[2]: functools.reduce(getattr, path.split("."), algorithm)
        for path in BUILTIN_POLICY_LOSSES[name].options
    }


def get_kl_estimator(name: str) -> KLEstimator:
    """The per-token KL estimator for spec value `name` (KeyError for a name without a card)."""
    return resolve(algorithms.KLS[name].function)


_losses: dict[str, tuple[PolicyLoss, LossOptions | None]] = {}
_estimators: dict[str, AdvantageEstimator] = {}


def register_policy_loss(name: str, fn: PolicyLoss, options: LossOptions | None = None) -> PolicyLoss:
    """Make `fn` the policy loss `name` in this process; `options(algorithm)` gives its keyword options.

    Registering a name again replaces it; a built-in name cannot be replaced.
    """
    _check_new("policy loss", name, BUILTIN_POLICY_LOSSES, fn)
    if options is not None and not callable(options):
        raise TypeError(f"options for policy loss {name!r} must be a callable (algorithm) -> dict")
    _losses[name] = (fn, options)
    return fn


def register_advantage_estimator(name: str, fn: AdvantageEstimator) -> AdvantageEstimator:
    """Make `fn` the advantage estimator `name` in this process (same rules as register_policy_loss)."""
    _check_new("advantage estimator", name, BUILTIN_ADVANTAGE_ESTIMATORS, fn)
    _estimators[name] = fn
    return fn


def get_policy_loss(name: str) -> PolicyLoss:
    """The per-token policy loss for spec value `name`."""
    if name in BUILTIN_POLICY_LOSSES:
        return resolve(BUILTIN_POLICY_LOSSES[name].function)
    if name not in _losses:
        fn = _load(
            "policy loss",
            POLICY_LOSS_GROUP,
            "trainer.algorithm.policy_loss_type",
            name,
            [*BUILTIN_POLICY_LOSSES, *_losses],
        )
        _losses[name] = (fn, getattr(fn, "rlc_options", None))
    return _losses[name][0]


def get_policy_loss_options(name: str, algorithm: Any) -> dict[str, Any]:
    """Keyword options for policy loss `name`, read from the trainer.algorithm config."""
    if name in BUILTIN_POLICY_LOSSES:
        return policy_loss_options(name, algorithm)
    get_policy_loss(name)
    options = _losses[name][1]
    return dict(options(algorithm)) if options is not None else policy_loss_options("regular", algorithm)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The advantage estimator for spec value `name`, in the common calling convention."""
    if name in BUILTIN_ADVANTAGE_ESTIMATORS:
        return resolve(BUILTIN_ADVANTAGE_ESTIMATORS[name].function)
    if name not in _estimators:
        _estimators[name] = _load(
            "advantage estimator",
            ADVANTAGE_ESTIMATOR_GROUP,
            "trainer.algorithm.advantage_estimator",
            name,
            [*BUILTIN_ADVANTAGE_ESTIMATORS, *_estimators],
        )
    return _estimators[name]


def _check_new(kind: str, name: str, builtins: dict, fn: Callable) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} name must be a non-empty string, got {name!r}")
    if name in builtins:
        raise ValueError(f"{name!r} is a built-in {kind}; register the function under another name")
    if not callable(fn):
        raise TypeError(f"{kind} {name!r} must be a function, got {fn!r}")


def _load(kind: str, group: str, field: str, name: str, known: list[str]) -> Callable:
    """The function of entry point `name` in `group`, or UnknownNameError listing what is known."""
    found = {ep.value: ep for ep in entry_points(group=group, name=name)}
    if len(found) > 1:
        raise ValueError(f"{kind} {name!r} is declared by several {group} entry points: {', '.join(sorted(found))}")
    if found:
        fn = next(iter(found.values())).load()
        if not callable(fn):
            raise TypeError(f"entry point {name!r} in {group} is {fn!r}, not a function")
        return fn
    known = sorted({*known, *(ep.name for ep in entry_points(group=group))})
    raise UnknownNameError(
        f"unknown {kind} {name!r}; known: {', '.join(known)}. An extension adds one by declaring the value "
        f'in its rlc.extensions hook (ext.add_values("{field}", ["{name}"])) and providing the function '
        f'under the entry-point group "{group}" ({name} = "my_pkg.module:function").'
    )
