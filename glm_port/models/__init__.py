"""Model families: one folder each (``glm/``, ...), found by the family name a ``config.json`` carries.

A family registers its config class and model class here. Shared pieces (training loop, checkpoint I/O,
generation, finetuning) take any registered family; nothing here imports a family until it is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    module: str  # the family's package; it exports ``config_class`` and ``model_class`` by these names
    config_class: str
    model_class: str
    model_types: tuple[str, ...]  # the ``model_type`` values of config.json files this family reads
    # Module with ``load(path, ...) -> (model, tokenizer)`` and ``generate(model, tokenizer, prompts, ...)``,
    # what glm-generate drives (glm_port.generation); None: the family does not generate.
    generation: str | None = None

    def load(self, attribute: str):
        return getattr(importlib.import_module(self.module), attribute)


FAMILIES: dict[str, Family] = {
    "glm": Family("glm", "glm_port.models.glm", "GLMConfig", "GLMModel", ("glm",),
                  generation="glm_port.models.glm.generation"),
    "chatglm2": Family("chatglm2", "glm_port.models.chatglm2", "ChatGLM2Config", "ChatGLM2ForCausalLM", ("chatglm",),
                       generation="glm_port.models.chatglm2.generation"),
}


class UnknownFamily(ValueError):
    """A config.json whose model type no family here reads."""


def family_for(model_type: str | None) -> Family:
    """The family that reads configs of ``model_type`` (a ``config.json``'s ``model_type``)."""
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    known = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
    raise UnknownFamily(f"unknown model family {model_type!r} in config.json; this version reads: {known}")


def register(family: Family) -> None:
    FAMILIES[family.name] = family
