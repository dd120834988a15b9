"""GLM-4's replies read back: tool calls (name line + JSON) and plain answers, and the round trip of a call
through the chat layout (the assistant turn as the model sees it, decoded and parsed back)."""

import runpy
from pathlib import Path

from glm_port.models.glm4.chat_format import declared_functions, observation, parse_tool_call, reply_message

CASES = runpy.run_path(str(Path(__file__).with_name("cases.py")))
CONVERSATIONS, WEATHER = CASES["CONVERSATIONS"], CASES["WEATHER"]


def test_declared_functions():
    assert declared_functions(CONVERSATIONS["tools"]) == {"get_weather", "now"}
    assert declared_functions([{"role": "system", "content": "", "tools": [WEATHER]}]) == {"get_weather"}
    assert declared_functions(CONVERSATIONS["multi"]) == set()


def test_tool_call_is_parsed():
    reply = 'get_weather\n{"city": "北京",\n "unit": "c"}'
    assert parse_tool_call(reply, {"get_weather"}) == {"name": "get_weather",
                                                       "arguments": {"city": "北京", "unit": "c"}}
    message = reply_message(reply, CONVERSATIONS["tools"])
    assert message == {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京",\n "unit": "c"}'}


def test_not_a_tool_call():
    assert parse_tool_call('get_weather\n{"city": "北京"}', {"now"}) is None  # not declared
    assert parse_tool_call("get_weather\ncity is 北京", {"get_weather"}) is None  # no JSON
    assert parse_tool_call('get_weather\n{"city": ', {"get_weather"}) is None  # broken JSON
    assert parse_tool_call("北京今天晴。", {"get_weather"}) is None
    assert reply_message("  北京今天晴，25 度。\n", CONVERSATIONS["tools"]) == {"role": "assistant",
                                                                          "content": "北京今天晴，25 度。"}


def test_a_call_round_trips_through_the_chat_layout(tok):
    messages = CONVERSATIONS["tools"]
    call = reply_message('get_weather\n{"city": "北京"}', messages)
    turn = messages + [call, observation({"temperature": 25})]
    text = tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    assert text.endswith('<|assistant|>get_weather\n{"city": "北京"}'
                         '<|observation|>\n{"temperature": 25}<|assistant|>')
    ids = tok.apply_chat_template(turn, add_generation_prompt=True, return_dict=False)
    assistant = tok.get_command("<|assistant|>")
    start = len(ids) - ids[::-1].index(assistant, 1) - 1  # the call's <|assistant|>
    stop = ids.index(tok.get_command("<|observation|>"), start)
    assert parse_tool_call(tok.decode(ids[start + 1:stop]), declared_functions(messages))["arguments"] == {
        "city": "北京"}
