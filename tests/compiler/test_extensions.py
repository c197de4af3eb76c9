"""Extensions: packages that add fields, sections and accepted values to the spec.

Two halves:
- through the installed `rlc` with the demo extension (tests/fixtures/rlc-ext-demo, installed by
  `make venv`): schema, validate and explain see what it adds;
- in process, SpecModel with an Extensions object built directly (no entry points).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.spec.algorithm import AlgorithmConfig
from rlc.spec.extensions import ENTRY_POINT_GROUP, ExtensionError, Extensions
from rlc.spec.fields import setting
from rlc.spec.generation import SkyRLGymConfig
from rlc.spec.model import SpecModel, to_plain
from rlc.spec.schema import build_schema, committed_schema

ALG = "trainer.algorithm"
COUNTDOWN = "environment.skyrl_gym.countdown"


def _demo_installed() -> bool:
    return any(ep.name == "demo" for ep in entry_points(group=ENTRY_POINT_GROUP))


needs_demo = pytest.mark.skipif(
    not _demo_installed(),
    reason="the demo extension is not installed here (pip install --no-deps -e tests/fixtures/rlc-ext-demo, or `make venv`)",
)

# examples/gsm8k-grpo-8xh100.yaml plus what the demo extension adds.
EXT_SPEC = """\
version: 1
name: countdown-demo

cluster:
  accelerator: H100
  gpus_per_node: 8
  num_nodes: 1
  infra: aws
  disk_size: 256

launch:
  target: skypilot
  secrets: [WANDB_API_KEY]

data:
  train_data: ["~/data/countdown/train.parquet"]
  val_data: ["~/data/countdown/validation.parquet"]

trainer:
  strategy: fsdp2
  policy:
    model:
      path: Qwen/Qwen2.5-1.5B-Instruct
    optimizer_config:
      lr: 1.0e-6
  algorithm:
    advantage_estimator: grpo
    use_kl_loss: true
    kl_loss_coef: 0.001
    policy_loss_type: demo_loss
    demo_bonus_coef: 0.5
    demo_mode: "on"
  epochs: 20
  train_batch_size: 1024
  policy_mini_batch_size: 256
  micro_train_batch_size_per_gpu: 40
  micro_forward_batch_size_per_gpu: 40
  max_prompt_length: 512
  eval_interval: 5
  ckpt_interval: 10
  logger: wandb
  project_name: countdown
  run_name: qwen2.5-1.5b-demo

generator:
  inference_engine:
    backend: hf
    tensor_parallel_size: 1
    gpu_memory_utilization: 0.8
  n_samples_per_prompt: 5
  batched: true
  sampling_params:
    max_generate_length: 1024

environment:
  env_class: countdown
  skyrl_gym:
    countdown:
      max_number: 50
      allow_negative: true
"""


def _line_of(text: str, needle: str) -> int:
    """1-based number of the only line containing `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _validate_json(path: Path) -> tuple[int, dict]:
    r = run_rlc("validate", "--format", "json", str(path))
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def _section_props(schema: dict, dotted: str) -> dict:
    """The `properties` of the section at `dotted`, following $refs from the root."""
    node = schema
    for part in dotted.split("."):
        prop = node["properties"][part]
        ref = prop.get("$ref") or next(b["$ref"] for b in prop["anyOf"] if "$ref" in b)
        node = schema["$defs"][ref.split("/")[-1]]
    return node["properties"]


def _enum_of(prop: dict) -> list:
    return next(b["enum"] for b in prop.get("anyOf", [prop]) if "enum" in b)


# -- through the installed CLI ----------------------------------------------------------------


@needs_demo
def test_cli_schema_has_the_extension():
    r = run_rlc("schema")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    alg = _section_props(schema, ALG)
    assert alg["demo_bonus_coef"]["description"] == "Coefficient of the demo bonus added to the policy loss."
    assert alg["demo_bonus_coef"]["default"] == 0.0
    assert {"type": "number", "minimum": 0} in alg["demo_bonus_coef"]["anyOf"]
    assert _enum_of(alg["demo_mode"]) == ["off", "on"]
    loss = _enum_of(alg["policy_loss_type"])
    assert "demo_loss" in loss and "regular" in loss
    countdown = _section_props(schema, COUNTDOWN)
    assert set(countdown) == {"max_number", "allow_negative", "num_operands"}
    assert countdown["max_number"]["default"] == 100
    assert countdown["allow_negative"]["default"] is False
    # the base keys are still there
    assert "kl_loss_coef" in alg
    assert "search" in _section_props(schema, "environment.skyrl_gym")


@needs_demo
def test_cli_validate_accepts_extension_keys(spec_file):
    path = spec_file(EXT_SPEC)
    r = run_rlc("validate", str(path))
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout
    code, out = _validate_json(path)
    assert code == 0 and out["ok"] is True and out["errors"] == 0


@needs_demo
def test_cli_validate_rejects_wrong_type_in_extension_field(spec_file):
    text = EXT_SPEC.replace("demo_bonus_coef: 0.5", "demo_bonus_coef: lots")
    path = spec_file(text)
    code, out = _validate_json(path)
    assert code == 1
    (d,) = out["diagnostics"]
    assert d["code"] == "RLC-E011"
    assert d["key"] == f"{ALG}.demo_bonus_coef"
    assert d["line"] == _line_of(text, "demo_bonus_coef:")
    assert d["values"]["value"] == "lots"
    r = run_rlc("validate", str(path))
    assert r.returncode == 1
    assert "error[RLC-E011]" in r.stderr
    assert f"{path}:{d['line']}:" in r.stderr


@needs_demo
def test_cli_validate_rejects_out_of_range_and_bad_value_in_extension(spec_file):
    text = EXT_SPEC.replace("demo_bonus_coef: 0.5", "demo_bonus_coef: -1").replace(
        'demo_mode: "on"', "demo_mode: sometimes"
    )
    code, out = _validate_json(spec_file(text))
    assert code == 1
    by_key = {d["key"]: d for d in out["diagnostics"]}
    assert by_key[f"{ALG}.demo_bonus_coef"]["code"] == "RLC-E013"
    assert by_key[f"{ALG}.demo_bonus_coef"]["line"] == _line_of(text, "demo_bonus_coef:")
    assert by_key[f"{ALG}.demo_mode"]["code"] == "RLC-E012"
    assert by_key[f"{ALG}.demo_mode"]["line"] == _line_of(text, "demo_mode:")


@needs_demo
def test_cli_validate_misspelt_extension_keys_get_did_you_mean(spec_file):
    text = EXT_SPEC.replace("max_number: 50", "max_numbr: 50").replace("demo_bonus_coef: 0.5", "demo_bonus_cof: 0.5")
    code, out = _validate_json(spec_file(text))
    assert code == 1
    assert {d["code"] for d in out["diagnostics"]} == {"RLC-E010"}
    by_key = {d["key"]: d for d in out["diagnostics"]}
    env = by_key[f"{COUNTDOWN}.max_numbr"]
    assert env["line"] == _line_of(text, "max_numbr:")
    assert env["hint"] == f"did you mean {COUNTDOWN}.max_number?"
    alg = by_key[f"{ALG}.demo_bonus_cof"]
    assert alg["line"] == _line_of(text, "demo_bonus_cof:")
    assert alg["hint"] == f"did you mean {ALG}.demo_bonus_coef?"


@needs_demo
def test_cli_validate_rejects_unknown_loss_with_extension_value_listed(spec_file):
    text = EXT_SPEC.replace("policy_loss_type: demo_loss", "policy_loss_type: demo_los")
    code, out = _validate_json(spec_file(text))
    assert code == 1
    (d,) = out["diagnostics"]
    assert d["code"] == "RLC-E012" and d["key"] == f"{ALG}.policy_loss_type"
    assert d["hint"] == "did you mean 'demo_loss'?"
    assert "demo_loss" in d["values"]["allowed"]


@needs_demo
def test_cli_base_example_still_valid_with_extension_installed():
    r = run_rlc("validate", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"))
    assert r.returncode == 0, r.stderr


@needs_demo
def test_cli_explain_extension_field():
    r = run_rlc("explain", f"{ALG}.demo_bonus_coef")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Coefficient of the demo bonus added to the policy loss." in out
    assert "type: float" in out
    assert "default: 0.0" in out
    assert "range: >= 0" in out
    assert "added by extension: demo" in out


@needs_demo
def test_cli_explain_extension_section_and_values():
    r = run_rlc("explain", COUNTDOWN)
    assert r.returncode == 0, r.stderr
    assert "type: section" in r.stdout
    assert "max_number" in r.stdout and "allow_negative" in r.stdout
    assert "added by extension: demo" in r.stdout
    r = run_rlc("explain", f"{ALG}.policy_loss_type")
    assert r.returncode == 0, r.stderr
    assert "demo_loss" in r.stdout
    r = run_rlc("explain", f"{ALG}.demo_bonus_cof")
    assert r.returncode == 2
    assert f"did you mean {ALG}.demo_bonus_coef" in r.stdout


# -- in process: SpecModel with Extensions built directly ---------------------------------------


@dataclass
class Knobs:
    """Knobs of a test algorithm."""

    bonus_coef: float = setting(0.0, "Bonus coefficient.", minimum=0)
    mode: str = setting("off", "Mode of the test algorithm.", enum=("off", "on"))


@dataclass
class PuzzleEnv:
    """puzzle environment (test extension)."""

    max_number: int = setting(100, "Largest number.", minimum=1)
    allow_negative: bool = setting(False, "Allow negative results.")
    seed: int | None = setting(None, "Puzzle seed.")


def _extensions() -> Extensions:
    ext = Extensions()
    ext.current = "unit"
    ext.add_fields(ALG, Knobs)
    ext.add_section("environment.skyrl_gym.puzzle", PuzzleEnv)
    ext.add_values(f"{ALG}.policy_loss_type", ["unit_loss"])
    ext.current = "<direct>"
    return ext


@pytest.fixture(scope="module")
def model() -> SpecModel:
    return SpecModel(_extensions())


def test_effective_classes_have_the_extension_fields(model):
    alg = model.lookup(ALG).section
    assert issubclass(alg, AlgorithmConfig) and alg is not AlgorithmConfig
    names = [f.name for f in dataclasses.fields(alg)]
    assert "bonus_coef" in names and "mode" in names and "kl_loss_coef" in names
    gym = model.lookup("environment.skyrl_gym").section
    assert issubclass(gym, SkyRLGymConfig) and "puzzle" in [f.name for f in dataclasses.fields(gym)]
    puzzle = model.lookup("environment.skyrl_gym.puzzle")
    assert puzzle.section is PuzzleEnv
    assert puzzle.doc == "puzzle environment (test extension)."
    coef = model.lookup(f"{ALG}.bonus_coef")
    assert coef.doc == "Bonus coefficient." and coef.tp is float and coef.default() == 0.0
    assert model.lookup("environment.skyrl_gym.puzzle.seed").optional
    # sections the extension does not touch keep their own classes
    assert model.lookup("trainer.policy").section.__name__ == "PolicyConfig"
    assert not hasattr(model.lookup("trainer.policy").section, "__rlc_path__")


def test_origin_and_allowed_values(model):
    assert model.extensions.origin[f"{ALG}.bonus_coef"] == "unit"
    assert model.extensions.origin["environment.skyrl_gym.puzzle"] == "unit"
    assert model.extensions.origin[f"{ALG}.policy_loss_type#values"] == "unit"
    values = model.allowed_values(model.lookup(f"{ALG}.policy_loss_type"))
    assert values[0] == "regular" and values[-1] == "unit_loss"
    assert model.allowed_values(model.lookup(f"{ALG}.mode")) == ("off", "on")


def test_to_typed_builds_extension_fields(model):
    data = {
        "version": 1,
        "trainer": {
            "algorithm": {"bonus_coef": 0.5, "mode": "on", "policy_loss_type": "unit_loss", "kl_loss_coef": 0.01}
        },
        "environment": {"skyrl_gym": {"puzzle": {"max_number": 50}, "max_env_workers": 4}},
    }
    typed = model.to_typed(data)
    alg = typed.trainer.algorithm
    assert isinstance(alg, AlgorithmConfig)
    assert (alg.bonus_coef, alg.mode, alg.policy_loss_type, alg.kl_loss_coef) == (0.5, "on", "unit_loss", 0.01)
    gym = typed.environment.skyrl_gym
    assert gym.max_env_workers == 4
    assert isinstance(gym.puzzle, PuzzleEnv)
    assert (gym.puzzle.max_number, gym.puzzle.allow_negative, gym.puzzle.seed) == (50, False, None)
    plain = to_plain(typed)
    assert plain["trainer"]["algorithm"]["bonus_coef"] == 0.5
    assert plain["environment"]["skyrl_gym"]["puzzle"] == {"max_number": 50, "allow_negative": False, "seed": None}


def test_defaults_apply(model):
    typed = model.to_typed({"version": 1})
    assert typed.trainer.algorithm.bonus_coef == 0.0
    assert typed.trainer.algorithm.mode == "off"
    assert typed.trainer.algorithm.policy_loss_type == "regular"
    assert typed.environment.skyrl_gym.puzzle == PuzzleEnv()
    # a section written partly keeps the defaults of the rest, and skipped (invalid) paths keep theirs
    typed = model.to_typed(
        {"trainer": {"algorithm": {"bonus_coef": "bad", "mode": "on"}}}, skip=frozenset({f"{ALG}.bonus_coef"})
    )
    assert typed.trainer.algorithm.bonus_coef == 0.0 and typed.trainer.algorithm.mode == "on"
    assert typed.trainer.algorithm.kl_loss_coef == AlgorithmConfig().kl_loss_coef


def test_schema_of_extended_model(model):
    schema = build_schema(model)
    alg = _section_props(schema, ALG)
    assert alg["bonus_coef"]["description"] == "Bonus coefficient."
    assert alg["bonus_coef"]["default"] == 0.0
    assert _enum_of(alg["mode"]) == ["off", "on"]
    assert _enum_of(alg["policy_loss_type"])[-1] == "unit_loss"
    assert set(_section_props(schema, "environment.skyrl_gym.puzzle")) == {"max_number", "allow_negative", "seed"}


def test_validation_in_process(model, spec_file):
    from rlc.compiler.pipeline import analyze

    good = spec_file(
        """
        version: 1
        trainer:
          algorithm:
            bonus_coef: 0.5
            policy_loss_type: unit_loss
        environment:
          skyrl_gym:
            puzzle:
              max_number: 7
        """,
        "good.yaml",
    )
    analysis = analyze(good, model=model)
    assert not [d for d in analysis.diagnostics if d.code.startswith("RLC-E01")], analysis.diagnostics
    assert analysis.spec.trainer.algorithm.bonus_coef == 0.5
    assert analysis.spec.environment.skyrl_gym.puzzle.max_number == 7
    bad = spec_file(
        """
        version: 1
        trainer:
          algorithm:
            bonus_coef: lots
        environment:
          skyrl_gym:
            puzzle:
              max_numbr: 7
        """,
        "bad.yaml",
    )
    diags = {d.key: d for d in analyze(bad, model=model).diagnostics}
    assert diags[f"{ALG}.bonus_coef"].code == "RLC-E011"
    assert diags[f"{ALG}.bonus_coef"].location.line == 4
    assert diags["environment.skyrl_gym.puzzle.max_numbr"].code == "RLC-E010"
    assert diags["environment.skyrl_gym.puzzle.max_numbr"].location.line == 8
    assert "max_number" in diags["environment.skyrl_gym.puzzle.max_numbr"].hint


def test_clash_with_existing_field_raises():
    @dataclass
    class Clash:
        kl_loss_coef: float = setting(0.1, "Clashes with the built-in field.")

    ext = Extensions()
    ext.add_fields(ALG, Clash)
    with pytest.raises(ExtensionError, match=r"trainer\.algorithm\.kl_loss_coef already exists"):
        SpecModel(ext)


def test_clash_with_existing_section_raises():
    ext = Extensions()
    ext.add_section("environment.skyrl_gym.search", PuzzleEnv)
    with pytest.raises(ExtensionError, match=r"environment\.skyrl_gym\.search already exists"):
        SpecModel(ext)


def test_clash_between_extensions_raises():
    @dataclass
    class Same:
        bonus_coef: float = setting(1.0, "The same name as Knobs.bonus_coef.")

    ext = Extensions()
    ext.add_fields(ALG, Knobs)
    ext.add_fields(ALG, Same)
    with pytest.raises(ExtensionError, match="bonus_coef"):
        SpecModel(ext)
    ext = Extensions()
    ext.add_section("environment.skyrl_gym.puzzle", PuzzleEnv)
    with pytest.raises(ExtensionError, match="registered twice"):
        ext.add_section("environment.skyrl_gym.puzzle", PuzzleEnv)


def test_non_dataclass_is_refused():
    class NotADataclass:
        x: int = 1

    with pytest.raises(ExtensionError, match="not a dataclass"):
        Extensions().add_fields(ALG, NotADataclass)
    with pytest.raises(ExtensionError, match="not a dataclass"):
        Extensions().add_section("environment.skyrl_gym.x", NotADataclass)


def test_base_model_is_unaffected(model):
    # building the extended model (the fixture) changed none of the v1 classes
    assert "bonus_coef" not in [f.name for f in dataclasses.fields(AlgorithmConfig)]
    assert "puzzle" not in [f.name for f in dataclasses.fields(SkyRLGymConfig)]
    base = SpecModel()
    assert base.extensions.is_empty()
    assert base.lookup(f"{ALG}.bonus_coef") is None
    assert base.lookup("environment.skyrl_gym.puzzle") is None
    assert base.lookup(ALG).section is AlgorithmConfig
    assert "unit_loss" not in base.allowed_values(base.lookup(f"{ALG}.policy_loss_type"))
    assert build_schema(base) == committed_schema()
    assert SpecModel(Extensions()).paths() == base.paths()


def test_field_types_are_the_evaluated_annotations(model):
    """Types written as objects (the spec's modules) are read as they stand, types written as text (this module's,
    under `from __future__ import annotations`) are evaluated: either way what typing.get_type_hints gives."""
    for path in model.paths():
        parent, _, name = path.rpartition(".")
        owner = model.lookup(parent).section if parent else model.root
        assert model.lookup(path).tp == typing.get_type_hints(owner)[name], path
    assert model.lookup("environment.skyrl_gym.puzzle.seed").tp == int | None  # written as text above
