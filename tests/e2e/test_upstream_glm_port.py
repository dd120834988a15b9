"""glm_port's own commands against upstream's entry point for the same job, on the same weights and data
(GLM_UPSTREAM; skipped without one): glm-generate against generate_samples.py (greedy).

Upstream runs unmodified under glm-mock (its migration gives the same figures:
test_upstream_entrypoints.py); both load one checkpoint the migrated pretraining wrote.
"""

from __future__ import annotations

import pytest

import harness
from harness import entrypoints, verify
from harness import upstream as up


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("glm-port-vs-upstream")


@pytest.mark.timeout(1800)
def test_glm_generate_fills_the_blanks_generate_samples_fills(trees, workdir):
    original, ported = trees
    pretrained = entrypoints.pretrained_checkpoint(ported, verify.ported_env(), workdir,
                                                   900, iters=entrypoints.GLM_GENERATE_ITERS)  # fmt: skip
    checkpoint = entrypoints.silenced_checkpoint(pretrained, workdir)
    vocab = original / up.VOCAB_CACHE
    theirs = entrypoints.run_entry("generate", "original", original, harness.mock_env(""), workdir, checkpoint,
                                   workdir, 900)  # fmt: skip
    ours = entrypoints.run_glm_generate(checkpoint, vocab, verify.ported_env(), workdir, 900)
    comparison = entrypoints.EntryComparison("generate", theirs, ours, rtol=0)
    print(entrypoints.table(comparison))
    assert comparison.ok, entrypoints.table(comparison)
    texts = [value for what, value in theirs.figures.items if what == "generated"]
    assert len(texts) == len(entrypoints.GENERATE_PROMPTS)
    for text in texts:  # not trivially equal: every blank runs to --out-seq-length, and not one token repeated
        words = text.split()[1:]
        assert len(words) == 16 and len(set(words)) > 1, text
