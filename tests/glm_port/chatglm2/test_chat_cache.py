"""Reusing the key/value cache across chat turns (THUDM's ``stream_chat(past_key_values=...,
return_past_key_values=True)``) in both chat formats, and glm-chat keeping it; THUDM's own stream_chat is
compared when a copy of its code is given (CHATGLM2_CODE / CHATGLM3_CODE, last test)."""

import builtins
import io
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache

import glm_port.chat as glm_chat
from glm_port.models.chatglm2.chat import (
    PromptTooLong, build_inputs, build_stream_inputs, process_chatglm3_response, process_response, stop_ids,
)
from glm_port.models.chatglm2.tokenizer import ChatGLM2Tokenizer, as_messages
from glm_port.models.chatglm2.config import CACHE_KWARG as CACHE  # "cache", or "past_key_values" before transformers 5.2x

QUERIES = ["你好", "晚上好", "今天天气很好，我们去公园散步吧。"]


@pytest.fixture(scope="module")
def tiny3():
    from glm_port.models.chatglm2.tiny import build_tiny

    return build_tiny(chat_format="chatglm3")


@pytest.fixture(params=["chatglm2", "chatglm3"])
def pair(request, tiny, tiny3):
    return tiny if request.param == "chatglm2" else tiny3


class Seen(LogitsProcessor):
    """The ids ``generate``'s last step was given: this call's input ids and the reply but its newest token."""

    def __init__(self):
        self.ids = None

    def __call__(self, input_ids, scores):
        self.ids = input_ids[0].tolist()
        return scores


def converse(model, tok, queries, new_tokens=7):
    """Greedy turns reusing the cache: per turn (response, ids seen, cache length), then history and cache."""
    history, past, turns = [], None, []
    for query in queries:
        seen = Seen()
        for response, history, past in model.stream_chat(
                tok, query, history, past_key_values=past, return_past_key_values=True, do_sample=False,
                max_new_tokens=new_tokens, logits_processor=LogitsProcessorList([seen])):
            pass
        turns.append((response, seen.ids, past.get_seq_length()))
    return turns, history, past


def reply_text(model, tok, query, history, reply):
    if tok.chat_format == "chatglm2":
        return process_response(tok.decode(reply))
    stops = stop_ids(model, tok)
    text = tok.decode(reply[:-1] if reply and reply[-1] in stops else reply)
    return process_chatglm3_response(text, as_messages(history) + [{"role": "user", "content": query}])[0]


def test_cached_turns_equal_one_prefill_of_the_same_ids(pair):
    # Each turn with the cache gives the tokens generate gives from the whole conversation prefilled at once,
    # no cache carried over: the previous prompts, the replies as generated (but the last token of each,
    # never fed back), then the new turn's ids as THUDM's stream_chat builds them.
    model, tok = pair
    turns, _, past = converse(model, tok, QUERIES)
    fed, history = [], []
    stops = stop_ids(model, tok)
    for query, (response, seen, length) in zip(QUERIES, turns, strict=True):
        if fed:
            new = build_stream_inputs(tok, query, history)["input_ids"][0].tolist()
        else:
            new = build_inputs(model, tok, query)["input_ids"][0].tolist()
        context = fed + new
        out = model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=7, eos_token_id=stops,
                             pad_token_id=0)
        reply = out[0, len(context):].tolist()
        assert seen == new + reply[:-1]  # the cached turn was given only its own ids
        assert response == reply_text(model, tok, query, history, reply)
        assert length == len(context) + len(reply) - 1
        fed = context + reply[:-1]
        history = history + [(query, response)]
    with torch.no_grad():  # and the cache holds what one forward pass over those ids computes
        whole = getattr(model(torch.tensor([fed]), use_cache=True), CACHE)
    for ours, fresh in zip(past.layers, whole.layers, strict=True):
        torch.testing.assert_close(ours.keys, fresh.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, fresh.values, atol=1e-5, rtol=1e-5)


def test_stream_inputs_are_thudms(tiny, tiny3):
    _, tok = tiny
    g = tok.get_command
    history = [("你好", "你好！")]
    ids = build_stream_inputs(tok, "晚上好", history)["input_ids"][0].tolist()
    encoded = tok.encode("\n\n[Round 2]\n\n问：晚上好\n\n答：", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(encoded[0]) == "▁" and ids == encoded[1:]  # the dummy prefix dropped
    assert g("[gMASK]") not in ids and tok.decode(ids) == "\n\n[Round 2]\n\n问：晚上好\n\n答："
    first = build_stream_inputs(tok, "晚上好", [])["input_ids"][0].tolist()  # a past but no history: round 1
    assert first == tok(tok.build_prompt("晚上好"))["input_ids"]
    _, tok3 = tiny3
    history3 = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}]
    ids3 = build_stream_inputs(tok3, "晚上好", history3, role="user")["input_ids"][0].tolist()
    assert ids3 == tok3.build_chat_input("晚上好")["input_ids"][0].tolist()  # [gMASK] sop opens it again
    with pytest.raises(ValueError, match="ChatGLM2's prompt has user turns only"):
        build_stream_inputs(tok, "x", history, role="observation")


def test_past_options(tiny):
    model, tok = tiny
    gen = dict(do_sample=False, max_new_tokens=4)
    steps = list(model.stream_chat(tok, "你好", [("a", "b")], return_past_key_values=True, **gen))
    assert all(len(step) == 3 and step[2] is steps[0][2] for step in steps)
    # no past given: the whole conversation is the prompt (THUDM's code builds only the new turn here, which
    # leaves the model without the history; see docs/chatglm2.md)
    prompt = build_inputs(model, tok, "你好", [("a", "b")])["input_ids"].shape[1]
    assert steps[-1][2].get_seq_length() == prompt + 3
    past = steps[-1][2]
    pairs = list(model.stream_chat(tok, "晚上好", steps[-1][1], past_key_values=past, **gen))
    assert all(len(step) == 2 for step in pairs) and past.get_seq_length() > prompt + 3  # extended in place
    length, seen = past.get_seq_length(), Seen()
    new = build_stream_inputs(tok, "谢谢", pairs[-1][1])["input_ids"].shape[1]
    list(model.stream_chat(tok, "谢谢", pairs[-1][1], past_key_values=past, do_sample=False, max_length=new + 2,
                           logits_processor=LogitsProcessorList([seen])))
    assert len(seen.ids) == new + 1  # max_length counts this turn's ids and the reply, not the past (THUDM's)
    assert past.get_seq_length() == length + new + 1  # two tokens generated, the last never fed back
    with pytest.raises(TypeError, match="past_key_values: expected the transformers Cache"):
        next(model.stream_chat(tok, "你好", [("a", "b")], past_key_values=((torch.zeros(1),),)))


def test_a_past_too_long_is_refused(tiny):
    model, tok = tiny
    with torch.no_grad():
        past = model(torch.randint(3, 900, (1, 505)), use_cache=True, cache=DynamicCache(config=model.config))
        past = getattr(past, CACHE)
    with pytest.raises(PromptTooLong, match=r"^505 cached \+ \d+ new tokens does not fit the model's seq_length "
                                            r"\(512\)$"):
        next(model.stream_chat(tok, "晚上好", [("你好", "你好！")], past_key_values=past))
    assert past.get_seq_length() == 505


def test_closing_the_stream_stops_generation(tiny):
    model, tok = tiny
    threads = threading.active_count()
    stream = model.stream_chat(tok, "你好", return_past_key_values=True, do_sample=False, max_new_tokens=400)
    past = next(stream)[2]
    stream.close()
    length = past.get_seq_length()
    time.sleep(0.2)
    assert past.get_seq_length() == length < 400 and threading.active_count() == threads


def test_last_yield_is_the_whole_reply(tiny):
    model, tok = tiny
    # a reply cut inside a character is still given at the end, as chat returns it (THUDM's stream ends on the
    # last whole character, or yields nothing at all)
    cut = [tok.sp_model.piece_to_id("<0xE4>")]

    class Force(LogitsProcessor):
        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, -1e9)
            forced[:, cut[0]] = 0
            return forced

    steps = list(model.stream_chat(tok, "你好", do_sample=False, max_new_tokens=1,
                                   logits_processor=LogitsProcessorList([Force()])))
    assert len(steps) == 1 and steps[0][0] == "\ufffd"


# ---------------------------------------------------------------- glm-chat
def _recording(monkeypatch):
    calls = []
    original = glm_chat.stream_chat

    def recorded(model, tokenizer, query, history, **kwargs):
        past = kwargs.get("past_key_values")
        calls.append((query, len(history), None if past is None else past.get_seq_length()))
        return original(model, tokenizer, query, history, **kwargs)

    monkeypatch.setattr(glm_chat, "stream_chat", recorded)
    return calls


def test_glm_chat_keeps_the_cache_until_clear(monkeypatch, capsys):
    calls = _recording(monkeypatch)
    lines = iter(["你好", "晚上好", "/clear", "谢谢", "明天见", "/exit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert glm_chat.main(["--greedy", "--max-new-tokens", "4", "--no-pack"]) == 0
    assert [c[:2] for c in calls] == [("你好", 0), ("晚上好", 1), ("谢谢", 0), ("明天见", 1)]
    assert calls[0][2] is None and calls[1][2] > 0 and calls[2][2] is None and calls[3][2] == calls[1][2]
    assert "(conversation cleared)" in capsys.readouterr().out


def test_glm_chat_without_cache_reuse(monkeypatch, capsys):
    calls = _recording(monkeypatch)
    args = ["--greedy", "--max-new-tokens", "4", "--no-pack", "--prompt", "你好", "--prompt", "晚上好"]
    assert glm_chat.main([*args, "--no-cache-reuse"]) == 0
    assert [c[1:] for c in calls] == [(0, None), (1, None)]
    plain = capsys.readouterr().out
    assert glm_chat.main(args) == 0
    assert calls[3][2] > 0 and capsys.readouterr().out.count("ChatGLM：") == plain.count("ChatGLM：") == 2


def test_glm_chat_says_when_the_conversation_no_longer_fits(monkeypatch):
    from glm_port.models.chatglm2.tiny import build_tiny

    small = build_tiny(seq_length=48)
    monkeypatch.setattr(glm_chat, "load", lambda *args, **kwargs: small)
    lines = iter(["你好", "晚上好，今天天气很好，我们去公园散步吧。", "/clear", "晚上好", "/exit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    out = io.StringIO()
    monkeypatch.setattr(glm_chat.sys, "stdout", out)
    assert glm_chat.main(["--greedy", "--max-new-tokens", "30", "--no-pack"]) == 0
    text = out.getvalue()
    assert re.search(r"\nglm-chat: \d+ cached \+ \d+ new tokens does not fit the model's seq_length \(48\); "
                     r"this turn was not answered, /clear to start over\n", text)
    assert text.count("ChatGLM：") == 3  # the refused turn, then the one after /clear answered


# ---------------------------------------------------------------- against THUDM's code
CODES = {"chatglm2": os.environ.get("CHATGLM2_CODE"), "chatglm3": os.environ.get("CHATGLM3_CODE")}
PROBE = Path(__file__).with_name("stream_chat_reference_probe.py")
STREAM_CASES = [("晚上好", [["你好", "你好！"]]), ("What's 2+2?", [["a", "b"], ["问：", " spaced  reply "]]),
                ("第一轮", [])]


def _thudm_code(chat_format):
    """``(code directory, python)`` for THUDM's code of a format, or a skip saying what to set."""
    name = chat_format.upper()
    code, python = CODES[chat_format], os.environ.get(f"{name}_PYTHON") or os.environ.get("GLM_REF_PYTHON")
    if not (code and all(Path(code, f).is_file() for f in ("modeling_chatglm.py", "tokenization_chatglm.py"))
            and python and Path(python).is_file()):
        pytest.skip(f"THUDM's {chat_format} code not given (set {name}_CODE to the directory of a copy of "
                    f"{chat_format}-6b's modeling_chatglm.py, configuration_chatglm.py and tokenization_chatglm.py, "
                    f"and {name}_PYTHON, or GLM_REF_PYTHON, to a Python with transformers 4.x, which its "
                    "stream_chat needs)")
    return code, python


def test_stream_chat_with_past_matches_thudms(tmp_path, pair):
    model, tok = pair
    code, python = _thudm_code(tok.chat_format)
    fields = {k: getattr(model.config, k) for k in (
        "num_layers", "padded_vocab_size", "hidden_size", "ffn_hidden_size", "kv_channels", "num_attention_heads",
        "seq_length", "layernorm_epsilon", "add_qkv_bias", "multi_query_attention", "multi_query_group_num")}
    fields.update(original_rope=True, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps(fields))
    (tmp_path / "tokenizer.model").write_bytes(Path(tok.vocab_file).read_bytes())
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    generate = {"do_sample": False, "max_new_tokens": 7}
    real = Path(code, "tokenizer.model")  # chatglm2-6b's vocabulary, when the copy has it (not an LFS pointer)
    if real.is_file() and real.stat().st_size > 10_000:
        (tmp_path / "real_tokenizer.model").write_bytes(real.read_bytes())
    cases = {"queries": QUERIES, "generate": generate, "stream_inputs": STREAM_CASES}
    (tmp_path / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    run = subprocess.run([python, str(PROBE), tok.chat_format, code, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    reference = json.loads((tmp_path / "reference.json").read_text(encoding="utf-8"))
    if reference["stream_inputs"]:
        real_tok = ChatGLM2Tokenizer(str(real), chat_format="chatglm2")
        ours = [build_stream_inputs(real_tok, q, h)["input_ids"][0].tolist() for q, h in STREAM_CASES]
        assert ours == reference["stream_inputs"]

    history, past = [], None
    for query, theirs in zip(QUERIES, reference["turns"], strict=True):
        built = build_inputs(model, tok, query, history) if past is None else build_stream_inputs(tok, query, history)
        assert built["input_ids"][0].tolist() == theirs["input_ids"]  # the turn's ids after a past: THUDM's
        seen = Seen()
        for response, history, past in model.stream_chat(tok, query, history, past_key_values=past,
                                                         return_past_key_values=True, **generate,
                                                         logits_processor=LogitsProcessorList([seen])):
            pass
        assert seen.ids == theirs["seen_ids"]  # the same tokens generated on the same ids
        assert past.get_seq_length() == theirs["past_length"]  # the past after the turn's last step
        # (THUDM's last yield may carry an earlier step's past when the reply's end decodes to a partial
        # character; ours is always the whole turn's, see docs/chatglm2.md)
        assert theirs["yield_past_length"] <= theirs["past_length"]
        keys = torch.tensor(theirs["keys"]).permute(1, 2, 0, 3)  # THUDM's [s, b, g, d] -> ours [b, g, s, d]
        torch.testing.assert_close(past.layers[0].keys, keys, atol=1e-5, rtol=1e-5)
        if tok.chat_format == "chatglm2":  # ChatGLM3's drops the reply's last token even when no stop ended it
            assert response == theirs["response"] and [list(t) for t in history] == theirs["history"]
