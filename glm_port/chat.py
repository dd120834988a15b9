"""``glm-chat``: a terminal chat with a ChatGLM2 / ChatGLM3 / GLM-4 model, replies streamed as they are generated.

    glm-chat                       # the embedded random-init tiny model (no downloads; talks nonsense)
    glm-chat --model chatglm2-6b/  # a THUDM directory (or one written by glm-convert --from transformers)
    glm-chat --model chatglm3-6b/ --system "You are ChatGLM3."   # ChatGLM3's role-token format, found by itself
    glm-chat --model glm-4-9b-chat/  # GLM-4 (THUDM's directory, or transformers' glm-4-9b-chat-hf layout)
    glm-chat --chat-format glm4      # the embedded random-init tiny GLM-4

The chat format follows the tokenizer: ChatGLM2's ``[Round i]`` prompt, or ChatGLM3's role tokens when
the directory is ChatGLM3's (``--chat-format`` overrides; ``chatglm3`` on a ChatGLM2 tokenizer is refused);
GLM-4's (``glm4``) for a GLM-4 directory (its family's one format; ``--chat-format glm4`` with no ``--model``: the
embedded tiny GLM-4).
Commands at the prompt: ``/clear`` forgets the history (the system prompt stays), ``/exit`` (or end of input,
or Ctrl-C) quits. Ctrl-C while a reply streams stops that reply and brings the prompt back, the conversation
as before the turn. ``--temperature 0`` is greedy, as ``--greedy``. A line that is not UTF-8 is refused
with one line and the chat goes on; bad options are one line on stderr, exit status 2, before anything loads.

The model's family is reached through the registry only (``glm_port.models``): a directory's family
(``family_at``) and its ``conversation`` binding (``glm_port.models.contract.ConversationBinding``: load,
``stream_chat``, the chat formats, whether a system prompt is taken); the embedded model is the ``tiny`` binding of
the default family, or of the family whose conversation binding speaks the ``--chat-format`` asked for.

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

from glm_port.dtypes import METAVAR as DTYPE_METAVAR
from glm_port.dtypes import dtype_argument, parse_dtype
from glm_port.generation.options import add_quantize_arguments
from glm_port.generation.text import bad_utf8, tolerant_stdin
from glm_port.models import FAMILIES, TINY_FAMILY, WeightsError, family_at, family_of


def chat_family(model_dir, chat_format=None):
    """The family glm-chat talks to for ``model_dir``: the directory's family (``family_at``) where it has a
    ``conversation`` binding; else the embedded model's family, whose loader then names in one line what is wrong
    with the directory (not a directory, another family's, not JSON...). With no directory (the embedded model):
    the default family, or, for a ``chat_format`` it does not speak, the first family with a ``tiny`` binding whose
    ``conversation`` binding speaks it (``--chat-format glm4``: GLM-4's)."""
    if model_dir is not None:
        try:
            family = family_at(model_dir)
        except ValueError:  # not JSON, an unknown model type: the loader's own message says it
            family = None
        if family is not None and family.conversation is not None:
            return family
        return FAMILIES[TINY_FAMILY]
    embedded = [FAMILIES[TINY_FAMILY]] + [f for f in FAMILIES.values() if f.name != TINY_FAMILY]
    for family in embedded:
        if family.tiny is not None and family.conversation is not None and (
                chat_format is None or chat_format in family.binding("conversation").CHAT_FORMATS):
            return family
    return FAMILIES[TINY_FAMILY]


def conversation_of(model):
    """The ``conversation`` binding of ``model``'s family (``models.family_of``: its class, its config's
    ``model_type``)."""
    return family_of(model).binding("conversation")


def chat_formats() -> tuple[str, ...]:
    """Every chat format a family's ``conversation`` binding speaks (``--chat-format``'s choices)."""
    formats = [f for family in FAMILIES.values() if family.conversation is not None
               for f in family.binding("conversation").CHAT_FORMATS]
    return tuple(dict.fromkeys(formats))


def stream_chat(model, tokenizer, query, history=None, **kwargs):
    """``model``'s family's ``stream_chat`` (its ``conversation`` binding): yields ``(response, history)``, with
    the past key/values third when ``return_past_key_values``."""
    return conversation_of(model).stream_chat(model, tokenizer, query, history, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    DEFAULTS = FAMILIES[TINY_FAMILY].binding("conversation").DEFAULTS  # the embedded model's family's (THUDM's)
    parser = argparse.ArgumentParser(
        prog="glm-chat",
        description="Terminal chat with a ChatGLM2/ChatGLM3/GLM-4 model, replies streamed as they are generated, in "
        "the model's own chat format (ChatGLM2's [Round i] prompt, ChatGLM3's or GLM-4's role tokens). "
        "At the prompt: /clear forgets the conversation, /exit quits.",
    )
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="ChatGLM2/ChatGLM3 or GLM-4 directory (config.json, weights, tokenizer.model); default: "
                        "the embedded random-init tiny model, built on the fly with no downloads")
    parser.add_argument("--ptuning_checkpoint", "--ptuning-checkpoint", metavar="DIR", default=None,
                        help="a P-Tuning v2 checkpoint (THUDM ptuning/'s or glm-finetune --pre_seq_len's output: "
                        "pytorch_model.bin of transformer.prefix_encoder.*, config.json) run on --model, its base "
                        "(default: none)")
    parser.add_argument("--chat-format", choices=chat_formats(), default=None,
                        help="chatglm2: '[Round i] 问：... 答：' prompts; chatglm3: <|user|>/<|assistant|> role tokens; "
                        "glm4: GLM-4's (a GLM-4 directory's only format; with no --model, the embedded tiny GLM-4). "
                        "default: what the directory's tokenizer files say (ChatGLM3's name it), chatglm2 for the "
                        "embedded model")
    parser.add_argument("--system", metavar="TEXT", default=None,
                        help="ChatGLM3 and GLM-4: a system prompt, the first message of every conversation (default: "
                        "none)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the model runs: cpu, cuda, cuda:1 ... (default: cuda when a GPU is there, else "
                             "cpu)")
    parser.add_argument("--dtype", type=dtype_argument, metavar=DTYPE_METAVAR, default=None,
                        help="weights and compute precision; torch's float32, bfloat16, float16 too (default: fp32 "
                             "on CPU, bf16 on a GPU)")
    parser.add_argument("--max-new-tokens", type=int, default=512,
                        help="tokens per reply at most, at least 1; cut to what the model's seq_length leaves "
                             "(default 512)")
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"],
                        help=f"sample in the smallest set of tokens whose probability reaches p, in (0, 1] "
                             f"(default {DEFAULTS['top_p']}, THUDM's)")
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"],
                        help=f"divide the logits by this before sampling, >= 0; 0 is greedy, as --greedy "
                             f"(default {DEFAULTS['temperature']}, THUDM's)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="sample among the k likeliest tokens, >= 0, 0 = all (default: transformers' 50)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="transformers' repetition penalty over the conversation and the reply so far, > 0; "
                             "1 is off (default 1.0)")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="end a reply at this text, which is cut off with what follows (repeatable; default: "
                             "none, replies end at the model's end token)")
    parser.add_argument("--greedy", action="store_true",
                        help="greedy decoding instead of sampling (default: sample, THUDM's top-p and temperature)")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed for sampling (default: none, a different reply each run)")
    parser.add_argument("--no-pack", action="store_true",
                        help="on CPU, keep the linear weights as loaded (default: repack them into oneDNN's layout "
                             "where that measures faster for one token; docs/generation.md)")
    add_quantize_arguments(parser)
    parser.add_argument("--no-cache-reuse", action="store_true",
                        help="prefill the whole conversation (the history re-encoded as text) every turn; default: "
                             "keep the key/value cache across turns and prefill only the new turn's tokens, as "
                             "THUDM's stream_chat(past_key_values=...) does (the cache then holds the replies as "
                             "generated)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="answer these queries in turn (history kept) and exit, instead of reading the terminal "
                             "(repeatable; default: read queries from the terminal or stdin)")
    return parser


def load(model_dir, device="cpu", dtype=None, chat_format=None, ptuning_checkpoint=None):
    """``(model, tokenizer)`` from a directory, or the embedded tiny model when ``model_dir`` is None.
    ``chat_format`` None: the directory's own (the embedded model: chatglm2's; ``chat_family`` says which family's
    tiny model another format gets). ``ptuning_checkpoint``: a P-Tuning v2 prefix for the directory's model
    (refused for a family without prefix tuning)."""
    family = chat_family(model_dir, chat_format)
    if model_dir is None:
        model, tokenizer = family.binding("tiny").build_tiny(**({"chat_format": chat_format} if chat_format else {}))
        return model.to(device=device, dtype=dtype or torch.float32), tokenizer
    # the family's loader: its directory (files, weight names, a P-Tuning prefix's fit) and the chat format
    # checked before the weights
    prefix = {}
    if ptuning_checkpoint is not None:  # only families declaring prefix tuning take the keyword
        family.require(("--ptuning_checkpoint", "prefix_tuning"))
        prefix = {"ptuning_checkpoint": ptuning_checkpoint}
    return family.binding("conversation").load(model_dir, device=device, dtype=dtype, chat_format=chat_format,
                                               **prefix)


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
        """Stream one reply to ``out``; history and cache move on only when it completes. A PromptTooLong
        leaves both as they were; so does a KeyboardInterrupt (Ctrl-C) while the reply streams: generation
        is stopped (its worker waited for), the cache cut back to its length before the turn, and the
        interrupt re-raised for the caller to go back to the prompt."""
        printed, history, past, stops = "", self.history, self.past, gen.get("stop_strings") or ()
        length = past.get_seq_length() if past is not None else 0
        stream = stream_chat(model, tokenizer, query, self.history, past_key_values=past,
                             return_past_key_values=self.reuse, **gen)
        response = ""
        try:
            for step in stream:
                response, history = _text(step[0]), step[1]
                if self.reuse:
                    past = step[2]
                shown = cut_at_stop(response, stops)
                if not shown.startswith(printed):
                    out.write("\n")
                    printed = ""
                out.write(shown[len(printed):])
                out.flush()
                printed = shown
        except KeyboardInterrupt:
            stream.close()  # stops generate at its next token and waits for it (done already if raised inside)
            extra = self.past.get_seq_length() - length if self.past is not None else 0
            if extra > 0:
                self.past.crop(-extra)  # the interrupted turn's keys and values go (negative: tokens to drop)
            raise
        final = cut_at_stop(response, stops, final=True)
        out.write((final[len(printed):] if final.startswith(printed) else "\n" + final) + "\n")
        if final != response and history:  # a --stop string cut the reply: the history keeps what was shown
            history = list(history)
            last = history[-1]
            history[-1] = (last[0], final) if isinstance(last, tuple) else {**last, "content": final}
        self.history, self.past = history, past


def cut_at_stop(text: str, stops, final: bool = False) -> str:
    """``text`` up to the first of the ``stops`` strings in it; while a reply streams (not ``final``), also
    without a tail that may be the start of one (shown once it is not)."""
    cuts = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    if cuts:
        return text[:min(cuts)]
    if final:
        return text
    held = max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
    return text[:len(text) - held]


def check_options(args) -> str | None:
    """What is wrong with the options, in one line, before anything loads (None: nothing)."""
    if args.max_new_tokens < 1:
        return f"--max-new-tokens must be at least 1, got {args.max_new_tokens}"
    if not 0 < args.top_p <= 1:  # NaN fails too
        return f"--top-p must be in (0, 1], got {args.top_p}"
    if not 0 <= args.temperature < float("inf"):
        return f"--temperature must be a number >= 0 (0: greedy), got {args.temperature}"
    if args.top_k is not None and args.top_k < 0:
        return f"--top-k must be at least 0 (0: no cut), got {args.top_k}"
    if not 0 < args.repetition_penalty < float("inf"):
        return f"--repetition-penalty must be a number > 0 (1: off), got {args.repetition_penalty}"
    if any(not stop for stop in args.stop or []):
        return "--stop must be a non-empty text"
    if args.ptuning_checkpoint is not None and args.model is None:
        return "--ptuning_checkpoint needs --model, the base model it was trained on"
    from glm_port.models import check_quantize

    problem = check_quantize(args.quantize, args.quantize_group_size)
    if problem is not None:
        return problem
    texts = [("--system", args.system)] + [("--stop", stop) for stop in args.stop or []]
    texts += [(f"--prompt {i + 1}", q) for i, q in enumerate(args.prompt or [])]
    for flag, text in texts:
        bad = bad_utf8(text) if text is not None else None
        if bad is not None:
            return f"{flag}: not valid UTF-8 ({bad})"
    return None


def generation_options(args) -> dict:
    """``stream_chat``'s generate arguments; ``--temperature 0`` is greedy, as ``--greedy`` (common CLIs' reading)."""
    gen = {"max_new_tokens": args.max_new_tokens}
    greedy = args.greedy or args.temperature == 0
    gen.update({"do_sample": False} if greedy else {"top_p": args.top_p, "temperature": args.temperature})
    if args.top_k is not None and not greedy:
        gen["top_k"] = args.top_k
    if args.repetition_penalty != 1.0:
        gen["repetition_penalty"] = args.repetition_penalty
    if args.stop:
        gen["stop_strings"] = list(args.stop)
    return gen


def main(argv=None) -> int:
    """Exit status: 0, 2 for bad input (one line on stderr), 130 for a Ctrl-C outside a reply (while loading,
    or during a --prompt run); Ctrl-C while a reply streams at the terminal stops that reply only."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_options(args)
    if problem is not None:
        print(f"glm-chat: error: {problem}", file=sys.stderr)
        return 2
    if args.seed is not None:
        torch.manual_seed(args.seed)
    family = chat_family(args.model, args.chat_format)
    try:
        if args.quantize:  # refused by a family without it, and a group size that does not divide a row, before loading
            family.require((f"--quantize {args.quantize}", "quantize"))
            if args.model is not None:
                family.binding("conversation").check_quantize(args.model, args.quantize, args.quantize_group_size)
        model, tokenizer = load(args.model, args.device, parse_dtype(args.dtype), args.chat_format,
                                args.ptuning_checkpoint)
    except (WeightsError, OSError, ValueError) as exc:  # a family refusing a flag (Unsupported) too
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"glm-chat: error: {message}", file=sys.stderr)
        return 2
    conversation_binding = family.binding("conversation")  # the family that loaded the model
    if args.system is not None and not conversation_binding.accepts_system(tokenizer):
        print(f"glm-chat: error: --system needs ChatGLM3's chat format or GLM-4's (this model's is "
              f"{conversation_binding.chat_format(tokenizer)}; see --chat-format)", file=sys.stderr)
        return 2
    if args.quantize:  # in place of the CPU repacking
        try:
            family.quantize(model, args.quantize, args.quantize_group_size)
        except ValueError as exc:
            print(f"glm-chat: error: {exc}", file=sys.stderr)
            return 2
    elif not args.no_pack and model.device.type == "cpu":
        from shim.nn import pack_linears

        pack_linears(model, batch_size=1)
    gen = generation_options(args)
    start = [] if args.system is None else [{"role": "system", "content": args.system}]
    conversation, out = Conversation(start, reuse=not args.no_cache_reuse), sys.stdout
    if args.prompt:
        for query in args.prompt:
            out.write(f"用户：{query}\nChatGLM：")
            try:
                conversation.turn(model, tokenizer, query, gen, out)
            except conversation_binding.PromptTooLong as exc:
                print(f"\nglm-chat: error: {exc}", file=sys.stderr)
                return 2
        return 0
    name = args.model or f"the embedded random-init {family.binding('tiny').NAME} model"
    out.write(f"glm-chat on {name} ({tokenizer.chat_format} chat format): /clear forgets the conversation, "
              "/exit quits, Ctrl-C stops a reply.\n")
    tolerant_stdin()  # a line that is not UTF-8 is refused below, not a UnicodeDecodeError
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
        bad = bad_utf8(query)
        if bad is not None:
            out.write(f"glm-chat: that line is not valid UTF-8 ({bad}); it was not sent\n")
            continue
        out.write("ChatGLM：")
        try:
            conversation.turn(model, tokenizer, query, gen, out)
        except conversation_binding.PromptTooLong as exc:
            out.write(f"\nglm-chat: {exc}; this turn was not answered, /clear to start over\n")
        except KeyboardInterrupt:
            out.write("\n(reply stopped; this turn is forgotten)\n")


if __name__ == "__main__":
    sys.exit(main())
