"""A real editor against `rlc lsp`: Neovim, headless, with its built-in LSP client (tests/e2e/neovim_lsp.lua), shows
the findings `rlc validate` reports at the same places, and they follow an edit. `make test` installs Debian's
neovim where it can (the Makefile's editor-deps); elsewhere the test is skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, rlc_executable, run_rlc

NVIM = shutil.which("nvim")
SCRIPT = Path(__file__).with_name("neovim_lsp.lua")


@pytest.mark.skipif(NVIM is None, reason="Neovim (nvim) is not installed; `make editor-deps` installs it as root")
def test_neovim_shows_rlc_validates_findings_and_follows_an_edit(tmp_path):
    spec = tmp_path / "job.yaml"
    text = (EXAMPLES / "gsm8k-grpo-2node.yaml").read_text(encoding="utf-8")
    spec.write_text(text.replace("policy_mini_batch_size: 256", "policy_mini_batch_size: 300"), encoding="utf-8")
    lines = spec.read_text(encoding="utf-8").splitlines()
    out = tmp_path / "shown.json"
    env = {
        **os.environ,
        "HOME": str(tmp_path),  # no user's Neovim configuration
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "RLC_TEST_SPEC": str(spec),
        "RLC_TEST_RLC": rlc_executable(),
        "RLC_TEST_OUT": str(out),
        "RLC_TEST_FIX_LINE": str(lines.index("  policy_mini_batch_size: 300")),
        "RLC_TEST_FIX_TEXT": "  policy_mini_batch_size: 256",
    }
    assert NVIM is not None
    ran = subprocess.run(
        [NVIM, "--headless", "--clean", "-n", "-u", "NONE", "-c", f"luafile {SCRIPT}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.exists(), ran.stderr + ran.stdout
    seen = json.loads(out.read_text(encoding="utf-8"))

    report = json.loads(run_rlc("validate", "--format", "json", str(spec)).stdout)["diagnostics"]
    expected = sorted((d["line"] - 1, d["column"] - 1, d["code"], d["message"] + f"\nkey: {d['key']}") for d in report)
    opened = sorted((d["line"], d["col"], d["code"], d["message"]) for d in seen["opened"])
    assert opened == expected
    assert {d["source"] for d in seen["opened"]} == {"rlc"}
    assert seen["fixed"] == []  # the edit fixed what the three findings were about
