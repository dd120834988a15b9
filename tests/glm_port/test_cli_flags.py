"""What a user reads in the commands' --help, and one dtype vocabulary for all of them (issue 26, item 10):
every flag of glm-generate, glm-chat, glm-convert, glm-merge and glm-export has help that states its default,
and ``--dtype`` takes fp32|bf16|fp16 and float32|bfloat16|float16 alike, through ``glm_port.dtypes``."""

import argparse

import pytest
import torch

from glm_port import chat
from glm_port.convert import export, merge, native
from glm_port.dtypes import dtype_name, parse_dtype
from glm_port.generation import cli as generate

# parser, the arguments that make it parse (the required ones), where --dtype sits
COMMANDS = {
    "glm-generate": (generate.build_parser, ["--model", "m", "p"]),
    "glm-chat": (chat.build_parser, []),
    "glm-convert": (native.build_parser, ["--to", "transformers", "src", "dst"]),
    "glm-merge": (merge.build_parser, ["src", "out"]),
    "glm-export": (export.build_parser, ["--model_name_or_path", "m", "--output_path", "o"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_has_help_with_its_default(command):
    parser = COMMANDS[command][0]()
    required = {a for group in parser._mutually_exclusive_groups if group.required for a in group._group_actions}
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = action.help or ""
        name = "/".join(action.option_strings) or action.dest
        if not text.strip():
            missing.append(f"{name}: no help")
        elif action.option_strings and not action.required and action not in required and "default" not in text:
            missing.append(f"{name}: help does not state the default")
    assert not missing, f"{command}: " + "; ".join(missing)
    assert "%(default)" not in parser.format_help()  # and it renders


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("short, long", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")])
def test_dtype_takes_both_spellings(command, short, long):
    build, required = COMMANDS[command]
    parsed = [build().parse_args([*required, "--dtype", name]).dtype for name in (short, long, long.upper())]
    assert parse_dtype(parsed[0]) is parse_dtype(parsed[1]) is parse_dtype(parsed[2]) is getattr(torch, long)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unknown_dtype_is_argparse_one_line(command, capsys):
    build, required = COMMANDS[command]
    with pytest.raises(SystemExit) as stop:
        build().parse_args([*required, "--dtype", "float64"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --dtype: unknown dtype 'float64': choose fp32, bf16 or fp16 (or float32, bfloat16, float16)" \
        in err, err


def test_parse_dtype():
    assert parse_dtype(None) is None and parse_dtype(torch.float16) is torch.float16
    assert dtype_name(" BFloat16 ") == "bf16"
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        parse_dtype("int8")

