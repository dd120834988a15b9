"""The embedded tiny GLM-4: a small tokenizer built on the fly and a random-init model of GLM-4's layout (no download).

A byte-level BPE is trained in a second with the ``tokenizers`` library on text shipped with glm_port (the
English default corpus and the Chinese chat lines of the ChatGLM2 tiny model), split before merging by
GLM-4's own pattern (``PAT_STR``). Its merges are written as a tiktoken rank file the way GLM-4's is laid
out: the 256 single bytes first (rank = byte value), then each merged byte string in merge order. The
fourteen specials then take the ids after the ranks, as on the real vocabulary.

``build_tiny`` adds the model: GLM-4's layout (ChatGLM2's block, 2 key/value groups, ``rope_ratio`` 500) at
``config.TINY``'s width, its vocabulary exactly the tokenizer's, its end ids GLM-4's three
stops. Its weights are random: it talks nonsense, but every code path of the real model runs.
``write_directory`` saves a model and tokenizer as a GLM-4 directory, in THUDM's layout or transformers'.
"""

from __future__ import annotations

import os
import tempfile

from glm_port.models.glm4.tokenizer import PAT_STR, GLM4Tokenizer, token_bytes, write_rank_file

NAME = "glm4-tiny"

CHINESE = [
    "你好，我是人工智能助手。今天天气很好，我们去公园散步吧。",
    "问：中国的首都是哪里？答：北京。一年有春天、夏天、秋天和冬天。",
    "请帮我查询北京今天的天气。好的，我来调用工具。",
    "在调用上述函数时，请使用 Json 格式表示调用的参数。",
    "谢谢你的帮助。不客气，有问题随时问我。晚上好，明天见。",
]


def corpus_lines(limit: int = 400) -> list[str]:
    """The training text: glm_port's default corpus and ``CHINESE``."""
    from glm_port.data.corpus import DEFAULT_CORPUS

    text = DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in text if line.strip()][:limit] + CHINESE * 4


def train_ranks(lines, vocab_size: int = 1024) -> dict[bytes, int]:
    """Train a byte-level BPE of ``vocab_size`` tokens (at least the 256 bytes) on ``lines``; return its
    tiktoken ranks: bytes 0..255 first, then the merges' byte strings in merge order."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256:
        raise ValueError(f"a byte-level vocabulary has at least 256 tokens, not {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    ranks = {bytes([b]): b for b in range(256)}
    for left, right in _merges(tokenizer):
        merged = token_bytes(left) + token_bytes(right)
        if merged not in ranks:
            ranks[merged] = len(ranks)
    return ranks


def _merges(tokenizer) -> list[tuple[str, str]]:
    import json

    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def build_rank_file(directory: str | None = None, vocab_size: int = 1024) -> str:
    """Train the tiny ranks and write ``tokenizer.model`` into ``directory`` (a temporary one if None)."""
    directory = directory or tempfile.mkdtemp(prefix="glm4-tiny-")
    return write_rank_file(train_ranks(corpus_lines(), vocab_size), os.path.join(directory, "tokenizer.model"))


def build_tokenizer(directory: str | None = None, vocab_size: int = 1024) -> GLM4Tokenizer:
    """The tiny GLM-4 tokenizer: its rank file trained into ``directory`` (temporary if None), opened."""
    return GLM4Tokenizer(build_rank_file(directory, vocab_size))


def tiny_config(tokenizer: GLM4Tokenizer, **overrides):
    """GLM-4's layout at ``TINY``'s sizes: the vocabulary exactly ``len(tokenizer)`` (no padding rows: a random model
    would sample them, and they decode to nothing), generation ending at the tokenizer's stop ids, padding with
    ``<|endoftext|>``."""
    from glm_port.models.glm4.config import TINY, GLM4Config

    return GLM4Config(**{**TINY, "padded_vocab_size": len(tokenizer), "eos_token_id": list(tokenizer.stop_ids),
                         "pad_token_id": tokenizer.eos_token_id, **overrides})


def build_tiny(directory: str | None = None, seed: int = 0, chat_format: str | None = None, **overrides):
    """``(model, tokenizer)``: the embedded random-init GLM-4 (eval mode, fp32) and its tokenizer (rank file trained
    into ``directory``, a temporary one if None). ``chat_format``: None or "glm4" (GLM-4 has one format)."""
    import torch

    from glm_port.models.glm4.model import GLM4ForCausalLM

    if chat_format not in (None, "glm4"):
        raise ValueError(f"chat format {chat_format!r}: the glm4 family speaks GLM-4's only ('glm4')")
    tokenizer = build_tokenizer(directory)
    config = tiny_config(tokenizer, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GLM4ForCausalLM(config)
    return model.eval(), tokenizer


def write_directory(model, tokenizer, directory, layout: str = "thudm") -> str:
    """Save ``model`` and ``tokenizer`` as a GLM-4 directory: ``layout="thudm"`` as THUDM publishes glm-4-9b-chat
    (``model_type: chatglm``, THUDM's tensor names), ``"transformers"`` as transformers' ``GlmForCausalLM``
    (``model_type: glm``, its names; ``chatglm2.convert``'s mapping). The tokenizer's ``tokenizer.model`` and
    ``tokenizer_config.json`` go with either. Returns the directory."""
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if layout == "thudm":
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(directory)
    elif layout == "transformers":
        from glm_port.models.chatglm2.convert import to_glm_config, to_glm_plan

        class Source(dict):  # to_glm_plan's source: tensors by THUDM's names
            directory = "<memory>"

        glm = {name: read().contiguous() for name, read in to_glm_plan(model.config, Source(state))}
        save_file(glm, str(directory / "model.safetensors"), metadata={"format": "pt"})
        glm_config = to_glm_config(model.config)
        glm_config.architectures = ["GlmForCausalLM"]
        glm_config.save_pretrained(directory)
    else:
        raise ValueError(f"layout {layout!r}: expected 'thudm' or 'transformers'")
    tokenizer.save_pretrained(directory)
    return str(directory)


__all__ = ["CHINESE", "NAME", "build_rank_file", "build_tiny", "build_tokenizer", "corpus_lines", "tiny_config",
           "train_ranks", "write_directory"]
