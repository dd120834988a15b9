"""What a family's bindings provide: one runtime-checkable ``typing.Protocol`` per binding kind.

A family's declaration (``glm_port.models.Family``, its folder's ``spec.py``) holds one object a kind of binding
it has (``Family.generation``, ``Family.chat``, ...; a module of the family's folder), typed by the protocol
here; ``family.binding(kind)`` returns it. The commands reach a family only that way (and through the
declaration's classes, ``family.config_class``...): none imports a ``glm_port.models.<family>`` module
(``tests/test_architecture.py`` checks it). Each protocol below lists the names the commands use, so a binding
module is written against it; ``PROTOCOLS`` maps each kind to its protocol and ``missing`` names what a module
lacks (the architecture test runs both ``isinstance(binding, protocol)`` and ``missing`` over every registered
family). A module conforms as a module does (PEP 544): its functions are the protocol's methods without
``self``, its constants and classes the protocol's attributes.

Errors: a binding raises ``glm_port.models.WeightsError`` (one line) for weights or a directory it cannot
read, which every command catches.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GenerationBinding(Protocol):
    """``glm-generate`` (``glm_port.generation``) and ``glm-serve``: load a model, continue prompts. A module
    may also have ``check_quantize(path, mode, group_size)``, run before loading (a group size that does not
    divide a row: one line)."""

    def load(self, path, *, dtype=None, device=None, tokenizer_type=None, tokenizer_path=None,
             tensor_parallel=None) -> tuple[Any, Any]: ...

    def generate(self, model, tokenizer, prompts: list[str], **options) -> list[dict]: ...


@runtime_checkable
class FinetuneBinding(Protocol):
    """``glm-finetune`` (``glm_port.finetune.run``): see ``glm_port/models/glm/finetune.py``."""

    def load(self, path, device, recompute: bool = False, tokenizer_path=None, meta: bool = False) -> tuple[Any, Any]:
        """``(model, tokenizer)``; ``meta``: the model built on the meta device from the config alone, no weight
        read (fp32): what a sharded run's ranks other than 0 build, their shards then filled from rank 0's
        weights (``glm_port.sharding.shard_from_rank0``)."""

    def tokenizer_home(self, path): ...
    def config_of(self, model): ...
    def fit_lengths(self, model, src_length: int, tgt_length: int) -> tuple[int, int]: ...
    def fingerprint(self, tokenizer) -> str: ...
    def encode(self, tokenizer, pairs, src_length: int, tgt_length: int, with_targets: bool = True): ...
    def collate(self, samples, tokenizer) -> dict: ...
    def logits(self, model, batch: dict, counted): ...
    def generate(self, model, tokenizer, samples, search: dict, batch_size: int, device) -> list[str]: ...
    def save(self, model, tokenizer, directory, source=None) -> None: ...
    def save_tokenizer(self, tokenizer, directory, source=None) -> None: ...


@runtime_checkable
class ChatBinding(Protocol):
    """The chat format a server speaks (``glm-serve``; messages are OpenAI's dicts)."""

    def chat_format(self, tokenizer) -> str: ...
    def encode_messages(self, tokenizer, messages: list[dict], tools=None) -> list[int]: ...
    def reply_stop_ids(self, model, tokenizer) -> list[int]: ...
    def parse_reply(self, tokenizer, ids: list[int], tools=None, final: bool = True): ...


@runtime_checkable
class ConversationBinding(Protocol):
    """``glm-chat``: a terminal conversation, replies streamed, the key/value cache kept from turn to turn."""

    CHAT_FORMATS: tuple[str, ...]  # what --chat-format may name
    DEFAULTS: dict  # the family's sampling defaults (top_p, temperature)
    PromptTooLong: type[Exception]  # a turn that no longer fits the model

    def load(self, directory, *, device="cpu", dtype=None, chat_format=None,
             ptuning_checkpoint=None) -> tuple[Any, Any]:
        """``(model, tokenizer)`` from a directory, ``chat_format`` None: the directory's own;
        ``ptuning_checkpoint`` a P-Tuning v2 prefix (passed only to families declaring ``prefix_tuning``); a ``WeightsError``
        (one line) for a directory or format it cannot chat with."""

    def check_quantize(self, path, mode, group_size) -> None: ...
    def chat_format(self, tokenizer) -> str: ...
    def accepts_system(self, tokenizer) -> bool: ...

    def stream_chat(self, model, tokenizer, query: str, history=None, role: str = "user", past_key_values=None,
                    return_past_key_values: bool = False, **generate_kwargs): ...


@runtime_checkable
class TinyBinding(Protocol):
    """The embedded random-init model a command runs with no weights given."""

    NAME: str

    def build_tiny(self, **options) -> tuple[Any, Any]: ...


@runtime_checkable
class WeightsBinding(Protocol):
    """A family's model directories, read with one-line errors (``WeightsError``)."""

    def check_directory(self, directory, quantized: bool = False):
        """The directory's config, its family, files and weight names checked before any weight is read."""

    def load_pretrained(self, directory, dtype=None, device="cpu", **options): ...
    def load_tokenizer(self, directory, **options): ...

    def open_weights(self, directory):
        """Single tensors by name, read lazily (a directory or tensor-parallel shards)."""


@runtime_checkable
class ConvertBinding(Protocol):
    """``glm-convert`` (to and from transformers' native classes), ``glm-merge`` and ``glm-export`` for a family
    written in its own (THUDM's) directory layout."""

    TRANSFORMERS_MODEL_TYPES: tuple[str, ...]  # the config.json model types of transformers' native directories

    def to_transformers(self, src, dst, dtype=None, max_shard_size="2GB") -> None: ...
    def from_transformers(self, src, dst, dtype=None, max_shard_size="2GB") -> None: ...

    def merge_checkpoint(self, src, dst, *, dtype=None, tokenizer_path=None, overwrite=False) -> dict:
        """Shards (or a directory) -> one directory; glm-merge's summary."""

    def tokenizer_for(self, src, source, tokenizer_path): ...

    def check_quantize(self, mode: str) -> None:
        """Before anything is read: a ``WeightsError`` (one line) when the family's layout has no quantized form."""

    def quantize_checkpoint(self, state: dict, config, mode: str) -> tuple[dict, Any]:
        """``(state, config)`` with the weights quantized as the family's layout stores them."""

    def save_checkpoint(self, state: dict, config, tokenizer, dst, *, overwrite: bool = False, inputs=(),
                        **options) -> dict: ...


@runtime_checkable
class HFDirectoryBinding(Protocol):
    """``glm-merge`` and ``glm-export`` for a family written as a Hugging Face directory of its own classes
    (GLM's), and the tokenizer files ``glm-pretrain`` records beside its checkpoints."""

    HF_PREFIX: str  # the prefix of the model's keys under the Hugging Face class
    TOKENIZER_FILES: tuple[str, ...]  # tokenizer files that are not the vocabulary
    model_class: type  # the Hugging Face class (from_pretrained, generation)
    tokenizer_class: type

    def find_source(self, path):
        """The weights at ``path`` in any form the family reads (shards, a directory)."""

    def iter_tensors(self, source, tp_size: int = 1, tp_rank: int = 0, **options): ...
    def source_config(self, source, overrides: dict | None = None): ...
    def save_hf(self, model_state: dict, directory, config: dict, **options) -> None: ...
    def load_tokenizer(self, path, tokenizer_type=None, tokenizer_path=None): ...
    def tokenizer_files(self, path, tokenizer_path=None) -> list: ...


# binding kind (a ``Family`` field holding the binding) -> what the binding provides
PROTOCOLS: dict[str, type] = {
    "generation": GenerationBinding,
    "finetune": FinetuneBinding,
    "chat": ChatBinding,
    "conversation": ConversationBinding,
    "tiny": TinyBinding,
    "weights": WeightsBinding,
    "convert": ConvertBinding,
    "hf": HFDirectoryBinding,
}


def members(protocol: type) -> list[str]:
    """The names ``protocol`` requires: its methods and annotated attributes."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return sorted(name for name in names if not name.startswith("_"))


def missing(kind: str, module) -> list[str]:
    """The names binding kind ``kind``'s protocol requires that ``module`` lacks."""
    return [name for name in members(PROTOCOLS[kind]) if not hasattr(module, name)]


__all__ = ["PROTOCOLS", "ChatBinding", "ConversationBinding", "ConvertBinding", "FinetuneBinding",
           "GenerationBinding", "HFDirectoryBinding", "TinyBinding", "WeightsBinding", "members", "missing"]
