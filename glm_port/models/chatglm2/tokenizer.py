"""ChatGLM2's tokenizer: a sentencepiece ``tokenizer.model`` plus five specials numbered after it.

As THUDM's ``tokenization_chatglm.py`` numbers them: the sentencepiece pieces keep their ids (``<unk>``
0 is also the pad, ``<s>`` 1, ``</s>`` 2 the end of a reply), then ``[MASK]``, ``[gMASK]``,
``[sMASK]``, ``sop``, ``eop`` take the next five ids (ChatGLM2-6B's 64789-piece model: 64789..64793).
Every input starts ``[gMASK] sop``; batches are padded on the left. ``build_prompt`` writes the chat
format ``[Round i]\\n\\n问：...\\n\\n答：...``.
"""

from __future__ import annotations

import os
import shutil

import sentencepiece as spm
from transformers import PreTrainedTokenizer

SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop")


def build_prompt(query: str, history=None) -> str:
    """The chat prompt of ChatGLM2's ``build_prompt``: each past ``(query, response)`` as a numbered round,
    then the new query with an open ``答：``."""
    prompt = ""
    for i, (old_query, response) in enumerate(history or []):
        prompt += f"[Round {i + 1}]\n\n问：{old_query}\n\n答：{response}\n\n"
    return prompt + f"[Round {len(history or []) + 1}]\n\n问：{query}\n\n答："


class ChatGLM2Tokenizer(PreTrainedTokenizer):
    """``AutoTokenizer``-style tokenizer for ChatGLM2 directories (``tokenizer.model``)."""

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, padding_side="left", clean_up_tokenization_spaces=False, **kwargs):
        if not os.path.isfile(vocab_file):
            raise ValueError(f"ChatGLM2 tokenizer: no sentencepiece model at {vocab_file}")
        self.vocab_file = vocab_file
        self.sp_model = spm.SentencePieceProcessor(model_file=vocab_file)
        n = self.sp_model.vocab_size()
        self.special_ids = {token: n + i for i, token in enumerate(SPECIAL_TOKENS)}
        self.special_names = {i: token for token, i in self.special_ids.items()}
        for key in ("unk_token", "pad_token", "eos_token", "bos_token"):
            kwargs.pop(key, None)
        super().__init__(
            padding_side=padding_side, clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            unk_token="<unk>", pad_token="<unk>", eos_token="</s>", **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.sp_model.vocab_size() + len(SPECIAL_TOKENS)

    def get_vocab(self):
        vocab = {self.sp_model.id_to_piece(i): i for i in range(self.sp_model.vocab_size())}
        vocab.update(self.special_ids)
        return vocab

    def get_command(self, token: str) -> int:
        """Id of a special (``[gMASK]``, ``sop``, ...) or of ``<bos>``/``<eos>``/``<pad>``, as THUDM names them."""
        named = {"<bos>": self.sp_model.bos_id(), "<eos>": self.sp_model.eos_id(), "<pad>": self.sp_model.unk_id()}
        if token in named:
            return named[token]
        if token not in self.special_ids:
            raise ValueError(f"{token!r} is not a ChatGLM2 special token ({', '.join(SPECIAL_TOKENS)})")
        return self.special_ids[token]

    def _tokenize(self, text, **kwargs):
        return self.sp_model.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        if token in self.special_ids:
            return self.special_ids[token]
        return self.sp_model.piece_to_id(token)

    def _convert_id_to_token(self, index):
        if index in self.special_names:
            return self.special_names[index]
        return self.sp_model.id_to_piece(index)

    def convert_tokens_to_string(self, tokens):
        # Specials and control pieces decode to nothing, as in THUDM's tokenizer.
        pieces = [t for t in tokens if t not in self.special_ids]
        return self.sp_model.decode_pieces(pieces)

    def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        n, sp = self.sp_model.vocab_size(), self.sp_model
        dropped = {sp.unk_id(), sp.bos_id(), sp.eos_id()}  # pad, bos, eos decode to nothing, as THUDM's do
        return sp.decode([int(i) for i in token_ids if 0 <= int(i) < n and int(i) not in dropped])

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [self.special_ids["[gMASK]"], self.special_ids["sop"]] + list(token_ids_0)
        if token_ids_1 is not None:
            ids += list(token_ids_1) + [self.eos_token_id]
        return ids

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def build_prompt(self, query: str, history=None) -> str:
        return build_prompt(query, history)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
        if os.path.abspath(path) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, path)
        return (path,)


def train_sentencepiece(lines, model_prefix: str, vocab_size: int = 1000) -> str:
    """Train a small sentencepiece model set up as ChatGLM2's: BPE, piece ids unk 0, bos 1, eos 2, byte
    fallback, digits split, no normalisation (newlines and full-width punctuation survive).

    For tests and the embedded default model; returns the ``.model`` path.
    """
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=model_prefix, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2, hard_vocab_limit=False, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
    )
    return model_prefix + ".model"
