"""verl's own launch scripts (its examples at main and at v0.4.1, tests/fixtures/verl) import: each one becomes a
spec that validates, or is refused for a reason named in verl's terms; none meets an internal error."""

from __future__ import annotations

import pytest
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.load import document_from_text
from rlc.compiler.pipeline import analyze_document
from verl_examples import extract

# What a user passes with --env: the device probe's answer, and what the scripts compute with `$(date ...)`.
ENV = {"HOME": "/home/user", "PWD": "/work", "DEVICE": "gpu", "NOW": "20260101", "EXPERIMENT_NAME": "run"}


# How many scripts of each set import and validate (the others are refused, each for its reason).
IMPORTED = {"main": 45, "v0.4.1": 41}


@pytest.fixture(scope="module", params=sorted(IMPORTED))
def outcomes(request, tmp_path_factory) -> tuple[str, dict[str, str]]:
    root = tmp_path_factory.mktemp(f"verl-{request.param}")
    extract(request.param, root)
    found: dict[str, str] = {}
    for script in sorted(root.rglob("*.sh")):
        name = str(script.relative_to(root))
        try:
            imported, errors, _ = import_script(str(script), ENV, [])
        except NotImportable as exc:
            found[name] = f"refused: {exc}"
            continue
        if imported is None:  # a value only running the script gives: named, with the --env that fixes it
            found[name] = "refused: " + "; ".join(f"{d.code} {d.message} ({d.hint})" for d in errors)
            continue
        analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
        errors = [f"{d.code} {d.message}" for d in analysis.diagnostics if d.severity == "error"]
        found[name] = f"invalid: {errors}" if errors else "ok"
    return request.param, found


def test_every_script_imports_and_validates_or_is_refused_by_name(outcomes):
    release, found = outcomes
    assert not [f"{k}: {v}" for k, v in found.items() if v.startswith("invalid")]
    assert sum(v == "ok" for v in found.values()) == IMPORTED[release]
    for name, outcome in found.items():
        assert outcome == "ok" or len(outcome) > len("refused: ") + 20, name


def test_what_rlc_cannot_run_is_refused_in_verls_terms(outcomes):
    _, found = outcomes
    for words in ("supervised fine-tuning (SFT)", "Ascend NPUs", "vision-language data", "generation only"):
        assert any(words in v for v in found.values()), words
    sft = {k: v for k, v in found.items() if "/sft/" in k}
    assert sft and all("supervised fine-tuning (SFT)" in v or "mlite" in v for v in sft.values()), sft
