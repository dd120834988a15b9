"""The training batch stream: corpus -> fixed-length windows -> blank infilling -> tensors.

Sample ``i`` of the global order is window ``i`` of the document stream, masked with randomness from
``(seed, i)`` alone. Each epoch shuffles the documents (seeded by ``(seed, epoch)``), lays them out as
``[CLS] doc [eos] [CLS] doc [eos] ...`` and cuts that into ``seq_length``-token windows (a window that starts
inside a document gets a ``[CLS]`` in front, as upstream's BlockDataset does). Data-parallel rank ``r`` of
``N`` takes samples ``r, r + N, r + 2N, ...``, so N ranks at batch size ``b`` together see exactly the batches
one process sees at ``N * b``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

import shim as torch
from glm_port.data.blocklm import BlockMasker
from glm_port.data.corpus import TokenizedCorpus, load_corpus
from glm_port.data.tokenization import GLMTokenizer

_SHUFFLE_STREAM = 0x5EED  # keeps document shuffling's random stream apart from the masker's (seed, index)


class Windows:
    """Window ``i`` (over all epochs) of the shuffled document stream, each ``seq_length`` ids.

    Only the framed documents are held (int32); an epoch is its document order, and a window gathers the
    few documents it overlaps.
    """

    def __init__(self, corpus: TokenizedCorpus, seq_length: int, seed: int, cls_id: int, eos_id: int):
        if len(corpus) == 0:
            raise ValueError("the corpus has no documents")
        self.seq_length, self.seed, self.cls_id = seq_length, seed, cls_id
        # Every document framed once as [CLS] doc [eos].
        self.lengths = np.diff(corpus.offsets) + 2
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.framed = np.empty(int(self.lengths.sum()), dtype=np.int32)
        inside = np.ones(len(self.framed), dtype=bool)
        inside[self.starts] = inside[self.starts + self.lengths - 1] = False
        self.framed[inside] = corpus.ids
        self.framed[self.starts], self.framed[self.starts + self.lengths - 1] = cls_id, eos_id
        self.per_epoch = max(1, len(self.framed) // seq_length)
        self._epoch, self._order, self._ends = -1, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s document order and where each document ends in its stream."""
        if epoch != self._epoch:
            order = np.random.default_rng([self.seed, epoch, _SHUFFLE_STREAM]).permutation(len(self.lengths))
            self._epoch, self._order, self._ends = epoch, order, np.cumsum(self.lengths[order])
        return self._order, self._ends

    def __getitem__(self, i: int) -> np.ndarray:
        epoch, k = divmod(i, self.per_epoch)
        order, ends = self._layout(epoch)
        start, stop = k * self.seq_length, min((k + 1) * self.seq_length, int(ends[-1]))
        pieces = []
        for j in range(int(np.searchsorted(ends, start, side="right")), len(order)):
            doc_start = int(ends[j] - self.lengths[order[j]])
            if doc_start >= stop:
                break
            offset = self.starts[order[j]] - doc_start
            pieces.append(self.framed[offset + max(start, doc_start): offset + min(stop, int(ends[j]))])
        window = np.concatenate(pieces).astype(np.int64)
        if window[0] != self.cls_id:
            window = np.concatenate(([self.cls_id], window[:-1]))
        return window


class BlockLMDataset(torch.utils.data.Dataset):
    """Sample ``i`` of the global order: window ``i``, blank-infilled with randomness from ``(seed, i)``."""

    def __init__(self, windows: Windows, masker: BlockMasker):
        self.windows, self.masker = windows, masker

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.masker(self.windows[i], index=i)


class RankBatches:
    """Batch sampler: rank ``r``'s ``b``-th batch is global samples ``b*N*B + r + N*j`` for ``j < B``."""

    def __init__(self, batch_size: int, rank: int, world_size: int, start_batch: int = 0):
        self.batch_size, self.rank, self.world_size, self.start_batch = batch_size, rank, world_size, start_batch

    def __iter__(self) -> Iterator[list[int]]:
        global_batch = self.batch_size * self.world_size
        for b in itertools.count(self.start_batch):
            yield list(range(b * global_batch + self.rank, (b + 1) * global_batch, self.world_size))


def collate(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack masked samples into upstream's batch: ``text``/``target`` [b, s] long, ``loss_mask`` [b, s]
    float, ``attention_mask`` [b] long (sep), ``position_id`` [b, 2, s] long."""
    return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}


def build_train_batches(paths: Sequence[str | Path] | str | Path | None, tokenizer: GLMTokenizer, *,
                        seq_length: int, batch_size: int, seed: int, masker_kwargs: dict | None = None,
                        rank: int = 0, world_size: int = 1, text_key: str = "text", start_batch: int = 0,
                        num_workers: int = 0, cache: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """An endless iterator of this rank's training batches (see the module docstring).

    ``paths``: corpus files (None: the embedded tiny corpus). ``masker_kwargs``: BlockMasker's knobs
    (``bert_prob``, ``gap_sentence_prob``, ``task_mask``, ...). ``start_batch`` skips ahead without masking
    the skipped samples, for resuming. ``num_workers`` > 0 masks in DataLoader worker processes; the
    batches are the same either way.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch_size < 1 or seq_length < 4:
        raise ValueError(f"need batch_size >= 1 and seq_length >= 4, got {batch_size} and {seq_length}")
    corpus = load_corpus(paths, tokenizer, text_key=text_key, cache=cache, progress=rank == 0)
    masker = BlockMasker(tokenizer, seed=seed, seq_length=seq_length, **(masker_kwargs or {}))
    windows = Windows(corpus, seq_length, seed, tokenizer.cls_id, tokenizer.eos_id)
    loader = torch.utils.data.DataLoader(
        BlockLMDataset(windows, masker), batch_sampler=RankBatches(batch_size, rank, world_size, start_batch),
        collate_fn=collate, num_workers=num_workers)
    return iter(loader)
