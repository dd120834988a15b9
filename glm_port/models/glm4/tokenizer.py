"""GLM-4's tokenizer (THUDM ``glm-4-9b-chat`` / ``glm-4-9b``): a tiktoken rank file plus fourteen specials.

The facts, and where each comes from in THUDM's published code, are in docs/glm4.md. In short:
``tokenizer.model`` is a tiktoken rank file (one ``base64(token bytes) rank`` a line; 151329 ranks in
the published one), split before merging by ``PAT_STR``; the specials ``SPECIAL_TOKENS`` are numbered
right after the ranks (``<|endoftext|>`` 151329 ... ``<|end_of_video|>`` 151342 on the real file),
``<|endoftext|>`` is eos and pad, batches are padded on the left, every input starts ``[gMASK]<sop>``.

A chat is ``[gMASK]<sop>``, then per message ``<|role|>`` + ``metadata + "\\n"`` + content, then
``<|assistant|>``. Two ways to write it, as THUDM's two published versions of the tokenizer did:
``build_chat_input`` (the first version's method: each piece of text encoded on its own, a system
message's ``tools`` appended to its content) and ``apply_chat_template`` (the later version's way: the
Jinja ``chat_template`` of ``tokenizer_config.json`` renders the text, which is then tokenized with the
specials recognised; a message with ``tools`` opens a ``<|system|>`` block naming the functions). A
directory as THUDM publishes it carries its own template, which is used as it is; directories this
module writes carry ``CHAT_TEMPLATE``, written here to give the same text for function tools.
"""

from __future__ import annotations

import base64
import json
import os
from functools import lru_cache
from pathlib import Path

import tiktoken
from transformers import AddedToken, BatchEncoding, PreTrainedTokenizer

from glm_port.models.chatglm2.tokenizer import as_messages, save_vocab_file  # as ChatGLM3's

# How GLM-4 splits text before merging (ChatGLM4Tokenizer.__init__'s ``pat_str``): cl100k's pattern with
# letters-only words and numbers of at most three digits.
PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                  "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
                  "<|begin_of_video|>", "<|end_of_video|>")  # ids: len(ranks) + position here
ROLES = ("system", "user", "assistant", "observation")
EOS_TOKEN = "<|endoftext|>"
STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")  # generation_config's eos_token_id list
PREFIX_TOKENS = ("[gMASK]", "<sop>")

# The system text GLM-4-9B-Chat was trained with for function calls (tokenizer_config.json's chat_template):
# a preamble, a "# 可用工具" (available tools) header, per function "## name" + its JSON, and an instruction.
TOOLS_PREAMBLE = ("你是一个名为 GLM-4 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，"
                  "你的任务是针对用户的问题和要求提供适当的答复和支持。")
TOOLS_HEADER = "\n\n# 可用工具"
TOOL_INSTRUCTION = "\n在调用上述函数时，请使用 Json 格式表示调用的参数。"

# Written here (not THUDM's text): the same output as THUDM's template for messages and ``function`` tools;
# THUDM's built-in tools (python, simple_browser, cogview) are refused, their long descriptions not carried.
# The tags stand where THUDM's stand: transformers renders with ``trim_blocks``, which drops the first newline
# after a block tag, so the "\n\n## name" after ``{% if %}`` comes out as "\n## name", as in THUDM's.
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}<|system|>\n" + TOOLS_PREAMBLE
    + TOOLS_HEADER + "{% for tool in item['tools'] %}{% if tool['type'] == 'function' %}"
    "\n\n## {{ tool['function']['name'] }}\n\n{{ tool['function'] | tojson(indent=4) }}" + TOOL_INSTRUCTION
    + "{% else %}{{ raise_exception('GLM-4 chat template: only function tools are written here, not '"
    " ~ tool['type']) }}{% endif %}{% endfor %}{% endif %}"
    "{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@lru_cache(maxsize=1)
def byte_symbols() -> tuple[dict[int, str], dict[str, int]]:
    """A printable character for each byte (GPT-2's byte-level alphabet): a rank's bytes as a token string."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars, {c: b for b, c in chars.items()}


def token_string(data: bytes) -> str:
    chars = byte_symbols()[0]
    return "".join(chars[b] for b in data)


def token_bytes(token: str) -> bytes:
    back = byte_symbols()[1]
    return bytes(back[c] for c in token)


def read_rank_file(path) -> dict[bytes, int]:
    """The ranks of a tiktoken rank file (``base64 rank`` a line). Ranks must be 0..n-1, each once."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a tiktoken rank line ('base64 rank'): {exc}") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def write_rank_file(ranks: dict[bytes, int], path) -> str:
    """Write ``ranks`` as a tiktoken rank file, by rank; returns the path."""
    with open(path, "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    return str(path)


def ranks_from_tokenizer_json(path) -> dict[bytes, int]:
    """The tiktoken ranks behind a ``tokenizer.json`` made from a GLM-4 rank file (transformers'
    ``TikTokenConverter``, as glm-4-9b-chat-hf's is): its byte-level BPE vocabulary, each token's bytes at its id.
    A ValueError (one line) for a file that is not such a tokenizer: not byte-level BPE, another pre-split
    pattern, ids that are not 0..n-1, or GLM-4's specials missing or at other ids than n + i."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        model, added = data["model"], data.get("added_tokens") or []
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a tokenizers file ({type(error).__name__}: {error})") from None
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ValueError(f"{path}: not a byte-level BPE vocabulary, as GLM-4's is")
    patterns = json.dumps(data.get("pre_tokenizer"))
    if json.dumps(PAT_STR)[1:-1] not in patterns:
        raise ValueError(f"{path}: its pre-tokenizer does not split with GLM-4's pattern")
    specials = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    try:
        ranks = {token_bytes(token): int(i) for token, i in model["vocab"].items() if token not in specials}
    except KeyError:
        raise ValueError(f"{path}: a vocabulary token is not byte-level (GPT-2's byte alphabet)") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the vocabulary's ids are not 0..{len(ranks) - 1}, each once")
    for i, token in enumerate(SPECIAL_TOKENS):
        if specials.get(token) != len(ranks) + i:
            raise ValueError(f"{path}: {token!r} is at id {specials.get(token)}, GLM-4's is {len(ranks) + i} "
                             f"({len(ranks)} ranks)")
    return ranks


def function_tool(tool: dict) -> dict:
    """A tool as the chat template takes it: ``{"type": "function", "function": {...}}`` (a bare function
    dict, as the first build_chat_input took, is wrapped)."""
    return tool if "type" in tool else {"type": "function", "function": tool}


class GLM4Tokenizer(PreTrainedTokenizer):
    """``AutoTokenizer``-style tokenizer for GLM-4 directories (a tiktoken ``tokenizer.model``).

    The fourteen specials are added tokens at ``len(ranks) + i`` (as THUDM's ``tokenizer_config.json``
    declares them; a directory declaring other ids for them is refused). Text encodes with tiktoken; specials
    written in text become their ids (as THUDM's tokenizer does), except inside ``build_chat_input``, which
    encodes message text as plain text (as THUDM's did). ``decode`` writes specials by name with no spaces,
    ``skip_special_tokens`` drops them.
    """

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]
    chat_format = "glm4"  # GLM-4's one chat format (glm-chat, glm-serve read it as ChatGLM2's tokenizers say theirs)

    def __init__(self, vocab_file, padding_side="left", clean_up_tokenization_spaces=False, chat_template=None,
                 **kwargs):
        if not os.path.isfile(vocab_file):
            raise ValueError(f"GLM-4 tokenizer: no tiktoken rank file at {vocab_file}")
        self.vocab_file = vocab_file
        self.ranks = read_rank_file(vocab_file)
        n = len(self.ranks)
        self.special_ids = {token: n + i for i, token in enumerate(SPECIAL_TOKENS)}
        self.special_names = {i: token for token, i in self.special_ids.items()}
        self.encoding = tiktoken.Encoding(name=f"glm4-{n}", pat_str=PAT_STR, mergeable_ranks=self.ranks,
                                          special_tokens=self.special_ids)
        self.decoder = {rank: token for token, rank in self.ranks.items()}
        declared = kwargs.pop("added_tokens_decoder", None) or {}
        for index, token in declared.items():
            content = token.content if isinstance(token, AddedToken) else (
                token["content"] if isinstance(token, dict) else str(token))
            if self.special_ids.get(content) != int(index):
                raise ValueError(f"GLM-4 tokenizer: {content!r} is declared at id {index}, but the rank file "
                                 f"({n} ranks) puts GLM-4's specials at {n}..{n + len(SPECIAL_TOKENS) - 1} "
                                 f"({content!r}: {self.special_ids.get(content, 'not one of them')})")
        self._added_tokens_decoder = {
            i: AddedToken(token, lstrip=False, rstrip=False, single_word=False, normalized=False, special=True)
            for token, i in self.special_ids.items()}
        for key in ("eos_token", "pad_token", "unk_token", "bos_token", "additional_special_tokens",
                    "extra_special_tokens", "tokenizer_class", "auto_map", "encode_special_tokens"):
            kwargs.pop(key, None)
        super().__init__(padding_side=padding_side, clean_up_tokenization_spaces=clean_up_tokenization_spaces,
                         eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, chat_template=chat_template or CHAT_TEMPLATE,
                         **kwargs)

    # ---------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """The rank file's size (as THUDM's ``vocab_size``); ``len(tokenizer)`` counts the specials too."""
        return len(self.ranks)

    def get_vocab(self):
        vocab = {token_string(token): rank for token, rank in self.ranks.items()}
        vocab.update(self.special_ids)
        return vocab

    def get_command(self, token: str) -> int:
        """Id of a special (``[gMASK]``, ``<sop>``, ``<|user|>``, ...)."""
        if token not in self.special_ids:
            raise ValueError(f"{token!r} is not a GLM-4 special token ({', '.join(SPECIAL_TOKENS)})")
        return self.special_ids[token]

    @property
    def stop_ids(self) -> list[int]:
        """The ids generation stops at (GLM-4's ``eos_token_id`` list): ``<|endoftext|>``, ``<|user|>``,
        ``<|observation|>``."""
        return [self.special_ids[token] for token in STOP_TOKENS]

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids with tiktoken, specials written in it taken as text (THUDM's
        ``tokenizer.encode(text, disallowed_special=())``)."""
        return self.encoding.encode(text, disallowed_special=())

    def _tokenize(self, text, **kwargs):
        return [token_string(self.decoder[i]) for i in self.encode_text(text)]

    def _convert_token_to_id(self, token):
        if token in self.special_ids:
            return self.special_ids[token]
        return self.ranks[token_bytes(token)]

    def _convert_id_to_token(self, index):
        if index in self.special_names:
            return self.special_names[index]
        return token_string(self.decoder[index])

    def convert_tokens_to_string(self, tokens):
        return self._decode([self._convert_token_to_id(token) for token in tokens])

    def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        ids = [int(i) for i in token_ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_names]
        unknown = [i for i in ids if i not in self.decoder and i not in self.special_names]
        if unknown:
            raise ValueError(f"GLM-4 tokenizer: ids {unknown[:5]} are outside the vocabulary "
                             f"(0..{len(self.ranks) + len(SPECIAL_TOKENS) - 1})")
        return self.encoding.decode(ids, errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [self.special_ids[t] for t in PREFIX_TOKENS] + list(token_ids_0)
        if token_ids_1 is not None:
            ids += list(token_ids_1) + [self.eos_token_id]
        return ids

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i in self.special_names) for i in token_ids_0]
        mask = [1, 1] + [0] * len(token_ids_0)
        return mask + [0] * len(token_ids_1) + [1] if token_ids_1 is not None else mask

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    # ---------------------------------------------------------------- THUDM's build_chat_input
    def build_single_message(self, role: str, metadata: str, message: str) -> list[int]:
        """``<|role|>`` + ``metadata + "\\n"`` + ``message``, the two texts encoded separately as plain text."""
        if role not in ROLES:
            raise ValueError(f"chat role {role!r} is not one of {', '.join(ROLES)}")
        return [self.get_command(f"<|{role}|>")] + self.encode_text(f"{metadata}\n") + self.encode_text(message)

    def build_chat_input(self, query: str, history=None, role: str = "user"):
        """The prompt of a conversation as THUDM's first ``ChatGLM4Tokenizer.build_chat_input`` writes it, a
        batch of one (``input_ids``, ``attention_mask``; pt tensors).

        ``history``: message dicts ``{"role", "content"[, "metadata"][, "tools"]}``; a system message's
        ``tools`` (function dicts, or ``{"type": "function", "function": ...}``) are appended to its content,
        each as ``"\\n\\n## name\\n\\n" + JSON (indent 4)`` and the JSON instruction. ``(query, response)``
        pairs are read as a user and an assistant message. The new ``query`` is a ``role`` message;
        ``<|assistant|>`` ends the prompt.
        """
        ids = [self.special_ids[t] for t in PREFIX_TOKENS]
        for message in as_messages(history):
            content = message["content"]
            if message["role"] == "system" and "tools" in message:
                for tool in message["tools"]:
                    function = function_tool(tool)["function"]
                    content += f"\n\n## {function['name']}\n\n{json.dumps(function, ensure_ascii=False, indent=4)}"
                    content += TOOL_INSTRUCTION
            ids += self.build_single_message(message["role"], message.get("metadata", ""), content)
        ids += self.build_single_message(role, "", query) + [self.get_command("<|assistant|>")]
        return BatchEncoding({"input_ids": [ids], "attention_mask": [[1] * len(ids)]}, tensor_type="pt")

    # ---------------------------------------------------------------- files
    def save_vocabulary(self, save_directory, filename_prefix=None):
        return save_vocab_file(self, save_directory, filename_prefix)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, then ``tokenizer_config.json`` completed as THUDM's reads: the specials'
        ``added_tokens_decoder`` at their ids and listed as ``additional_special_tokens`` (so that THUDM's
        ``decode(skip_special_tokens=True)`` drops them), eos/pad ``<|endoftext|>``, left padding, and the
        ``chat_template`` in the file itself (transformers 5 writes it to ``chat_template.jinja``, which older
        transformers do not read)."""
        files = super().save_pretrained(save_directory, *args, **kwargs)
        path = Path(save_directory) / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        config.update({
            "added_tokens_decoder": {
                str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True} for token, i in self.special_ids.items()},
            "additional_special_tokens": list(SPECIAL_TOKENS), "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN,
            "padding_side": "left",
            "clean_up_tokenization_spaces": False, "chat_template": self.chat_template,
            "tokenizer_class": type(self).__name__,
        })
        config.pop("extra_special_tokens", None)
        path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        jinja = Path(save_directory) / "chat_template.jinja"
        if jinja.is_file():
            jinja.unlink()
            files = tuple(f for f in files if Path(f) != jinja)
        return files


__all__ = ["CHAT_TEMPLATE", "EOS_TOKEN", "GLM4Tokenizer", "PAT_STR", "PREFIX_TOKENS", "ROLES", "SPECIAL_TOKENS",
           "STOP_TOKENS", "TOOLS_HEADER", "TOOLS_PREAMBLE", "TOOL_INSTRUCTION", "as_messages", "function_tool",
           "ranks_from_tokenizer_json", "read_rank_file", "token_bytes", "token_string", "write_rank_file"]
