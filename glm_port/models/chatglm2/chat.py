"""Chat with a ChatGLM2 / ChatGLM3 model: THUDM's ``chat`` / ``stream_chat`` on transformers' ``generate``
(``glm-chat``, the terminal command, is ``glm_port/chat.py``).

The tokenizer's ``chat_format`` picks the format. ChatGLM2: ``chat(model, tokenizer, query, history)``
builds the prompt with ``build_prompt`` (``[Round i]`` turns), samples with THUDM's defaults (top-p 0.8,
temperature 0.8) until ``</s>`` and returns ``(response, history + [(query, response)])``.

ChatGLM3: the prompt is ``tokenizer.build_chat_input(query, history, role)`` (role tokens), generation
stops at ``</s>``, ``<|user|>`` or ``<|observation|>``, and the history is THUDM's message dicts: the
query as a ``{"role": role, "content": query}`` message, then one assistant message per
``<|assistant|>`` segment of the reply, each ``metadata + "\\n" + content``. A reply with metadata is a
tool call: ``{"name": metadata, "parameters": {...}}`` when the system message declared ``tools`` and the
call reads as ``tool_call(key=literal, ...)`` (parsed with ``ast``, never evaluated), else
``{"name": metadata, "content": text}``.

``stream_chat`` yields the same pair as the reply grows (``generate`` in a worker thread, the tokens
coming through a transformers streamer; closing the stream early stops the worker at its next token).

Cache reuse, as THUDM's ``stream_chat(past_key_values=..., return_past_key_values=True)``: the stream then
yields ``(response, history, past_key_values)``, the past a transformers ``DynamicCache`` holding the whole
conversation so far (the prompts and the replies as generated, up to the token before the last one
generated, which was never fed back). Given a past, a turn is prefilled from its own tokens only
(``build_stream_inputs``: ChatGLM2's ``"\n\n[Round n]\n\n问：{query}\n\n答："`` without specials, its first
token dropped; ChatGLM3's ``build_chat_input(query, role=role)``, ``[gMASK] sop`` again included), handed to
``generate`` as the new ids with an attention mask over past + new, so positions continue after the past.
The past is extended in place (as transformers' caches are); pass ``copy.deepcopy(past)`` to branch from it.
"""

from __future__ import annotations

import ast
import json
import contextlib
import copy
import queue
import threading

import torch
from transformers import BatchEncoding, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import Cache, DynamicCache

from glm_port.models.chatglm2.config import CACHE_KWARG
from glm_port.models.chatglm2.tokenizer import as_messages

DEFAULTS = dict(do_sample=True, top_p=0.8, temperature=0.8)
STOP_ROLES = ("<|user|>", "<|observation|>")  # ChatGLM3 stops at eos or at these


class PromptTooLong(ValueError):
    """The prompt (history included) does not fit the model's ``seq_length``."""


def is_chatglm3(tokenizer) -> bool:
    return getattr(tokenizer, "chat_format", "chatglm2") == "chatglm3"


def _check_role(tokenizer, role):
    if role != "user" and not is_chatglm3(tokenizer):
        raise ValueError(f"role {role!r}: ChatGLM2's prompt has user turns only (roles are ChatGLM3's)")


def _fitting(model, inputs, past_length: int = 0):
    length, limit = inputs["input_ids"].shape[1], model.config.seq_length
    if past_length + length >= limit:
        what = f"{past_length} cached + {length} new tokens" if past_length else f"prompt of {length} tokens"
        raise PromptTooLong(f"{what} does not fit the model's seq_length ({limit})")
    return inputs.to(model.device)


def build_inputs(model, tokenizer, query: str, history=None, role: str = "user"):
    """The whole conversation's prompt (history + query), a batch of one."""
    _check_role(tokenizer, role)
    if is_chatglm3(tokenizer):
        inputs = tokenizer.build_chat_input(query, history, role=role)
    else:
        inputs = tokenizer([tokenizer.build_prompt(query, history)], return_tensors="pt")
    return _fitting(model, inputs)


def build_stream_inputs(tokenizer, query: str, history=None, role: str = "user"):
    """One turn's ids to append to a cache of the conversation before it, as THUDM's ``stream_chat`` builds
    them when given ``past_key_values``. ChatGLM2 (THUDM's ``build_stream_inputs``): with a history, the text
    ``"\n\n[Round n]\n\n问：{query}\n\n答："`` encoded without specials and its first token (sentencepiece's
    dummy-prefix ``▁``) dropped; with none, the first round's prompt with ``[gMASK] sop``. ChatGLM3:
    ``build_chat_input(query, role=role)`` without the history (so ``[gMASK] sop`` opens every turn)."""
    _check_role(tokenizer, role)
    if is_chatglm3(tokenizer):
        return tokenizer.build_chat_input(query, role=role)
    if not history:
        return tokenizer([tokenizer.build_prompt(query)], return_tensors="pt")
    ids = tokenizer.encode(f"\n\n[Round {len(history) + 1}]\n\n问：{query}\n\n答：", add_special_tokens=False)[1:]
    return BatchEncoding({"input_ids": [ids], "attention_mask": [[1] * len(ids)]}, tensor_type="pt")


def stop_ids(model, tokenizer) -> list[int]:
    """The ids generation stops at: eos, and for ChatGLM3 also ``<|user|>`` and ``<|observation|>``."""
    eos = model.config.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    if is_chatglm3(tokenizer):
        ids += [tokenizer.get_command(token) for token in STOP_ROLES]
    return ids


def _generate_kwargs(model, tokenizer, inputs, kwargs, past_length: int = 0):
    """``generate``'s arguments: THUDM's defaults under the caller's, lengths clipped to ``seq_length``.
    ``max_length`` counts this call's ids and the reply, not a past (as THUDM's ``stream_generate``)."""
    merged = {**DEFAULTS, **kwargs}
    if not merged.get("do_sample"):
        merged.pop("top_p", None), merged.pop("temperature", None)
    limit = model.config.seq_length - past_length
    if "max_new_tokens" in merged:
        merged["max_new_tokens"] = min(merged["max_new_tokens"], limit - inputs["input_ids"].shape[1])
    else:
        merged["max_length"] = min(merged.get("max_length", 8192), limit)
    stops = stop_ids(model, tokenizer)
    merged.setdefault("eos_token_id", stops if len(stops) > 1 else stops[0])
    merged.setdefault("pad_token_id", model.config.pad_token_id)
    if merged.get("stop_strings"):  # transformers' StopStringCriteria reads the tokenizer's pieces
        merged.setdefault("tokenizer", tokenizer)
    return merged


def process_response(response: str) -> str:
    """THUDM's post-processing of a reply: trimmed, its training-date placeholder filled."""
    return response.strip().replace("[[训练时间]]", "2023年")


def parse_tool_call(code: str):
    """The keyword arguments of ``tool_call(key=literal, ...)`` (ChatGLM3's tool call), or None when ``code``
    is not such a call (read with ``ast``; nothing is evaluated)."""
    try:
        call = ast.parse(code.strip(), mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args):
            return None
        if any(keyword.arg is None for keyword in call.keywords):
            return None
        return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


def process_chatglm3_response(output: str, history: list):
    """``(response, history)`` from the decoded reply (specials written out), as THUDM's ``process_response``:
    one assistant message per ``<|assistant|>`` segment; the response is the last segment's content (a
    dict for a tool call, see the module's docstring)."""
    history, content = copy.deepcopy(history), ""
    for segment in output.split("<|assistant|>"):
        metadata, content = segment.split("\n", 1) if "\n" in segment else ("", segment)
        if not metadata.strip():
            content = content.strip()
            history.append({"role": "assistant", "metadata": metadata, "content": content})
            content = content.replace("[[训练时间]]", "2023年")
            continue
        history.append({"role": "assistant", "metadata": metadata, "content": content})
        name = metadata.strip()
        if history[0]["role"] == "system" and "tools" in history[0]:
            parameters = parse_tool_call("\n".join(content.split("\n")[1:-1]))  # inside the ``` fence
            if parameters is not None:
                content = {"name": name, "parameters": parameters}
                continue
        content = {"name": name, "content": content}
    return content, history


def _new_ids(sequence: list[int], stops) -> list[int]:
    return sequence[:-1] if sequence and sequence[-1] in stops else sequence


@torch.inference_mode()
def chat(model, tokenizer, query: str, history=None, role: str = "user", **generate_kwargs):
    """``(response, history)`` for one turn, as THUDM's ``model.chat`` (ChatGLM2's or ChatGLM3's format)."""
    history = list(history or [])
    inputs = build_inputs(model, tokenizer, query, history, role)
    output = model.generate(**inputs, **_generate_kwargs(model, tokenizer, inputs, generate_kwargs))
    new = output[0, inputs["input_ids"].shape[1]:].tolist()
    if is_chatglm3(tokenizer):
        messages = copy.deepcopy(as_messages(history)) + [{"role": role, "content": query}]
        return process_chatglm3_response(tokenizer.decode(_new_ids(new, stop_ids(model, tokenizer))), messages)
    response = process_response(tokenizer.decode(new))
    return response, history + [(query, response)]


class _Closed(StoppingCriteria):
    """Stops ``generate`` once the stream's consumer has gone (the event is set when the generator closes)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def _streamed(model, kwargs, streamer):
    """Run ``generate`` in a worker thread and yield what ``streamer`` gives; re-raise its failure here.
    Closing this generator early (a ``break``, an interrupt) stops the worker at its next token and waits for
    it, so nothing goes on writing into a cache the caller may reuse."""
    failure, closed = [], threading.Event()
    criteria = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), _Closed(closed)])

    def run():
        try:
            with torch.inference_mode():
                model.generate(**{**kwargs, "stopping_criteria": criteria}, streamer=streamer)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
            streamer.end()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        yield from streamer
    finally:
        closed.set()
        worker.join()
    if failure:
        raise failure[0]


class TokenStreamer:
    """A transformers streamer (``put`` / ``end``) handing over the new token ids, iterated like
    ``TextIteratorStreamer``; ChatGLM3's stream decodes the whole reply each time, as THUDM's does, since its
    specials split it into messages."""

    def __init__(self):
        self.queue, self.prompt_seen = queue.Queue(), False

    def put(self, value):
        if not self.prompt_seen:  # generate's first put is the prompt
            self.prompt_seen = True
            return
        self.queue.put(value.reshape(-1).tolist())

    def end(self):
        self.queue.put(None)

    def __iter__(self):
        while (ids := self.queue.get()) is not None:
            yield ids



def stream_generate_kwargs(model, tokenizer, query: str, history, role: str, past_key_values,
                           return_past_key_values: bool, generate_kwargs: dict, *, inputs_fn=None,
                           stream_inputs_fn=None, kwargs_fn=None) -> tuple[dict, object]:
    """``(generate's keywords, cache)`` for one streamed turn, as ``stream_chat`` sets it up (a family building on
    this one passes its own prompt builders and keyword function: GLM-4's). Given ``past_key_values`` (the cache a
    previous turn returned), the turn's own ids after it (a P-Tuning prefix in the cache takes no position, as
    THUDM's ``stream_chat``), the attention mask over past + new and the cache; without one, the whole
    conversation, into a new ``DynamicCache`` when ``return_past_key_values``."""
    inputs_fn, stream_inputs_fn = inputs_fn or build_inputs, stream_inputs_fn or build_stream_inputs
    kwargs_fn = kwargs_fn or _generate_kwargs
    if past_key_values is None:
        past_length, inputs = 0, inputs_fn(model, tokenizer, query, history, role)
    else:
        if not isinstance(past_key_values, Cache):
            raise TypeError(f"past_key_values: expected the transformers Cache a previous stream_chat(..., "
                            f"return_past_key_values=True) yielded, got {type(past_key_values).__name__}")
        past_length = max(past_key_values.get_seq_length() - (getattr(model.config, "pre_seq_len", None) or 0), 0)
        inputs = _fitting(model, stream_inputs_fn(tokenizer, query, history, role), past_length)
    kwargs = {**inputs, **kwargs_fn(model, tokenizer, inputs, generate_kwargs, past_length)}
    cache = past_key_values
    if cache is None and return_past_key_values:
        cache = DynamicCache(config=model.config)
    if cache is not None:
        # generate's way to continue a cache: the new ids only, the attention mask over past + new (positions
        # follow from it), the cache itself.
        mask = inputs["attention_mask"]
        kwargs.update({"attention_mask": torch.cat([mask.new_ones(mask.shape[0], past_length), mask], dim=1),
                       CACHE_KWARG: cache, "use_cache": True})
    return kwargs, cache

def stream_chat(model, tokenizer, query: str, history=None, role: str = "user", past_key_values=None,
                return_past_key_values: bool = False, **generate_kwargs):
    """Yield ``(response so far, history)`` as tokens arrive (``generate`` runs in a worker thread), or
    ``(response so far, history, past_key_values)`` with ``return_past_key_values``.

    ``past_key_values``: the cache a previous turn's stream returned (a transformers ``Cache``); this turn then
    prefills only its own ids (``build_stream_inputs``) after it and extends it in place. Without one the
    prompt is the whole conversation (``build_inputs``), into a new ``DynamicCache`` when
    ``return_past_key_values``. Each yield gives the same cache object, which ``generate`` is still filling;
    it is complete when the stream ends.
    """
    history = list(history or [])
    kwargs, cache = stream_generate_kwargs(model, tokenizer, query, history, role, past_key_values,
                                           return_past_key_values, generate_kwargs)
    if is_chatglm3(tokenizer):
        stream = _stream_chatglm3(model, tokenizer, query, history, role, kwargs)
    else:
        stream = _stream_chatglm2(model, tokenizer, query, history, kwargs)
    with contextlib.closing(stream):  # closing this stream closes the worker's (see _streamed)
        for response, new_history in stream:
            yield (response, new_history, cache) if return_past_key_values else (response, new_history)


def _stream_chatglm2(model, tokenizer, query, history, kwargs):
    from transformers import TextIteratorStreamer

    response, pieces = "", _streamed(model, kwargs, TextIteratorStreamer(tokenizer, skip_prompt=True,
                                                                         skip_special_tokens=True))
    yielded = None
    with contextlib.closing(pieces):
        for piece in pieces:
            response += piece
            if response and not response.endswith("\ufffd"):  # wait for a whole character
                yielded = response
                yield process_response(response), history + [(query, process_response(response))]
    if response != yielded:  # the whole reply comes last, as chat returns it (empty, or cut in a character)
        yield process_response(response), history + [(query, process_response(response))]


def _stream_chatglm3(model, tokenizer, query, history, role, kwargs):
    messages = copy.deepcopy(as_messages(history)) + [{"role": role, "content": query}]
    yield from stream_messages(model, tokenizer, kwargs, messages, stop_ids(model, tokenizer),
                               process_chatglm3_response)


def stream_messages(model, tokenizer, kwargs: dict, messages: list, stops, process):
    """Yield ``process(reply so far, messages)`` as ``generate(**kwargs)`` streams token ids (a worker thread),
    the reply decoded with its specials up to the first of ``stops``: at each whole new character, and the whole
    reply last (as ``chat`` returns it, empty or cut in a character). The role-token formats' stream (ChatGLM3's,
    GLM-4's with its own ``process``)."""
    new, last = [], None
    steps = _streamed(model, kwargs, TokenStreamer())
    with contextlib.closing(steps):  # closing this stream closes the worker's (see _streamed)
        for ids in steps:
            new += ids
            text = tokenizer.decode(_new_ids(new, stops))
            if text and not text.endswith("\ufffd") and text != last:  # a whole character, something new
                last = text
                yield process(text, messages)
    text = tokenizer.decode(_new_ids(new, stops))
    if text != last:
        yield process(text, messages)


# ---------------------------------------------------------------- the chat format as a server speaks it
# (glm_port.serve reaches these through the registry's ``Family.chat``; messages are OpenAI's dicts)

TOOLS_SYSTEM = "Answer the following questions as best as you can. You have access to the following tools:"


def chat_format(tokenizer) -> str:
    """"chatglm2" or "chatglm3": the tokenizer's chat format."""
    return getattr(tokenizer, "chat_format", "chatglm2")


def _tool_call_code(arguments) -> str:
    """ChatGLM3's way of writing a call it made: ``tool_call(key=literal, ...)`` in a python fence."""
    if not isinstance(arguments, dict) or not all(isinstance(k, str) and k.isidentifier() for k in arguments):
        raise ValueError("a tool call's arguments must be a JSON object with identifier keys")
    inner = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
    return f"```python\ntool_call({inner})\n```"


def encode_messages(tokenizer, messages: list[dict], tools=None) -> list[int]:
    """The prompt ids of an OpenAI-style conversation (``{"role", "content"[, "tool_calls"]}`` dicts; roles
    system/user/assistant/tool) in the tokenizer's chat format, ending where the assistant's reply starts.

    ChatGLM3: messages map to THUDM's (``tool`` -> ``observation``; an assistant's ``tool_calls`` -> one
    assistant message per call, its name as metadata, its arguments as ``tool_call(...)``); ``tools`` (OpenAI's
    ``{"type": "function", "function": {...}}``) go to the system message as THUDM's demo puts them. The last
    message is a user or tool message. ChatGLM2: user/assistant rounds, a system message prepended to the
    first query (as THUDM's ChatGLM2 API does); tools are ChatGLM3's. A ValueError says what does not fit."""
    if not messages:
        raise ValueError("messages: at least one message is needed")
    if chat_format(tokenizer) != "chatglm3":
        return _encode_chatglm2(tokenizer, messages, tools)
    history, rest = [], list(messages)
    if tools:
        functions = [tool.get("function", tool) if isinstance(tool, dict) else tool for tool in tools]
        system = rest.pop(0).get("content") or "" if rest[0]["role"] == "system" else TOOLS_SYSTEM
        history.append({"role": "system", "content": system, "tools": functions})
    for message in rest:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            if content:
                history.append({"role": "assistant", "content": content})
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except json.JSONDecodeError as error:
                    raise ValueError(f"a tool call's arguments are not valid JSON ({error.msg})") from None
                history.append({"role": "assistant", "metadata": function.get("name") or "",
                                "content": _tool_call_code(arguments)})
        elif role == "tool":
            history.append({"role": "observation", "content": content})
        elif role in ("system", "user", "assistant"):
            history.append({"role": role, "content": content})
        else:
            raise ValueError(f"message role {role!r} is not one of system, user, assistant, tool")
    last = history.pop()
    if last["role"] not in ("user", "observation"):
        raise ValueError("the last message must be a user or tool message")
    return tokenizer.build_chat_input(last["content"], history, role=last["role"])["input_ids"][0].tolist()


def _encode_chatglm2(tokenizer, messages, tools):
    if tools:
        raise ValueError("tools: this model's chat format (chatglm2) has no tool calls (ChatGLM3's has)")
    system, rounds, query = "", [], None
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system":
            system += content
        elif role == "user":
            if query is not None:
                raise ValueError("two user messages in a row: chatglm2's format alternates user and assistant")
            query, system = system + content, ""
        elif role == "assistant":
            if query is None:
                raise ValueError("an assistant message must follow a user message in chatglm2's format")
            rounds.append((query, content))
            query = None
        else:
            raise ValueError(f"message role {role!r}: chatglm2's format has system, user and assistant only")
    if query is None:
        raise ValueError("the last message must be a user message")
    return tokenizer([tokenizer.build_prompt(query, rounds)])["input_ids"][0]


def reply_stop_ids(model, tokenizer) -> list[int]:
    """The ids a chat reply ends at (``stop_ids``)."""
    return stop_ids(model, tokenizer)


def parse_reply(tokenizer, ids: list[int], tools=None, final: bool = True):
    """``(content, tool_calls)`` of a reply's new ids (its stop id excluded): the text as ``chat`` returns it,
    and ChatGLM3's tool call as ``[{"name", "arguments"}]`` (arguments a JSON string) when ``tools`` were
    given. ``final=False`` (a reply still growing): the content only as far as it is surely plain text (a
    ChatGLM3 reply whose first line names a tool, or not yet known, holds its content back), so that what a
    stream shows is a prefix of the final content."""
    if chat_format(tokenizer) != "chatglm3":
        return process_response(tokenizer.decode(ids, skip_special_tokens=True)), []
    text = tokenizer.decode(ids)
    if not final and ("\n" not in text or text.split("\n", 1)[0].strip() or "<|assistant|>" in text):
        return "", []
    start = [{"role": "system", "content": "", "tools": tools}] if tools else [{"role": "user", "content": ""}]
    response, _ = process_chatglm3_response(text, start)
    if isinstance(response, dict):
        if "parameters" in response:
            return "", [{"name": response["name"], "arguments": json.dumps(response["parameters"], ensure_ascii=False)}]
        return response["content"], []
    return response, []
