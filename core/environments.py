"""The built-in environments, one entry each: the table that skyrl-gym registration (`rlc.runtime.envs.gym`), the
compiler's environment facts (`core.runtime_facts`), the driver's on-the-fly datasets and `rlc data`'s commands all
derive from. A new built-in environment is a class in `runtime/envs/` and one entry in `ENVIRONMENTS`.

The table is plain data in core rather than classes in the runtime because both sides read it: the compiler checks
an `env_class` and builds `rlc data`'s commands from it without importing the runtime (skyrl-gym, pandas, pyarrow),
and the runtime needs of each class, writer and scorer only its import path, "module:attribute", the form
skyrl-gym's registry takes anyway. So there is one list, and no second one to hold equal to it by a test.
"""

from __future__ import annotations

from rlc.core.dataclass import dataclass


@dataclass(frozen=True)
class Rows:
    """A split's row count in `rlc data ID`: its default and the most it takes (None: no bound)."""

    default: int
    most: int | None = None


@dataclass(frozen=True)
class Option:
    """An option of one `rlc data ID` beyond the splits and the seed, handed to the writer as `keyword`."""

    flags: tuple[str, ...]
    keyword: str
    default: int | str
    help: str
    least: int | None = None  # an integer option's range
    most: int | None = None
    choices: tuple[str, ...] = ()  # a choice option's values
    names_directory: bool = False  # a value but the default writes to the default directory with "-VALUE" added


@dataclass(frozen=True)
class Writer:
    """How rlc writes an environment's dataset (train.parquet, validation.parquet): by `rlc data ID`, and by `rlc run`
    when the spec's data files do not exist yet."""

    function: str  # "module:function", called (out_dir, train, validation, seed, **options) -> the files written
    summary: str  # the command's help
    title: str  # `rlc run` says "wrote the TITLE dataset"
    train: Rows
    validation: Rows
    validation_flags: tuple[str, ...] = ("--validation",)
    options: tuple[Option, ...] = ()
    run_seed: bool = False  # `rlc run` writes it with the run's seed; else with 0 (every seed sees the same problems)


@dataclass(frozen=True)
class Environment:
    id: str  # environment.env_class, a row's env_class
    entry_point: str  # the class, "module:Class", registered with skyrl-gym under `id`
    skyrl_gym: bool  # the id is skyrl-gym's (rlc may register a class of its own under it); else rlc's
    multi_turn: bool  # a trajectory may take several turns (tool calls, retries)
    runs_model_code: bool  # it runs what the model wrote: in the sandbox (rlc.runtime.envs.sandbox)
    description: str
    # Its reward takes two values, right or wrong (1 or 0; aime's 1 or -1), as its scorer's code gives it: a group's
    # rewards are then all equal with a chance the time estimate counts (compiler/estimate.py, `inert`). Graded:
    # gsm8k_multi_turn (a format score each turn), synthetic (a quarter for the digit first), llm_as_a_judge.
    right_or_wrong: bool = False
    writer: Writer | None = None  # rlc can write its dataset
    scorer: str | None = None  # rlc's scorer of one completion, "module:Class", which the class steps


# The word-problem datasets' splits (arithmetic, calculator), and their validation flags.
_PROBLEMS, _HELD_OUT, _HELD_OUT_FLAGS = Rows(2000, 200_000), Rows(128, 100_000), ("--validation", "--val")

# skyrl-gym's ids first, then rlc's, each in the order `rlc explain environment.env_class` names them.
ENVIRONMENTS: tuple[Environment, ...] = (
    Environment(
        "gsm8k",
        "skyrl_gym.envs.gsm8k.env:GSM8kEnv",
        skyrl_gym=True,
        multi_turn=False,
        runs_model_code=False,
        description="GSM8K math word problems, the answer after ####",
        right_or_wrong=True,
    ),
    Environment(
        "gsm8k_multi_turn",
        "skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv",
        skyrl_gym=True,
        multi_turn=True,
        runs_model_code=False,
        description="GSM8K with further tries until the answer is right or the turns run out",
    ),
    Environment(
        "text2sql",
        "rlc.runtime.envs.sql:SandboxedSQLEnv",
        skyrl_gym=True,
        multi_turn=True,
        runs_model_code=True,
        description="SQL questions over a database, the model's queries run in the sandbox",
        right_or_wrong=True,
    ),
    Environment(
        "search",
        "skyrl_gym.envs.search.env:SearchEnv",
        skyrl_gym=True,
        multi_turn=True,
        runs_model_code=False,
        description="questions answered with a retrieval server's search tool",
        right_or_wrong=True,
    ),
    Environment(
        "lcb",
        "rlc.runtime.envs.code:SandboxedLCBEnv",
        skyrl_gym=True,
        multi_turn=False,
        runs_model_code=True,
        description="LiveCodeBench problems, the model's program run against each test case in the sandbox",
        right_or_wrong=True,
    ),
    Environment(
        "aime",
        "skyrl_gym.envs.aime.env:AIMEEnv",
        skyrl_gym=True,
        multi_turn=False,
        runs_model_code=False,
        description="AIME problems, the boxed answer",
        right_or_wrong=True,
    ),
    Environment(
        "searchcode",
        "rlc.runtime.envs.code:SandboxedSearchCodeEnv",
        skyrl_gym=True,
        multi_turn=True,
        runs_model_code=True,
        description="questions answered with search and a python tool, the python run in the sandbox",
        right_or_wrong=True,
    ),
    Environment(
        "synthetic",
        "rlc.runtime.envs.gym:SyntheticEnv",
        skyrl_gym=False,
        multi_turn=False,
        runs_model_code=False,
        description="copy the digit: a task a tiny model learns by RL alone in minutes",
        writer=Writer(
            "rlc.runtime.data:synthetic",
            "The copy-the-digit task of `env_class: synthetic`.",
            "synthetic copy-the-digit",
            train=Rows(3200),
            validation=Rows(64),
            run_seed=True,
        ),
        scorer="rlc.runtime.envs.synthetic:CopyDigit",
    ),
    Environment(
        "arithmetic",
        "rlc.runtime.envs.gym:ArithmeticEnv",
        skyrl_gym=False,
        multi_turn=False,
        runs_model_code=False,
        description="addition and subtraction word problems, the final number",
        right_or_wrong=True,
        writer=Writer(
            "rlc.runtime.data:arithmetic",
            "Addition / subtraction word problems of `env_class: arithmetic` (held-out validation questions).",
            "arithmetic",
            train=_PROBLEMS,
            validation=_HELD_OUT,
            validation_flags=_HELD_OUT_FLAGS,
            options=(
                Option(("--max-number",), "high", 20, "Largest operand.", least=3, most=10_000),
                Option(
                    ("--format",),
                    "fmt",
                    "rlc",
                    "rlc's rows, or verl's GSM8K rows (data_source, prompt, reward_model, extra_info) for an imported "
                    "verl job; verl's go to ~/.cache/rlc/data/arithmetic-verl unless -o says otherwise.",
                    choices=("rlc", "verl"),
                    names_directory=True,
                ),
            ),
        ),
        scorer="rlc.runtime.envs.arithmetic:Arithmetic",
    ),
    Environment(
        "calculator",
        "rlc.runtime.envs.calculator:CalculatorEnv",
        skyrl_gym=False,
        multi_turn=True,
        runs_model_code=False,
        description="multiplication word problems answered through a calculator tool",
        right_or_wrong=True,
        writer=Writer(
            "rlc.runtime.data:calculator",
            "Multiplication word problems of `env_class: calculator`, answered over several turns with a calculator "
            "tool (held-out validation questions).",
            "calculator",
            train=_PROBLEMS,
            validation=_HELD_OUT,
            validation_flags=_HELD_OUT_FLAGS,
        ),
    ),
    Environment(
        "llm_as_a_judge",
        "rlc.runtime.envs.judge:LLMJudgeEnv",
        skyrl_gym=False,
        multi_turn=False,
        runs_model_code=False,
        description="GSM8K answers graded by another model behind an OpenAI-compatible API (SkyRL's example)",
    ),
    Environment(
        "verl",
        "rlc.runtime.envs.verl:VerlEnv",
        skyrl_gym=False,
        multi_turn=False,
        runs_model_code=False,
        description="a verl dataset scored as verl's default reward scores its data source",
        right_or_wrong=True,
    ),
    Environment(
        "reward_function",
        "rlc.runtime.envs.reward_function:RewardFunctionEnv",
        skyrl_gym=False,
        multi_turn=False,
        runs_model_code=False,
        description="verl's rows scored by your own compute_score (environment.skyrl_gym.reward_function)",
    ),
)

BY_ID = {env.id: env for env in ENVIRONMENTS}
WRITERS = {env.id: env.writer for env in ENVIRONMENTS if env.writer is not None}
