"""ChatGLM2's and ChatGLM3's tokenizer: a sentencepiece ``tokenizer.model`` plus specials numbered after it.

As THUDM's ``tokenization_chatglm.py`` numbers them: the sentencepiece pieces keep their ids (``<unk>``
0 is also the pad, ``<s>`` 1, ``</s>`` 2 the end of a reply), then ``[MASK]``, ``[gMASK]``,
``[sMASK]``, ``sop``, ``eop`` take the next five ids (ChatGLM2-6B's 64789-piece model: 64789..64793).
Every input starts ``[gMASK] sop``; batches are padded on the left. ``build_prompt`` writes ChatGLM2's
chat format ``[Round i]\\n\\n问：...\\n\\n答：...``.

ChatGLM3 ships the same ``tokenizer.model``; its tokenizer code adds four role tokens after the five
(``<|system|>`` ``<|user|>`` ``<|assistant|>`` ``<|observation|>``: 64794..64797 on the real vocabulary)
and chats in messages: ``build_chat_input`` gives ``[gMASK] sop``, then per message ``<|role|>`` +
``metadata + "\\n"`` + content (each piece of text encoded on its own), then ``<|assistant|>``. Which
format a tokenizer speaks is ``chat_format`` ("chatglm2" / "chatglm3"): given, or found by
``detect_chat_format`` in the files next to ``tokenizer.model``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import sentencepiece as spm
from transformers import BatchEncoding, PreTrainedTokenizer

SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop")
ROLES = ("system", "user", "assistant", "observation")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)  # ChatGLM3's, numbered after SPECIAL_TOKENS
CHAT_FORMATS = ("chatglm2", "chatglm3")


def detect_chat_format(directory) -> str:
    """"chatglm3" when the files of a tokenizer directory say it is ChatGLM3's, else "chatglm2".

    ChatGLM3's ``tokenizer.model`` is byte for byte ChatGLM2's, so the sign is elsewhere: a
    ``tokenizer_config.json`` with our ``chat_format``, or naming a role token (THUDM's later
    ``added_tokens_decoder`` / ``chat_template``) or a ``chatglm3`` model (``name_or_path``); a
    ``config.json`` whose ``_name_or_path`` names ``chatglm3``; THUDM's ``tokenization_chatglm.py`` shipped
    alongside with the role tokens in it (read as text, never run).
    """
    directory = Path(directory)
    config = _read_json(directory / "tokenizer_config.json")
    if config.get("chat_format") in CHAT_FORMATS:
        return config["chat_format"]
    if any(token in json.dumps(config, ensure_ascii=False) for token in ROLE_TOKENS):
        return "chatglm3"
    names = [config.get("name_or_path"), config.get("_name_or_path"),
             _read_json(directory / "config.json").get("_name_or_path")]
    if any(isinstance(name, str) and "chatglm3" in name.lower() for name in names):
        return "chatglm3"
    code = directory / "tokenization_chatglm.py"
    if code.is_file() and "<|observation|>" in code.read_text(encoding="utf-8", errors="replace"):
        return "chatglm3"
    return "chatglm2"


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def build_prompt(query: str, history=None) -> str:
    """The chat prompt of ChatGLM2's ``build_prompt``: each past ``(query, response)`` as a numbered round,
    then the new query with an open ``答：``."""
    prompt = ""
    for i, (old_query, response) in enumerate(history or []):
        prompt += f"[Round {i + 1}]\n\n问：{old_query}\n\n答：{response}\n\n"
    return prompt + f"[Round {len(history or []) + 1}]\n\n问：{query}\n\n答："


class ChatGLM2Tokenizer(PreTrainedTokenizer):
    """``AutoTokenizer``-style tokenizer for ChatGLM2 / ChatGLM3 directories (``tokenizer.model``).

    ``chat_format``: "chatglm2" (five specials, ``build_prompt``) or "chatglm3" (nine, ``build_chat_input``);
    None finds it in the files next to ``vocab_file`` (``detect_chat_format``). ``encode_special_tokens``
    (ChatGLM3, as THUDM's option): role tokens written in text become the role ids instead of text pieces.
    """

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, padding_side="left", clean_up_tokenization_spaces=False, chat_format=None,
                 encode_special_tokens=False, **kwargs):
        if not os.path.isfile(vocab_file):
            raise ValueError(f"ChatGLM2 tokenizer: no sentencepiece model at {vocab_file}")
        if chat_format is None:
            chat_format = detect_chat_format(os.path.dirname(os.path.abspath(vocab_file)))
        if chat_format not in CHAT_FORMATS:
            raise ValueError(f"ChatGLM2 tokenizer: chat_format {chat_format!r} is not one of {', '.join(CHAT_FORMATS)}")
        self.vocab_file = vocab_file
        self.chat_format = chat_format
        self.encode_special_tokens = bool(encode_special_tokens)
        self.sp_model = spm.SentencePieceProcessor(model_file=vocab_file)
        n = self.sp_model.vocab_size()
        self.command_tokens = SPECIAL_TOKENS + (ROLE_TOKENS if chat_format == "chatglm3" else ())
        self.special_ids = {token: n + i for i, token in enumerate(self.command_tokens)}
        self.special_names = {i: token for token, i in self.special_ids.items()}
        for key in ("unk_token", "pad_token", "eos_token", "bos_token"):
            kwargs.pop(key, None)
        super().__init__(
            padding_side=padding_side, clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            unk_token="<unk>", pad_token="<unk>", eos_token="</s>", chat_format=chat_format,
            encode_special_tokens=self.encode_special_tokens, **kwargs,
        )

    @property
    def is_chatglm3(self) -> bool:
        return self.chat_format == "chatglm3"

    @property
    def vocab_size(self) -> int:
        return self.sp_model.vocab_size() + len(self.command_tokens)

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
            raise ValueError(f"{token!r} is not a {self.chat_format} special token ({', '.join(self.command_tokens)})")
        return self.special_ids[token]

    def _tokenize(self, text, **kwargs):
        if not (self.encode_special_tokens and self.is_chatglm3):
            return self.sp_model.encode(text, out_type=str)
        pieces = []
        for i, part in enumerate(re.split("(" + "|".join(map(re.escape, ROLE_TOKENS)) + ")", text)):
            pieces += [part] if i % 2 else (self.sp_model.encode(part, out_type=str) if part else [])
        return pieces

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
        ids = [int(i) for i in token_ids if int(i) not in dropped]
        if not self.is_chatglm3 or skip_special_tokens:
            return sp.decode([i for i in ids if 0 <= i < n])
        # ChatGLM3's decode writes the specials out by name (its replies are split at "<|assistant|>"): as
        # THUDM's under transformers 4.x, one sentencepiece decode of the pieces, the names among them.
        names = self.special_names
        return sp.decode_pieces([names[i] if i in names else sp.id_to_piece(i) for i in ids if i in names or 0 <= i < n])

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [self.special_ids["[gMASK]"], self.special_ids["sop"]] + list(token_ids_0)
        if token_ids_1 is not None:
            ids += list(token_ids_1) + [self.eos_token_id]
        return ids

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def build_prompt(self, query: str, history=None) -> str:
        """ChatGLM2's ``[Round i]`` prompt text (the tokenizer adds ``[gMASK] sop``); ChatGLM3 chats through
        ``build_chat_input`` instead (this text stays available to both, e.g. for ADGEN finetuning)."""
        return build_prompt(query, history)

    # ---------------------------------------------------------------- ChatGLM3's chat format
    def build_single_message(self, role: str, metadata: str, message: str) -> list[int]:
        """``<|role|>`` + ``metadata + "\\n"`` + ``message``, the two texts encoded separately (ChatGLM3)."""
        if role not in ROLES:
            raise ValueError(f"chat role {role!r} is not one of {', '.join(ROLES)}")
        return [self.get_command(f"<|{role}|>")] + self.sp_model.encode(f"{metadata}\n") + self.sp_model.encode(message)

    def build_chat_input(self, query: str, history=None, role: str = "user"):
        """The ChatGLM3 prompt of a conversation, as a batch of one (``input_ids``, ``attention_mask``; pt tensors).

        ``history``: THUDM's message dicts ``{"role", "content"[, "metadata"][, "tools"]}`` (a system message's
        ``tools`` are appended to its content as indented JSON); ``(query, response)`` pairs are read as a user
        and an assistant message. The new ``query`` is a ``role`` message; ``<|assistant|>`` ends the prompt.
        """
        if not self.is_chatglm3:
            raise ValueError("build_chat_input is ChatGLM3's chat format; this tokenizer's chat_format is chatglm2 "
                             "(build_prompt)")
        ids = []
        for message in as_messages(history):
            content = message["content"]
            if message["role"] == "system" and "tools" in message:
                content = content + "\n" + json.dumps(message["tools"], indent=4, ensure_ascii=False)
            ids += self.build_single_message(message["role"], message.get("metadata", ""), content)
        ids += self.build_single_message(role, "", query) + [self.get_command("<|assistant|>")]
        ids = self.build_inputs_with_special_tokens(ids)
        return BatchEncoding({"input_ids": [ids], "attention_mask": [[1] * len(ids)]}, tensor_type="pt")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        return save_vocab_file(self, save_directory, filename_prefix)


def as_messages(history) -> list[dict]:
    """ChatGLM3's history as message dicts: dicts as they are, ``(query, response)`` pairs as user + assistant."""
    messages = []
    for item in history or []:
        if isinstance(item, dict):
            if not {"role", "content"} <= item.keys():
                raise ValueError(f"chat history message {item!r} needs a 'role' and a 'content'")
            messages.append(item)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            messages += [{"role": "user", "content": item[0]}, {"role": "assistant", "content": item[1]}]
        else:
            raise ValueError(f"chat history item {item!r} is neither a message dict nor a (query, response) pair")
    return messages


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


# ---------------------------------------------------------------- transformers' own fast tokenizer
# Chat templates (Jinja, as transformers' apply_chat_template and vLLM render them) writing the prompts of
# ``chat.encode_messages``. The text between added tokens gets sentencepiece's dummy prefix ("▁") in the fast
# tokenizer, as each separately encoded text does here; ChatGLM3's ``metadata + "\n"`` and content are two
# encodes, so the content follows the newline after a space (the dummy prefix of its own encode).
CHATGLM2_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='', round=0) -%}"
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{%- set content = message.get('content') or '' -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = ns.system + content -%}"
    "{%- elif message['role'] == 'user' -%}{%- set ns.round = ns.round + 1 -%}"
    "{{ '[Round ' ~ ns.round ~ ']\\n\\n问：' ~ ns.system ~ content ~ '\\n\\n答：' }}{%- set ns.system = '' -%}"
    "{%- elif message['role'] == 'assistant' -%}{{ content ~ '\\n\\n' }}"
    "{%- else -%}{{ raise_exception('chatglm2\\'s chat format has system, user and assistant messages only') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
CHATGLM3_CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- set rest = messages -%}"
    "{%- if tools -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0].get('content') or '' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '" + "Answer the following questions as best as you can. You have access to the "
    "following tools:" + "' -%}{%- endif -%}"
    "{%- set ns = namespace(functions=[]) -%}"
    "{%- for tool in tools -%}{%- set ns.functions = ns.functions + [tool['function'] if tool['function'] is "
    "defined else tool] -%}{%- endfor -%}"
    "{{ '<|system|>\\n ' ~ system ~ '\\n' ~ (ns.functions | tojson(indent=4)) }}"
    "{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- set role = 'observation' if message['role'] == 'tool' else message['role'] -%}"
    "{%- if role not in ('system', 'user', 'assistant', 'observation') -%}"
    "{{ raise_exception('chatglm3\\'s chat format has system, user, assistant and tool/observation messages') }}"
    "{%- endif -%}"
    "{%- set content = message.get('content') or '' -%}"
    "{%- if role == 'system' and message.get('tools') -%}"
    "{%- set content = content ~ '\\n' ~ (message['tools'] | tojson(indent=4)) -%}{%- endif -%}"
    "{{ '<|' ~ role ~ '|>' ~ (message.get('metadata') or '') ~ '\\n' }}"
    "{%- if content -%}{{ ' ' ~ content }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
# The names of sop and eop in the fast tokenizer: transformers matches an added token's name anywhere in text
# ("people" holds "eop"), so they carry GLM-4's angle brackets; their ids are THUDM's.
FAST_NAMES = {"sop": "<sop>", "eop": "<eop>"}


def sentencepiece_to_tokenizers(path):
    """``(tokenizers.Tokenizer, {piece: id})``: a sentencepiece BPE model as a ``tokenizers`` BPE that encodes as
    ``SentencePieceProcessor.encode`` does (no specials of its own).

    Pieces keep their ids; merges are every split of a normal piece into two normal pieces, ranked by the merged
    piece's score (sentencepiece's BPE joins the best-scoring adjacent pair); byte fallback as the model says.
    The normaliser follows the model's ``normalizer_spec`` in sentencepiece's order: its precompiled character
    map, extra whitespace removal, the dummy prefix ("▁" before each text, ``Prepend``: tokenizers normalises
    each text between added tokens on its own, as each is a separate encode here), spaces as "▁". Pieces a
    user defined are matched whole and never merged, as sentencepiece does. (transformers 5.24's
    ``SpmConverter.build_tokenizer_from_spm_proto`` builds the same; earlier 5.x releases' did not, hence our own.)
    """
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
        raise ValueError(f"{path}: a sentencepiece {kind} model; ChatGLM2's is BPE")
    piece_type = sentencepiece_model_pb2.ModelProto.SentencePiece
    normal, user = piece_type.NORMAL, piece_type.USER_DEFINED
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    scores = {piece.piece: (piece.score, i) for i, piece in enumerate(proto.pieces) if piece.type == normal}
    ranked = sorted((-scores[piece][0], scores[piece][1], piece[:k], piece[k:]) for piece in scores
                    for k in range(1, len(piece)) if piece[:k] in scores and piece[k:] in scores)
    user_defined = [piece.piece for piece in proto.pieces if piece.type == user]
    backend = Tokenizer(BPE(vocab=vocab, merges=[(left, right) for _, _, left, right in ranked],
                            unk_token=proto.trainer_spec.unk_piece, fuse_unk=True,
                            byte_fallback=proto.trainer_spec.byte_fallback, ignore_merges=bool(user_defined)))
    spec, steps = proto.normalizer_spec, []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only: sentencepiece leaves newlines and tabs alone
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    backend.normalizer = normalizers.Sequence(steps)
    if user_defined:
        pattern = "|".join(re.escape(piece) for piece in sorted(user_defined, key=len, reverse=True))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    steps = [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if proto.trainer_spec.byte_fallback else [])
    steps.append(decoders.Fuse())
    if spec.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend, vocab


def to_fast_tokenizer(tokenizer: ChatGLM2Tokenizer):
    """transformers' own fast tokenizer (``PreTrainedTokenizerFast`` over ``sentencepiece_to_tokenizers``' BPE of
    ``tokenizer.model``) giving ``tokenizer``'s ids with no remote code: the specials at their ids, ``[gMASK]
    <sop>`` prefixed by the post-processor, left padding, and the chat format as ``chat_template``.
    ``save_pretrained`` writes ``tokenizer.json`` + ``tokenizer_config.json``."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    backend, vocab = sentencepiece_to_tokenizers(tokenizer.vocab_file)
    names = {token: FAST_NAMES.get(token, token) for token in tokenizer.command_tokens}
    # the pieces' own specials (split out of text, as the slow tokenizer does), then the commands at n, n+1, ...
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "</s>")])
    added = backend.add_special_tokens([AddedToken(names[t], special=True, normalized=False)
                                        for t in tokenizer.command_tokens])
    ids = {token: backend.token_to_id(names[token]) for token in tokenizer.command_tokens}
    if added != len(tokenizer.command_tokens) or ids != tokenizer.special_ids:
        raise ValueError(f"{tokenizer.vocab_file}: the specials would not get THUDM's ids {tokenizer.special_ids}")
    gmask, sop, eos = (names["[gMASK]"], ids["[gMASK]"]), (names["sop"], ids["sop"]), ("</s>", vocab["</s>"])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{gmask[0]} {sop[0]} $A", pair=f"{gmask[0]} {sop[0]} $A $B:1 </s>:1",
        special_tokens=[gmask, sop, eos])
    template = CHATGLM3_CHAT_TEMPLATE if tokenizer.is_chatglm3 else CHATGLM2_CHAT_TEMPLATE
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<unk>", eos_token="</s>", padding_side="left",
        clean_up_tokenization_spaces=False, chat_template=template, chat_format=tokenizer.chat_format,
        model_max_length=tokenizer.model_max_length)


def save_fast_tokenizer(tokenizer: ChatGLM2Tokenizer, directory, model_max_length: int | None = None,
                        fast=None) -> None:
    """Write ``to_fast_tokenizer(tokenizer)`` into ``directory`` as transformers 4.x and 5.x both read it with no
    remote code: ``tokenizer.json``, and a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and
    holding the ``chat_template`` (transformers 5 would put the template in a ``chat_template.jinja`` of its own,
    which older readers, vLLM's among them, miss)."""
    fast = fast if fast is not None else to_fast_tokenizer(tokenizer)  # ``fast``: made already, to fail early
    if model_max_length is not None:
        fast.model_max_length = model_max_length
    fast.save_pretrained(directory)
    path = Path(directory) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=fast.chat_template,
                  model_max_length=fast.model_max_length)
    config.pop("backend", None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (Path(directory) / "chat_template.jinja").unlink(missing_ok=True)


def save_vocab_file(tokenizer, save_directory, filename_prefix=None) -> tuple[str]:
    """transformers' ``save_vocabulary`` for a tokenizer whose vocabulary is one file (``vocab_file``): copied into
    ``save_directory`` under its name (with ``filename_prefix``), unless it is already there."""
    name = (filename_prefix + "-" if filename_prefix else "") + tokenizer.vocab_files_names["vocab_file"]
    path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
    if os.path.abspath(path) != os.path.abspath(tokenizer.vocab_file):
        shutil.copyfile(tokenizer.vocab_file, path)
    return (path,)
