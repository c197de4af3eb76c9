"""`rlc explain KEY`: type, default, doc, accepted values and the rules a key takes part in."""

from __future__ import annotations

import difflib
import json

from rlc.compiler import allocation, estimate, memory
from rlc.compiler.check import rules_for
from rlc.compiler.importers.skyrl.legacy import legacy_target
from rlc.compiler.targets import TARGETS
from rlc.compiler.trainers import TRAINERS
from rlc.spec.model import default_model, to_plain, type_label
from rlc.spec.skyrl_release import default_change


class _Grammar:
    def __init__(self, text: str, codes: dict[str, str]):
        self.text, self.codes = text, codes


# Keys whose values are small languages of their own: their grammar and diagnostics.
GRAMMARS = {allocation.KEY: _Grammar(allocation.GRAMMAR, allocation.CODES)}


def explain_key(key: str) -> tuple[str, bool]:
    if key == "memory":
        return memory_text(), True
    if key == "time":
        return time_text(), True
    model = default_model()
    spec = model.lookup(key)
    if spec is None:
        target = legacy_target(key)
        if target:
            return f"{key} is a legacy SkyRL key; in spec v1 it is {target} (`rlc migrate` rewrites it)", True
        close = difflib.get_close_matches(key, model.paths(), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"unknown key {key}{hint}", False
    lines = [key, f"  {spec.doc}"]
    if spec.section is not None:
        lines.append(f"  type: section{' (or null)' if spec.optional else ''}")
        lines.append("  keys:")
        for child in model.fields_of(spec.section, key):
            lines.append(
                f"    {child.name:<40} {type_label(child.tp) if child.section is None else 'section':<18} {child.doc}"
            )
    else:
        lines.append(f"  type: {type_label(spec.tp)}")
        lines.append(f"  default: {json.dumps(to_plain(spec.default()))}")
        values = model.allowed_values(spec)
        if values:
            lines.append(f"  accepted values: {', '.join(map(str, values))}" + (" (or null)" if spec.optional else ""))
        bounds = [
            f"{w} {spec.meta[m]}"
            for m, w in (("minimum", ">="), ("exclusive_minimum", ">"), ("maximum", "<="))
            if m in spec.meta
        ]
        if bounds:
            lines.append(f"  range: {', '.join(bounds)}")
        if spec.meta.get("passthrough"):
            lines.append("  free-form mapping: its keys are passed through unchecked")
        upstream = default_change(key)
        if upstream:
            lines.append(f"  {upstream}")
    if spec.meta.get("rlc_only"):
        lines.append("  rlc addition: SkyRL's config has no such key")
    if key == "launch.target":
        lines.append("  targets:")
        lines.extend(f"    {t.name:<9} {t.summary}" for t in TARGETS)
    if key == "launch.trainer":
        lines.append("  trainers (the release each one's commands are checked against):")
        lines.extend(f"    {t.name:<6} {t.release or '-':<6} {t.summary}" for t in TRAINERS)
    grammar = GRAMMARS.get(key)
    if grammar:
        lines.append("  grammar:")
        lines.extend(f"    {line}" if line else "" for line in grammar.text.splitlines())
        lines.append("  diagnostics:")
        lines.extend(f"    {code}  {what}" for code, what in grammar.codes.items())
    origin = model.extensions.origin.get(key)
    if origin:
        lines.append(f"  added by extension: {origin}")
    values_origin = model.extensions.origin.get(key + "#values")
    if values_origin:
        extra = ", ".join(model.extensions.values.get(key, []))
        lines.append(f"  values added by extension {values_origin}: {extra}")
    rules = [(r.code, r.title) for r in rules_for(key)] + memory_codes_for(key)
    if rules:
        lines.append("  rules:")
        lines.extend(f"    {code}  {title}" for code, title in rules)
    return "\n".join(lines), True


def memory_codes_for(key: str) -> list[tuple[str, str]]:
    """The memory-fit findings a key takes part in (policy keys stand for every role's)."""
    generic = key.replace("trainer.ref.", "trainer.policy.").replace("trainer.critic.", "trainer.policy.")
    generic = (
        generic.replace("_ref_", "_policy_")
        .replace("_critic_", "_policy_")
        .replace("placement.ref", "placement.policy")
    )
    generic = generic.replace("placement.critic", "placement.policy")
    return [
        (code, memory.CODES[code] + " (`rlc explain memory`)")
        for code, keys in memory.MEMORY_KEYS.items()
        if any(generic == k or k.startswith(generic + ".") for k in keys)
    ]


def memory_text() -> str:
    """How rlc estimates each GPU's peak memory: the memory module's own account, then its findings."""
    lines = ["memory", "  How `rlc plan`, `validate` and `compile` estimate each GPU's peak memory:", ""]
    lines += ["  " + line for line in (memory.__doc__ or "").strip().splitlines()]
    lines += [
        "",
        "  Model sizes come from a local directory's config.json, the Hugging Face cache, or rlc's table of common",
        "  hub ids; model_config_kwargs override them. Accelerator capacities are the driver's totals (H100 79.6 GiB).",
        "  Sequence lengths are the longest the spec allows (max_prompt_length + max_generate_length): the estimate",
        "  is the peak of a micro-batch of full-length rows, what one long response pads a whole batch to.",
        "  CPU-only clusters (accelerator: none) are not checked.",
        "  findings:",
    ]
    lines += [f"    {code}  {title}" for code, title in memory.CODES.items()]
    return "\n".join(lines)


def time_text() -> str:
    """How `rlc plan` estimates a step's time and a run's cost, and the spec keys that set each assumption."""
    lines = ["time", "  How `rlc plan` estimates seconds per step, the run's wall time, GPU-hours and cost:", ""]
    lines += ["  " + line for line in (estimate.__doc__ or "").strip().splitlines()]
    lines += ["", "  Each assumption, set in the spec or as an override (e.g. estimate.train_mfu=0.45):"]
    model = default_model()
    spec = model.lookup("estimate")
    for child in model.fields_of(spec.section, "estimate") if spec and spec.section else []:
        lines.append(f"    estimate.{child.name:<26} {child.doc} (default {json.dumps(to_plain(child.default()))})")
    lines += ["", f"  GPU-hour prices ({estimate.PRICES_AS_OF}, {estimate.PRICE_SOURCE}):"]
    lines += [f"    {name:<10} ${price:.2f}" for name, price in estimate.PRICES.items()]
    return "\n".join(lines)
