"""The static reader of bash launch scripts (rlc.compiler.importers.shell): what it finds, and what it reports."""

from __future__ import annotations

from pathlib import Path

from rlc.compiler.importers.shell import (
    BRANCH,
    FROM_ENV,
    NEEDS_ENV,
    NO_LAUNCH,
    NOT_BASH,
    read_script,
)


def command(text: str, env: dict[str, str] | None = None, argv=(), name: str = "run.sh"):
    script = read_script(text, name, env=env, argv=argv)
    launch, diags = script.command()
    return launch, diags


def args(text: str, **kw) -> list[str]:
    launch, _ = command(text, **kw)
    assert launch is not None
    return [w.text for w in launch.args]


def test_defaults_assignments_arrays_and_arithmetic():
    text = """#!/bin/bash
set -xeuo pipefail
: "${GPUS:=8}"
NODES=${NODES:-2}
TP=${TP:-}
TP=${TP:-4}
export MODEL=Qwen/Qwen3-8B
OPTS=(a.b=1 "c.d=two words")
OPTS+=(e.f=$((GPUS * NODES / TP)))
python3 -m pkg.main \\
    model.path=$MODEL \\
    "${OPTS[@]}" \\
    n=${#OPTS[@]} "$@"
"""
    launch, diags = command(text, argv=["x.y=7"])
    assert launch is not None and launch.program == "pkg.main" and launch.module
    assert [w.text for w in launch.args] == [
        "model.path=Qwen/Qwen3-8B",
        "a.b=1",
        "c.d=two words",
        "e.f=4",
        "n=3",
        "x.y=7",
    ]
    assert diags == []
    # each word says where it was written: array elements at their own line, "$@" on the command line
    assert [(w.line, w.column) for w in launch.args] == [(11, 5), (8, 7), (8, 13), (9, 8), (13, 5), (0, 0)]
    assert launch.env["MODEL"] == "Qwen/Qwen3-8B"


def test_launchers_are_stripped():
    cases = {
        "uv run --isolated --extra fsdp --with 'x==1' -m skyrl.train.entrypoints.main_base a=1": (
            "skyrl.train.entrypoints.main_base",
            True,
        ),
        "torchrun --nproc_per_node=8 --nnodes 2 -m verl.trainer.sft_trainer a=1": ("verl.trainer.sft_trainer", True),
        "ray job submit --address=http://h:8265 --runtime-env-json='{}' -- python3 -u -m verl.trainer.main_ppo a=1": (
            "verl.trainer.main_ppo",
            True,
        ),
        'L=(uv run --frozen --extra vllm python3)\n"${L[@]}" -m verl.trainer.main_ppo a=1': (
            "verl.trainer.main_ppo",
            True,
        ),
        "CUDA_VISIBLE_DEVICES=0 nohup env A=1 python train.py a=1 2>&1 | tee log": ("train.py", False),
        'D=(uv run --with x -- python)\n"${D[@]}" -m m.main a=1': ("m.main", True),
    }
    for text, (program, module) in cases.items():
        launch, diags = command(text)
        assert launch is not None, text
        assert (launch.program, launch.module) == (program, module), text
        assert [w.text for w in launch.args] == ["a=1"], text
        assert diags == [], text


def test_if_and_case_on_known_values():
    text = """
ENGINE=${ENGINE:-megatron}
case "$ENGINE" in
  fsdp|dp) E=(actor.strategy=fsdp2) ;;
  megatron) E=(model_engine=megatron) ;;
  *) echo unknown; exit 1 ;;
esac
if [ "$ENGINE" = megatron ] && [[ -n "$ENGINE" ]]; then
  E+=(actor.megatron.tp=2)
elif [ -z "$ENGINE" ]; then
  E+=(never)
else
  E+=(never.either)
fi
[ "$ENGINE" != fsdp ] && E+=(and=1) || E+=(or=1)
python3 -m verl.trainer.main_ppo "${E[@]}"
"""
    assert args(text) == ["model_engine=megatron", "actor.megatron.tp=2", "and=1"]
    assert args(text, env={"ENGINE": "dp"}) == ["actor.strategy=fsdp2", "never.either", "and=1"]
    launch, diags = command(text, env={"ENGINE": "other"})
    assert launch is None and [d.code for d in diags] == [NO_LAUNCH]
    assert "exits at line 6" in diags[0].message


def test_command_output_needs_env():
    text = """
RUN_ID=$(date +%s)
NAME=run-$RUN_ID
python3 -m m.main trainer.run_name=$NAME
"""
    launch, diags = command(text)
    assert launch is not None and launch.args[0].text == "trainer.run_name=run-$(date +%s)"
    assert [(d.code, d.severity, d.location.line) for d in diags] == [(NEEDS_ENV, "error", 4)]
    assert "RUN_ID" in diags[0].message and "line 2" in diags[0].message
    assert diags[0].hint == "pass --env RUN_ID=VALUE"
    # --env gives the value the script would compute
    assert args(text, env={"RUN_ID": "7"}) == ["trainer.run_name=run-7"]


def test_required_and_environment_variables():
    text = """
: "${SYNC_DIR:?set SYNC_DIR to a bucket}"
python3 -m m.main a=$SYNC_DIR b=$HOME/data c=${UNSET:-d}
"""
    launch, diags = command(text)
    assert launch is not None
    assert [(d.code, d.location.line) for d in diags] == [(NEEDS_ENV, 2), (FROM_ENV, 3)]
    assert "set SYNC_DIR to a bucket" in diags[0].message
    home = launch.args[1]
    assert home.render(lambda u: "${oc.env:" + u.name + "}") == "b=${oc.env:HOME}/data"
    assert launch.args[2].text == "c=d"
    assert args(text, env={"SYNC_DIR": "gs://b", "HOME": "/h"}) == ["a=gs://b", "b=/h/data", "c=d"]


def test_unknown_branch_is_read_both_ways():
    text = """
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
if [ "$DEVICE" = npu ]; then
  N=16; SAME=1
else
  N=8; SAME=1
fi
python3 -m m.main n=$N same=$SAME
"""
    launch, diags = command(text)
    assert launch is not None and launch.args[1].text == "same=1"
    assert [d.code for d in diags] == [BRANCH]
    assert "N is set differently by the branches of line 3" in diags[0].message
    assert "DEVICE" in diags[0].message and diags[0].hint.startswith("pass --env DEVICE=")
    assert args(text, env={"DEVICE": "gpu"}) == ["n=8", "same=1"]


def test_wrapper_script_is_followed(tmp_path: Path):
    (tmp_path / "base.sh").write_text('python3 -m m.main a=1 "$@"\n')
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text('DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\nbash "$DIR/base.sh" b=2 "$@"\n')
    script = read_script(wrapper, argv=["c=3"])
    launch, diags = script.command()
    assert launch is not None and [w.text for w in launch.args] == ["a=1", "b=2", "c=3"]
    assert [w.line for w in launch.args] == [1, 2, 0] and launch.args[0].file.endswith("base.sh")
    assert diags == []


def test_bad_input_is_a_diagnostic(tmp_path: Path):
    binary = tmp_path / "x.sh"
    binary.write_bytes(b"\x7fELF\x00\x01")
    huge = tmp_path / "huge.sh"
    huge.write_bytes(b"# " + b"x" * (1 << 21))
    for source in (binary, huge, tmp_path / "missing.sh", tmp_path):
        launch, diags = read_script(source).command()
        assert launch is None and diags[0].code == NOT_BASH, source
    launch, diags = command("version: 1\ntrainer: {epochs: 2}\n")
    assert launch is None and diags[-1].code == NO_LAUNCH
    launch, diags = command("if then fi ((( python3 -m m a=1\n")
    assert any(d.code == NOT_BASH for d in diags)
    # a loop that never ends is cut off, not run forever
    launch, diags = command("f() { f; }\nf\nfor i in 1 2; do for j in $(seq 9); do :; done; done\n")
    assert launch is None


def test_never_executes(tmp_path: Path):
    marker = tmp_path / "ran"
    text = f"""
X=$(touch {marker})
touch {marker}
`touch {marker}`
python3 -m m.main a=$(touch {marker})
"""
    launch, _ = command(text)
    assert launch is not None and not marker.exists()


def test_constructs_verl_scripts_use():
    text = """
Q=${Q:-}
if [ -n "${Q}" ] && [ "${B:-vllm}" != trtllm ]; then
  exit 1
fi
N=$((2 * 4))
if (( N % 3 != 0 )); then M=odd; else M=even; fi
ROOT=$(cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." >/dev/null 2>&1 && pwd)
MODULES='{a.\\{*\\}:{},'\\
'b:{}}'
python3 -m verl.trainer.main_ppo m=$M p=$ROOT/x.py "apply=${MODULES}"
"""
    assert args(text, name="examples/t/run.sh") == ["m=odd", "p=./x.py", "apply={a.\\{*\\}:{},b:{}}"]
