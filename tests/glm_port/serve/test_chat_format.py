"""OpenAI messages -> the family's chat format, checked against the format written by hand: ChatGLM3's as THUDM's
``build_chat_input`` takes its message dicts (a tool result is an ``observation``; a call the assistant made is
its name as metadata and ``tool_call(...)`` in a python fence, as the model writes it), ChatGLM2's as
``build_prompt``'s rounds. (The tool round trip in test_api.py teaches the model from ``encode_chat`` itself,
so it cannot see a wrong mapping; this can.)"""

import json

import pytest

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "string"}}}]


@pytest.fixture(scope="module")
def chatglm3(kit, one_thread):
    return kit.tiny_served("chatglm3")


@pytest.fixture(scope="module")
def chatglm2(kit, one_thread):
    return kit.tiny_served("chatglm2")


def test_chatglm3_tools_calls_and_results(chatglm3):
    tok = chatglm3.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny"},
    ]
    history = [
        {"role": "system", "content": "Be brief.", "tools": [TOOLS[0]["function"]]},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "metadata": "get_weather", "content": "```python\ntool_call(city='Paris')\n```"},
    ]
    expected = tok.build_chat_input("sunny", history, role="observation")["input_ids"][0].tolist()
    assert chatglm3.encode_chat(messages, TOOLS) == expected
    # without tools: no system tools, plain turns; the default system message when tools come without one
    plain = chatglm3.encode_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                  {"role": "user", "content": "bye"}])
    assert plain == tok.build_chat_input("bye", [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "yo"}])["input_ids"][0].tolist()
    assert tok.decode(chatglm3.encode_chat([{"role": "user", "content": "hi"}], TOOLS)).count(
        "You have access to the following tools") == 1


def test_chatglm3_reply_parsing(chatglm3):
    tok = chatglm3.tokenizer
    call = tok.build_single_message("assistant", "get_weather", "```python\ntool_call(city='Paris', days=2)\n```")[1:]
    assert chatglm3.parse_reply(call, TOOLS) == ("", [{"name": "get_weather",
                                                       "arguments": json.dumps({"city": "Paris", "days": 2})}])
    assert chatglm3.parse_reply(call, TOOLS, final=False) == ("", [])  # a call is never streamed as text
    text = tok.build_single_message("assistant", "", "Sunny today.")[1:]
    assert chatglm3.parse_reply(text, TOOLS) == ("Sunny today.", [])
    partial = chatglm3.parse_reply(text[:-2], TOOLS, final=False)[0]
    assert partial and "Sunny today.".startswith(partial)  # a growing reply shows a prefix of the final text
    assert chatglm3.parse_reply(call, None)[1] == []  # no tools given: no tool call


def test_chatglm2_rounds_and_system(chatglm2):
    tok = chatglm2.tokenizer
    messages = [{"role": "system", "content": "Be kind. "}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    expected = tok([tok.build_prompt("bye", [("Be kind. hi", "hello")])])["input_ids"][0]
    assert chatglm2.encode_chat(messages) == expected
    for bad in ([{"role": "tool", "content": "x"}, {"role": "user", "content": "hi"}],
                [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]):
        with pytest.raises(ValueError):
            chatglm2.encode_chat(bad)
    with pytest.raises(ValueError, match="tool"):
        chatglm2.encode_chat([{"role": "user", "content": "hi"}], TOOLS)


def test_a_directory_served_in_another_chat_format(tmp_path, one_thread):
    """``glm-serve --model DIR --chat-format chatglm3`` on a directory whose tokenizer says chatglm2: the
    tokenizer is rebuilt with ChatGLM3's role tokens (setting the name alone would leave them out)."""
    from glm_port.models import build_tiny
    from glm_port.serve.engine import ServedModel

    model, tokenizer = build_tiny()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert ServedModel.load(tmp_path).chat_format == "chatglm2"
    served = ServedModel.load(tmp_path, chat_format="chatglm3")
    assert served.chat_format == "chatglm3"
    ids = served.encode_chat([{"role": "user", "content": "hi"}])
    assert served.tokenizer.get_command("<|user|>") in ids and ids[-1] == served.tokenizer.get_command("<|assistant|>")
