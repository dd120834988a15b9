"""Tensor-parallel split plans: how each weight is cut over the ranks, written once, as data.

A ``Split`` says how one tensor is cut: along ``dim`` (``None``: replicated, whole on every rank), in
``stride`` equal blocks or in blocks of ``sections`` sizes, each block cut over the ranks, so rank ``r``
holds every block's ``r``-th part side by side (``[q_r; k_r; v_r]``). ``section_replicas[b]`` (vLLM's
key/value head replication) cuts block ``b`` into ``size / section_replicas[b]`` parts only, which
``section_replicas[b]`` neighbouring ranks hold alike.

========================================  =================  =====================================
``Split``                                  ``Linear1D``       the layer's weight
========================================  =================  =====================================
``Split(None)`` (``REPLICATED``)           ``"data"``         whole on every rank
``Split(0, stride=, sections=, ...)``      ``"col"``          output rows (bias: the same split)
``Split(1)``                               ``"row"``          input columns (bias: replicated)
========================================  =================  =====================================

``Split.layer_kwargs()`` gives the ``Linear1D`` arguments a weight's split asks for, so a model builds its
layers from the same entries its loaders slice and merge by; a ``VocabParallelEmbedding``'s table is
``Split(0)``.

A family's plan (``SplitPlan``) is an ordered table ``(key pattern, Split)``: a weight name takes the
split of the first pattern found in it (``re.search``), ``REPLICATED`` when none is. A split that depends
on the architecture (ChatGLM2's fused ``[Q | K | V]`` sections: heads, groups and their width) comes from a
plan the family builds from its config (a function ``config, size -> SplitPlan``).

``slice_for_rank(tensor, split, rank, size)`` and ``merge_ranks(parts, split)`` are exact inverses:
``merge_ranks([slice_for_rank(t, s, r, n) for r in range(n)], s)`` is ``t``. ``slice_for_rank`` takes a
``torch.Tensor`` or a safetensors slice (``safe_open(...).get_slice(name)``, read lazily: only this rank's
rows or columns are read); a one-block cut returns a view of the tensor, not a copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["REPLICATED", "Split", "SplitPlan", "merge_ranks", "slice_for_rank"]


@dataclass(frozen=True)
class Split:
    """How one tensor is cut over the tensor-parallel ranks (module docstring)."""

    dim: int | None = None
    stride: int = 1
    sections: tuple[int, ...] | None = None
    section_replicas: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.dim not in (None, 0, 1):
            raise ValueError(f"Split dim={self.dim!r}: expected None (replicated), 0 or 1")
        if self.sections is not None:
            object.__setattr__(self, "sections", tuple(int(s) for s in self.sections))
            if self.stride != 1:
                raise ValueError("Split: sections and stride exclude each other")
        if self.section_replicas is not None:
            if self.sections is None or len(self.section_replicas) != len(self.sections):
                raise ValueError(f"Split section_replicas={tuple(self.section_replicas)}: one count a section")
            replicas = tuple(int(k) for k in self.section_replicas)
            if min(replicas) < 1:
                raise ValueError(f"Split section_replicas={replicas}: counts of at least 1")
            # All ones is no replication: one spelling, so plans and layers compare equal.
            object.__setattr__(self, "section_replicas", replicas if max(replicas) > 1 else None)
        if self.dim is None and (self.stride != 1 or self.sections is not None):
            raise ValueError("Split: a replicated tensor has no stride or sections")

    @property
    def parallel(self) -> str:
        """``Linear1D``'s ``parallel`` for a layer whose weight is cut this way."""
        return {None: "data", 0: "col", 1: "row"}[self.dim]

    @property
    def bias(self) -> "Split":
        """The split of the bias of a ``Linear1D`` whose weight is cut this way (a row-split layer's
        bias is whole on every rank)."""
        return self if self.dim == 0 else REPLICATED

    def layer_kwargs(self) -> dict:
        """``Linear1D``'s keyword arguments for a layer whose weight is cut this way."""
        kwargs: dict = {"parallel": self.parallel}
        if self.stride != 1:
            kwargs["stride"] = self.stride
        if self.sections is not None:
            kwargs["sections"] = self.sections
        if self.section_replicas is not None:
            kwargs["section_replicas"] = self.section_replicas
        return kwargs

    @classmethod
    def of_layer(cls, layer) -> "Split":
        """The split a built ``Linear1D`` holds its weight by (``parallel``, ``stride``, ``output_sections``,
        ``output_replicas``): what a plan's entry for its weight must equal."""
        dim = {"data": None, "col": 0, "row": 1}[layer.parallel]
        return cls(dim, stride=layer.stride, sections=layer.output_sections, section_replicas=layer.output_replicas)

    def blocks(self, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The whole tensor's blocks along ``dim`` (sizes) and how many ranks hold each part of them."""
        if self.sections is not None:
            if sum(self.sections) != length:
                raise ValueError(f"sections {self.sections} do not add up to {length}")
            return self.sections, self.section_replicas or (1,) * len(self.sections)
        if length % self.stride:
            raise ValueError(f"{length} does not split into stride {self.stride} blocks")
        return (length // self.stride,) * self.stride, (1,) * self.stride


REPLICATED = Split()


def _shape(tensor) -> list[int]:
    return list(tensor.shape) if isinstance(tensor, torch.Tensor) else list(tensor.get_shape())


def _narrow(tensor, dim: int, start: int, stop: int):
    if isinstance(tensor, torch.Tensor):
        return tensor.narrow(dim, start, stop - start)
    return tensor[(slice(None),) * dim + (slice(start, stop),)]  # a lazy slice: only these rows are read


def _parts(size: int, copies: int, block: int) -> int:
    """How many parts a block of ``block`` rows held by ``copies`` ranks each is cut into over ``size``."""
    if size % copies:
        raise ValueError(f"tensor-parallel size {size} is not a multiple of section_replicas {copies}")
    parts = size // copies
    if block % parts:
        raise ValueError(f"a block of {block} does not split into {parts} parts")
    return parts


def slice_for_rank(tensor, split: Split, rank: int, size: int):
    """Rank ``rank``'s part (of ``size``) of the whole ``tensor`` (a tensor or a lazy safetensors slice)
    cut by ``split``; the tensor itself when replicated or ``size`` is 1. A cut that does not divide is a
    ``ValueError``."""
    if split.dim is None or size == 1:
        return tensor
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not one of tensor-parallel size {size}")
    sizes, replicas = split.blocks(_shape(tensor)[split.dim])
    pieces, start = [], 0
    for block, copies in zip(sizes, replicas):
        step = block // _parts(size, copies, block)
        part = rank // copies
        pieces.append(_narrow(tensor, split.dim, start + part * step, start + (part + 1) * step))
        start += block
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=split.dim)


def merge_ranks(parts: Sequence[torch.Tensor], split: Split) -> torch.Tensor:
    """The whole tensor from every rank's part (in rank order): ``slice_for_rank``'s inverse. A replicated
    tensor, or a part several ranks hold, is read from the first rank holding it. Parts that do not fit
    together are torch's ``RuntimeError`` (or a ``ValueError``)."""
    size = len(parts)
    if split.dim is None or size == 1:
        return parts[0]
    if split.sections is not None:
        replicas = split.section_replicas or (1,) * len(split.sections)
        local = [block // _parts(size, copies, block) for block, copies in zip(split.sections, replicas)]
    else:
        length = parts[0].shape[split.dim]
        if length % split.stride:
            raise ValueError(f"a part of {length} does not hold stride {split.stride} blocks")
        local, replicas = [length // split.stride] * split.stride, (1,) * split.stride
    if len(local) == 1:
        return torch.cat(list(parts), dim=split.dim)
    cut = [part.split(local, dim=split.dim) for part in parts]
    return torch.cat([cut[r][b] for b, copies in enumerate(replicas) for r in range(0, size, copies)], dim=split.dim)


@dataclass(frozen=True)
class SplitPlan:
    """A family's splits: ``(pattern, Split)`` rules in order, the first pattern found in a weight's name
    giving its split; ``REPLICATED`` when none is."""

    rules: tuple[tuple[re.Pattern, Split], ...]

    @classmethod
    def of(cls, rules: Iterable[tuple[str | re.Pattern, Split]]) -> "SplitPlan":
        return cls(tuple((re.compile(pattern), split) for pattern, split in rules))

    def split_for(self, name: str) -> Split:
        for pattern, split in self.rules:
            if pattern.search(name):
                return split
        return REPLICATED

    def layer_kwargs(self, weight_name: str) -> dict:
        """``Linear1D``'s split arguments for the layer whose weight is ``weight_name``."""
        return self.split_for(weight_name).layer_kwargs()

    def slice(self, name: str, tensor, rank: int, size: int):
        return slice_for_rank(tensor, self.split_for(name), rank, size)

    def merge(self, name: str, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return merge_ranks(parts, self.split_for(name))
