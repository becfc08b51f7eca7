"""Recipes: the seeds' lab setups as built-in experiments named `seed-*` (profiles/experiments/seed-*.toml).

A recipe reads its corpus (and maybe its tokenizer) from the Hugging Face Hub. Without network a study says so in
one line before any work, and gives the same shape on the built-in corpus, which needs none: the model and the
logits keep their shape (model.vocab_size is fixed in the recipe where the tokenizer comes from the Hub).
"""

from __future__ import annotations

from memlab.core.config import Experiment, builtin_names
from memlab.core.errors import ConfigError, MemlabError

PREFIX = "seed-"
OFFLINE_BPE = 8192  # the built-in corpus trains a BPE of this size in seconds (what gpt2s uses)


def recipe_names() -> list[str]:
    return [n for n in builtin_names("experiment") if n.startswith(PREFIX)]


def check_recipe(name: str) -> str:
    """The experiment a recipe name stands for; a one-line ConfigError naming the recipes for an unknown one."""
    names = recipe_names()
    if name not in names:
        raise ConfigError(f"unknown recipe {name!r}; recipes: {', '.join(names)}")
    return name


def hub_parts(experiment: Experiment) -> list[str]:
    """What of the experiment comes from the Hub: its corpus, its tokenizer."""
    return [x for x in (experiment.data.source, experiment.data.tokenizer) if x.startswith("hf:")]


def offline_tokenizer(experiment: Experiment) -> str:
    tok = experiment.data.tokenizer
    return tok if tok.startswith("bpe:") else f"bpe:{OFFLINE_BPE}"


def offline_suggestion(experiment: Experiment, study_args: str) -> str:
    return f"memlab study {study_args} --data stdlib --tokenizer {offline_tokenizer(experiment)}".replace("  ", " ")


def check_reachable(experiment: Experiment, study_args: str) -> None:
    """Refuse, in one line with the offline command, a study whose Hub corpus cannot be read here: the Hub does not
    answer and memlab's token cache does not hold the corpus already."""
    parts = hub_parts(experiment)
    if not parts or _tokens_cached(experiment):
        return
    from memlab.core.data import hub

    if not hub.is_offline():
        return
    raise MemlabError(
        f"{experiment.name} reads {' and '.join(parts)} from the Hugging Face Hub, and {hub.offline_reason()}; "
        f"the same shape on the built-in corpus, offline: {offline_suggestion(experiment, study_args)}"
    )


def _tokens_cached(experiment: Experiment) -> bool:
    try:
        from memlab.core.data import cache as cache_mod
        from memlab.core.data.tokens import cache_entry

        _, _, name = cache_entry(experiment.data)
        return cache_mod.read_meta(cache_mod.tokens_dir() / name) is not None
    except Exception:  # noqa: BLE001 (unknown: let the check ask the Hub)
        return False
