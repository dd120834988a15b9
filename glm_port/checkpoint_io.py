"""Checkpoints in upstream GLM's layout, written atomically, resumed exactly.

Layout (as upstream's ``save_checkpoint``)::

    SAVE/latest_checkpointed_iteration.txt      "20"
    SAVE/20/mp_rank_00_model_states.pt           one file per tensor-parallel rank

Each file is a dict with ``'module'`` (the model's state dict, upstream's key names), ``'iteration'``,
``'optimizer'``, ``'lr_scheduler'`` and the RNG states under upstream's keys, plus ``'glm_config'``
(the architecture, checked on load), ``'grad_scaler'`` and DeepSpeed's ``'mp_world_size'`` (how many
tensor-parallel ranks' files make the checkpoint, so a missing one is named). Upstream checkpoints and Hugging Face GLM
weights load as well.

A run that trains a part of a frozen model (glm-finetune's P-Tuning v2 prefix, LoRA adapters) keeps only that
part: ``'trainable'`` (the trained weights, ``trainable_state_dict``) in place of ``'module'``, with
``'trained_part'`` (what they are) and ``'base_model'`` (the model they were trained on), so a 6B model's
checkpoint is megabytes. Resuming (``load_checkpoint(..., trainable_only=True, base=...)``) puts them back on
the base the run loaded again; a reader that wants a whole model gets one line saying what the file holds.

A save goes to a hidden temporary directory that is renamed into place, and the tracker file is
replaced last (each written file flushed and fsynced, then its directory), so an interrupted save leaves the
previous checkpoint as the latest one; what a killed save left behind is cleared by the next save or load.
A latest checkpoint that cannot be read is reported with the newest intact one before it.

A sharded run (``glm_port.sharding``: FSDP2) saves with torch.distributed.checkpoint instead
(``save_sharded_checkpoint``): ``SAVE/20/`` holds every rank's shards (``.metadata``, ``__R_0.distcp``) and
``training_state.pt``; the same tracker and atomic publication, and ``load_checkpoint`` reads it at any
world size (``find_checkpoint`` names its ``training_state.pt``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np

import shim as torch
import shim.distributed as dist
from glm_port.distributed import local_state_dict, tensor_parallel_size

TRACKER = "latest_checkpointed_iteration.txt"
SHARDED_STATE = "training_state.pt"  # beside a DCP checkpoint's shards (save_sharded_checkpoint)
TRACKERS = (TRACKER, "latest")  # Megatron's / glm-pretrain's, DeepSpeed's
RANK_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or made for another model."""


def model_file_name(tp_rank: int = 0) -> str:
    return f"mp_rank_{tp_rank:02d}_model_states.pt"


def _rng_states() -> dict:
    np_state = np.random.get_state()
    states = {
        "random_rng_state": random.getstate(),
        # numpy's state as plain values + a tensor, so the file loads with weights_only=True
        "np_rng_state": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda_rng_state"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(sd: dict) -> None:
    random.setstate(sd["random_rng_state"])
    name, keys, *rest = sd["np_rng_state"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(sd["torch_rng_state"])
    if "cuda_rng_state" in sd and torch.cuda.is_available():
        torch.cuda.set_rng_state(sd["cuda_rng_state"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(save_dir, iteration: int, model_state: dict, *, config, optimizer=None,
                    scheduler=None, grad_scaler=None, save_rng: bool = True, tp_rank: int = 0,
                    writer: bool = True, trained_part: str | None = None, base_model: str | None = None) -> Path:
    """Write ``SAVE/<iteration>/mp_rank_XX_model_states.pt`` atomically and point the tracker at it.

    Collective when a process group is up: every rank calls it; ranks with ``writer`` (data-parallel
    rank 0 of each tensor-parallel rank) write their file, global rank 0 publishes. ``trained_part`` (e.g.
    "P-Tuning v2 prefix encoder"): ``model_state`` is only the trained part of a frozen ``base_model``
    (``trainable_state_dict``), saved as ``'trainable'`` instead of ``'module'``.
    """
    save_dir = Path(save_dir)
    final = save_dir / str(iteration)
    staging = save_dir / f".tmp-{iteration}"
    if dist.get_rank() == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        clear_interrupted_saves(save_dir)
        staging.mkdir()
    dist.barrier()
    if writer:
        sd = {**_training_state(iteration, config, scheduler, grad_scaler, save_rng),
              "mp_world_size": tensor_parallel_size()}
        if trained_part is None:
            sd["module"] = model_state
        else:
            sd.update(trainable=model_state, trained_part=trained_part, base_model=base_model)
        if optimizer is not None:
            sd["optimizer"] = optimizer.state_dict()
        if save_rng and _tracker() is not None:
            sd["rng_tracker_states"] = _tracker().get_states()
        path = staging / model_file_name(tp_rank)
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
    dist.barrier()
    return _publish(save_dir, iteration, staging, final)


def _publish(save_dir: Path, iteration: int, staging: Path, final: Path) -> Path:
    """Rank 0 renames the written ``staging`` directory to ``final`` and points the tracker at it; collective."""
    if dist.get_rank() == 0:
        _fsync_dir(staging)
        previous = save_dir / f".old-{iteration}"
        if final.exists():  # saving the same iteration again: swap, then drop the old copy
            os.replace(final, previous)
        os.replace(staging, final)
        shutil.rmtree(previous, ignore_errors=True)
        tracker_tmp = save_dir / f".{TRACKER}.tmp"
        with open(tracker_tmp, "w") as f:
            f.write(str(iteration))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tracker_tmp, save_dir / TRACKER)
        _fsync_dir(save_dir)
    dist.barrier()
    return final


def _training_state(iteration: int, config, scheduler, grad_scaler, save_rng: bool) -> dict:
    """What every checkpoint records beside the weights and the optimizer: the iteration, the config, the schedule,
    the loss scale and (``save_rng``) the RNG states."""
    sd = {"iteration": iteration, "glm_config": config.to_dict()}
    if scheduler is not None:
        sd["lr_scheduler"] = scheduler.state_dict()
    if grad_scaler is not None and grad_scaler.is_enabled():
        sd["grad_scaler"] = grad_scaler.state_dict()
    if save_rng:
        sd.update(_rng_states())
    return sd


def save_sharded_checkpoint(save_dir, iteration: int, model, *, config, optimizer=None, scheduler=None,
                            grad_scaler=None, save_rng: bool = True) -> Path:
    """A sharded run's checkpoint (``glm_port.sharding``): ``SAVE/<iteration>/`` holds the model's and the
    optimizer's shards as torch.distributed.checkpoint (DCP) writes them (``.metadata``, ``*.distcp``; each
    rank writes its own), so it loads at any world size, and ``training_state.pt`` (rank 0: iteration,
    config, schedule, loss scale, RNG). Written and published as ``save_checkpoint`` does (staging directory
    renamed into place, tracker last). Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    save_dir = Path(save_dir)
    final, staging = save_dir / str(iteration), save_dir / f".tmp-{iteration}"
    if dist.get_rank() == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        clear_interrupted_saves(save_dir)
        staging.mkdir()
    dist.barrier()
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=str(staging))
    if dist.get_rank() == 0:
        with open(staging / SHARDED_STATE, "wb") as f:
            sd = {**_training_state(iteration, config, scheduler, grad_scaler, save_rng),
                  "sharded": dist.get_world_size()}
            if tensor_parallel_size() > 1:  # its global tensors are in the tensor-parallel ranks' order
                sd["tensor_parallel_size"] = tensor_parallel_size()
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
    dist.barrier()
    return _publish(save_dir, iteration, staging, final)


def is_sharded_checkpoint(directory) -> bool:
    """Whether an iteration directory holds a DCP checkpoint (``save_sharded_checkpoint``)."""
    return (Path(directory) / ".metadata").is_file() and (Path(directory) / SHARDED_STATE).is_file()


def load_sharded_checkpoint(path, model, *, optimizer=None, scheduler=None, grad_scaler=None,
                            load_optimizer: bool = True, load_rng: bool = True) -> int:
    """Load a ``save_sharded_checkpoint`` directory (``path``: its ``training_state.pt``) into ``model``, sharded
    with FSDP2 at any world size or a plain model in one process: DCP reshards on load. Returns the iteration."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    directory = Path(path).parent
    sd = read_checkpoint(directory / SHARDED_STATE)
    saved_tp = int(sd.get("tensor_parallel_size", 1))
    if saved_tp != tensor_parallel_size():
        raise CheckpointError(f"{directory}: a sharded checkpoint saved at tensor parallel {saved_tp} loads at the "
                              f"same tensor-parallel size only (here {tensor_parallel_size()})")
    state = {"model": get_model_state_dict(model)}
    with_optimizer = load_optimizer and optimizer is not None
    if with_optimizer:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    try:
        with warnings.catch_warnings():  # in one process DCP says it loads in one process: it is meant
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, checkpoint_id=str(directory))
    except Exception as error:  # DCP's CheckpointException lists every rank's failure: the first line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{directory}: the sharded checkpoint does not load into this model ({reason})") from None
    set_model_state_dict(model, state["model"])
    if with_optimizer:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        if scheduler is not None and "lr_scheduler" in sd:
            scheduler.load_state_dict(sd["lr_scheduler"])
        if grad_scaler is not None and "grad_scaler" in sd:
            grad_scaler.load_state_dict(sd["grad_scaler"])
    if load_rng and "torch_rng_state" in sd:
        _set_rng_states(sd)
    return int(sd.get("iteration", 0))


def read_sharded_weights(directory) -> dict:
    """The whole model's weights in a ``save_sharded_checkpoint`` directory, read in this process (every rank's
    shards put together by DCP, no process group needed): what glm-merge and the GLM loaders take from it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state_file = Path(directory) / SHARDED_STATE
    saved_tp = int(read_checkpoint(state_file).get("tensor_parallel_size", 1)) if state_file.is_file() else 1
    if saved_tp > 1:
        raise CheckpointError(f"{directory}: a sharded checkpoint saved at tensor parallel {saved_tp} is not read "
                              "whole: take the run's final/ (mp_rank_XX shards), or resume at that size")
    reader = dcp.FileSystemReader(str(directory))
    try:
        metadata = reader.read_metadata()
    except Exception as error:
        raise CheckpointError(f"{directory}: not a readable sharded checkpoint ({error})") from None
    weights = {key[len("model."):]: torch.empty(entry.size, dtype=entry.properties.dtype)
               for key, entry in metadata.state_dict_metadata.items()
               if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)}
    with warnings.catch_warnings():  # DCP says it reads in one process: it is meant
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load({"model": weights}, storage_reader=reader, no_dist=True)
    return weights


def clear_interrupted_saves(save_dir: Path) -> None:
    """Remove what a save killed midway (``kill -9``) left in ``save_dir``: staging ``.tmp-N`` directories and
    the tracker's temporary file. An ``.old-N`` copy is put back as ``N`` if the kill came between the swap's
    two renames, and dropped otherwise."""
    for entry in save_dir.glob(".tmp-*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    (save_dir / f".{TRACKER}.tmp").unlink(missing_ok=True)
    for entry in save_dir.glob(".old-*"):
        final = save_dir / entry.name[len(".old-"):]
        if entry.is_dir() and not final.exists():
            os.replace(entry, final)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _tracker():
    """The model-parallel RNG tracker, when shim's checkpointing provides one."""
    checkpointing = getattr(torch, "checkpointing", None)
    return checkpointing.get_cuda_rng_tracker() if checkpointing is not None else None


def find_checkpoint(load: str | os.PathLike, tp_rank: int = 0) -> Path:
    """The model file ``--load`` refers to: a directory with a tracker, an iteration directory, or a file."""
    load = Path(load)
    if not load.exists():
        raise CheckpointError(f"--load {load}: no such file or directory")
    if load.is_file():
        return load
    tracker = load / TRACKER
    directory = load
    if tracker.is_file():
        tracked = tracker.read_text().strip()
        if not tracked.isdigit():
            raise CheckpointError(f"--load {load}: {tracker} holds {tracked[:20]!r}, not an iteration"
                                  f"{_previous_good(load, None, tp_rank)}")
        directory = load / tracked
    if is_sharded_checkpoint(directory):
        return directory / SHARDED_STATE
    path = directory / model_file_name(tp_rank)
    if not path.is_file():
        hint = _previous_good(load, int(directory.name), tp_rank) if tracker.is_file() else ""
        raise CheckpointError(f"--load {load}: no checkpoint there ({path} not found){hint}")
    return path


def shard_directory(path) -> Path | None:
    """The iteration directory of the tensor-parallel checkpoint ``path`` names: an ``mp_rank_XX`` file's
    directory, the one a tracker (``TRACKERS``) points at, or ``path`` itself when it holds rank files;
    None when ``path`` is none of these."""
    path = Path(path)
    if path.is_file():
        return path.parent if RANK_FILE.search(path.name) else None
    if not path.is_dir():
        return None
    for tracker in TRACKERS:
        if (path / tracker).is_file():
            return path / (path / tracker).read_text().strip()
    return path if any(RANK_FILE.search(p.name) for p in path.iterdir()) else None


def rank_files(directory: Path) -> list[Path]:
    """Every tensor-parallel rank's model file in ``directory``, in rank order; a one-line CheckpointError
    when there is none or a rank's file is missing (a gap, or past the last one found when rank 0's file
    records how many there are: ``'mp_world_size'``, ours and DeepSpeed's)."""
    directory = Path(directory)
    ranks = {int(m.group(1)): p for p in directory.iterdir() if (m := RANK_FILE.search(p.name))}
    if not ranks:
        raise CheckpointError(f"{directory}: no mp_rank_XX_model_states.pt files")
    size = max(ranks) + 1
    if 0 in ranks:
        size = max(size, saved_ranks(ranks[0]) or 0)
    missing = [r for r in range(size) if r not in ranks]
    if missing:
        raise CheckpointError(f"{directory}: {model_file_name(missing[0])} is missing "
                              f"(the checkpoint has {size} model-parallel ranks)")
    return [ranks[r] for r in range(size)]


class _MeshUnpicklingNotice(logging.Filter):
    """torch's "pickling/unpickling of the DeviceMesh occurred before the PGs were created" warning, logged once
    per DTensor mesh a checkpoint's optimizer state holds when it is read without a process group (glm-merge,
    glm-export, detecting a family): true and harmless there (nothing is compiled), so not shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "unpickling of the DeviceMesh occurred before the PGs were created" not in record.getMessage()


@contextlib.contextmanager
def quiet_mesh_unpickling():
    logger, notice = logging.getLogger("torch.distributed.device_mesh"), _MeshUnpicklingNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def load_file(path, **kwargs):
    """``torch.load`` for a checkpoint file (``map_location`` "cpu" unless given), every family's readers'
    way in: the DeviceMeshes of tensor-parallel optimizer state unpickle without their warning."""
    kwargs.setdefault("map_location", "cpu")
    with quiet_mesh_unpickling():
        return torch.load(path, **kwargs)


def _header(path) -> dict | None:
    """A checkpoint file's top-level dict, tensors memory-mapped (not read); None for files that cannot be
    read this way (upstream's pickles of numpy state, legacy formats)."""
    try:
        checkpoint = load_file(path, weights_only=True, mmap=True)
    except Exception:
        return None
    return checkpoint if isinstance(checkpoint, dict) else None


def saved_ranks(path) -> int | None:
    """How many tensor-parallel ranks' files the checkpoint ``path`` belongs to, where it records it."""
    size = (_header(path) or {}).get("mp_world_size")
    return size if isinstance(size, int) and size > 0 else None


def saved_config(path) -> dict | None:
    """The architecture a checkpoint of ours carries (``'glm_config'``: a family's config as a dict, with its
    ``model_type`` where the family has one), read without loading its tensors; None for files that carry
    none (upstream's) or cannot be read this way."""
    config = (_header(path) or {}).get("glm_config")  # upstream's pickles, legacy formats: none
    return config if isinstance(config, dict) else None


def open_safetensors(path, error=CheckpointError):
    """``safetensors.safe_open(path)``; a file it cannot read (truncated by an interrupted copy or download,
    not safetensors at all) is one ``error`` naming the file, not a SafetensorError naming none."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as failure:
        reason = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        raise error(f"{path}: not a readable safetensors file ({reason}; an incomplete copy or download?)") from None


def _is_intact(path: Path) -> bool:
    """Whether ``path`` is a whole ``torch.save`` file: a zip archive whose every member passes its CRC."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _previous_good(root: Path, latest: int | None, tp_rank: int) -> str:
    """``"; the previous checkpoint ... is intact: --load DIR"`` for the newest intact one before ``latest``, or ``""``."""
    iterations = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir()), reverse=True)
    for iteration in iterations:
        if latest is not None and iteration >= latest:
            continue
        if _is_intact(root / str(iteration) / model_file_name(tp_rank)):
            return f"; the previous checkpoint, iteration {iteration}, is intact: --load {root / str(iteration)}"
    return ""


def read_checkpoint(path: Path) -> dict:
    try:
        try:
            return load_file(path, weights_only=True)
        except pickle.UnpicklingError as error:
            if "Weights only load failed" not in str(error):
                raise
            # Upstream's files pickle numpy RNG state; like upstream, a checkpoint you load is trusted.
            return load_file(path, weights_only=False)
    except (pickle.UnpicklingError, OSError, RuntimeError, EOFError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None


def trainable_state_dict(model) -> dict:
    """The weights ``model`` trains (``requires_grad``), as this rank holds them (``local_state_dict``'s
    names): what the resumable checkpoint of a run with a frozen base keeps (``save_checkpoint(trained_part=...)``)."""
    names = {name for name, param in model.named_parameters() if param.requires_grad}
    return {name: value for name, value in local_state_dict(model).items() if name in names}


def trained_part_problem(checkpoint, path) -> str | None:
    """One line for a reader that wants a whole model when ``checkpoint`` holds only a run's trained part
    (``save_checkpoint(trained_part=...)``); None for any other checkpoint."""
    if not isinstance(checkpoint, dict) or "trainable" not in checkpoint or "module" in checkpoint:
        return None
    return (f"{path}: holds only the {checkpoint.get('trained_part', 'trained weights')} of a run on "
            f"{checkpoint.get('base_model')} (resumable state; the frozen base is not in it), not a model: take the "
            f"run's final/ directory")


def _trained_part(sd: dict, path, model, trainable_only: bool, base_model: str | None) -> tuple[dict, dict]:
    """``(weights, target)`` to copy when resuming from ``sd``: the whole model's, or (a checkpoint of the
    trained part) the trained weights onto the parameters this run trains; a CheckpointError when they do not
    fit the run: another kind of run, another base, other trained weights."""
    if "trainable" not in sd or "module" in sd:
        target = local_state_dict(model)
        return _keyed_as(model_weights(sd), target), target
    part, saved_base = sd.get("trained_part", "trained weights"), sd.get("base_model")
    if not trainable_only:
        raise CheckpointError(f"{path}: holds only the {part} of a run on {saved_base} (the frozen base is not in "
                              "it), not the whole model this run trains")
    if base_model is not None and saved_base is not None and saved_base != base_model:
        raise CheckpointError(f"{path}: holds the {part} trained on {saved_base}, not on {base_model}: resume on "
                              "that base (or start in another output directory)")
    weights, target = sd["trainable"], trainable_state_dict(model)
    extra = sorted(set(weights) - set(target))
    if extra:
        raise CheckpointError(f"{path} does not fit this run: it holds {extra[0]}, which this run does not train "
                              f"(the {part} of another configuration?)")
    return weights, target


def model_weights(checkpoint: dict) -> dict:
    """The model state dict inside a checkpoint: upstream's ``'module'``, or the dict itself (HF weights)."""
    weights = checkpoint.get("module", checkpoint)
    if not isinstance(weights, dict) or not any(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError("the checkpoint holds no model weights ('module' missing)")
    return weights


def _keyed_as(weights: dict, target: dict) -> dict:
    """``weights`` keyed as the model names them: Hugging Face files nest a model under its wrapper's
    ``base_model_prefix`` (GLM's ``glm.``), which is dropped where the rest of the key is the model's."""
    keyed = {}
    for key, value in weights.items():
        inner = key.split(".", 1)[-1]
        keyed[inner if key not in target and inner in target else key] = value
    return keyed


def check_fits(weights: dict, model_state: dict, source, hint: str = "") -> None:
    """One-line error when ``weights`` were made for another architecture than ``model_state``."""
    missing = [k for k in model_state if k not in weights]
    if missing:
        raise CheckpointError(
            f"{source} does not fit this model: it lacks {len(missing)} of the model's weights, e.g. {missing[0]}"
        )
    for key, value in model_state.items():
        if weights[key].shape != value.shape:
            raise CheckpointError(
                f"{source} does not fit this model: {key} is {list(weights[key].shape)} there, "
                f"{list(value.shape)} here{hint}"
            )


def _tensor_parallel_hint(sd: dict) -> str:
    """What a checkpoint's shape mismatch may be owed to: the tensor-parallel size it was saved at (its
    ``'mp_world_size'``) against this run's, else a guess when this run is tensor parallel."""
    tp_size = tensor_parallel_size()
    saved = sd.get("mp_world_size") if isinstance(sd, dict) else None
    if isinstance(saved, int) and saved != tp_size:
        return f" (saved at tensor parallel {saved}, this run is at tensor parallel {tp_size}: resume at {saved})"
    if tp_size > 1:
        return f" (this rank's shard of tensor parallel {tp_size}: saved with another --model-parallel-size?)"
    return ""


def check_resumable(load, model, *, tp_rank: int = 0, trainable_only: bool = False,
                    base_model: str | None = None) -> None:
    """The CheckpointError ``load_checkpoint`` would raise about the weights of ``load``'s latest checkpoint
    (another model, another base, a trained part that does not fit), raised before a run writes anything; the
    tensors are memory-mapped, not read. Sharded (DCP) checkpoints and files that cannot be read this way are
    left to ``load_checkpoint``."""
    path = find_checkpoint(load, tp_rank)
    sd = None if path.name == SHARDED_STATE else _header(path)
    if sd is None:
        return
    weights, target = _trained_part(sd, path, model, trainable_only, base_model)
    check_fits(weights, target, path, _tensor_parallel_hint(sd))


def load_checkpoint(load, model, *, tp_rank: int = 0, optimizer=None, scheduler=None, grad_scaler=None,
                    load_optimizer: bool = True, load_rng: bool = True, trainable_only: bool = False,
                    base_model: str | None = None) -> int:
    """Load ``--load`` into ``model`` (and the training state when present); returns the iteration.
    ``trainable_only``: the run trains part of a frozen ``base_model`` (P-Tuning, LoRA), so a checkpoint of
    that part alone (``save_checkpoint(trained_part=...)``) is put back on its trained parameters; a whole
    model's checkpoint loads whole as ever."""
    load = Path(load)
    if dist.get_rank() == 0 and load.is_dir() and (load / TRACKER).is_file():
        clear_interrupted_saves(load)  # resuming where a killed save left debris
    path = find_checkpoint(load, tp_rank)
    if path.name == SHARDED_STATE:
        return load_sharded_checkpoint(path, model, optimizer=optimizer, scheduler=scheduler,
                                       grad_scaler=grad_scaler, load_optimizer=load_optimizer, load_rng=load_rng)
    try:
        sd = read_checkpoint(path)
    except CheckpointError as error:
        tracked = load.is_dir() and (load / TRACKER).is_file()
        raise CheckpointError(f"{error}{_previous_good(load, int(path.parent.name), tp_rank) if tracked else ''}") from None
    # this rank's shards under tensor parallel, as upstream's files hold; or the run's trained part alone
    weights, target = _trained_part(sd, path, model, trainable_only, base_model)
    check_fits(weights, target, path, _tensor_parallel_hint(sd))
    with torch.no_grad():  # extra keys (e.g. an HF head) are not ours to load
        for name, tensor in target.items():
            tensor.copy_(weights[name])
    if "glm_config" not in sd:
        # Upstream's or Hugging Face's file: its optimizer state is apex's/DeepSpeed's, so take the
        # weights and start a new run from them.
        return 0
    if load_optimizer and optimizer is not None and "optimizer" in sd:
        optimizer.load_state_dict(sd["optimizer"])
        if scheduler is not None and "lr_scheduler" in sd:
            scheduler.load_state_dict(sd["lr_scheduler"])
        if grad_scaler is not None and "grad_scaler" in sd:
            grad_scaler.load_state_dict(sd["grad_scaler"])
    if load_rng and "torch_rng_state" in sd:
        _set_rng_states(sd)
        if "rng_tracker_states" in sd and _tracker() is not None:
            _tracker().set_states(sd["rng_tracker_states"])
    return int(sd.get("iteration", 0))


# ---- the base model an adapter was trained on ---------------------------------------------------------

BASE_RECORD = "base_model.json"  # beside a PEFT adapter's adapter_config.json


def weights_fingerprint(state) -> str:
    """sha256 of a model's weights: every tensor's name, shape and values, floating point ones as float32
    (exact for float16 and bfloat16), so a base held in any of those dtypes, on any device, fingerprints
    alike. One tensor is converted at a time."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach()
        tensor = (tensor.float() if tensor.is_floating_point() else tensor).cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}\n".encode())
        digest.update(tensor.numpy().reshape(-1).view(np.uint8))
    return digest.hexdigest()


def write_base_record(adapter_dir, base_path, fingerprint: str | None) -> Path:
    """Record beside an adapter the base it was trained on: its path (as PEFT's ``base_model_name_or_path``)
    and its :func:`weights_fingerprint` (None where it was not taken: a tensor-parallel run)."""
    path = Path(adapter_dir) / BASE_RECORD
    record = {"base_model_name_or_path": str(base_path) if base_path is not None else None,
              "weights_sha256": fingerprint}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_base_record(adapter_dir) -> dict | None:
    """What :func:`write_base_record` wrote beside ``adapter_dir``, or None (an adapter saved by plain PEFT)."""
    path = Path(adapter_dir) / BASE_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a readable base record ({error})") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: not a readable base record (not a JSON object)")
    return record

