"""glm-convert: move a model directory between glm_port's family layout and transformers' native classes.

    glm-convert --to transformers chatglm2-6b/ chatglm2-6b-hf/     # then AutoModelForCausalLM, no remote code
    glm-convert --from transformers chatglm2-6b-hf/ chatglm2-6b/    # back to THUDM's names

The family is read from SRC's config.json (ChatGLM2/ChatGLM3: model_type "chatglm" <-> transformers'
"glm"), and converted by its ``convert`` binding (``glm_port.models.contract.ConvertBinding``). Tensors are
read one at a time across shards and written as safetensors shards into a temporary directory renamed to DST
when complete. Bad input ends with a one-line error and exit status 2.
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


def converting_family(src, to_transformers: bool):
    """The family whose ``convert`` binding converts ``src``: ``--to``, SRC's family (its config.json,
    ``models.family_at``); ``--from``, the family that reads SRC's transformers model type (its binding's
    ``TRANSFORMERS_MODEL_TYPES``). ``--to`` the directory of a family with no ``convert`` binding whose model type a
    converting family reads too (GLM-4's "chatglm"): a one-line ``WeightsError`` naming the family. Anything else
    no converting family reads (no config.json, another model type, not JSON): the first family that converts,
    whose own reading of SRC then names what is wrong in one line."""
    from glm_port.models import FAMILIES, WeightsError, family_at

    converting = [family for family in FAMILIES.values() if family.convert is not None]
    if to_transformers:
        try:
            family = family_at(src)
        except ValueError:  # not JSON, an unknown model type: the converter's own message says it
            family = None
        if family in converting:
            return family
        if family is not None and any(_model_type(src) in f.model_types for f in converting):
            # another family's directory of a model type a converter reads (GLM-4's "chatglm", claimed by its
            # detect hook): refused by name, not misread as the converter's own family
            raise WeightsError(f"SRC {src}: glm-convert does not convert the {family.name} family")
    else:
        model_type = _model_type(src)
        for family in converting:
            if model_type in family.binding("convert").TRANSFORMERS_MODEL_TYPES:
                return family
    return converting[0]


def _model_type(directory) -> str | None:
    import json
    from pathlib import Path

    try:
        return json.loads((Path(directory) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from glm_port.models import WeightsError
    from glm_port.outputs import OutputError

    dtype = parse_dtype(args.dtype)
    try:
        convert = converting_family(args.src, bool(args.to)).binding("convert")
        if args.to:
            convert.to_transformers(args.src, args.dst, dtype=dtype, max_shard_size=args.max_shard_size)
        else:
            convert.from_transformers(args.src, args.dst, dtype=dtype, max_shard_size=args.max_shard_size)
    except (WeightsError, OutputError, OSError) as exc:
        print(f"glm-convert: error: {exc}", file=sys.stderr)
        return 2
    print(f"glm-convert: wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
