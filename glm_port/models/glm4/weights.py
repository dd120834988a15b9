"""Reading a GLM-4 directory: THUDM's layout (``model_type: chatglm``, ChatGLM2's tensor names) or transformers'
native ``GlmForCausalLM`` layout (``model_type: glm``, glm-4-9b-chat-hf), with one-line errors.

Both are read tensor by tensor across shards by the shared reader (``weights_io``: safetensors or ``.bin``, one
file or an index), each cast to the asked dtype as it is read, into a model built on the meta device; the names
are GLM-4's adapters (``adapter``, ChatGLM2's): THUDM's layout is the model's names (its constant rotary buffer
dropped), the transformers layout is mapped to them by ``from_glm_plan`` (``q|k|v_proj`` joined into
``query_key_value``; ``gate_up_proj`` is ``dense_h_to_4h`` as it is) and its config by
``chatglm2.convert.from_glm_config`` (``rope_theta`` = 10000 x ``rope_ratio``, ``partial_rotary_factor`` 0.5).
A weight missing or left over is a ``WeightsError`` naming it before the model is used.

Tensor-parallel shards (glm-finetune ``--tensor_parallel_degree``'s ``mp_rank_XX_model_states.pt``, the config
under ``'glm_config'``) are read as ChatGLM2's are (``chatglm2.weights.ShardSource``: each tensor merged by the
split plan when asked), their config read as GLM-4's (``shard_source``): every reader here takes such a
directory as it takes THUDM's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from glm_port.models import WeightsError
from glm_port.models.glm4.adapter import ADAPTER, from_glm_plan
from glm_port.models.chatglm2.weights import (default_dtype, open_hf, read_config_json, shards_config,
                                              tensor_parallel_checkpoint)
from glm_port.models.glm4.config import GLM4Config
from glm_port.models.glm4.detect import is_glm4, is_rank_file, is_transformers_glm
from glm_port.models.glm4.ptuning import read_ptuning_checkpoint  # THUDM's layout or finetune_demo's PEFT directory


def shard_source(directory):
    """The tensor-parallel checkpoint at ``directory`` (``chatglm2.weights.ShardSource``, checked on opening) with
    its ``config`` a ``GLM4Config``; None when ``directory`` holds no shards."""
    source = tensor_parallel_checkpoint(directory)
    if source is not None:
        saved = {k: v for k, v in source.config.to_dict().items() if k not in ("model_type", "transformers_version")}
        source.config = GLM4Config(**saved)
    return source


def read_config(directory) -> GLM4Config:
    """The directory's ``GLM4Config`` (THUDM's fields, or transformers' ``GlmConfig`` mapped); a one-line
    ``WeightsError`` when the directory is not GLM-4's or asks for what this port does not run."""
    raw = read_config_json(directory)
    path = Path(directory) / "config.json"
    if not is_glm4(directory, raw):
        raise WeightsError(f"{path}: not a GLM-4 directory (model_type {raw.get('model_type')!r}; GLM-4's is 'chatglm' "
                           f"with a tiktoken tokenizer.model, or transformers' 'glm' GlmForCausalLM)")
    try:
        if is_transformers_glm(raw):
            from glm_port.models.chatglm2.convert import from_glm_config

            mapped = from_glm_config(raw).to_dict()
            config = GLM4Config(**{k: v for k, v in mapped.items() if k not in ("model_type", "transformers_version")})
        else:
            config = GLM4Config.from_pretrained(directory)
        config.check_supported()
    except WeightsError as error:
        raise WeightsError(f"{path}: {error}") from None
    except (ValueError, TypeError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"{path}: {reason}") from None
    return config


def weight_plan(directory, config: GLM4Config, source=None) -> list[tuple[str, object]]:
    """``[(our tensor name, function reading it)]`` for the directory's layout, tensor-parallel shards too
    (``source``: its tensors already opened, ``chatglm2.weights.open_hf``)."""
    shards = shard_source(directory)
    if shards is not None:
        return [(name, lambda name=name: shards[name]) for name in shards.keys()]
    source = source if source is not None else open_hf(directory)
    if is_transformers_glm(read_config_json(directory)):
        return from_glm_plan(config, source)
    return [(model, lambda name=name: source[name]) for name in source.keys()
            if (model := ADAPTER.to_model(name)) is not None]


class PlannedWeights:
    """A GLM-4 directory's tensors by our (THUDM's) names, each read when asked (``weight_plan``); ``part(name)``
    (what ``chatglm2.weights.load_tensor_parallel`` cuts a rank's slice from): a lazy safetensors slice where the
    stored tensor is the model's (``source``, THUDM's layout), else the tensor."""

    def __init__(self, plan, source=None):
        self.plan = dict(plan)
        self.source = source

    def part(self, name):
        return self.source.part(name) if self.source is not None else self.plan[name]()

    def __contains__(self, name) -> bool:
        return name in self.plan

    def __iter__(self):
        return iter(self.plan)

    def keys(self):
        return self.plan.keys()

    def __getitem__(self, name):
        return self.plan[name]()


def open_weights(directory, config: GLM4Config | None = None) -> PlannedWeights:
    """The directory's tensors by THUDM's names (either layout), each read lazily when asked (the weights binding's
    ``open_weights``; ``generation.load_split`` copies each rank's slices from it); ``config``: its config already
    read. Tensor-parallel shards: their ``ShardSource`` (``shard_source``), whose ``config`` is theirs."""
    shards = shard_source(directory)
    if shards is not None:
        return shards
    config, source = config or read_config(directory), open_hf(directory)
    stored_as_ours = not is_transformers_glm(read_config_json(directory))
    return PlannedWeights(weight_plan(directory, config, source), source if stored_as_ours else None)


def _expected(config: GLM4Config) -> dict[str, torch.Size]:
    from glm_port.models.glm4.model import GLM4ForCausalLM

    with torch.device("meta"):
        return {k: v.shape for k, v in GLM4ForCausalLM(config).state_dict().items()}


def check_directory(directory, ptuning_checkpoint=None, pre_seq_len: int | None = None) -> GLM4Config:
    """Everything checkable without reading a tensor: GLM-4's config, the shards present, no weight missing
    or left over (tensor-parallel shards: every rank's file, names and parts' shapes, checked on opening).
    ``ptuning_checkpoint``: a P-Tuning v2 checkpoint to run on this base (``chatglm2.weights.read_ptuning_checkpoint``,
    its prefix checked against the base's layers, groups and channels; ``pre_seq_len``, when given, its length);
    the config returned then carries its prefix settings."""
    shards = shard_source(directory)
    if shards is not None:
        return shards_config(shards, directory, ptuning_checkpoint)
    config = read_config(directory)
    if ptuning_checkpoint is not None:
        config = _checked_directory(directory, config)
        config, _ = read_ptuning_checkpoint(ptuning_checkpoint, config, pre_seq_len, tensors=False)
        return config
    return _checked_directory(directory, config)


def _checked_directory(directory, config: GLM4Config) -> GLM4Config:
    """``config`` once the directory's weight names are exactly its model's (one line for the first missing or
    left over)."""
    names = {name for name, _ in weight_plan(directory, config)}
    expected = _expected(config)
    missing = sorted(set(expected) - names)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{directory}: weight {missing[0]} missing from the checkpoint{more}")
    unexpected = sorted(names - set(expected))
    if unexpected:
        raise WeightsError(f"{directory}: unexpected weight {unexpected[0]} (not a GLM-4 of this config?)")
    return config


def load_pretrained(directory, dtype=None, device="cpu", quantize=None, group_size=None, quantized: bool = False,
                    ptuning_checkpoint=None, pre_seq_len: int | None = None):
    """``GLM4ForCausalLM`` from a GLM-4 directory (either layout, or tensor-parallel shards), tensor by tensor to
    ``dtype`` (default: fp32 on CPU, bf16 on an accelerator) on ``device``, eval mode; ``quantize``
    ("int8"/"int4"): the linears quantized after loading (``Family.quantize``; the output layer kept in float).
    ``quantized``: the weights binding's flag for a layout stored quantized, which GLM-4 has none of (its
    directories hold float weights): accepted and changes nothing. ``ptuning_checkpoint``: a P-Tuning v2
    checkpoint (glm-finetune ``--pre_seq_len``'s output, THUDM's layout) whose prefix is put on the model
    (``chatglm2.model.attach_prefix``, fp32, as THUDM's code keeps it); ``pre_seq_len``, when given, its length."""
    from glm_port.models.glm4.model import GLM4ForCausalLM

    dtype = dtype or default_dtype(device)
    if ptuning_checkpoint is not None:
        check_directory(directory, ptuning_checkpoint, pre_seq_len)  # the prefix's fit, before a tensor is read
    config = check_directory(directory)
    expected = _expected(config)
    with torch.device("meta"):
        model = GLM4ForCausalLM(config)
    state = {}
    for name, read in weight_plan(directory, config):
        tensor = read()
        if list(tensor.shape) != list(expected[name]):
            raise WeightsError(f"{directory}: {name} is {list(tensor.shape)}, the config gives "
                               f"{list(expected[name])}")
        state[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).to(device)
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device=device).eval()
    if ptuning_checkpoint is not None:
        from glm_port.models.chatglm2.model import attach_prefix

        prefixed, prefix = read_ptuning_checkpoint(ptuning_checkpoint, model.config, pre_seq_len)
        attach_prefix(model, prefixed.pre_seq_len, prefixed.prefix_projection, prefixed.prefix_hidden_size,
                      {k: v.float() for k, v in prefix.items()})
        model.eval()
    if quantize is not None:
        from glm_port.models import FAMILIES

        FAMILIES["glm4"].quantize(model, quantize, group_size)
    return model


def load_tokenizer(directory):
    """The directory's ``GLM4Tokenizer``: THUDM's tiktoken ``tokenizer.model`` (its ``tokenizer_config.json``'s chat
    template when it has one), or, without one, the ranks behind a ``tokenizer.json`` (glm-4-9b-chat-hf's,
    ``tokenizer.ranks_from_tokenizer_json``), written as a rank file into a temporary directory, with the
    directory's chat template (``tokenizer_config.json``'s, or ``chat_template.jinja``)."""
    from glm_port.models.glm4.tokenizer import GLM4Tokenizer

    path = Path(directory) / "tokenizer.model"
    if not path.is_file() and (Path(directory) / "tokenizer.json").is_file():
        return _from_tokenizer_json(Path(directory))
    if not path.is_file():
        raise WeightsError(f"{path}: missing (GLM-4 reads THUDM's tiktoken tokenizer.model, or a tokenizer.json)")
    if not is_rank_file(path):
        raise WeightsError(f"{path}: not a tiktoken rank file ('base64 rank' lines), as GLM-4's is")
    try:
        return GLM4Tokenizer.from_pretrained(str(directory))
    except ValueError as error:
        raise WeightsError(str(error).strip().splitlines()[0]) from None


def _from_tokenizer_json(directory: Path):
    import json
    import tempfile

    from glm_port.models.glm4.tokenizer import GLM4Tokenizer, ranks_from_tokenizer_json, write_rank_file

    try:
        ranks = ranks_from_tokenizer_json(directory / "tokenizer.json")
    except ValueError as error:
        raise WeightsError(str(error)) from None
    template = None
    config = directory / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except ValueError:
            raise WeightsError(f"{config}: not valid JSON") from None
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    vocab = write_rank_file(ranks, Path(tempfile.mkdtemp(prefix="glm4-tokenizer-")) / "tokenizer.model")
    return GLM4Tokenizer(vocab, chat_template=template if isinstance(template, str) else None)


__all__ = ["PlannedWeights", "WeightsError", "check_directory", "load_pretrained", "load_tokenizer", "open_weights",
           "read_config", "shard_source", "weight_plan"]
