"""GLM-4's ``conversation`` binding (``glm_port.models.contract.ConversationBinding``): what ``glm-chat`` takes
from the family. The chat itself is ``chat.py`` (``stream_chat`` in GLM-4's role-token format, ChatGLM2's
streaming, cache reuse and sampling defaults); the loader is glm-generate's (``generation.load``: either layout,
THUDM's or transformers'), after the chat format asked for is checked; this module gathers the names."""

from __future__ import annotations

from glm_port.models import WeightsError
from glm_port.models.glm4.chat import DEFAULTS, FORMAT, PromptTooLong, chat_format, stream_chat
from glm_port.models.glm4.generation import check_quantize

CHAT_FORMATS = (FORMAT,)  # GLM-4 has one chat format


def accepts_system(tokenizer) -> bool:
    """GLM-4's format has a system message (``<|system|>``)."""
    return True


def load(directory, *, device="cpu", dtype=None, chat_format=None, ptuning_checkpoint=None):
    """``(model, tokenizer)`` from a GLM-4 directory (THUDM's layout or transformers'); ``chat_format``: None or
    "glm4", another is a one-line ``WeightsError`` before the tokenizer and the weights are read, as is a directory
    that is not GLM-4's (``weights.read_config``); ``ptuning_checkpoint``: a P-Tuning v2 prefix run on it."""
    from glm_port.models.glm4.generation import load as load_generation
    from glm_port.models.glm4.weights import read_config

    read_config(directory)
    if chat_format is not None and chat_format not in CHAT_FORMATS:
        raise WeightsError(f"--chat-format {chat_format}: {directory} is a glm4 model, whose chat format is {FORMAT}")
    try:
        return load_generation(directory, dtype=dtype, device=device, ptuning_checkpoint=ptuning_checkpoint)
    except WeightsError:
        raise
    except ValueError as error:  # a tokenizer larger than the model's vocabulary
        raise WeightsError(str(error).strip().splitlines()[0]) from None


__all__ = ["CHAT_FORMATS", "DEFAULTS", "PromptTooLong", "accepts_system", "chat_format", "check_quantize", "load",
           "stream_chat"]
