"""ChatGLM2's ``conversation`` binding (``glm_port.models.contract.ConversationBinding``): what ``glm-chat``
takes from the family. The chat itself is ``chat.py`` (``stream_chat``, THUDM's); the chat formats are the
tokenizer's (``tokenizer.py``); this module adds the loader, with glm-chat's checks, and gathers the names."""

from __future__ import annotations

from glm_port.models.chatglm2.chat import DEFAULTS, PromptTooLong, chat_format, is_chatglm3, stream_chat
from glm_port.models.chatglm2.tokenizer import CHAT_FORMATS, ROLE_TOKENS, detect_chat_format
from glm_port.models.chatglm2.weights import (WeightsError, check_directory, check_quantize, load_pretrained,
                                              load_tokenizer)


def accepts_system(tokenizer) -> bool:
    """Whether the chat format has a system message (ChatGLM3's role tokens; ChatGLM2's prompt has none)."""
    return is_chatglm3(tokenizer)


def load(directory, *, device="cpu", dtype=None, chat_format=None, ptuning_checkpoint=None):
    """``(model, tokenizer)`` from a ChatGLM2/ChatGLM3 directory (THUDM's, glm-convert's, glm-merge's);
    ``chat_format`` None: the directory's own; ``ptuning_checkpoint``: a P-Tuning v2 prefix run on it
    (``weights.read_ptuning_checkpoint``). The directory (family, shards, weight names, the prefix's fit) and the
    chat format are checked before the tokenizer and the weights are read: a one-line ``WeightsError``."""
    config = check_directory(directory, quantized=True, ptuning_checkpoint=ptuning_checkpoint)
    if chat_format is not None and chat_format not in CHAT_FORMATS:  # another family's (glm4)
        raise WeightsError(f"--chat-format {chat_format}: {directory} is a chatglm2 model, whose chat formats are "
                           f"{', '.join(CHAT_FORMATS)}")
    if chat_format == "chatglm3" and detect_chat_format(directory) != "chatglm3":
        # ChatGLM3's role tokens would be numbered after ChatGLM2's five specials: rows ChatGLM2 never trained
        raise WeightsError(f"--chat-format chatglm3: {directory}'s tokenizer is ChatGLM2's, which has no "
                           f"{'/'.join(ROLE_TOKENS)} tokens (use --chat-format chatglm2, or a ChatGLM3 directory)")
    tokenizer = load_tokenizer(directory, chat_format=chat_format)
    if tokenizer.vocab_size > config.padded_vocab_size:
        raise WeightsError(f"{directory}: tokenizer.model gives {tokenizer.vocab_size} ids, more than the model's "
                           f"padded_vocab_size ({config.padded_vocab_size})")
    return load_pretrained(directory, dtype=dtype, device=device, ptuning_checkpoint=ptuning_checkpoint), tokenizer


__all__ = ["CHAT_FORMATS", "DEFAULTS", "PromptTooLong", "accepts_system", "chat_format", "check_quantize", "load",
           "stream_chat"]
