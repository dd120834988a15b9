"""ChatGLM2 <-> transformers' native ``GlmForCausalLM`` (model_type "glm"): the same network, other names.

transformers' GLM family (written for GLM-4) has ChatGLM2's layout, so a ChatGLM2 checkpoint becomes a
directory ``AutoModelForCausalLM.from_pretrained`` loads without remote code, and back:

=====================================================  ==========================================
ChatGLM2 (THUDM)                                       transformers GlmForCausalLM
=====================================================  ==========================================
transformer.embedding.word_embeddings.weight           model.embed_tokens.weight
...layers.{i}.input_layernorm.weight                   model.layers.{i}.input_layernorm.weight
...layers.{i}.self_attention.query_key_value.{w,b}     ...self_attn.{q,k,v}_proj.{w,b}: rows H*d | G*d | G*d
...layers.{i}.self_attention.dense.weight              ...self_attn.o_proj.weight
...layers.{i}.post_attention_layernorm.weight          ...post_attention_layernorm.weight
...layers.{i}.mlp.dense_h_to_4h.weight                 ...mlp.gate_up_proj.weight (gate | up, as is)
...layers.{i}.mlp.dense_4h_to_h.weight                 ...mlp.down_proj.weight
transformer.encoder.final_layernorm.weight             model.norm.weight
transformer.output_layer.weight                        lm_head.weight
=====================================================  ==========================================

Config: ``num_key_value_heads`` = ``multi_query_group_num``, ``head_dim`` = ``kv_channels``,
``partial_rotary_factor`` 0.5, ``attention_bias`` = ``add_qkv_bias``, ``rope_theta`` = 10000 x
``rope_ratio`` (chatglm2-6b-32k's divided positions become ``rope_type`` "linear"). Rotary embeddings
need no permutation: transformers' GLM rotates interleaved pairs of the first half of each head, as
THUDM's code does (LLaMA-style checkpoints would need one; this family does not).

Both directions read tensors one at a time across shards and write safetensors shards into a
temporary directory that is renamed to DST at the end, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.outputs import check_apart, check_directory_output, discard, publish, save_safetensors, work_directory
from glm_port.models.chatglm2.adapter import from_glm_plan, to_glm_plan  # noqa: F401  (re-exported)
from glm_port.models.chatglm2.weights import (IGNORED_KEYS, TensorSource, WeightsError, read_config,
                                              read_config_json)

TOKENIZER_FILES = ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
TRANSFORMERS_MODEL_TYPES = ("glm",)  # transformers' native GlmForCausalLM, what from_transformers reads


# ---------------------------------------------------------------- configs
def to_glm_config(config: ChatGLM2Config):
    """The ``GlmConfig`` of the same network; a one-line error for options transformers' GLM lacks."""
    from transformers import GlmConfig

    unsupported = {
        "rmsnorm": (config.rmsnorm, True), "add_bias_linear": (config.add_bias_linear, False),
        "post_layer_norm": (config.post_layer_norm, True),
        "apply_residual_connection_post_layernorm": (config.apply_residual_connection_post_layernorm, False),
    }
    for name, (value, needed) in unsupported.items():
        if value != needed:
            raise WeightsError(f"ChatGLM2 config {name}={value}: transformers' GlmForCausalLM has no such option")
    rope = {"rope_type": "default", "rope_theta": 10000.0 * config.rope_ratio, "partial_rotary_factor": 0.5}
    if config.rope_ratio_scales == "positions" and config.rope_ratio != 1:
        rope = {"rope_type": "linear", "factor": float(config.rope_ratio), "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5}
    return GlmConfig(
        vocab_size=config.padded_vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.ffn_hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.kv_channels, rms_norm_eps=config.layernorm_epsilon,
        max_position_embeddings=config.seq_length, attention_bias=config.add_qkv_bias,
        attention_dropout=config.attention_dropout, tie_word_embeddings=False, rope_parameters=rope,
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id, bos_token_id=None,
        initializer_range=config.initializer_range,
    )


def from_glm_config(raw: dict) -> ChatGLM2Config:
    """The ChatGLM2 config of a transformers GLM ``config.json`` (as a dict)."""
    rope = raw.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.5))
    if partial != 0.5:
        raise WeightsError(f"GLM config partial_rotary_factor={partial}: ChatGLM2 rotates half of each head (0.5)")
    if raw.get("hidden_act", "silu") != "silu":
        raise WeightsError(f"GLM config hidden_act={raw['hidden_act']!r}: ChatGLM2's MLP is SwiGLU ('silu')")
    rope_type = rope.get("rope_type", "default")
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope_type == "default":
        ratio, scales = theta / 10000.0, "base"
    elif rope_type == "linear" and theta == 10000.0:
        ratio, scales = float(rope["factor"]), "positions"
    else:
        raise WeightsError(f"GLM config rope_type={rope_type!r} (theta {theta}): not a ChatGLM2 rotary embedding")
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    return ChatGLM2Config(
        num_layers=raw["num_hidden_layers"], padded_vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        ffn_hidden_size=raw["intermediate_size"], kv_channels=head_dim, num_attention_heads=heads,
        seq_length=raw.get("max_position_embeddings", 32768), layernorm_epsilon=raw.get("rms_norm_eps", 1e-5),
        add_qkv_bias=raw.get("attention_bias", True), multi_query_attention=True,
        multi_query_group_num=raw.get("num_key_value_heads") or heads, attention_dropout=raw.get("attention_dropout", 0.0),
        rope_ratio=ratio, rope_ratio_scales=scales, initializer_range=raw.get("initializer_range", 0.02),
        eos_token_id=raw.get("eos_token_id", 2), pad_token_id=raw.get("pad_token_id", 0),
    )


# ---------------------------------------------------------------- writing
def _parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", str(text).upper())
    if not match:
        raise WeightsError(f"--max-shard-size {text!r}: expected a size such as 2GB or 500MB")
    scale = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}[match[2]]
    return int(float(match[1]) * scale)


def check_destination(dst, inputs, overwrite: bool = False, overwrite_flag: str | None = None) -> None:
    """Before anything is read: ``dst`` apart from every input (``outputs.check_apart``) and writable as a
    directory (absent or empty; non-empty only with ``overwrite``, the command's ``overwrite_flag``)."""
    check_apart(dst, inputs, "DST")
    check_directory_output(dst, "DST", overwrite=overwrite, overwrite_flag=overwrite_flag)


def write_plan(plan, dst, config_writer, dtype=None, max_shard_bytes: int = 2 * 2**30, src=None, desc="convert",
               overwrite: bool = False, inputs=(), tokenizer_files=TOKENIZER_FILES):
    """Write the planned tensors as safetensors shards + index, the config and tokenizer files, atomically
    (``overwrite``: a non-empty ``dst`` is replaced once the new one is complete). ``dst`` may neither be,
    contain nor lie inside ``src`` or any of ``inputs`` (``(flag, path)`` pairs), whatever ``overwrite`` says."""
    dst = Path(dst)
    check_destination(dst, [("SRC", src), *inputs], overwrite, "--overwrite" if desc == "glm-merge" else None)
    tmp = work_directory(dst)
    try:
        shards, current, size = [], {}, 0
        for name, get in tqdm(plan, desc=desc, unit="tensor", disable=None):
            tensor = get()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > max_shard_bytes:
                shards.append(current)
                current, size = {}, 0
            current[name] = tensor.contiguous().clone()
            size += nbytes
            if size >= max_shard_bytes:
                shards.append(current)
                current, size = {}, 0
        if current:
            shards.append(current)
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_safetensors(shard, tmp / fname, metadata={"format": "pt"}, shown=dst / fname)
            weight_map.update({k: fname for k in shard})
            total += sum(t.numel() * t.element_size() for t in shard.values())
        if len(shards) > 1:
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2), encoding="utf-8")
        config_writer(tmp)
        for fname in tokenizer_files:  # copied from src as they are (the config writer may write others)
            if src is not None and (Path(src) / fname).is_file():
                shutil.copyfile(Path(src) / fname, tmp / fname)
        publish(tmp, dst)
    finally:
        discard(tmp)


def to_transformers(src, dst, dtype=None, max_shard_size="2GB") -> None:
    """ChatGLM2 directory ``src`` -> transformers GLM directory ``dst`` (``AutoModelForCausalLM`` loads it)."""
    check_destination(dst, [("SRC", src)])
    config = read_config(src)
    glm_config = to_glm_config(config)
    source = TensorSource(src)
    plan = to_glm_plan(config, source)
    tokenizer = _source_tokenizer(src)  # before any tensor is read: a bad tokenizer.model fails early
    fast = None
    if tokenizer is not None:
        from glm_port.models.chatglm2.tokenizer import to_fast_tokenizer

        try:
            fast = to_fast_tokenizer(tokenizer)
        except ValueError as error:
            raise WeightsError(str(error)) from None

    def write_config(directory):
        if dtype is not None:
            glm_config.dtype = dtype
        glm_config.architectures = ["GlmForCausalLM"]
        glm_config.save_pretrained(directory)
        if tokenizer is not None:  # transformers' own fast tokenizer: AutoTokenizer reads it with no remote code
            from glm_port.models.chatglm2.tokenizer import save_fast_tokenizer

            save_fast_tokenizer(tokenizer, directory, model_max_length=config.seq_length, fast=fast)
            if tokenizer.is_chatglm3:  # a reply ends at </s>, <|user|> or <|observation|>: generate and vLLM stop there
                from transformers import GenerationConfig

                stops = [config.eos_token_id] + [tokenizer.get_command(t) for t in ("<|user|>", "<|observation|>")]
                GenerationConfig(eos_token_id=stops, pad_token_id=config.pad_token_id).save_pretrained(directory)

    write_plan(plan, dst, write_config, dtype, _parse_size(max_shard_size), src, desc="to transformers",
               tokenizer_files=("tokenizer.model",))


def _source_tokenizer(src):
    """The ChatGLM2/ChatGLM3 tokenizer of ``src`` (None without a ``tokenizer.model``); a one-line WeightsError
    for one sentencepiece cannot read."""
    from glm_port.models.chatglm2.weights import load_tokenizer

    if not (Path(src) / "tokenizer.model").is_file():
        return None
    try:
        return load_tokenizer(src)
    except (RuntimeError, ValueError, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"{Path(src) / 'tokenizer.model'}: not a readable sentencepiece model ({message})") from None


def from_transformers(src, dst, dtype=None, max_shard_size="2GB") -> None:
    """transformers GLM directory ``src`` (model_type "glm") -> ChatGLM2 directory ``dst``."""
    check_destination(dst, [("SRC", src)])
    raw = read_config_json(src)
    if raw.get("model_type") != "glm":
        raise WeightsError(
            f"{Path(src) / 'config.json'}: model_type {raw.get('model_type')!r} is not transformers' GLM ('glm')"
        )
    if "intermediate_size" not in raw or "num_hidden_layers" not in raw:  # THUDM's GLM-10B also says "glm"
        raise WeightsError(f"{Path(src) / 'config.json'}: not a GlmForCausalLM config (no intermediate_size/"
                           f"num_hidden_layers); THUDM GLM-10B directories are the glm family, not ChatGLM2")
    config = from_glm_config(raw)
    source = TensorSource(src)
    plan = from_glm_plan(config, source)
    tokenizer = _source_tokenizer(src)

    def write_config(directory):
        config.architectures = ["ChatGLM2ForCausalLM"]
        config.save_pretrained(directory)
        if tokenizer is not None:  # ChatGLM2's own tokenizer_config.json (its chat format), not the fast one's
            tokenizer.save_pretrained(directory)

    write_plan(plan, dst, write_config, dtype, _parse_size(max_shard_size), src, desc="from transformers",
               tokenizer_files=("tokenizer.model",) if tokenizer is not None else TOKENIZER_FILES)


# ---------------------------------------------------------------- glm-merge
def tokenizer_for(src: Path, source, tokenizer_path):
    """The tokenizer to write beside the merged weights: ``tokenizer_path`` (a ``tokenizer.model`` or its
    directory), else the one beside SRC (for shards: in SRC, their iteration directory or its parent)."""
    from glm_port.models.chatglm2.tokenizer import ChatGLM2Tokenizer
    from glm_port.models.chatglm2.weights import load_tokenizer

    return find_tokenizer(src, source, tokenizer_path, load_tokenizer, ChatGLM2Tokenizer)


def tokenizer_places(src: Path, source) -> list[Path]:
    """Where the tokenizer of the weights at ``src`` is looked for: SRC (its folder for a file), then, for
    tensor-parallel shards, their iteration directory and its parent (the tracker's, where glm-finetune saves it)."""
    places = [src if src.is_dir() else src.parent]
    if hasattr(source, "files"):  # shards: their iteration directory, then its parent (the tracker's)
        places += [source.files[0].parent, source.files[0].parent.parent]
    return list(dict.fromkeys(places))


def find_tokenizer(src: Path, source, tokenizer_path, load_directory, load_file, file_name="tokenizer.model"):
    """A family's tokenizer for glm-merge: ``tokenizer_path`` (``load_file`` for a file, ``load_directory`` for
    a directory), else ``load_directory`` of the first of ``tokenizer_places`` holding ``file_name``; a one-line
    WeightsError with neither."""
    if tokenizer_path is not None:
        path = Path(tokenizer_path).expanduser()
        if path.is_dir():
            return load_directory(path)
        if not path.is_file():
            raise WeightsError(f"--tokenizer-path {path}: no such file or directory")
        return load_file(str(path))
    places = tokenizer_places(src, source)
    for place in places:
        if (place / file_name).is_file():
            return load_directory(place)
    raise WeightsError(f"no {file_name} beside {src} (looked in {', '.join(map(str, places))}): "
                       f"name it with --tokenizer-path")


def merge_checkpoint(src, dst, *, dtype=None, tokenizer_path=None, overwrite=False, max_shard_size="2GB") -> dict:
    """ChatGLM2 weights at ``src`` (tensor-parallel shards, merged by ``weights.tensor_parallel_merge``, or a
    THUDM directory) -> one THUDM-layout directory ``dst``: safetensors shards of at most ``max_shard_size``
    (+ index), ``config.json`` (model_type "chatglm"), the tokenizer. Names, shapes and the tokenizer are
    checked before anything is written; ``dst`` appears whole or not at all. Returns glm-merge's summary."""
    from glm_port.models.chatglm2.weights import check_directory, open_weights

    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    check_destination(dst, [("SRC", src), ("--tokenizer-path", tokenizer_path)], overwrite, "--overwrite")
    source = open_weights(src)  # shards: checked on opening (ranks, names, part shapes)
    config = source.config if hasattr(source, "config") else check_directory(src)
    tokenizer = tokenizer_for(src, source, tokenizer_path)
    return write_merged(src, dst, source, config, tokenizer, "ChatGLM2ForCausalLM", tokenizer.vocab_size,
                        f"ChatGLM2 sentencepiece ({tokenizer.vocab_size} ids)", dtype=dtype,
                        tokenizer_path=tokenizer_path, overwrite=overwrite, max_shard_size=max_shard_size)


def write_merged(src: Path, dst: Path, source, config, tokenizer, architecture: str, ids: int, described: str, *,
                 dtype=None, tokenizer_path=None, overwrite=False, max_shard_size="2GB") -> dict:
    """glm-merge's writer for a family in THUDM's ChatGLM layout (ChatGLM2's, GLM-4's): every tensor of ``source``
    (by THUDM's names; shards merged as they are read) into ``dst`` as ``write_plan`` lays it out, with ``config``
    (``architectures`` [``architecture``], the weights' dtype) and ``tokenizer`` (``ids`` of them, at most the
    model's ``padded_vocab_size``; ``described`` in the summary). Returns glm-merge's summary."""
    if ids > config.padded_vocab_size:
        raise WeightsError(f"the tokenizer gives {ids} ids, more than the model's "
                           f"padded_vocab_size ({config.padded_vocab_size}): name its own with --tokenizer-path")
    stored, count = set(), {"tensors": 0, "parameters": 0}

    def get(name):
        tensor = source[name]
        tensor = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        if tensor.is_floating_point():
            stored.add(tensor.dtype)
        count["tensors"] += 1
        count["parameters"] += tensor.numel()
        return tensor

    names = [n for n in source.keys() if not n.endswith(IGNORED_KEYS)]

    def write_config(directory):
        _write_config_and_tokenizer(config, stored.pop() if len(stored) == 1 else torch.float32, tokenizer, directory,
                                    architecture)

    write_plan([(n, lambda n=n: get(n)) for n in names], dst, write_config, None, _parse_size(max_shard_size),
               None, desc="glm-merge", overwrite=overwrite, inputs=[("SRC", src), ("--tokenizer-path", tokenizer_path)])
    return {"source": str(src), "kind": "megatron" if hasattr(source, "files") else "hf",
            "shards": getattr(source, "size", 1), "output": str(dst), **count,
            "dtype": str(config.dtype).replace("torch.", ""), "tokenizer": described}


def _write_config_and_tokenizer(config, dtype, tokenizer, directory, architecture="ChatGLM2ForCausalLM") -> None:
    config.architectures = [architecture]
    config.dtype = dtype
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def check_quantize(mode: str) -> None:
    """glm-export ``--quantize``, before anything is read: ChatGLM2's layout stores both int8 and int4 (THUDM's
    ``quantization.py``), so nothing is refused."""


def quantize_checkpoint(state: dict, config, mode: str) -> tuple[dict, ChatGLM2Config]:
    """``(state, config)`` with the layers' four linears quantized as THUDM's ``quantization.py`` stores them
    (``shim.nn.quantized.quantize_thudm``: int8, or int4 packed two a byte; a ``weight_scale`` a row in the
    weight's dtype) and ``quantization_bit`` set in a copy of ``config``: what ``save_checkpoint`` writes for
    glm-export --quantize, which ``load_pretrained`` (and THUDM's code) loads quantized as it is. ``mode``:
    "int8" or "int4" (``glm_port.models.QUANTIZE_BITS``)."""
    import copy

    from glm_port.models import QUANTIZE_BITS
    from glm_port.models.chatglm2.weights import QUANTIZED_LINEARS
    from shim.nn.quantized import quantize_thudm

    state, config = dict(state), copy.deepcopy(config)
    config.quantization_bit = QUANTIZE_BITS[mode]
    for index in range(config.num_layers):
        for path in QUANTIZED_LINEARS:
            name = f"transformer.encoder.layers.{index}.{path}.weight"
            state[name], state[f"{name}_scale"] = quantize_thudm(state[name], config.quantization_bit)
    return state, config


def save_checkpoint(state: dict, config, tokenizer, dst, *, overwrite: bool = False, inputs=(),
                    max_shard_size="2GB", desc: str = "glm-export", model_class=None) -> dict:
    """A whole (THUDM-named) ``state`` -> one THUDM-layout directory ``dst``, as ``merge_checkpoint`` writes it
    (safetensors shards + index, ``config.json`` with the weights' dtype, the tokenizer): glm-export's writer
    for a model with its LoRA adapter folded in. Names are checked against the architecture first; ``dst``
    appears whole or not at all, and may neither be, contain nor lie inside any of ``inputs``. ``model_class``:
    the architecture the names are checked against and ``config.json`` names (default ``ChatGLM2ForCausalLM``;
    GLM-4's binding passes its own)."""
    if model_class is None:
        from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM as model_class

    with torch.device("meta"):
        expected = {k: list(v.shape) for k, v in model_class(config).state_dict().items()}
    if config.quantization_bit:  # THUDM's quantized layout: the layers' four linears as int8 + a scale a row
        from glm_port.models.chatglm2.weights import QUANTIZED_LINEARS

        for index in range(config.num_layers):
            for path in QUANTIZED_LINEARS:
                name = f"transformer.encoder.layers.{index}.{path}.weight"
                rows, columns = expected[name]
                expected[name] = [rows, columns // (2 if config.quantization_bit == 4 else 1)]
                expected[f"{name}_scale"] = [rows]
    for name, tensor in state.items():
        if expected.get(name) != list(tensor.shape):
            raise WeightsError(f"{name} {list(tensor.shape)}: not a weight of this {model_class.__name__} architecture "
                               f"({'needs ' + str(expected[name]) if name in expected else 'unexpected name'})")
    missing = sorted(set(expected) - set(state))
    if missing:
        raise WeightsError(f"missing {len(missing)} weight(s), e.g. {missing[0]}")
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    stored = dtypes.pop() if len(dtypes) == 1 else torch.float32
    write_plan([(n, lambda n=n: state[n]) for n in state], dst,
               lambda directory: _write_config_and_tokenizer(config, stored, tokenizer, directory,
                                                             model_class.__name__), None,
               _parse_size(max_shard_size), None, desc=desc, overwrite=overwrite, inputs=list(inputs))
    return {"output": str(dst), "tensors": len(state), "parameters": sum(t.numel() for t in state.values()),
            "dtype": str(stored).replace("torch.", "")}
