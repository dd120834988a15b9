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
    """Window ``i`` (over all epochs) of the shuffled document stream, each ``seq_length`` ids."""

    def __init__(self, corpus: TokenizedCorpus, seq_length: int, seed: int, cls_id: int, eos_id: int):
        if len(corpus) == 0:
            raise ValueError("the corpus has no documents")
        self.corpus, self.seq_length, self.seed = corpus, seq_length, seed
        self.cls_id, self.eos_id = cls_id, eos_id
        stream_length = corpus.num_tokens + 2 * len(corpus)
        self.per_epoch = max(1, stream_length // seq_length)
        self._epoch, self._stream = -1, np.empty(0, dtype=np.int64)

    def stream(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            order = np.random.default_rng([self.seed, epoch, _SHUFFLE_STREAM]).permutation(len(self.corpus))
            framed = []
            for d in order:
                framed += [[self.cls_id], self.corpus[d], [self.eos_id]]
            self._epoch, self._stream = epoch, np.concatenate(framed).astype(np.int64)
        return self._stream

    def __getitem__(self, i: int) -> np.ndarray:
        epoch, k = divmod(i, self.per_epoch)
        window = self.stream(epoch)[k * self.seq_length: (k + 1) * self.seq_length]
        if window[0] != self.cls_id:
            window = np.concatenate(([self.cls_id], window[:-1]))
        return window


def collate(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack masked samples into upstream's batch: ``text``/``target`` [b, s] long, ``loss_mask`` [b, s]
    float, ``attention_mask`` [b] long (sep), ``position_id`` [b, 2, s] long."""
    return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}


def build_train_batches(paths: Sequence[str | Path] | str | Path | None, tokenizer: GLMTokenizer, *,
                        seq_length: int, batch_size: int, seed: int, masker_kwargs: dict | None = None,
                        rank: int = 0, world_size: int = 1, text_key: str = "text", start_batch: int = 0,
                        cache: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """An endless iterator of this rank's training batches (see the module docstring).

    ``paths``: corpus files (None: the embedded tiny corpus). ``masker_kwargs``: BlockMasker's knobs
    (``bert_prob``, ``gap_sentence_prob``, ``task_mask``, ...). ``start_batch`` skips ahead, for resuming.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch_size < 1 or seq_length < 4:
        raise ValueError(f"need batch_size >= 1 and seq_length >= 4, got {batch_size} and {seq_length}")
    corpus = load_corpus(paths, tokenizer, text_key=text_key, cache=cache, progress=rank == 0)
    masker = BlockMasker(tokenizer, seed=seed, seq_length=seq_length, **(masker_kwargs or {}))
    windows = Windows(corpus, seq_length, seed, tokenizer.cls_id, tokenizer.eos_id)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        global_batch = batch_size * world_size
        for b in itertools.count(start_batch):
            indices = range(b * global_batch + rank, (b + 1) * global_batch, world_size)
            yield collate([masker(windows[i], index=i) for i in indices])

    return batches()
