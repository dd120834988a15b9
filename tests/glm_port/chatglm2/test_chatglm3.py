"""ChatGLM3's chat format on the ChatGLM2 family: the four role tokens after the five specials, the prompt of
``build_chat_input``, detecting a ChatGLM3 directory, chat / stream_chat with message-dict history and
their stops, and glm-chat in that format. All on a sentencepiece model trained here; THUDM's own
tokenizer code is compared when a copy is given (CHATGLM3_CODE, see the last tests)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from glm_port.chat import load as chat_load, main as chat_main
from glm_port.models.chatglm2.chat import parse_tool_call, process_chatglm3_response, stop_ids
from glm_port.models.chatglm2.tokenizer import ROLE_TOKENS, SPECIAL_TOKENS, ChatGLM2Tokenizer, detect_chat_format

TOOLS = [{"name": "get_weather", "description": "查询城市的天气",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = "get_weather\n```python\ntool_call(city='北京')\n```"
CASES = [  # (query, history, role)
    ("你好", [], "user"),
    ("晚上好", [{"role": "system", "content": "You are ChatGLM3, a helpful assistant."},
               {"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}], "user"),
    ('{"temperature": 22}', [{"role": "system", "content": "Answer with the tools.", "tools": TOOLS},
                             {"role": "user", "content": "北京天气怎么样"},
                             {"role": "assistant", "metadata": "get_weather", "content": CALL.split("\n", 1)[1]}],
     "observation"),
    ("What's 2+2?", [{"role": "user", "content": "Hello there\nsecond line"},
                     {"role": "assistant", "content": " spaced  reply "}], "user"),
]
TEXTS = ["<|user|>hi<|assistant|>晚上好", "plain text <|observation|> inside"]


@pytest.fixture(scope="module")
def tiny3():
    from glm_port.models.chatglm2.tiny import build_tiny

    return build_tiny(chat_format="chatglm3")


@pytest.fixture(scope="module")
def tok3(tiny3):
    return tiny3[1]


def _ids(tok, text):
    return tok.sp_model.encode(text)


# ---------------------------------------------------------------- vocabulary and prompt layout
def test_role_tokens_follow_the_five_specials(tok3, tiny):
    n = tok3.sp_model.vocab_size()
    assert [tok3.get_command(t) for t in SPECIAL_TOKENS + ROLE_TOKENS] == list(range(n, n + 9))
    assert tok3.vocab_size == n + 9 and tok3.chat_format == "chatglm3"
    assert tok3.convert_tokens_to_ids(list(ROLE_TOKENS)) == [n + 5, n + 6, n + 7, n + 8]
    chatglm2 = tiny[1]  # the embedded default stays ChatGLM2's: five specials
    assert chatglm2.chat_format == "chatglm2" and chatglm2.vocab_size == chatglm2.sp_model.vocab_size() + 5
    with pytest.raises(ValueError, match="'<|user|>' is not a chatglm2 special token"):
        chatglm2.get_command("<|user|>")
    with pytest.raises(ValueError, match="build_chat_input is ChatGLM3's chat format"):
        chatglm2.build_chat_input("你好")


def test_prompt_layout_is_chatglm3s(tok3):
    # PROMPT.md of THUDM/ChatGLM3: [gMASK] sop, then per message <|role|>{metadata}\n{content}, the
    # <|role|> a special token and the two texts encoded separately; a system message's tools follow its
    # content as indented JSON; <|assistant|> opens the reply.
    g = tok3.get_command
    query, history, role = CASES[2]
    tools = json.dumps(TOOLS, indent=4, ensure_ascii=False)
    expected = ([g("[gMASK]"), g("sop")]
                + [g("<|system|>")] + _ids(tok3, "\n") + _ids(tok3, "Answer with the tools.\n" + tools)
                + [g("<|user|>")] + _ids(tok3, "\n") + _ids(tok3, "北京天气怎么样")
                + [g("<|assistant|>")] + _ids(tok3, "get_weather\n") + _ids(tok3, CALL.split("\n", 1)[1])
                + [g("<|observation|>")] + _ids(tok3, "\n") + _ids(tok3, query)
                + [g("<|assistant|>")])
    inputs = tok3.build_chat_input(query, history, role=role)
    assert inputs["input_ids"].tolist() == [expected]
    assert inputs["attention_mask"].tolist() == [[1] * len(expected)]
    first = tok3.build_chat_input("你好")["input_ids"][0].tolist()
    assert first == [g("[gMASK]"), g("sop"), g("<|user|>")] + _ids(tok3, "\n") + _ids(tok3, "你好") + [g("<|assistant|>")]


def test_pair_history_reads_as_user_and_assistant(tok3):
    pairs = tok3.build_chat_input("晚上好", [("你好", "你好！")])["input_ids"]
    dicts = tok3.build_chat_input("晚上好", [{"role": "user", "content": "你好"},
                                            {"role": "assistant", "content": "你好！"}])["input_ids"]
    assert pairs.tolist() == dicts.tolist()
    with pytest.raises(ValueError, match="chat role 'robot' is not one of system, user, assistant, observation"):
        tok3.build_chat_input("x", [{"role": "robot", "content": "y"}])
    with pytest.raises(ValueError, match="needs a 'role' and a 'content'"):
        tok3.build_chat_input("x", [{"role": "user"}])


def test_role_tokens_in_text_stay_text_unless_asked(tok3):
    g = tok3.get_command
    text = TEXTS[0]
    assert not set(tok3(text)["input_ids"]) & {g(t) for t in ROLE_TOKENS}  # no injection through text
    special = ChatGLM2Tokenizer(tok3.vocab_file, chat_format="chatglm3", encode_special_tokens=True)
    assert special(text)["input_ids"] == ([g("[gMASK]"), g("sop"), g("<|user|>")] + _ids(tok3, "hi")
                                          + [g("<|assistant|>")] + _ids(tok3, "晚上好"))


def test_decode_writes_specials_out_unless_skipped(tok3):
    g = tok3.get_command
    ids = [g("<|assistant|>")] + _ids(tok3, "\n") + _ids(tok3, "你好") + [g("<|user|>"), tok3.eos_token_id]
    text = tok3.decode(ids)  # THUDM's exact spacing is checked against its code below (CHATGLM3_CODE)
    assert text.startswith("<|assistant|>") and text.endswith("你好<|user|>")
    metadata, content = text[len("<|assistant|>"):-len("<|user|>")].split("\n", 1)
    assert metadata.strip() == "" and content.strip() == "你好"
    assert tok3.decode(ids, skip_special_tokens=True) == tok3.sp_model.decode(_ids(tok3, "\n") + _ids(tok3, "你好"))


# ---------------------------------------------------------------- which format a directory speaks
def _tokenizer_dir(tmp_path, name, tok, files):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "tokenizer.model").write_bytes(Path(tok.vocab_file).read_bytes())
    for file, text in files.items():
        (directory / file).write_text(text, encoding="utf-8")
    return directory


def test_detects_a_chatglm3_directory(tmp_path, tok3):
    thudm3 = {"name_or_path": "THUDM/chatglm3-6b", "remove_space": False, "do_lower_case": False,
              "tokenizer_class": "ChatGLMTokenizer",
              "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}
    dirs = {
        "chatglm3": _tokenizer_dir(tmp_path, "a", tok3, {"tokenizer_config.json": json.dumps(thudm3)}),
        "chatglm3-config": _tokenizer_dir(tmp_path, "b", tok3, {"config.json": json.dumps(
            {"_name_or_path": "THUDM/chatglm3-6b", "model_type": "chatglm"})}),
        "chatglm3-code": _tokenizer_dir(tmp_path, "c", tok3, {"tokenization_chatglm.py": (
            "# a stand-in written here: the role tokens <|system|> <|user|> <|assistant|> <|observation|>\n")}),
        "chatglm3-added": _tokenizer_dir(tmp_path, "d", tok3, {"tokenizer_config.json": json.dumps(
            {"added_tokens_decoder": {"64795": {"content": "<|user|>", "special": True}}})}),
        "chatglm2": _tokenizer_dir(tmp_path, "e", tok3, {"tokenizer_config.json": json.dumps(
            {**thudm3, "name_or_path": "THUDM/chatglm2-6b"}), "config.json": "{not json"}),
        "bare": _tokenizer_dir(tmp_path, "f", tok3, {}),
    }
    found = {name: detect_chat_format(directory) for name, directory in dirs.items()}
    assert found == {"chatglm3": "chatglm3", "chatglm3-config": "chatglm3", "chatglm3-code": "chatglm3",
                     "chatglm3-added": "chatglm3", "chatglm2": "chatglm2", "bare": "chatglm2"}
    opened = ChatGLM2Tokenizer(str(dirs["chatglm3"] / "tokenizer.model"))
    assert opened.chat_format == "chatglm3" and opened.vocab_size == tok3.vocab_size
    assert ChatGLM2Tokenizer(str(dirs["chatglm3"] / "tokenizer.model"), chat_format="chatglm2").vocab_size == (
        tok3.vocab_size - 4)
    with pytest.raises(ValueError, match="chat_format 'chatglm4' is not one of chatglm2, chatglm3"):
        ChatGLM2Tokenizer(tok3.vocab_file, chat_format="chatglm4")


def test_save_pretrained_keeps_the_format(tmp_path, tok3):
    tok3.save_pretrained(tmp_path)
    again = ChatGLM2Tokenizer.from_pretrained(tmp_path)
    assert again.chat_format == "chatglm3" and again.vocab_size == tok3.vocab_size
    assert again.build_chat_input("你好")["input_ids"].tolist() == tok3.build_chat_input("你好")["input_ids"].tolist()


# ---------------------------------------------------------------- chat
class Force(LogitsProcessor):
    """Make generation emit ``ids`` in turn from the prompt's end (everything else -inf)."""

    def __init__(self, prompt_length, ids):
        self.prompt_length, self.ids = prompt_length, ids

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.ids[min(step, len(self.ids) - 1)]] = 0
        return forced


def _forced(tok, query, history, ids, role="user"):
    length = tok.build_chat_input(query, history, role=role)["input_ids"].shape[1]
    return LogitsProcessorList([Force(length, ids)])


def test_chat_is_generate_on_build_chat_input(tiny3):
    model, tok = tiny3
    history = [{"role": "user", "content": "你好"}, {"role": "assistant", "metadata": "", "content": "你好！"}]
    response, new_history = model.chat(tok, "晚上好", history, do_sample=False, max_new_tokens=6)
    ids = tok.build_chat_input("晚上好", history)["input_ids"]
    stops = [2, tok.get_command("<|user|>"), tok.get_command("<|observation|>")]
    expected = model.generate(ids, do_sample=False, max_new_tokens=6, eos_token_id=stops, pad_token_id=0)
    new = expected[0, ids.shape[1]:].tolist()
    new = new[:-1] if new[-1] in stops else new
    text = tok.decode(new)
    reply = text.split("<|assistant|>")[-1]
    assert response == process_chatglm3_response(text, history + [{"role": "user", "content": "晚上好"}])[0]
    assert new_history[:3] == history + [{"role": "user", "content": "晚上好"}]
    assert new_history[3]["role"] == "assistant" and len(new_history) == 3 + text.count("<|assistant|>") + 1
    assert history == [{"role": "user", "content": "你好"}, {"role": "assistant", "metadata": "", "content": "你好！"}]
    assert isinstance(reply, str) and stop_ids(model, tok) == stops


@pytest.mark.parametrize("stop", ["<|user|>", "<|observation|>", "</s>"])
def test_chat_stops_at_user_observation_and_eos(tiny3, stop):
    model, tok = tiny3
    reply = _ids(tok, "\n") + _ids(tok, "好的")
    stop_id = tok.eos_token_id if stop == "</s>" else tok.get_command(stop)
    after = _ids(tok, "不该出现")
    processor = _forced(tok, "你好", [], reply + [stop_id] + after)
    response, history = model.chat(tok, "你好", do_sample=False, max_new_tokens=20, logits_processor=processor)
    assert response == "好的"
    assert history == [{"role": "user", "content": "你好"},
                       {"role": "assistant", "metadata": "", "content": "好的"}]


def test_chat_without_a_stop_keeps_every_token(tiny3):
    model, tok = tiny3
    reply = _ids(tok, "\n") + _ids(tok, "好的好的好的")
    processor = _forced(tok, "你好", [], reply)
    response, _ = model.chat(tok, "你好", do_sample=False, max_new_tokens=len(reply), logits_processor=processor)
    assert response == "好的好的好的"  # THUDM's chat drops the last token even here; we drop only a stop


def test_tool_call_round_trip(tiny3):
    model, tok = tiny3
    history = [{"role": "system", "content": "Answer with the tools.", "tools": TOOLS}]
    reply = _ids(tok, "get_weather\n") + _ids(tok, CALL.split("\n", 1)[1]) + [tok.get_command("<|observation|>")]
    processor = _forced(tok, "北京天气怎么样", history, reply)
    response, history = model.chat(tok, "北京天气怎么样", history, do_sample=False, max_new_tokens=len(reply) + 2,
                                   logits_processor=processor)
    assert response == {"name": "get_weather", "parameters": {"city": "北京"}}
    text = tok.sp_model.decode(reply[:-1])  # the reply as one run of pieces, as the model would write it
    assert history[-1] == {"role": "assistant", "metadata": "get_weather", "content": text.split("\n", 1)[1]}
    answer = _ids(tok, "\n") + _ids(tok, "北京今天22度。") + [tok.eos_token_id]
    processor = _forced(tok, '{"temperature": 22}', history, answer, role="observation")
    response, history = model.chat(tok, '{"temperature": 22}', history, "observation", do_sample=False,
                                   max_new_tokens=len(answer) + 2, logits_processor=processor)
    assert response == "北京今天22度。"
    assert [m["role"] for m in history] == ["system", "user", "assistant", "observation", "assistant"]


def test_process_response_as_thudms():
    base = [{"role": "user", "content": "q"}]
    assert process_chatglm3_response(" \n 你好 [[训练时间]]", base) == (
        "你好 2023年", base + [{"role": "assistant", "metadata": " ", "content": "你好 [[训练时间]]"}])
    # two segments: a tool call without declared tools, then a plain reply; the last one is the response
    text, history = process_chatglm3_response("search\nquery text<|assistant|>\n answer", base)
    assert text == "answer" and history[1:] == [
        {"role": "assistant", "metadata": "search", "content": "query text"},
        {"role": "assistant", "metadata": "", "content": "answer"}]
    tools = [{"role": "system", "content": "s", "tools": TOOLS}] + base
    assert process_chatglm3_response("search\nquery text", base)[0] == {"name": "search", "content": "query text"}
    assert process_chatglm3_response(f"{CALL}", tools)[0] == {"name": "get_weather", "parameters": {"city": "北京"}}
    # a call that is not literal keywords (or is cut off while streaming) stays text; nothing is evaluated
    evil = "get_weather\n```python\ntool_call(city=__import__('os').getcwd())\n```"
    assert process_chatglm3_response(evil, tools)[0] == {"name": "get_weather", "content": evil.split("\n", 1)[1]}
    assert process_chatglm3_response("get_weather\n```python\ntool_call(ci", tools)[0]["name"] == "get_weather"
    assert parse_tool_call("tool_call(a=1, b=[2, 'x'], c={'k': None})") == {"a": 1, "b": [2, "x"], "c": {"k": None}}
    assert parse_tool_call("tool_call(1)") is None and parse_tool_call("os.system('x')") is None


def test_stream_chat_ends_with_chats_answer(tiny3):
    model, tok = tiny3
    torch.manual_seed(7)
    response, history = model.chat(tok, "你好", max_new_tokens=8)
    torch.manual_seed(7)
    steps = list(model.stream_chat(tok, "你好", max_new_tokens=8))
    assert steps[-1] == (response, history)
    assert len(steps) > 1


def test_stream_chat_stops_like_chat(tiny3):
    model, tok = tiny3
    reply = _ids(tok, "\n") + _ids(tok, "好的，明天见") + [tok.get_command("<|user|>")]
    steps = list(model.stream_chat(tok, "你好", do_sample=False, max_new_tokens=20,
                                   logits_processor=_forced(tok, "你好", [], reply)))
    assert steps[-1][0] == "好的，明天见" and steps[-1][1][-1]["content"] == "好的，明天见"
    assert all("<|user|>" not in str(s[0]) for s in steps) and all(steps[-1][0].startswith(s[0]) for s in steps)


# ---------------------------------------------------------------- glm-chat
def test_glm_chat_in_chatglm3_format(capsys):
    code = chat_main(["--chat-format", "chatglm3", "--system", "You are a test.", "--prompt", "你好",
                      "--prompt", "晚上好", "--max-new-tokens", "4", "--seed", "0", "--greedy"])
    assert code == 0
    assert capsys.readouterr().out.count("ChatGLM：") == 2
    assert chat_main(["--system", "You are a test.", "--prompt", "你好"]) == 2  # the embedded model is ChatGLM2
    assert "--system needs ChatGLM3's chat format" in capsys.readouterr().err


def test_glm_chat_reads_a_chatglm3_directory(tmp_path, make_model, write_thudm, tok3):
    directory = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "glm3", shards=1)
    (directory / "tokenizer.model").write_bytes(Path(tok3.vocab_file).read_bytes())
    (directory / "tokenizer_config.json").write_text(json.dumps({"name_or_path": "THUDM/chatglm3-6b"}))
    _, tokenizer = chat_load(str(directory))
    assert tokenizer.chat_format == "chatglm3"
    assert chat_load(str(directory), chat_format="chatglm2")[1].chat_format == "chatglm2"


# ---------------------------------------------------------------- against THUDM's code
# ids THUDM's ChatGLM3 tokenizer (transformers 4.27.4) gives on chatglm3-6b's tokenizer.model, which is
# chatglm2-6b's file byte for byte (sha256 e7dc4c39...a6f2)
THUDM_REAL = {
    "specials": [64789, 64790, 64791, 64792, 64793, 64794, 64795, 64796, 64797],
    "晚上好": ([{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}],
            [64790, 64792, 64795, 30910, 13, 36474, 54591, 64796, 30910, 13, 36474, 54591, 31404, 64795, 30910, 13,
             30910, 32820, 54591, 64796]),
}
REAL = os.environ.get("CHATGLM3_TOKENIZER") or os.environ.get("CHATGLM2_TOKENIZER")


@pytest.mark.skipif(not REAL, reason="set CHATGLM3_TOKENIZER (or CHATGLM2_TOKENIZER: the same file) to "
                                     "chatglm3-6b's tokenizer.model to check the real vocabulary")
def test_real_vocabulary_matches_thudms_ids():
    tok = ChatGLM2Tokenizer(REAL, chat_format="chatglm3")
    assert [tok.get_command(t) for t in SPECIAL_TOKENS + ROLE_TOKENS] == THUDM_REAL["specials"]
    history, ids = THUDM_REAL["晚上好"]
    assert tok.build_chat_input("晚上好", history)["input_ids"][0].tolist() == ids


CODE = os.environ.get("CHATGLM3_CODE")
PYTHON = os.environ.get("CHATGLM3_PYTHON") or os.environ.get("GLM_REF_PYTHON")
PROBE = Path(__file__).with_name("chatglm3_reference_probe.py")
thudm_code = pytest.mark.skipif(
    not (CODE and Path(CODE, "tokenization_chatglm.py").is_file() and PYTHON and Path(PYTHON).is_file()),
    reason="THUDM's ChatGLM3 tokenizer code not given (set CHATGLM3_CODE to the directory of a copy of "
           "chatglm3-6b's tokenization_chatglm.py and CHATGLM3_PYTHON, or GLM_REF_PYTHON, to a Python with "
           "transformers 4.x, which that code needs)")


def _thudm(tmp_path, model_file):
    (tmp_path / "tokenizer.model").write_bytes(Path(model_file).read_bytes())
    cases = {"chat": [{"query": q, "history": h, "role": r} for q, h, r in CASES], "text": TEXTS}
    (tmp_path / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    run = subprocess.run([PYTHON, str(PROBE), CODE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "reference.json").read_text(encoding="utf-8"))


def _compare(tok, reference):
    assert [tok.get_command(t) for t in SPECIAL_TOKENS + ROLE_TOKENS] == reference["specials"]
    assert tok.vocab_size == reference["vocab_size"]
    for (query, history, role), theirs in zip(CASES, reference["chat"], strict=True):
        ours = tok.build_chat_input(query, history, role=role)
        assert ours["input_ids"][0].tolist() == theirs["input_ids"]
        assert ours["attention_mask"][0].tolist() == theirs["attention_mask"]
        assert tok.decode(theirs["input_ids"]) == theirs["decoded"]
    special = ChatGLM2Tokenizer(tok.vocab_file, chat_format="chatglm3", encode_special_tokens=True)
    for text, theirs in zip(TEXTS, reference["text"], strict=True):
        assert tok(text)["input_ids"] == theirs["plain"]
        if theirs["special"] is not None:
            assert special(text)["input_ids"] == theirs["special"]


@thudm_code
def test_build_chat_input_matches_thudms_code(tmp_path, tok3):
    _compare(tok3, _thudm(tmp_path, tok3.vocab_file))


@thudm_code
def test_real_vocabulary_matches_thudms_code(tmp_path):
    model = REAL or str(Path(CODE or "", "tokenizer.model"))
    if not Path(model).is_file() or Path(model).stat().st_size < 10_000:  # absent, or a Git LFS pointer
        pytest.skip("no real chatglm3-6b tokenizer.model (CHATGLM3_TOKENIZER, or one in CHATGLM3_CODE)")
    _compare(ChatGLM2Tokenizer(model, chat_format="chatglm3"), _thudm(tmp_path, model))
