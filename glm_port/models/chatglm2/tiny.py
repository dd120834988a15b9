"""The embedded default: a small random-init ChatGLM2-shaped model and a tokenizer built on the fly.

``glm-chat`` with no ``--model`` (and tests) run on it with no downloads: a sentencepiece model is trained
in a second on text shipped with glm_port (the English default corpus and the chat prompt's Chinese
words), numbered as ChatGLM2's (unk/pad 0, bos 1, eos 2, the five specials right after the pieces),
and the model has ChatGLM2-6B's layout (multi-query attention in 2 groups, rotary on half of each head,
SwiGLU, RMSNorm, bias on QKV only) at a width that runs instantly. Its weights are random: it talks
nonsense, but every code path of the real model runs.
"""

from __future__ import annotations

import os
import tempfile

from glm_port.models.chatglm2.config import TINY, ChatGLM2Config
from glm_port.models.chatglm2.tokenizer import SPECIAL_TOKENS, ChatGLM2Tokenizer, build_prompt, train_sentencepiece

NAME = "chatglm2-tiny"

_CHINESE = [
    "你好，我是一个语言模型。今天天气很好，我们去公园散步吧。",
    "问：中国的首都是哪里？答：北京。",
    "问：一年有几个季节？答：春天、夏天、秋天和冬天。",
    "谢谢你的帮助。不客气，有问题随时问我。",
    "这件衣服的颜色很漂亮，款式简单大方，适合日常穿着。",
    "类型#裙*颜色#蓝色*风格#清新*图案#条纹",
    "晚上好，明天见。请问你叫什么名字？",
]


def corpus_lines(limit: int = 400) -> list[str]:
    from glm_port.data.corpus import DEFAULT_CORPUS

    text = DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines()
    lines = [line for line in text if line.strip()][:limit]
    prompts = [build_prompt(q, [("你好", "你好！")]) for q in _CHINESE]
    return lines + _CHINESE * 4 + prompts


def build_tokenizer(directory: str | None = None, vocab_size: int = 1000, chat_format: str = "chatglm2") -> ChatGLM2Tokenizer:
    """Train the tiny sentencepiece model into ``directory`` (a temporary one if None) and open it
    (``chat_format="chatglm3"``: with ChatGLM3's four role tokens after the five specials)."""
    directory = directory or tempfile.mkdtemp(prefix="chatglm2-tiny-")
    path = train_sentencepiece(corpus_lines(), os.path.join(directory, "tokenizer"), vocab_size=vocab_size)
    return ChatGLM2Tokenizer(path, chat_format=chat_format)


def tiny_config(tokenizer: ChatGLM2Tokenizer, **overrides) -> ChatGLM2Config:
    """ChatGLM2-6B's layout at TINY's sizes, its vocabulary the tokenizer's padded up to a multiple of 64."""
    vocab = -(-tokenizer.vocab_size // 64) * 64
    return ChatGLM2Config(**{**TINY, "padded_vocab_size": vocab, **overrides})


def build_tiny(directory: str | None = None, seed: int = 0, chat_format: str = "chatglm2", **overrides):
    """``(model, tokenizer)``: the embedded random-init model (eval mode, fp32) and its tokenizer; ChatGLM2's
    chat format unless ``chat_format="chatglm3"``."""
    import torch

    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    tokenizer = build_tokenizer(directory, chat_format=chat_format)
    config = tiny_config(tokenizer, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ChatGLM2ForCausalLM(config)
    return model.eval(), tokenizer


__all__ = ["NAME", "SPECIAL_TOKENS", "build_tiny", "build_tokenizer", "corpus_lines", "tiny_config"]
