"""Model families: one folder each (``glm/``, ``chatglm2/``, ``glm4/``), found by what a directory holds.

A family declares itself once, as code, in its own folder (``glm_port/models/<name>/spec.py``: ``FAMILY =
Family(...)``, holding its config, model and tokenizer classes, its detect hook, split plan, state-dict adapter and
binding modules, and what it supports) and is registered by one line here (``FAMILIES.declare``). Shared pieces
(training loop, checkpoint I/O, generation, finetuning) take any registered family; importing this module imports
no family: a family's declaration (and so its code) is imported on its first lookup. The commands reach a family
only through this module (``family_at``, ``family_for``, ``family_of``, ``FAMILIES``, ``Family.binding``; what
each binding provides: ``contract.py``), never a family's modules.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm_port.models.contract import (PROTOCOLS, ChatBinding, ConversationBinding, ConvertBinding, FinetuneBinding,
                                      GenerationBinding, HFDirectoryBinding, TinyBinding, WeightsBinding)

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
    """One model family, declared once as code in its own folder (``glm_port/models/<name>/spec.py``: ``FAMILY =
    Family(...)``, torchtitan's ``TrainSpec`` way) and registered by one line below. Every field holds the object
    itself (a class, a function, a module), never its name; ``tests/test_architecture.py`` checks it."""

    name: str
    config_class: type  # its config (a transformers ``PretrainedConfig``)
    model_class: type  # its model: what ``family_of`` tells a loaded model's family by
    model_types: tuple[str, ...]  # the ``model_type`` values of config.json files this family reads
    # Its tokenizer class, and the chat formats it speaks (what glm-chat's and glm-serve's --chat-format may name).
    tokenizer_class: type | None = None
    chat_formats: tuple[str, ...] = ()
    # ``split_plan(config, size) -> shim.nn.split_plan.SplitPlan``: how its weights are cut under tensor parallel
    # ``size`` (the family's ``splits.py``; docs/architecture.md, "The split plan").
    split_plan: Callable[[Any, int], Any] | None = None
    # Its state-dict adapter (``weights_io.Adapter``, its ``adapter.py``): its checkpoints' names <-> its model's,
    # both ways, what the shared reader renames by (docs/architecture.md, "Reading weights").
    adapter: Any = None  # a weights_io.Adapter (named, not imported: weights_io imports this module)
    # ``detect(directory, config) -> bool`` (``config``: the parsed config.json), called by ``family_at`` before
    # ``model_type`` is looked at: True claims the directory (GLM-4 and ChatGLM2 share "chatglm").
    detect: Callable[[Path, dict], bool] | None = None
    # The ``FEATURES`` this family has, each tested for it; anything else is refused by the commands.
    supports: frozenset[str] = frozenset()
    # ``fnmatch`` patterns of linear layers ``--quantize`` keeps in float (THUDM keeps ChatGLM2's output layer).
    quantize_keep: tuple[str, ...] = ()
    # Its bindings, one a kind of ``contract.PROTOCOLS``, each the module (or any object) providing that kind's
    # protocol; None: the family has no such binding. ``generation``: glm-generate's and glm-serve's (load,
    # generate); ``finetune``: glm-finetune's (load, encode, collate, logits, generate, save...); ``chat``: the
    # chat format a server speaks; ``conversation``: glm-chat's (load, stream_chat, the chat formats); ``tiny``:
    # the embedded random-init model a command runs with no weights given; ``weights``: the family's directories
    # read with one-line errors; ``convert``: glm-convert's, and the writer glm-merge and glm-export use for a
    # family kept in its own layout; ``hf``: the pieces glm-merge and glm-export assemble a Hugging Face
    # directory of the family's classes from.
    generation: GenerationBinding | None = None
    finetune: FinetuneBinding | None = None
    chat: ChatBinding | None = None
    conversation: ConversationBinding | None = None
    tiny: TinyBinding | None = None
    weights: WeightsBinding | None = None
    convert: ConvertBinding | None = None
    hf: HFDirectoryBinding | None = None

    def __post_init__(self):
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"family {self.name}: unknown features {sorted(unknown)} (known: {sorted(FEATURES)})")
        named = [f"{field}={value!r}" for field, value in self.declared_code().items() if isinstance(value, str)]
        if named:  # the declaration holds code: a name (a module path, a class name) is a mistake here
            raise TypeError(f"family {self.name}: declare the object itself, not its name: {', '.join(named)}")

    def declared_code(self) -> dict:
        """The fields that hold code (classes, functions, binding modules), by name; None where not declared."""
        return {field: getattr(self, field) for field in CODE_FIELDS}

    def claims(self, directory: Path, config: dict) -> bool:
        """Whether this family's ``detect`` hook claims the directory (False without one)."""
        return self.detect is not None and bool(self.detect(directory, config))

    def require(self, *requested: tuple[str | None, str]) -> None:
        """``(flag, feature)`` pairs, one per feature a command can be asked for (``flag``: how the user asked,
        e.g. ``"--pipeline-parallel-size 2"``; empty or None: not asked for this time): ``Unsupported`` (one
        line, naming the flag) for the first feature asked for that this family does not support."""
        for flag, feature in requested:
            if feature not in FEATURES:
                raise KeyError(f"unknown feature {feature!r} (known: {', '.join(FEATURES)})")
            if flag and feature not in self.supports:
                raise Unsupported(f"{flag}: the {self.name} family does not support {FEATURES[feature]}")

    def load(self, what):
        """One of the family's declared classes: ``what`` itself (``family.load(family.config_class)``, as
        callers wrote it when the declaration held names), or the declared class named ``what``."""
        if not isinstance(what, str):
            return what
        for cls in (self.config_class, self.model_class, self.tokenizer_class):
            if cls is not None and cls.__name__ == what:
                return cls
        raise AttributeError(f"the {self.name} family declares no class {what!r}")

    def binding(self, kind: str):
        """The object one of this family's bindings is (a kind of ``contract.PROTOCOLS``: ``"generation"``,
        ``"finetune"``, ``"chat"``, ``"tiny"``, ...); a ValueError when the family has none."""
        if kind not in PROTOCOLS:
            raise KeyError(f"unknown binding kind {kind!r} (known: {', '.join(PROTOCOLS)})")
        binding = getattr(self, kind)
        if binding is None:
            raise ValueError(f"the {self.name} family has no {kind} binding")
        return binding

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


# The fields of a declaration that hold code: its classes, its hooks and its bindings (one a contract kind).
CODE_FIELDS = ("config_class", "model_class", "tokenizer_class", "split_plan", "adapter", "detect", *PROTOCOLS)


class Registry(MutableMapping):
    """Family name -> ``Family``. A family is registered by the module that declares it (its folder's
    ``spec.py``, whose ``FAMILY`` is the declaration), imported on the first lookup of that family (``FAMILIES[name]``,
    ``.values()``, ``family_at``...): importing ``glm_port.models`` (a command's ``--help``) loads no family.
    Names and order are known without loading (``list(FAMILIES)``, ``name in FAMILIES``)."""

    def __init__(self):
        self._entries: dict[str, Family | str] = {}  # a loaded declaration, or the module that declares it
        self._declared_in: dict[str, str] = {}

    def declare(self, name: str, spec_module: str) -> None:
        """Register family ``name``, declared as ``FAMILY`` in ``spec_module`` (imported on first lookup)."""
        self._entries[name] = self._declared_in[name] = spec_module

    def declared_in(self, name: str) -> str | None:
        """The module whose ``FAMILY`` family ``name`` is (None: a ``Family`` set directly, as tests do)."""
        module = self._declared_in.get(name)
        if module is None or isinstance(self._entries[name], str):
            return module
        return module if importlib.import_module(module).FAMILY is self._entries[name] else None

    def __getitem__(self, name: str) -> Family:
        entry = self._entries[name]
        if isinstance(entry, str):
            family = importlib.import_module(entry).FAMILY
            if not isinstance(family, Family) or family.name != name:
                raise TypeError(f"{entry}.FAMILY must be the Family named {name!r}, found {family!r}")
            self._entries[name] = entry = family
        return entry

    def __setitem__(self, name: str, family: Family) -> None:
        if not isinstance(family, Family) or family.name != name:
            raise TypeError(f"FAMILIES[{name!r}] must be a Family named {name!r}")
        self._entries[name] = family

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        self._declared_in.pop(name, None)

    def __contains__(self, name) -> bool:  # without loading the declaration
        return name in self._entries

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({list(self._entries)})"


# The registry: one line a family (adding one: docs/architecture.md, "Adding a model family").
FAMILIES = Registry()
FAMILIES.declare("glm", "glm_port.models.glm.spec")
FAMILIES.declare("chatglm2", "glm_port.models.chatglm2.spec")
FAMILIES.declare("glm4", "glm_port.models.glm4.spec")
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
        exact = [family for family in readers if type(model) is family.model_class]
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
