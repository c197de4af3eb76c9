"""Build SkyRL 0.4.0's config from command lines as its main_base does, and print each as JSON.

Run by tests/compiler/test_skyrl_trainer.py in a process of its own, once per session: stdin is a JSON object
{name: [override, ...]}, stdout {"configs": {name: {"config": the config as a nested dict, or null, "error": why
not}}, "fields": every field of SkyRLTrainConfig (skyrl_walk.py's list), "defaults": its default config as a nested
dict}. Each command line goes through `SkyRLTrainConfig.from_cli_overrides` and then `validate_cfg`, what main_base
runs before it starts Ray; it imports nothing of rlc.

Two stand-ins, neither of which changes what SkyRL's config and validation decide:
- skyrl 0.4.0 declares Python >= 3.12: one of its pydantic models (skyrl.tinker.types, imported on the way to
  validate_cfg) uses `typing.TypedDict`, which pydantic takes from `typing_extensions` only before 3.12;
- building a config imports the vLLM worker extension (new_inference_worker_wrap, 20 s of vLLM imports on a CPU)
  for the name of its class alone: the module is stood in for by that name.
"""

import contextlib
import dataclasses
import json
import sys
import types
import typing
import warnings

import typing_extensions

if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
WORKER_WRAP = "skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap"
sys.modules[WORKER_WRAP] = types.ModuleType(WORKER_WRAP)
sys.modules[WORKER_WRAP].VLLM_NEW_INFERENCE_WORKER_EXTENSION_CLS = f"{WORKER_WRAP}.NewInferenceWorkerWrap"  # type: ignore[attr-defined]

from skyrl.train.config import SkyRLTrainConfig  # noqa: E402
from skyrl.train.utils import validate_cfg  # noqa: E402
from skyrl_walk import walk  # noqa: E402


def build(argv: list) -> dict:
    try:  # what SkyRL prints goes to stderr: stdout is the answer
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            cfg = SkyRLTrainConfig.from_cli_overrides(argv)
            validate_cfg(cfg)
    except Exception as exc:  # noqa: BLE001 - SkyRL's refusal is the answer, reported as data
        return {"config": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=repr)), "error": None}


if __name__ == "__main__":
    commands = json.load(sys.stdin)
    fields: list = []
    walk(SkyRLTrainConfig, "", fields)
    with contextlib.redirect_stdout(sys.stderr):
        defaults = dataclasses.asdict(SkyRLTrainConfig())
    answer = {
        "configs": {name: build(argv) for name, argv in commands.items()},
        "fields": fields,
        "defaults": json.loads(json.dumps(defaults, default=repr)),
    }
    json.dump(answer, sys.stdout)
