"""Reading a ChatGLM2 directory as THUDM publishes it, with one-line errors for what is wrong with it.

A directory holds ``config.json`` (``model_type`` "chatglm") and the weights as one file or shards:
``pytorch_model-0000N-of-0000M.bin`` + ``pytorch_model.bin.index.json`` (THUDM's), or
``model-0000N-of-0000M.safetensors`` + ``model.safetensors.index.json``, or a single
``pytorch_model.bin`` / ``model.safetensors``. The family and every shard are checked before anything
is read; ``load_pretrained`` then lets transformers' ``from_pretrained`` read shard by shard, straight
to the asked dtype and device, and turns a key missing from the shards into an error (transformers
would initialise it at random and only warn).

``TensorSource`` reads single tensors across shards lazily (safetensors' ``safe_open``; ``.bin`` shards
memory-mapped), for conversions that must not hold a whole 6B model twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from glm_port.models.chatglm2.config import ChatGLM2Config
from shim.nn.tensor_parallel import section_part

MODEL_TYPES = ("chatglm",)
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
IGNORED_KEYS = ("rotary_pos_emb.inv_freq",)  # THUDM's files carry this constant buffer


class WeightsError(ValueError):
    """A ChatGLM2 directory that cannot be read; the message is one line naming the file at fault."""


def read_config_json(directory) -> dict:
    path = Path(directory) / "config.json"
    if not Path(directory).is_dir():
        raise WeightsError(f"{directory}: not a directory")
    if not path.is_file():
        raise WeightsError(f"{path}: missing (a model directory needs its config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


def read_config(directory, expected=MODEL_TYPES) -> ChatGLM2Config:
    """The directory's ``ChatGLM2Config``; a one-line error when its ``model_type`` is another family's."""
    raw = read_config_json(directory)
    model_type = raw.get("model_type")
    if model_type not in expected:
        raise WeightsError(
            f"{Path(directory) / 'config.json'}: model_type {model_type!r} is not a ChatGLM2-family model "
            f"(expected {' or '.join(map(repr, expected))})"
        )
    config = ChatGLM2Config.from_pretrained(directory)
    config.check_supported()
    return config


def weight_map(directory) -> dict[str, str]:
    """``{tensor name: file name}`` from the index (every listed shard checked present) or the single file."""
    directory = Path(directory)
    for index_name in INDEX_FILES:
        index = directory / index_name
        if index.is_file():
            try:
                mapping = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError):
                raise WeightsError(f"{index}: not a weight index (no 'weight_map')") from None
            for shard in sorted(set(mapping.values())):
                if not (directory / shard).is_file():
                    raise WeightsError(f"{directory / shard}: shard listed in {index_name} is missing")
            return mapping
    for name in SINGLE_FILES:
        if (directory / name).is_file():
            return {key: name for key in _file_keys(directory / name)}
    raise WeightsError(f"{directory}: no weights ({', '.join(INDEX_FILES + SINGLE_FILES)})")


def _file_keys(path: Path) -> list[str]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    return list(torch.load(path, map_location="meta", weights_only=True, mmap=True))


class TensorSource:
    """Tensors of a (sharded) checkpoint by name, each read when asked (files opened once, lazily)."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.map = weight_map(directory)
        self._open: dict[str, object] = {}

    def keys(self):
        return self.map.keys()

    def __contains__(self, key):
        return key in self.map

    def __getitem__(self, key) -> torch.Tensor:
        if key not in self.map:
            raise WeightsError(f"{self.directory}: weight {key} missing from the checkpoint")
        name = self.map[key]
        handle = self._open.get(name)
        if handle is None:
            path = self.directory / name
            if path.suffix == ".safetensors":
                from safetensors import safe_open

                handle = safe_open(str(path), framework="pt")
            else:
                handle = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            self._open[name] = handle
        return handle.get_tensor(key) if hasattr(handle, "get_tensor") else handle[key]

    def files_in_order(self) -> list[str]:
        return sorted(set(self.map.values()))


def check_directory(directory) -> ChatGLM2Config:
    """Everything checkable without reading weights: family, config, shards present, no key missing."""
    config = read_config(directory)
    present = set(weight_map(directory))
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    with torch.device("meta"):
        expected = ChatGLM2ForCausalLM(config).state_dict().keys()
    missing = sorted(set(expected) - present)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{directory}: weight {missing[0]} missing from the checkpoint{more}")
    return config


def default_dtype(device) -> torch.dtype:
    """fp32 on CPU, bf16 on an accelerator."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_pretrained(directory, dtype=None, device="cpu"):
    """``ChatGLM2ForCausalLM`` from a ChatGLM2 directory, shard by shard to ``dtype`` on ``device``, eval mode."""
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    config = check_directory(directory)
    dtype = dtype or default_dtype(device)
    model, info = ChatGLM2ForCausalLM.from_pretrained(
        directory, config=config, dtype=dtype, device_map=str(torch.device(device)), output_loading_info=True
    )
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        raise WeightsError(f"{directory}: weight {missing[0]} missing from the checkpoint")
    return model.eval()


def load_tokenizer(directory, chat_format=None):
    """The directory's tokenizer; its chat format (ChatGLM2's or ChatGLM3's) as given, else as the directory's
    files say (``tokenizer.detect_chat_format``)."""
    from glm_port.models.chatglm2.tokenizer import ChatGLM2Tokenizer

    path = os.path.join(directory, "tokenizer.model")
    if not os.path.isfile(path):
        raise WeightsError(f"{path}: missing (ChatGLM2 reads its sentencepiece tokenizer.model)")
    return ChatGLM2Tokenizer(path, chat_format=chat_format)


def save_sharded(state: dict, directory, shards: int = 2, fmt: str = "bin") -> None:
    """Write ``state`` as THUDM lays it out (``pytorch_model-0000N-of-0000M.bin`` + index) or as safetensors
    shards; for tests and conversions. Keys keep their order; shard sizes are near equal."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    keys = list(state)
    per = -(-len(keys) // shards)
    weight_index, total = {}, 0
    for i in range(shards):
        part = {k: state[k].contiguous() for k in keys[i * per:(i + 1) * per]}
        if fmt == "bin":
            name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
            torch.save(part, directory / name)
        else:
            from safetensors.torch import save_file

            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(directory / name), metadata={"format": "pt"})
        weight_index.update({k: name for k in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    index_name = "pytorch_model.bin.index.json" if fmt == "bin" else "model.safetensors.index.json"
    (directory / index_name).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_index}, indent=2), encoding="utf-8"
    )


def tensor_parallel_slice(name: str, full: torch.Tensor, config: ChatGLM2Config, rank: int, size: int) -> torch.Tensor:
    """This rank's part of THUDM's tensor ``name`` under tensor parallel ``size``, as the split layers hold it.

    ``query_key_value`` rows: ``[Q_r; K_r; V_r]`` (this rank's query heads, then its key/value groups;
    with more ranks than groups, the one group its heads belong to, ``r // (size / groups)``);
    ``dense_h_to_4h`` rows: ``[gate_r; up_r]``; ``dense`` and ``dense_4h_to_h`` weights: a slice of
    columns. Everything else (embedding, norms, output layer, row-split biases) is whole on every rank.
    """
    d = config.kv_channels
    if ".query_key_value." in name:
        if not config.multi_query_attention:  # per-head [q; k; v] blocks: a contiguous run of heads
            return full.chunk(size, dim=0)[rank]
        heads, groups = config.num_attention_heads, config.num_key_value_heads
        copies = size // groups if size > groups else 1
        return section_part(full, (heads * d, groups * d, groups * d), rank, size, (1, copies, copies))
    if ".dense_h_to_4h." in name:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    if name.endswith((".self_attention.dense.weight", ".dense_4h_to_h.weight")):
        return full.chunk(size, dim=1)[rank]
    return full


def load_tensor_parallel(model, state: dict) -> None:
    """Copy a whole (THUDM-named) state dict into a model built under a tensor-parallel layout: each rank
    writes its own slices (``tensor_parallel_slice``) into its shards."""
    import sys

    dtensor = sys.modules.get("torch.distributed.tensor")
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = name if name in state else name.removeprefix("transformer.")
            if key not in state:
                raise WeightsError(f"weight {name} missing from the state dict")
            full = state[key]
            if dtensor is not None and isinstance(param, dtensor.DTensor):
                local = param.to_local()
                mesh = param.device_mesh
                part = full if local.shape == full.shape else tensor_parallel_slice(
                    name, full, model.config, mesh.get_local_rank(), mesh.size())
                local.copy_(part)
            else:
                param.copy_(full)
