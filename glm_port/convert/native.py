"""glm-convert: move a model directory between glm_port's family layout and transformers' native classes.

    glm-convert --to transformers chatglm2-6b/ chatglm2-6b-hf/     # then AutoModelForCausalLM, no remote code
    glm-convert --from transformers chatglm2-6b-hf/ chatglm2-6b/    # back to THUDM's names
    glm-convert --to transformers glm-4-9b-chat/ glm-4-9b-chat-hf/  # GLM-4: its tokenizer.json too

The family is read from SRC (``models.family_at``: ChatGLM2/ChatGLM3 or GLM-4, both model_type "chatglm" <->
transformers' "glm", told apart by their tokenizers), and converted by its ``convert`` binding
(``glm_port.models.contract.ConvertBinding``). Tensors are read one at a time across shards and written as
safetensors shards into a temporary directory renamed to DST when complete. Bad input ends with a one-line error
and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from glm_port.dtypes import METAVAR, dtype_argument, parse_dtype


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-convert",
        description="Convert a ChatGLM2/ChatGLM3 or GLM-4 directory (THUDM's weight names) to transformers' native "
        "GlmForCausalLM layout (--to transformers) or back (--from transformers).",
    )
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to", choices=["transformers"],
                           help="SRC is a ChatGLM2/GLM-4 directory; DST is for transformers (one of --to/--from is "
                           "required)")
    direction.add_argument("--from", dest="from_", choices=["transformers"],
                           help="SRC is a transformers GLM directory; DST gets THUDM's ChatGLM2/GLM-4 names (one of "
                           "--to/--from is required)")
    parser.add_argument("src", metavar="SRC", help="model directory to read (config.json + weights)")
    parser.add_argument("dst", metavar="DST", help="directory to write (must not exist or be empty)")
    parser.add_argument("--dtype", type=dtype_argument, metavar=METAVAR, default=None,
                        help="cast floating tensors; torch's float32, bfloat16, float16 too (default: keep SRC's)")
    parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors shard written (default 2GB)")
    return parser


def converting_family(src, to_transformers: bool):
    """The family whose ``convert`` binding converts ``src``: SRC's family (``models.family_at``: a ``detect``
    hook's claim, else its config.json's model type) where it converts; for ``--from``, else the family that reads
    SRC's transformers model type (its binding's ``TRANSFORMERS_MODEL_TYPES``: ChatGLM2's ``glm``). Where none does
    (no config.json, another family's, not JSON), the first family that converts, whose own reading of SRC then
    names what is wrong in one line."""
    from glm_port.models import FAMILIES, family_at

    converting = [family for family in FAMILIES.values() if family.convert is not None]
    try:
        family = family_at(src)  # a family's detect hook claims its directories in either layout (GLM-4's)
    except ValueError:  # not JSON, an unknown model type: the converter's own message says it
        family = None
    if family in converting:
        return family
    if not to_transformers:  # a transformers directory no family claims: the family reading its model type
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
