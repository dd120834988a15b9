"""glm_port's own commands against upstream's entry point for the same job, on the same weights and data
(GLM_UPSTREAM; skipped without one): glm-generate against generate_samples.py (greedy); glm_port's model
and training loss against finetune_glm.py's seq2seq loss on its first batch.

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


@pytest.fixture(scope="module")
def pretrained(trees, workdir):
    """The tiny model trained 200 iterations by the migrated pretrain_glm.py (the 10 of the other
    comparisons leave it near uniform: its losses hardly depend on the attention)."""
    return entrypoints.pretrained_checkpoint(trees[1], verify.ported_env(), workdir, 900,
                                             iters=entrypoints.GLM_GENERATE_ITERS)  # fmt: skip


@pytest.mark.timeout(1800)
def test_glm_generate_fills_the_blanks_generate_samples_fills(trees, workdir, pretrained):
    original, ported = trees
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


@pytest.mark.timeout(1800)
def test_glm_ports_seq2seq_loss_on_upstreams_first_batch_is_finetune_glms(trees, workdir, pretrained):
    """finetune_glm.py --task cnn_dm_original (under glm-mock), its first step on the whole training split
    in one batch, against glm_port's model and training loss (glm_port.training.lm_loss, glm-finetune's)
    on that batch laid out as upstream lays it out (harness.entrypoints.upstream_seq2seq_sample): glm-finetune's
    own layout is another one (docs/upstream.md), so its command cannot be given the same batch."""
    import numpy as np
    import torch

    from glm_port.models.glm import generation
    from glm_port.models.glm.hf import GLMForConditionalGeneration
    from glm_port.training import Encoded, collate, lm_loss

    original = trees[0]
    data = entrypoints.write_data(workdir / "data")
    theirs = entrypoints.seq2seq_first_step("original", original, harness.mock_env(""), data, pretrained, workdir, 900)
    assert theirs.code == 0, theirs.cause
    losses = [float(v) for _, v in theirs.figures.items]
    assert len(losses) == 1, losses  # one step: the whole split in one batch

    entrypoints.write_config(pretrained, 30592)  # the heads (upstream ignores the file)
    vocab = original / up.VOCAB_CACHE
    tokens = generation.load_tokenizer(pretrained, "BertWordPieceTokenizer", vocab).vocab
    ids = {"cls": tokens.cls_id, "mask": tokens.mask_id, "pad": tokens.pad_id, "sop": tokens.sop_id,
           "eop": tokens.eop_id}  # fmt: skip
    read = [(data / "s2s" / f"train.{k}").read_text(encoding="utf-8").splitlines() for k in ("source", "target")]
    samples = []
    for source, target in zip(*read):
        raw = entrypoints.upstream_seq2seq_sample(tokens.encode(" Content:") + tokens.encode(" " + source.strip()),
                                                  tokens.encode(" " + target.strip()), ids)  # fmt: skip
        samples.append(Encoded(text=np.asarray(raw["text"]), position_id=np.asarray(raw["position_id"]),
                               sep=raw["sep"], target=np.asarray(raw["target"]),
                               loss_mask=np.asarray(raw["loss_mask"], dtype=np.float32), truncated_target=False))
    batch = collate(samples, tokens.pad_id)
    model = GLMForConditionalGeneration.from_pretrained(pretrained, device="cpu").glm.eval()
    with torch.no_grad():
        _, ours = lm_loss(model, batch, label_smoothing=entrypoints.SEQ2SEQ_SMOOTHING)
    print(f"finetune_glm.py first-step lm loss {losses[0]:.6E}, glm_port's {float(ours):.6E} "
          f"({len(samples)} samples, {int(batch['loss_mask'].sum())} target tokens)")
    assert abs(float(ours) - losses[0]) <= 1e-5  # upstream prints 7 digits
