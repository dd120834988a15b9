"""Tokenizers: GLM's command ids per vocabulary (as upstream's data_utils/tokenization.py lays them out),
round trips on the real vocabularies in ../shared/vocab, and the built-in default."""

from pathlib import Path

import pytest

from glm_port.data import DEFAULT_TOKENIZER, get_tokenizer
from glm_port.data.corpus import DEFAULT_CORPUS

VOCAB = Path(__file__).resolve().parents[2] / ".." / "shared" / "vocab"
needs_vocab = pytest.mark.skipif(not VOCAB.is_dir(), reason=f"real vocab files not found at {VOCAB}")

# (type, file inside VOCAB) -> expected ids, num_tokens, padded vocab_size
REAL = {
    "BertWordPieceTokenizer": (
        "bert-base-uncased-vocab.txt",
        dict(pad=0, eos=0, cls=101, sep=102, mask=103, unk=100, sop=30522, eop=30523, gmask=30524, smask=30525,
             dblock=30526),
        30527, 30592),
    "GPT2BPETokenizer": (
        "gpt2-vocab.json",
        dict(pad=50256, eos=50256, sop=50257, eop=50258, cls=50259, mask=50260, sep=50261, unk=50262, gmask=50263,
             smask=50264, dblock=50265),
        50266, 50304),
    "RobertaBPETokenizer": (
        "roberta-vocab.json",
        dict(pad=2, eos=2, sep=2, cls=0, mask=50264, unk=3, sop=50265, eop=50266, gmask=50267, smask=50268,
             dblock=50269),
        50270, 50304),
    "ChineseSPTokenizer": (
        "cog-pretrain.model",
        dict(pad=50000, eos=50000, sep=50001, cls=50002, mask=50003, unk=50004, sop=50006, eop=50007, smask=50008,
             gmask=50009, dblock=50010),
        50011, 50048),
}

ROUND_TRIP = {
    "BertWordPieceTokenizer": "glm fills in the blanks. it was trained on books, wikipedia and more - 42 times!",
    "GPT2BPETokenizer": "GLM fills in blanks.\n  Spaces,\ttabs, caf\u00e9 and \u4e2d\u6587 survive: 3.14 % <html>",
    "RobertaBPETokenizer": "RoBERTa's byte-level BPE keeps Everything: \u00fcber, \u2603, and\n\nnewlines.",
    "ChineseSPTokenizer": "\u6e05\u534e\u5927\u5b66\u7684GLM\u6a21\u578b\u80fd\u591f\u586b\u7a7a\u3002",
}


@needs_vocab
@pytest.mark.parametrize("kind", sorted(REAL))
def test_real_vocab_command_ids(kind):
    file, ids, num_tokens, vocab_size = REAL[kind]
    tok = get_tokenizer(kind, VOCAB / file)
    assert tok.command_ids == ids
    assert {name: getattr(tok, f"{name}_id") for name in ids} == ids
    assert (tok.num_tokens, tok.vocab_size) == (num_tokens, vocab_size)


@needs_vocab
@pytest.mark.parametrize("kind", sorted(REAL))
def test_real_vocab_round_trip(kind):
    tok = get_tokenizer(kind, VOCAB)  # the directory: each type finds its own file
    text = ROUND_TRIP[kind]
    ids = tok.encode(text)
    assert all(0 <= i < tok.num_tokens for i in ids)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text


@needs_vocab
def test_real_vocab_known_encodings():
    assert get_tokenizer("GPT2BPETokenizer", VOCAB).encode("Hello world") == [15496, 995]
    assert get_tokenizer("BertWordPieceTokenizer", VOCAB).encode("Hello world") == [7592, 2088]


@needs_vocab
def test_command_tokens_in_text_encode_to_their_ids():
    bert = get_tokenizer("BertWordPieceTokenizer", VOCAB)
    assert bert.encode("a [MASK] b [gMASK]") == [1037, bert.mask_id, 1038, bert.gmask_id]
    gpt2 = get_tokenizer("GPT2BPETokenizer", VOCAB)
    ids = gpt2.encode("Hi [sMASK] there<|endoftext|>")
    assert ids[1] == gpt2.smask_id and ids[-1] == gpt2.eos_id
    sp = get_tokenizer("ChineseSPTokenizer", VOCAB)
    ids = sp.encode("\u4f60\u597d[gMASK]<|startofpiece|>")
    assert ids[-2:] == [sp.gmask_id, sp.sop_id]
    assert sp.decode(ids) == "\u4f60\u597d[gMASK]<|startofpiece|>"


@needs_vocab
def test_bert_case_follows_the_file_name_or_the_caller(tmp_path):
    uncased = get_tokenizer("BertWordPieceTokenizer", VOCAB)
    assert uncased.decode(uncased.encode("Hello World")) == "hello world"
    cased_name = tmp_path / "bert-base-cased-vocab.txt"
    cased_name.write_bytes((VOCAB / "bert-base-uncased-vocab.txt").read_bytes())
    # an uncased vocabulary read as cased: capitalised words are no longer whole tokens
    assert get_tokenizer("BertWordPieceTokenizer", cased_name).encode("Hello") != uncased.encode("hello")
    forced = get_tokenizer("BertWordPieceTokenizer", cased_name, lowercase=True)
    assert forced.encode("Hello") == uncased.encode("hello")
    with pytest.raises(ValueError, match="lowercase applies to BertWordPieceTokenizer only"):
        get_tokenizer("GPT2BPETokenizer", VOCAB, lowercase=True)


@needs_vocab
def test_gpt2_type_takes_roberta_layout_from_a_roberta_file():
    # upstream: GPT2BPETokenizer with a model type starting with "roberta"
    tok = get_tokenizer("GPT2BPETokenizer", VOCAB / "roberta-vocab.json")
    assert tok.name == "RobertaBPETokenizer" and tok.mask_id == 50264


@needs_vocab
def test_sentence_end_table():
    tok = get_tokenizer("GPT2BPETokenizer", VOCAB)
    table = tok.sentence_end
    assert table[tok.encode(".")[0]] and table[tok.encode("\n")[0]] and table[tok.encode(" end.")[-1]]
    assert not table[tok.encode(" word")[0]] and not table[tok.eos_id]


def test_default_tokenizer_layout():
    tok = get_tokenizer()
    assert tok.name == DEFAULT_TOKENIZER
    assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 0, 1, 2, 3, 4)
    n = tok.num_tokens
    assert (tok.sop_id, tok.eop_id, tok.gmask_id, tok.smask_id, tok.dblock_id) == (n - 5, n - 4, n - 3, n - 2, n - 1)
    assert tok.vocab_size % 128 == 0 and tok.vocab_size >= n


def test_default_tokenizer_is_deterministic_and_covers_its_corpus():
    a, b = get_tokenizer(), get_tokenizer(DEFAULT_TOKENIZER)
    assert a.fingerprint == b.fingerprint
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    ids = a.encode(text)
    assert a.unk_id not in ids
    words = text.split()
    assert len(ids) < 1.3 * len(words)  # whole words, not characters
    assert a.decode(a.encode("Ada met Finn near the old mill.")) == "ada met finn near the old mill."


def test_default_tokenizer_spells_unknown_words():
    tok = get_tokenizer()
    ids = tok.encode("zebra-crossing 2024")
    assert tok.unk_id not in ids
    assert tok.decode(ids) == "zebra - crossing 2024"


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer type 'Nope'"):
        get_tokenizer("Nope")
    with pytest.raises(ValueError, match="needs a path"):
        get_tokenizer("BertWordPieceTokenizer")
    with pytest.raises(ValueError, match="takes no path"):
        get_tokenizer(None, tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_tokenizer("GPT2BPETokenizer", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no sentencepiece model"):
        get_tokenizer("ChineseSPTokenizer", tmp_path)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        get_tokenizer("GPT2BPETokenizer", tmp_path)
