"""Chat with a ChatGLM2 model: THUDM's ``chat`` / ``stream_chat`` on transformers' ``generate``, and ``glm-chat``.

``chat(model, tokenizer, query, history)`` builds the prompt with ``build_prompt`` (``[Round i]`` turns),
samples with THUDM's defaults (top-p 0.8, temperature 0.8) until ``</s>`` and returns
``(response, history + [(query, response)])``. ``stream_chat`` yields the same pair as the response
grows, the tokens coming through transformers' ``TextIteratorStreamer``.

    glm-chat                       # the embedded random-init tiny model (no downloads; talks nonsense)
    glm-chat --model chatglm2-6b/  # a THUDM directory (or one written by glm-convert --from transformers)

Commands at the prompt: ``/clear`` forgets the history, ``/exit`` (or end of input) quits.
"""

from __future__ import annotations

import argparse
import sys
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


# ---------------------------------------------------------------- glm-chat
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-chat",
        description="Terminal chat with a ChatGLM2/ChatGLM3 model, replies streamed as they are generated. "
        "At the prompt: /clear forgets the conversation, /exit quits.",
    )
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="ChatGLM2 directory (config.json, weights, tokenizer.model); default: the embedded "
                        "random-init tiny model, built on the fly with no downloads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="default: float32 on CPU, bfloat16 on a GPU")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"])
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"])
    parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--prompt", action="append", default=None,
                        help="answer these queries in turn (history kept) and exit, instead of reading the terminal")
    return parser


def load(model_dir, device="cpu", dtype=None):
    """``(model, tokenizer)`` from a directory, or the embedded tiny model when ``model_dir`` is None."""
    if model_dir is None:
        from glm_port.models.chatglm2.tiny import build_tiny

        model, tokenizer = build_tiny()
        return model.to(device=device, dtype=dtype or torch.float32), tokenizer
    from glm_port.models.chatglm2.weights import WeightsError, check_directory, load_pretrained, load_tokenizer

    config = check_directory(model_dir)  # family, shards and weight names before the tokenizer and the weights
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.vocab_size > config.padded_vocab_size:
        raise WeightsError(f"{model_dir}: tokenizer.model gives {tokenizer.vocab_size} ids, more than the model's "
                           f"padded_vocab_size ({config.padded_vocab_size})")
    return load_pretrained(model_dir, dtype=dtype, device=device), tokenizer


def _turn(model, tokenizer, query, history, gen, out):
    printed = ""
    for response, history in stream_chat(model, tokenizer, query, history, **gen):
        out.write(response[len(printed):] if response.startswith(printed) else "\n" + response)
        out.flush()
        printed = response
    out.write("\n")
    return history


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from glm_port.models.chatglm2.weights import WeightsError

    if args.seed is not None:
        torch.manual_seed(args.seed)
    try:
        model, tokenizer = load(args.model, args.device, getattr(torch, args.dtype) if args.dtype else None)
    except (WeightsError, OSError) as exc:
        print(f"glm-chat: error: {exc}", file=sys.stderr)
        return 2
    gen = {"max_new_tokens": args.max_new_tokens}
    gen.update({"do_sample": False} if args.greedy else {"top_p": args.top_p, "temperature": args.temperature})
    history, out = [], sys.stdout
    if args.prompt:
        for query in args.prompt:
            out.write(f"用户：{query}\nChatGLM：")
            try:
                history = _turn(model, tokenizer, query, history, gen, out)
            except PromptTooLong as exc:
                print(f"\nglm-chat: error: {exc}", file=sys.stderr)
                return 2
        return 0
    name = args.model or "the embedded random-init chatglm2-tiny model"
    out.write(f"glm-chat on {name}: /clear forgets the conversation, /exit quits.\n")
    while True:
        try:
            query = input("\n用户：").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        if query == "/exit":
            return 0
        if query == "/clear":
            history = []
            out.write("(conversation cleared)\n")
            continue
        if not query:
            continue
        out.write("ChatGLM：")
        try:
            history = _turn(model, tokenizer, query, history, gen, out)
        except PromptTooLong as exc:
            out.write(f"\nglm-chat: {exc}; /clear to start over\n")


if __name__ == "__main__":
    sys.exit(main())
