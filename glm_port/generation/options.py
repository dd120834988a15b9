"""Command-line options that glm-generate (``glm_port.generation.cli``) and glm-chat (``glm_port.chat``) both take,
written once so that their names, choices and help cannot drift apart."""

from __future__ import annotations

import argparse

QUANTIZE_MODES = ("int8", "int4")  # glm_port.models.QUANTIZE_BITS' keys; check_quantize checks the pair


def add_quantize_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--quantize int8|int4`` and ``--quantize-group-size`` (docs/quantization.md); the command checks them with
    ``glm_port.models.check_quantize`` and the family's ``quantize`` feature before loading."""
    parser.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                        help="weight-only quantization of the transformer layers' linears after loading, activations "
                             "in --dtype (int8: a scale a row; int4: a scale and zero a group of columns); the output "
                             "layer (ChatGLM2, GLM-4: kept in float as THUDM's), embeddings and norms stay float; in "
                             "place of the CPU repacking (default: off, or what config.json's quantization_bit says; "
                             "docs/quantization.md)")
    parser.add_argument("--quantize-group-size", type=int, default=None,
                        help="with --quantize int4: columns a scale, 32, 64 or 128, dividing every row (default 128)")


__all__ = ["QUANTIZE_MODES", "add_quantize_arguments"]
