"""Which directories are GLM-4's (``Family.detect`` of the glm4 family, consulted before ``model_type``).

THUDM's GLM-4 directories say ``model_type: chatglm``, as ChatGLM2's and ChatGLM3's do; transformers' native
``GlmForCausalLM`` directories (glm-4-9b-chat-hf) say ``glm``, as THUDM's original GLM-10b does. The files
tell them apart: GLM-4's ``tokenizer.model`` is a tiktoken rank file (ChatGLM2's is a sentencepiece model),
its ``tokenizer_config.json`` names ``ChatGLM4Tokenizer`` (or glm_port's ``GLM4Tokenizer``), a
``tokenizer.json`` holds GLM-4's ``<sop>`` / ``<|endoftext|>`` specials, or the vocabulary is GLM-4's 151552; and
what glm_port itself writes for a GLM-4 names ``GLM4ForCausalLM`` in ``architectures`` (its tensor-parallel shards'
config too, so they are GLM-4's with no tokenizer beside them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

GLM4_VOCAB = 151552
ARCHITECTURE = "GLM4ForCausalLM"  # what glm_port writes as a GLM-4's architectures (config.json, shards' configs)
TOKENIZER_CLASSES = ("ChatGLM4Tokenizer", "GLM4Tokenizer")
_RANK_LINE = re.compile(rb"^[A-Za-z0-9+/]+={0,2} \d+\r?\n?$")


def is_rank_file(path) -> bool:
    """Whether ``path`` starts like a tiktoken rank file (``base64 rank`` lines), not a sentencepiece model."""
    try:
        with open(path, "rb") as f:
            lines = [f.readline(256) for _ in range(2)]
    except OSError:
        return False
    return bool(lines[0]) and all(_RANK_LINE.match(line) for line in lines if line)


def is_transformers_glm(config: dict) -> bool:
    """A ``config.json`` of transformers' ``GlmForCausalLM`` (not THUDM's GLM-10b, also model_type "glm")."""
    if config.get("model_type") != "glm":
        return False
    return "GlmForCausalLM" in (config.get("architectures") or []) or (
        "num_key_value_heads" in config and "intermediate_size" in config)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def tokenizer_says_glm4(directory) -> bool | None:
    """True when the tokenizer files are GLM-4's, False when they are another's (a sentencepiece model), None
    when there are none to tell."""
    directory = Path(directory)
    model = directory / "tokenizer.model"
    if model.is_file():
        return is_rank_file(model)
    if _json(directory / "tokenizer_config.json").get("tokenizer_class") in TOKENIZER_CLASSES:
        return True
    fast = directory / "tokenizer.json"
    if fast.is_file():
        added = [t.get("content") for t in _json(fast).get("added_tokens") or [] if isinstance(t, dict)]
        return "<sop>" in added and "<|endoftext|>" in added
    return None


def is_glm4(directory, config: dict) -> bool:
    """Whether the model directory (its parsed ``config.json``: ``config``) is GLM-4's. A ``chatglm`` config naming
    ``GLM4ForCausalLM`` in its ``architectures`` is (glm_port writes that for GLM-4 only: glm-merge's, glm-export's
    and glm-finetune's directories, and the config glm-finetune's tensor-parallel shards carry); other ``chatglm``
    configs (THUDM's say ``ChatGLMModel`` for GLM-4 and ChatGLM2 alike) are told by their tokenizer files, or,
    with none, by the vocabulary."""
    architectures = config.get("architectures")
    if config.get("model_type") == "chatglm" and isinstance(architectures, list) and ARCHITECTURE in architectures:
        return True
    if config.get("model_type") == "chatglm":
        vocab = config.get("padded_vocab_size")
    elif is_transformers_glm(config):
        vocab = config.get("vocab_size")
    else:
        return False
    says = tokenizer_says_glm4(directory)
    return says if says is not None else vocab == GLM4_VOCAB


__all__ = ["ARCHITECTURE", "GLM4_VOCAB", "TOKENIZER_CLASSES", "is_glm4", "is_rank_file", "is_transformers_glm",
           "tokenizer_says_glm4"]
