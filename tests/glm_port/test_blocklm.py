"""Blank infilling: hand-worked layouts, invariants of every sample, and the span statistics upstream's
knobs promise (Poisson span lengths, mask ratio, generation length, task mix)."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glm_port.data import BlockMasker, get_tokenizer
from glm_port.data.blocklm import layout_blocks, layout_suffix

TOK = get_tokenizer()
CLS, EOS, MASK, SOP, EOP = TOK.cls_id, TOK.eos_id, TOK.mask_id, TOK.sop_id, TOK.eop_id
GMASK, SMASK = TOK.gmask_id, TOK.smask_id
WORDS = np.arange(100, 200)  # ordinary word ids of the default vocabulary, none a command or punctuation


def window(rng, length, docs=1):
    """[CLS] doc [eos] [CLS] doc ... of random word ids, cut to ``length``."""
    parts = []
    for size in rng.multinomial(length, [1 / docs] * docs):
        parts += [[CLS], rng.choice(WORDS, size=size), [EOS]]
    return np.concatenate(parts)[:length].astype(np.int64)


def test_layout_blocks_hand_worked():
    #        CLS  a   b   c   d   e   f   g
    text = np.array([2, 10, 11, 12, 13, 14, 15, 16])
    inputs, targets, loss, pos, block, sep = layout_blocks(
        text, np.array([[2, 4], [6, 7]]), order=np.array([1, 0]), mask_id=4, sop_id=90, eop_id=91)
    assert sep == 7
    assert inputs.tolist() == [2, 10, 4, 13, 14, 4, 16, 90, 15, 90, 11, 12]
    assert targets.tolist() == [2, 10, 4, 13, 14, 4, 16, 15, 91, 11, 12, 91]
    assert loss.tolist() == [0] * 7 + [1] * 5
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 5, 5, 2, 2, 2]
    assert block.tolist() == [0] * 7 + [1, 2, 1, 2, 3]


def test_layout_blocks_adjacent_spans_and_no_spans():
    text = np.array([2, 10, 11, 12, 13])
    inputs, targets, _, pos, block, sep = layout_blocks(
        text, np.array([[1, 3], [3, 5]]), order=np.array([0, 1]), mask_id=4, sop_id=90, eop_id=91)
    assert sep == 3 and inputs.tolist() == [2, 4, 4, 90, 10, 11, 90, 12, 13]
    assert targets.tolist() == [2, 4, 4, 10, 11, 91, 12, 13, 91]
    assert pos.tolist() == [0, 1, 2, 1, 1, 1, 2, 2, 2] and block.tolist() == [0, 0, 0, 1, 2, 3, 1, 2, 3]
    inputs, targets, loss, pos, block, sep = layout_blocks(
        text, np.empty((0, 2)), order=np.empty(0), mask_id=4, sop_id=90, eop_id=91)
    assert sep == 5 and inputs.tolist() == text.tolist() == targets.tolist() and loss.sum() == 0


def test_layout_suffix_hand_worked():
    text = np.array([2, 10, 11, 12, 13, 14])
    inputs, targets, loss, pos, block, sep = layout_suffix(text, 3, gmask_id=5, sop_id=90, cls_id=2)
    assert sep == 4
    assert inputs.tolist() == [2, 10, 11, 5, 90, 12, 13]
    assert targets.tolist() == [2, 10, 11, 5, 12, 13, 14]
    assert loss.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert pos.tolist() == [0, 1, 2, 3, 3, 3, 3]
    assert block.tolist() == [0, 0, 0, 0, 1, 2, 3]


@st.composite
def text_and_spans(draw):
    """A text of word ids and non-overlapping (start, end) spans in it, with a block order."""
    n = draw(st.integers(1, 60))
    text = np.array(draw(st.lists(st.integers(100, 199), min_size=n, max_size=n)))
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=12)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]
    order = draw(st.permutations(range(len(spans))))
    return text, np.array(spans, dtype=np.int64).reshape(-1, 2), np.array(order, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(text_and_spans())
def test_layout_blocks_is_invertible(case):
    text, spans, order = case
    inputs, targets, loss, pos, block, sep = layout_blocks(text, spans, order, mask_id=MASK, sop_id=SOP,
                                                           eop_id=EOP)
    n = len(inputs)
    assert n == len(text) + 2 * len(spans) == len(targets) == len(loss) == len(pos) == len(block)
    assert sep == len(text) - int((spans[:, 1] - spans[:, 0]).sum()) + len(spans)
    sample = {"text": inputs, "target": targets, "loss_mask": loss.astype(np.float32),
              "attention_mask": np.array(sep), "position_id": np.stack([pos, block])}
    original, found, masks = reconstruct(sample)
    assert original.tolist() == text.tolist()
    assert found == sorted(map(tuple, spans.tolist())) and set(masks) <= {MASK}
    blocks_in_order = [int(pos[i]) for i in range(sep, n) if block[i] == 1]
    mask_positions = np.flatnonzero(inputs[:sep] == MASK)
    assert blocks_in_order == mask_positions[np.argsort(np.argsort(spans[:, 0]))][order].tolist()


def reconstruct(sample):
    """Undo blank infilling: put each Part B block back at its mask; returns (text, spans, mask ids)."""
    text, target = sample["text"], sample["target"]
    sep = int(sample["attention_mask"])
    pos, block = sample["position_id"]
    end = sep + int((block[sep:] > 0).sum())
    assert sample["loss_mask"][:sep].sum() == 0 and (sample["loss_mask"][sep:end] <= 1).all()
    part_a = list(text[:sep])
    fills, masks = {}, []
    starts = [i for i in range(sep, end) if block[i] == 1]
    for s, e in zip(starts, starts[1:] + [end]):
        assert text[s] == SOP and (pos[s:e] == pos[s]).all()
        assert block[s:e].tolist() == list(range(1, e - s + 1))
        assert target[s:e - 1].tolist() == text[s + 1:e].tolist()  # teacher forcing within a block
        has_eop = target[e - 1] == EOP
        fills[int(pos[s])] = list(target[s:e - 1]) if has_eop else list(target[s:e])
        masks.append(int(part_a[pos[s]]))
    out, spans = [], []
    for p, t in enumerate(part_a):
        if p in fills:
            spans.append((len(out), len(out) + len(fills[p])))
            out += fills[p]
        else:
            out.append(t)
    return np.array(out), spans, masks


@pytest.mark.parametrize("mode", [dict(bert_prob=1.0), dict(bert_prob=0.0, gap_sentence_prob=1.0),
                                  dict(bert_prob=0.0, gpt_infill_prob=1.0), dict(bert_prob=0.0, gpt_infill_prob=0.0)])
@pytest.mark.parametrize("docs", [1, 3])
def test_every_sample_is_a_consistent_blank_infilling(mode, docs):
    rng = np.random.default_rng(0)
    masker = BlockMasker(TOK, seed=3, seq_length=96, task_mask=True, **mode)
    corpus = TOK.encode(" ".join(["ada met finn near the mill."] * 20))
    padding = []
    for i in range(60):
        tokens = window(rng, 96, docs) if mode.get("gap_sentence_prob", 0) == 0 else \
            np.concatenate(([CLS], corpus))[: 96 + i % 7]
        sample = masker(tokens, index=i)
        assert {k: v.shape for k, v in sample.items()} == {
            "text": (96,), "target": (96,), "loss_mask": (96,), "attention_mask": (), "position_id": (2, 96)}
        assert sample["text"].dtype == np.int64 and sample["loss_mask"].dtype == np.float32
        original, spans, masks = reconstruct(sample)
        assert original.tolist() == tokens[: len(original)].tolist()
        padding.append(96 - int(sample["attention_mask"]) - int((sample["position_id"][1] > 0).sum()))
        assert (sample["text"][96 - padding[-1]:] == TOK.pad_id).all()
        assert set(masks) <= {MASK, SMASK, GMASK}
        for s, e in spans:
            if masks[0] != GMASK or mode.get("gpt_infill_prob") == 0.0 and docs == 1:
                assert not np.isin(original[s:e], [CLS, EOS]).any(), "spans stay inside one document"
    assert np.mean(padding) < 2.5, "the window should fill the sample"


def test_task_mask_off_uses_plain_mask_everywhere():
    rng = np.random.default_rng(1)
    for mode in (dict(bert_prob=0.0, gap_sentence_prob=1.0), dict(bert_prob=0.0)):
        masker = BlockMasker(TOK, seed=0, task_mask=False, **mode)
        tokens = np.concatenate(([CLS], TOK.encode("ada is here. finn is there. " * 5)))
        sample = masker(tokens, index=int(rng.integers(1000)))
        sep = int(sample["attention_mask"])
        assert MASK in sample["text"][:sep].tolist()
        assert not np.isin(sample["text"], [GMASK, SMASK]).any()


def test_token_span_statistics():
    """Pooled span lengths follow Poisson(3) on 1..39 (renormalised); each sample masks
    int(0.15 * text) tokens or slightly more; spans never touch [CLS]/eos."""
    masker = BlockMasker(TOK, seed=7, seq_length=256, avg_block_length=3, mask_ratio=0.15)
    rng = np.random.default_rng(2)
    lengths, ratios = [], []
    for i in range(600):
        sample = masker(window(rng, 256, docs=1 + i % 3), index=i)
        original, spans, _ = reconstruct(sample)
        lengths += [e - s for s, e in spans]
        ratios.append(sum(e - s for s, e in spans) / len(original))
        assert len(original) + 2 * len(spans) <= 256
    pmf = np.array([math.exp(-3) * 3 ** k / math.factorial(k) for k in range(1, 40)])
    pmf /= pmf.sum()
    lengths = np.array(lengths)
    assert abs(lengths.mean() - (pmf * np.arange(1, 40)).sum()) < 0.1  # 3.157
    counts = np.bincount(lengths, minlength=40)[1:40]
    expected = pmf * len(lengths)
    chi2 = ((counts[:7] - expected[:7]) ** 2 / expected[:7]).sum()
    assert chi2 < 25, (counts[:7], expected[:7].round())  # 7 bins: p ~ 1e-3
    ratios = np.array(ratios)
    assert ratios.min() >= 0.13 and 0.15 <= ratios.mean() <= 0.175


def test_avg_block_length_moves_the_mean():
    masker = BlockMasker(TOK, seed=0, seq_length=512, avg_block_length=6)
    rng = np.random.default_rng(3)
    lengths = [e - s for i in range(100) for s, e in reconstruct(masker(window(rng, 512), index=i))[1]]
    assert 5.7 < np.mean(lengths) < 6.4


def test_generation_statistics():
    """[gMASK] takes a suffix (or one in-document span) of gpt_min_ratio..all of the text."""
    masker = BlockMasker(TOK, seed=1, seq_length=200, bert_prob=0.0, gpt_min_ratio=0.25, task_mask=True)
    rng = np.random.default_rng(4)
    fractions = []
    for i in range(400):
        original, spans, masks = reconstruct(masker(window(rng, 200), index=i))
        assert masks == [GMASK] and len(spans) == 1
        s, e = spans[0]
        fractions.append((e - s) / len(original))
    fractions = np.array(fractions)
    assert fractions.min() >= 0.24 and fractions.max() <= 1.0
    assert abs(fractions.mean() - 0.62) < 0.03  # uniform on [0.25, 1 - 2/len]


def test_sentence_spans_are_whole_sentences():
    text = "ada is the baker. finn met cora near the mill! why? nobody knows; the end."
    tokens = np.concatenate(([CLS], TOK.encode(" ".join([text] * 6))))
    sentence_end = TOK.sentence_end
    masker = BlockMasker(TOK, seed=2, seq_length=len(tokens) + 8, bert_prob=0.0, gap_sentence_prob=1.0,
                         task_mask=True)
    for i in range(100):
        original, spans, masks = reconstruct(masker(tokens, index=i))
        assert set(masks) == {SMASK}
        for s, e in spans:
            assert sentence_end[original[e - 1]] or e == len(original)
            assert s == 1 or sentence_end[original[s - 1]]
        assert sum(e - s for s, e in spans) >= int(0.15 * len(original))


def test_task_mix_follows_the_probabilities():
    masker = BlockMasker(TOK, seed=5, seq_length=64, bert_prob=0.5, gap_sentence_prob=0.3, task_mask=True)
    tokens = np.concatenate(([CLS], TOK.encode("ada is here. finn is there. cora is away. " * 4)))
    kinds = []
    for i in range(1000):
        sample = masker(tokens, index=i)
        sep = int(sample["attention_mask"])
        kinds.append(next(m for m in (GMASK, SMASK, MASK) if m in sample["text"][:sep]))
    share = {m: kinds.count(m) / len(kinds) for m in (MASK, SMASK, GMASK)}
    assert abs(share[MASK] - 0.5) < 0.05 and abs(share[SMASK] - 0.3) < 0.05 and abs(share[GMASK] - 0.2) < 0.05


def test_determinism():
    rng = np.random.default_rng(6)
    tokens = window(rng, 128, docs=2)
    a = BlockMasker(TOK, seed=11, bert_prob=0.4, gap_sentence_prob=0.3)
    b = BlockMasker(TOK, seed=11, bert_prob=0.4, gap_sentence_prob=0.3)
    for i in range(20):
        sa, sb = a(tokens, index=i), b(tokens, index=i)
        assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not np.array_equal(a(tokens, index=1)["text"], a(tokens, index=2)["text"])
    stream_a, stream_b = [a(tokens)["text"] for _ in range(5)], [b(tokens)["text"] for _ in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(stream_a, stream_b))
    assert not np.array_equal(stream_a[0], stream_a[1])


def test_short_window_is_padded():
    sample = BlockMasker(TOK, seed=0, seq_length=32)(np.concatenate(([CLS], WORDS[:20], [EOS])), index=0)
    original, spans, _ = reconstruct(sample)
    assert len(original) == 22 and len(spans) >= 1  # it all fits: nothing is cut
    used = 22 + 2 * len(spans)
    assert int((sample["position_id"][1] > 0).sum()) + int(sample["attention_mask"]) == used
    assert (sample["text"][used:] == TOK.pad_id).all() and sample["loss_mask"][used:].sum() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="bert_prob \\+ gap_sentence_prob"):
        BlockMasker(TOK, seed=0, bert_prob=0.8, gap_sentence_prob=0.3)
    with pytest.raises(ValueError, match="mask_ratio must be in"):
        BlockMasker(TOK, seed=0, mask_ratio=1.5)
    with pytest.raises(ValueError, match="non-empty 1-D window"):
        BlockMasker(TOK, seed=0)([])


VOCAB = Path(__file__).resolve().parents[2] / ".." / "shared" / "vocab"


@pytest.mark.skipif(not VOCAB.is_dir(), reason=f"real vocab files not found at {VOCAB}")
@pytest.mark.parametrize("kind", ["GPT2BPETokenizer", "ChineseSPTokenizer", "BertWordPieceTokenizer"])
def test_real_vocabularies_mask_consistently(kind):
    tok = get_tokenizer(kind, VOCAB)
    text = ("\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6211\u4eec\u53bb\u516c\u56ed\u5427\uff01"
            if kind == "ChineseSPTokenizer" else "The weather is fine today. Let us walk to the park! ")
    tokens = np.concatenate(([tok.cls_id], tok.encode(text * 12), [tok.eos_id]))
    masker = BlockMasker(tok, seed=0, seq_length=80, bert_prob=0.4, gap_sentence_prob=0.4, task_mask=True)
    seen = set()
    for i in range(40):
        sample = masker(tokens, index=i)
        sep = int(sample["attention_mask"])
        seen |= set(sample["text"][:sep].tolist()) & {tok.mask_id, tok.smask_id, tok.gmask_id}
        assert sample["text"].max() < tok.num_tokens and sample["loss_mask"].sum() > 0
        assert sample["text"][sep] == tok.sop_id
    assert seen == {tok.mask_id, tok.smask_id, tok.gmask_id}


def test_block_mask_hides_part_b_inputs_only():
    masked = BlockMasker(TOK, seed=0, seq_length=256, block_mask_prob=0.3)
    plain = BlockMasker(TOK, seed=0, seq_length=256)  # the same draws up to the hiding
    rng = np.random.default_rng(8)
    hidden = candidates = 0
    for i in range(100):
        tokens = window(rng, 256)
        sample, reference = masked(tokens, index=i), plain(tokens, index=i)
        for key in ("target", "loss_mask", "attention_mask", "position_id"):
            assert np.array_equal(sample[key], reference[key])
        changed = sample["text"] != reference["text"]
        assert (sample["text"][changed] == TOK.dblock_id).all()
        assert (sample["position_id"][1][changed] > 1).all(), "only Part B inputs after [sop]"
        hidden += int(changed.sum())
        candidates += int((sample["position_id"][1] > 1).sum())
    assert abs(hidden / candidates - 0.3) < 0.03


def test_single_spans_and_short_sequences():
    rng = np.random.default_rng(9)
    single = BlockMasker(TOK, seed=0, seq_length=128, single_span_prob=0.4)
    counts = [len(reconstruct(single(window(rng, 128), index=i))[1]) for i in range(300)]
    assert abs(np.mean(np.array(counts) == 1) - 0.4) < 0.07 and max(counts) > 3

    short = BlockMasker(TOK, seed=0, seq_length=128, short_seq_prob=0.5, bert_prob=0.5, gap_sentence_prob=0.2)
    used = []
    for i in range(300):
        sample = short(window(rng, 128), index=i)
        used.append(int(sample["attention_mask"]) + int((sample["position_id"][1] > 0).sum()))
    used = np.array(used)
    assert abs(np.mean(used < 120) - 0.5) < 0.08 and used.min() >= 32


@settings(max_examples=200, deadline=None)
@given(seq_length=st.integers(4, 160), docs=st.integers(1, 4), fill=st.floats(0.05, 1.5),
       bert=st.floats(0, 1), sentence=st.floats(0, 1), short=st.sampled_from([0.0, 0.5]),
       single=st.sampled_from([0.0, 0.3]), ratio=st.floats(0.05, 0.6), seed=st.integers(0, 2**31))
def test_any_window_and_knobs_give_a_consistent_sample(seq_length, docs, fill, bert, sentence, short, single,
                                                       ratio, seed):
    rng = np.random.default_rng(seed)
    size = max(1, int(seq_length * fill))
    words = np.append(WORDS, TOK.encode(". ?"))  # some tokens end sentences
    tokens = np.concatenate([[CLS, *rng.choice(words, size // docs + 1), EOS] for _ in range(docs)])[:size]
    masker = BlockMasker(TOK, seed=seed, seq_length=seq_length, bert_prob=bert, mask_ratio=ratio,
                         gap_sentence_prob=(1 - bert) * sentence, short_seq_prob=short, single_span_prob=single,
                         task_mask=True)
    sample = masker(tokens, index=0)
    assert sample["text"].shape == (seq_length,) and sample["position_id"].shape == (2, seq_length)
    original, spans, masks = reconstruct(sample)
    assert original.tolist() == tokens[: len(original)].tolist()
    used = int(sample["attention_mask"]) + int((sample["position_id"][1] > 0).sum())
    assert (sample["text"][used:] == TOK.pad_id).all() and sample["loss_mask"][used:].sum() == 0
