"""Reading a ChatGLM2 directory as THUDM publishes it, with one-line errors for what is wrong with it.

A directory holds ``config.json`` (``model_type`` "chatglm") and the weights as one file or shards:
``pytorch_model-0000N-of-0000M.bin`` + ``pytorch_model.bin.index.json`` (THUDM's), or
``model-0000N-of-0000M.safetensors`` + ``model.safetensors.index.json``, or a single
``pytorch_model.bin`` / ``model.safetensors``. The family and every shard are checked before anything
is read; ``load_pretrained`` then reads tensor by tensor into a model built on the meta device, straight
to the asked dtype and device, and turns a key missing from the shards into an error.

Files are read by the shared reader (``glm_port.models.weights_io``): ``TensorSource`` is its ``Tensors`` over
THUDM's layout (single tensors across shards, read lazily: safetensors' ``safe_open``, ``.bin`` shards
memory-mapped), for conversions that must not hold a whole 6B model twice; the names are ChatGLM2's adapter's
(``adapter.ADAPTER``: THUDM's names are the model's, its constant rotary buffer dropped).

Tensor parallel: ``tensor_parallel_slice`` cuts a THUDM tensor into a rank's part, ``tensor_parallel_merge``
puts the parts back (its exact inverse), both by ChatGLM2's split plan (``splits.split_plan``, the table the
model's layers are built by too). ``ShardSource`` reads a tensor-parallel checkpoint (glm-finetune's
``mp_rank_XX_model_states.pt``, one per rank) by THUDM's names, each tensor merged when asked; every loader
here (``load_pretrained``, ``check_directory``, ``open_weights``) takes such a directory as it takes THUDM's.

P-Tuning v2: ``read_ptuning_checkpoint`` reads THUDM ``ptuning/``'s output directory (``pytorch_model.bin``,
or ``model.safetensors``, holding only ``transformer.prefix_encoder.*``, and its ``config.json``), checked
against the base model's config; ``load_pretrained(BASE, ptuning_checkpoint=DIR)`` builds the base with that
prefix, as THUDM's ``main.py`` / ``web_demo.py`` do with ``--ptuning_checkpoint``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from glm_port.models import WeightsError  # noqa: F401  (the one class of every family: the contract's)
from glm_port.models.chatglm2.adapter import ADAPTER, IGNORED_KEYS  # noqa: F401  (THUDM's names)
from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.models.chatglm2.splits import split_plan
from glm_port.models.weights_io import Tensors, TensorFile, find_layout

MODEL_TYPES = ("chatglm",)
PREFIX_KEYS = "transformer.prefix_encoder."  # a P-Tuning v2 prefix's weights (THUDM saves these alone)
_PROJECTION_KEYS = ("trans.0.weight", "trans.0.bias", "trans.2.weight", "trans.2.bias")


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


def read_config(directory, expected=MODEL_TYPES, quantized: bool = False, prefix: bool = False) -> ChatGLM2Config:
    """The directory's ``ChatGLM2Config``; a one-line error when its ``model_type`` is another family's, or
    when it sets ``quantization_bit`` and ``quantized`` is off (the caller needs float weights), or
    ``pre_seq_len`` and ``prefix`` is off (the caller runs no P-Tuning prefix)."""
    raw = read_config_json(directory)
    model_type = raw.get("model_type")
    if model_type not in expected:
        raise WeightsError(
            f"{Path(directory) / 'config.json'}: model_type {model_type!r} is not a ChatGLM2-family model "
            f"(expected {' or '.join(map(repr, expected))})"
        )
    try:  # a field this port does not run (pre_seq_len...) or a value out of range: one line
        config = ChatGLM2Config.from_pretrained(directory)
        config.check_supported(quantized, prefix)
    except (ValueError, TypeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"{Path(directory) / 'config.json'}: {reason}") from None
    return config


class TensorSource(Tensors):
    """The tensors of a directory of THUDM's layout (one file or shards with an index) by their stored names, each
    read when asked: the shared reader (``weights_io.Tensors``; every shard checked present and readable first)."""

    def __init__(self, directory):
        layout = find_layout(directory)
        if layout.kind == "ranks":
            raise WeightsError(f"{directory}: tensor-parallel rank files (mp_rank_XX), not THUDM's layout: "
                               f"glm-merge them first")
        if layout.kind == "dcp":
            raise WeightsError(f"{directory}: a sharded run's checkpoint, not THUDM's layout: take the run's final/")
        super().__init__(layout)


open_hf = TensorSource


def check_directory(directory, quantized: bool = False, ptuning_checkpoint=None,
                    pre_seq_len: int | None = None) -> ChatGLM2Config:
    """Everything checkable without reading weights: family, config, shards present, no key missing (for a
    tensor-parallel checkpoint: every rank's file, its names and its parts' shapes, ``ShardSource``).
    ``ptuning_checkpoint``: a P-Tuning v2 checkpoint to run on this base (``read_ptuning_checkpoint``, which
    ``pre_seq_len`` checks when given); the config returned then carries its prefix settings."""
    shards = tensor_parallel_checkpoint(directory)
    if shards is not None:
        return shards_config(shards, directory, ptuning_checkpoint)
    raw = read_config_json(directory)
    if raw.get("pre_seq_len") and raw.get("model_type") in MODEL_TYPES:  # a P-Tuning checkpoint given as a model?
        try:
            weights = set(open_hf(directory).keys())
        except WeightsError:
            weights = set()
        if weights and all(key.startswith(PREFIX_KEYS) for key in weights):
            raise WeightsError(f"{directory}: a P-Tuning checkpoint (transformer.prefix_encoder.* weights only), not "
                               f"a model: give it as --ptuning_checkpoint beside the base model")
    config = read_config(directory, quantized=quantized, prefix=ptuning_checkpoint is not None)
    present = set(open_hf(directory).keys())
    if ptuning_checkpoint is not None:
        config, _ = read_ptuning_checkpoint(ptuning_checkpoint, config, pre_seq_len, tensors=False)
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    with torch.device("meta"):
        expected = ChatGLM2ForCausalLM(config).state_dict().keys()
    missing = sorted(k for k in set(expected) - present if ptuning_checkpoint is None or not k.startswith(PREFIX_KEYS))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        hint = (f"; config.json sets pre_seq_len={config.pre_seq_len}: give the P-Tuning checkpoint as "
                f"--ptuning_checkpoint" if missing[0].startswith(PREFIX_KEYS) else "")
        raise WeightsError(f"{directory}: weight {missing[0]} missing from the checkpoint{more}{hint}")
    return config


def shards_config(shards, directory, ptuning_checkpoint=None):
    """``check_directory``'s answer for the tensor-parallel shards ``shards`` at ``directory``: their config; a
    P-Tuning checkpoint given with them is one line (its prefix goes on one directory of THUDM's layout)."""
    if ptuning_checkpoint is not None:
        raise WeightsError(f"{directory}: tensor-parallel shards; a P-Tuning checkpoint goes with one directory "
                           f"of THUDM's layout (glm-merge the shards first)")
    return shards.config


def check_quantize(path, mode, group_size) -> None:
    """Before any weight is read: a ``WeightsError`` (one line) when ``--quantize int4``'s group size does not divide
    the row of a linear ``Family.quantize`` would replace (the layers' four; the output layer is kept)."""
    if mode != "int4":
        return
    check_quantize_rows(check_directory(path, quantized=True), mode, group_size)


def check_quantize_rows(config, mode, group_size) -> None:
    """``check_quantize`` on a config already read (a ChatGLM2-layout config: GLM-4's too)."""
    if mode != "int4":
        return
    group = group_size or 128
    rows = {"self_attention.query_key_value": config.hidden_size,
            "self_attention.dense": config.num_attention_heads * config.kv_channels,
            "mlp.dense_h_to_4h": config.hidden_size, "mlp.dense_4h_to_h": config.ffn_hidden_size}
    for name, features in rows.items():
        if features % group:
            raise WeightsError(f"--quantize-group-size {group}: int4 group size {group} does not divide the row of "
                             f"{features} input features of transformer.encoder.layers.*.{name}")


def read_ptuning_checkpoint(directory, config: ChatGLM2Config, pre_seq_len: int | None = None,
                            tensors: bool = True) -> tuple[ChatGLM2Config, dict]:
    """``(config, state)``: the base model's ``config`` with the prefix settings of the P-Tuning v2 checkpoint
    in ``directory`` (THUDM ``ptuning/``'s output: ``pytorch_model.bin`` or ``model.safetensors`` holding
    ``transformer.prefix_encoder.*``, ``config.json`` optional), and the prefix encoder's tensors by their
    names under it (``tensors`` False: shapes only, nothing read). A ``WeightsError`` naming the file when
    the prefix does not fit the base (its layers, key/value groups or channels), when its length is not
    ``pre_seq_len`` (given) or what its ``config.json`` records, or when the file holds no prefix."""
    import copy

    from glm_port.models.chatglm2.model import prefix_width

    directory = Path(directory)
    if not directory.is_dir():
        raise WeightsError(f"{directory}: not a directory (a P-Tuning checkpoint is the directory THUDM's "
                           f"ptuning/main.py saves: pytorch_model.bin and config.json)")
    path = next((directory / name for name in ("pytorch_model.bin", "model.safetensors")
                 if (directory / name).is_file()), None)
    if path is None:
        raise WeightsError(f"{directory / 'pytorch_model.bin'}: missing (a P-Tuning checkpoint holds its prefix "
                           f"encoder there, or in model.safetensors)")
    file = TensorFile(path)  # the shared reader: a truncated or foreign file is one line naming it
    names = [k for k in file.keys() if isinstance(k, str) and k.startswith(PREFIX_KEYS)]
    found = {k: file.get(k) if tensors else None for k in names}
    shapes = {k: tuple(file.shape(k)) for k in names}
    state = {k[len(PREFIX_KEYS):]: v for k, v in found.items()}
    shapes = {k[len(PREFIX_KEYS):]: v for k, v in shapes.items()}
    if "embedding.weight" not in shapes:
        raise WeightsError(f"{path}: no {PREFIX_KEYS}embedding.weight (not a P-Tuning v2 checkpoint)")
    unknown = sorted(set(shapes) - {"embedding.weight", *_PROJECTION_KEYS})
    if unknown:
        raise WeightsError(f"{path}: {PREFIX_KEYS}{unknown[0]} is not a prefix encoder weight")
    embedding = shapes["embedding.weight"]
    width, per_layer = prefix_width(config), 2 * config.num_key_value_heads * config.kv_channels
    if len(embedding) != 2 or embedding[1] != width:
        got = embedding[-1] if embedding else 0
        fits = f"a prefix for {got // per_layer} layers" if got % per_layer == 0 else "no whole number of layers"
        raise WeightsError(f"{path}: {PREFIX_KEYS}embedding.weight is {list(embedding)}, {fits}; the base model has "
                           f"{config.num_layers} layers of {config.num_key_value_heads} key/value groups x "
                           f"{config.kv_channels} channels ([pre_seq_len, {width}])")
    length = embedding[0]
    recorded = {}
    if (directory / "config.json").is_file():
        recorded = read_config_json(directory)
    if recorded.get("pre_seq_len") not in (None, length):
        raise WeightsError(f"{directory / 'config.json'}: pre_seq_len {recorded['pre_seq_len']!r}, but {path.name}'s "
                           f"prefix has {length} positions")
    if pre_seq_len is not None and pre_seq_len != length:
        raise WeightsError(f"{path}: the prefix has {length} positions, not --pre_seq_len {pre_seq_len}")
    projection = "trans.0.weight" in shapes
    if "prefix_projection" in recorded and recorded["prefix_projection"] is not None \
            and bool(recorded["prefix_projection"]) != projection:
        raise WeightsError(f"{directory / 'config.json'}: prefix_projection {recorded['prefix_projection']!r}, but "
                           f"{path.name} {'holds' if projection else 'has no'} the projection's weights")
    middle = None
    if projection or any(k in shapes for k in _PROJECTION_KEYS):
        absent = [k for k in _PROJECTION_KEYS if k not in shapes]
        if absent:
            raise WeightsError(f"{path}: {PREFIX_KEYS}{absent[0]} missing (the prefix projection is incomplete)")
        middle = shapes["trans.0.weight"][0]
        wanted = {"trans.0.weight": (middle, width), "trans.0.bias": (middle,), "trans.2.weight": (width, middle),
                  "trans.2.bias": (width,)}
        for key, shape in wanted.items():
            if shapes[key] != shape:
                raise WeightsError(f"{path}: {PREFIX_KEYS}{key} is {list(shapes[key])}, expected {list(shape)}")
    config = copy.deepcopy(config)
    config.pre_seq_len, config.prefix_projection = length, projection
    config.prefix_hidden_size = middle if middle not in (None, config.hidden_size) else None
    return config, state


def default_dtype(device) -> torch.dtype:
    """fp32 on CPU, bf16 on an accelerator."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


# THUDM's ``ChatGLMModel.quantize``: the four linears of every layer; embedding and output layer stay float.
QUANTIZED_LINEARS = ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                     "mlp.dense_4h_to_h")


def _group_for(in_features: int) -> int:
    """An int4 group size dividing the row (THUDM's one scale a row is repeated over the groups: any does)."""
    return next(g for g in (128, 64, 32) if in_features % g == 0)


def _quantize_thudm(model, config, source, dtype, device) -> None:
    """``config.quantization_bit``: the layers' four linears as THUDM's ``QuantizedLinear``s, built by
    ``shim.nn.quantized.from_thudm``: from the checkpoint's int8 tensors and ``weight_scale`` when it holds
    them (THUDM's published int4/int8 checkpoints, read as they are), else quantized now by THUDM's recipe
    (``quantize_thudm``) from the float weights already loaded into ``model``."""
    from shim.nn.quantized import from_thudm, quantize_thudm

    bits = config.quantization_bit
    for index, layer in enumerate(model.transformer.encoder.layers):
        for path in QUANTIZED_LINEARS:
            parent_name, child_name = path.split(".")
            parent = getattr(layer, parent_name)
            linear = getattr(parent, child_name)
            prefix = f"transformer.encoder.layers.{index}.{path}"
            bias = linear.bias.detach() if linear.bias is not None else None
            try:
                if source is not None and f"{prefix}.weight_scale" in source:
                    weight = source[f"{prefix}.weight"].to(device)
                    scale = source[f"{prefix}.weight_scale"].to(device)
                    if weight.dtype != torch.int8:
                        raise ValueError(f"{prefix}.weight is {weight.dtype}, not the int8 of a "
                                         f"quantization_bit={bits} checkpoint")
                else:
                    weight, scale = quantize_thudm(linear.weight.detach().float(), bits)
                layer_q = from_thudm(weight, scale, bits, bias, in_features=linear.in_features,
                                     group_size=_group_for(linear.in_features), dtype=dtype)
            except ValueError as error:
                raise WeightsError(f"{prefix}: {str(error).splitlines()[0]}") from None
            setattr(parent, child_name, layer_q.pack())


def _load_thudm_quantized(directory, config, dtype, device):
    """A directory whose layers' linears are stored quantized (``weight`` int8 and ``weight_scale``): the
    model built on the meta device, the quantized layers built from their tensors, the rest assigned."""
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    source = TensorSource(directory)
    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(config)
    for index in range(config.num_layers):  # every layer quantized, or the checkpoint is refused
        for path in QUANTIZED_LINEARS:
            key = f"transformer.encoder.layers.{index}.{path}.weight_scale"
            if key not in source:
                raise WeightsError(f"{directory}: {key} missing from a quantization_bit={config.quantization_bit} "
                                   f"checkpoint")
    quantized = {f"transformer.encoder.layers.{i}.{p}.weight" for i in range(config.num_layers)
                 for p in QUANTIZED_LINEARS}
    state = {}
    for name in model.state_dict():
        if name not in quantized:
            tensor = source[name]
            state[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).to(device)
    model.load_state_dict(state, strict=False, assign=True)  # the biases of the quantized layers included
    _quantize_thudm(model, config, source, dtype, device)
    left = [name for name, p in model.named_parameters() if p.is_meta]
    if left:
        raise WeightsError(f"{directory}: weight {left[0]} missing from the checkpoint")
    return model.to(device=device).eval()


def load_pretrained(directory, dtype=None, device="cpu", quantize=None, group_size=None, quantized: bool = True,
                    ptuning_checkpoint=None, pre_seq_len: int | None = None):
    """``ChatGLM2ForCausalLM`` from a ChatGLM2 directory, shard by shard to ``dtype`` on ``device``, eval mode;
    or from a tensor-parallel checkpoint (``mp_rank_XX`` files, merged by ``tensor_parallel_merge``).

    ``config.json``'s ``quantization_bit`` (4 or 8), as THUDM's code reads it: the layers' linears stored
    quantized (int8 ``weight``, per-row ``weight_scale``) are read as they are; stored in float, they are
    quantized now by THUDM's recipe. ``quantize`` ("int8" or "int4", ``group_size`` default 128): the
    linears quantized after loading (``Family.quantize``: the output layer kept in float). ``quantized``
    False: a ``quantization_bit`` directory is refused (one line), for callers that need float weights.
    ``ptuning_checkpoint``: THUDM P-Tuning v2's output directory, its prefix put on this base
    (``read_ptuning_checkpoint``; ``pre_seq_len``, when given, must be its length)."""
    from glm_port.models import FAMILIES

    dtype = dtype or default_dtype(device)
    model = _load_pretrained(directory, dtype, device, quantized, ptuning_checkpoint, pre_seq_len)
    model.config._name_or_path = str(directory)  # as transformers' from_pretrained records it
    if quantize is not None:
        FAMILIES["chatglm2"].quantize(model, quantize, group_size)
    return model


def _read_model(config, source, dtype, device, where):
    """``ChatGLM2ForCausalLM(config)`` built on the meta device and filled from ``source`` (tensors by the model's
    names: ``TensorSource``, ``ShardSource``) tensor by tensor, each cast to ``dtype`` and moved to ``device`` as
    it is read; a weight missing or of another shape is one line naming it."""
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(config)
    state = {}
    for name, want in model.state_dict().items():
        if name not in source:
            raise WeightsError(f"{where}: weight {name} missing from the checkpoint")
        tensor = source[name]
        if list(tensor.shape) != list(want.shape):
            raise WeightsError(f"{where}: {name} is {list(tensor.shape)}, the config gives {list(want.shape)}")
        state[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).to(device)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=device).eval()


def _load_pretrained(directory, dtype, device, quantized, ptuning_checkpoint=None, pre_seq_len=None):
    shards = tensor_parallel_checkpoint(directory)
    if shards is not None and ptuning_checkpoint is None:  # merged tensor by tensor into a model built on meta
        model = _read_model(shards.config, shards, dtype, device, directory)
        if shards.config.quantization_bit:
            _quantize_thudm(model, shards.config, None, dtype, device)
        return model
    config = check_directory(directory, quantized=quantized, ptuning_checkpoint=ptuning_checkpoint,
                             pre_seq_len=pre_seq_len)
    model = _load_base(directory, config, dtype, device, drop_prefix=ptuning_checkpoint is not None)
    if ptuning_checkpoint is not None:  # the base as it is, then the prefix put on it (fp32, THUDM's)
        from glm_port.models.chatglm2.model import attach_prefix

        _, state = read_ptuning_checkpoint(ptuning_checkpoint, model.config, pre_seq_len)
        attach_prefix(model, config.pre_seq_len, config.prefix_projection, config.prefix_hidden_size,
                      {k: v.float() for k, v in state.items()})
    return model.eval()


def _load_base(directory, config, dtype, device, drop_prefix: bool):
    if drop_prefix:  # the model the base directory holds, without the prefix that goes on it afterwards
        import copy

        config = copy.deepcopy(config)
        config.pre_seq_len, config.prefix_projection, config.prefix_hidden_size = None, False, None
    source = TensorSource(directory)
    if config.quantization_bit and any(key.endswith(".weight_scale") for key in source.keys()):
        return _load_thudm_quantized(directory, config, dtype, device)
    model = _read_model(config, source, dtype, device, directory)
    if (Path(directory) / "generation_config.json").is_file():  # as transformers' from_pretrained takes it
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(directory)
    if config.quantization_bit:  # a full-precision directory: quantized at load, as THUDM's code does
        _quantize_thudm(model, config, None, dtype, device)
    return model


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
    """This rank's part of THUDM's tensor ``name`` under tensor parallel ``size``, as the split layers hold it:
    cut as ChatGLM2's split plan says (``splits.split_plan``).

    ``query_key_value`` rows: ``[Q_r; K_r; V_r]`` (this rank's query heads, then its key/value groups;
    with more ranks than groups, the one group its heads belong to, ``r // (size / groups)``);
    ``dense_h_to_4h`` rows: ``[gate_r; up_r]``; ``dense`` and ``dense_4h_to_h`` weights: a slice of
    columns. Everything else (embedding, norms, output layer, row-split biases) is whole on every rank.
    A tensor that does not split so is a one-line WeightsError.
    """
    try:
        return split_plan(config, size).slice(name, full, rank, size)
    except ValueError as error:
        shape = list(full.shape) if isinstance(full, torch.Tensor) else list(full.get_shape())  # a lazy slice's
        raise WeightsError(f"{name} {shape} does not split over tensor-parallel size {size} "
                           f"({error})") from None


# Parts several ranks hold (a key/value group at T > G; whole tensors) are taken from the first rank holding
# them; the others must agree with it to this tolerance (compared in float32; rtol at least two units of the
# stored dtype's precision, so a bf16 copy may be a rounding or two apart). Training keeps copies equal
# (bitwise on CPU); a larger difference means the files are not one run's shards.
COPY_RTOL, COPY_ATOL = 1e-3, 1e-5


def tensor_parallel_merge(name: str, parts: list, config: ChatGLM2Config) -> torch.Tensor:
    """THUDM's whole tensor ``name`` from every rank's part (in rank order), merged as ChatGLM2's split plan
    says: ``tensor_parallel_slice``'s inverse, so ``merge([slice(full, r) for r])`` is ``full`` exactly.

    ``query_key_value`` rows: each rank's ``[Q_r; K_r; V_r]`` put back as ``[Q | K | V]`` (a key/value group
    several ranks hold, T > G, read from the first of them); ``dense_h_to_4h``: the ``gate_r`` halves, then
    the ``up_r`` halves; ``dense`` and ``dense_4h_to_h`` weights: the columns side by side; everything else is
    whole on every rank: the first rank's. Then every part must be its rank's slice of the result: the
    same shape, and a copy equal to the first (to ``COPY_RTOL``, ``COPY_ATOL``); else a one-line WeightsError.
    """
    size = len(parts)
    shapes = [list(p.shape) for p in parts]
    try:
        whole = split_plan(config, size).merge(name, parts)
    except (RuntimeError, ValueError):  # parts that do not even fit together
        raise WeightsError(f"{name}: parts of shapes {shapes} are not {size} tensor-parallel slices of one "
                           f"tensor of this model") from None
    for rank, part in enumerate(parts):
        expected = tensor_parallel_slice(name, whole, config, rank, size)
        if list(expected.shape) != list(part.shape):
            raise WeightsError(f"{name}: rank {rank}'s part is {list(part.shape)}, its slice of tensor parallel "
                               f"{size} would be {list(expected.shape)} (shards of another model or degree?)")
        if part is not expected and not torch.equal(part, expected):
            a, b = part.float(), expected.float()
            rtol = max(COPY_RTOL, 2 * torch.finfo(part.dtype).eps) if part.is_floating_point() else 0.0
            if not part.is_floating_point() or not torch.allclose(a, b, rtol=rtol, atol=COPY_ATOL):
                raise WeightsError(f"{name}: rank {rank}'s copy differs from the first rank's by up to "
                                   f"{(a - b).abs().max().item():.3g} (shards of different runs?)")
    return whole


class ShardSource:
    """A tensor-parallel ChatGLM2 checkpoint (``mp_rank_XX_model_states.pt``, one per rank, as glm-finetune
    writes them with the config under ``'glm_config'``) read by THUDM's names, each tensor merged
    (``tensor_parallel_merge``) when asked. The files are memory-mapped. Checked on opening, before any
    tensor is read: every rank's file present, its config a ChatGLM2 one, the same names in every file and
    exactly the model's, each part the shape of its rank's slice."""

    def __init__(self, directory, files: list[Path]):
        from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

        self.directory, self.files = Path(directory), files
        ranks = [TensorFile(f, ADAPTER.to_model) for f in files]  # the shared reader, THUDM's names
        raw = ranks[0].config()
        if not isinstance(raw, dict) or raw.get("model_type") not in MODEL_TYPES:
            found = raw.get("model_type") if isinstance(raw, dict) else None
            raise WeightsError(f"{files[0]}: not a ChatGLM2 checkpoint (its saved config's model_type is "
                               f"{found!r}, expected {' or '.join(map(repr, MODEL_TYPES))})")
        self.config = ChatGLM2Config.from_dict({k: v for k, v in raw.items() if k != "model_type"})
        try:
            self.config.check_supported()
        except ValueError as error:
            raise WeightsError(f"{files[0]}: {error}") from None
        self.modules = [{k: rank.get(k) for k in rank.keys()} for rank in ranks]
        with torch.device("meta"):
            expected = {k: v.shape for k, v in ChatGLM2ForCausalLM(self.config).state_dict().items()}
        size = len(files)
        for path, module in zip(files, self.modules):
            missing = [k for k in expected if k not in module]
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise WeightsError(f"{path}: weight {missing[0]} missing from the checkpoint{more}")
            unexpected = [k for k in module if k not in expected]
            if unexpected:
                raise WeightsError(f"{path}: unexpected weight {unexpected[0]} (not a ChatGLM2 of this config?)")
        for name, shape in expected.items():
            whole = torch.empty(shape, device="meta")
            for rank, (path, module) in enumerate(zip(files, self.modules)):
                try:
                    want = list(tensor_parallel_slice(name, whole, self.config, rank, size).shape)
                except WeightsError:  # the saved config's tensor does not even cut into this many parts
                    want = f"none ({list(shape)} does not cut into {size} parts)"
                if list(module[name].shape) != want:
                    raise WeightsError(f"{path}: {name} is {list(module[name].shape)}, rank {rank}'s slice at "
                                       f"tensor parallel {size} of the saved config is {want} (a rank's file "
                                       f"missing, or one from another model or degree?)")
        self._names = list(expected)

    @property
    def size(self) -> int:
        return len(self.files)

    def keys(self):
        return list(self._names)

    def __contains__(self, key) -> bool:
        return key in self.modules[0]

    def __getitem__(self, key) -> torch.Tensor:
        if key not in self.modules[0]:
            raise WeightsError(f"{self.directory}: weight {key} missing from the checkpoint")
        try:
            return tensor_parallel_merge(key, [m[key] for m in self.modules], self.config)
        except WeightsError as error:
            raise WeightsError(f"{self.directory}: {error}") from None


def tensor_parallel_checkpoint(directory) -> ShardSource | None:
    """``ShardSource`` over the tensor-parallel checkpoint at ``directory`` (a directory with a checkpoint
    tracker, an iteration directory, or one ``mp_rank_XX`` file); None when it holds THUDM's layout (or none)."""
    from glm_port.checkpoint_io import shard_directory

    path = Path(directory)
    if shard_directory(path) is None:
        return None
    layout = find_layout(path)  # the shared reader: THUDM's files first, then the ranks' (every one named)
    if layout.kind == "hf":
        return None
    if layout.kind == "dcp":
        raise WeightsError(f"{layout.directory}: a sharded run's checkpoint, not read as a ChatGLM2 model: take the "
                           f"run's final/ (mp_rank_XX shards)")
    return ShardSource(path, layout.files)


def open_weights(directory):
    """The tensors of a ChatGLM2 directory by THUDM's names, read lazily: ``TensorSource`` (THUDM's layout)
    or ``ShardSource`` (a tensor-parallel checkpoint)."""
    return tensor_parallel_checkpoint(directory) or TensorSource(directory)


def load_tensor_parallel(model, state) -> None:
    """Copy a whole (THUDM-named) state dict into a model built under a tensor-parallel layout: each rank
    writes its own slices (``tensor_parallel_slice``) into its shards. From the shared reader's ``Tensors``
    (``TensorSource``), a rank reads only its slice of a split safetensors weight (``Tensors.part``)."""
    import sys

    dtensor = sys.modules.get("torch.distributed.tensor")
    lazy = getattr(state, "part", None)  # a safetensors slice (read when indexed) or the tensor
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = name if name in state else name.removeprefix("transformer.")
            if key not in state:
                raise WeightsError(f"weight {name} missing from the state dict")
            if dtensor is not None and isinstance(param, dtensor.DTensor):
                local = param.to_local()
                mesh = param.device_mesh
                full = lazy(key) if lazy is not None else state[key]
                shape = list(full.shape) if isinstance(full, torch.Tensor) else list(full.get_shape())
                part = full if list(local.shape) == shape else tensor_parallel_slice(
                    name, full, model.config, mesh.get_local_rank(), mesh.size())
                local.copy_(part if isinstance(part, torch.Tensor) else part[:])
            else:
                param.copy_(state[key])
