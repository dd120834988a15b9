"""GLM tokenizers: a text vocabulary (``tokenizers`` or ``sentencepiece``) plus GLM's command tokens.

Command-token ids follow upstream's ``data_utils/tokenization.py`` for each vocabulary (with the block-LM
symbols and the task masks that GLM pretraining adds); the ``vocab_size`` a model uses is ``num_tokens``
padded up to a multiple of 128 (upstream's ``--make-vocab-size-divisible-by``).
"""

from __future__ import annotations

import hashlib
import re
from functools import cached_property
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from glm_port.data._renamed import renamed

# The embedded corpus (corpus.py reads it as its default; its words make the built-in vocabulary).
DEFAULT_CORPUS = Path(__file__).with_name("default_corpus.txt")  # written by default_corpus.py
SOP, EOP = "<|startofpiece|>", "<|endofpiece|>"
GMASK, SMASK = "[gMASK]", "[sMASK]"
DBLOCK = "[dBLOCK]"  # replaces Part B inputs under upstream's --block-mask-prob
# Characters whose presence makes a token end a sentence (upstream's ``contains_sentence_end``).
SENTENCE_END_CHARS = frozenset(".?!;:。？！；…\n")
COMMAND_NAMES = ("pad", "eos", "cls", "sep", "mask", "unk", "sop", "eop", "gmask", "smask", "dblock")


class TextTokenizer(Protocol):
    """The text half of a GLMVocab: a plain vocabulary with no knowledge of GLM's commands."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_texts(self) -> list[str]: ...


class HFTextTokenizer:
    """A ``tokenizers.Tokenizer`` whose special tokens (GLM's commands) are registered as added tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_batch(self, texts):
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_texts(self):
        # Decoded, not raw, pieces: byte-level BPE spells "\n" as "Ċ".
        n = self.tokenizer.get_vocab_size(with_added_tokens=True)
        return self.tokenizer.decode_batch([[i] for i in range(n)], skip_special_tokens=False)


class SentencePieceTextTokenizer:
    """A sentencepiece model with command tokens appended after its pieces (ids >= its vocab size).

    sentencepiece cannot register extra tokens, so command strings in the text are split out here
    (as upstream's ``EncodeAsIds`` does) and command ids are rendered as their strings when decoding.
    """

    def __init__(self, processor, commands: dict[str, int]):
        self.sp = processor
        self.base = processor.vocab_size()
        self.command_by_id = {i: tok for tok, i in commands.items() if i >= self.base}
        self.command_by_text = {tok: i for i, tok in self.command_by_id.items()}
        self.splitter = re.compile("(" + "|".join(map(re.escape, self.command_by_text)) + ")")

    def encode_batch(self, texts):
        return [self._encode(t) for t in texts]

    def _encode(self, text):
        ids: list[int] = []
        for piece in self.splitter.split(text):
            if piece in self.command_by_text:
                ids.append(self.command_by_text[piece])
            elif piece:
                ids.extend(self.sp.encode(piece))
        return ids

    def decode(self, ids):
        parts, run = [], []
        for i in ids:
            if i in self.command_by_id:
                parts += [self.sp.decode(run), self.command_by_id[i]]
                run = []
            else:
                run.append(int(i))
        parts.append(self.sp.decode(run))
        return "".join(parts)

    def token_texts(self):
        texts = [self.sp.id_to_piece(i) for i in range(self.base)]
        top = max(self.command_by_id, default=self.base - 1)
        return texts + [self.command_by_id.get(i, "") for i in range(self.base, top + 1)]


class GLMVocab:
    """A vocabulary with GLM's command tokens; the object every part of glm_port tokenizes with. (Called
    ``GLMTokenizer`` before issue 27, the name of the inference tokenizer over it, ``glm_port.GLMTokenizer``;
    the old name still imports, with a DeprecationWarning.)

    Attributes ``pad_id, eos_id, cls_id, sep_id, mask_id, unk_id, sop_id, eop_id, gmask_id, smask_id,
    dblock_id`` are ids (``None`` where the vocabulary has no such command). ``num_tokens`` counts real tokens;
    ``vocab_size`` is that padded to ``pad_multiple`` (the embedding size a model needs).
    """

    pad_id: int | None
    eos_id: int | None
    cls_id: int | None
    sep_id: int | None
    mask_id: int | None
    unk_id: int | None
    sop_id: int | None
    eop_id: int | None
    gmask_id: int | None
    smask_id: int | None
    dblock_id: int | None

    def __init__(self, name: str, text: TextTokenizer, command_ids: dict[str, int], num_tokens: int,
                 fingerprint: str, pad_multiple: int = 128):
        unknown = set(command_ids) - set(COMMAND_NAMES)
        if unknown:
            raise ValueError(f"unknown GLM command names: {sorted(unknown)}")
        self.name = name
        self.text = text
        self.num_tokens = num_tokens
        self.vocab_size = -(-num_tokens // pad_multiple) * pad_multiple
        self.fingerprint = fingerprint
        self.command_ids = dict(command_ids)
        for command in COMMAND_NAMES:
            setattr(self, f"{command}_id", command_ids.get(command))

    def encode(self, text: str) -> list[int]:
        return self.text.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.text.encode_batch(texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self.text.decode([int(i) for i in ids])

    @cached_property
    def sentence_end(self) -> np.ndarray:
        """Boolean table over ids: does this token end a sentence (for ``[sMASK]`` spans)."""
        texts = self.text.token_texts()
        table = np.zeros(max(self.num_tokens, len(texts)), dtype=bool)
        table[: len(texts)] = [not SENTENCE_END_CHARS.isdisjoint(t) for t in texts]
        for command in ("eos", "pad", "cls", "sep"):
            if self.command_ids.get(command) is not None:
                table[self.command_ids[command]] = False
        return table

    def __repr__(self):
        return (f"GLMVocab({self.name}, num_tokens={self.num_tokens}, vocab_size={self.vocab_size}, "
                f"commands={self.command_ids})")


def _fingerprint(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _find_one(path: Path, patterns: Sequence[str], what: str) -> Path:
    """``path`` itself if it is a file, else the single file in the directory matching the first pattern
    that matches anything."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer path does not exist: {path}")
    for pattern in patterns:
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"several {what} files in {path}: {', '.join(f.name for f in found)}; pass the file")
    raise FileNotFoundError(f"no {what} file ({' or '.join(patterns)}) in {path}")


def _with_added(tokenizer, tokens: Sequence[str], lstrip: Sequence[str] = ()):
    """Register command tokens so text containing them encodes to their ids; ``lstrip`` ones swallow the
    space before them (upstream's masks in byte-level BPE)."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, lstrip=t in lstrip) for t in tokens])
    return tokenizer


def tiny_wordpiece() -> GLMVocab:
    """The self-contained default: a WordPiece vocabulary of every word in the embedded corpus, plus ASCII
    characters (and their ``##`` continuations) so any English text still encodes without [UNK].

    Built from the corpus's words rather than trained: ``tokenizers``' trainer breaks ties differently from
    run to run, and data-parallel ranks that build it independently must agree on every id.
    """
    import string

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers


    normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    text = normalizer.normalize_str(DEFAULT_CORPUS.read_text(encoding="utf-8"))
    words = sorted({word for word, _ in pre_tokenizer.pre_tokenize_str(text)})
    chars = string.ascii_lowercase + string.digits + string.punctuation
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    pieces += [w for w in words if w not in set(pieces)]
    tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoders.WordPiece()
    return wordpiece_tokenizer(tok, DEFAULT_TOKENIZER, _fingerprint("tiny", *pieces))


def _check_ids(name: str, tokenizer, expected: dict[str, int]) -> dict[str, int]:
    """Map command name -> id through the vocabulary, asserting the layout the checkpoints expect."""
    ids = {}
    for command, (token, want) in expected.items():
        got = tokenizer.token_to_id(token)
        if got != want:
            raise ValueError(f"{name}: {token} has id {got}, GLM expects {want}; is this the right vocabulary?")
        ids[command] = got
    return ids


def wordpiece_tokenizer(tok, name: str, fingerprint: str) -> GLMVocab:
    """GLM's BERT layout on a ``tokenizers`` WordPiece vocabulary: [PAD] (= eos), [CLS], [SEP], [MASK], [UNK]
    where the vocabulary has them; sop, eop, [gMASK], [sMASK], [dBLOCK] appended after it (upstream's order)."""
    base = tok.get_vocab_size()
    _with_added(tok, [SOP, EOP, GMASK, SMASK, DBLOCK])
    named = {"pad": "[PAD]", "eos": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "unk": "[UNK]",
             "sop": SOP, "eop": EOP, "gmask": GMASK, "smask": SMASK, "dblock": DBLOCK}
    ids = {command: tok.token_to_id(token) for command, token in named.items()}
    missing = [named[c] for c in ("pad", "cls", "sep", "mask", "unk") if ids[c] is None]
    if missing:
        raise ValueError(f"{name}: WordPiece vocab lacks {', '.join(missing)}")
    _with_added(tok, [named[c] for c in ("pad", "cls", "sep", "mask", "unk")])  # recognised in text, kept whole
    return GLMVocab(name, HFTextTokenizer(tok), ids, base + 5, fingerprint)


def bert_wordpiece(path: Path, lowercase: bool | None = None) -> GLMVocab:
    """BERT WordPiece (GLM-Base/Large), with [gMASK]/[sMASK]/[dBLOCK] as upstream's ``--task-mask
    --block-mask-prob`` add them."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = _find_one(path, ["vocab.txt", "*vocab.txt"], "WordPiece vocab (.txt)")
    if lowercase is None:  # upstream: cased only for "-cased" model types
        lowercase = "-cased" not in vocab.name
    tok = Tokenizer(models.WordPiece.from_file(str(vocab), unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    fp = _fingerprint("bert", str(lowercase), vocab.read_bytes())
    return wordpiece_tokenizer(tok, "BertWordPieceTokenizer", fp)


def gpt2_bpe(path: Path, roberta: bool | None = None) -> GLMVocab:
    """GPT-2 byte-level BPE (GLM-2B/10B) or RoBERTa's (GLM-RoBERTa), with upstream's command ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    prefixed = "roberta-vocab.json" if roberta else "gpt2-vocab.json"
    vocab = _find_one(path, ["vocab.json", prefixed], "BPE vocab (.json)")
    merges = vocab.with_name(vocab.name.replace("vocab.json", "merges.txt"))
    if vocab.suffix != ".json" or not merges.is_file():
        raise FileNotFoundError(f"BPE needs <name>vocab.json with <name>merges.txt beside it; got {vocab}")
    if roberta is None:  # upstream picks RoBERTa's layout when the model type starts with "roberta"
        roberta = vocab.name.startswith("roberta")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    base = tok.get_vocab_size()
    if roberta:
        _with_added(tok, ["<s>", "</s>", "<unk>", "<mask>", SOP, EOP, GMASK, SMASK, DBLOCK],
                    lstrip=["<mask>", GMASK, SMASK])
        ids = _check_ids("RoBERTa BPE", tok, {
            "pad": ("</s>", 2), "eos": ("</s>", 2), "sep": ("</s>", 2), "cls": ("<s>", 0),
            "mask": ("<mask>", base - 1), "unk": ("<unk>", 3), "sop": (SOP, base), "eop": (EOP, base + 1),
            "gmask": (GMASK, base + 2), "smask": (SMASK, base + 3), "dblock": (DBLOCK, base + 4)})
        name, num_tokens = "RobertaBPETokenizer", base + 5
    else:
        _with_added(tok, ["<|endoftext|>", SOP, EOP, "[CLS]", "[MASK]", "[SEP]", "[UNK]", GMASK, SMASK, DBLOCK],
                    lstrip=["[MASK]", GMASK, SMASK])
        ids = _check_ids("GPT-2 BPE", tok, {
            "pad": ("<|endoftext|>", base - 1), "eos": ("<|endoftext|>", base - 1), "sop": (SOP, base),
            "eop": (EOP, base + 1), "cls": ("[CLS]", base + 2), "mask": ("[MASK]", base + 3),
            "sep": ("[SEP]", base + 4), "unk": ("[UNK]", base + 5), "gmask": (GMASK, base + 6),
            "smask": (SMASK, base + 7), "dblock": (DBLOCK, base + 8)})
        name, num_tokens = "GPT2BPETokenizer", base + 9
    fp = _fingerprint(name, vocab.read_bytes(), merges.read_bytes())
    return GLMVocab(name, HFTextTokenizer(tok), ids, num_tokens, fp)


def chinese_sentencepiece(path: Path) -> GLMVocab:
    """The Chinese sentencepiece model (GLM-Large/10B-Chinese).

    Ids follow upstream with ``--fix-command-token`` (the released checkpoints' layout): commands start at
    the model's size n: eos=pad n, [SEP] n+1, [CLS] n+2, [MASK] n+3, [UNK] n+4, (n+5 unused), sop n+6,
    eop n+7, [sMASK] n+8, [gMASK] n+9, [dBLOCK] n+10. Without that flag upstream gives [gMASK] the id of eop.
    """
    import sentencepiece

    model = _find_one(path, ["*.model"], "sentencepiece model (.model)")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    n = sp.vocab_size()
    commands = {"<|endoftext|>": n, "[SEP]": n + 1, "[CLS]": n + 2, "[MASK]": n + 3, "[UNK]": n + 4,
                SOP: n + 6, EOP: n + 7, SMASK: n + 8, GMASK: n + 9, DBLOCK: n + 10}
    ids = {"pad": n, "eos": n, "sep": n + 1, "cls": n + 2, "mask": n + 3, "unk": n + 4, "sop": n + 6,
           "eop": n + 7, "smask": n + 8, "gmask": n + 9, "dblock": n + 10}
    fp = _fingerprint("chinese-sp", model.read_bytes())
    return GLMVocab("ChineseSPTokenizer", SentencePieceTextTokenizer(sp, commands), ids, n + 11, fp)


DEFAULT_TOKENIZER = "TinyWordPieceTokenizer"
_LOADERS = {
    "BertWordPieceTokenizer": bert_wordpiece,
    "GPT2BPETokenizer": gpt2_bpe,
    "RobertaBPETokenizer": lambda path: gpt2_bpe(path, roberta=True),
    "ChineseSPTokenizer": chinese_sentencepiece,
}


def get_tokenizer(tokenizer_type: str | None = None, path: str | Path | None = None, *,
                  lowercase: bool | None = None) -> GLMVocab:
    """A GLMVocab by upstream's ``--tokenizer-type`` name, read from ``path`` (a vocabulary file or a
    directory holding one).

    Types: ``BertWordPieceTokenizer`` (vocab.txt), ``GPT2BPETokenizer`` (vocab.json + merges.txt; RoBERTa's
    layout when the file is named ``roberta-*``, as upstream), ``RobertaBPETokenizer``, ``ChineseSPTokenizer``
    (a sentencepiece ``.model``), and the default ``TinyWordPieceTokenizer`` (built in, no path).
    ``lowercase`` (WordPiece only) overrides upstream's rule: lowercase unless the vocabulary is "-cased".
    """
    if lowercase is not None and tokenizer_type != "BertWordPieceTokenizer":
        raise ValueError(f"lowercase applies to BertWordPieceTokenizer only, not {tokenizer_type or DEFAULT_TOKENIZER}")
    if tokenizer_type in (None, DEFAULT_TOKENIZER):
        if path is not None:
            raise ValueError(f"{DEFAULT_TOKENIZER} is built in and takes no path (got {path})")
        return tiny_wordpiece()
    if tokenizer_type not in _LOADERS:
        raise ValueError(f"unknown tokenizer type {tokenizer_type!r}; "
                         f"choose from {', '.join([DEFAULT_TOKENIZER, *_LOADERS])}")
    if path is None:
        raise ValueError(f"{tokenizer_type} needs a path: its vocabulary file or a directory holding it")
    if tokenizer_type == "BertWordPieceTokenizer":
        return bert_wordpiece(Path(path).expanduser(), lowercase=lowercase)
    return _LOADERS[tokenizer_type](Path(path).expanduser())


__getattr__ = renamed(__name__, {"GLMTokenizer": "GLMVocab"}, globals())  # the name before issue 27
