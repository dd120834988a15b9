"""One reader for every file layout the families' weights come in; a family adds only its state-dict adapter.

Layouts (``find_layout``), the same for every family:

- ``hf``: transformers' files: ``model.safetensors``, ``pytorch_model.bin``, or either sharded with its
  ``*.index.json`` (every shard the index names checked present, every safetensors header checked readable,
  before a tensor is read); a single weight file given by its path;
- ``ranks``: one ``mp_rank_XX_model_states.pt`` per tensor-parallel rank (upstream GLM's, DeepSpeed's and the
  project's own saves: weights under ``'module'``, the architecture under ``'glm_config'``), in an iteration
  directory, under a ``latest_checkpointed_iteration.txt`` / ``latest`` tracker, or one rank's file given;
- ``dcp``: a sharded run's torch.distributed.checkpoint directory (``checkpoint_io.save_sharded_checkpoint``),
  read whole.

Reading (``TensorFile`` for one file, ``Tensors`` for an ``hf`` layout across its shards, ``iter_rank_tensors``
for a rank's slice of any layout): safetensors through ``safe_open``, lazily and by name, a tensor-parallel slice
read as a slice of the file (``get_slice``); ``.pt``/``.bin`` through ``torch.load(weights_only=True, mmap=True)``
(upstream's rank files pickle numpy RNG state beside the weights: those, named ``mp_rank_XX``, fall back to a
full unpickling, as upstream loads them: a checkpoint you load is trusted). Nothing here knows a family's names:
a ``rename`` (the family's adapter, ``Adapter``) turns the file's names into the family's, and the family's split
plan (``take``, ``merge``) cuts and joins tensor-parallel parts.

Every failure is one ``glm_port.models.WeightsError`` naming the file.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import shim as torch

from glm_port.checkpoint_io import (RANK_FILE, SHARDED_STATE, CheckpointError, is_sharded_checkpoint, load_file,
                                    open_safetensors, rank_files, read_sharded_weights, saved_config, shard_directory,
                                    trained_part_problem)
from glm_port.models import WeightsError

# transformers' weight files, in the order a directory's are taken (safetensors first, as transformers does)
HF_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")
INDEX_FILES = tuple(f for f in HF_FILES if f.endswith(".index.json"))
SINGLE_FILES = tuple(f for f in HF_FILES if not f.endswith(".index.json"))


# ---- a family's names ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Adapter:
    """A family's checkpoint names <-> its model's state-dict names, both ways.

    ``to_model(name)``: the model's name for a checkpoint name, None for one the model does not hold (a constant
    buffer a checkpoint carries); ``to_checkpoint(name)``: the name a checkpoint of the family's own layout
    stores a model weight under. Renames only (one tensor each way); a layout that fuses or splits tensors (the
    transformers ``glm`` layout's ``q|k|v_proj``) is a plan over these names in the family's folder."""

    to_model: Callable[[str], str | None] = staticmethod(lambda name: name)
    to_checkpoint: Callable[[str], str] = staticmethod(lambda name: name)


IDENTITY = Adapter()


# ---- where the weights are -------------------------------------------------------------------------
@dataclass
class Layout:
    """What ``path`` holds: ``kind`` ("hf", "ranks" or "dcp") and its ``files`` (``hf``: the weight files, sorted;
    ``ranks``: one per tensor-parallel rank, in rank order; ``dcp``: the iteration directory)."""

    kind: str
    path: Path  # what was asked for (a directory, or the file given), for messages
    files: list[Path]
    index: Path | None = None  # hf sharded: the index
    key_map: dict[str, Path] = field(default_factory=dict)  # hf sharded: tensor name -> its file
    config_file: Path | None = None  # the config.json that goes with the weights, when there is one

    @property
    def tp_size(self) -> int:
        """How many tensor-parallel ranks' parts the weights are stored in."""
        return len(self.files) if self.kind == "ranks" else 1

    @property
    def directory(self) -> Path:
        return self.files[0] if self.kind == "dcp" else self.files[0].parent


def find_layout(path, what: str = "") -> Layout:
    """The layout of the weights at ``path`` (a directory, or one weight file); a one-line ``WeightsError`` when
    there is none (``what``: the family's name for the message, "GLM" gives "holds no GLM weights")."""
    path = Path(path).expanduser()
    if not path.exists():
        raise WeightsError(f"{path}: no such file or directory")
    if path.is_file():
        if RANK_FILE.search(path.name):
            return _ranks(path.parent, path)
        _check_readable(path)
        return Layout("hf", path, [path], config_file=_present(path.with_name("config.json")))
    for name in HF_FILES:
        candidate = path / name
        if candidate.is_file():
            if name.endswith(".index.json"):
                return _indexed(path, candidate)
            _check_readable(candidate)
            return Layout("hf", path, [candidate], config_file=_present(path / "config.json"))
    target = shard_directory(path) or (path if is_sharded_checkpoint(path) else None)  # a tracker's, or here
    if target is not None:
        if not target.is_dir():
            raise WeightsError(f"{path}: its checkpoint tracker points at {target}, which does not exist")
        return _ranks(target, path)
    kind = f" {what}" if what else ""
    raise WeightsError(f"{path} holds no{kind} weights (looked for {', '.join(HF_FILES)}, "
                       f"mp_rank_XX_model_states.pt, or a checkpoint tracker)")


def _present(path: Path) -> Path | None:
    return path if path.is_file() else None


def _check_readable(path: Path) -> None:
    if path.suffix == ".safetensors":  # its header against its size: a truncated file named before any reading
        open_safetensors(path, WeightsError)


def read_json(path: Path) -> dict | None:
    """A JSON file (None when absent); not JSON is one line naming it."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise WeightsError(f"{path}: not valid JSON ({error})") from None


def _indexed(directory: Path, index: Path) -> Layout:
    parsed = read_json(index)
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
        raise WeightsError(f"{index}: not a weight index (no 'weight_map')")
    files = sorted({directory / f for f in weight_map.values()})
    missing = [f for f in files if not f.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{missing[0]}: shard listed in {index.name} is missing{more}")
    for file in files:
        _check_readable(file)
    return Layout("hf", directory, files, index=index, key_map={k: directory / f for k, f in weight_map.items()},
                  config_file=_present(directory / "config.json"))


def _ranks(directory: Path, root: Path) -> Layout:
    root = root if root.is_dir() else root.parent
    configs = (root / "config.json", directory / "config.json")
    if is_sharded_checkpoint(directory):
        return Layout("dcp", root, [directory], config_file=next((c for c in configs if c.is_file()), None))
    try:  # every rank's file, or the first missing one named
        files = rank_files(directory)
    except CheckpointError as error:
        raise WeightsError(str(error)) from None
    return Layout("ranks", root, files, config_file=next((c for c in reversed(configs) if c.is_file()), None))


# ---- reading ---------------------------------------------------------------------------------------
def load_checkpoint_file(path: Path, unpickle: bool = False):
    """A ``.pt``/``.bin`` file, tensors memory-mapped where its format allows, read with ``weights_only`` (no code
    in the file runs). ``unpickle``: a rank file that needs more (upstream GLM's pickle numpy RNG state beside the
    weights) is unpickled whole, as upstream does: the reader of a family whose upstream writes such files asks
    for it (GLM's); the others (ChatGLM2's, GLM-4's: their rank files are the project's own) never unpickle. One
    line naming the file otherwise."""
    errors = (pickle.UnpicklingError, OSError, RuntimeError, EOFError, ValueError, AttributeError, TypeError)
    attempts = [{"mmap": True, "weights_only": True}, {"weights_only": True}]
    if unpickle and RANK_FILE.search(path.name):
        attempts += [{"mmap": True, "weights_only": False}, {"weights_only": False}]
    last = None
    for kwargs in attempts:
        try:
            return load_file(path, **kwargs)
        except errors as error:
            last = error
    reason = str(last).strip().splitlines()[0] if str(last).strip() else type(last).__name__
    raise WeightsError(f"{path}: not a readable checkpoint ({reason})")


class TensorFile:
    """The tensors of one weight file (or a ``dcp`` directory) by name, renamed by ``rename`` (a family adapter's
    ``to_model``, or any name map; None drops a name). Safetensors are read lazily and sliceably; a ``.pt``/``.bin``
    is mapped, its weights its ``'module'`` (a rank's file: upstream's and the project's saves) or the dict itself."""

    def __init__(self, path, rename: Callable[[str], str | None] | None = None, unpickle: bool = False):
        self.path = path = Path(path)
        self._handle, self._tensors, self._checkpoint = None, None, None
        if path.is_dir():  # a sharded run's DCP checkpoint: read whole
            try:
                raw = read_sharded_weights(path)
            except CheckpointError as error:
                raise WeightsError(str(error)) from None
            self._tensors = raw
        elif path.suffix == ".safetensors":
            self._handle = open_safetensors(path, WeightsError)
            raw = dict.fromkeys(self._handle.keys())
        else:
            checkpoint = load_checkpoint_file(path, unpickle)
            self._checkpoint = checkpoint if isinstance(checkpoint, dict) else None
            problem = trained_part_problem(checkpoint, path)  # a LoRA / P-Tuning run's resumable state
            if problem is not None:
                raise WeightsError(problem)
            weights = checkpoint.get("module", checkpoint) if isinstance(checkpoint, dict) else None
            if not isinstance(weights, dict) or not any(isinstance(v, torch.Tensor) for v in weights.values()):
                raise WeightsError(f"{path}: holds no model weights ('module' missing)")
            raw = self._tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
        self._names = {}
        for key in raw:
            name = rename(key) if rename is not None else key
            if name is not None:
                self._names[name] = key

    def keys(self):
        return self._names.keys()

    def __contains__(self, name) -> bool:
        return name in self._names

    def stored_name(self, name: str) -> str:
        return self._names[name]

    def part(self, name: str):
        """``name``'s tensor as something to slice: a safetensors slice (only what is indexed is read) or a tensor."""
        if self._handle is not None:
            return self._handle.get_slice(self._names[name])
        return self._tensors[self._names[name]]

    def get(self, name: str) -> "torch.Tensor":
        if self._handle is not None:
            return self._handle.get_tensor(self._names[name])
        return self._tensors[self._names[name]]

    def shape(self, name: str) -> list[int]:
        if self._handle is not None:
            return list(self._handle.get_slice(self._names[name]).get_shape())
        return list(self._tensors[self._names[name]].shape)

    def config(self) -> dict | None:
        """The architecture the file records (the project's saves: ``'glm_config'``; safetensors: the metadata's
        ``glm_config``), or None."""
        if self.path.is_dir():
            return saved_config(self.path / SHARDED_STATE)
        if self._handle is not None:
            metadata = self._handle.metadata() or {}
            return json.loads(metadata["glm_config"]) if "glm_config" in metadata else None
        config = (self._checkpoint or {}).get("glm_config")
        return config if isinstance(config, dict) else None

    @property
    def checkpoint(self) -> dict | None:
        """A ``.pt``/``.bin`` file's whole top-level dict (the weights mapped, not read)."""
        return self._checkpoint


class Tensors:
    """An ``hf`` layout's tensors by name across its files (its index, or the one file's names), each file opened
    once: an indexed layout's when a tensor of it is first asked for, a single file's at once (for its names).
    ``rename``: as ``TensorFile``'s."""

    def __init__(self, layout: Layout, rename: Callable[[str], str | None] | None = None):
        if layout.kind != "hf":
            raise WeightsError(f"{layout.path}: tensor-parallel rank files, not a model directory's weights")
        self.layout, self.rename = layout, rename
        self.directory = layout.path if layout.path.is_dir() else layout.path.parent
        self._open: dict[Path, TensorFile] = {}
        if layout.key_map:
            stored = layout.key_map
        else:
            only = self._file(layout.files[0])
            stored = {only.stored_name(n): layout.files[0] for n in only.keys()}
        self.map: dict[str, Path] = {}
        for key, file in stored.items():
            name = rename(key) if rename is not None else key
            if name is not None:
                self.map[name] = file

    def _file(self, path: Path) -> TensorFile:
        if path not in self._open:
            self._open[path] = TensorFile(path, self.rename)
        return self._open[path]

    def keys(self):
        return self.map.keys()

    def __contains__(self, name) -> bool:
        return name in self.map

    def __iter__(self):
        return iter(self.map)

    def file_of(self, name: str) -> TensorFile:
        if name not in self.map:
            raise WeightsError(f"{self.directory}: weight {name} missing from the checkpoint")
        file = self._file(self.map[name])
        if name not in file:
            index = self.layout.index.name if self.layout.index else "its index"
            raise WeightsError(f"{file.path}: lacks {name}, which {index} places there")
        return file

    def __getitem__(self, name: str) -> "torch.Tensor":
        return self.file_of(name).get(name)

    def part(self, name: str):
        return self.file_of(name).part(name)

    def shape(self, name: str) -> list[int]:
        return self.file_of(name).shape(name)

    def files_in_order(self) -> list[Path]:
        return sorted(set(self.map.values()))

    def close(self) -> None:
        self._open.clear()


def open_tensors(path, rename: Callable[[str], str | None] | None = None, what: str = "") -> Tensors:
    """``Tensors`` over the ``hf`` layout at ``path``."""
    return Tensors(find_layout(path, what), rename)


# ---- a tensor-parallel rank's slice of any layout ----------------------------------------------------
Take = Callable[[str, object, int, int], "torch.Tensor"]  # (name, tensor or safetensors slice, size, rank)
Merge = Callable[[str, list, list], "torch.Tensor"]  # (name, parts in rank order, their files)


def iter_rank_tensors(layout: Layout, take: Take, merge: Merge, *, tp_size: int = 1, tp_rank: int = 0,
                      rename: Callable[[str], str | None] | None = None, keep: Callable[[str], bool] | None = None,
                      unpickle: bool = False) -> Iterator[tuple[str, "torch.Tensor"]]:
    """``(name, tensor)``: rank ``tp_rank``'s slice at tensor parallel ``tp_size`` of every weight ``keep``
    accepts, file by file (the family's split plan: ``take`` cuts a rank's part, ``merge`` joins ranks' parts).

    ``hf`` and ``dcp``: each tensor cut as it is read (a safetensors slice reads only the part). ``ranks`` saved at
    size ``s``: at ``s == t`` each rank reads its own file; ``s / t`` consecutive files merged when ``t`` divides
    ``s``; one file cut further when ``s`` divides ``t``; else everything merged, then cut. ``unpickle``: as
    ``load_checkpoint_file``'s."""
    def open_file(path):
        return TensorFile(path, rename, unpickle)

    def names(file):
        return [n for n in file.keys() if keep is None or keep(n)]

    if layout.kind != "ranks":
        for path in layout.files:
            file = open_file(path)
            for name in names(file):
                yield name, take(name, file.part(name), tp_size, tp_rank)
            del file
        return
    s, t = layout.tp_size, tp_size
    if s == t:
        file = open_file(layout.files[tp_rank])
        for name in names(file):
            yield name, file.get(name)
    elif s % t == 0:
        group = s // t
        files = same_names([open_file(layout.files[tp_rank * group + i]) for i in range(group)])
        for name in names(files[0]):
            yield name, merge(name, [f.get(name) for f in files], [f.path for f in files])
    elif t % s == 0:
        group = t // s
        file = open_file(layout.files[tp_rank // group])
        for name in names(file):
            yield name, take(name, file.get(name), group, tp_rank % group)
    else:
        files = same_names([open_file(f) for f in layout.files])
        for name in names(files[0]):
            yield name, take(name, merge(name, [f.get(name) for f in files], [f.path for f in files]), t, tp_rank)


def same_names(files: list[TensorFile]) -> list[TensorFile]:
    """Tensor-parallel ranks' files hold the same weights; a file that holds others is another model's."""
    first = set(files[0].keys())
    for file in files[1:]:
        other = set(file.keys())
        if other != first:
            name, place, holder = (sorted(first - other)[0], file.path, files[0].path) if first - other else \
                (sorted(other - first)[0], files[0].path, file.path)
            raise WeightsError(f"{place} lacks {name}, which {holder} holds: shards of different models mixed?")
    return files


__all__ = ["Adapter", "HF_FILES", "IDENTITY", "INDEX_FILES", "Layout", "SINGLE_FILES", "TensorFile", "Tensors",
           "find_layout", "iter_rank_tensors", "load_checkpoint_file", "open_tensors", "read_json", "same_names"]
