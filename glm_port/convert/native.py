"""glm-convert: move a model directory between glm_port's family layout and transformers' native classes.

    glm-convert --to transformers chatglm2-6b/ chatglm2-6b-hf/     # then AutoModelForCausalLM, no remote code
    glm-convert --from transformers chatglm2-6b-hf/ chatglm2-6b/    # back to THUDM's names

The family is read from SRC's config.json (ChatGLM2/ChatGLM3: model_type "chatglm" <-> transformers'
"glm"). Tensors are read one at a time across shards and written as safetensors shards into a temporary
directory renamed to DST when complete. Bad input ends with a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from glm_port.dtypes import METAVAR, dtype_argument, parse_dtype


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-convert",
        description="Convert a ChatGLM2/ChatGLM3 directory (THUDM's weight names) to transformers' native "
        "GlmForCausalLM layout (--to transformers) or back (--from transformers).",
    )
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to", choices=["transformers"],
                           help="SRC is a ChatGLM2 directory; DST is for transformers (one of --to/--from is required)")
    direction.add_argument("--from", dest="from_", choices=["transformers"],
                           help="SRC is a transformers GLM directory; DST gets THUDM's ChatGLM2 names (one of "
                           "--to/--from is required)")
    parser.add_argument("src", metavar="SRC", help="model directory to read (config.json + weights)")
    parser.add_argument("dst", metavar="DST", help="directory to write (must not exist or be empty)")
    parser.add_argument("--dtype", type=dtype_argument, metavar=METAVAR, default=None,
                        help="cast floating tensors; torch's float32, bfloat16, float16 too (default: keep SRC's)")
    parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors shard written (default 2GB)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from glm_port.models.chatglm2.convert import from_transformers, to_transformers
    from glm_port.models.chatglm2.weights import WeightsError
    from glm_port.outputs import OutputError

    dtype = parse_dtype(args.dtype)
    try:
        if args.to:
            to_transformers(args.src, args.dst, dtype=dtype, max_shard_size=args.max_shard_size)
        else:
            from_transformers(args.src, args.dst, dtype=dtype, max_shard_size=args.max_shard_size)
    except (WeightsError, OutputError, OSError) as exc:
        print(f"glm-convert: error: {exc}", file=sys.stderr)
        return 2
    print(f"glm-convert: wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
