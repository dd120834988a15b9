"""GLM-4's P-Tuning v2 checkpoints: THUDM's ``ptuning/`` layout (ChatGLM2's) or the PEFT directory THUDM's GLM-4
``finetune_demo`` saves.

THUDM's GLM-4 ``finetune_demo/finetune.py`` trains P-Tuning v2 through PEFT (``get_peft_model`` with the
``peft_config`` of ``configs/ptuning_v2.yaml``: ``peft_type: PREFIX_TUNING``, ``num_virtual_tokens: 512``,
``num_attention_heads: 2``, ``token_dim: 256``, i.e. glm-4-9b's 2 key/value groups x 128 channels), so what it saves
is a PEFT directory: ``adapter_config.json`` and ``adapter_model.safetensors`` (or ``adapter_model.bin``) holding
one tensor, ``prompt_embeddings`` ``[P, num_layers * 2 * token_dim]``: the prefix encoder's output for each virtual
token (PEFT saves the projected values when ``prefix_projection`` was on, so the file is the same either way).

PEFT's ``PeftModelForCausalLM.get_prompt`` reads each row as ``[num_layers * 2, num_attention_heads, token_dim /
num_attention_heads]`` (layer-major, key then value, group, channel) and hands layer ``i`` the keys at ``2i`` and
values at ``2i + 1`` as a cache in front of the tokens, with the attention mask opened over them: the same order
THUDM's ``get_prompt`` (and ``chatglm2.model.ChatGLM2Model.get_prompt``) reads ``prefix_encoder.embedding.weight``
in. So the PEFT tensor is the prefix encoder's embedding as it is (no projection), and the prefix runs as every
P-Tuning prefix here does: its positions not counted (THUDM's ``ChatGLMModel`` numbers the tokens from 0 when no
``position_ids`` are given, as in finetune_demo's training).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from glm_port.models import WeightsError
from glm_port.models.chatglm2.weights import read_ptuning_checkpoint as read_thudm_checkpoint

ADAPTER_CONFIG = "adapter_config.json"
PEFT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PEFT_KEY = "prompt_embeddings"


def is_peft_directory(directory) -> bool:
    """Whether ``directory`` is a PEFT adapter directory (it holds ``adapter_config.json``)."""
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def read_ptuning_checkpoint(directory, config, pre_seq_len: int | None = None, tensors: bool = True):
    """``(config, state)`` as ``chatglm2.weights.read_ptuning_checkpoint`` gives them (the base ``config`` with the
    prefix settings; the prefix encoder's tensors by their names under it), from THUDM's layout or a PEFT
    prefix-tuning directory (``read_peft_prefix``)."""
    if is_peft_directory(directory):
        return read_peft_prefix(directory, config, pre_seq_len, tensors)
    return read_thudm_checkpoint(directory, config, pre_seq_len, tensors)


def read_peft_prefix(directory, config, pre_seq_len: int | None = None, tensors: bool = True):
    """A PEFT ``PREFIX_TUNING`` directory read as a P-Tuning v2 prefix without projection: ``(config, {"embedding.weight":
    prompt_embeddings})`` (``tensors`` False: the tensor's shape checked, nothing read). A one-line ``WeightsError``
    naming the file for another PEFT type, a prefix whose layers, key/value groups or channels are not the base's, a
    length other than ``pre_seq_len`` (given), or a file without ``prompt_embeddings`` of the configured shape."""
    directory = Path(directory)
    path = directory / ADAPTER_CONFIG
    try:
        peft = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise WeightsError(f"{path}: not a readable JSON file") from None
    if not isinstance(peft, dict):
        raise WeightsError(f"{path}: not a JSON object")
    kind = peft.get("peft_type")
    if kind != "PREFIX_TUNING":
        raise WeightsError(f"{path}: a PEFT {kind} adapter, not prefix tuning (P-Tuning v2 is peft_type "
                           f"PREFIX_TUNING)")
    fields = {}
    for name in ("num_virtual_tokens", "num_layers", "num_attention_heads", "token_dim"):
        value = peft.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise WeightsError(f"{path}: {name} {value!r} is not a positive integer")
        fields[name] = value
    if peft.get("num_transformer_submodules", 1) != 1:
        raise WeightsError(f"{path}: num_transformer_submodules {peft['num_transformer_submodules']!r}: an "
                           f"encoder-decoder prefix, not a GLM-4's (1)")
    groups, channels = config.num_key_value_heads, config.kv_channels
    if (fields["num_layers"], fields["num_attention_heads"], fields["token_dim"]) != (
            config.num_layers, groups, groups * channels):
        raise WeightsError(f"{path}: num_layers {fields['num_layers']}, num_attention_heads "
                           f"{fields['num_attention_heads']}, token_dim {fields['token_dim']}; the base model has "
                           f"{config.num_layers} layers of {groups} key/value groups x {channels} channels "
                           f"(num_attention_heads {groups}, token_dim {groups * channels})")
    length = fields["num_virtual_tokens"]
    if pre_seq_len is not None and pre_seq_len != length:
        raise WeightsError(f"{path}: num_virtual_tokens {length}, not --pre_seq_len {pre_seq_len}")
    weights = next((directory / name for name in PEFT_FILES if (directory / name).is_file()), None)
    if weights is None:
        raise WeightsError(f"{directory / PEFT_FILES[0]}: missing (a PEFT adapter directory holds its weights there, "
                           f"or in {PEFT_FILES[1]})")
    width = config.num_layers * 2 * groups * channels
    embedding = _read_prompt_embeddings(weights, tensors)
    shape = list(embedding.shape if tensors else embedding)
    if shape != [length, width]:
        raise WeightsError(f"{weights}: {PEFT_KEY} is {shape}, expected [{length}, {width}] (num_virtual_tokens x "
                           f"num_layers * 2 * token_dim)")
    prefixed = copy.deepcopy(config)
    prefixed.pre_seq_len, prefixed.prefix_projection, prefixed.prefix_hidden_size = length, False, None
    return prefixed, ({"embedding.weight": embedding} if tensors else {})


def _read_prompt_embeddings(path: Path, tensors: bool):
    """The ``prompt_embeddings`` tensor of a PEFT weights file (``tensors`` False: its shape only)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                if PEFT_KEY not in handle.keys():
                    raise WeightsError(f"{path}: no {PEFT_KEY} (not a PEFT prefix-tuning adapter)")
                return handle.get_tensor(PEFT_KEY) if tensors else tuple(handle.get_slice(PEFT_KEY).get_shape())
        from glm_port.checkpoint_io import load_file

        state = load_file(path, weights_only=True, mmap=True)
    except WeightsError:
        raise
    except Exception as error:  # a truncated or foreign file
        raise WeightsError(f"{path}: not a readable checkpoint ({type(error).__name__})") from None
    import torch

    embeddings = state.get(PEFT_KEY) if isinstance(state, dict) else None
    if not isinstance(embeddings, torch.Tensor):  # absent, or something else pickled under its name
        raise WeightsError(f"{path}: no {PEFT_KEY} tensor (not a PEFT prefix-tuning adapter)")
    return embeddings if tensors else tuple(embeddings.shape)


__all__ = ["ADAPTER_CONFIG", "is_peft_directory", "read_peft_prefix", "read_ptuning_checkpoint"]
