"""glm-serve under load on loopback: aggregate tokens/s and time to first token at 1, 4, 8, 16 clients; a soak
with random disconnects. Not a test: it prints figures (docs/serve.md quotes them).

A ``glm-serve`` process is started on a free port (the embedded tiny model unless ``--model``), and each level
runs N concurrent clients, each sending ``--requests`` streamed ``/v1/completions`` one after the other
(``--max-tokens`` each, greedy, a prompt of its own, ``stream_options.include_usage`` so tokens are the
server's count). Per level: aggregate completion tokens / wall time, p50/p95 time to first token (request
sent -> first chunk with text), failed requests. The server's resident memory (psutil) is read after the
first request and after the last level.

``--soak N``: N requests from ``--soak-clients`` clients, each request dropped by its client after a random
number of chunks with probability ``--drop``; then the server must be idle (/health: nothing running or
queued), every kept request must have finished, and its memory is read again.

    python -m bench.serve                                  # tiny model, 1/4/8/16 clients x 4 requests x 64 tokens
    python -m bench.serve --clients 1 8 --requests 2 --max-tokens 16 --soak 0      # smoke run
    python -m bench.serve --model chatglm3-6b --clients 1 4 8 --max-tokens 128
    python -m bench.serve --clients --soak 300             # the soak only
    python -m bench.serve --width 1024 --layers 4          # a random ChatGLM2 of that shape, written and served

``--width H --layers L``: a random-init ChatGLM2 (ChatGLM2-6B's layout: 2 key/value groups, heads of 128 or
fewer, ffn about 3.3 H) with the tiny tokenizer, written to a temporary THUDM-layout directory and served from
there (through glm-serve's ordinary loading), so that the model's compute, not Python, sets the pace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

from bench._measure import print_cpu_line
from harness import free_port


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="glm-serve --model (default: the embedded tiny model)")
    parser.add_argument("--width", type=int, default=None, help="serve a random ChatGLM2 of this hidden size")
    parser.add_argument("--layers", type=int, default=4, help="its layers (with --width)")
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 4, 8, 16], help="concurrency levels")
    parser.add_argument("--requests", type=int, default=4, help="requests per client per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="the server's torch threads (0: torch's default)")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--soak", type=int, default=200, help="soak requests after the levels (0: none)")
    parser.add_argument("--soak-clients", type=int, default=8)
    parser.add_argument("--drop", type=float, default=0.3, help="share of soak requests dropped mid-stream")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-arg", action="append", default=[], help="more glm-serve arguments")
    return parser


def write_model(width: int, layers: int, directory) -> str:
    """A random ChatGLM2 of that shape and the tiny tokenizer, as THUDM lays a directory out."""
    import torch

    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.tiny import build_tokenizer
    from glm_port.models.chatglm2.weights import save_sharded

    tokenizer = build_tokenizer(str(directory))
    heads = max(2, width // 128)
    config = ChatGLM2Config(num_layers=layers, hidden_size=width, ffn_hidden_size=(width * 107 // 32) // 16 * 16,
                            kv_channels=width // heads, num_attention_heads=heads, multi_query_group_num=2,
                            padded_vocab_size=-(-tokenizer.vocab_size // 64) * 64, seq_length=2048)
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).eval()
    save_sharded(dict(model.state_dict()), directory, shards=1, fmt="safetensors")
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def start_server(args, port):
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [sys.executable, "-m", "glm_port.serve", "--port", str(port), "--log-level", "warning",
               "--max-batch", str(args.max_batch), "--max-queue", "256", *args.server_arg]
    if args.model:
        command += ["--model", args.model]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def wait_up(http, base, process):
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"glm-serve exited: {process.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            if (await http.get(base + "/health")).status_code == 200:
                return
        except Exception:
            pass
        await asyncio.sleep(0.5)
    raise SystemExit("glm-serve did not come up in 300 s")


async def one_request(http, base, model, prompt, max_tokens, drop_after=None):
    """``(ok, tokens, ttft, dropped)`` for one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, ttft, tokens, chunks, finished = time.perf_counter(), None, 0, 0, False
    try:
        async with http.stream("POST", base + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return False, 0, None, False
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return False, 0, ttft, False
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    if ttft is None and (choice.get("text") or choice.get("finish_reason")):
                        ttft = time.perf_counter() - start
                    finished = finished or choice.get("finish_reason") is not None
                chunks += 1
                if drop_after is not None and chunks >= drop_after:
                    return True, 0, ttft, True  # leaving: the context manager closes the connection
    except Exception:
        return False, 0, ttft, False
    return finished, tokens, ttft, False


async def level(http, base, model, clients, args):
    ttfts, failed, tokens = [], 0, 0

    async def client(c):
        nonlocal failed, tokens
        for r in range(args.requests):
            ok, n, ttft, _ = await one_request(http, base, model, f"client {c} request {r}: once upon a time",
                                               args.max_tokens)
            failed += not ok
            tokens += n
            if ttft is not None:
                ttfts.append(ttft)

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - start
    ttfts.sort()
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))] if ttfts else float("nan")
    return {"clients": clients, "requests": clients * args.requests, "tokens": tokens, "seconds": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p95_ms": 1000 * p95, "failed": failed}


async def soak(http, base, model, args, rng, count):
    failed, dropped, kept = 0, 0, 0
    queue = list(range(count))

    async def client():
        nonlocal failed, dropped, kept
        while queue:
            i = queue.pop()
            drop = rng.randint(1, max(2, args.max_tokens // 2)) if rng.random() < args.drop else None
            ok, _, _, was_dropped = await one_request(http, base, model, f"soak {i}: the river", args.max_tokens,
                                                      drop)
            failed += not ok
            dropped += was_dropped
            kept += ok and not was_dropped

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.soak_clients)))
    wall = time.perf_counter() - start
    deadline, health = time.monotonic() + 30, {}
    while time.monotonic() < deadline:  # dropped requests leave at the next step: the server goes idle
        health = (await http.get(base + "/health")).json()
        if health["running"] == 0 and health["queued"] == 0:
            break
        await asyncio.sleep(0.1)
    return {"requests": count, "dropped": dropped, "finished": kept, "failed": failed, "seconds": wall,
            "idle_after": health.get("running") == 0 and health.get("queued") == 0}


async def main_async(args):
    import httpx
    import psutil

    rng = random.Random(args.seed)
    written = None
    if args.width:
        import tempfile

        written = tempfile.TemporaryDirectory(prefix="bench-serve-")  # removed at the end
        args.model = write_model(args.width, args.layers, written.name)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(args, port)
    server = psutil.Process(process.pid)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as http:
            await wait_up(http, base, process)
            model = (await http.get(base + "/v1/models")).json()["data"][0]["id"]
            ok, *_ = await one_request(http, base, model, "warm up", args.max_tokens)
            rss_first = server.memory_info().rss
            print(f"glm-serve on {model!r}; server "
                  f"threads {args.threads or 'default'}; {args.requests} requests per client, {args.max_tokens} "
                  f"tokens each, greedy", flush=True)
            print(f"{'clients':>7} {'requests':>8} {'tokens':>7} {'s':>7} {'tok/s':>8} {'x1':>6} "
                  f"{'TTFT p50 ms':>11} {'p95 ms':>8} {'failed':>6}")
            single = None
            for clients in args.clients:
                row = await level(http, base, model, clients, args)
                single = single or row["tokens_per_s"]
                print(f"{row['clients']:>7} {row['requests']:>8} {row['tokens']:>7} {row['seconds']:>7.2f} "
                      f"{row['tokens_per_s']:>8.1f} {row['tokens_per_s'] / single:>6.2f} {row['ttft_p50_ms']:>11.0f} "
                      f"{row['ttft_p95_ms']:>8.0f} {row['failed']:>6}", flush=True)
            rss_levels = server.memory_info().rss
            print(f"server RSS: {rss_first / 2**20:.1f} MiB after the first request, {rss_levels / 2**20:.1f} MiB "
                  f"after the levels ({100 * (rss_levels / rss_first - 1):+.1f}%)", flush=True)
            rounds = 4 if args.soak >= 4 else 1
            for round_ in range(rounds if args.soak else 0):  # memory read after each quarter: flat or growing
                count = args.soak // rounds + (round_ < args.soak % rounds)
                result = await soak(http, base, model, args, rng, count)
                rss_soak = server.memory_info().rss
                print(f"soak {round_ + 1}/{rounds}: {result['requests']} requests from {args.soak_clients} clients "
                      f"in {result['seconds']:.1f} s: {result['dropped']} dropped mid-stream, {result['finished']} "
                      f"finished, {result['failed']} failed; idle after: {result['idle_after']}; RSS "
                      f"{rss_soak / 2**20:.1f} MiB ({100 * (rss_soak / rss_first - 1):+.1f}% on the first request)",
                      flush=True)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        if written is not None:
            written.cleanup()


def main(argv=None):
    args = build_parser().parse_args(argv)
    print_cpu_line()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
