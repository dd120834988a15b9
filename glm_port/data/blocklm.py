"""GLM's blank-infilling objective (upstream ``blocklm_utils.ConstructBlockStrategy``), one sample at a time.

A sample is a window of token ids: ``[CLS]`` + text, documents ended by eos (and each new one opened by
``[CLS]``). Spans are cut out of the text; **Part A** is the text with each span replaced by one mask token
(visible bidirectionally: the ``sep`` attention mask is Part A's length), **Part B** is the spans in shuffled
order, each fed as ``[sop] + span`` and predicted as ``span + [eop]``. Part B tokens take the position of
their mask token and block positions 1..len+1 (Part A's block positions are 0); the loss is on Part B only.

Three tasks, drawn per sample with ``bert_prob`` / ``gap_sentence_prob`` / the rest:

- token spans (``[MASK]``): Poisson(``avg_block_length``) lengths, truncated to 1..``max_block_length``-1,
  drawn until ``mask_ratio`` of the text is covered, spread over the documents in the window;
- sentence spans (``[sMASK]`` with ``task_mask``): whole sentences until ``gap_sentence_ratio`` is covered;
- generation (``[gMASK]`` with ``task_mask``): one span of ``gpt_min_ratio``..all of the text; with
  probability ``gpt_infill_prob`` (or when the window holds several documents) it is the text's suffix, fed
  as ``[gMASK] [sop] suffix[:-1]`` with no ``[eop]``, as upstream does; otherwise a span inside the document.

Upstream's ``block_mask_prob`` (Part B inputs of token spans hidden behind ``[dBLOCK]``),
``single_span_prob`` (one token span) and ``short_seq_prob`` (a text of random length in [32, seq_length-2];
upstream cuts several such pieces from random sentence starts, here it is the window's prefix) are kept, as are
``context_mask_ratio`` (token spans: that share of the text, taken from Part A tokens at most 3 away from a
span's edge, hidden behind ``[dBLOCK]``), ``shuffle_blocks`` (off: Part B in text order),
``block_position_encoding`` (off: every Part B token has block position 1, upstream's ``--no-block-position``)
and ``sentinel_base`` (upstream's ``--sentinel-token``: the k-th block of Part B, k >= 1, opens with its own
``sop<k>`` and, for token spans, leaves ``[MASK<k>]`` in Part A; every Part B token takes position
``seq_length``. Sentinel ids are ``sentinel_base + 2(k-1)`` for ``[MASK<k>]`` and one more for ``sop<k>``).

Unlike upstream, whose samples grow by two tokens per span and are padded per batch, every sample here is
exactly ``seq_length`` long: the text is cut to ``seq_length - 2 * num_spans`` tokens (the rest of the window
is dropped) and the remainder padded. Tasks are drawn per sample, not per batch, so that a sample depends only
on its index: data-parallel ranks then see exactly the samples one process would.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from glm_port.data.tokenization import GLMVocab

_CONTEXT_RANGE = 3  # upstream's context_mask_range: tokens next to a span's edge that --context-mask-ratio may hide


def _span_length_distribution(avg_block_length: float, max_block_length: int) -> np.ndarray:
    """Poisson(avg) probabilities of lengths 1..max_block_length-1, renormalised (upstream's table)."""
    k = np.arange(1, max_block_length)
    log_pmf = k * math.log(avg_block_length) - avg_block_length - np.array([math.lgamma(i + 1) for i in k])
    pmf = np.exp(log_pmf)
    return pmf / pmf.sum()


def layout_blocks(text: np.ndarray, spans: np.ndarray, order: np.ndarray, *, mask_id: int, sop_id: int,
                  eop_id: int):
    """Upstream's ``make_block_data``: Part A is ``text`` with each (start, end) span replaced by one
    ``mask_id``; Part B is the spans in ``order``, each ``[sop] + span`` predicting ``span + [eop]``.

    Returns ``(inputs, targets, loss_mask, positions, block_positions, sep)``.
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    by_start = np.argsort(spans[:, 0])
    starts, ends = spans[by_start, 0], spans[by_start, 1]
    depth = np.bincount(starts, minlength=len(text) + 1) - np.bincount(ends, minlength=len(text) + 1)
    keep = np.cumsum(depth)[:-1] == 0
    keep[starts] = True
    position = np.cumsum(keep) - 1  # a span collapses onto its mask token's position
    part_a = text.copy()
    part_a[starts] = mask_id
    part_a = part_a[keep]

    order = np.asarray(order, dtype=np.int64)
    starts, sizes = spans[order, 0], spans[order, 1] - spans[order, 0] + 1  # each block is [sop] + span
    offset = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    source = np.repeat(starts, sizes) + offset
    last = max(len(text) - 1, 0)
    b_inputs = np.where(offset == 0, sop_id, text[np.clip(source - 1, 0, last)])
    b_targets = np.where(offset == np.repeat(sizes - 1, sizes), eop_id, text[np.minimum(source, last)])

    sep = len(part_a)
    inputs = np.concatenate((part_a, b_inputs))
    targets = np.concatenate((part_a, b_targets))
    loss = np.concatenate((np.zeros(sep), np.ones(len(b_inputs))))
    positions = np.concatenate((np.arange(sep), np.repeat(position[starts], sizes)))
    block_positions = np.concatenate((np.zeros(sep, dtype=np.int64), offset + 1))
    return inputs, targets, loss, positions, block_positions, sep


def layout_suffix(text: np.ndarray, span: int, *, gmask_id: int, sop_id: int, cls_id: int):
    """Upstream's generation layout for a document suffix of ``span`` tokens: Part A is
    ``text[:-span] + [gMASK]``, Part B is ``[sop] + text[-span:-1]`` predicting ``text[-span:]`` (no eop).
    Part B keeps the mask's position; block positions count from the mask (0) up."""
    d = len(text) - span
    inputs = np.concatenate((text[:d], [gmask_id, sop_id], text[d:-1]))
    targets = np.concatenate((text[:d], [gmask_id], text[d:]))
    loss = np.concatenate((np.zeros(d + 1), text[d:] != cls_id))  # no loss on a [CLS] opening a document
    positions = np.concatenate((np.arange(d + 1), np.full(span, d)))
    block_positions = np.concatenate((np.zeros(d, dtype=np.int64), np.arange(span + 1)))
    return inputs, targets, loss, positions, block_positions, d + 1


class BlockMasker:
    """Turns a window of token ids into one GLM training sample (see the module docstring).

    ``__call__(token_ids, index=None)`` returns numpy arrays: ``text`` [s] int64, ``target`` [s] int64,
    ``loss_mask`` [s] float32, ``attention_mask`` (0-d int64: ``sep``, the length of Part A) and
    ``position_id`` [2, s] int64 (positions, block positions). ``s`` is ``seq_length`` (default: the
    window's length). With ``index`` the sample's randomness comes from ``(seed, index)`` alone, otherwise
    from the masker's own generator seeded by ``seed``.
    """

    def __init__(self, tokenizer: GLMVocab, *, seed: int, seq_length: int | None = None,
                 avg_block_length: float = 3, max_block_length: int = 40, mask_ratio: float = 0.15,
                 bert_prob: float = 1.0, gap_sentence_prob: float = 0.0, gap_sentence_ratio: float = 0.15,
                 gpt_infill_prob: float = 0.5, gpt_min_ratio: float = 0.5, task_mask: bool = False,
                 shuffle_blocks: bool = True, block_mask_prob: float = 0.0, short_seq_prob: float = 0.0,
                 single_span_prob: float = 0.0, context_mask_ratio: float = 0.0,
                 block_position_encoding: bool = True, sentinel_base: int | None = None):
        for name, p in [("mask_ratio", mask_ratio), ("bert_prob", bert_prob), ("gpt_min_ratio", gpt_min_ratio),
                        ("gap_sentence_prob", gap_sentence_prob), ("gap_sentence_ratio", gap_sentence_ratio),
                        ("gpt_infill_prob", gpt_infill_prob), ("block_mask_prob", block_mask_prob),
                        ("short_seq_prob", short_seq_prob), ("single_span_prob", single_span_prob),
                        ("context_mask_ratio", context_mask_ratio)]:
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        if bert_prob + gap_sentence_prob > 1.0 + 1e-9:
            raise ValueError(f"bert_prob + gap_sentence_prob must be <= 1, got {bert_prob} + {gap_sentence_prob}")
        if avg_block_length <= 0 or max_block_length < 2:
            raise ValueError("avg_block_length must be > 0 and max_block_length >= 2")
        if seq_length is not None and seq_length < 4:
            raise ValueError(f"seq_length must be at least 4, got {seq_length}")
        needed = ["cls", "eos", "pad", "mask", "sop", "eop"] + (["gmask", "smask"] if task_mask else []) + (
            ["dblock"] if block_mask_prob or context_mask_ratio else [])
        if sentinel_base is not None and sentinel_base < tokenizer.num_tokens:
            raise ValueError(f"sentinel ids must follow the vocabulary's {tokenizer.num_tokens} tokens, "
                             f"got sentinel_base {sentinel_base}")
        missing = [name for name in needed if tokenizer.command_ids.get(name) is None]
        if missing:
            raise ValueError(f"{tokenizer.name} has no {', '.join(missing)} token(s), needed for blank infilling")
        self.tokenizer = tokenizer
        self.seed = seed
        self.seq_length = seq_length
        self.mask_ratio = mask_ratio
        self.bert_prob = bert_prob
        self.gap_sentence_prob = gap_sentence_prob
        self.gap_sentence_ratio = gap_sentence_ratio
        self.gpt_infill_prob = gpt_infill_prob
        self.gpt_min_ratio = gpt_min_ratio
        self.shuffle_blocks = shuffle_blocks
        self.block_mask_prob = block_mask_prob
        self.short_seq_prob = short_seq_prob
        self.single_span_prob = single_span_prob
        self.context_mask_ratio = context_mask_ratio
        self.block_position_encoding = block_position_encoding
        self.sentinel_base = sentinel_base
        self.span_lengths = np.arange(1, max_block_length)
        self.span_cdf = np.cumsum(_span_length_distribution(avg_block_length, max_block_length))
        self.span_cdf[-1] = 1.0  # rounding must not leave a draw past the last length
        ids = tokenizer.command_ids
        self.cls_id, self.eos_id, self.pad_id = ids["cls"], ids["eos"], ids["pad"]
        self.sop_id, self.eop_id, self.mask_id = ids["sop"], ids["eop"], ids["mask"]
        self.gmask_id = ids["gmask"] if task_mask else ids["mask"]
        self.smask_id = ids["smask"] if task_mask else ids["mask"]
        self.dblock_id = ids.get("dblock")
        self.rng = np.random.default_rng(seed)

    def __call__(self, token_ids: Sequence[int] | np.ndarray, index: int | None = None) -> dict[str, np.ndarray]:
        rng = self.rng if index is None else np.random.default_rng([self.seed, index])
        tokens = np.asarray(token_ids, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError(f"BlockMasker needs a non-empty 1-D window of token ids, got shape {tokens.shape}")
        length = self.seq_length or len(tokens)
        used = length
        if self.short_seq_prob and rng.random() < self.short_seq_prob:
            # a short sequence: upstream's random length in [32, length - 2], then padding
            used = int(rng.integers(min(32, length - 2), length - 1))
        if self.single_span_prob and rng.random() < self.single_span_prob:
            parts = self._token_spans(tokens, used, rng, single=True)
        else:
            draw = rng.random()
            if draw < self.bert_prob:
                parts = self._token_spans(tokens, used, rng)
            elif draw < self.bert_prob + self.gap_sentence_prob:
                parts = self._sentence_spans(tokens, used, rng)
            else:
                parts = self._generation(tokens, used, rng)
        if not self.block_position_encoding:  # upstream's --no-block-position: Part B all at block position 1
            parts = (*parts[:4], (parts[4] > 0).astype(np.int64), parts[5])
        return self._padded(*parts, length)

    # -- the three tasks ---------------------------------------------------------------------------------

    def _token_spans(self, tokens, length, rng, single=False):
        if single:  # upstream's --single-span-prob: one Poisson-length span
            lengths = self.span_lengths[np.searchsorted(self.span_cdf, rng.random(1))]
        else:
            lengths = self._draw_span_lengths(min(len(tokens), length), length, rng)
        text = tokens[: length - 2 * len(lengths)]
        spans = self._place_in_documents(text, lengths, rng)
        inputs, targets, loss, positions, block_positions, sep = self._blocks(
            text, spans, self.mask_id, rng, sentinel_masks=True)
        if self.block_mask_prob:  # upstream's --block-mask-prob: hide Part B inputs (not [sop]) behind [dBLOCK]
            hidden = (block_positions > 1) & (rng.random(len(inputs)) < self.block_mask_prob)
            inputs = np.where(hidden, self.dblock_id, inputs)
        if self.context_mask_ratio:
            # upstream counts the window's length (its samples grow with the spans; ours cut the text to fit)
            inputs = self._mask_context(inputs, spans, sep, min(len(tokens), length), rng)
        return inputs, targets, loss, positions, block_positions, sep

    def _mask_context(self, inputs, spans, sep, text_length, rng):
        """Upstream's --context-mask-ratio: ``int(ratio * text_length)`` Part A tokens, drawn from the first and
        last 3 tokens of each run of text between masks (not the start of the first run), become [dBLOCK]."""
        spans = spans[np.argsort(spans[:, 0])]
        removed = np.cumsum(spans[:, 1] - spans[:, 0] - 1) - (spans[:, 1] - spans[:, 0] - 1)
        masks = spans[:, 0] - removed  # each span's mask token in Part A
        edges = np.concatenate(([-1], masks, [sep]))
        candidates = set()
        for start, end in zip(edges[:-1] + 1, edges[1:]):
            if end <= start:
                continue
            if start != 0:
                candidates.update(range(start, min(end, start + _CONTEXT_RANGE)))
            candidates.update(range(max(start, end - _CONTEXT_RANGE), end))
        count = min(int(self.context_mask_ratio * text_length), len(candidates))
        if count:
            chosen = rng.choice(np.array(sorted(candidates)), size=count, replace=False)
            inputs = inputs.copy()
            inputs[chosen] = self.dblock_id
        return inputs


    def _sentence_spans(self, tokens, length, rng):
        """Shuffled whole sentences until ``gap_sentence_ratio`` of the text is covered (upstream takes at
        least one). Each span costs two more tokens, so the text is cut to ``length - 2 * spans`` and only
        sentences inside it count; more spans may then be needed, so this repeats until they fit."""
        window = tokens[:length]
        sentences = rng.permutation(self._sentences(window), axis=0)
        reserved = 0
        while True:
            text_length = min(len(window), length - 2 * reserved)
            inside = sentences[sentences[:, 1] <= text_length]
            covered = np.cumsum(inside[:, 1] - inside[:, 0])
            needed = int(self.gap_sentence_ratio * text_length)
            count = min(len(inside), int(np.searchsorted(covered, needed)) + 1)
            if count <= reserved:
                return self._blocks(window[:text_length], inside[:count], self.smask_id, rng)
            reserved = count

    def _generation(self, tokens, length, rng):
        window = tokens[:length]
        eos_at = np.flatnonzero(window == self.eos_id)
        several_docs = len(eos_at) > 0 and eos_at[0] != len(window) - 1
        if several_docs or rng.random() < self.gpt_infill_prob:
            return self._suffix(window[: length - 1], rng)
        text = window[: length - 2]
        span_length = self._generation_length(len(text), rng)
        spans = self._place_in_documents(text, np.array([span_length]), rng)
        return self._blocks(text, spans, self.gmask_id, rng)

    def _generation_length(self, text_length, rng) -> int:
        """Upstream's ``randint(int(gpt_min_ratio * n), n - 2)``, kept at least 1."""
        high = max(text_length - 2, 1)
        low = min(max(int(self.gpt_min_ratio * text_length), 1), high)
        return int(rng.integers(low, high + 1))

    def _suffix(self, text, rng):
        span = self._generation_length(len(text), rng)
        return layout_suffix(text, span, gmask_id=self.gmask_id, sop_id=self.sop_id, cls_id=self.cls_id)

    # -- span sampling -----------------------------------------------------------------------------------

    def _draw_span_lengths(self, available, length, rng) -> np.ndarray:
        """Span lengths drawn until ``mask_ratio`` of the text is covered, the text being what fits in
        ``length`` once each span has added its two tokens."""
        if int(self.mask_ratio * available) == 0:
            return np.empty(0, dtype=np.int64)
        # Each draw is >= 1, so this many always suffice.
        draws = self.span_lengths[np.searchsorted(self.span_cdf, rng.random(int(self.mask_ratio * length) + 2))]
        text_lengths = np.minimum(available, length - 2 * np.arange(1, len(draws) + 1))
        enough = np.cumsum(draws) >= np.floor(self.mask_ratio * text_lengths)
        return draws[: int(np.argmax(enough)) + 1]

    def _documents(self, text) -> np.ndarray:
        """``[k, 2]`` (start, end) runs of text between [CLS]/eos tokens; the window's last token is left
        out, as upstream leaves it out of the last document."""
        outside = np.ones(len(text) + 2, dtype=np.int8)  # padded with "outside" at both ends
        outside[1:-1] = (text == self.cls_id) | (text == self.eos_id)
        outside[-2] = 1
        edges = np.diff(outside)
        return np.stack([np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)], axis=1)

    def _place_in_documents(self, text, lengths, rng) -> np.ndarray:
        """Upstream's ``sample_span_in_document``: shuffled lengths go to documents from the shortest up,
        each taking ``mask_ratio`` of itself; the longest takes whatever still fits. Spans that fit nowhere
        are dropped (upstream drops the sample; here Part B just comes out shorter). Within a document the
        spans keep their order and are spread uniformly at random, at least one token apart."""
        lengths = rng.permutation(lengths)
        docs = self._documents(text)
        sizes = docs[:, 1] - docs[:, 0]
        by_size = np.argsort(sizes, kind="stable")
        docs, sizes = docs[by_size], sizes[by_size]
        counts, used = np.zeros(len(docs), dtype=np.int64), 0
        for i, size in enumerate(sizes.tolist()):
            covered = np.cumsum(lengths[used:])
            if i == len(docs) - 1:  # spans plus the gaps between them must fit
                counts[i] = np.searchsorted(covered + np.arange(len(covered)), size, side="right")
            else:
                counts[i] = np.searchsorted(covered, int(size * self.mask_ratio), side="right")
            used += counts[i]
        lengths = lengths[:used]
        doc = np.repeat(np.arange(len(docs)), counts)
        room = sizes - np.bincount(doc, weights=lengths, minlength=len(docs)).astype(np.int64) - counts + 1
        gaps = rng.integers(0, room[doc] + 1)
        gaps = gaps[np.lexsort((gaps, doc))]  # sorted within each document
        step = np.cumsum(lengths + 1) - (lengths + 1)  # tokens taken by earlier spans (and their gaps)
        first = np.cumsum(counts) - counts  # each document's first span
        starts = docs[doc, 0] + gaps + step - step[first[doc]]
        return np.stack([starts, starts + lengths], axis=1)

    def _sentences(self, text) -> np.ndarray:
        """``[k, 2]`` sentences: runs ending at a sentence-final token, never crossing [CLS]/eos."""
        boundary = (text == self.cls_id) | (text == self.eos_id)
        ends_sentence = self.tokenizer.sentence_end[text]
        after_break = np.concatenate(([True], (boundary | ends_sentence)[:-1]))
        before_boundary = np.concatenate((boundary[1:], [True]))
        starts = np.flatnonzero(~boundary & after_break)
        ends = np.flatnonzero(~boundary & (ends_sentence | before_boundary)) + 1
        return np.stack([starts, ends], axis=1)

    def _blocks(self, text, spans, mask_id, rng, sentinel_masks=False):
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        order = rng.permutation(len(spans)) if self.shuffle_blocks else np.argsort(spans[:, 0], kind="stable")
        parts = layout_blocks(text, spans, order, mask_id=mask_id, sop_id=self.sop_id, eop_id=self.eop_id)
        if self.sentinel_base is None:
            return parts
        return self._with_sentinels(*parts, sentinel_masks=sentinel_masks)

    def _with_sentinels(self, inputs, targets, loss, positions, block_positions, sep, sentinel_masks):
        """Block k >= 1 of Part B opens with ``sop<k>``; for token spans its Part A mask becomes ``[MASK<k>]``;
        Part B takes position ``seq_length`` (upstream's --sentinel-token)."""
        inputs, targets, positions = inputs.copy(), targets.copy(), positions.copy()
        opens = sep + np.flatnonzero(block_positions[sep:] == 1)
        k = np.arange(len(opens))
        later = k >= 1
        inputs[opens[later]] = self.sentinel_base + 2 * (k[later] - 1) + 1
        if sentinel_masks:
            masks = positions[opens[later]]
            inputs[masks] = targets[masks] = self.sentinel_base + 2 * (k[later] - 1)
        positions[sep:] = self.seq_length if self.seq_length else len(inputs)
        return inputs, targets, loss, positions, block_positions, sep

    def _padded(self, inputs, targets, loss, positions, block_positions, sep, length):
        n = len(inputs)
        if n > length:
            raise AssertionError(f"blank infilling produced {n} tokens for seq_length {length}")
        sample = {
            "text": np.full(length, self.pad_id, dtype=np.int64),
            "target": np.full(length, self.pad_id, dtype=np.int64),
            "loss_mask": np.zeros(length, dtype=np.float32),
            "attention_mask": np.array(sep, dtype=np.int64),
            "position_id": np.zeros((2, length), dtype=np.int64),
        }
        sample["text"][:n], sample["target"][:n], sample["loss_mask"][:n] = inputs, targets, loss
        sample["position_id"][0, :n], sample["position_id"][1, :n] = positions, block_positions
        return sample
