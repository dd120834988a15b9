"""Chat with a GLM-4 model: THUDM's ``chat`` / ``stream_chat`` in GLM-4's format, and the format as a server
speaks it (the ``chat`` binding of the glm4 family: ``chat_format``, ``encode_messages``, ``reply_stop_ids``,
``parse_reply``).

A prompt is ``[gMASK]<sop>``, each message ``<|role|>{metadata}\\n{content}``, then ``<|assistant|>``
(``GLM4Tokenizer.build_chat_input``; one user turn: ``[gMASK]<sop><|user|>\\n{query}<|assistant|>``). Generation
stops at ``<|endoftext|>``, ``<|user|>`` or ``<|observation|>``. A reply is read back in messages as ChatGLM3's
``process_response`` reads one (one assistant message per ``<|assistant|>`` segment, ``metadata`` its first line),
with GLM-4's tool-call rule (THUDM's GLM-4 server, ``chat_format.parse_tool_call``): a segment with metadata is a
call ``{"name", "parameters"}`` when the conversation declared that function and the rest parses as JSON (never
evaluated), else ``{"name", "content"}``. (THUDM's GLM-4 ``modeling_chatglm.py`` was not at hand to compare.)

The streaming, cache reuse and sampling defaults are ChatGLM2's (``glm_port.models.chatglm2.chat``): given
the cache a previous turn returned, a turn prefills only ``build_chat_input(query, role=role)`` (``[gMASK]<sop>``
opening it again, as ChatGLM3's does) after it.
"""

from __future__ import annotations

import contextlib
import copy
import json

import torch

from glm_port.models.chatglm2.chat import (DEFAULTS, PromptTooLong, _fitting, _generate_kwargs, _new_ids,
                                           stream_generate_kwargs, stream_messages)
from glm_port.models.glm4.chat_format import declared_functions, parse_tool_call
from glm_port.models.glm4.tokenizer import ROLES, as_messages

FORMAT = "glm4"


def chat_format(tokenizer) -> str:
    """GLM-4's one chat format: "glm4"."""
    return FORMAT


def stop_ids(model, tokenizer) -> list[int]:
    """The ids a reply ends at: the tokenizer's three (``<|endoftext|>``, ``<|user|>``, ``<|observation|>``) and
    any other end id the model's config lists."""
    eos = model.config.eos_token_id
    config = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    return list(dict.fromkeys(list(tokenizer.stop_ids) + config))


reply_stop_ids = stop_ids


def _check_role(role):
    if role not in ROLES or role == "assistant":
        raise ValueError(f"role {role!r}: a GLM-4 turn is a user, system or observation message")


def build_inputs(model, tokenizer, query: str, history=None, role: str = "user"):
    """The whole conversation's prompt (history + query), a batch of one, checked against ``seq_length``."""
    _check_role(role)
    return _fitting(model, tokenizer.build_chat_input(query, history, role=role))


def build_stream_inputs(tokenizer, query: str, history=None, role: str = "user"):
    """One turn's ids to append to a cache of the conversation before it: ``build_chat_input(query, role=role)``."""
    _check_role(role)
    return tokenizer.build_chat_input(query, role=role)


def process_response(output: str, messages: list):
    """``(response, messages)`` from the decoded reply (specials written out), as THUDM's GLM-4 reads it: see the
    module's docstring. ``messages``: the conversation so far, the query included."""
    messages, content = copy.deepcopy(messages), ""
    functions = declared_functions(messages)
    for segment in output.split("<|assistant|>"):
        metadata, content = segment.split("\n", 1) if "\n" in segment else ("", segment)
        if not metadata.strip():
            content = content.strip()
            messages.append({"role": "assistant", "metadata": metadata, "content": content})
            continue
        messages.append({"role": "assistant", "metadata": metadata, "content": content})
        call = parse_tool_call(segment, functions)
        content = ({"name": call["name"], "parameters": call["arguments"]} if call is not None
                   else {"name": metadata.strip(), "content": content})
    return content, messages


def _kwargs(model, tokenizer, inputs, generate_kwargs, past_length: int = 0) -> dict:
    stops = stop_ids(model, tokenizer)
    return _generate_kwargs(model, tokenizer, inputs, {"eos_token_id": stops, **generate_kwargs}, past_length)


@torch.inference_mode()
def chat(model, tokenizer, query: str, history=None, role: str = "user", **generate_kwargs):
    """``(response, history)`` for one turn, as THUDM's GLM-4 ``model.chat``; the history is message dicts."""
    history = as_messages(history)
    inputs = build_inputs(model, tokenizer, query, history, role)
    output = model.generate(**inputs, **_kwargs(model, tokenizer, inputs, generate_kwargs))
    new = output[0, inputs["input_ids"].shape[1]:].tolist()
    messages = copy.deepcopy(history) + [{"role": role, "content": query}]
    return process_response(tokenizer.decode(_new_ids(new, stop_ids(model, tokenizer))), messages)


def stream_chat(model, tokenizer, query: str, history=None, role: str = "user", past_key_values=None,
                return_past_key_values: bool = False, **generate_kwargs):
    """Yield ``(response so far, history)`` as tokens arrive, or ``(response, history, past_key_values)`` with
    ``return_past_key_values``; ``past_key_values``: the cache a previous turn's stream returned, extended in place
    (ChatGLM2's ``stream_chat``, which this follows, says more)."""
    history = as_messages(history)
    kwargs, cache = stream_generate_kwargs(model, tokenizer, query, history, role, past_key_values,
                                           return_past_key_values, generate_kwargs, inputs_fn=build_inputs,
                                           stream_inputs_fn=build_stream_inputs, kwargs_fn=_kwargs)
    messages = copy.deepcopy(history) + [{"role": role, "content": query}]
    steps = stream_messages(model, tokenizer, kwargs, messages, stop_ids(model, tokenizer), process_response)
    with contextlib.closing(steps):
        for response, new_history in steps:
            yield (response, new_history, cache) if return_past_key_values else (response, new_history)


# ---------------------------------------------------------------- the chat format as a server speaks it
def encode_messages(tokenizer, messages: list[dict], tools=None) -> list[int]:
    """The prompt ids of an OpenAI-style conversation (roles system/user/assistant/tool), ending where the
    assistant's reply starts, as THUDM's GLM-4 server builds it: ``tool`` -> ``observation``; an assistant's
    ``tool_calls`` -> one assistant message per call (``metadata`` its name, content its JSON arguments);
    ``tools`` (OpenAI's ``{"type": "function", "function": {...}}``) on a system message of their own, which the
    tokenizer's chat template writes. The last message is a user or tool message."""
    if not messages:
        raise ValueError("messages: at least one message is needed")
    converted = [{"role": "system", "content": "", "tools": [dict(t) for t in tools]}] if tools else []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            if content:
                converted.append({"role": "assistant", "content": content})
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                converted.append({"role": "assistant", "metadata": function.get("name") or "",
                                  "content": function.get("arguments") or "{}"})
        elif role == "tool":
            converted.append({"role": "observation", "content": content})
        elif role in ("system", "user", "assistant"):
            converted.append({"role": role, "content": content})
        else:
            raise ValueError(f"message role {role!r} is not one of system, user, assistant, tool")
    if converted[-1]["role"] not in ("user", "observation"):
        raise ValueError("the last message must be a user or tool message")
    return list(tokenizer.apply_chat_template(converted, add_generation_prompt=True, tokenize=True, return_dict=False))


def parse_reply(tokenizer, ids: list[int], tools=None, final: bool = True):
    """``(content, tool_calls)`` of a reply's new ids (its stop id excluded): the text, or a call of a declared
    function as ``[{"name", "arguments"}]`` (arguments a JSON string). ``final=False`` (a reply still growing):
    the content only as far as it is surely plain text (a first line that may name a function is held back)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    head, newline, rest = text.partition("\n")
    if head.strip():  # metadata: a tool call, or a reply that does not open with GLM-4's newline
        if not final and tools:
            return "", []
        call = parse_tool_call(text, declared_functions([{"tools": tools}])) if tools else None
        if call is not None:
            return "", [{"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}]
        return text.strip(), []
    if not newline and not final:
        return "", []
    return (rest if newline else text).strip(), []


__all__ = ["DEFAULTS", "FORMAT", "PromptTooLong", "build_inputs", "build_stream_inputs", "chat", "chat_format",
           "encode_messages", "parse_reply", "process_response", "reply_stop_ids", "stop_ids", "stream_chat"]
