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
coming through a transformers streamer).
"""

from __future__ import annotations

import ast
import copy
import queue
import threading

import torch

from glm_port.models.chatglm2.tokenizer import as_messages

DEFAULTS = dict(do_sample=True, top_p=0.8, temperature=0.8)
STOP_ROLES = ("<|user|>", "<|observation|>")  # ChatGLM3 stops at eos or at these


class PromptTooLong(ValueError):
    """The prompt (history included) does not fit the model's ``seq_length``."""


def is_chatglm3(tokenizer) -> bool:
    return getattr(tokenizer, "chat_format", "chatglm2") == "chatglm3"


def build_inputs(model, tokenizer, query: str, history=None, role: str = "user"):
    if is_chatglm3(tokenizer):
        inputs = tokenizer.build_chat_input(query, history, role=role)
    else:
        if role != "user":
            raise ValueError(f"role {role!r}: ChatGLM2's prompt has user turns only (roles are ChatGLM3's)")
        inputs = tokenizer([tokenizer.build_prompt(query, history)], return_tensors="pt")
    length, limit = inputs["input_ids"].shape[1], model.config.seq_length
    if length >= limit:
        raise PromptTooLong(f"prompt of {length} tokens does not fit the model's seq_length ({limit})")
    return inputs.to(model.device)


def stop_ids(model, tokenizer) -> list[int]:
    """The ids generation stops at: eos, and for ChatGLM3 also ``<|user|>`` and ``<|observation|>``."""
    eos = model.config.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    if is_chatglm3(tokenizer):
        ids += [tokenizer.get_command(token) for token in STOP_ROLES]
    return ids


def _generate_kwargs(model, tokenizer, inputs, kwargs):
    merged = {**DEFAULTS, **kwargs}
    if not merged.get("do_sample"):
        merged.pop("top_p", None), merged.pop("temperature", None)
    limit = model.config.seq_length
    if "max_new_tokens" in merged:
        merged["max_new_tokens"] = min(merged["max_new_tokens"], limit - inputs["input_ids"].shape[1])
    else:
        merged["max_length"] = min(merged.get("max_length", 8192), limit)
    stops = stop_ids(model, tokenizer)
    merged.setdefault("eos_token_id", stops if len(stops) > 1 else stops[0])
    merged.setdefault("pad_token_id", model.config.pad_token_id)
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


def _streamed(model, kwargs, streamer):
    """Run ``generate`` in a worker thread and yield what ``streamer`` gives; re-raise its failure here."""
    failure = []

    def run():
        try:
            with torch.inference_mode():
                model.generate(**kwargs, streamer=streamer)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
            streamer.end()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    yield from streamer
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


def stream_chat(model, tokenizer, query: str, history=None, role: str = "user", **generate_kwargs):
    """Yield ``(response so far, history)`` as tokens arrive (``generate`` runs in a worker thread)."""
    history = list(history or [])
    inputs = build_inputs(model, tokenizer, query, history, role)
    kwargs = {**inputs, **_generate_kwargs(model, tokenizer, inputs, generate_kwargs)}
    if is_chatglm3(tokenizer):
        yield from _stream_chatglm3(model, tokenizer, query, history, role, kwargs)
        return
    from transformers import TextIteratorStreamer

    response = ""
    for piece in _streamed(model, kwargs, TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)):
        response += piece
        if response and not response.endswith("\ufffd"):  # wait for a whole character
            yield process_response(response), history + [(query, process_response(response))]
    if not response:
        yield "", history + [(query, "")]


def _stream_chatglm3(model, tokenizer, query, history, role, kwargs):
    messages = copy.deepcopy(as_messages(history)) + [{"role": role, "content": query}]
    stops, new, last = stop_ids(model, tokenizer), [], None
    for ids in _streamed(model, kwargs, TokenStreamer()):
        new += ids
        text = tokenizer.decode(_new_ids(new, stops))
        if text and not text.endswith("\ufffd") and text != last:  # a whole character, something new
            last = text
            yield process_chatglm3_response(text, messages)
    if last is None:
        yield process_chatglm3_response("", messages)
