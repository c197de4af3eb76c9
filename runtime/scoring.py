"""Scoring a step's rollouts: the batch the updates train on (masks and filters, values, reference and old log-probs,
off-policy weights, rewards with the KL penalty when asked, advantages), and the step's rollout metrics."""

from __future__ import annotations

from collections.abc import Callable

import torch
from rlc.core import algorithms
from rlc.core.job import ScoringSettings
from rlc.runtime.algorithms.advantages import batch_normalize, broadcast_to_steps
from rlc.runtime.algorithms.filtering import zero_variance_groups
from rlc.runtime.algorithms.kl import KLController, kl_penalized_rewards, token_kl
from rlc.runtime.algorithms.off_policy import off_policy_correction, options_from_config
from rlc.runtime.algorithms.pf_ppo import pf_ppo_rows
from rlc.runtime.algorithms.registry import get_advantage_estimator
from rlc.runtime.batch import Rollout, TrainBatch, to_batch
from rlc.runtime.generator import rollout_metrics
from rlc.runtime.run_error import RunError
from rlc.spec.algorithm import AlgorithmConfig

# (role, batch, **options) -> the role's per-token outputs of the batch; with sum_pi_squared=True the policy's are
# (rows, response_len, 2): log-probs, then the sums of squared probabilities.
Forward = Callable[..., torch.Tensor]


class Scoring:
    """A step's scored batch and rollout metrics, as `settings` says; the estimators and the off-policy correction
    take `algorithm` (trainer.algorithm) whole. `forward` runs a role's forward pass over a batch; `roles` are the
    roles the job runs. `kl` is the KL-in-reward coefficient's controller, which checkpoints keep."""

    def __init__(
        self,
        settings: ScoringSettings,
        algorithm: AlgorithmConfig,
        pad_token_id: int,
        roles: set[str],
        forward: Forward,
    ) -> None:
        self.settings, self.algorithm, self.pad_token_id = settings, algorithm, pad_token_id
        self.roles, self.forward = roles, forward
        self.kl = KLController.from_decision(settings.kl)

    def batch(self, rollouts: list[Rollout], metrics: dict, seed: int = 0) -> TrainBatch:
        """The batch with what the updates need: masks, values, reference and old log-probs, off-policy weights,
        rewards (KL-penalized when asked) and advantages; PF-PPO then draws its rows again, seeded by `seed`."""
        s = self.settings
        batch = to_batch(rollouts, self.pad_token_id, mask_truncated=s.apply_overlong_filtering)
        if s.zero_reward_on_non_stop:
            metrics["zeroed_non_stop_fraction"] = sum(r.zeroed for r in rollouts) / len(rollouts)
        if s.apply_overlong_filtering:
            metrics["overlong_filtered_fraction"] = sum(r.finish_reason != "stop" for r in rollouts) / len(rollouts)
        if s.zero_variance_filter:
            flat = zero_variance_groups(
                torch.tensor(outcomes(rollouts)),
                batch.group,
                mask=batch.loss_mask,
                tol=s.zero_variance_filter_tol,
            )
            batch.loss_mask = batch.loss_mask * (~flat).float()[:, None]
            metrics["zero_variance_fraction"] = float(flat.float().mean())
        mask = batch.loss_mask
        if "critic" in self.roles:
            batch.old_values = self.forward("critic", batch)
        if "ref" in self.roles:
            batch.ref_logprobs = self.forward("ref", batch)
        if s.fully_async:  # generated ahead with older weights: the engine's log-probs anchor the importance ratio
            batch.old_logprobs = batch.rollout_logprobs.clone()
        elif s.old_logprob_pass and s.sum_pi_squared:  # the optimal token baselines read both
            batch.old_logprobs, batch.sum_pi_squared = self.forward("policy", batch, sum_pi_squared=True).unbind(-1)
        elif s.old_logprob_pass:  # else the current policy's, which the update starts from (decide.old_logprob_pass)
            batch.old_logprobs = self.forward("policy", batch)
        if s.off_policy_correction:
            assert batch.old_logprobs is not None  # a correction always has them (decide.old_logprob_pass)
            weight, mask, corrected = off_policy_correction(
                batch.old_logprobs,
                batch.rollout_logprobs,
                mask,
                **options_from_config(self.algorithm.off_policy_correction),
            )
            batch.is_weight, batch.loss_mask = weight, mask
            metrics.update({f"off_policy/{k}": float(v) for k, v in corrected.items()})
        rewards = batch.token_rewards
        if s.kl_in_reward and batch.ref_logprobs is not None and batch.old_logprobs is not None:
            kl = token_kl(batch.old_logprobs, batch.ref_logprobs, mask, s.kl_estimator)
            rewards = kl_penalized_rewards(rewards, kl, self.kl.value)
            mean_kl = float((kl.sum(-1) / mask.sum(-1).clamp(min=1)).mean())
            metrics["kl_in_reward"], metrics["kl_coef"] = mean_kl, self.kl.value
            self.kl.update(mean_kl, len(rollouts))
        last_step = torch.tensor([r.last_step for r in rollouts]) if s.step_wise else None
        components = self.components(rollouts, batch, rewards) if self.algorithm.gdpo_reward_keys else None
        batch.advantages, batch.returns = self.advantages(rewards, mask, batch, last_step, components)
        if s.pf_ppo is not None:  # as verl, on the scored batch: the rows' advantages were taken before the draw
            rows = pf_ppo_rows(
                batch.token_rewards.sum(-1), s.pf_ppo, s.pf_ppo_weight_pow, torch.Generator().manual_seed(seed)
            )
            metrics["pf_ppo/distinct_rows_fraction"] = len(set(rows.tolist())) / max(batch.rows, 1)
            batch = batch.select(rows)
        return batch

    def components(self, rollouts: list[Rollout], batch: TrainBatch, rewards: torch.Tensor) -> list[torch.Tensor]:
        """Each of gdpo_reward_keys as per-token rewards: the reward function's entry on the row's last response
        token, where verl puts it (a row whose environment failed has none: 0, and no loss)."""
        last = (batch.attention_mask[:, batch.prompt_len :].sum(-1) - 1).clamp(min=0)
        rows = torch.arange(len(rollouts))
        out = []
        for key in self.algorithm.gdpo_reward_keys:
            values = []
            for r in rollouts:
                found = (r.reward_components or {}).get(key)
                if found is None and r.env_error is None:
                    given = ", ".join(sorted(r.reward_components or {})) or "none"
                    raise RunError(
                        f"gdpo_reward_keys names {key!r}, which the reward function's dict does not hold (its "
                        f"numeric entries: {given}); return it from the function, or remove it from the keys"
                    )
                values.append(found or 0.0)
            part = torch.zeros_like(rewards)
            part[rows, last] = torch.tensor(values, dtype=rewards.dtype)
            out.append(part)
        return out

    def advantages(self, rewards: torch.Tensor, mask: torch.Tensor, batch: TrainBatch, last_step=None, components=None):
        """The estimator's advantages and returns; step-wise rows (`last_step` marks each trajectory's last) share
        the advantage their trajectory's last turn gets, as SkyRL broadcasts it."""
        a = self.algorithm
        try:
            estimator = get_advantage_estimator(self.settings.advantage_estimator)
        except (KeyError, ValueError) as exc:
            raise RunError(str(exc)) from None
        # The batch's fields the estimator's card lists, by their names (None where the job computes none).
        card = algorithms.advantage_estimator(self.settings.advantage_estimator)
        inputs = {name: getattr(batch, name) for name in card.inputs}
        if last_step is not None:
            values = batch.old_values[last_step] if batch.old_values is not None else None
            ones = torch.ones_like(mask[last_step])
            per_trajectory, trajectory_returns = estimator(
                rewards[last_step],
                ones,
                index=batch.group[last_step],
                values=values,
                algorithm=a,
                **{k: v[last_step] if v is not None else None for k, v in inputs.items()},
            )
            advantages = broadcast_to_steps(per_trajectory, last_step, mask)
            returns = broadcast_to_steps(trajectory_returns, last_step, mask)
        else:
            extra = {"components": components} if components is not None else {}
            advantages, returns = estimator(
                rewards, mask, index=batch.group, values=batch.old_values, algorithm=a, **inputs, **extra
            )
        if self.settings.advantage_batch_normalize:
            advantages = batch_normalize(advantages, mask)
        return advantages, returns

    def rollout_metrics(self, rollouts: list[Rollout], batch: TrainBatch) -> dict:
        """Per-trajectory figures (a step-wise trajectory counts once) and the engine / trainer log-prob gap."""
        s = self.settings
        tokens = sum(len(r.response_ids) for r in rollouts)
        real = (batch.loss_mask > 0) if s.multi_turn else batch.attention_mask[:, batch.prompt_len :].bool()
        old = batch.old_logprobs if not s.fully_async else None  # async: the rollout's own
        diff = (old - batch.rollout_logprobs).abs()[real] if old is not None else torch.empty(0)
        last = [r for r in rollouts if r.last_step]
        env = rollout_metrics(rollouts)
        if not s.multi_turn:
            env.pop("env/turns", None)
        if batch.reward_baselines is not None:  # remax: the greedy responses' mean reward
            env["greedy_reward"] = float(batch.reward_baselines.mean())
        return dict(
            reward=sum(outcomes(last)) / len(last),
            response_length=tokens / len(rollouts),
            stop_fraction=sum(r.finish_reason == "stop" for r in last) / len(last),
            **env,
            **({"logprob_diff_max": float(diff.max())} if diff.numel() else {}),
        )


def outcomes(rollouts: list[Rollout]) -> list[float]:
    """Each row's trajectory outcome: its reward, or for step-wise rows their trajectory's last turn's (what the
    advantage is computed from)."""
    out, pending = [0.0] * len(rollouts), []
    for i, r in enumerate(rollouts):
        pending.append(i)
        if r.last_step:
            for j in pending:
                out[j] = r.reward
            pending = []
    return out
