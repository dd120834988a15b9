"""Chat with a ChatGLM2 model: THUDM's ``chat`` / ``stream_chat`` on transformers' ``generate`` (``glm-chat``,
the terminal command, is ``glm_port/chat.py``).

``chat(model, tokenizer, query, history)`` builds the prompt with ``build_prompt`` (``[Round i]`` turns),
samples with THUDM's defaults (top-p 0.8, temperature 0.8) until ``</s>`` and returns
``(response, history + [(query, response)])``. ``stream_chat`` yields the same pair as the response
grows, the tokens coming through transformers' ``TextIteratorStreamer``.
"""

from __future__ import annotations

import threading

import torch

DEFAULTS = dict(do_sample=True, top_p=0.8, temperature=0.8)


class PromptTooLong(ValueError):
    """The prompt (history included) does not fit the model's ``seq_length``."""


def build_inputs(model, tokenizer, query: str, history=None):
    prompt = tokenizer.build_prompt(query, history)
    inputs = tokenizer([prompt], return_tensors="pt")
    length, limit = inputs["input_ids"].shape[1], model.config.seq_length
    if length >= limit:
        raise PromptTooLong(f"prompt of {length} tokens does not fit the model's seq_length ({limit})")
    return inputs.to(model.device)


def _generate_kwargs(model, inputs, kwargs):
    merged = {**DEFAULTS, **kwargs}
    if not merged.get("do_sample"):
        merged.pop("top_p", None), merged.pop("temperature", None)
    limit = model.config.seq_length
    if "max_new_tokens" in merged:
        merged["max_new_tokens"] = min(merged["max_new_tokens"], limit - inputs["input_ids"].shape[1])
    else:
        merged["max_length"] = min(merged.get("max_length", 8192), limit)
    merged.setdefault("eos_token_id", model.config.eos_token_id)
    merged.setdefault("pad_token_id", model.config.pad_token_id)
    return merged


def process_response(response: str) -> str:
    """THUDM's post-processing of a reply: trimmed, its training-date placeholder filled."""
    return response.strip().replace("[[训练时间]]", "2023年")


@torch.inference_mode()
def chat(model, tokenizer, query: str, history=None, **generate_kwargs):
    """``(response, history)`` for one turn, as THUDM's ``model.chat``."""
    history = list(history or [])
    inputs = build_inputs(model, tokenizer, query, history)
    output = model.generate(**inputs, **_generate_kwargs(model, inputs, generate_kwargs))
    response = process_response(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:].tolist()))
    return response, history + [(query, response)]


def stream_chat(model, tokenizer, query: str, history=None, **generate_kwargs):
    """Yield ``(response so far, history)`` as tokens arrive (``generate`` runs in a worker thread)."""
    from transformers import TextIteratorStreamer

    history = list(history or [])
    inputs = build_inputs(model, tokenizer, query, history)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    kwargs = {**inputs, **_generate_kwargs(model, inputs, generate_kwargs), "streamer": streamer}
    failure = []

    def run():
        try:
            with torch.inference_mode():
                model.generate(**kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
            streamer.end()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    response = ""
    for piece in streamer:
        response += piece
        if response and not response.endswith("\ufffd"):  # wait for a whole character
            yield process_response(response), history + [(query, process_response(response))]
    worker.join()
    if failure:
        raise failure[0]
    if not response:
        yield "", history + [(query, "")]
