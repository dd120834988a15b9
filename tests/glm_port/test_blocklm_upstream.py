"""BlockMasker against upstream's own ConstructBlockStrategy (GLM_UPSTREAM=/path/to/GLM; skipped without).

Both mask the same windows of the embedded corpus, one sample per call (upstream draws its task and its
short-sequence split per batch, so a batch of one makes its draws per sample, as ours are). The numbers
compared are what each knob promises: the share of text masked and the spans' count and length, the share of
Part B hidden by --block-mask-prob, the Part A tokens --context-mask-ratio hides, one span under
--single-span-prob, the text length under --short-seq-prob, the task mix, and the layouts --no-block-position,
--no-shuffle-block and --sentinel-token give. Upstream's module is loaded with stand-ins for what it imports
from its own tree (mpu's data-parallel rank, utils.print_rank_0) and for NumPy's removed ``np.long``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from glm_port.data import BlockMasker, get_tokenizer, load_corpus
from glm_port.data.batches import Windows

UPSTREAM = Path(os.environ.get("GLM_UPSTREAM", "/nonexistent"))
pytestmark = pytest.mark.skipif(not (UPSTREAM / "blocklm_utils.py").is_file(),
                                reason="needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM")
pytest.importorskip("scipy", reason="upstream's blocklm_utils needs scipy")

TOK = get_tokenizer()
SEQ = 128
SAMPLES = 300


class UpstreamTokenizer:
    """Our tokenizer in upstream's interface: ``get_command(name).Id``, ``IdToToken``, ``DecodeIds``."""

    def __init__(self, sentinel_base: int | None = None):
        self.ids = {"ENC": TOK.cls_id, "eos": TOK.eos_id, "pad": TOK.pad_id, "MASK": TOK.mask_id,
                    "sop": TOK.sop_id, "eop": TOK.eop_id, "gMASK": TOK.gmask_id, "sMASK": TOK.smask_id,
                    "dBLOCK": TOK.dblock_id}
        self.texts = TOK.text.token_texts()
        self.sentinel_base = sentinel_base

    def get_command(self, name):
        for prefix, offset in (("MASK", 0), ("sop", 1)):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                return types.SimpleNamespace(Id=self.sentinel_base + 2 * (int(name[len(prefix):]) - 1) + offset)
        return types.SimpleNamespace(Id=self.ids[name])

    def IdToToken(self, i):
        return self.texts[i] if i < len(self.texts) else ""

    def DecodeIds(self, ids):
        return TOK.decode(ids)


class SetSamplingRandom(random.Random):
    def sample(self, population, k, **kwargs):
        return super().sample(sorted(population) if isinstance(population, set) else population, k, **kwargs)


@pytest.fixture(scope="module")
def upstream_class():
    stubs = {"mpu": types.SimpleNamespace(get_data_parallel_rank=lambda: 0, get_data_parallel_world_size=lambda: 1),
             "utils": types.SimpleNamespace(print_rank_0=lambda *a, **k: None)}
    saved = {name: sys.modules.get(name) for name in stubs}
    had_long = hasattr(np, "long")
    sys.modules.update(stubs)
    np.long = np.int64  # removed from NumPy 1.24; upstream's module uses it
    try:
        spec = importlib.util.spec_from_file_location("_upstream_blocklm_utils", UPSTREAM / "blocklm_utils.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # Upstream samples --context-mask-ratio positions from a set, which Python >= 3.11 refuses; give its
        # generator the sorted set (what Python 3.10 did, up to the order of small ints' hashes).
        module.random = types.SimpleNamespace(Random=SetSamplingRandom, random=random.random)
        yield module.ConstructBlockStrategy
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
        if not had_long:
            del np.long


@pytest.fixture(scope="module")
def windows():
    corpus = load_corpus(None, TOK, progress=False)
    stream = Windows(corpus, SEQ, seed=3, cls_id=TOK.cls_id, eos_id=TOK.eos_id)
    return [stream[i] for i in range(SAMPLES)]


def upstream_samples(cls, windows, seq_length=SEQ, sentinel=False, **knobs):
    random.seed(0)  # upstream's --block-mask-prob draws from Python's global generator
    tokenizer = UpstreamTokenizer(TOK.num_tokens if sentinel else None)
    strategy = cls(types.SimpleNamespace(eod_token=TOK.eos_id), tokenizer, seq_length, sentinel_token=sentinel,
                   **knobs)
    out = []
    for window in windows:
        batch = strategy.construct_blocks([{"text": window.copy(), "loss_mask": np.ones(len(window), np.int64)}])
        for b in range(len(batch["text"])):  # --short-seq-prob splits one sample into several
            loss = batch["loss_mask"][b].numpy()
            n = int(np.flatnonzero(loss).max()) + 1 if loss.any() else int(batch["attention_mask"][b])
            out.append({"text": batch["text"][b].numpy()[:n], "loss_mask": batch["loss_mask"][b].numpy()[:n],
                        "position_id": batch["position_id"][b].numpy()[:, :n],
                        "sep": int(batch["attention_mask"][b])})
    return out


OURS_NAMES = {"average_block_length": "avg_block_length", "shuffle_blocks": "shuffle_blocks",
              "block_position_encoding": "block_position_encoding"}


def our_samples(windows, seq_length=SEQ, sentinel=False, **knobs):
    kwargs = {OURS_NAMES.get(k, k): v for k, v in knobs.items()}
    masker = BlockMasker(TOK, seed=0, seq_length=seq_length, sentinel_base=TOK.num_tokens if sentinel else None,
                         **kwargs)
    out = []
    for i, window in enumerate(windows):
        s = masker(window, index=i)
        n = int(np.flatnonzero(s["loss_mask"]).max()) + 1 if s["loss_mask"].any() else int(s["attention_mask"])
        out.append({"text": s["text"][:n], "loss_mask": s["loss_mask"][:n], "position_id": s["position_id"][:, :n],
                    "sep": int(s["attention_mask"])})
    return out


def describe(samples):
    """Per-sample numbers both implementations promise, averaged."""
    rows = []
    for s in samples:
        sep, text, block = s["sep"], s["text"], s["position_id"][1]
        part_b = np.arange(len(text)) >= sep
        opens = part_b & (block == 1)
        spans = int(opens.sum())
        masked = int(s["loss_mask"].sum()) - spans
        length = sep - spans + masked  # the text before masking
        first_part_a = text[:sep]
        rows.append(dict(
            spans=spans, masked_share=masked / max(length, 1), span_length=masked / spans if spans else np.nan,
            length=length,
            part_b_hidden=float(np.mean(text[part_b & (block > 1)] == TOK.dblock_id)) if (part_b & (block > 1)).any()
            else np.nan,
            part_a_hidden=int((first_part_a == TOK.dblock_id).sum()),
            task=("gmask" if (first_part_a == TOK.gmask_id).any() else
                  "smask" if (first_part_a == TOK.smask_id).any() else "mask"),
        ))
    summary = {key: float(np.nanmean([r[key] for r in rows])) for key in rows[0] if key != "task"}
    for task in ("mask", "smask", "gmask"):
        summary[f"share_{task}"] = float(np.mean([r["task"] == task for r in rows]))
    return summary


def assert_close(ours, theirs, keys, rel=0.12, abs_=0.04):
    for key in keys:
        assert ours[key] == pytest.approx(theirs[key], rel=rel, abs=abs_), (key, ours[key], theirs[key])


def test_token_spans_match_upstream(upstream_class, windows):
    ours, theirs = describe(our_samples(windows)), describe(upstream_samples(upstream_class, windows))
    assert_close(ours, theirs, ["masked_share", "span_length", "spans"])


def test_block_mask_prob_matches_upstream(upstream_class, windows):
    knobs = dict(block_mask_prob=0.3)
    ours, theirs = describe(our_samples(windows, **knobs)), describe(upstream_samples(upstream_class, windows, **knobs))
    assert 0.2 < theirs["part_b_hidden"] < 0.4
    assert_close(ours, theirs, ["part_b_hidden", "masked_share"])


def test_context_mask_ratio_matches_upstream(upstream_class, windows):
    knobs = dict(context_mask_ratio=0.05)
    ours, theirs = describe(our_samples(windows, **knobs)), describe(upstream_samples(upstream_class, windows, **knobs))
    assert theirs["part_a_hidden"] > 3
    assert_close(ours, theirs, ["part_a_hidden"], rel=0.1, abs_=0.5)


def test_single_span_prob_matches_upstream(upstream_class, windows):
    knobs = dict(single_span_prob=1.0)
    ours, theirs = describe(our_samples(windows, **knobs)), describe(upstream_samples(upstream_class, windows, **knobs))
    assert ours["spans"] == theirs["spans"] == 1.0
    assert_close(ours, theirs, ["span_length"])


def test_short_seq_prob_matches_upstream(upstream_class, windows):
    """Upstream cuts several pieces of one random length in [32, seq_length - 2], ends moved to sentence
    ends; ours takes the window's prefix of such a length: the lengths' mean agrees."""
    knobs = dict(short_seq_prob=1.0)
    ours, theirs = describe(our_samples(windows, **knobs)), describe(upstream_samples(upstream_class, windows, **knobs))
    assert theirs["length"] < 0.8 * SEQ
    assert_close(ours, theirs, ["length", "masked_share"], rel=0.15)


def test_task_mix_matches_upstream(upstream_class, windows):
    knobs = dict(bert_prob=0.4, gap_sentence_prob=0.3, gpt_min_ratio=0.25, task_mask=True)
    ours, theirs = describe(our_samples(windows, **knobs)), describe(upstream_samples(upstream_class, windows, **knobs))
    assert_close(ours, theirs, ["share_mask", "share_smask", "share_gmask"], abs_=0.08)


def test_no_block_position_matches_upstream(upstream_class, windows):
    knobs = dict(block_position_encoding=False)
    for samples in (our_samples(windows[:50], **knobs), upstream_samples(upstream_class, windows[:50], **knobs)):
        for s in samples:
            block = s["position_id"][1]
            assert set(block[: s["sep"]].tolist()) <= {0} and set(block[s["sep"]:].tolist()) == {1}


def test_no_shuffle_block_matches_upstream(upstream_class, windows):
    """Unshuffled, Part B's blocks follow the text: their positions increase, in both."""
    knobs = dict(shuffle_blocks=False)
    for samples in (our_samples(windows[:50], **knobs), upstream_samples(upstream_class, windows[:50], **knobs)):
        for s in samples:
            sep, position, block = s["sep"], s["position_id"][0], s["position_id"][1]
            opens = position[sep:][block[sep:] == 1]
            assert np.all(np.diff(opens) > 0)


def test_sentinel_tokens_match_upstream(upstream_class, windows):
    """Each block opens with its own sop<k> (the first with sop), [MASK<k>] stands for it in Part A, and
    Part B sits at position seq_length: the same ids in the same places, in both."""
    for samples in (our_samples(windows[:50], sentinel=True), upstream_samples(upstream_class, windows[:50], sentinel=True)):
        for s in samples:
            sep, text, position, block = s["sep"], s["text"], s["position_id"][0], s["position_id"][1]
            opens = text[sep:][block[sep:] == 1]
            k = np.arange(1, len(opens))
            assert opens[0] == TOK.sop_id and opens[1:].tolist() == (TOK.num_tokens + 2 * (k - 1) + 1).tolist()
            assert np.all(position[sep:] == SEQ)
            masks = np.sort(text[:sep][text[:sep] >= TOK.num_tokens])
            assert masks.tolist() == sorted((TOK.num_tokens + 2 * (k - 1)).tolist())
