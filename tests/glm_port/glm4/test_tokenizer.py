"""GLM-4's tokenizer on the tiny rank file trained here: the rank file, the specials' ids, the chat layouts
(build_chat_input and the chat template), padding, save/load. THUDM's own code is compared in
test_reference.py when a copy is given."""

import base64
import json
import os
import runpy
from pathlib import Path

import pytest

from glm_port.models.glm4 import GLM4Tokenizer
from glm_port.models.glm4.tiny import train_ranks
from glm_port.models.glm4.tokenizer import (
    SPECIAL_TOKENS,
    TOOL_INSTRUCTION,
    TOOLS_HEADER,
    TOOLS_PREAMBLE,
    read_rank_file,
    write_rank_file,
)

CASES = runpy.run_path(str(Path(__file__).with_name("cases.py")))
CONVERSATIONS, TEXTS, as_chat_input = CASES["CONVERSATIONS"], CASES["TEXTS"], CASES["as_chat_input"]


# ---------------------------------------------------------------- the rank file
def test_tiny_rank_file_is_laid_out_as_glm4s(rank_file):
    ranks = read_rank_file(rank_file)
    assert all(ranks[bytes([b])] == b for b in range(256))  # the single bytes first, at their byte value
    assert len(ranks) > 600 and sorted(ranks.values()) == list(range(len(ranks)))
    lines = Path(rank_file).read_text(encoding="ascii").splitlines()
    token, rank = lines[300].split()
    assert int(rank) == 300 and ranks[base64.b64decode(token)] == 300  # "base64 rank", by rank


def test_rank_file_round_trip(tmp_path, rank_file):
    ranks = read_rank_file(rank_file)
    again = write_rank_file(ranks, tmp_path / "copy.model")
    assert read_rank_file(again) == ranks
    assert Path(again).read_bytes() == Path(rank_file).read_bytes()


def test_ranks_follow_merge_order():
    ranks = train_ranks(["abab abab abab cdcd cdcd"] * 5, vocab_size=300)
    merged = sorted((r, t) for t, r in ranks.items() if r >= 256)
    # each merged token is made of two earlier ones, so tiktoken can reach it
    for rank, token in merged:
        assert any(token[:i] in ranks and token[i:] in ranks and max(ranks[token[:i]], ranks[token[i:]]) < rank
                   for i in range(1, len(token)))


@pytest.mark.parametrize("text", TEXTS + ["", "日本語と中文の混在 text ✓"])
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert all(0 <= i < tok.vocab_size for i in ids) or "[gMASK]" in text
    assert tok.decode(ids) == text


def test_bad_rank_files_are_refused(tmp_path):
    gap = tmp_path / "gap.model"
    gap.write_text(f"{base64.b64encode(b'a').decode()} 0\n{base64.b64encode(b'b').decode()} 2\n")
    with pytest.raises(ValueError, match="not 0..1"):
        read_rank_file(gap)
    bad = tmp_path / "bad.model"
    bad.write_text("not-a-rank-line\n")
    with pytest.raises(ValueError, match="bad.model:1"):
        read_rank_file(bad)
    with pytest.raises(ValueError, match="no tiktoken rank file"):
        GLM4Tokenizer(str(tmp_path / "absent.model"))


# ---------------------------------------------------------------- specials
def test_special_ids_follow_the_ranks(tok, rank_file):
    n = len(read_rank_file(rank_file))
    assert tok.vocab_size == n and len(tok) == n + 14
    assert [tok.get_command(t) for t in SPECIAL_TOKENS] == list(range(n, n + 14))
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(n, n + 14))
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.eos_token_id == tok.pad_token_id == n
    assert tok.stop_ids == [n, n + 7, n + 9]  # <|endoftext|>, <|user|>, <|observation|>
    assert tok.encode("hi")[:2] == [n + 2, n + 4]  # [gMASK] <sop>
    with pytest.raises(ValueError, match="not a GLM-4 special"):
        tok.get_command("sop")


def test_specials_in_text(tok):
    n = tok.vocab_size
    ids = tok.encode("a<|user|>b", add_special_tokens=False)
    assert n + 7 in ids  # written in text, a special is its id (as THUDM's added tokens)
    assert n + 7 not in tok.encode_text("a<|user|>b")  # build_chat_input's plain encoding
    assert tok.decode(ids) == "a<|user|>b"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_declared_ids_must_match_the_rank_file(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    n = tok.vocab_size
    assert {int(k): v["content"] for k, v in config["added_tokens_decoder"].items()} == {
        n + i: t for i, t in enumerate(SPECIAL_TOKENS)}
    config["added_tokens_decoder"] = {"151329": {"content": "<|endoftext|>", "special": True}}  # the real file's id
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="declared at id 151329"):
        GLM4Tokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------- the chat layouts
def _role(tok, role):
    return tok.get_command(f"<|{role}|>")


def test_single_turn(tok):
    ids = tok.build_chat_input("你好")["input_ids"][0].tolist()
    expected = [tok.get_command("[gMASK]"), tok.get_command("<sop>"), _role(tok, "user"), *tok.encode_text("\n"),
                *tok.encode_text("你好"), _role(tok, "assistant")]
    assert ids == expected
    assert tok.decode(ids) == "[gMASK]<sop><|user|>\n你好<|assistant|>"
    assert tok.apply_chat_template(CONVERSATIONS["single"], add_generation_prompt=True, return_dict=False) == expected


def test_multi_turn(tok):
    query, history, role = as_chat_input(CONVERSATIONS["multi"])
    ids = tok.build_chat_input(query, history, role=role)["input_ids"][0].tolist()
    assert tok.decode(ids) == ("[gMASK]<sop><|user|>\nHello<|assistant|>\nHi! How can I help?<|user|>\nWhat is 2+2?"
                               "<|assistant|>\n4<|user|>\n谢谢，再见。<|assistant|>")
    pairs = [("Hello", "Hi! How can I help?"), ("What is 2+2?", "4")]
    assert tok.build_chat_input(query, pairs)["input_ids"][0].tolist() == ids  # (query, response) pairs
    text = tok.apply_chat_template(CONVERSATIONS["multi"], add_generation_prompt=True, tokenize=False)
    assert text == tok.decode(ids)


def test_system_and_tools(tok):
    query, history, role = as_chat_input(CONVERSATIONS["tools"])
    ids = tok.build_chat_input(query, history, role=role)["input_ids"][0].tolist()
    weather, clock = (tool["function"] for tool in CONVERSATIONS["tools"][0]["tools"])
    functions = "".join(f"\n\n## {f['name']}\n\n{json.dumps(f, ensure_ascii=False, indent=4)}{TOOL_INSTRUCTION}"
                        for f in (weather, clock))
    assert tok.decode(ids) == (f"[gMASK]<sop><|system|>\nYou answer about the weather.{functions}"
                               "<|user|>\n北京今天天气怎么样？<|assistant|>")
    # the chat template: a system block of its own naming the functions (one newline before each "## ", as
    # transformers' trim_blocks renders THUDM's template), then the system message's content as a message
    text = tok.apply_chat_template(CONVERSATIONS["tools"], add_generation_prompt=True, tokenize=False)
    block = "".join(f"\n## {f['name']}\n\n{json.dumps(f, ensure_ascii=False, indent=4)}{TOOL_INSTRUCTION}"
                    for f in (weather, clock))
    assert text == (f"[gMASK]<sop><|system|>\n{TOOLS_PREAMBLE}{TOOLS_HEADER}{block}<|system|>\nYou answer about "
                    "the weather.<|user|>\n北京今天天气怎么样？<|assistant|>")
    ids = tok.apply_chat_template(CONVERSATIONS["tools"], add_generation_prompt=True, return_dict=False)
    assert tok.decode(ids) == text and ids.count(_role(tok, "system")) == 2


def test_the_tools_preamble_is_the_final_published_templates(tok):
    """THUDM's glm-4-9b-chat tokenizer_config.json as last published names the assistant "GLM-4" in the tools
    preamble (earlier versions: "ChatGLM", and "GhatGLM" in July 2024's in-code template); docs/glm4.md, "Facts"."""
    text = tok.apply_chat_template(CONVERSATIONS["tools"], add_generation_prompt=True, tokenize=False)
    assert text.startswith("[gMASK]<sop><|system|>\n你是一个名为 GLM-4 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 "
                           "模型开发的，你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具\n## get_weather\n")


def test_observation_turn(tok):
    query, history, role = as_chat_input(CONVERSATIONS["observation"])
    assert role == "observation"
    ids = tok.build_chat_input(query, history, role=role)["input_ids"][0].tolist()
    call = [_role(tok, "assistant"), *tok.encode_text("get_weather\n"), *tok.encode_text('{"city": "北京"}')]
    result = [_role(tok, "observation"), *tok.encode_text("\n"), *tok.encode_text(query), _role(tok, "assistant")]
    start = ids.index(_role(tok, "assistant"))
    assert ids[start:] == call + result
    text = tok.apply_chat_template(CONVERSATIONS["observation"], add_generation_prompt=True, tokenize=False)
    assert text.endswith('<|user|>\n北京天气<|assistant|>get_weather\n{"city": "北京"}'
                         '<|observation|>\n{"temperature": 25, "weather": "晴"}<|assistant|>')


def test_template_refuses_built_in_tools(tok):
    messages = [{"role": "system", "content": "", "tools": [{"type": "python"}]}, {"role": "user", "content": "hi"}]
    with pytest.raises(Exception, match="only function tools"):
        tok.apply_chat_template(messages, tokenize=False)


def test_unknown_role_is_refused(tok):
    with pytest.raises(ValueError, match="chat role 'tool'"):
        tok.build_chat_input("x", [{"role": "tool", "content": "y"}])


# ---------------------------------------------------------------- padding and files
def test_padding_is_left_with_endoftext(tok):
    batch = tok(["hi", "a much longer text than that"], padding=True)
    short, long = batch["input_ids"]
    assert len(short) == len(long)
    pad = len(long) - len(tok("hi")["input_ids"])
    assert pad > 0 and short[:pad] == [tok.pad_token_id] * pad and batch["attention_mask"][0][:pad] == [0] * pad
    assert batch["attention_mask"][0][pad:] == [1] * (len(short) - pad)


def test_save_and_load(tmp_path, tok):
    files = tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.model").read_bytes() == Path(tok.vocab_file).read_bytes()
    assert not (tmp_path / "chat_template.jinja").exists() and all(os.path.exists(f) for f in files)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == tok.chat_template and config["padding_side"] == "left"
    assert config["eos_token"] == config["pad_token"] == "<|endoftext|>"
    again = GLM4Tokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
    for messages in CONVERSATIONS.values():
        assert again.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False)


def test_a_directorys_own_template_is_used(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    text = GLM4Tokenizer.from_pretrained(tmp_path).apply_chat_template(CONVERSATIONS["single"], tokenize=False)
    assert text == "[gMASK]<sop><|user|>你好"


REAL = os.environ.get("GLM4_TOKENIZER")


@pytest.mark.skipif(not REAL, reason="set GLM4_TOKENIZER to glm-4-9b-chat's tokenizer.model to check the real "
                                     "vocabulary")
def test_real_vocabulary():
    tok = GLM4Tokenizer(REAL)
    assert tok.vocab_size == 151329
    assert [tok.get_command(t) for t in SPECIAL_TOKENS] == list(range(151329, 151343))
    assert tok.stop_ids == [151329, 151336, 151338]
    assert tok.build_chat_input("你好")["input_ids"][0].tolist()[:3] == [151331, 151333, 151336]


def test_a_tokenizer_json_from_the_rank_file_gives_the_same_ids(tok):
    """The route to the ``tokenizer.json`` a transformers-native ``glm`` directory carries (glm-4-9b-chat-hf is
    a ``PreTrainedTokenizerFast``): transformers' ``TikTokenConverter`` on the rank file, GLM-4's pattern, the
    specials added in order, gives our ids for text and for the chat template."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from glm_port.models.glm4.tokenizer import PAT_STR

    converted = TikTokenConverter(tok.vocab_file, pattern=PAT_STR, extra_special_tokens=list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=converted.converted(), eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", padding_side="left", chat_template=tok.chat_template)
    assert fast.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [tok.get_command(t) for t in SPECIAL_TOKENS]
    for text in TEXTS:
        assert fast.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False), text
    for messages in CONVERSATIONS.values():
        assert (fast.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
                == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
