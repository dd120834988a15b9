"""A small GLM-4-shaped tokenizer built on the fly, for tests and the embedded default (no download).

A byte-level BPE is trained in a second with the ``tokenizers`` library on text shipped with glm_port (the
English default corpus and the Chinese chat lines of the ChatGLM2 tiny model), split before merging by
GLM-4's own pattern (``PAT_STR``). Its merges are written as a tiktoken rank file the way GLM-4's is laid
out: the 256 single bytes first (rank = byte value), then each merged byte string in merge order. The
fourteen specials then take the ids after the ranks, as on the real vocabulary.
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


__all__ = ["CHINESE", "NAME", "build_rank_file", "build_tokenizer", "corpus_lines", "train_ranks"]
