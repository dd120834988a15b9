"""GLMTokenizer for inference: each release's special-token ids and mask handling on the real vocabularies
(../shared/vocab), from_pretrained with added_tokens.json, build_inputs_for_generation's layout."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from glm_port.data.tokenization import tiny_wordpiece
from glm_port.models.glm.tokenizer import GLMTokenizer

# ../shared/vocab beside the checkout; GLM_VOCAB names another place (a worktree, a CI cache).
VOCAB = Path(os.environ.get("GLM_VOCAB") or Path(__file__).resolve().parents[2] / ".." / "shared" / "vocab")
needs_vocab = pytest.mark.skipif(not VOCAB.is_dir(), reason=f"real vocab files not found at {VOCAB}")

# Release directory layout -> the ids the issue and upstream's data_utils/tokenization.py give.
RELEASES = {
    "glm-10b (GPT-2 BPE)": ({"vocab.json": "gpt2-vocab.json", "merges.txt": "gpt2-merges.txt"},
                            dict(eos=50256, sop=50257, eop=50258, cls=50259, mask=50260, gmask=50263, smask=50264)),
    "glm-10b-chinese (sentencepiece)": ({"cog-pretrain.model": "cog-pretrain.model"},
                                        dict(eos=50000, mask=50003, sop=50006, eop=50007, smask=50008, gmask=50009,
                                             cls=50002)),
    "glm-large (BERT WordPiece)": ({"vocab.txt": "bert-base-uncased-vocab.txt"},
                                   dict(eos=0, cls=101, mask=103, sop=30522, eop=30523, gmask=30524, smask=30525)),
    # upstream: [MASK] is RoBERTa's own <mask> (50264); sop/eop follow the vocabulary (50265/50266).
    "glm-roberta-large (RoBERTa BPE)": ({"vocab.json": "roberta-vocab.json", "merges.txt": "roberta-merges.txt"},
                                        dict(eos=2, cls=0, mask=50264, sop=50265, eop=50266, gmask=50267)),
}


def release_dir(tmp_path, files) -> Path:
    directory = tmp_path / "release"
    directory.mkdir()
    for target, source in files.items():
        (directory / target).symlink_to(VOCAB / source)
    return directory


@needs_vocab
@pytest.mark.parametrize("release", RELEASES)
def test_release_ids_and_mask_handling(tmp_path, release):
    files, ids = RELEASES[release]
    tok = GLMTokenizer.from_pretrained(release_dir(tmp_path, files))
    for name, want in ids.items():
        assert getattr(tok, f"{name}_token_id") == want, name
    text = "Ng is an adjunct professor at [MASK] (he used to be the Director of [MASK] Lab)."
    encoded = tok.encode(text)
    assert encoded[0] == tok.cls_token_id and encoded[-1] == tok.eos_token_id
    assert [i for i in encoded if i in tok.mask_token_ids] == [tok.mask_token_id] * 2
    assert tok.decode(encoded).count("<mask>" if "RoBERTa" in release else "[MASK]") == 2
    inputs = tok.build_inputs_for_generation([text, "Beijing is the capital of"], max_gen_length=4)
    first = inputs.input_ids[0].tolist()
    assert inputs.mask_positions[0] == [p for p, i in enumerate(first) if i == tok.mask_token_id]
    second = inputs.input_ids[1][inputs.attention_mask[1].bool()].tolist()
    assert second[-2:] == [tok.gmask_token_id, tok.sop_token_id]  # [gMASK] appended, no eos after it
    assert second[0] == tok.cls_token_id


@needs_vocab
def test_added_tokens_json_is_checked(tmp_path):
    files, _ = RELEASES["glm-10b (GPT-2 BPE)"]
    directory = release_dir(tmp_path, files)
    (directory / "added_tokens.json").write_text(json.dumps({"<|startofpiece|>": 50257, "[gMASK]": 50263}))
    assert GLMTokenizer.from_pretrained(directory).gmask_token_id == 50263
    (directory / "added_tokens.json").write_text(json.dumps({"[gMASK]": 50009}))
    with pytest.raises(ValueError, match=r"\[gMASK\] has id 50009 there but 50263"):
        GLMTokenizer.from_pretrained(directory)


@needs_vocab
def test_tokenizer_config_names_the_type(tmp_path):
    directory = tmp_path / "r"
    directory.mkdir()
    shutil.copy(VOCAB / "roberta-vocab.json", directory / "vocab.json")
    shutil.copy(VOCAB / "roberta-merges.txt", directory / "merges.txt")
    assert GLMTokenizer.from_pretrained(directory).vocab.name == "RobertaBPETokenizer"  # <s> at 0
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GLMRobertaTokenizer"}))
    assert GLMTokenizer.from_pretrained(directory).sop_token_id == 50265


def test_no_vocabulary_is_one_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GLM vocabulary"):
        GLMTokenizer.from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def tiny():
    return GLMTokenizer(tiny_wordpiece())


def test_generation_layout_by_hand(tiny):
    inputs = tiny.build_inputs_for_generation(["a [MASK] b", "c d [MASK] e f"], max_gen_length=3)
    # Row 0 is left-padded by 2: [pad pad CLS a MASK b eos sop]; row 1: [CLS c d MASK e f eos sop].
    pad, cls, eos, sop, mask = tiny.pad_token_id, tiny.cls_token_id, tiny.eos_token_id, tiny.sop_token_id, \
        tiny.mask_token_id
    assert inputs.input_ids[0].tolist()[:3] == [pad, pad, cls] and inputs.input_ids[0, 4] == mask
    assert inputs.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8]
    assert inputs.mask_positions == [[2], [3]]
    assert inputs.position_ids[0].tolist() == [[0, 0, 0, 1, 2, 3, 4, 2, 2, 2],
                                               [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]]
    assert inputs.position_ids[1].tolist() == [[0, 1, 2, 3, 4, 5, 6, 3, 3, 3],
                                               [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]]
    visible = inputs.generation_attention_mask[0, 0].int()
    assert visible.shape == (10, 10)
    assert visible[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]  # prompt: bidirectional, no padding
    assert visible[8].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0]  # generated: prompt + causal
    assert inputs.input_ids[0, -1] == sop and inputs.input_ids[1, -2] == eos


def test_training_pairs_with_targets(tiny):
    pair = tiny.build_inputs_for_generation(["a [MASK] b"], targets=["c d"], max_gen_length=8)
    target = tiny.vocab.encode("c d")
    s = len(tiny.encode("a [MASK] b"))
    assert pair.input_ids[0, s:].tolist() == [tiny.sop_token_id, *target]
    assert pair.labels[0, s:].tolist() == [*target, tiny.eop_token_id]
    assert (pair.labels[0, :s] == -100).all()
    assert pair.attention_mask.shape == (1, 1, s + 3, s + 3)
    assert pair.position_ids[0, 1, s:].tolist() == [1, 2, 3]


def test_missing_mask_token_is_one_error():
    vocab = tiny_wordpiece()
    tok = GLMTokenizer(vocab)
    tok.smask_token_id = None
    with pytest.raises(ValueError, match=r"no \[sMASK\] token"):
        tok.encode("a [sMASK] b")
