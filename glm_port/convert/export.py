"""``glm-export``: a (finetuned) GLM or ChatGLM2 for serving: one directory with the LoRA adapter folded in, in the
serving dtype, and (GLM) optionally a graph of the decoding step (ONNX, ``torch.export``).

    glm-export --model_name_or_path out/final --output_path served --dtype float16
    glm-export --model_name_or_path glm-large-chinese --lora_path out/final --output_path served --onnx
    glm-export --model_name_or_path out/final --output_path served --torch_export

PaddleNLP's ``export_model.py`` flag names. The output (``model.safetensors``, ``config.json``, the tokenizer
files) loads with ``glm-generate --model OUT`` and ``GLMForConditionalGeneration.from_pretrained(OUT)``;
``--onnx`` adds ``onnx/decode_step.onnx`` (checked against the eager model with onnxruntime before it is
written), ``--torch_export`` adds ``decode_step.pt2``. See ``glm_port.convert.decode_step`` for the graph's
inputs and outputs. The directory is written whole or not at all.

A ChatGLM2 model (THUDM's directory, or glm-finetune's tensor-parallel shards: the family comes from the
config, ``models.family_at``) is written in THUDM's layout by the family's writer, as glm-merge writes it
(its ``convert`` binding's ``save_checkpoint``; a GLM goes through its ``hf`` binding: the family is reached
through its bindings only, ``glm_port.models.contract``); it declares no decode-step graph
(``Family.supports``), so ``--onnx`` and ``--torch_export`` are refused for it in one line before anything is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import shim as torch
from glm_port.checkpoint_io import BASE_RECORD, CheckpointError, read_base_record, weights_fingerprint
from glm_port.convert.decode_step import (ONNX_INSTALL, check_onnx, export_onnx, export_program,
                                          missing_onnx_modules)
from glm_port.convert.merge import (DTYPE_METAVAR, ConvertError, check_not_adapter, check_output, source_tokenizer,
                                    torch_dtype, write_model_directory)
from glm_port.dtypes import dtype_argument
from glm_port.models import WeightsError, family_at

PROG = "glm-export"
ONNX_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # relative to the largest logit


def check_adapter_base(path: Path, source: Path, glm, *, allow_mismatch: bool = False) -> str | None:
    """Refuse an adapter that glm-finetune recorded as trained on another base than ``glm`` (the weights read
    from ``source``): its ``base_model.json`` fingerprint against ``glm``'s (``checkpoint_io``). Returns the
    warning to print once the adapter has folded in, if any: an adapter without the record (plain PEFT's, a
    tensor-parallel run's) cannot be checked; a mismatch passes with ``allow_mismatch``."""
    try:
        record = read_base_record(path)
    except CheckpointError as error:
        raise ConvertError(f"--lora_path {error}") from None
    expected = (record or {}).get("weights_sha256")
    if not expected:
        why = (f"no {BASE_RECORD}: not saved by glm-finetune" if record is None else
               f"{BASE_RECORD} names {record.get('base_model_name_or_path')} without a weights fingerprint")
        return f"{PROG}: warning: cannot check that --lora_path {path} was trained on {source} ({why})"
    actual = weights_fingerprint(glm.state_dict())
    if actual == expected:
        return None
    trained_on = record.get("base_model_name_or_path") or "another base"
    message = (f"--lora_path {path} was trained on {trained_on} (weights sha256 {expected[:12]}), not on "
               f"--model_name_or_path {source} (sha256 {actual[:12]})")
    if not allow_mismatch:
        raise ConvertError(f"{message}: pass --allow_base_mismatch to fold it in anyway")
    return f"{PROG}: warning: {message}; folded in as --allow_base_mismatch asks"


def check_adapter(path: Path) -> None:
    """A ConvertError unless ``path`` is a PEFT adapter directory (missing, a file, no adapter_config.json)."""
    from glm_port.finetune.lora import adapter_problem

    problem = adapter_problem(path)
    if problem is not None:
        raise ConvertError(f"--lora_path {path}: {problem}")


def fold_adapter(glm, path: Path):
    """``glm`` (a GLMModel) with the PEFT LoRA adapter at ``path`` merged into its weights (PEFT's
    ``merge_and_unload``)."""
    import peft

    check_adapter(path)
    try:
        adapted = peft.PeftModel.from_pretrained(glm, str(path), is_trainable=False)
    except (RuntimeError, ValueError, KeyError) as error:  # shapes or module names of another base model
        first = str(error).strip().splitlines()[0]
        raise ConvertError(f"--lora_path {path} was made for another base model: {first}") from None
    return adapted.merge_and_unload()


def export(model_name_or_path, output_path, *, lora_path=None, dtype: str = "float32", onnx: bool = False,
           torch_export: bool = False, tokenizer_type=None, tokenizer_path=None, overwrite: bool = False,
           allow_base_mismatch: bool = False, quantize: str | None = None, log=print) -> dict:
    source, out = Path(model_name_or_path).expanduser(), Path(output_path).expanduser()
    lora = Path(lora_path).expanduser() if lora_path else None
    tokenizer_path = Path(tokenizer_path).expanduser() if tokenizer_path else None
    target = torch_dtype(dtype)
    check_output(out, overwrite, ("--model_name_or_path", source), ("--lora_path", lora),
                 ("--tokenizer_path", tokenizer_path), out_flag="--output_path")
    if not source.exists():
        raise ConvertError(f"--model_name_or_path {source}: no such file or directory")
    check_not_adapter(source, "--model_name_or_path")
    family = family_at(source)  # its config.json, or the config its shards carry; GLM without one
    family.require((f"--model_name_or_path {source}", "export"), (lora is not None and "--lora_path", "lora"),
                   (onnx and "--onnx", "decode_graph"), (torch_export and "--torch_export", "decode_graph"))
    if onnx and (missing := missing_onnx_modules()):
        raise ConvertError(f"--onnx needs {' and '.join(missing)}, not installed here: {ONNX_INSTALL}")
    if lora is not None:
        check_adapter(lora)  # before the model loads
    family.require((quantize and f"--quantize {quantize}", "quantize"))
    if quantize is not None and family.hf is not None:
        raise ConvertError(f"--quantize {quantize}: glm-export writes quantized weights for ChatGLM2 only (THUDM's "
                           f"layout); quantize a GLM at load with glm-generate --quantize")
    if quantize is not None:  # a layout with no quantized form says so before anything is read
        family.binding("convert").check_quantize(quantize)
    if family.hf is None:  # kept in its own layout: its weights and convert bindings
        return export_own_layout(family, source, out, lora, target, tokenizer_type=tokenizer_type,
                                 tokenizer_path=tokenizer_path, overwrite=overwrite,
                                 allow_base_mismatch=allow_base_mismatch, quantize=quantize)
    hf = family.binding("hf")
    model = hf.model_class.from_pretrained(source, dtype=torch.float32)  # merge in fp32
    tokenizer = source_tokenizer(hf, source, tokenizer_type, tokenizer_path, model.config.vocab_size)
    if lora is not None:
        model.glm = fold_checked(model.glm, source, lora, allow_base_mismatch)
    model = model.to(target).eval()
    state = {k: v.detach() for k, v in model.glm.state_dict().items()}
    report = {"output": str(out), "dtype": str(target).replace("torch.", ""), "lora": str(lora) if lora else None}

    def graphs(work: Path) -> None:
        if onnx:
            path = export_onnx(model, work / "onnx" / "decode_step.onnx")
            try:
                error = check_onnx(model, path)
            except Exception as failure:
                if target == torch.float32:
                    raise
                # onnxruntime's CPU provider lacks kernels for some half-precision ops (bfloat16 Add, ...)
                reason = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
                log(f"{PROG}: onnxruntime could not run the {dtype} graph on CPU, so it is not checked "
                    f"({reason[:160]})")
                report["onnx_check"] = None
            else:
                if error > ONNX_TOLERANCE[target]:
                    raise ConvertError(f"the ONNX graph's logits differ from the eager model's by {error:.2e} "
                                       f"(relative), more than {ONNX_TOLERANCE[target]:.0e}")
                report["onnx_check"] = error
                log(f"{PROG}: ONNX decode step checked with onnxruntime: max |logits - eager| = {error:.2e} "
                    f"of the largest logit (prompt forward + 3 cached steps)")
            report["onnx"] = str(out / "onnx" / "decode_step.onnx")
        if torch_export:
            export_program(model, work / "decode_step.pt2")
            report["torch_export"] = str(out / "decode_step.pt2")

    write_model_directory(hf, state, model.config, target, tokenizer, hf.tokenizer_files(source, tokenizer_path),
                          out, extra=graphs)
    report["parameters"] = sum(t.numel() for t in state.values())
    return report


def fold_checked(model, source: Path, lora: Path, allow_base_mismatch: bool):
    """``model`` (the base read from ``source``) with the adapter at ``lora`` folded in, after the base record
    check; the check's warning, if any, printed once it has folded in."""
    warning = None
    if (lora / "adapter_config.json").is_file():  # (fold_adapter refuses any other folder)
        warning = check_adapter_base(lora, source, model, allow_mismatch=allow_base_mismatch)
    model = fold_adapter(model, lora)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return model


def export_own_layout(family, source: Path, out: Path, lora: Path | None, target, *, tokenizer_type=None,
                      tokenizer_path=None, overwrite: bool = False, allow_base_mismatch: bool = False,
                      quantize: str | None = None) -> dict:
    """A family kept in its own layout (ChatGLM2: a THUDM directory or glm-finetune's shards) with ``lora`` folded
    in, in ``target`` dtype, written in that layout by the family's writer (its ``convert`` binding's
    ``save_checkpoint``, what glm-merge writes). ``quantize`` ("int8", "int4"): the weights quantized as the
    layout stores them (``convert.quantize_checkpoint``; ChatGLM2: the layers' four linears as THUDM's
    ``quantization.py`` writes them, int8 or packed int4, a ``weight_scale`` a row in ``target``,
    ``quantization_bit`` in config.json): the directory loads quantized as it is, by THUDM's code too."""
    weights, convert = family.binding("weights"), family.binding("convert")
    if tokenizer_type is not None:
        raise ConvertError(f"--tokenizer_type is for GLM vocabularies; the {family.name} family reads its "
                           f"tokenizer.model (--tokenizer_path)")
    tokenizer = convert.tokenizer_for(source, weights.open_weights(source), tokenizer_path)
    model = weights.load_pretrained(source, dtype=torch.float32, quantized=False)  # fold in fp32
    if tokenizer.vocab_size > model.config.padded_vocab_size:
        raise ConvertError(f"the tokenizer gives {tokenizer.vocab_size} ids, more than the model's "
                           f"padded_vocab_size ({model.config.padded_vocab_size}): name its own with --tokenizer_path")
    if lora is not None:
        model = fold_checked(model, source, lora, allow_base_mismatch)
    state = {k: v.detach().to(target) if v.is_floating_point() else v.detach() for k, v in model.state_dict().items()}
    config = model.config
    if quantize is not None:
        state, config = convert.quantize_checkpoint(state, config, quantize)
    written = convert.save_checkpoint(state, config, tokenizer, out, overwrite=overwrite,
                              inputs=[("--model_name_or_path", source), ("--lora_path", lora),
                                      ("--tokenizer_path", tokenizer_path)])
    return {"output": written["output"], "dtype": written["dtype"], "lora": str(lora) if lora else None,
            "parameters": written["parameters"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Export a GLM or ChatGLM2 for serving: LoRA folded in, the weights in the serving dtype, "
        "config and tokenizer files; optionally (GLM) an ONNX or torch.export graph of the decoding step.",
        epilog="The graph takes new tokens after a key/value cache (past 0: the prompt; query 1: a decode step); "
        "see docs/finetune.md, 'Merging shards and exporting', for its inputs and what does not export.")
    parser.add_argument("--model_name_or_path", required=True,
                        help="the model: a Hugging Face GLM directory (glm-finetune's final/), tensor-parallel shards, "
                        "a glm-pretrain --save directory, or a ChatGLM2 directory (THUDM's layout, written back in it)")
    parser.add_argument("--lora_path", default=None,
                        help="a PEFT LoRA adapter (glm-finetune --lora's output) to fold in (default: none)")
    parser.add_argument("--output_path", required=True, help="the directory to write")
    parser.add_argument("--dtype", default="float32", type=dtype_argument, metavar=DTYPE_METAVAR,
                        help="weights (and graph) precision; fp32, bf16, fp16 too (default float32)")
    parser.add_argument("--onnx", action="store_true",
                        help="also write onnx/decode_step.onnx, checked against the eager model with onnxruntime "
                        "(GLM only; default: no graph)")
    parser.add_argument("--torch_export", action="store_true",
                        help="also write decode_step.pt2, torch.export (GLM only; default: no graph)")
    parser.add_argument("--tokenizer_type", default=None,
                        help="vocabulary type, where none is beside the model (default: the one beside it, else "
                        "glm-pretrain's built-in)")
    parser.add_argument("--tokenizer_path", default=None,
                        help="vocabulary file or directory to copy (default: the files beside the model)")
    parser.add_argument("--quantize", choices=["int8", "int4"], default=None,
                        help="ChatGLM2: write the layers' linears quantized in THUDM's layout (int8, or int4 packed "
                        "two a byte; a scale a row; quantization_bit in config.json), which loads quantized as it "
                        "is; output layer, embedding and norms in --dtype (default: none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --output_path if it exists (default: refuse a non-empty one)")
    parser.add_argument("--allow_base_mismatch", "--allow-base-mismatch", action="store_true",
                        help="fold in a --lora_path adapter that glm-finetune recorded as trained on other base "
                        "weights than --model_name_or_path (refused by default)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        report = export(args.model_name_or_path, args.output_path, lora_path=args.lora_path, dtype=args.dtype,
                        onnx=args.onnx, torch_export=args.torch_export, tokenizer_type=args.tokenizer_type,
                        tokenizer_path=args.tokenizer_path, overwrite=args.overwrite,
                        allow_base_mismatch=args.allow_base_mismatch, quantize=args.quantize)
    except (ConvertError, WeightsError, OSError, ValueError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)
    lora = f" with {report['lora']} folded in" if report["lora"] else ""
    print(f"{PROG}: wrote {report['output']} ({report['parameters']:,} parameters in {report['dtype']}{lora})"
          + "".join(f"; {key.replace('_', '.')}: {report[key]}" for key in ("onnx", "torch_export") if key in report)
          + f"\n{PROG}: load it with: glm-generate --model {report['output']} \"...\"", flush=True)


if __name__ == "__main__":
    main()
