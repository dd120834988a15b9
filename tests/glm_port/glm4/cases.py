"""Conversations the GLM-4 chat tests (and the opt-in comparison with THUDM's code) run through.

Each is a list of messages as the chat template takes them (tools as ``{"type": "function", "function": ...}``);
``as_chat_input`` turns one into ``build_chat_input``'s arguments (the last message is the query; tools as the
bare function dicts THUDM's first ``build_chat_input`` took).
"""

WEATHER = {"name": "get_weather", "description": "查询城市的天气",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "城市名"}},
                          "required": ["city"]}}
CLOCK = {"name": "now", "description": "The current time", "parameters": {"type": "object", "properties": {}}}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "你好"}],
    "multi": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
              {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
              {"role": "user", "content": "谢谢，再见。"}],
    "system": [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "Tell me a story about the sea."}],
    "tools": [{"role": "system", "content": "You answer about the weather.",
               "tools": [{"type": "function", "function": WEATHER}, {"type": "function", "function": CLOCK}]},
              {"role": "user", "content": "北京今天天气怎么样？"}],
    "observation": [{"role": "system", "content": "Weather bot.", "tools": [{"type": "function", "function": WEATHER}]},
                    {"role": "user", "content": "北京天气"},
                    {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京"}'},
                    {"role": "observation", "content": '{"temperature": 25, "weather": "晴"}'}],
    "text": [{"role": "user", "content": "Numbers 1234567 and  two  spaces\n\nand <|user|> written in text."}],
}


def as_chat_input(messages):
    """``(query, history, role)`` for ``build_chat_input``: the last message is the query."""
    history = []
    for message in messages[:-1]:
        message = dict(message)
        if "tools" in message:
            message["tools"] = [tool["function"] for tool in message["tools"]]
        history.append(message)
    return messages[-1]["content"], history, messages[-1]["role"]


TEXTS = ["Hello world", "你好，世界！今天天气很好。", "  leading spaces and trailing  ",
         "line one\nline two\r\n\n\tend",
         "I'm sure you're right, they'd've said", "x = 12345678 + 0.5 ** 2", "emoji 🙂 and ünïcödé",
         "[gMASK]<sop> written as text"]
