"""ChatGLM2 chat: the second turn's time to first token, reusing the first turn's key/value cache or not.

Turn 1 is a first query of about --history tokens (text from glm_port's default corpus) and a reply of exactly
--reply tokens (greedy, ``</s>`` suppressed so the random weights cannot stop early), through
``stream_chat(return_past_key_values=True)``. Turn 2 asks a short question and is timed to its first token
(``max_new_tokens=1``: the prefill plus one token), two ways:

  reuse       ``stream_chat(query, history, past_key_values=<a copy of turn 1's cache>)``: prefills only the
              new turn's ids (THUDM's ``past_key_values`` path; what glm-chat does)
  re-encode   ``stream_chat(query, history)``: prefills the whole conversation, the history re-encoded as text
              (THUDM's ``stream_chat`` without a past; ``glm-chat --no-cache-reuse``)

The cache is copied (``copy.deepcopy``, not timed) before each reuse run, since a run extends it in place. Both
run in one process, alternating, after one warm-up each; the median of --repeats is kept. The model has
random weights at a preset shape (bench.chatglm2's: 4 layers of ChatGLM2-6B at full width by default) and the
tokenizer is glm_port's tiny sentencepiece model (vocabulary 1005): token counts, not words, are what matter.
On CPU the linear weights are packed for one row, as glm-chat does (``--no-pack``: as loaded).

    python -m bench.chat_cache                              # 6b-4layers, history 1024, reply 128
    python -m bench.chat_cache --preset tiny --history 64 --reply 8 --repeats 1   # smoke run
    python -m bench.chat_cache --layers 28 --device cuda --dtype bfloat16 --history 4096
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

from bench._measure import print_cpu_line
from bench.chatglm2 import PRESETS, resolve

QUESTION = "请问你叫什么名字？"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default="6b-4layers")
    for name in ("layers", "hidden", "ffn", "heads", "groups", "kv_channels", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--history", type=int, default=1024, help="tokens of the first query (about)")
    parser.add_argument("--reply", type=int, default=128, help="tokens of the first reply (exactly)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="timed second turns per way (median kept)")
    parser.add_argument("--no-pack", action="store_true", help="on CPU, keep the linear weights as loaded")
    return parser


def first_query(tokenizer, tokens: int) -> str:
    """Lines of the default corpus joined until the text is about ``tokens`` tokens long."""
    from glm_port.models.chatglm2.tiny import corpus_lines

    lines, text = corpus_lines(), ""
    i = 0
    while len(tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += lines[i % len(lines)] + "\n"
        i += 1
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def main(argv=None) -> int:
    args = resolve(build_parser().parse_args(argv))
    if args.history < 1 or args.reply < 1 or args.repeats < 1:
        print("bench.chat_cache: error: --history, --reply and --repeats must be at least 1", file=sys.stderr)
        return 2
    print_cpu_line()
    import torch

    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.chat import build_inputs, build_stream_inputs
    from glm_port.models.chatglm2.tiny import build_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    config = ChatGLM2Config(
        num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
        multi_query_group_num=args.groups, kv_channels=args.kv_channels,
        padded_vocab_size=max(args.vocab, -(-tokenizer.vocab_size // 64) * 64),
        seq_length=max(2048, 2 * (args.history + args.reply) + 256),
    )
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    if model.device.type == "cpu" and not args.no_pack:
        from shim.nn import pack_linears

        pack_linears(model, batch_size=1)
    greedy = {"do_sample": False, "suppress_tokens": [tokenizer.eos_token_id]}

    query = first_query(tokenizer, args.history)
    for _, history, past in model.stream_chat(tokenizer, query, return_past_key_values=True,
                                              max_new_tokens=args.reply, **greedy):
        pass
    new_ids = build_stream_inputs(tokenizer, QUESTION, history)["input_ids"].shape[1]
    whole_ids = build_inputs(model, tokenizer, QUESTION, history)["input_ids"].shape[1]

    def sync():
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    def second_turn(reuse: bool) -> float:
        cache = copy.deepcopy(past) if reuse else None
        sync()
        start = time.perf_counter()
        for _ in model.stream_chat(tokenizer, QUESTION, history, past_key_values=cache, max_new_tokens=1, **greedy):
            pass
        sync()
        return time.perf_counter() - start

    from tqdm import tqdm

    times = {True: [], False: []}
    for reuse in (True, False):
        second_turn(reuse)  # warm-up
    for _ in tqdm(range(args.repeats), desc="second turns", leave=False):
        for reuse in (True, False):
            times[reuse].append(second_turn(reuse))
    print(f"shape: {args.layers} layers, hidden {args.hidden}, {args.heads} heads x {args.kv_channels} "
          f"({args.groups} kv groups), ffn {args.ffn}, vocab {config.padded_vocab_size}; {args.device} {args.dtype}"
          f"{'' if model.device.type != 'cpu' or args.no_pack else ', packed'}; turn 1: "
          f"{past.get_seq_length()} tokens cached; median of {args.repeats}")
    reuse_ms, whole_ms = (statistics.median(times[k]) * 1000 for k in (True, False))
    print("| second turn | tokens prefilled | ttft ms | speedup |")
    print("| --- | --- | --- | --- |")
    print(f"| reuse (past_key_values) | {new_ids} | {reuse_ms:.1f} | {whole_ms / reuse_ms:.2f}x |")
    print(f"| re-encode (whole conversation) | {whole_ids} | {whole_ms:.1f} | 1.00x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
