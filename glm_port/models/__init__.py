"""Model families: one folder each (``glm/``, ...), found by the family name a ``config.json`` carries.

A family registers its config class and model class here. Shared pieces (training loop, checkpoint I/O,
generation, finetuning) take any registered family; nothing here imports a family until it is asked for.
The commands reach a family only through this module (``family_at``, ``family_for``, ``FAMILIES``,
``Family.load``, ``Family.binding``; what each binding provides: ``contract.py``), never a family's modules.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

# What a family may declare it supports (``Family.supports``), and how a refusal names it. A command asked for
# one of these (a flag) checks it with ``Family.require`` before it loads anything: one line, exit status 2.
FEATURES: dict[str, str] = {
    "tensor_parallel": "tensor parallelism",
    "pipeline_parallel": "pipeline parallelism (layers split into stages)",
    "static_cache": "a static (preallocated) key/value cache",
    "recompute": "activation checkpointing (recompute)",
    "lora": "LoRA adapters",
    "export": "glm-export",
    "merge": "glm-merge (tensor-parallel shards to one directory)",
    "decode_graph": "a decode-step graph (ONNX, torch.export)",
    "quantize": "weight-only int8/int4 quantization (--quantize)",
    "prefix_tuning": "P-Tuning v2 prefixes (THUDM's pre_seq_len)",
}

# ``--quantize`` values and their bits; ``--quantize-group-size`` choices (int4 only; default 128).
QUANTIZE_BITS: dict[str, int] = {"int8": 8, "int4": 4}
QUANTIZE_GROUP_SIZES = (32, 64, 128)


class Unsupported(ValueError):
    """A command was asked for a feature its model's family does not declare (``Family.supports``)."""


class WeightsError(ValueError):
    """Weights or a model directory (any family's) that are missing, unreadable or made for another model: one
    line naming the file or tensor at fault. Every family's loaders raise this one class; the commands catch it."""


@dataclass(frozen=True)
class Family:
    name: str
    module: str  # the family's package; it exports ``config_class`` and ``model_class`` by these names
    config_class: str
    model_class: str
    model_types: tuple[str, ...]  # the ``model_type`` values of config.json files this family reads
    # The ``FEATURES`` this family has, each tested for it; anything else is refused by the commands.
    supports: frozenset[str] = frozenset()
    # Module with ``load(path, ...) -> (model, tokenizer)`` and ``generate(model, tokenizer, prompts, ...)``,
    # what glm-generate drives (glm_port.generation); None: the family does not generate.
    generation: str | None = None
    # Module with glm-finetune's binding (load, encode, collate, logits, generate, save...: see
    # glm_port/models/glm/finetune.py); None: the family is not finetuned by glm-finetune.
    finetune: str | None = None
    # Module with the chat format a server speaks (glm_port.serve): ``chat_format(tokenizer)``,
    # ``encode_messages(tokenizer, messages, tools) -> ids``, ``reply_stop_ids(model, tokenizer)``,
    # ``parse_reply(tokenizer, ids, tools, final) -> (content, tool_calls)``; None: the family does not chat.
    chat: str | None = None
    # Module with ``build_tiny(chat_format=...) -> (model, tokenizer)``: the embedded random-init model the
    # commands use when given no weights; None: the family has none.
    tiny: str | None = None
    # More bindings (what each module provides: ``glm_port.models.contract``, one protocol a kind):
    # ``conversation``, glm-chat's (load, stream_chat, the chat formats); ``weights``, the family's directories
    # read with one-line errors; ``convert``, glm-convert's and the writer glm-merge and glm-export use for a
    # family kept in its own layout; ``hf``, the pieces glm-merge and glm-export assemble a Hugging Face
    # directory of the family's classes from. None: the family has no such binding.
    conversation: str | None = None
    weights: str | None = None
    convert: str | None = None
    hf: str | None = None
    # ``fnmatch`` patterns of linear layers ``--quantize`` keeps in float (THUDM keeps ChatGLM2's output layer).
    quantize_keep: tuple[str, ...] = ()
    # ``"module:function"``, called as ``function(directory, config) -> bool`` (``config``: the parsed config.json)
    # before ``model_type`` is looked at: True claims the directory (GLM-4 and ChatGLM2 share "chatglm").
    detect: str | None = None

    def claims(self, directory: Path, config: dict) -> bool:
        """Whether this family's ``detect`` hook claims the directory (False without one)."""
        if self.detect is None:
            return False
        module, _, function = self.detect.partition(":")
        return bool(getattr(importlib.import_module(module), function)(directory, config))

    def __post_init__(self):
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"family {self.name}: unknown features {sorted(unknown)} (known: {sorted(FEATURES)})")

    def require(self, *requested: tuple[str | None, str]) -> None:
        """``(flag, feature)`` pairs, one per feature a command can be asked for (``flag``: how the user asked,
        e.g. ``"--pipeline-parallel-size 2"``; empty or None: not asked for this time): ``Unsupported`` (one
        line, naming the flag) for the first feature asked for that this family does not support."""
        for flag, feature in requested:
            if feature not in FEATURES:
                raise KeyError(f"unknown feature {feature!r} (known: {', '.join(FEATURES)})")
            if flag and feature not in self.supports:
                raise Unsupported(f"{flag}: the {self.name} family does not support {FEATURES[feature]}")

    def load(self, attribute: str):
        return getattr(importlib.import_module(self.module), attribute)

    def binding(self, kind: str):
        """The module of one of this family's bindings (a kind of ``contract.PROTOCOLS``: ``"generation"``,
        ``"finetune"``, ``"chat"``, ``"tiny"``, ...), imported on first use; a ValueError when the family has none."""
        from glm_port.models.contract import PROTOCOLS

        if kind not in PROTOCOLS:
            raise KeyError(f"unknown binding kind {kind!r} (known: {', '.join(PROTOCOLS)})")
        module = getattr(self, kind)
        if module is None:
            raise ValueError(f"the {self.name} family has no {kind} binding")
        return importlib.import_module(module)

    def quantize(self, model, mode: str, group_size: int | None = None) -> int:
        """Quantize ``model``'s linear layers in place (``shim.nn.quantize_linears``), keeping
        ``quantize_keep`` in float; ``mode`` "int8" or "int4" (``group_size`` default 128). Returns how many
        layers; a ValueError (one line) for an unknown mode or a group size that does not divide a row,
        before any layer is replaced."""
        from shim.nn import quantize_linears

        if mode not in QUANTIZE_BITS:
            raise ValueError(f"--quantize {mode}: expected one of {', '.join(QUANTIZE_BITS)}")
        self.require((f"--quantize {mode}", "quantize"))
        return quantize_linears(model, QUANTIZE_BITS[mode], group_size=group_size or 128, skip=self.quantize_keep)


FAMILIES: dict[str, Family] = {
    "glm": Family("glm", "glm_port.models.glm", "GLMConfig", "GLMModel", ("glm",),
                  generation="glm_port.models.glm.generation", finetune="glm_port.models.glm.finetune",
                  hf="glm_port.models.glm.hf_directory",
                  # GLM's output is the tied embedding table: no linear to keep in float (quantize_keep)
                  supports=frozenset(FEATURES) - {"prefix_tuning"}),
    "chatglm2": Family("chatglm2", "glm_port.models.chatglm2", "ChatGLM2Config", "ChatGLM2ForCausalLM", ("chatglm",),
                       supports=frozenset({"tensor_parallel", "static_cache", "recompute", "lora", "export",
                                           "merge", "quantize", "prefix_tuning"}),
                       quantize_keep=("*output_layer", "*prefix_encoder.*"),  # THUDM keeps both in float
                       generation="glm_port.models.chatglm2.generation",
                       finetune="glm_port.models.chatglm2.finetune", chat="glm_port.models.chatglm2.chat",
                       tiny="glm_port.models.chatglm2.tiny", conversation="glm_port.models.chatglm2.conversation",
                       weights="glm_port.models.chatglm2.weights", convert="glm_port.models.chatglm2.convert"),
    "glm4": Family("glm4", "glm_port.models.glm4", "GLM4Config", "GLM4ForCausalLM", ("chatglm", "glm"),
                   supports=frozenset({"tensor_parallel", "static_cache", "quantize", "lora", "recompute", "merge",
                                       "export", "prefix_tuning"}),
                   quantize_keep=("*output_layer", "*prefix_encoder.*"), finetune="glm_port.models.glm4.finetune",
                   detect="glm_port.models.glm4.detect:is_glm4", generation="glm_port.models.glm4.generation",
                   chat="glm_port.models.glm4.chat", tiny="glm_port.models.glm4.tiny",
                   conversation="glm_port.models.glm4.conversation", weights="glm_port.models.glm4.weights",
                   convert="glm_port.models.glm4.convert"),
}
TINY_FAMILY = "chatglm2"  # the family of the embedded model a command runs with no weights given


class UnknownFamily(ValueError):
    """A config.json whose model type no family here reads."""


def family_for(model_type: str | None) -> Family:
    """The family that reads configs of ``model_type`` (a ``config.json``'s ``model_type``)."""
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    known = ", ".join(dict.fromkeys(t for f in FAMILIES.values() for t in f.model_types))
    raise UnknownFamily(f"unknown model family {model_type!r} in config.json; this version reads: {known}")


def family_of(model) -> Family:
    """The family of a loaded ``model``: the family reading its config's ``model_type``; where several do (GLM-4 and
    ChatGLM2 share "chatglm"), the one whose model class ``model`` is (GLM-4's subclasses ChatGLM2's)."""
    model_type = getattr(model.config, "model_type", None)
    readers = [family for family in FAMILIES.values() if model_type in family.model_types]
    if len(readers) > 1:
        exact = [family for family in readers if type(model) is family.load(family.model_class)]
        if exact:
            return exact[0]
    return readers[0] if readers else family_for(model_type)


def build_tiny(family: str = TINY_FAMILY, **kwargs):
    """``(model, tokenizer)``: a family's embedded random-init model (keyword arguments go to its
    ``build_tiny``, e.g. ``chat_format="chatglm3"``)."""
    return FAMILIES[family].binding("tiny").build_tiny(**kwargs)


def check_quantize(mode: str | None, group_size: int | None) -> str | None:
    """What is wrong with ``--quantize`` / ``--quantize-group-size``, in one line (None: nothing)."""
    if mode is None:
        return "--quantize-group-size needs --quantize int4" if group_size is not None else None
    if mode not in QUANTIZE_BITS:
        return f"--quantize {mode}: expected one of {', '.join(QUANTIZE_BITS)}"
    if group_size is not None and mode != "int4":
        return f"--quantize-group-size applies to --quantize int4, not {mode} (one scale a row)"
    if group_size is not None and group_size not in QUANTIZE_GROUP_SIZES:
        return f"--quantize-group-size must be one of {', '.join(map(str, QUANTIZE_GROUP_SIZES))}, got {group_size}"
    return None


def register(family: Family) -> None:
    FAMILIES[family.name] = family


def family_at(path) -> Family:
    """The family of the weights at ``path``: the family whose ``detect`` hook claims its (or its folder's)
    directory, else that ``config.json``'s ``model_type``; for
    tensor-parallel shards without one, the family whose ``detect`` hook claims the config the shards carry (with
    the folder holding them or the tokenizer saved beside them: GLM-4's), else that config's ``model_type``
    (glm-finetune's ChatGLM2 shards); GLM where there is none (upstream's ``mp_rank_XX`` files, glm-pretrain
    checkpoints)."""
    path = Path(path)
    for directory in (path if path.is_dir() else path.parent, path.parent):
        config = directory / "config.json"
        if config.is_file():
            try:
                raw = json.loads(config.read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:
                raise ValueError(f"{config}: not valid JSON ({error.msg})") from None
            raw = raw if isinstance(raw, dict) else {}
            claimed = next((f for f in FAMILIES.values() if f.claims(directory, raw)), None)
            if claimed is not None:
                return claimed
            model_type = raw.get("model_type")
            return family_for(model_type) if model_type else FAMILIES["glm"]
    from glm_port.checkpoint_io import SHARDED_STATE, is_sharded_checkpoint, model_file_name, saved_config, shard_directory

    shards = shard_directory(path)
    if shards is None and path.is_dir() and is_sharded_checkpoint(path):
        shards = path
    for recorded in ((shards / model_file_name(0)), (shards / SHARDED_STATE)) if shards is not None else ():
        if recorded.is_file():  # a tensor-parallel rank's file, or a sharded (DCP) run's training state
            recorded_config = saved_config(recorded) or {}
            model_type = recorded_config.get("model_type")
            if model_type:  # the detect hooks first, on the folders a tokenizer is saved in beside the shards
                homes = dict.fromkeys((path if path.is_dir() else path.parent, shards, shards.parent))
                claimed = next((f for home in homes for f in FAMILIES.values() if f.claims(home, recorded_config)),
                               None)
                return claimed or family_for(model_type)
    return FAMILIES["glm"]
