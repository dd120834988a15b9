"""The training batch stream: corpus -> fixed-length windows -> blank infilling -> tensors.

Sample ``i`` of the global order is window ``i`` of the document stream, masked with randomness from
``(seed, i)`` alone. Each epoch shuffles the documents (seeded by ``(seed, epoch)``), lays them out as
``[CLS] doc [eos] [CLS] doc [eos] ...`` and cuts that into ``seq_length``-token windows (a window that starts
inside a document gets a ``[CLS]`` in front, as upstream's BlockDataset does). Data-parallel rank ``r`` of
``N`` takes samples ``r, r + N, r + 2N, ...``, so N ranks at batch size ``b`` together see exactly the batches
one process sees at ``N * b``.

Upstream's data options (``DataOptions``): ``--split`` divides the documents into train/valid/test by
upstream's rule (``split_documents``); ``--non-sentence-start`` is the share of windows allowed to start
mid-sentence (the others move their start, by at most half a window, to just after a sentence end, as
upstream's BlockDataset does); ``--sample-one-document`` gives each window a single document (a long one
in consecutive pieces); ``--filter-english`` keeps the documents that py3langid reads as English;
``--loader-scatter N`` gives data-parallel rank ``r`` the ``r % N``-th of N disjoint shares of the documents.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

import shim as torch
from glm_port.data._renamed import renamed
from glm_port.data.blocklm import BlockMasker
from glm_port.data.corpus import TokenizedCorpus, load_corpus
from glm_port.data.tokenization import GLMVocab

_SHUFFLE_STREAM = 0x5EED  # keeps document shuffling's random stream apart from the masker's (seed, index)
_SENTENCE_STREAM = 0x5E57  # window starts (--non-sentence-start)
_SCATTER_STREAM = 0x5CA7  # --loader-scatter's document shares
_SPLIT_SEED = 1234  # upstream's split_ds shuffles documents with RandomState(1234) whatever --seed is


class Windows:
    """Window ``i`` (over all epochs) of the shuffled document stream, each ``seq_length`` ids.

    Only the framed documents are held (int32); an epoch is its document order, and a window gathers the
    few documents it overlaps.
    """

    def __init__(self, corpus: TokenizedCorpus, seq_length: int, seed: int, cls_id: int, eos_id: int, *,
                 sentence_end: np.ndarray | None = None, non_sentence_start: float = 1.0,
                 one_document: bool = False):
        """``sentence_end`` (a bool per vocabulary id) with ``non_sentence_start`` < 1 moves the start of
        ``1 - non_sentence_start`` of the windows that begin mid-document to a sentence start; ``one_document``
        lays each document out alone (its last window shorter, padded later) instead of back to back."""
        if len(corpus) == 0:
            raise ValueError("the corpus has no documents")
        if not 0.0 <= non_sentence_start <= 1.0:
            raise ValueError(f"non_sentence_start must be in [0, 1], got {non_sentence_start}")
        if non_sentence_start < 1.0 and sentence_end is None:
            raise ValueError("sentence starts need the tokenizer's sentence_end table")
        self.seq_length, self.seed, self.cls_id, self.eos_id = seq_length, seed, cls_id, eos_id
        self.sentence_end, self.non_sentence_start = sentence_end, non_sentence_start
        # Every document framed once as [CLS] doc [eos].
        self.framed_lengths = np.diff(corpus.offsets) + 2
        self.starts_framed = np.cumsum(self.framed_lengths) - self.framed_lengths
        self.framed = np.empty(int(self.framed_lengths.sum()), dtype=np.int32)
        inside = np.ones(len(self.framed), dtype=bool)
        inside[self.starts_framed] = inside[self.starts_framed + self.framed_lengths - 1] = False
        self.framed[inside] = corpus.ids
        self.framed[self.starts_framed] = cls_id
        self.framed[self.starts_framed + self.framed_lengths - 1] = eos_id
        self.lengths = self.framed_lengths.copy()  # what each document takes in the stream
        if one_document:  # each document's windows: its pieces of at most seq_length tokens, padded apart
            self.pieces = -(-self.lengths // seq_length)
            self.lengths = self.pieces * seq_length  # a document takes whole windows in the stream
        self.one_document = one_document
        self.per_epoch = max(1, int(self.lengths.sum()) // seq_length)
        self._epoch, self._order, self._ends = -1, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s document order and where each document ends in its stream."""
        if epoch != self._epoch:
            order = np.random.default_rng([self.seed, epoch, _SHUFFLE_STREAM]).permutation(len(self.lengths))
            self._epoch, self._order, self._ends = epoch, order, np.cumsum(self.lengths[order])
        return self._order, self._ends

    def _stream(self, order, ends, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of an epoch's document stream (clipped to it)."""
        start, stop = max(start, 0), min(stop, int(ends[-1]))
        pieces = [np.empty(0, dtype=np.int32)]
        for j in range(int(np.searchsorted(ends, start, side="right")), len(order)):
            doc_start = int(ends[j] - self.lengths[order[j]])
            if doc_start >= stop:
                break
            framed_length = len(self._framed_doc(order[j]))
            offset = self.starts_framed[order[j]] - doc_start
            doc_stop = min(stop, doc_start + framed_length)  # one_document: the padding after it is not text
            if doc_stop > max(start, doc_start):
                pieces.append(self.framed[offset + max(start, doc_start): offset + doc_stop])
        return np.concatenate(pieces).astype(np.int64)

    def _framed_doc(self, d: int) -> np.ndarray:
        return self.framed[self.starts_framed[d]: self.starts_framed[d] + self.framed_lengths[d]]

    def __getitem__(self, i: int) -> np.ndarray:
        epoch, k = divmod(i, self.per_epoch)
        order, ends = self._layout(epoch)
        start = k * self.seq_length
        if self.one_document:
            j = int(np.searchsorted(ends, start, side="right"))
            doc = self._framed_doc(order[j])
            piece_start = start - int(ends[j] - self.lengths[order[j]])
            window = doc[piece_start: piece_start + self.seq_length].astype(np.int64)
        else:
            if self.non_sentence_start < 1.0:
                start = self._sentence_start(order, ends, start, i)
            window = self._stream(order, ends, start, start + self.seq_length)
        if window[0] != self.cls_id:
            window = np.concatenate(([self.cls_id], window[:-1]))
        return window

    def _sentence_start(self, order, ends, start: int, i: int) -> int:
        """Upstream's BlockDataset start: with probability ``1 - non_sentence_start`` a window beginning
        inside a document moves (back or forward, even odds, at most half a window, never past the document's
        edge) to just after a sentence-final token."""
        rng = np.random.default_rng([self.seed, i, _SENTENCE_STREAM])
        if rng.random() < self.non_sentence_start:
            return start
        reach = self.seq_length // 2
        around = self._stream(order, ends, start - reach - 1, start + reach + 1)
        here = min(start, reach + 1)  # index of ``start`` in ``around``
        if here >= len(around) or around[here] == self.cls_id or here == 0:
            return start
        after_end = self.sentence_end[around[:-1]] | (around[:-1] == self.eos_id)
        step = -1 if rng.random() < 0.5 else 1
        position, moved = here, 0
        while moved < reach and 0 < position < len(around):
            if after_end[position - 1] or around[position] == self.cls_id:
                break
            if around[position - 1] == self.cls_id:  # the document's first token: start at its [CLS]
                position -= 1
                break
            position += step
            moved += 1
        if position < len(around) and around[position] == self.eos_id:  # ran into the end: next document
            position += 1
        return start + position - here


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


def stack_batch(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack masked samples into upstream's batch: ``text``/``target`` [b, s] long, ``loss_mask`` [b, s]
    float, ``attention_mask`` [b] long (sep), ``position_id`` [b, 2, s] long."""
    return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}


def parse_split(text: str, *, valid_given: bool = False, test_given: bool = False) -> list[float]:
    """Upstream's ``--split`` ("949,50,1", "0.9/0.1", "0.98"): train/valid/test shares summing to 1. Shares
    summing to less than 1 leave the rest to the next part; a part given by its own file gets none."""
    try:
        shares = [float(x) for x in text.replace("/", ",").split(",")]
    except ValueError:
        raise ValueError(f"--split {text!r}: expected comma-separated numbers such as 949,50,1") from None
    if any(x < 0 for x in shares) or not sum(shares) > 0:
        raise ValueError(f"--split {text!r}: shares must be non-negative and not all zero")
    if sum(shares) < 1.0:
        shares.append(1.0 - sum(shares))
    shares = (shares + [0.0, 0.0])[:3]
    if valid_given:
        shares[1] = 0.0
    if test_given:
        shares[2] = 0.0
    if shares[0] == 0.0 and sum(shares) == 0.0:
        raise ValueError(f"--split {text!r}: no share left for training")
    total = sum(shares)
    return [x / total for x in shares]


def split_documents(num_documents: int, shares: Sequence[float]) -> list[np.ndarray | None]:
    """Upstream's ``split_ds``: documents shuffled by ``RandomState(1234)``, then cut in order into parts of
    ``num_documents * share`` documents, fractions carried from one part to the next; a non-zero share gets
    at least one document, a zero share ``None``."""
    order = np.arange(num_documents)
    np.random.RandomState(_SPLIT_SEED).shuffle(order)
    parts: list[np.ndarray | None] = []
    start, carry = 0, 0.0
    for share in shares:
        if share == 0:
            parts.append(None)
            continue
        size = num_documents * share
        carry += size % 1
        count = int(int(size) + carry)
        parts.append(order[start: start + max(count, 1)])
        start += count
        carry %= 1
    return parts


def take_documents(corpus: TokenizedCorpus, indices: np.ndarray) -> TokenizedCorpus:
    """The documents ``indices`` of ``corpus``, in that order."""
    indices = np.asarray(indices, dtype=np.int64)
    lengths = corpus.offsets[indices + 1] - corpus.offsets[indices]
    starts = corpus.offsets[indices]
    gather = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))
    return TokenizedCorpus(corpus.ids[gather], np.concatenate(([0], np.cumsum(lengths))))


def english_documents(corpus: TokenizedCorpus, tokenizer: GLMVocab, progress: bool = True) -> np.ndarray:
    """Indices of the documents py3langid classifies as English, judged, as upstream's --filter-english judges
    them with fastText, on the text of their first 1024 tokens with newlines removed."""
    try:
        import py3langid
    except ImportError:
        raise ImportError("--filter-english needs py3langid: pip install 'glm-migrate[data]'") from None
    keep = [i for i in tqdm(range(len(corpus)), desc="language check", unit="doc", disable=not progress)
            if py3langid.classify(tokenizer.decode(corpus[i][:1024]).replace("\n", ""))[0] == "en"]
    return np.array(keep, dtype=np.int64)


@dataclass(frozen=True)
class DataOptions:
    """Upstream's data flags that decide which documents a rank reads and how windows are cut."""

    split: str = "1000,1,1"
    valid_given: bool = False
    test_given: bool = False
    filter_english: bool = False
    non_sentence_start: float = 1.0  # upstream's default 0.0 is glm-pretrain's; 1.0 keeps windows where they fall
    sample_one_document: bool = False
    loader_scatter: int | None = None


def scatter_documents(num_documents: int, scatter: int, part: int, seed: int) -> np.ndarray:
    """Upstream's --loader-scatter: documents shuffled (seeded), cut into ``scatter`` contiguous shares of
    ``ceil(n / scatter)``; share ``part`` of them."""
    order = np.random.default_rng([seed, _SCATTER_STREAM]).permutation(num_documents)
    size = -(-num_documents // scatter)
    return np.sort(order[part * size: (part + 1) * size])


def corpus_splits(corpus: TokenizedCorpus, tokenizer: GLMVocab, options: DataOptions, *, seed: int,
                  scatter_part: int = 0, progress: bool = True) -> list[TokenizedCorpus | None]:
    """Train, valid and test corpora (None for an empty share), in upstream's order: scatter, split, filter."""
    if options.loader_scatter:
        corpus = take_documents(corpus, scatter_documents(len(corpus), options.loader_scatter, scatter_part, seed))
        if len(corpus) == 0:
            raise ValueError(f"--loader-scatter {options.loader_scatter}: share {scatter_part} has no documents")
    shares = parse_split(options.split, valid_given=options.valid_given, test_given=options.test_given)
    parts = split_documents(len(corpus), shares) if max(shares) < 1.0 else [np.arange(len(corpus)), None, None]
    splits = []
    for name, indices in zip(("train", "valid", "test"), parts):
        if indices is None:
            splits.append(None)
            continue
        part = take_documents(corpus, indices)
        if options.filter_english:
            part = take_documents(part, english_documents(part, tokenizer, progress))
            if len(part) == 0:
                raise ValueError(f"--filter-english left no English document in the {name} data")
        splits.append(part)
    return splits


def build_batches(corpus: TokenizedCorpus, tokenizer: GLMVocab, *, seq_length: int, batch_size: int,
                  seed: int, masker_kwargs: dict | None = None, rank: int = 0, world_size: int = 1,
                  start_batch: int = 0, num_workers: int = 0, options: DataOptions | None = None
                  ) -> Iterator[dict[str, torch.Tensor]]:
    """An endless iterator of this rank's batches of ``corpus`` (see the module docstring)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch_size < 1 or seq_length < 4:
        raise ValueError(f"need batch_size >= 1 and seq_length >= 4, got {batch_size} and {seq_length}")
    options = options or DataOptions()
    masker = BlockMasker(tokenizer, seed=seed, seq_length=seq_length, **(masker_kwargs or {}))
    windows = Windows(corpus, seq_length, seed, tokenizer.cls_id, tokenizer.eos_id,
                      sentence_end=tokenizer.sentence_end, non_sentence_start=options.non_sentence_start,
                      one_document=options.sample_one_document)
    loader = torch.utils.data.DataLoader(
        BlockLMDataset(windows, masker), batch_sampler=RankBatches(batch_size, rank, world_size, start_batch),
        collate_fn=stack_batch, num_workers=num_workers)
    return iter(loader)


def build_train_batches(paths: Sequence[str | Path] | str | Path | None, tokenizer: GLMVocab, *,
                        seq_length: int, batch_size: int, seed: int, masker_kwargs: dict | None = None,
                        rank: int = 0, world_size: int = 1, text_key: str = "text", start_batch: int = 0,
                        num_workers: int = 0, cache: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """An endless iterator of this rank's training batches over all of ``paths`` (see the module docstring).

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
    return build_batches(corpus, tokenizer, seq_length=seq_length, batch_size=batch_size, seed=seed,
                         masker_kwargs=masker_kwargs, rank=rank, world_size=world_size, start_batch=start_batch,
                         num_workers=num_workers)


__getattr__ = renamed(__name__, {"collate": "stack_batch"}, globals())  # the name before issue 27
