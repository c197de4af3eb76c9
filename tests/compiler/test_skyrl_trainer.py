"""SkyRL's trainer as the job's trainer (launch.trainer: skyrl): the command rlc writes is judged by SkyRL 0.4.0's own
code, and what SkyRL's trainer does not run is refused in its terms.

SkyRL's code is the referee: every command goes through `SkyRLTrainConfig.from_cli_overrides` and `validate_cfg`
(what main_base runs before Ray starts) in one process for the whole session (skyrl_referee.py). Round trips: each
of SkyRL's launch scripts (tests/fixtures/skyrl-scripts) imported with `rlc migrate`, compiled for SkyRL's trainer,
gives the config SkyRL builds from the script's own arguments, field for field.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rlc.compiler.importers.base import NotImportable, environment_reference
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.importers.shell import read_script
from rlc.compiler.importers.skyrl.script import SkyRLScript
from rlc.compiler.pipeline import analyze, compile_job
from rlc.compiler.trainers.skyrl import SKYRL, cli_value
from rlc.compiler.trainers.skyrl_config import DROPPED, PATH_KEYS, skyrl_keys, skyrl_values
from rlc.core.overrides import parse_override
from rlc.spec.model import SpecModel
from rlc.spec.skyrl_release import SKYRL_RELEASE
from test_skyrl_scripts import ENV, ROOT, SCRIPTS

HERE = Path(__file__).resolve().parent
EXAMPLES = sorted((HERE.parents[1] / "examples").glob("*.yaml"))
SKYRL_CHOSEN = parse_override("launch.trainer=skyrl")
# The code and SQL environments run what the policy writes; under SkyRL's trainer only with this consent (RLC-E642).
CONSENT = parse_override("environment.sandbox.isolation=unisolated")

# The scripts whose round trip has no config to compare, and why.
NO_CONFIG = {
    **{
        name: "hands the job to an integration's entrypoint: rlc does not import it"
        for name in SCRIPTS
        if name.startswith("integrations/arctic_rl/")
    },
    # SkyRL 0.4.0 refuses the script itself; rlc's import keeps what runs (and says what it dropped)
    # main_dapo's fields on main_base: rlc's import refuses them too
    "examples/train/megatron/run_megatron_dapo_qwen3_235b_a22b_lora.sh": "Invalid fields",
    "examples/train/text_to_sql/run_sql_fsdp_2node.sh": "Invalid fields {'reward_num_nodes'}",  # a legacy key
}
# Refused alike by SkyRL's validation and by rlc (RLC-E106): the same batch arithmetic.
BOTH_REFUSE = {"examples/train/training_backends/run_no_seq_pack.sh": "should be divisible by"}

# Values a `key=value` override must carry unchanged (into a free-form dict field, which keeps any value).
TRICKY = [
    "plain",
    "with space",
    "",
    "null",
    "None",
    "true",
    "Yes",
    "off",
    "~",
    "~/ckpts",
    "1e5",
    "0x10",
    "1_000",
    "12:30",
    "a: b",
    "[a]",
    "{a: 1}",
    "#hash",
    'quote\'s "both"',
    "back\\slash",
    "line\nbreak",
    "tab\there",
    "ünïcode 😀",
    "-leading-dash",
    ".5",
    "a=b",
    "'",
    0,
    -3,
    10**20,
    0.1,
    1e-06,
    -0.0,
    1.0,
    float("inf"),
    float("-inf"),
    None,
    True,
    False,
    [],
    {},
    ["a", 1, None, 2.5, [True], {"k": "v"}],
    {"nested": {"deep": [1, "two"]}, "with space": "x", "1": 1, "null": None},
]


def _compiled(path: Path, *overrides) -> Any:
    return compile_job(path, [SKYRL_CHOSEN, *overrides], env={"WANDB_API_KEY": "set"})


def _script_commands(tmp: Path) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, Any]]:
    """(the script's own main_base arguments, rlc's command of its import, the compile's errors) per script."""
    original, compiled, errors = {}, {}, {}
    for name in SCRIPTS:
        path = ROOT / name
        try:
            imported, _, _ = import_script(str(path), ENV.get(name, {}), [])
        except NotImportable:
            continue
        launch, _ = read_script(path, str(path), env=ENV.get(name, {})).command(SkyRLScript().accepts)
        original[name] = [word.render(environment_reference) for word in launch.args]
        spec = tmp / (name.replace("/", "_") + ".yaml")
        spec.write_text(imported.text)
        result = _compiled(spec, CONSENT)
        errors[name] = sorted({d.code for d in result.diagnostics if d.is_error})
        if result.spec is not None:
            compiled[name] = list(SKYRL.command(result.spec, {}, SKYRL_RELEASE).overrides)
    return original, compiled, errors


@pytest.fixture(scope="session")
def session(tmp_path_factory) -> dict[str, Any]:
    """Every command of this file, judged by SkyRL in one process."""
    pytest.importorskip("skyrl", reason="SkyRL's config code is the referee (make venv installs skyrl==0.4.0)")
    tmp = tmp_path_factory.mktemp("skyrl-trainer")
    original, compiled, errors = _script_commands(tmp)
    commands = {f"script:{k}": v for k, v in original.items()} | {f"rlc:{k}": v for k, v in compiled.items()}
    examples = {}
    for path in EXAMPLES:
        result = _compiled(path)
        examples[path.name] = result
        if result.ok:
            commands[f"example:{path.name}"] = list(SKYRL.command(result.spec, {}, SKYRL_RELEASE).overrides)
    for i, value in enumerate(TRICKY):
        commands[f"value:{i}"] = [f"generator.inference_engine.engine_init_kwargs.v={cli_value(value)}"]
        if isinstance(value, str):
            commands[f"top:{i}"] = [f"trainer.run_name={cli_value(value)}"]
    names = {n for argv in commands.values() for a in argv for n in re.findall(r"\$\{oc\.env:(\w+)\}", a)}
    env = {**os.environ, "WANDB_API_KEY": "set", **{n: f"/env/{n}" for n in names if n != "HOME"}}
    done = subprocess.run(
        [sys.executable, str(HERE / "skyrl_referee.py")],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    return {**answer, "errors": errors, "examples": examples, "env": env}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


def _differences(a: dict, b: dict) -> dict[str, tuple[Any, Any]]:
    fa, fb = _flat(a), _flat(b)
    return {
        k: (fa.get(k, "<absent>"), fb.get(k, "<absent>"))
        for k in sorted(fa.keys() | fb.keys())
        if fa.get(k, "<absent>") != fb.get(k, "<absent>")
    }


# -- round trips ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_compiled_for_skyrl_gives_the_config_of_its_own_arguments(name, session):
    configs = session["configs"]
    if name in NO_CONFIG:
        theirs = configs.get(f"script:{name}")
        assert theirs is None or NO_CONFIG[name] in (theirs["error"] or ""), theirs
        return
    theirs, ours = configs[f"script:{name}"], configs[f"rlc:{name}"]
    if name in BOTH_REFUSE:
        assert BOTH_REFUSE[name] in theirs["error"] and BOTH_REFUSE[name] in ours["error"]
        assert session["errors"][name] == ["RLC-E106"]
        return
    assert theirs["error"] is None, theirs["error"]
    assert session["errors"][name] == [], session["errors"][name]  # rlc refuses nothing SkyRL runs
    assert ours["error"] is None, ours["error"]
    assert _differences(theirs["config"], ours["config"]) == {}


def test_most_scripts_round_trip(session):
    """The figure the file holds: 57 scripts, 50 round trips field for field."""
    compared = [n for n in SCRIPTS if n not in NO_CONFIG and n not in BOTH_REFUSE]
    assert len(SCRIPTS) == 57 and len(compared) == 50


# -- the examples -----------------------------------------------------------------------------------------------


def _expected(value: Any, env: dict[str, str]) -> Any:
    """A value as SkyRL resolves it on the node: ${oc.env:NAME} read from its environment."""
    if isinstance(value, list):
        return [_expected(v, env) for v in value]
    if isinstance(value, str):  # SkyRL expands ~ in its own defaults, which the command leaves to it
        return os.path.expanduser(re.sub(r"\$\{oc\.env:(\w+)\}", lambda m: env[m.group(1)], value))
    return value


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_each_example_for_skyrl_is_refused_by_rlc_or_passes_skyrls_validation(example, session):
    result = session["examples"][example]
    if not result.ok:
        # the local CPU examples: rlc's own engine, packaged model and environment on a cluster without GPUs
        codes = {d.code for d in result.diagnostics if d.is_error}
        assert codes and codes <= {"RLC-E641", "RLC-E646", "RLC-E647", "RLC-E648"}, codes
        assert example.startswith("local-cpu"), codes
        return
    judged = session["configs"][f"example:{example}"]
    assert judged["error"] is None, judged["error"]
    config = _flat(judged["config"])
    for key, value in skyrl_values(result.spec).items():
        if value is not None and key in config:  # None: SkyRL derives it (its value is checked by the round trips)
            assert config[key] == _expected(value, session["env"]), key


# -- the values -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("i", range(len(TRICKY)), ids=[repr(v)[:30] for v in TRICKY])
def test_every_value_reads_back_unchanged(i, session):
    value, configs = TRICKY[i], session["configs"]
    judged = configs[f"value:{i}"]
    assert judged["error"] is None, judged["error"]
    back = judged["config"]["generator"]["inference_engine"]["engine_init_kwargs"]["v"]
    if isinstance(value, float) and math.isinf(value):
        assert back == repr(value) or back == value  # json.dumps of the config writes Infinity
    else:
        assert back == value and type(back) is type(value), (cli_value(value), back)
    if isinstance(value, str):
        assert configs[f"top:{i}"]["config"]["trainer"]["run_name"] == value


# -- SkyRL's keys and defaults --------------------------------------------------------------------------------


def test_skyrls_keys_are_the_specs_less_rlcs_own_and_the_dropped(session):
    fields = {key: default for key, _type, default in session["fields"]}
    optional = {key for key, tp, _ in session["fields"] if "Optional[skyrl" in tp}
    walked = {k for k in fields if not any(k.startswith(s + ".") for s in optional)}
    assert set(skyrl_keys()) == walked
    spec_keys = set(SpecModel().paths())
    assert set(DROPPED) <= spec_keys and not set(DROPPED) & set(fields)


# Values SkyRL's config derives when it is built (its __post_init__), which the default config shows derived.
DERIVED_ON_BUILD = {
    "generator.max_input_length",
    "trainer.algorithm.temperature",
    "data.dataloader.num_workers",
    "trainer.ref.model.path",
    "generator.eval_sampling_params",
}


def test_skyrls_defaults_are_the_specs_or_the_listed_changes(session):
    """The defaults the command leaves out are SkyRL's own, read from its default config (a role's section may
    differ from its class: the critic's learning rate)."""
    home = os.path.expanduser("~")
    for key, default in skyrl_keys().items():
        if key in DERIVED_ON_BUILD:
            continue
        if key in PATH_KEYS:
            default = _expected(default, {"HOME": home}) if "${" in str(default) else default
            default = [os.path.expanduser(p) for p in default] if isinstance(default, list) else default
            default = os.path.expanduser(default) if isinstance(default, str) else default
        value: Any = session["defaults"]
        for part in key.split("."):
            value = value[part]
        assert value == default, key


# -- refusals in SkyRL's terms ----------------------------------------------------------------------------------

BASE = "version: 1\ncluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}\nlaunch: {trainer: skyrl}\n"
BASE += "trainer: {logger: console, policy: {model: {path: Qwen/Qwen2.5-0.5B-Instruct}}}\n"


def _diagnostics(tmp_path, text: str, *overrides: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return analyze(path, [parse_override(o) for o in overrides], env={}).diagnostics


CASES = {
    "RLC-E640": ("environment.sandbox.memory_mb=2048", "environment.sandbox.memory_mb"),
    "RLC-E641": ("environment.env_class=calculator", "environment.env_class"),
    "RLC-E642": ("environment.env_class=lcb", "environment.sandbox.isolation"),
    "RLC-E643": ("trainer.algorithm.policy_loss_type=demo_loss", "trainer.algorithm.policy_loss_type"),
    "RLC-E644": ("launch.trainer_settings={skyrl: {trainer.epoch: 3}}", "launch.trainer_settings.skyrl.trainer.epoch"),
    "RLC-E645": (
        "launch.trainer_settings={skyrl: {trainer.epochs: 3}}",
        "launch.trainer_settings.skyrl.trainer.epochs",
    ),
    "RLC-E646": (
        "generator.inference_engine.weight_sync_backend=gloo",
        "generator.inference_engine.weight_sync_backend",
    ),
    "RLC-E647": ("cluster.accelerator=none", "cluster.accelerator"),
    "RLC-E648": ("trainer.policy.model.path=rlc:tiny", "trainer.policy.model.path"),  # not again at ref's, derived
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_what_skyrls_trainer_lacks_is_refused_at_its_key_only_under_skyrl(code, tmp_path):
    override, key = CASES[code]
    if code == "RLC-E643":
        pytest.importorskip("rlc_ext_demo", reason="an extension's policy loss is one SkyRL lacks")
    found = [d for d in _diagnostics(tmp_path, BASE, override) if d.code == code]
    assert [(d.key, d.severity) for d in found] == [(key, "error")], found
    assert f"SkyRL {SKYRL_RELEASE}" in found[0].message and found[0].hint
    assert found[0].location is not None
    under_rlc = _diagnostics(tmp_path, BASE, override, "launch.trainer=rlc")
    assert not [d for d in under_rlc if d.code == code]


def test_a_dropped_skyrl_key_names_its_replacement(tmp_path):
    found = [d for d in _diagnostics(tmp_path, BASE, "trainer.rope_theta=500000") if d.code == "RLC-E640"]
    assert {d.key for d in found} >= {"trainer.rope_theta"}
    assert "rope_parameters" in found[0].hint


def test_warnings_name_what_runs_differently(tmp_path):
    consent = _diagnostics(tmp_path, BASE, "environment.env_class=lcb", "environment.sandbox.isolation=unisolated")
    assert {d.code for d in consent if d.severity == "error"} == set()
    assert "RLC-W640" in {d.code for d in consent}
    other = _diagnostics(
        tmp_path, BASE, "launch.trainer_version=0.5.0", "launch.trainer_settings={skyrl: {trainer.new_key: 1}}"
    )
    assert {d.code for d in other} >= {"RLC-W641", "RLC-W642"} and not [d for d in other if d.is_error]


def test_what_only_rlcs_runtime_lacks_is_not_refused_under_skyrl(tmp_path):
    """SkyRL 0.4's features rlc's runtime has not built yet run under SkyRL's trainer."""
    overrides = (
        "generator.inference_engine.enable_return_sample_support_set=true",
        "trainer.policy.torch_profiler_config.enable=true",
        "data.dataloader.num_workers=4",
        "trainer.logger=mlflow",
    )
    under_skyrl = _diagnostics(tmp_path, BASE, *overrides)
    assert not [d for d in under_skyrl if d.is_error], [(d.code, d.message) for d in under_skyrl if d.is_error]
    under_rlc = _diagnostics(tmp_path, BASE, *overrides, "launch.trainer=rlc")
    assert {"RLC-E813", "RLC-E804", "RLC-E801", "RLC-E903"} <= {d.code for d in under_rlc}


def test_the_command_names_skyrls_entrypoint_and_the_extras_the_job_needs():
    result = compile_job(HERE.parents[1] / "examples" / "gsm8k-grpo-megatron-8xh100.yaml", [SKYRL_CHOSEN])
    command = SKYRL.command(result.spec, {}, SKYRL_RELEASE)
    assert command.module == "skyrl.train.entrypoints.main_base"
    assert command.requirements == (f"skyrl[megatron]=={SKYRL_RELEASE}",)
    assert "trainer.strategy=megatron" in command.overrides
    assert "generator.inference_engine.num_engines=4" in command.overrides  # derived from the cluster
    settings = parse_override("launch.trainer_settings={skyrl: {trainer.run_name: x}}")
    result = compile_job(HERE.parents[1] / "examples" / "gsm8k-grpo-8xh100.yaml", [SKYRL_CHOSEN, settings])
    command = SKYRL.command(result.spec, {}, SKYRL_RELEASE)
    assert command.requirements == (f"skyrl[fsdp]=={SKYRL_RELEASE}",)
    assert command.overrides[-1] == "trainer.run_name=x"


def test_the_plan_and_memory_estimate_hold_under_skyrl():
    """The same GPUs, models and batches: plan, memory fit and decisions are what they are for rlc's runtime."""
    path = HERE.parents[1] / "examples" / "gsm8k-grpo-8xh100.yaml"
    ours, theirs = compile_job(path), compile_job(path, [SKYRL_CHOSEN])
    assert theirs.ok and theirs.memory is not None and ours.memory is not None
    assert theirs.plan == ours.plan
    assert theirs.memory.to_json() == ours.memory.to_json()
