"""A run's prompts: the training and validation rows (a missing dataset written first), each with its prompt's token
ids, the environments they name checked, the prompts longer than the limit left out."""

from __future__ import annotations

from rlc.core.environments import WRITERS
from rlc.core.job import DataSettings
from rlc.core.runtime_facts import runs_model_code
from rlc.runtime.chat import ChatTemplateError, Templater, custom_template
from rlc.runtime.data import DataError, read_rows, write_dataset
from rlc.runtime.envs import sandbox
from rlc.runtime.envs.gym import registered
from rlc.runtime.paths import expand
from rlc.runtime.run_error import RunError

Rows = list[tuple[dict, list[int]]]  # (dataset row, prompt token ids)


class Prompts:
    """The rows of `settings.train_data` and `settings.val_data`, tokenized through the chat template it names."""

    def __init__(self, settings: DataSettings, tokenizer) -> None:
        self.settings = settings
        try:
            template = custom_template(settings.chat_template_source, settings.chat_template)
        except ChatTemplateError as exc:
            raise RunError(str(exc)) from None
        self.templater = Templater(tokenizer, template, settings.chat_template_kwargs)

    def train(self) -> Rows:
        return self.rows(list(self.settings.train_data))

    def validation(self) -> Rows:
        """The validation rows; none for a run that never evaluates (its settings name no files)."""
        return self.rows(list(self.settings.val_data)) if self.settings.val_data else []

    def rows(self, paths: list[str]) -> Rows:
        env_class = self.settings.env_class
        writer = WRITERS.get(env_class)
        if writer is not None and paths and not all(expand(p).exists() for p in paths):
            directory = expand(paths[0]).parent
            write_dataset(writer, directory, seed=self.settings.seed if writer.run_seed else 0)
            print(f"rlc: wrote the {writer.title} dataset to {directory}", flush=True)
        try:
            rows = read_rows(paths)
        except DataError as exc:
            raise RunError(str(exc)) from None
        known = set(registered())
        unknown = sorted({r.get("env_class") or env_class for r in rows} - known)
        if unknown:
            raise RunError(
                f"{paths} name the environment(s) {', '.join(unknown)}, which no installed package registers "
                f"(there are {', '.join(sorted(known))})"
            )
        refuse_unsandboxed({r.get("env_class") or env_class for r in rows}, paths, self.settings.isolation)
        limit = self.settings.max_prompt_length
        kept = []
        for row in rows:
            ids = self.templater.prompt_ids(row["prompt"])
            if len(ids) <= limit:
                kept.append((row, ids))
        if rows and not kept:
            raise RunError(f"every prompt of {paths} is longer than trainer.max_prompt_length={limit} tokens")
        return kept


def refuse_unsandboxed(env_classes: set[str], paths: list[str], level: str) -> None:
    """Refuse, before training, rows that name an environment running model-written code at a level this machine
    cannot give (the default environment was checked at start)."""
    coders = sorted(e for e in env_classes if runs_model_code(e))
    if coders and not sandbox.probe().available(level):
        raise RunError(
            f"{paths} name the environment(s) {', '.join(coders)}, which run model-written code, and "
            f"environment.sandbox.isolation: {level} cannot be had on this machine: {sandbox.probe().reason}"
        )
