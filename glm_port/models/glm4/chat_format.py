"""GLM-4's replies read back into messages: plain answers and tool calls (docs/glm4.md, "tool call").

GLM-4-9B-Chat calls a tool by answering with the function's name on the first line and its JSON arguments
after it (``get_weather\\n{"city": "北京"}``); in the conversation that turn is an assistant message whose
``metadata`` is the name and whose content is the JSON text, and the tool's result comes back as an
``observation`` message. As THUDM's ``glm_server.py`` (``process_response``) reads a reply: it is a call when
the second line starts with ``{``, the first names a declared function tool and the rest parses as JSON
(parsed, never evaluated). Generation stops at ``<|endoftext|>``, ``<|user|>`` or ``<|observation|>``
(``GLM4Tokenizer.stop_ids``).
"""

from __future__ import annotations

import json

from glm_port.models.glm4.tokenizer import function_tool


def declared_functions(messages) -> set[str]:
    """The names of the function tools the messages declare (any message's ``tools``)."""
    names = set()
    for message in messages or []:
        if isinstance(message, dict):
            for tool in message.get("tools") or []:
                tool = function_tool(tool)
                if tool.get("type") == "function":
                    names.add(tool["function"]["name"])
    return names


def parse_tool_call(reply: str, functions) -> dict | None:
    """``{"name", "arguments"}`` (arguments parsed from JSON) when ``reply`` is a call of one of ``functions``
    (names), else None."""
    lines = reply.strip().split("\n")
    if len(lines) < 2 or not lines[1].startswith("{"):
        return None
    name, arguments = lines[0].strip(), "\n".join(lines[1:]).strip()
    if name not in set(functions):
        return None
    try:
        return {"name": name, "arguments": json.loads(arguments)}
    except ValueError:
        return None


def reply_message(reply: str, messages) -> dict:
    """The assistant message a reply adds to the conversation ``messages``: a tool call as ``metadata`` (the
    name) + the arguments' JSON text as written, anything else as its stripped text."""
    call = parse_tool_call(reply, declared_functions(messages))
    if call is None:
        return {"role": "assistant", "content": reply.strip()}
    arguments = reply.strip().split("\n", 1)[1].strip()  # the JSON text as the model wrote it
    return {"role": "assistant", "metadata": call["name"], "content": arguments}


def observation(result) -> dict:
    """A tool's result as the message that returns it to the model (text as it is, anything else as JSON)."""
    content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return {"role": "observation", "content": content}


__all__ = ["declared_functions", "observation", "parse_tool_call", "reply_message"]
