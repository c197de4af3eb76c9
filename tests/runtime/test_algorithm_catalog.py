"""The catalog of built-in algorithms (rlc.core.algorithms): every card's function resolves and takes its calling
convention, every id is a value the spec accepts, and the properties the compiler reasons with are what the
functions do."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from rlc.compiler.rules.upstream import UNSUPPORTED  # noqa: E402
from rlc.core import algorithms  # noqa: E402
from rlc.runtime.algorithms import registry  # noqa: E402
from rlc.spec import algorithm as spec  # noqa: E402

F64 = torch.float64


def t(values):
    return torch.tensor(values, dtype=F64)


def test_ids_are_unique_and_are_the_values_the_spec_accepts():
    for cards, field in (
        (algorithms.POLICY_LOSSES, "policy_loss_type"),
        (algorithms.ADVANTAGE_ESTIMATORS, "advantage_estimator"),
        (algorithms.KL_ESTIMATORS, "kl_estimator_type"),
        (algorithms.LOSS_REDUCTIONS, "loss_reduction"),
    ):
        ids = [card.id for card in cards]
        assert len(set(ids)) == len(ids)
        enum = tuple(spec.AlgorithmConfig.__dataclass_fields__[field].metadata["enum"])
        assert enum[: len(ids)] == tuple(ids)  # an installed extension's values come after
        assert getattr(spec.AlgorithmConfig(), field) in ids  # the default has a card


def test_a_loss_without_a_function_is_one_the_compiler_refuses():
    refused = {v for g in UNSUPPORTED for k, v in g.refused_values if k == "trainer.algorithm.policy_loss_type"}
    assert {card.id for card in algorithms.POLICY_LOSSES if card.function is None} == refused


def test_every_function_resolves_and_takes_its_calling_convention():
    def takes(fn, *names):
        params = inspect.signature(fn).parameters
        assert list(params)[: len(names)] == list(names), fn

    for card in algorithms.POLICY_LOSSES:
        if card.function:
            fn = registry.resolve(card.function)
            takes(fn, "log_probs", "old_log_probs", "advantages", "mask")
            keywords = {p for p, v in inspect.signature(fn).parameters.items() if v.kind is v.KEYWORD_ONLY}
            options = {path.rpartition(".")[2] for path in card.options}
            assert options <= keywords, card.id
            assert ("rollout_log_probs" in keywords) == card.rollout_anchored, card.id
            assert registry.get_policy_loss(card.id) is fn
    for card in algorithms.ADVANTAGE_ESTIMATORS:
        fn = registry.resolve(card.function)
        takes(fn, "rewards", "mask", "index", "values", "algorithm")
        assert registry.get_advantage_estimator(card.id) is fn
    for card in algorithms.KL_ESTIMATORS:
        takes(registry.resolve(card.function), "log_probs", "ref_log_probs")
    for card in algorithms.LOSS_REDUCTIONS:
        if card.over_mini_batch:  # the driver's, over the whole mini-batch's rows
            takes(registry.resolve(card.function), "mask", "group", "micro_batch_size", "max_seq_len")
        else:
            takes(registry.resolve(card.function), "mask", "total_tokens", "total_sequences", "max_seq_len")


def test_every_loss_reads_its_options_from_the_spec():
    a = spec.AlgorithmConfig()
    for card in algorithms.POLICY_LOSSES:
        if card.function:
            options = registry.get_policy_loss_options(card.id, a)
            assert set(options) == {path.rpartition(".")[2] for path in card.options}


def _loss(card, log_probs, advantages):
    options = registry.get_policy_loss_options(card.id, spec.AlgorithmConfig())
    options = {k: 0.1 if v is None and k == "beta" else v for k, v in options.items()}  # dro.beta has no default
    if card.rollout_anchored:
        options["rollout_log_probs"] = log_probs.detach()
    mask = torch.ones_like(log_probs)
    return registry.get_policy_loss(card.id)(log_probs, log_probs.detach(), advantages, mask, **options)[0]


def test_an_advantage_weighted_loss_gives_a_row_of_zero_advantages_no_loss_and_no_gradient():
    for card in algorithms.POLICY_LOSSES:
        if card.function:
            log_probs = t([[-0.5, -1.0], [-0.7, -0.2]]).requires_grad_(True)
            token_loss = _loss(card, log_probs, t([[0.0, 0.0], [1.0, -1.0]]))
            token_loss.sum().backward()
            silent = bool((token_loss[0] == 0).all() and (log_probs.grad[0] == 0).all())
            if card.advantage_weighted:
                assert silent, card.id
            elif card.id == "cross_entropy":  # reads no advantage: every row is imitated
                assert not silent


def test_a_group_baseline_estimator_gives_a_group_of_equal_rewards_zero_advantages():
    a = spec.AlgorithmConfig()
    mask = torch.ones(4, 2, dtype=F64)
    mask[3, 0] = 0  # the other group's tokens do not average to 0: whitening over the batch moves the equal group
    # What the estimators that read more than the rewards get (each only what its card lists)
    inputs = {
        "reward_baselines": torch.zeros(4, dtype=F64),
        "old_logprobs": torch.full((4, 2), 0.5, dtype=F64).log(),
        "sum_pi_squared": torch.full((4, 2), 0.5, dtype=F64),
        "is_weight": None,
    }
    for card in algorithms.ADVANTAGE_ESTIMATORS:
        if card.needs_critic:
            continue
        advantages, _ = registry.resolve(card.function)(
            t([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]),
            mask,
            index=[0, 0, 1, 1],
            values=None,
            algorithm=a,
            **{name: inputs[name] for name in card.inputs},
        )
        assert bool((advantages[:2] == 0).all()) == card.group_baseline, card.id


def test_a_critic_estimator_refuses_to_run_without_values():
    for card in algorithms.ADVANTAGE_ESTIMATORS:
        if card.needs_critic:
            with pytest.raises(ValueError, match="critic"):
                registry.resolve(card.function)(
                    t([1.0]), torch.ones(1, 1), index=[0], values=None, algorithm=spec.AlgorithmConfig()
                )


def test_a_reduction_needing_max_seq_len_refuses_to_run_without_it():
    for card in algorithms.LOSS_REDUCTIONS:
        weights = registry.resolve(card.function)
        mask = torch.ones(1, 2)
        if card.over_mini_batch:  # weights over one row of one prompt: the token mean
            one = weights(mask, torch.zeros(1, dtype=torch.long), micro_batch_size=1, max_seq_len=None)
            assert one.sum() == pytest.approx(1.0)
        elif card.needs_max_seq_len:
            with pytest.raises(ValueError, match="max_seq_len"):
                weights(mask, total_tokens=2, total_sequences=1, max_seq_len=None)
        else:
            assert weights(mask, total_tokens=2, total_sequences=1, max_seq_len=None).sum() == pytest.approx(1.0)


def test_an_extensions_value_gets_the_defaults_card():
    assert algorithms.policy_loss("my_loss") == algorithms.PolicyLoss("my_loss", None, "an extension's policy loss")
    assert not algorithms.policy_loss("my_loss").advantage_weighted  # its rows are never left out
    assert algorithms.advantage_estimator("my_adv").per_trajectory
    assert not algorithms.advantage_estimator("my_adv").group_baseline


def test_docs_algorithms_lists_every_estimator_and_loss_with_its_source():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    text = text.partition("\n## Off-policy correction")[0]  # the tables of estimators and losses come first
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")}
    cards = (*algorithms.ADVANTAGE_ESTIMATORS, *algorithms.POLICY_LOSSES, *algorithms.LOSS_REDUCTIONS)
    assert rows == {card.id for card in cards}
