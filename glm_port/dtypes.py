"""Dtype names, one place for every command: ``fp32|bf16|fp16`` and torch's ``float32|bfloat16|float16``
mean the same everywhere (glm-generate, glm-chat, glm-convert, glm-merge, glm-export and the loaders).

    parse_dtype("bf16") is parse_dtype("bfloat16") is torch.bfloat16
    parser.add_argument("--dtype", type=dtype_argument, metavar=METAVAR, ...)   # argparse: one-line error
"""

from __future__ import annotations

import argparse

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch's names
METAVAR = "{fp32,bf16,fp16}"
ACCEPTED = "fp32, bf16 or fp16 (or float32, bfloat16, float16)"


def dtype_name(name: str) -> str:
    """The short name (``fp32``/``bf16``/``fp16``) for either spelling; ValueError (one line) otherwise."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: choose {ACCEPTED}")
    return key


def parse_dtype(dtype) -> torch.dtype | None:
    """A ``torch.dtype`` from a name in either spelling; None and ``torch.dtype`` pass through."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return DTYPES[dtype_name(dtype)]


def dtype_argument(value: str) -> str:
    """argparse ``type=``: the short name, or argparse's one-line usage error (exit 2)."""
    try:
        return dtype_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
