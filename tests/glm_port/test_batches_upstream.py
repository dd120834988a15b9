"""Document-level data flags against upstream's own code (GLM_UPSTREAM=/path/to/GLM; skipped without):
``--split`` against ``data_utils.datasets.split_ds``, ``--non-sentence-start`` and ``--sample-one-document``
against ``BlockDataset``.

The corpus is synthetic: every token id occurs once, so where a sample starts in its document can be read
off its first token; every 7th token ends a sentence. Upstream's module is loaded with stand-ins for the
imports these classes do not use (pandas, nltk, its lazy loader, utils.print_rank_0).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from glm_port.data.batches import Windows, split_documents
from glm_port.data.corpus import TokenizedCorpus

UPSTREAM = Path(os.environ.get("GLM_UPSTREAM", "/nonexistent"))
pytestmark = pytest.mark.skipif(not (UPSTREAM / "data_utils" / "datasets.py").is_file(),
                                reason="needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM")

EOS, CLS, FIRST_WORD = 0, 1, 10
SEQ = 64


def synthetic_documents(lengths):
    ids, docs = FIRST_WORD, []
    for n in lengths:
        docs.append(list(range(ids, ids + n)))
        ids += n
    sentence_end = np.zeros(ids, dtype=bool)
    sentence_end[FIRST_WORD + 6::7] = True
    return docs, sentence_end


class UpstreamTokenizer:
    def __init__(self, sentence_end):
        self.sentence_end = sentence_end

    def get_command(self, name):
        return types.SimpleNamespace(Id={"ENC": CLS, "eos": EOS, "pad": EOS}[name])

    def IdToToken(self, i):
        return "." if i < len(self.sentence_end) and self.sentence_end[i] else "w"


@pytest.fixture(scope="module")
def datasets():
    names = ["pandas", "nltk", "utils", "_glmup_data_utils", "_glmup_data_utils.lazy_loader"]
    saved = {name: sys.modules.get(name) for name in names}
    package = types.ModuleType("_glmup_data_utils")
    package.__path__ = [str(UPSTREAM / "data_utils")]
    sys.modules.update({
        "pandas": types.ModuleType("pandas"), "nltk": types.SimpleNamespace(tokenize=None),
        "utils": types.SimpleNamespace(print_rank_0=lambda *a, **k: None), "_glmup_data_utils": package,
        "_glmup_data_utils.lazy_loader": types.SimpleNamespace(LazyLoader=object, exists_lazy=None),
    })
    try:
        spec = importlib.util.spec_from_file_location("_glmup_data_utils.datasets", UPSTREAM / "data_utils" / "datasets.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


@pytest.mark.parametrize("n, shares", [(7, [0.5, 0.3, 0.2]), (1000, [949 / 1000, 50 / 1000, 1 / 1000]),
                                       (520, [1000 / 1002, 1 / 1002, 1 / 1002]), (33, [0.9, 0.1, 0.0])])
def test_split_is_upstreams_split_ds(datasets, n, shares):
    theirs = datasets.split_ds(list(range(n)), list(shares), shuffle=True)
    ours = split_documents(n, shares)
    for their_part, our_part in zip(theirs, ours):
        if their_part is None:
            assert our_part is None
        else:
            assert list(their_part.split_inds) == our_part.tolist()


def upstream_block_samples(datasets, docs, sentence_end, count, **kwargs):
    ds = [{"text": d, "tokens": d, "loss_masks": [1] * len(d)} for d in docs]
    block = datasets.BlockDataset(ds, UpstreamTokenizer(sentence_end), max_seq_len=SEQ, **kwargs)
    return [block[i]["text"] for i in range(count)]


def our_windows(docs, sentence_end, count, **kwargs):
    lengths = [len(d) for d in docs]
    corpus = TokenizedCorpus(np.concatenate(docs).astype(np.int32), np.concatenate(([0], np.cumsum(lengths))))
    windows = Windows(corpus, SEQ, 0, CLS, EOS, sentence_end=sentence_end, **kwargs)
    return [windows[i] for i in range(count)]


def sentence_start_share(samples, sentence_end, doc_start):
    """Of the samples opening inside a document, the share whose first token follows a sentence end."""
    starts = [int(s[1]) for s in samples if len(s) > 1 and s[1] >= FIRST_WORD and s[1] not in doc_start]
    return np.mean([sentence_end[t - 1] for t in starts]), len(starts)


@pytest.mark.parametrize("non_sentence_start", [0.0, 0.5, 1.0])
def test_non_sentence_start_matches_block_dataset(datasets, non_sentence_start):
    docs, sentence_end = synthetic_documents([150 + 37 * (i % 9) for i in range(120)])
    doc_start = {d[0] for d in docs}
    theirs, n_theirs = sentence_start_share(
        upstream_block_samples(datasets, docs, sentence_end, 400, non_sentence_start=non_sentence_start),
        sentence_end, doc_start)
    ours, n_ours = sentence_start_share(
        our_windows(docs, sentence_end, 400, non_sentence_start=non_sentence_start), sentence_end, doc_start)
    assert n_theirs > 200 and n_ours > 200
    assert ours == pytest.approx(theirs, abs=0.08)


def test_sample_one_document_matches_block_dataset(datasets):
    docs, sentence_end = synthetic_documents([20 + 11 * (i % 13) for i in range(200)])
    for samples in (upstream_block_samples(datasets, docs, sentence_end, 300, sample_across_doc=False),
                    our_windows(docs, sentence_end, 300, one_document=True)):
        assert all(int(np.sum(np.asarray(s) == CLS)) == 1 and s[0] == CLS for s in samples)
    across = upstream_block_samples(datasets, docs, sentence_end, 300)
    assert np.mean([np.sum(np.asarray(s) == CLS) > 1 for s in across]) > 0.05  # the default packs short ones
