"""What this rlc runtime can execute: a spec value it cannot run yet is refused at compile time.

A compiled spec must never fail on the cluster for lack of an implementation. Values the CPU runtime
lacks are errors. The Megatron strategy is a warning for now:
their launch files are still worth checking, and the runtime stops at start-up, before any model loads.
"""

from __future__ import annotations

from pathlib import Path

from rlc.compiler.rules.base import Context, num, rule
from rlc.core.runtime_facts import BUILTIN_ENVS, MODEL_CODE_ENVS, RLC_ENVS, SKYRL_GYM_ENVS, runs_model_code

ALG = "trainer.algorithm"


def _extension_envs() -> set[str]:
    """Environment ids installed extensions declare (ext.add_environment, or a section under
    environment.skyrl_gym, as extensions declared them before)."""
    # deferred: an import cycle (the spec model's extensions load the rules' facts)
    from rlc.spec.model import default_model

    ext = default_model().extensions
    prefix = "environment.skyrl_gym."
    return set(ext.environments) | {p[len(prefix) :] for p in ext.sections if p.startswith(prefix)}


@rule(
    "RLC-E902",
    "environment.env_class is an environment rlc, skyrl-gym or an extension registers",
    "environment.env_class",
)
def environment_exists(c: Context):
    env_class = c.s.environment.env_class
    if not isinstance(env_class, str) or env_class in BUILTIN_ENVS or env_class in _extension_envs():
        return
    import difflib  # deferred: only a wrong name needs a close match

    close = difflib.get_close_matches(env_class, [*BUILTIN_ENVS, *_extension_envs()], n=1)
    yield c.error(
        "RLC-E902",
        "environment.env_class",
        f"no environment {env_class!r} is registered: skyrl-gym has {', '.join(SKYRL_GYM_ENVS)}, rlc adds "
        f"{', '.join(RLC_ENVS)}"
        + (f", extensions {', '.join(sorted(_extension_envs()))}" if _extension_envs() else ""),
        f"did you mean {close[0]!r}?"
        if close
        else "use one of those, or install the extension that declares it (ext.add_environment)",
    )


@rule(
    "RLC-W905",
    "model-written code runs unisolated only when asked: environment.sandbox.isolation: unisolated with an "
    f"environment that runs the model's code ({', '.join(MODEL_CODE_ENVS)}, an extension's)",
    "environment.sandbox.isolation",
    "environment.env_class",
)
def model_code_unisolated(c: Context):
    env_class = c.s.environment.env_class
    if c.s.environment.sandbox.isolation != "unisolated" or not isinstance(env_class, str):
        return
    if runs_model_code(env_class):
        yield c.warning(
            "RLC-W905",
            "environment.sandbox.isolation",
            f"the {env_class} environment runs what the policy writes, and isolation: unisolated runs it in the "
            "trainer's filesystem, network and uid: it can read the job's secrets, rewrite checkpoints and reach "
            "Ray and the engines",
            "use isolation: bubblewrap (install bubblewrap; docs/sandbox.md says what a container needs) unless "
            "every program it runs is trusted",
            ["environment.env_class"],
        )


JUDGE_KEY = "OPENAI_API_KEY"


@rule(
    "RLC-E904",
    "the environment's service is named: search needs its retrieval URL, the LLM judge its API key",
    "environment.env_class",
    "environment.skyrl_gym.search.search_url",
    "launch.secrets",
    "launch.envs",
    "launch.target",
)
def environment_service_named(c: Context):
    env_class = c.s.environment.env_class
    if env_class == "search":
        url = c.s.environment.skyrl_gym.search.search_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            yield c.error(
                "RLC-E904",
                "environment.skyrl_gym.search.search_url",
                f"the search environment POSTs its queries to a retrieval server, but search_url is {url!r}",
                "set environment.skyrl_gym.search.search_url to the server's http(s) URL (SkyRL's is "
                "http://127.0.0.1:8000/retrieve on the head node)",
                ["environment.env_class"],
            )
    if env_class == "llm_as_a_judge":
        secrets = c.s.launch.secrets if isinstance(c.s.launch.secrets, list) else []
        envs = c.s.launch.envs if isinstance(c.s.launch.envs, dict) else {}
        here = c.s.launch.target == "local" and c.env.get(JUDGE_KEY)
        if JUDGE_KEY not in secrets and JUDGE_KEY not in envs and not here:
            yield c.error(
                "RLC-E904",
                "environment.env_class",
                f"the llm_as_a_judge environment calls its judge with {JUDGE_KEY}, which this job does not pass "
                "to its nodes (every trajectory would fail)",
                f"add {JUDGE_KEY} to launch.secrets (the value stays on your machine)",
                ["launch.secrets"],
            )


RF = "environment.skyrl_gym.reward_function"


@rule(
    "RLC-E905",
    "env_class reward_function names a readable Python file that defines the function",
    "environment.env_class",
    f"{RF}.path",
    f"{RF}.name",
)
def reward_function_file(c: Context):
    if c.s.environment.env_class != "reward_function":
        return
    config = c.s.environment.skyrl_gym.reward_function
    path, name = config.path, config.name
    if not isinstance(path, str) or not path:
        yield c.error(
            "RLC-E905",
            f"{RF}.path",
            "env_class reward_function scores each row with your function, but no file is named",
            f"set {RF}.path to your Python file (and {RF}.name to its function, compute_score by default)",
            ["environment.env_class"],
        )
        return
    if "${" in path:
        return  # resolved where the job runs
    why = _defines(Path(path).expanduser(), str(name))
    if why:
        key = f"{RF}.name" if why.startswith("it defines no") else f"{RF}.path"
        yield c.error(
            "RLC-E905",
            key,
            f"the reward function file {path}: {why}",
            "name a file that exists here (relative to the directory rlc runs in) and a function it defines at "
            "its top level, compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)",
            [f"{RF}.path"],
        )


def _defines(path: Path, name: str) -> str | None:
    """Why `path` is no Python file defining `name` at its top level (read, never run), or None."""
    import ast  # deferred: only a spec with a reward file reads one

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        return f"it is not valid Python ({getattr(exc, 'msg', exc)}{f', line {line}' if line else ''})"
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    imported = {(a.asname or a.name).split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}  # fmt: skip
    if name in defined or name in assigned or name in imported:
        return None
    return f"it defines no function {name!r} (its functions: {', '.join(defined) or 'none'})"


def _gathers_one_shape(t) -> bool:
    """Whether a Megatron role's allgather MoE dispatcher would meet micro-batches of different shapes: token-budget
    ones differ from one data-parallel (so expert-parallel) rank to the next, and under pipeline stages from one
    micro-batch to the next (Megatron-Core refuses `variable_seq_lengths` with that dispatcher)."""
    for role in ("policy", "ref"):
        mc = getattr(t, role).megatron_config
        kwargs = mc.transformer_config_kwargs if isinstance(mc.transformer_config_kwargs, dict) else {}
        dispatcher = kwargs.get("moe_token_dispatcher_type", mc.moe_token_dispatcher_type)  # the worker's order
        if dispatcher == "allgather" and (
            (num(mc.expert_model_parallel_size) or 1) > 1 or (num(mc.pipeline_model_parallel_size) or 1) > 1
        ):
            return True
    return False


def _unsupported(c: Context):
    """(key, what is set, fix) for every feature the runtime does not execute yet."""
    t, g = c.t, c.s.generator
    checks = [
        (
            "generator.inference_engine.enable_http_endpoint",
            g.inference_engine.enable_http_endpoint,
            "the HTTP endpoint",
        ),
        (
            "trainer.algorithm.dynamic_sampling.type",
            g.step_wise_trajectories and bool(t.algorithm.dynamic_sampling.type),
            "dynamic sampling of step-wise trajectories",
        ),
        ("trainer.logger", t.logger == "mlflow", "mlflow logging"),
        ("trainer.update_ref_every_epoch", t.update_ref_every_epoch, "refreshing the reference model"),
        ("trainer.rope_scaling", bool(t.rope_scaling), "RoPE scaling overrides"),
        ("trainer.rope_theta", t.rope_theta is not None, "RoPE base overrides"),
        ("trainer.policy.use_torch_compile", t.policy.use_torch_compile, "torch.compile"),
        (
            "trainer.max_tokens_per_microbatch",
            (num(t.max_tokens_per_microbatch) or 0) > 0 and c.megatron and _gathers_one_shape(t),
            "token-budget micro-batches with Megatron's allgather MoE dispatcher over expert-parallel ranks or "
            "pipeline stages (it wants one micro-batch shape on every rank; moe_token_dispatcher_type alltoall "
            "takes any)",
        ),
    ]
    found = [
        (key, what, f"remove {key.rsplit('.', 1)[1]} (or set it back to its default)") for key, on, what in checks if on
    ]
    # rlc's hf engine (local, or served over HTTP by rlc.runtime.inference.http) samples with its own
    # parameters only: extra vLLM sampling arguments would be ignored, so the run would differ from the spec.
    for params in ("sampling_params", "eval_sampling_params"):
        if g.inference_engine.backend == "hf" and getattr(g, params).additional_kwargs:
            found.append(
                (
                    f"generator.{params}.additional_kwargs",
                    "extra sampling arguments on the hf engine",
                    "remove additional_kwargs, or use the vllm engine (generator.inference_engine.backend: vllm)",
                )
            )
    return found


FEATURE_KEYS = (
    "generator.inference_engine.enable_http_endpoint",
    "trainer.algorithm.dynamic_sampling.type",
    "generator.step_wise_trajectories",
    "trainer.logger",
    "trainer.update_ref_every_epoch",
    "trainer.rope_scaling",
    "trainer.rope_theta",
    "trainer.policy.use_torch_compile",
    "generator.sampling_params.additional_kwargs",
    "generator.eval_sampling_params.additional_kwargs",
    "generator.inference_engine.backend",
    "trainer.max_tokens_per_microbatch",
    "trainer.strategy",
    *(
        f"trainer.{role}.megatron_config.{key}"
        for role in ("policy", "ref")
        for key in (
            "moe_token_dispatcher_type",
            "transformer_config_kwargs",
            "expert_model_parallel_size",
            "pipeline_model_parallel_size",
        )
    ),
)


@rule("RLC-E903", "the runtime executes every feature the spec turns on", *FEATURE_KEYS)
def runtime_executes_features(c: Context):
    for key, what, fix in _unsupported(c):
        yield c.error("RLC-E903", key, f"{what} ({key}) is in spec v1 but this rlc runtime cannot run it yet", fix)


IE = "generator.inference_engine"


@rule(
    "RLC-E906",
    "delta weight sync (weight_sync_backend: delta) names where it publishes (delta_weight_sync.sync_dir) and syncs "
    "full weights (not LoRA adapters, as in SkyRL 0.4)",
    f"{IE}.weight_sync_backend",
    f"{IE}.delta_weight_sync",
    f"{IE}.delta_weight_sync.sync_dir",
    "trainer.policy.model.lora.rank",
)
def delta_sync_complete(c: Context):
    ie = c.s.generator.inference_engine
    if ie.weight_sync_backend != "delta":
        return
    delta = ie.delta_weight_sync
    if delta is None or not isinstance(delta.sync_dir, str) or not delta.sync_dir:
        yield c.error(
            "RLC-E906",
            f"{IE}.weight_sync_backend",
            "delta weight sync publishes the weights to a directory or bucket, and delta_weight_sync.sync_dir "
            "names none",
            f"set {IE}.delta_weight_sync.sync_dir to a path every node sees, s3://bucket/prefix or gs://bucket/prefix",
            [f"{IE}.delta_weight_sync.sync_dir"],
        )
    rank = num(c.s.trainer.policy.model.lora.rank)
    if rank is not None and rank > 0:
        yield c.error(
            "RLC-E906",
            f"{IE}.weight_sync_backend",
            "delta weight sync publishes full checkpoints, and a LoRA policy syncs its adapters alone (SkyRL 0.4 "
            "refuses the pair too)",
            "use weight_sync_backend: nccl (or gloo) with LoRA, or train full weights with delta",
            ["trainer.policy.model.lora.rank"],
        )


RULES = (
    delta_sync_complete,
    environment_exists,
    environment_service_named,
    reward_function_file,
    model_code_unisolated,
    runtime_executes_features,
)
