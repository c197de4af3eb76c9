"""Rules of verl's rollout correction in `trainer.algorithm.off_policy_correction` (IcePop, batch-normalized TIS
weights, rejection sampling, bypass mode) and of PF-PPO: what verl itself refuses when it starts, and settings
nothing reads."""

from __future__ import annotations

from rlc.compiler.rules.base import Context, num, rule
from rlc.core import algorithms

OPC = "trainer.algorithm.off_policy_correction"


@rule(
    "RLC-E330",
    "rejection sampling names known modes with a positive bound each",
    f"{OPC}.rejection_sampling",
    f"{OPC}.rejection_threshold_high",
    f"{OPC}.rejection_threshold_low",
)
def rejection_sampling_bounded(c: Context):
    opc = c.alg.off_policy_correction
    modes = list(dict.fromkeys(opc.rejection_sampling or []))
    high, low = list(opc.rejection_threshold_high or []), list(opc.rejection_threshold_low or [])
    if not modes:
        for name, given in (("rejection_threshold_high", high), ("rejection_threshold_low", low)):
            if given:
                yield c.error("RLC-E330", f"{OPC}.{name}", f"{name} is set but rejection_sampling is not: nothing "
                              "reads it", "set rejection_sampling, or remove it")  # fmt: skip
        return
    unknown = [m for m in modes if m not in algorithms.REJECTION_MODES]
    if unknown:
        yield c.error("RLC-E330", f"{OPC}.rejection_sampling", f"unknown rejection mode(s) {', '.join(unknown)}",
                      f"use {', '.join(algorithms.REJECTION_MODES)}")  # fmt: skip
    k1 = [m for m in modes if m.endswith("k1")]
    if len(high) not in (1, len(modes)):
        yield c.error("RLC-E330", f"{OPC}.rejection_threshold_high", f"rejection_threshold_high has {len(high)} "
                      f"value(s) for {len(modes)} mode(s)", "give one bound shared by every mode, or one per mode")  # fmt: skip
    elif any((num(v) or 0) <= 0 for v in high + low):
        key = "rejection_threshold_high" if any((num(v) or 0) <= 0 for v in high) else "rejection_threshold_low"
        yield c.error("RLC-E330", f"{OPC}.{key}", "rejection bounds are positive (a ratio for k1, a divergence "
                      "for k2 and k3)", "use bounds above 0, e.g. 2.0 for k1, 0.01 for seq_mean_k3")  # fmt: skip
    if low and len(low) not in (1, len(k1)):
        yield c.error("RLC-E330", f"{OPC}.rejection_threshold_low", f"rejection_threshold_low has {len(low)} "
                      f"value(s) for {len(k1)} k1 mode(s)", "give one lower ratio bound per k1 mode, or one for all; "
                      "only k1 modes have one")  # fmt: skip
    elif low and len(high) in (1, len(modes)):
        highs = dict(zip(modes, high * len(modes) if len(high) == 1 else high, strict=True))
        lows = dict(zip(k1, low * len(k1) if len(low) == 1 else low, strict=True))
        for mode in k1:
            if num(lows[mode]) is not None and num(highs[mode]) is not None and lows[mode] > highs[mode]:
                yield c.error("RLC-E330", f"{OPC}.rejection_threshold_low", f"{mode}'s lower ratio bound "
                              f"{lows[mode]} is above its upper bound {highs[mode]}", "lower it below the upper")  # fmt: skip


@rule(
    "RLC-E331",
    "IcePop and batch-normalized TIS weights need a TIS weight",
    f"{OPC}.tis_ratio_clip_low",
    f"{OPC}.tis_batch_normalize",
    f"{OPC}.tis_ratio_type",
)
def tis_refinements_need_tis(c: Context):
    opc = c.alg.off_policy_correction
    for name, on in (("tis_ratio_clip_low", opc.tis_ratio_clip_low is not None),
                     ("tis_batch_normalize", opc.tis_batch_normalize)):  # fmt: skip
        if on and opc.tis_ratio_type is None:
            yield c.error("RLC-E331", f"{OPC}.{name}", f"{name} shapes the TIS weight, but tis_ratio_type is null",
                          "set tis_ratio_type (token or sequence), or remove it", [f"{OPC}.tis_ratio_type"])  # fmt: skip
    if opc.tis_ratio_type is not None and num(opc.tis_ratio_clip_low) is not None:
        high = getattr(opc, f"{opc.tis_ratio_type}_tis_ratio_clip_high")
        if num(high) is not None and opc.tis_ratio_clip_low > high:
            yield c.error("RLC-E331", f"{OPC}.tis_ratio_clip_low", f"the IcePop band [{opc.tis_ratio_clip_low}, "
                          f"{high}] is empty: every weight would be 0", f"lower tis_ratio_clip_low below "
                          f"{opc.tis_ratio_type}_tis_ratio_clip_high")  # fmt: skip


@rule("RLC-E332", "bypass.loss_type needs policy_loss_type bypass", "trainer.algorithm.bypass.loss_type",
      "trainer.algorithm.policy_loss_type")  # fmt: skip
def bypass_settings_need_bypass(c: Context):
    if c.alg.bypass.loss_type != "ppo_clip" and c.alg.policy_loss_type != "bypass":
        yield c.error("RLC-E332", "trainer.algorithm.bypass.loss_type", f"bypass.loss_type is "
                      f"{c.alg.bypass.loss_type}, but policy_loss_type is {c.alg.policy_loss_type}: nothing reads it",
                      "set policy_loss_type: bypass (verl's bypass mode), or remove it",
                      ["trainer.algorithm.policy_loss_type"])  # fmt: skip


@rule("RLC-E333", "pf_ppo.weight_pow is read by reweight_method pow only", "trainer.algorithm.pf_ppo")
def pf_ppo_power_needs_pow(c: Context):
    pf = c.alg.pf_ppo
    if pf.weight_pow != 2.0 and pf.reweight_method != "pow":
        yield c.error("RLC-E333", "trainer.algorithm.pf_ppo.weight_pow", f"pf_ppo.weight_pow is {pf.weight_pow}, "
                      f"but reweight_method is {pf.reweight_method}: nothing reads it",
                      "set reweight_method: pow, or remove weight_pow")  # fmt: skip


RULES = (rejection_sampling_bounded, tis_refinements_need_tis, bypass_settings_need_bypass, pf_ppo_power_needs_pow)
