"""Models written on shim (one folder per family under ``glm_port.models``) and the commands that use them.

Shared pieces sit beside the families: ``training`` (optimizer, schedule, precision, step),
``checkpoint_io`` (saving and loading), ``distributed`` (ranks and groups), ``data`` (tokenizers and
blank-infilling data); ``pretrain_glm`` is ``glm-pretrain``, ``generation`` is ``glm-generate``.

GLM's classes import on first use (``from glm_port import GLMConfig`` imports GLM's config then), so that
importing a command's module (its ``--help``) pays for neither torch nor transformers.
``GLMForConditionalGeneration`` and ``GLMTokenizer`` are for inference (transformers' models, generation and
tokenizers); ``GLMConfig`` is a transformers ``PretrainedConfig``.

This public re-export of GLM's classes is the one place outside ``glm_port.models`` that names a family's
modules (allowed by name in ``tests/test_architecture.py``); the commands reach every family through the
registry's contract (``glm_port.models``; docs/architecture.md, "The family contract").
"""

__all__ = ["GLMConfig", "GLMModel", "GLMForConditionalGeneration", "GLMTokenizer"]

_LAZY = {
    "GLMConfig": "glm_port.models.glm.config",
    "GLMModel": "glm_port.models.glm.model",
    "GLMForConditionalGeneration": "glm_port.models.glm.hf",
    "GLMPretrainedConfig": "glm_port.models.glm.hf",  # GLMConfig's name before issue 27 (a DeprecationWarning)
    "GLMTokenizer": "glm_port.models.glm.tokenizer",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glm_port' has no attribute {name!r}")
