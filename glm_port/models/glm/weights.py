"""GLM weights in every form a GLM user has them, loaded with no conversion step; GLM's weight names.

THUDM's converter saves upstream's ``checkpoint['module']`` as it is; its remote code's
``base_model_prefix = "glm"`` nests the same keys under ``glm.`` when it saves again. Both load.

Sources (``find_source``):

- a Hugging Face GLM directory: ``config.json`` (THUDM's fields) with ``model.safetensors``,
  ``pytorch_model.bin`` or a sharded ``*.index.json``; keys are upstream's names, with or without the
  ``glm.`` prefix (THUDM's converter saved ``checkpoint['module']`` as it was);
- upstream GLM's ``mp_rank_XX_model_states.pt`` (weights under ``'module'``) at any model-parallel size,
  in an iteration directory or under a ``latest_checkpointed_iteration.txt`` / DeepSpeed ``latest`` tracker;
- a ``glm-pretrain --save`` directory (the same layout, with the architecture under ``'glm_config'``).

Tensor-parallel slices follow Megatron's split rules, GLM's split plan (``splits.SPLIT_PLAN``, the
table the model's layers are built by too): the fused QKV weight splits per third, the word embeddings and
``dense_h_to_4h`` on dim 0 (rows), ``attention.dense`` and ``dense_4h_to_h`` weights on dim 1; everything
else is replicated. A checkpoint saved at model-parallel size ``s`` is
merged and re-split to the run's tensor-parallel size ``t``; each rank reads only the files holding its
slice (``s / t`` files when merging, one when splitting).

Files are found and read by the shared reader (``glm_port.models.weights_io``: ``find_layout``,
``iter_rank_tensors``), under upstream's names (GLM's adapter, ``adapter.ADAPTER``). Loading is shard by shard:
the model is built on the meta device, each tensor is read (safetensors
memory-mapped, ``.pt``/``.bin`` through ``torch.load(mmap=True)``), converted to the target dtype and
device and assigned, so host memory stays near one copy of the weights. Any mismatch (a missing or
unexpected key, a shape, a missing shard file) is one ``WeightsError`` naming it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import shim as torch

from glm_port.checkpoint_io import load_file
from glm_port.dtypes import parse_dtype
from glm_port.models import WeightsError  # noqa: F401  (the one class of every family: the contract's)
from glm_port.models.glm.adapter import ADAPTER
from glm_port.models.glm.model import HF_PREFIX, without_hf_prefix  # noqa: F401  (the names' owner)
from glm_port.models.glm.splits import SPLIT_PLAN
from glm_port.models.weights_io import Layout, TensorFile, find_layout, iter_rank_tensors, read_json
from shim.nn.split_plan import merge_ranks, slice_for_rank


# ---- Megatron's split rules: GLM's split plan (splits.py) --------------------------------------------
def merge_slices(name: str, slices: list, files: list | None = None) -> "torch.Tensor":
    """The whole tensor from its tensor-parallel slices (in rank order; ``files``: where each came from, for the
    message), merged as GLM's split plan says. Slices that are not one tensor's (other shapes: shards of
    different models mixed) are a one-line WeightsError."""
    split = SPLIT_PLAN.split_for(name)
    shapes = [list(s.shape) for s in slices]
    keep = [d for d in range(len(shapes[0])) if d != split.dim]
    if any(len(s) != len(shapes[0]) or [s[d] for d in keep] != [shapes[0][d] for d in keep] for s in shapes):
        where = [Path(f).name for f in files] if files else [f"rank {r}" for r in range(len(slices))]
        shown = ", ".join(f"{shape} in {place}" for shape, place in zip(shapes, where))
        inside = f" in {Path(files[0]).parent}" if files else ""
        raise WeightsError(f"{name}: the tensor-parallel shards{inside} do not fit together ({shown}): files of "
                           f"different models or runs mixed?")
    return merge_ranks(slices, split)


def take_slice(name: str, tensor, size: int, rank: int):
    """Rank ``rank``'s slice of ``tensor`` (a tensor, or a safetensors slice read lazily) out of ``size``, cut
    as GLM's split plan says."""
    split = SPLIT_PLAN.split_for(name)
    if split.dim is None or size == 1:
        return tensor[:] if not isinstance(tensor, torch.Tensor) else tensor
    try:
        return slice_for_rank(tensor, split, rank, size)
    except ValueError:
        shape = list(tensor.get_shape()) if not isinstance(tensor, torch.Tensor) else list(tensor.shape)
        raise WeightsError(f"{name} {shape} does not split over tensor-parallel size {size}") from None


# ---- where the weights are: the shared reader (weights_io), GLM's names (adapter) ----------------------
@dataclass
class WeightSource:
    """What ``path`` holds (``weights_io.find_layout``) and the architecture beside it. ``files``: the weight
    files (per mp rank for upstream layouts)."""

    layout: Layout
    config: dict | None = None  # THUDM config.json fields, or glm-pretrain's glm_config

    @property
    def kind(self) -> str:  # "hf", or "megatron" (mp_rank files, a sharded run's DCP directory)
        return "hf" if self.layout.kind == "hf" else "megatron"

    @property
    def path(self) -> Path:
        return self.layout.path

    @property
    def files(self) -> list[Path]:
        return self.layout.files

    @property
    def mp_size(self) -> int:
        return self.layout.tp_size


def find_source(path) -> WeightSource:
    """Find the weights under ``path`` (a directory or a single ``mp_rank_00_model_states.pt``)."""
    layout = find_layout(path, "GLM")
    if layout.kind == "hf" and layout.path.is_dir() and layout.config_file is None:
        raise WeightsError(f"{layout.path}: {(layout.index or layout.files[0]).name} but no config.json beside it")
    source = WeightSource(layout, config=read_json(layout.config_file))
    if layout.kind == "ranks":
        _check_rank_count(source, layout.directory)
    return source


def _check_rank_count(source: WeightSource, directory: Path) -> None:
    """Files that record no rank count (upstream's, older ones of ours): the word embeddings are split by rows
    over the ranks, so the rows rank 0 holds against the vocabulary the saved config names give the count."""
    from glm_port.checkpoint_io import model_file_name

    try:
        checkpoint = load_file(source.files[0], weights_only=True, mmap=True)
    except Exception:  # upstream's pickles of numpy state: nothing to compare with (no config either)
        return
    if not isinstance(checkpoint, dict) or "mp_world_size" in checkpoint:
        return
    config = source.config or checkpoint.get("glm_config") or {}
    module = checkpoint.get("module", checkpoint)
    embeddings = module.get("word_embeddings.weight", module.get(HF_PREFIX + "word_embeddings.weight")) \
        if isinstance(module, dict) else None
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    if not isinstance(embeddings, torch.Tensor) or not isinstance(vocab, int) or embeddings.dim() != 2:
        return
    rows, found = embeddings.size(0), len(source.files)
    if rows and vocab % rows == 0 and vocab // rows > found:
        raise WeightsError(f"{directory}: {model_file_name(found)} is missing ({source.files[0].name} holds {rows} "
                           f"of the model's {vocab} word-embedding rows: the checkpoint has {vocab // rows} "
                           f"model-parallel ranks, {found} found)")


def _reader(path: Path) -> TensorFile:
    """One file's tensors by upstream's names (GLM's adapter)."""
    return TensorFile(path, ADAPTER.to_checkpoint, unpickle=True)  # upstream's rank files pickle numpy RNG state


def iter_tensors(source: WeightSource, tp_size: int = 1, tp_rank: int = 0,
                 keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, "torch.Tensor"]]:
    """``(name, tensor)`` for this tensor-parallel rank's slice of every weight ``keep`` accepts, file by
    file (the others are never read), by upstream's names, cut and merged by GLM's split plan."""
    return iter_rank_tensors(source.layout, take_slice, merge_slices, tp_size=tp_size, tp_rank=tp_rank,
                             rename=ADAPTER.to_checkpoint, keep=keep, unpickle=True)


def stage_weights(stage) -> Callable[[str], bool]:
    """The weights a pipeline stage runs with: its layers, the embeddings on the first stage, the final
    LayerNorm and the (tied) word embeddings on the last."""
    def keep(name: str) -> bool:
        layer = re.match(r"transformer\.layers\.(\d+)\.", name)
        if layer:
            return stage.holds(int(layer.group(1)))
        if name == "word_embeddings.weight":
            return stage.is_first or stage.is_last
        if name.startswith("transformer.final_layernorm."):
            return stage.is_last
        return stage.is_first  # position embeddings
    return keep


# ---- the architecture ------------------------------------------------------------------------------
def source_config(source: WeightSource, overrides: dict | None = None):
    """A ``GLMConfig`` for ``source``: its config.json, glm-pretrain's glm_config, or the shapes."""
    from glm_port.models.glm.config import RUN_SETTINGS, GLMConfig

    overrides = dict(overrides or {})
    if source.config is not None:
        fields = {k: v for k, v in source.config.items() if not k.startswith("_")}
        fields.pop("architectures", None)
        fields.pop("auto_map", None)
        config = GLMConfig.from_dict(fields)
    else:
        first = _reader(source.files[0])
        embedded = first.config()
        if embedded is not None and "model_type" not in embedded:
            # glm-pretrain's checkpoints from while GLMConfig was a dataclass: its fields, the run settings not taken
            config = GLMConfig(**{k: v for k, v in embedded.items() if k not in RUN_SETTINGS})
        elif embedded is not None:
            config = GLMConfig.from_dict({k: v for k, v in embedded.items() if not k.startswith("_")})
        else:
            config = _config_from_shapes(first, source.mp_size, overrides.pop("num_attention_heads", None))
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _config_from_shapes(reader: TensorFile, mp_size: int, heads: int | None):
    """Upstream's files carry no architecture: read it off the shapes (heads: 64-wide, as every GLM release)."""
    from glm_port.models.glm.config import GLMConfig

    names = set(reader.keys())
    if "word_embeddings.weight" not in names:
        raise WeightsError(f"{reader.path}: no word_embeddings.weight, not a GLM checkpoint")
    rows, hidden = reader.shape("word_embeddings.weight")
    layers = 1 + max(int(m.group(1)) for n in names if (m := re.match(r"transformer\.layers\.(\d+)\.", n)))
    block = "transformer.block_position_embeddings.weight" in names
    positions = reader.shape("transformer.position_embeddings.weight")[0] - (1 if block else 0)
    if heads is None:
        heads = max(1, hidden // 64)
        # The shapes cannot tell the head count: a model with heads of another width loads without an error
        # and computes something else, so say what was assumed and how to say otherwise.
        logging.getLogger("glm_port").warning(
            "%s: no config.json and no saved architecture: assuming %d attention heads (64 wide, as every GLM "
            "release); if the model has others, put a config.json with num_attention_heads beside the files "
            "(glm-merge --num-attention-heads N writes one)", reader.path.parent, heads)
    return GLMConfig(num_layers=layers, vocab_size=rows * mp_size, hidden_size=hidden,
                     num_attention_heads=heads, max_sequence_length=positions, block_position_encoding=block)


# ---- loading into a model --------------------------------------------------------------------------
def load_state(model, source: WeightSource, *, dtype=None, device=None, tp_size: int = 1, tp_rank: int = 0,
               assign: Callable | None = None, keep: Callable[[str], bool] | None = None) -> None:
    """Read ``source`` into ``model`` (a ``GLMForConditionalGeneration``), tensor by tensor, checking keys
    and shapes; ``assign(name, tensor)`` places a tensor (default: replaces the parameter); ``keep`` limits
    the load to the weights it accepts (a pipeline stage's)."""
    names = {ADAPTER.to_checkpoint(k): v for k, v in model.state_dict().items()}
    expected = {k: v for k, v in names.items() if keep is None or keep(k)}
    seen = set()
    for name, tensor in iter_tensors(source, tp_size, tp_rank, keep):
        if name not in expected:
            raise WeightsError(f"{source.path}: unexpected weight {name} (not a GLM of this architecture?)")
        want = expected[name]
        local_shape = list(torch.to_local(want).shape)
        if list(tensor.shape) != local_shape:
            raise WeightsError(f"{source.path}: {name} is {list(tensor.shape)} there, {local_shape} in the model "
                               f"(config.json, or the tensor-parallel size {tp_size}, does not fit)")
        source_tensor = tensor
        tensor = tensor.to(device=device or "cpu", dtype=dtype if tensor.is_floating_point() and dtype else None)
        if tensor.device.type == "cpu" and not tensor.is_contiguous() or _is_mapped(tensor):
            tensor = tensor.contiguous().clone()
        if _is_mapped(source_tensor):
            _release_pages(source_tensor)
        del source_tensor
        (assign or _assign_parameter)(model, ADAPTER.to_model(name), tensor)
        seen.add(name)
    missing = [k for k in expected if k not in seen]
    if missing:
        raise WeightsError(f"{source.path}: missing {len(missing)} weight(s) the model needs, e.g. {missing[0]}")


def _is_mapped(tensor) -> bool:
    # A tensor still backed by the file mapping: copy it, so the model owns its memory.
    try:
        return not tensor.untyped_storage().resizable()
    except (RuntimeError, AttributeError):
        return False


def _release_pages(tensor) -> None:
    """Drop the file pages a consumed tensor was read from.

    A memory-mapped checkpoint's pages count in the process's resident memory for as long as the file
    stays mapped, so reading a single-file checkpoint would end near twice the weights (the mapped file +
    the model's copy). Once a tensor is copied out, ``madvise(MADV_DONTNEED)`` on the whole pages inside it
    returns them (they re-read from the file if touched again). Only called on storages the readers
    memory-mapped (safetensors, ``torch.load(mmap=True)``; never resizable), so nothing anonymous is dropped.
    """
    import ctypes
    import mmap

    libc = getattr(_release_pages, "libc", None)
    if libc is None:
        try:
            libc = _release_pages.libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise  # noqa: B018  (present on Linux and macOS)
        except (OSError, AttributeError):
            _release_pages.libc = False
            return
    if not libc or tensor.device.type != "cpu":
        return
    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // page) * page, end // page * page  # whole pages only: neighbours keep theirs
    if last > first:
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # MADV_DONTNEED


def _assign_parameter(model, qualified: str, tensor) -> None:
    module_name, _, leaf = qualified.rpartition(".")
    module = model.get_submodule(module_name)
    old = getattr(module, leaf)
    if isinstance(old, torch.nn.Parameter):
        # Trainable as the model built it (as transformers' from_pretrained returns it): a full finetune trains
        # every weight, inference runs under no_grad, PEFT freezes what it does not adapt.
        setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=old.requires_grad))
    else:
        module._buffers[leaf] = tensor


def load_model(cls, path, *, dtype=None, device=None, tensor_parallel=None, **overrides):
    """``cls.from_pretrained``: build on the meta device, fill from ``path``, return it in eval mode.

    ``tensor_parallel`` (an object with ``size`` and ``rank``; the layout already set up by shim's
    ``setup_layout``): the model is built with its layers split, and each rank reads and copies in only
    its own slices (Megatron's layout, which shim's split layers hold locally). Its ``pipeline`` (a
    ``glm_port.distributed.PipelineStage``, or None): only that stage's layers are built and read, split
    over the stage's tensor-parallel group when ``size > 1``; the rest stay on the meta device.
    """
    source = find_source(path)
    config = source_config(source, overrides)
    tp_size = getattr(tensor_parallel, "size", 1)
    tp_rank = getattr(tensor_parallel, "rank", 0)
    pipeline = getattr(tensor_parallel, "pipeline", None)
    dtype = _dtype(dtype)
    keep = None
    if pipeline is not None:
        given = pipeline.layout.pipeline_num_layers
        if given not in (pipeline.stages, config.num_layers):  # the layout's default is one layer a stage
            raise WeightsError(f"--pipeline-num-layers {given} must equal the model's {config.num_layers} layers")
        if config.num_layers < pipeline.stages:
            raise WeightsError(f"{config.num_layers} layers do not fill {pipeline.stages} pipeline stages")
        # The split layers find their stage's mesh by layer index: the layout learns the model's layer count.
        import shim.distributed as dist

        dist.set_pipeline_num_layers(config.num_layers)
        pipeline = type(pipeline)(pipeline.layout, config.num_layers)
        keep = stage_weights(pipeline)  # other stages' weights are never read
    if tp_size == 1:
        with torch.device("meta"):  # every weight is replaced as it is read; other stages' stay meta
            model = cls(config)
        load_state(model, source, dtype=dtype, device=device, tp_size=1, tp_rank=0, keep=keep)
    else:
        # DTensor parameters cannot be swapped for plain tensors: build them split, copy the slices in.
        # Under pipeline stages the model builds other stages' layers on the meta device itself.
        with torch.device(device or "cpu"):
            model = cls(config)
        load_state(model, source, dtype=None, device=device, tp_size=tp_size, tp_rank=tp_rank, assign=_copy_local,
                   keep=keep)
        if dtype is not None:
            model.to(dtype)
    if pipeline is not None:
        model.pipeline = pipeline
        model.run_device = torch.device(device or "cpu")
    model.eval()
    model.source = source
    return model


def _copy_local(model, qualified: str, tensor) -> None:
    target = model.get_parameter(qualified) if qualified in dict(model.named_parameters()) else \
        model.get_buffer(qualified)
    with torch.no_grad():
        torch.to_local(target).copy_(tensor)


def _dtype(dtype):
    return parse_dtype(dtype)  # either spelling (glm_port.dtypes)


# ---- writing (tests, benches, conversion) ----------------------------------------------------------
def save_hf(model_state: dict, directory, config: dict, *, shards: int = 1, prefix: str = HF_PREFIX,
            safetensors: bool = True, shown_as=None) -> Path:
    """A Hugging Face GLM directory: ``config.json`` and the weights, sharded with an index when
    ``shards > 1``. Written to a temporary name and renamed, so a failure leaves nothing half-written
    (and names the file in ``shown_as``, the directory ``directory`` will become, when given)."""
    directory = Path(directory)
    shown = Path(shown_as or directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {prefix + ADAPTER.to_checkpoint(k): v.contiguous() for k, v in model_state.items()}
    names = list(state)
    groups = [names[i::shards] for i in range(shards)]
    ext = "safetensors" if safetensors else "bin"
    base = "model" if safetensors else "pytorch_model"
    if shards == 1:
        _write_weights({k: state[k] for k in names}, tmp / f"{base}.{ext}", safetensors, shown / f"{base}.{ext}")
    else:
        weight_map = {}
        for i, group in enumerate(groups):
            file = f"{base}-{i + 1:05d}-of-{shards:05d}.{ext}"
            _write_weights({k: state[k] for k in group}, tmp / file, safetensors, shown / file)
            weight_map.update({k: file for k in group})
        index = {"metadata": {}, "weight_map": weight_map}
        (tmp / f"{base}.{ext}.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if directory.exists():
        import shutil

        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def _write_weights(tensors: dict, path: Path, safetensors: bool, shown: Path) -> None:
    if safetensors:
        from glm_port.outputs import save_safetensors  # a failed write (a full disk): one line naming the file

        save_safetensors({k: v.detach().cpu() for k, v in tensors.items()}, path, shown=shown)
    else:
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, path)
