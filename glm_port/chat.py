"""``glm-chat``: a terminal chat with a ChatGLM2 / ChatGLM3 model, replies streamed as they are generated.

    glm-chat                       # the embedded random-init tiny model (no downloads; talks nonsense)
    glm-chat --model chatglm2-6b/  # a THUDM directory (or one written by glm-convert --from transformers)
    glm-chat --model chatglm3-6b/ --system "You are ChatGLM3."   # ChatGLM3's role-token format, found by itself

The chat format follows the tokenizer: ChatGLM2's ``[Round i]`` prompt, or ChatGLM3's role tokens when
the directory is ChatGLM3's (``--chat-format`` overrides). Commands at the prompt: ``/clear`` forgets the
history (the system prompt stays), ``/exit`` (or end of input) quits.

The key/value cache is kept from turn to turn (THUDM's ``stream_chat(past_key_values=...)``), so a turn
prefills only its own tokens; ``/clear`` drops it. ``--no-cache-reuse`` prefills the whole conversation,
re-encoded from the history's text, every turn instead. A turn that no longer fits the model's
``seq_length`` is refused with a one-line message (``/clear`` starts over); history and cache stay as
they were.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from glm_port.models.chatglm2.chat import DEFAULTS, PromptTooLong, is_chatglm3, stream_chat
from glm_port.models.chatglm2.tokenizer import CHAT_FORMATS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-chat",
        description="Terminal chat with a ChatGLM2/ChatGLM3 model, replies streamed as they are generated, in the "
        "model's own chat format (ChatGLM2's [Round i] prompt or ChatGLM3's role tokens). "
        "At the prompt: /clear forgets the conversation, /exit quits.",
    )
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="ChatGLM2/ChatGLM3 directory (config.json, weights, tokenizer.model); default: the "
                        "embedded random-init tiny model, built on the fly with no downloads")
    parser.add_argument("--chat-format", choices=CHAT_FORMATS, default=None,
                        help="chatglm2: '[Round i] 问：... 答：' prompts; chatglm3: <|user|>/<|assistant|> role tokens. "
                        "Default: what the directory's tokenizer files say (ChatGLM3's name it), chatglm2 for the "
                        "embedded model")
    parser.add_argument("--system", metavar="TEXT", default=None,
                        help="ChatGLM3 only: a system prompt, the first message of every conversation")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="default: float32 on CPU, bfloat16 on a GPU")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"])
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"])
    parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-pack", action="store_true",
                        help="on CPU, keep the linear weights as loaded (default: repack them into oneDNN's layout "
                             "where that measures faster for one token; docs/generation.md)")
    parser.add_argument("--no-cache-reuse", action="store_true",
                        help="prefill the whole conversation (the history re-encoded as text) every turn; default: "
                             "keep the key/value cache across turns and prefill only the new turn's tokens, as "
                             "THUDM's stream_chat(past_key_values=...) does (the cache then holds the replies as "
                             "generated)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="answer these queries in turn (history kept) and exit, instead of reading the terminal")
    return parser


def load(model_dir, device="cpu", dtype=None, chat_format=None):
    """``(model, tokenizer)`` from a directory, or the embedded tiny model when ``model_dir`` is None.
    ``chat_format`` None: the directory's own (the embedded model: chatglm2)."""
    if model_dir is None:
        from glm_port.models.chatglm2.tiny import build_tiny

        model, tokenizer = build_tiny(chat_format=chat_format or "chatglm2")
        return model.to(device=device, dtype=dtype or torch.float32), tokenizer
    from glm_port.models.chatglm2.weights import WeightsError, check_directory, load_pretrained, load_tokenizer

    config = check_directory(model_dir)  # family, shards and weight names before the tokenizer and the weights
    tokenizer = load_tokenizer(model_dir, chat_format=chat_format)
    if tokenizer.vocab_size > config.padded_vocab_size:
        raise WeightsError(f"{model_dir}: tokenizer.model gives {tokenizer.vocab_size} ids, more than the model's "
                           f"padded_vocab_size ({config.padded_vocab_size})")
    return load_pretrained(model_dir, dtype=dtype, device=device), tokenizer


def _text(response) -> str:
    """A reply as printed: ChatGLM3's tool calls (dicts) as JSON."""
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


class Conversation:
    """History and, unless ``reuse`` is off, the key/value cache of the conversation so far."""

    def __init__(self, start, reuse=True):
        self.start, self.reuse = list(start), reuse
        self.clear()

    def clear(self):
        self.history, self.past = list(self.start), None

    def turn(self, model, tokenizer, query, gen, out):
        """Stream one reply to ``out``; history and cache move on only when it completes (a PromptTooLong
        leaves both as they were)."""
        printed, history, past = "", self.history, self.past
        stream = stream_chat(model, tokenizer, query, self.history, past_key_values=past,
                             return_past_key_values=self.reuse, **gen)
        for step in stream:
            response, history = _text(step[0]), step[1]
            if self.reuse:
                past = step[2]
            out.write(response[len(printed):] if response.startswith(printed) else "\n" + response)
            out.flush()
            printed = response
        out.write("\n")
        self.history, self.past = history, past


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from glm_port.models.chatglm2.weights import WeightsError

    if args.seed is not None:
        torch.manual_seed(args.seed)
    try:
        model, tokenizer = load(args.model, args.device, getattr(torch, args.dtype) if args.dtype else None,
                                args.chat_format)
    except (WeightsError, OSError) as exc:
        print(f"glm-chat: error: {exc}", file=sys.stderr)
        return 2
    if args.system is not None and not is_chatglm3(tokenizer):
        print("glm-chat: error: --system needs ChatGLM3's chat format (this model's is chatglm2; see --chat-format)",
              file=sys.stderr)
        return 2
    if not args.no_pack and model.device.type == "cpu":
        from shim.nn import pack_linears

        pack_linears(model, batch_size=1)
    gen = {"max_new_tokens": args.max_new_tokens}
    gen.update({"do_sample": False} if args.greedy else {"top_p": args.top_p, "temperature": args.temperature})
    start = [] if args.system is None else [{"role": "system", "content": args.system}]
    conversation, out = Conversation(start, reuse=not args.no_cache_reuse), sys.stdout
    if args.prompt:
        for query in args.prompt:
            out.write(f"用户：{query}\nChatGLM：")
            try:
                conversation.turn(model, tokenizer, query, gen, out)
            except PromptTooLong as exc:
                print(f"\nglm-chat: error: {exc}", file=sys.stderr)
                return 2
        return 0
    name = args.model or "the embedded random-init chatglm2-tiny model"
    out.write(f"glm-chat on {name} ({tokenizer.chat_format} chat format): /clear forgets the conversation, "
              "/exit quits.\n")
    while True:
        try:
            query = input("\n用户：").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        if query == "/exit":
            return 0
        if query == "/clear":
            conversation.clear()
            out.write("(conversation cleared)\n")
            continue
        if not query:
            continue
        out.write("ChatGLM：")
        try:
            conversation.turn(model, tokenizer, query, gen, out)
        except PromptTooLong as exc:
            out.write(f"\nglm-chat: {exc}; this turn was not answered, /clear to start over\n")


if __name__ == "__main__":
    sys.exit(main())
