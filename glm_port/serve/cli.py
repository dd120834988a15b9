"""``glm-serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over any model glm_port loads.

    glm-serve                                  # the embedded random-init tiny model on http://127.0.0.1:8000
    glm-serve --model chatglm3-6b              # a THUDM directory (any family glm_port reads)
    glm-serve --model chatglm3-6b --host 0.0.0.0 --api-key "$KEY"   # listening beyond loopback needs a key

Then ``http://127.0.0.1:8000/`` is a chat page, and the ``openai`` client talks to
``http://127.0.0.1:8000/v1``. Bad input is one line on stderr and exit status 2. docs/serve.md has the API,
the limits and the batching.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from glm_port.dtypes import METAVAR as DTYPE_METAVAR
from glm_port.dtypes import dtype_argument
from glm_port.serve.app import Limits

LOOPBACK_NAMES = ("localhost",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-serve",
        description="Serve a model over OpenAI's HTTP API (chat completions with tools, completions with GLM "
                    "blank filling, Server-Sent Events streaming), with batching, limits and a chat page at /.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + "\n".join("  " + line.strip() for line in __doc__.split("\n\n")[1].splitlines()))
    limits = Limits()
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="weights of any family glm_port reads (the family from config.json); default: the "
                             "embedded random-init tiny ChatGLM2-shaped model (no downloads; talks nonsense)")
    from glm_port.serve.engine import chat_formats

    parser.add_argument("--chat-format", choices=chat_formats(), default=None,
                        help="the chat format, one a family's chat binding speaks (default: what the model's "
                             "tokenizer files say; chatglm2 for the embedded model; glm4 with no --model: the "
                             "embedded tiny GLM-4)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients name (default: the directory's name)")
    net = parser.add_argument_group("network and access")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    net.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    net.add_argument("--api-key", default=os.environ.get("GLM_SERVE_API_KEY"),
                     help="clients must send 'Authorization: Bearer KEY' to /v1/ (default: $GLM_SERVE_API_KEY; "
                          "required when --host is not a loopback address)")
    caps = parser.add_argument_group("limits (each answered with a 4xx naming it)")
    caps.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes,
                      help=f"largest request body (default {limits.max_body_bytes}; over it: 413)")
    caps.add_argument("--max-prompt-tokens", type=int, default=None,
                      help="longest prompt in tokens (default: the model's seq_length - 1; over it: 400)")
    caps.add_argument("--max-tokens", type=int, default=limits.max_tokens,
                      help=f"largest max_tokens a request may ask, and the default when it asks none "
                           f"(default {limits.max_tokens}; over it: 400)")
    caps.add_argument("--max-n", type=int, default=limits.max_n, help=f"largest n (default {limits.max_n})")
    caps.add_argument("--max-queue", type=int, default=64,
                      help="sequences waiting for a batch slot at most (default 64; more: 429)")
    run = parser.add_argument_group("batching and compute")
    run.add_argument("--max-batch", type=int, default=16, help="sequences decoded together at most (default 16)")
    run.add_argument("--batch-wait-ms", type=float, default=5.0,
                     help="when idle, wait this long after a request for others to start with it (default 5)")
    run.add_argument("--temperature", type=float, default=limits.temperature,
                     help=f"sampling temperature where a request gives none (default {limits.temperature})")
    run.add_argument("--top-p", type=float, default=limits.top_p,
                     help=f"top-p where a request gives none (default {limits.top_p})")
    run.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when there is one)")
    run.add_argument("--dtype", type=dtype_argument, metavar=DTYPE_METAVAR, default=None,
                     help="fp32, bf16 or fp16 (or float32, bfloat16, float16); default: fp32 on CPU, the family's "
                          "default on a GPU")
    run.add_argument("--no-pack", action="store_true",
                     help="on CPU, keep the linear weights as loaded (default: oneDNN-packed where faster)")
    run.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return parser


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UsageError(ValueError):
    """Bad input: one line on stderr, exit status 2."""


def check(args) -> None:
    for name in ("max_body_bytes", "max_tokens", "max_n", "max_queue", "max_batch"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise UsageError(f"--max-prompt-tokens must be at least 1, got {args.max_prompt_tokens}")
    if not 0 <= args.temperature <= 2 or not 0 < args.top_p <= 1:
        raise UsageError("--temperature must be in [0, 2] and --top-p in (0, 1]")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: not a TCP port")
    if args.batch_wait_ms < 0:
        raise UsageError("--batch-wait-ms must not be negative")
    if not is_loopback(args.host) and not args.api_key:
        raise UsageError(f"--host {args.host} listens beyond this machine: give --api-key (or $GLM_SERVE_API_KEY)")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key is empty")


def build(args):
    """``(app, engine)`` from parsed arguments: the model loaded, packed on CPU, the engine started."""
    import torch

    from glm_port.serve.app import create_app
    from glm_port.serve.engine import Engine, ServedModel

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    served = ServedModel.load(args.model, dtype=args.dtype, device=device, chat_format=args.chat_format,
                              name=args.served_model_name)
    if not args.no_pack and served.model.device.type == "cpu" and served.stepped:
        from shim.nn import pack_linears

        pack_linears(served.model, batch_size=max(1, min(args.max_batch, 8)))
    engine = Engine(served, max_batch=args.max_batch, max_queue=args.max_queue, batch_wait_ms=args.batch_wait_ms)
    limits = Limits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                    max_tokens=args.max_tokens, max_n=args.max_n, temperature=args.temperature, top_p=args.top_p)
    return create_app(engine, api_key=args.api_key, limits=limits), engine


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check(args)
        app, engine = build(args)
    except (UsageError, ValueError, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"glm-serve: error: {message}", file=sys.stderr)
        return 2
    import uvicorn

    name = args.model or "the embedded random-init tiny model"
    print(f"glm-serve: {name} as {engine.served.name!r} on http://{args.host}:{args.port}/ "
          f"(OpenAI API at /v1)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
