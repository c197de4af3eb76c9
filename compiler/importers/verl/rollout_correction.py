"""verl's `algorithm.rollout_correction` and PF-PPO (`algorithm.use_pf_ppo`) as the spec's
`trainer.algorithm.off_policy_correction` and `trainer.algorithm.pf_ppo`.

verl's threshold strings are parsed as verl parses them: `rollout_is_threshold` is a ratio cap, or "low_high" for
IcePop; `rollout_rs_threshold` is one entry per `rollout_rs` mode (or one shared), "low_high" ratio bounds for a k1
mode. A threshold verl itself would refuse is reported, not carried.
"""

from __future__ import annotations

from typing import Any

from rlc.compiler.importers.verl.record import VerlImport
from rlc.core import algorithms

ALG = "algorithm"
RC = f"{ALG}.rollout_correction"
OPC = "trainer.algorithm.off_policy_correction"


def _number(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a number")
    return float(text)


def is_threshold(spec: Any) -> tuple[float | None, float]:
    """(low, high) of verl's rollout_is_threshold: a cap, or "low_high" (IcePop)."""
    text = str(spec).strip()
    low, sep, high = text.partition("_")
    if not sep:
        return None, _number(text)
    return _number(low), _number(high)


def rs_thresholds(modes: list[str], spec: Any) -> tuple[list[float], list[float] | None]:
    """The spec's rejection_threshold_high and rejection_threshold_low (one per k1 mode) of verl's
    rollout_rs_threshold: one entry shared by every mode, or one per mode."""
    entries = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(entries) not in (1, len(modes)):
        raise ValueError(f"{len(entries)} thresholds for {len(modes)} modes; verl wants 1 or one per mode")
    entries = entries * len(modes) if len(entries) == 1 else entries
    high, low, k1_written = [], [], False
    for mode, entry in zip(modes, entries, strict=True):
        lo, sep, hi = entry.partition("_")
        if sep and not mode.endswith("k1"):
            raise ValueError(f"{mode} takes one upper bound, not {entry!r}")
        high.append(_number(hi if sep else entry))
        if mode.endswith("k1"):
            low.append(_number(lo) if sep else 1.0 / high[-1])
            k1_written = k1_written or bool(sep)
    return (high if len(set(high)) > 1 else high[:1]), (low if k1_written else None)


def modes(spec: Any) -> list[str]:
    """verl's comma-separated rollout_rs, duplicates dropped; an unknown mode raises ValueError."""
    found = list(dict.fromkeys(part.strip() for part in str(spec).split(",") if part.strip()))
    unknown = [m for m in found if m not in algorithms.REJECTION_MODES]
    if unknown or not found:
        raise ValueError(f"unknown rollout_rs mode(s) {unknown}; verl has {', '.join(algorithms.REJECTION_MODES)}")
    return found


def import_rollout_correction(imp: VerlImport) -> None:
    level = imp.get(f"{RC}.rollout_is")
    if level is not None:
        try:
            low, high = is_threshold(imp.get(f"{RC}.rollout_is_threshold", 2.0))
        except ValueError as exc:
            imp.problem(f"{RC}.rollout_is_threshold", f"verl would refuse this threshold ({exc}); not carried")
        else:
            imp.put(f"{OPC}.tis_ratio_type", level, f"{RC}.rollout_is")
            imp.put(f"{OPC}.{level}_tis_ratio_clip_high", high, f"{RC}.rollout_is_threshold")
            if low is not None:
                imp.put(f"{OPC}.tis_ratio_clip_low", low, f"{RC}.rollout_is_threshold")
            if imp.get(f"{RC}.rollout_is_batch_normalize", False):
                imp.put(f"{OPC}.tis_batch_normalize", True, f"{RC}.rollout_is_batch_normalize")
    rs = imp.get(f"{RC}.rollout_rs")
    legacy = imp.has(f"{RC}.rollout_token_veto_threshold")  # v0.6: ratio-band rejection and the token veto
    if legacy:
        _legacy_rejection(imp, rs, level)
    elif rs is not None:
        try:
            found = modes(rs)
            highs, lows = rs_thresholds(found, imp.get(f"{RC}.rollout_rs_threshold"))
        except ValueError as exc:
            imp.problem(f"{RC}.rollout_rs", f"verl would refuse these rejection settings ({exc}); not carried")
        else:
            imp.put(f"{OPC}.rejection_sampling", found, f"{RC}.rollout_rs")
            imp.put(f"{OPC}.rejection_threshold_high", highs, f"{RC}.rollout_rs_threshold")
            if lows is not None:
                imp.put(f"{OPC}.rejection_threshold_low", lows, f"{RC}.rollout_rs_threshold")
    bypass = bool(imp.get(f"{RC}.bypass_mode", False))
    veto = imp.get(f"{RC}.rollout_token_veto_threshold")
    if level is not None or rs is not None or bypass or veto is not None:
        imp.read("actor_rollout_ref.rollout.calculate_log_probs")  # the engines return their log-probs (resolve)
    # verl 0.6's use_policy_gradient (read in bypass mode only) is 0.7's bypass loss_type reinforce: -w * A * log p
    # with w the IS weight against the engine, no PPO clip
    gradient = bool(imp.get(f"{RC}.use_policy_gradient", False))
    if bypass:
        imp.put("trainer.algorithm.policy_loss_type", "bypass", f"{RC}.bypass_mode",
                reason="verl's bypass mode replaces the actor's policy_loss.loss_mode with its bypass_mode loss")  # fmt: skip
        loss_type = "reinforce" if gradient else imp.get(f"{RC}.loss_type", "ppo_clip")
        if loss_type not in ("ppo_clip", "reinforce"):
            imp.problem(f"{RC}.loss_type", f"verl has no bypass loss_type {loss_type!r}; not carried")
        else:
            source = f"{RC}.use_policy_gradient" if gradient else f"{RC}.loss_type"
            vetoed = gradient and veto is not None and rs is None
            imp.put("trainer.algorithm.bypass.loss_type", loss_type, source,
                    reason="verl 0.6's policy-gradient loss: verl 0.7's bypass loss_type reinforce"
                    + ("; verl 0.6 applied the token veto's mask only with rollout_rs set, rlc applies it"
                       if vetoed else ""), severity="warning" if vetoed else "info")  # fmt: skip
    # with rollout_is and rollout_rs null the thresholds are read by nothing, in verl as here; loss_type only in
    # bypass mode
    imp.read(f"{RC}.rollout_is", f"{RC}.rollout_is_threshold", f"{RC}.rollout_is_batch_normalize")
    imp.read(f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold", f"{RC}.bypass_mode", f"{RC}.loss_type")
    imp.read(f"{RC}.use_policy_gradient")  # outside bypass mode verl 0.6 reads it nowhere


# verl 0.6's rollout_rs levels -> SkyRL's masks of the same ratio bands: (its key, the keys of its band)
LEGACY_RS = {
    "token": (None, "token_mask_is_threshold_low", "token_mask_is_threshold_high"),
    "sequence": ("product", "product_mask_low", "product_mask_high"),
    "geometric": ("geometric", "geo_mask_low", "geo_mask_high"),
}


def _legacy_rejection(imp: VerlImport, rs: Any, level: Any) -> None:
    """verl 0.6's rejection: a token, product or geometric-mean ratio outside [lower, upper] (lower 1 / upper when
    unset) is SkyRL's token or sequence mask, and a row holding a token ratio below the veto threshold is SkyRL's
    outlier mask; verl 0.6 takes the IS weight over every token, rlc after the token and outlier masks."""
    keys = (f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold", f"{RC}.rollout_rs_threshold_lower")
    if rs is not None:
        high, low = imp.get(keys[1]), imp.get(keys[2])
        if rs not in LEGACY_RS or high is None or float(high) <= 0:
            imp.problem(keys[0], f"verl {imp.c.release} would refuse rollout_rs {rs!r} with threshold {high!r}; "
                        "not carried")  # fmt: skip
        else:
            metric, low_key, high_key = LEGACY_RS[rs]
            if metric is not None:
                imp.put(f"{OPC}.sequence_mask_metric", metric, keys[0])
            imp.put(f"{OPC}.{low_key}", float(low) if low is not None else 1.0 / float(high), *keys[1:][::-1])
            differs = rs == "token" and level == "sequence"
            imp.put(f"{OPC}.{high_key}", float(high), keys[1], severity="warning" if differs else "info",
                    reason="verl 0.6 takes the sequence IS weight over every token; rlc leaves out the tokens its "
                    "token mask drops" if differs else "")  # fmt: skip
    veto_key = f"{RC}.rollout_token_veto_threshold"
    veto = imp.get(veto_key)
    if veto is not None:
        normalized = bool(imp.get(f"{RC}.rollout_is_batch_normalize", False)) and level is not None
        reason = "verl 0.6's token veto: a row holding a token ratio below it leaves the loss"
        if normalized:
            reason += "; verl 0.6 averages the vetoed rows' IS weights into the batch mean, rlc leaves them out"
        imp.put(f"{OPC}.outlier_token_is_threshold_low", float(veto), veto_key, reason=reason,
                severity="warning" if normalized else "info")  # fmt: skip
    imp.read(*keys, veto_key)
    imp.read(f"{RC}.rollout_is", f"{RC}.rollout_is_threshold", f"{RC}.rollout_is_batch_normalize")
    imp.read(f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold")


def import_pf_ppo(imp: VerlImport) -> None:
    estimator = imp.get(f"{ALG}.adv_estimator", "gae")
    if imp.get(f"{ALG}.use_pf_ppo", False) and estimator != "gae":
        imp.drop(f"{ALG}.use_pf_ppo", f"verl's main_ppo resamples with PF-PPO only under adv_estimator gae, not "
                 f"{estimator}: it changes nothing in verl either; not carried", "warning", kept=False)  # fmt: skip
    elif imp.get(f"{ALG}.use_pf_ppo", False):
        method = imp.get(f"{ALG}.pf_ppo.reweight_method", "pow")
        if method not in algorithms.PF_PPO_REWEIGHTS:
            imp.problem(f"{ALG}.pf_ppo.reweight_method", f"verl has no {method!r} PF-PPO reweighting; not carried")
        else:
            imp.put("trainer.algorithm.pf_ppo.reweight_method", method, f"{ALG}.use_pf_ppo",
                    f"{ALG}.pf_ppo.reweight_method")  # fmt: skip
            if method == "pow":  # the other methods read no power
                imp.put("trainer.algorithm.pf_ppo.weight_pow", imp.get(f"{ALG}.pf_ppo.weight_pow", 2.0),
                        f"{ALG}.pf_ppo.weight_pow")  # fmt: skip
    imp.read(f"{ALG}.use_pf_ppo", f"{ALG}.pf_ppo")
