"""``GLMTokenizer`` for inference: a GLM vocabulary (``glm_port.data.tokenization``) with the Hugging Face
calling conventions and GLM's blank-filling inputs.

``GLMTokenizer.from_pretrained(DIR)`` reads the vocabulary files of a released GLM directory (GPT-2 BPE,
RoBERTa BPE, BERT WordPiece or the Chinese sentencepiece model) and checks ``added_tokens.json`` against the
command ids upstream's ``data_utils/tokenization.py`` gives that vocabulary.

``build_inputs_for_generation`` lays a batch of texts out as GLM's blank infilling expects:
``[CLS] text-with-masks [eos]`` (no ``[eos]`` after a trailing ``[gMASK]``, as upstream's
``generate_samples.py``), a text without any mask gets `` [gMASK]`` appended, left padding, then ``sop``.
Position ids are 2D: the prompt counts 0.. from its first real token with block position 0; the
tokens generated for a blank take the blank's position and block positions 1, 2, ... The generation
attention mask lets the prompt attend bidirectionally (padding excluded) and the generated part causally.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


import shim as torch
from glm_port.data import tokenization as vocabularies
from glm_port.data.tokenization import EOP, GMASK, SMASK, SOP

MASK_TEXTS = ("[MASK]", SMASK, GMASK)
_MASK_PATTERN = re.compile(r"\[(?:MASK|sMASK|gMASK)\]")

# The class names THUDM's tokenizer_config.json uses -> our vocabulary loaders.
_HF_CLASSES = {
    "GLMGPT2Tokenizer": "GPT2BPETokenizer",
    "GLMRobertaTokenizer": "RobertaBPETokenizer",
    "GLMChineseTokenizer": "ChineseSPTokenizer",
    "GLMBertTokenizer": "BertWordPieceTokenizer",
}


class GLMInputs(dict):
    """A dict of tensors (``BatchEncoding``-like): ``inputs.to(device)``, ``inputs.input_ids``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device):
        return GLMInputs({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()})


def generation_mask(key_visible: torch.Tensor, prompt_length: int, total_length: int) -> torch.Tensor:
    """``[b, 1, L, L]`` boolean: query i sees key j when j is a real token and (j is in the prompt or j <= i).

    ``key_visible`` ``[b, L']`` (L' <= L) marks real tokens (padding and dropped end tokens are False);
    positions past it (tokens still to be generated) count as real.
    """
    batch = key_visible.size(0)
    keys = torch.ones(batch, total_length, dtype=torch.bool, device=key_visible.device)
    keys[:, : key_visible.size(1)] = key_visible.bool()
    idx = torch.arange(total_length, device=key_visible.device)
    causal_or_prompt = (idx.view(1, -1) <= idx.view(-1, 1)) | (idx.view(1, -1) < prompt_length)
    return (causal_or_prompt.unsqueeze(0) & keys.unsqueeze(1)).unsqueeze(1)


class GLMTokenizer:
    """GLM's tokenizer for inference. ``vocab`` is a ``glm_port.data.tokenization.GLMVocab``.

    Ids: ``eos_token_id``, ``pad_token_id``, ``cls_token_id``, ``sop_token_id``, ``eop_token_id``,
    ``mask_token_id``, ``smask_token_id``, ``gmask_token_id``; ``mask_token_ids`` are the three blanks.
    """

    padding_side = "left"

    def __init__(self, vocab):
        self.vocab = vocab
        for name in ("eos", "pad", "cls", "sep", "sop", "eop", "mask", "smask", "gmask", "unk"):
            setattr(self, f"{name}_token_id", vocab.command_ids.get(name))
        self.mask_token_ids = [i for i in (self.mask_token_id, self.smask_token_id, self.gmask_token_id)
                               if i is not None]

    def __repr__(self):
        return f"GLMTokenizer({self.vocab!r})"

    @property
    def vocab_size(self) -> int:
        """The padded vocabulary size a model built for this tokenizer has."""
        return self.vocab.vocab_size

    # ---- loading ----------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path, tokenizer_type: str | None = None) -> "GLMTokenizer":
        """Read the vocabulary in ``path`` (a released GLM directory, or the vocabulary file itself).

        The type comes from ``tokenizer_config.json``'s ``tokenizer_class`` (THUDM's names), else from
        the files: a ``.model`` is the Chinese sentencepiece, ``vocab.txt`` BERT WordPiece, ``vocab.json``
        with ``merges.txt`` GPT-2 BPE (RoBERTa's when it holds ``<s>`` at id 0).
        """
        path = Path(path).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"tokenizer path does not exist: {path}")
        kind = tokenizer_type or _detect_type(path)
        # The built-in vocabulary (glm-pretrain's and glm-finetune's default) is rebuilt, not read.
        lowercase = recorded_lowercase(path) if kind == "BertWordPieceTokenizer" else None
        vocab = vocabularies.get_tokenizer(kind, None if kind == vocabularies.DEFAULT_TOKENIZER else path,
                                           lowercase=lowercase)
        tokenizer = cls(vocab)
        added = path / "added_tokens.json" if path.is_dir() else None
        if added is not None and added.is_file():
            tokenizer._check_added_tokens(json.loads(added.read_text(encoding="utf-8")), added)
        return tokenizer

    def _check_added_tokens(self, added: dict, source) -> None:
        """The released ``added_tokens.json`` must give our command tokens the ids we use."""
        ours = {SOP: self.sop_token_id, EOP: self.eop_token_id, GMASK: self.gmask_token_id,
                SMASK: self.smask_token_id}
        if self.vocab.name == "GPT2BPETokenizer":
            ours.update({"[MASK]": self.mask_token_id, "[CLS]": self.cls_token_id})
        for token, want in ours.items():
            if token in added and want is not None and int(added[token]) != want:
                raise ValueError(f"{source}: {token} has id {added[token]} there but {want} in the "
                                 f"{self.vocab.name} layout; is this the vocabulary the model was trained with?")

    def save_pretrained(self, directory, lowercase: bool | None = None) -> None:
        """Write ``tokenizer_config.json`` naming the vocabulary type (the vocabulary files are not copied);
        ``lowercase`` (WordPiece, when it was not upstream's rule of the file's name): ``do_lower_case``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        inverse = {v: k for k, v in _HF_CLASSES.items()}
        config = {"tokenizer_class": inverse.get(self.vocab.name, self.vocab.name)}
        if lowercase is not None:
            config["do_lower_case"] = bool(lowercase)
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    # ---- text <-> ids -----------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``[CLS] ids [eos]`` as upstream's ``generate_samples.py`` (no ``[eos]`` after a final ``[gMASK]``)."""
        ids = self._encode_with_masks(text)
        if not add_special_tokens:
            return ids
        ids = [self.cls_token_id, *ids]
        if not text.rstrip().endswith(GMASK):
            ids.append(self.eos_token_id)
        return ids

    def _encode_with_masks(self, text: str) -> list[int]:
        """Blanks map to their ids whatever the vocabulary calls them (RoBERTa's [MASK] is its ``<mask>``);
        the space before a blank is dropped, as upstream's ``lstrip`` command tokens do."""
        ids: list[int] = []
        start = 0
        for match in _MASK_PATTERN.finditer(text):
            blank = self._blank_ids.get(match.group())
            if blank is None:
                raise ValueError(f"the {self.vocab.name} vocabulary has no {match.group()} token "
                                 f"(in {text[:60]!r})")
            piece = text[start:match.start()].rstrip()
            ids += self.vocab.encode(piece) if piece else []
            ids.append(blank)
            start = match.end()
        rest = text[start:]
        ids += self.vocab.encode(rest) if rest.strip() else []
        return ids

    @property
    def _blank_ids(self) -> dict:
        return {"[MASK]": self.mask_token_id, SMASK: self.smask_token_id, GMASK: self.gmask_token_id}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
        if skip_special_tokens:
            special = {self.cls_token_id, self.eos_token_id, self.pad_token_id, self.sop_token_id,
                       self.eop_token_id}
            ids = [i for i in ids if i not in special]
        return self.vocab.decode(ids)

    def __call__(self, texts, add_special_tokens: bool = True, return_tensors: str | None = "pt"):
        """Encode a text or a batch, left-padded: ``input_ids`` and ``attention_mask`` (1 = real token)."""
        batch = [texts] if isinstance(texts, str) else list(texts)
        encoded = [self.encode(t, add_special_tokens) for t in batch]
        if return_tensors is None:
            return GLMInputs(input_ids=encoded if not isinstance(texts, str) else encoded[0])
        return GLMInputs(self._pad(encoded))

    def _pad(self, encoded: list[list[int]]) -> dict:
        length = max(map(len, encoded))
        ids = torch.full((len(encoded), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), length), dtype=torch.long)
        for row, seq in enumerate(encoded):
            if seq:
                ids[row, length - len(seq):] = torch.tensor(seq, dtype=torch.long)
                mask[row, length - len(seq):] = 1
        return {"input_ids": ids, "attention_mask": mask}

    # ---- GLM's blank-filling inputs ---------------------------------------------------------------
    def with_blank(self, text: str) -> str:
        """The text as generation takes it: unchanged when it has a blank, else with `` [gMASK]`` at its end."""
        return text if _MASK_PATTERN.search(text) else f"{text} {GMASK}"

    def build_inputs_for_generation(self, texts, max_gen_length: int = 512, targets=None,
                                    max_length: int | None = None) -> GLMInputs:
        """Inputs for ``model.generate`` (filling each text's first blank), or for training with ``targets``.

        ``texts``: a string, a list of strings, or the output of ``tokenizer(texts)``. Returns
        ``input_ids`` (prompt + ``sop``), ``attention_mask`` (1 = real token), ``position_ids``
        ``[b, 2, s + max_gen_length]`` and ``generation_attention_mask`` ``[b, 1, L, L]`` covering every
        position generation may reach, ``mask_positions`` (each text's blanks, left to right, as
        positions), and ``prompt_length``. ``max_length`` (the model's positions) makes a prompt that
        cannot fit one clear error.

        With ``targets`` (one string per text) the result is a training pair as THUDM's: ``input_ids`` =
        prompt + ``sop`` + target, ``labels`` (-100 outside the target + ``eop``), ``attention_mask`` the
        full ``[b, 1, L, L]`` mask.
        """
        if isinstance(texts, dict):
            ids = texts["input_ids"]
            encoded = [row[mask.bool()].tolist() for row, mask in zip(ids, texts["attention_mask"])]
        else:
            batch = [texts] if isinstance(texts, str) else list(texts)
            encoded = [self.encode(self.with_blank(t)) for t in batch]
        blanks = []
        for seq in encoded:
            found = [p for p, i in enumerate(seq) if i in self.mask_token_ids]
            if not found:
                raise ValueError("a text has no [MASK], [sMASK] or [gMASK] token to fill")
            blanks.append(found)
        if max_length is not None:
            longest = max(map(len, encoded)) + 1
            if longest > max_length:
                raise ValueError(f"a prompt is {longest} tokens with sop, longer than the model's "
                                 f"{max_length} positions")
        padded = self._pad(encoded)
        input_ids, pad_mask = padded["input_ids"], padded["attention_mask"]
        batch_size, prompt_length = input_ids.shape
        if targets is not None:
            return self._training_pair(input_ids, pad_mask, blanks, targets, max_gen_length)
        first = torch.tensor([b[0] for b in blanks], dtype=torch.long)
        positions = prompt_positions(pad_mask)
        total = prompt_length + max_gen_length
        position_ids = torch.zeros(batch_size, 2, total, dtype=torch.long)
        position_ids[:, :, :prompt_length] = positions
        position_ids[:, 0, prompt_length:] = first.view(-1, 1)
        position_ids[:, 1, prompt_length:] = torch.arange(1, max_gen_length + 1)
        sop = torch.full((batch_size, 1), self.sop_token_id, dtype=torch.long)
        return GLMInputs(
            input_ids=torch.cat((input_ids, sop), dim=1),
            attention_mask=torch.cat((pad_mask, torch.ones_like(sop)), dim=1),
            position_ids=position_ids,
            generation_attention_mask=generation_mask(pad_mask, prompt_length, total),
            mask_positions=blanks,
            prompt_length=prompt_length,
        )

    def _training_pair(self, input_ids, pad_mask, blanks, targets, max_gen_length) -> GLMInputs:
        targets = [targets] if isinstance(targets, str) else list(targets)
        if len(targets) != input_ids.size(0):
            raise ValueError(f"{len(targets)} targets for {input_ids.size(0)} texts")
        spans = [(self.vocab.encode(t) + [self.eop_token_id])[:max_gen_length] for t in targets]
        gen = max(map(len, spans))
        batch_size, prompt_length = input_ids.shape
        total = prompt_length + gen
        block = torch.full((batch_size, gen), self.pad_token_id, dtype=torch.long)
        labels = torch.full((batch_size, total), -100, dtype=torch.long)
        key_visible = torch.cat((pad_mask, torch.zeros(batch_size, gen, dtype=torch.long)), dim=1)
        for row, span in enumerate(spans):
            block[row, 0] = self.sop_token_id
            block[row, 1:len(span)] = torch.tensor(span[:-1], dtype=torch.long)
            labels[row, prompt_length:prompt_length + len(span)] = torch.tensor(span, dtype=torch.long)
            key_visible[row, prompt_length:prompt_length + len(span)] = 1
        position_ids = torch.zeros(batch_size, 2, total, dtype=torch.long)
        position_ids[:, :, :prompt_length] = prompt_positions(pad_mask)
        position_ids[:, 0, prompt_length:] = torch.tensor([b[0] for b in blanks]).view(-1, 1)
        position_ids[:, 1, prompt_length:] = torch.arange(1, gen + 1)
        return GLMInputs(
            input_ids=torch.cat((input_ids, block), dim=1),
            position_ids=position_ids,
            attention_mask=generation_mask(key_visible, prompt_length, total),
            labels=labels,
            mask_positions=blanks,
            prompt_length=prompt_length,
        )


def prompt_positions(pad_mask: torch.Tensor) -> torch.Tensor:
    """``[b, 2, s]``: positions counted from each row's first real token (0 on padding), block 0."""
    positions = (pad_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return torch.stack((positions, torch.zeros_like(positions)), dim=1)


def _detect_type(path: Path) -> str:
    if path.is_file():
        if path.suffix == ".model":
            return "ChineseSPTokenizer"
        if path.suffix == ".txt":
            return "BertWordPieceTokenizer"
        return _bpe_kind(path)
    config = path / "tokenizer_config.json"
    if config.is_file():
        name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
        if name in _HF_CLASSES:
            return _HF_CLASSES[name]
        if name in _HF_CLASSES.values() or name == vocabularies.DEFAULT_TOKENIZER:
            return name
    if list(path.glob("*.model")):
        return "ChineseSPTokenizer"
    if list(path.glob("*vocab.txt")):
        return "BertWordPieceTokenizer"
    vocab = sorted(path.glob("*vocab.json"))
    if vocab:
        return _bpe_kind(vocab[0])
    raise FileNotFoundError(f"no GLM vocabulary in {path} (expected vocab.json + merges.txt, vocab.txt "
                            f"or a sentencepiece .model)")


def recorded_lowercase(path: Path) -> bool | None:
    """``do_lower_case`` of the directory's ``tokenizer_config.json`` (None: not recorded)."""
    config = path / "tokenizer_config.json" if path.is_dir() else None
    if config is None or not config.is_file():
        return None
    value = json.loads(config.read_text(encoding="utf-8")).get("do_lower_case")
    return value if isinstance(value, bool) else None


def _bpe_kind(vocab_json: Path) -> str:
    vocab = json.loads(vocab_json.read_text(encoding="utf-8"))
    return "RobertaBPETokenizer" if vocab.get("<s>") == 0 else "GPT2BPETokenizer"


# The files a GLM directory's tokenizer is read from (copied along when weights are merged, exported, saved).
TOKENIZER_FILES = ("tokenizer_config.json", "added_tokens.json", "special_tokens_map.json", "generation_config.json")
VOCAB_PATTERNS = ("*.model", "*vocab.txt", "*vocab.json", "*merges.txt")


def tokenizer_files(path: Path, tokenizer_path: Path | None = None) -> list[Path]:
    """The vocabulary files to copy: ``tokenizer_path`` (a file, with its merges; or a directory), else
    those beside the weights (``path``: a directory, or a weight file whose directory is looked in)."""
    if tokenizer_path is not None:
        if tokenizer_path.is_file():
            files = [tokenizer_path]
            if tokenizer_path.name.endswith("vocab.json"):
                files.append(tokenizer_path.with_name(tokenizer_path.name.replace("vocab.json", "merges.txt")))
            return [f for f in files if f.is_file()]
        path = tokenizer_path
    directory = path if path.is_dir() else path.parent
    found = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    for pattern in VOCAB_PATTERNS:
        found += sorted(p for p in directory.glob(pattern) if p.is_file())
    return found
