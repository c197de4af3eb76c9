"""verl's trainer (launch.trainer: verl): every command rlc writes for verl is composed by verl 0.9.1's own Hydra
configs and passes verl's own config checks, and verl's example scripts imported into rlc and compiled back for
verl give the config verl composes from the scripts themselves."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import re
from pathlib import Path

import pytest
import yaml
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.scripts import SCRIPT_IMPORTERS, import_script
from rlc.compiler.importers.shell import read_script
from rlc.compiler.importers.verl.script import _arguments
from rlc.compiler.pipeline import compile_job
from rlc.compiler.trainers.verl import VERL
from verl_examples import extract

pytest.importorskip("hydra")
pytest.importorskip("omegaconf")
VERL_SPEC = importlib.util.find_spec("verl")
if VERL_SPEC is None or VERL_SPEC.submodule_search_locations is None:
    pytest.skip(
        "verl is not installed (make venv installs verl==0.9.1 without its dependencies)", allow_module_level=True
    )

import omegaconf.base  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra._internal.config_loader_impl import ConfigLoaderImpl  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

CONFIG_DIR = Path(next(iter(VERL_SPEC.submodule_search_locations))) / "trainer" / "config"
ENV = {"HOME": "/home/user", "PWD": "/work", "DEVICE": "gpu", "NOW": "20260101", "EXPERIMENT_NAME": "run"}
ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")
# How many of verl's example scripts round-trip: imported with no change that alters what runs, composed by verl
# 0.9.1, compiled back for verl, composed again: the same config on every key the script changes.
ROUND_TRIPS = {"main": 31, "v0.4.1": 26}  # v0.4.1: run_qwen2-7b_sgl_megatron.sh with virtual stages


@pytest.fixture(scope="module")
def verl_compose():
    """verl 0.9.1's Hydra composition of `main_ppo OVERRIDES` on its packaged configs.

    Hydra composes in two parts: the config groups an override chooses (model_engine=megatron) pick the defaults
    list, which is loaded and merged, then every other override is applied to the merged config
    (ConfigLoaderImpl._apply_overrides_to_config). The first part reads some 300 YAML files, a second a compose:
    it runs once per choice of groups, and Hydra's own second part runs on a copy for each command."""
    GlobalHydra.instance().clear()
    bases: dict[tuple, object] = {}
    # verl's configs hold some 430 `${oc.select:...}` interpolations, each parsed by OmegaConf's ANTLR grammar on
    # every read; the same strings parse to the same trees, so they are parsed once (the trees are only read)
    uncached = omegaconf.base.parse
    omegaconf.base.parse = functools.lru_cache(maxsize=None)(uncached)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):

        def run(overrides, config_name="ppo_trainer"):
            parsed = OverridesParser.create().parse_overrides(list(overrides))
            groups = tuple(o.input_line for o in parsed if "." not in o.key_or_group and not o.is_add())
            if (config_name, groups) not in bases:
                bases[config_name, groups] = compose(config_name=config_name, overrides=list(groups))
            cfg = copy.deepcopy(bases[config_name, groups])
            ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if o.input_line not in groups], cfg)
            return cfg

        yield run
    omegaconf.base.parse = uncached
    GlobalHydra.instance().clear()


def plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def flat(node, prefix="") -> dict:
    if isinstance(node, dict) and node:
        out = {}
        for k, v in node.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def compiled(tmp_path: Path, text: str, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return compile_job(path, env={})


@pytest.fixture(scope="module")
def verl_checks():
    """What verl's main_ppo checks before it starts Ray: validate_config (which builds the actor's and critic's
    dataclasses: their __post_init__ checks), and the rollout's and algorithm's dataclasses."""
    try:
        from verl.utils.config import omega_conf_to_dataclass, validate_config
    except ImportError as exc:  # verl is installed without its dependencies: the test extra has what this needs
        pytest.skip(f"verl's config checks need {exc.name}")

    def check(cfg) -> str:
        """'' when verl's checks pass; what they need that is not here (a model's config from the Hub for the
        critic's, vLLM's release for LoRA's rank limit) when they stop on that; raises when verl refuses."""
        try:
            _checks(cfg)
        except Exception as exc:
            text = f"{exc} {exc.__cause__}"
            for need, words in (("the model's config.json from the Hub", "huggingface"),
                                ("the model's config.json from the Hub", "OSError"),
                                ("vLLM's release", "vllm version")):  # fmt: skip
                if words in text or words in repr(exc.__cause__):
                    return need
            raise
        return ""

    def _checks(cfg) -> None:
        # verl.trainer.ppo.utils.need_critic and need_reference_policy (that module imports verl's datasets)
        critic = cfg.critic.enable if cfg.critic.enable is not None else cfg.algorithm.adv_estimator == "gae"
        reference = cfg.algorithm.get("use_kl_in_reward", False) or cfg.actor_rollout_ref.actor.use_kl_loss
        # what the actor's worker asserts as it starts (verl/workers/engine_workers.py, ActorRolloutRefWorker): the
        # global micro-batch sizes of older releases are no longer read
        arr = cfg.actor_rollout_ref
        if not arr.actor.use_dynamic_bsz:
            assert arr.rollout.log_prob_micro_batch_size_per_gpu is not None, (
                "rollout.log_prob_micro_batch_size_per_gpu"
            )
            assert arr.actor.ppo_micro_batch_size_per_gpu is not None, "actor.ppo_micro_batch_size_per_gpu"
        validate_config(cfg, use_reference_policy=reference, use_critic=critic)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.algorithm)

    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True  # the critic's model config is read from the Hub: fail at once, no retries
    yield check
    constants.HF_HUB_OFFLINE = offline


SPEC = """\
version: 1
name: gsm8k-verl
cluster: {{accelerator: H100, gpus_per_node: 8, num_nodes: 1}}
launch: {{target: ray, trainer: verl{settings}}}
data: {{train_data: [~/data/gsm8k/train.parquet], val_data: [~/data/gsm8k/test.parquet]}}
trainer:
  policy: {{model: {{path: Qwen/Qwen2.5-3B-Instruct}}}}
  train_batch_size: 256
  policy_mini_batch_size: 64
  micro_train_batch_size_per_gpu: 8
  micro_forward_batch_size_per_gpu: 16
  placement: {{colocate_all: true}}
  algorithm: {{advantage_estimator: grpo, use_kl_loss: true, loss_reduction: {reduction}}}
  logger: console
generator:
  n_samples_per_prompt: 5
  inference_engine: {{backend: vllm, tensor_parallel_size: 2}}
environment: {{env_class: verl}}
"""


def test_a_spec_becomes_a_main_ppo_command_verl_composes_and_checks(tmp_path, verl_compose, verl_checks):
    result = compiled(tmp_path, SPEC.format(settings="", reduction="sequence_mean"))
    assert result.ok, [d.message for d in result.diagnostics if d.severity == "error"]
    cmd = VERL.command(result.spec, {}, VERL.release)
    assert cmd.module == "verl.trainer.main_ppo"
    assert cmd.requirements == ("verl[vllm,fsdp]==0.9.1",)
    cfg = verl_compose(cmd.overrides)
    assert verl_checks(cfg) == ""
    values = flat(plain(cfg))
    expected = {
        "trainer.n_gpus_per_node": 8,
        "trainer.nnodes": 1,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "actor_rollout_ref.rollout.n": 5,
        "actor_rollout_ref.actor.rollout_n": 5,
        "data.train_batch_size": 256,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_c": 1e9,  # rlc's regular loss: verl's dual clip never bites
        "trainer.logger": ["console"],
    }
    assert {k: values[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("policy", "strategy", "per_gpu"),
    [
        ({"sequence_parallel_size": 2}, "fsdp2", 4096),  # Ulysses: each of 2 GPUs runs half of every row
        ({"megatron_config": {"context_parallel_size": 2}}, "megatron", 4096),
        ({}, "fsdp2", 8192),
    ],
)
def test_a_token_budget_reaches_verl_as_each_gpus_share_of_the_rows(tmp_path, verl_compose, policy, strategy, per_gpu):
    spec = yaml.safe_load(SPEC.format(settings="", reduction="sequence_mean"))
    spec["trainer"].update(max_tokens_per_microbatch=8192, strategy=strategy)
    spec["trainer"]["policy"].update(policy)
    result = compiled(tmp_path, yaml.safe_dump(spec))
    assert result.ok, [d.message for d in result.diagnostics if d.severity == "error"]
    values = flat(plain(verl_compose(VERL.command(result.spec, {}, VERL.release).overrides)))
    assert values["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert values["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == per_gpu
    assert values["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == per_gpu


@pytest.mark.parametrize("estimator", ["remax", "optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_estimators_with_inputs_of_their_own_reach_verl_by_its_names(
    tmp_path, verl_compose, verl_checks, estimator
):
    """remax (verl makes the greedy rollout itself) and the optimal token baselines, whose sum of squared
    probabilities verl's actor computes only when told (its trainer asserts it is there)."""
    text = SPEC.format(settings="", reduction="sequence_mean").replace("estimator: grpo", f"estimator: {estimator}")
    result = compiled(tmp_path, text)
    assert result.ok, [d.message for d in result.diagnostics if d.severity == "error"]
    cfg = verl_compose(VERL.command(result.spec, {}, VERL.release).overrides)
    assert verl_checks(cfg) == ""
    values = flat(plain(cfg))
    assert values["algorithm.adv_estimator"] == estimator
    assert values["actor_rollout_ref.actor.calculate_sum_pi_squared"] is (estimator != "remax")


def test_the_overlong_penalty_becomes_verls_dapo_reward_manager(tmp_path, verl_compose, verl_checks):
    """trainer.algorithm.overlong_buffer_* is verl's dapo reward manager's overlong buffer, from the longest
    response."""
    spec = _with_algorithm(SPEC.format(settings="", reduction="token_mean"), overlong_buffer_len=256,
                           overlong_buffer_penalty_factor=0.5)  # fmt: skip
    result = compiled(tmp_path, spec)
    assert result.ok, [d.message for d in result.diagnostics if d.severity == "error"]
    cfg = verl_compose(VERL.command(result.spec, {}, VERL.release).overrides)
    assert verl_checks(cfg) == ""
    values = flat(plain(cfg))
    assert values["reward.reward_manager.name"] == "dapo"
    buffer = {k.rpartition(".")[2]: v for k, v in values.items() if ".overlong_buffer_cfg." in k}
    assert buffer == {"enable": True, "len": 256, "penalty_factor": 0.5, "log": False}
    assert values["reward.reward_kwargs.max_resp_len"] == result.spec.generator.sampling_params.max_generate_length


def _with_algorithm(text: str, **fields) -> str:
    """The spec with trainer.algorithm's `fields` set."""
    import yaml as pyyaml

    data = pyyaml.safe_load(text)
    data["trainer"].setdefault("algorithm", {}).update(fields)
    return pyyaml.safe_dump(data, sort_keys=False)


def test_trainer_settings_pass_to_verl_and_wrong_ones_are_refused_in_verls_terms(tmp_path, verl_compose):
    ok = ", trainer_settings: {verl: {data.filter_overlong_prompts: true, trainer.logger: [console, wandb]}}"
    result = compiled(tmp_path, SPEC.format(settings=ok, reduction="sequence_mean"))
    assert result.ok, [d.message for d in result.diagnostics if d.severity == "error"]
    cfg = plain(verl_compose(VERL.command(result.spec, {}, VERL.release).overrides))
    assert cfg["data"]["filter_overlong_prompts"] is True and cfg["trainer"]["logger"] == ["console", "wandb"]
    bad = ", trainer_settings: {verl: {data.filter_overlong_prompt: true, data.train_batch_size: 8}}"
    result = compiled(tmp_path, SPEC.format(settings=bad, reduction="sequence_mean"), "bad.yaml")
    found = [(d.code, d.message, d.hint) for d in result.diagnostics if d.code == "RLC-E666"]
    assert len(found) == 2, found
    assert any("verl 0.9.1" in m and "filter_overlong_prompts" in h for _, m, h in found)
    assert any("data.train_batch_size" in m and "spec" in m for _, m, _ in found)


def test_what_verl_lacks_is_refused_only_for_verl(tmp_path):
    text = SPEC.format(settings="", reduction="token_mean").replace("env_class: verl", "env_class: gsm8k")
    codes = {d.code for d in compiled(tmp_path, text).diagnostics}
    assert "RLC-E662" in codes and "RLC-W660" in codes
    rlc = compiled(tmp_path, text.replace("trainer: verl", "trainer: rlc"), "rlc.yaml")
    assert not {d.code for d in rlc.diagnostics} & {"RLC-E662", "RLC-W660"}


def _scripts(tmp_path_factory, release: str) -> dict[str, Path]:
    """The example scripts of a release, by their path in verl's repository (several share a file name)."""
    root = tmp_path_factory.mktemp(f"verl-{release}")
    extract(release, root)
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*.sh"))}


DEFAULTS: dict[tuple, dict] = {}


def defaults_of(verl_compose, config_name: str, engine: tuple[str, ...]) -> dict:
    """verl's own values of a config and engine, flat (what a script changes is what differs from them)."""
    if (config_name, engine) not in DEFAULTS:
        DEFAULTS[config_name, engine] = flat(plain(verl_compose(engine, config_name)))
    return DEFAULTS[config_name, engine]


def same(key: str, theirs, ours) -> bool:
    """Equal, or one data file written as a file or a list of one: verl's RLHFDataset reads both alike
    (`if not isinstance(data_files, list | ListConfig): data_files = [data_files]`)."""
    if key in ("data.train_files", "data.val_files"):
        return (theirs if isinstance(theirs, list) else [theirs]) == (ours if isinstance(ours, list) else [ours])
    return theirs == ours


def round_trip(script: Path, tmp_path: Path, verl_compose, verl_checks) -> str:
    """'ok', 'excluded: why', or 'differs: ...' for one example script."""
    try:
        imported, errors, _ = import_script(str(script), ENV, [])
    except NotImportable:
        return "excluded: refused by rlc's importer"
    if imported is None:
        return "excluded: needs a value only running the script gives"
    if any(ch.severity == "error" for ch in imported.changes):
        return "excluded: imported with a change that alters what runs"
    read = read_script(script, str(script), env=ENV, argv=[])
    launch, _ = read.command(lambda x: any(i.accepts(x) for i in SCRIPT_IMPORTERS))
    config_name, config_path, overrides = _arguments(launch)
    if config_path is not None and config_name not in ("ppo_trainer", "ppo_megatron_trainer"):
        return "excluded: composed on the script's own config"
    texts = [o.text for o in overrides]
    for name in ENV_REF.findall(" ".join(texts) + imported.text):
        os.environ.setdefault(name, f"/env/{name}")
    try:
        original = verl_compose(texts, config_name)
        theirs = flat(plain(original))
    except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's errors: verl 0.9.1 refuses the script
        return f"excluded: verl 0.9.1 does not compose it ({type(exc).__name__})"
    try:
        verl_checks(original)
    except Exception as exc:  # noqa: BLE001 - verl's asserts and its dataclasses' checks
        return f"excluded: verl 0.9.1's config checks refuse it ({type(exc).__name__}: {str(exc)[:80]})"
    base = defaults_of(verl_compose, config_name, tuple(t for t in texts if t.startswith("model_engine=")))
    text = re.sub(r"(?m)^launch:\n", "launch:\n  trainer: verl\n", imported.text, count=1)
    # verl names no GPU type, and the importer assumes an H100; verl's examples are written for up to H200s
    text = re.sub(r"(?m)^  accelerator: H100\b", "  accelerator: H200", text, count=1)
    result = compiled(tmp_path, text, f"{script.stem}.yaml")
    if not result.ok:
        return "differs: refused for verl: " + "; ".join(
            f"{d.code} {d.message}" for d in result.diagnostics if d.severity == "error"
        )
    ours_cfg = verl_compose(VERL.command(result.spec, {}, VERL.release).overrides)
    verl_checks(ours_cfg)  # raises where verl refuses rlc's command
    ours = flat(plain(ours_cfg))
    changed = [k for k in theirs if theirs[k] != base.get(k, object())]
    differ = {k: (theirs[k], ours.get(k, "<absent>")) for k in changed if not same(k, theirs[k], ours.get(k))}
    return f"differs: {differ}" if differ else "ok"


@pytest.mark.parametrize("release", sorted(ROUND_TRIPS))
def test_verls_example_scripts_round_trip(release, tmp_path_factory, verl_compose, verl_checks):
    found = {}
    for name, script in _scripts(tmp_path_factory, release).items():
        found[name] = round_trip(script, tmp_path_factory.mktemp("spec"), verl_compose, verl_checks)
    differ = {k: v for k, v in found.items() if v.startswith("differs")}
    assert not differ, "\n".join(f"{k}: {v}" for k, v in differ.items())
    assert sum(v == "ok" for v in found.values()) == ROUND_TRIPS[release], found
    # verl's ReMax and optimal-token-baseline examples among them (main's main_ppo_sync one is no main_ppo job)
    ours = {k: v for k, v in found.items() if "remax_trainer/" in k or "otb_trainer/" in k}
    assert ours and all(v == "ok" or k.endswith("_sync_fsdp.sh") for k, v in ours.items()), ours


ROLLOUT_CORRECTION = """python3 -m verl.trainer.main_ppo \\
  data.train_files=/data/train.parquet data.val_files=/data/test.parquet \\
  actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.rollout.name=vllm \\
  algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.calculate_log_probs=True \\
  data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
  {settings}
"""


@pytest.mark.parametrize(
    "settings",
    [
        "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=3.0",
        "algorithm.rollout_correction.rollout_is=sequence \"algorithm.rollout_correction.rollout_is_threshold='0.5_5.0'\" "
        "algorithm.rollout_correction.rollout_is_batch_normalize=True "
        "\"algorithm.rollout_correction.rollout_rs='token_k1,seq_mean_k3'\" "
        "\"algorithm.rollout_correction.rollout_rs_threshold='0.8_1.25,0.01'\"",
        "algorithm.rollout_correction.rollout_rs=seq_max_k2 algorithm.rollout_correction.rollout_rs_threshold=0.05 "
        "algorithm.adv_estimator=gae critic.model.path=Qwen/Qwen2.5-0.5B-Instruct critic.ppo_micro_batch_size_per_gpu=2 "
        "algorithm.use_pf_ppo=True algorithm.pf_ppo.reweight_method=pow algorithm.pf_ppo.weight_pow=3.0",
        "algorithm.rollout_correction.bypass_mode=True algorithm.rollout_correction.loss_type=reinforce "
        "algorithm.rollout_correction.rollout_is=sequence algorithm.rollout_correction.rollout_is_threshold=2.5",
        "algorithm.rollout_correction.bypass_mode=True actor_rollout_ref.actor.clip_ratio_c=4.0 "
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3 algorithm.rollout_correction.rollout_rs_threshold=0.02",
    ],
    ids=["token-tis", "icepop-normalized-rejection", "rejection-pf-ppo", "bypass-reinforce", "bypass-ppo-clip"],
)
def test_verls_rollout_correction_and_pf_ppo_round_trip(settings, tmp_path, verl_compose, verl_checks):
    """Imported into the spec's off_policy_correction and pf_ppo, written back as verl's keys, not as
    trainer_settings: verl composes the same config."""
    script = tmp_path / "run.sh"
    script.write_text(ROLLOUT_CORRECTION.format(settings=settings))
    imported, _, _ = import_script(str(script), ENV, [])
    kept = (yaml.safe_load(imported.text)["launch"].get("trainer_settings") or {}).get("verl", {})
    assert not [k for k in kept if "rollout_correction" in k or "pf_ppo" in k], kept
    assert round_trip(script, tmp_path, verl_compose, verl_checks) == "ok"
