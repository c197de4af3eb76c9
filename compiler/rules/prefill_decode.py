"""The prefill/decode split (generator.inference_engine.enable_pd): SkyRL's checks of its settings, decided before
launch. The engines start as prefill or decode engines with vLLM's kv_transfer_config, and rlc's router sends each
request to a prefill engine, then to a decode engine with what the prefill handed over (docs/engines.md)."""

from __future__ import annotations

from rlc.compiler.rules.base import Context, num, rule

IE = "generator.inference_engine"
ROLES = ("prefill", "decode")


# The connector rlc has run on vLLM's CPU build (through files, tests/runtime/test_vllm_cpu.py); NIXL and Mooncake
# move the KV cache between GPUs.
CPU_CONNECTORS = ("ExampleConnector",)


def _kv_transfer(kwargs) -> bool:
    return isinstance(kwargs, dict) and bool(kwargs.get("kv_transfer_config"))


def _connector(kwargs) -> object:
    kv = kwargs.get("kv_transfer_config") if isinstance(kwargs, dict) else None
    return kv.get("kv_connector") if isinstance(kv, dict) else None


@rule(
    "RLC-E515",
    "prefill/decode split: local prefill and decode engines both, each with vLLM's kv_transfer_config (on a CPU, "
    "ExampleConnector's)",
    f"{IE}.enable_pd",
    f"{IE}.num_prefill",
    f"{IE}.num_engines",
    f"{IE}.engine_init_kwargs",
    f"{IE}.prefill_init_kwargs",
    f"{IE}.decode_init_kwargs",
    f"{IE}.run_engines_locally",
    "cluster.accelerator",
    f"{IE}.backend",
)
def prefill_decode_engines(c: Context):
    ie = c.ie
    role_kwargs = {r: getattr(ie, f"{r}_init_kwargs") for r in ROLES}
    if not ie.enable_pd:
        for r, kwargs in role_kwargs.items():
            if kwargs:
                yield c.error(
                    "RLC-E515",
                    f"{IE}.{r}_init_kwargs",
                    f"{r}_init_kwargs are the {r} engines' arguments, and enable_pd is off: no engine is a {r} engine",
                    f"set {IE}.enable_pd: true, or move them to engine_init_kwargs",
                    [f"{IE}.enable_pd"],
                )
        return
    if ie.backend != "vllm":
        return  # RLC-E822: the split is the vllm engine's
    if not ie.run_engines_locally:
        yield c.error(
            "RLC-E515",
            f"{IE}.enable_pd",
            "enable_pd with remote engines: rlc starts prefill and decode engines of its own only",
            "split a remote deployment on its side (vllm serve --kv-transfer-config, a router in front, its URL as "
            f"{IE}.external_proxy_url), or run the engines locally",
            [f"{IE}.run_engines_locally"],
        )
        return
    prefill, engines = num(ie.num_prefill), num(ie.num_engines)
    if prefill is not None and engines is not None and not 0 < prefill < engines:
        yield c.error(
            "RLC-E515",
            f"{IE}.num_prefill",
            f"num_prefill {prefill} of num_engines {engines}: a prefill/decode split needs at least one prefill "
            "engine and one decode engine",
            f"set num_prefill between 1 and {max(int(engines) - 1, 1)} (and num_engines to 2 or more)",
            [f"{IE}.num_engines"],
        )
    if any(role_kwargs.values()):
        if ie.engine_init_kwargs:
            yield c.error(
                "RLC-E515",
                f"{IE}.engine_init_kwargs",
                "engine_init_kwargs and prefill_init_kwargs / decode_init_kwargs are both set: the role's arguments "
                "replace engine_init_kwargs, so SkyRL refuses the two together",
                "move every engine argument (kv_transfer_config too) into prefill_init_kwargs and decode_init_kwargs",
                [f"{IE}.prefill_init_kwargs", f"{IE}.decode_init_kwargs"],
            )
        for r, kwargs in role_kwargs.items():
            if not _kv_transfer(kwargs):
                yield c.error(
                    "RLC-E515",
                    f"{IE}.{r}_init_kwargs",
                    f"{r}_init_kwargs set no kv_transfer_config: the {r} engines would have no way to hand the KV "
                    "cache over",
                    f"set {IE}.{r}_init_kwargs.kv_transfer_config.kv_connector (NixlConnector, as SkyRL's script)",
                )
        sources = {f"{IE}.{r}_init_kwargs": kwargs for r, kwargs in role_kwargs.items()}
    elif not _kv_transfer(ie.engine_init_kwargs):
        yield c.error(
            "RLC-E515",
            f"{IE}.enable_pd",
            "enable_pd without a kv_transfer_config: the prefill engines would have no way to hand the KV cache to "
            "the decode engines",
            f"set {IE}.engine_init_kwargs.kv_transfer_config.kv_connector (NixlConnector, as SkyRL's script)",
            [f"{IE}.engine_init_kwargs"],
        )
        return
    else:
        sources = {f"{IE}.engine_init_kwargs": ie.engine_init_kwargs}
    if c.s.cluster.accelerator == "none":
        yield from _cpu_connectors(c, sources)


def _cpu_connectors(c: Context, sources: dict):
    for key, kwargs in sources.items():
        connector = _connector(kwargs)
        if connector is not None and connector not in CPU_CONNECTORS:
            yield c.error(
                "RLC-E515",
                key,
                f"kv_connector {connector} on a CPU: it moves the KV cache between GPUs (NIXL, Mooncake); on vLLM's "
                "CPU build rlc runs the split with ExampleConnector only (the KV cache through files)",
                "use kv_transfer_config: {kv_connector: ExampleConnector, kv_connector_extra_config: "
                "{shared_storage_path: DIR}} on a CPU, or GPUs (cluster.accelerator)",
                ["cluster.accelerator"],
            )


RULES = (prefill_decode_engines,)
