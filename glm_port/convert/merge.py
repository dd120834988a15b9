"""``glm-merge SRC OUT``: any GLM weights -> one Hugging Face GLM directory (single-shard safetensors,
``config.json``, the tokenizer files), which ``glm-generate --model OUT``, ``GLMForConditionalGeneration
.from_pretrained(OUT)`` and ``glm-finetune --model_name_or_path OUT`` load; ChatGLM2 shards -> one THUDM-layout
ChatGLM2 directory.

    glm-merge runs/ft/final runs/ft/merged                # glm-finetune --tensor_parallel_degree 2 shards
    glm-merge checkpoints/glm-large/ glm-large-hf          # upstream mp_rank_XX_model_states.pt files
    glm-merge --dtype bf16 glm-10b-sharded/ glm-10b-one    # a sharded HF directory, as one file in bf16

SRC is whatever GLM's ``find_source`` (``glm_port.models.glm.weights``) reads: tensor-parallel shards
(``mp_rank_XX_model_states.pt`` of glm-pretrain, glm-finetune or upstream, under a checkpoint tracker or
in an iteration directory), a Hugging Face directory (one file, sharded with an index, ``.bin``). Shards
are merged by Megatron's split rules as the loaders apply them (``weights.iter_tensors`` at
tensor-parallel size 1: the rules exist once, GLM's split plan ``splits.SPLIT_PLAN``). Names and shapes are checked
against the architecture before anything is written; the output is assembled in a hidden directory
beside OUT and renamed into place, so a failure leaves nothing half-written.

The family comes from SRC's ``config.json`` or, for shards, from the config they carry (``models.family_at``),
and is reached through its bindings only (``glm_port.models.contract``): a family written as a Hugging Face
directory of its own classes (GLM) through its ``hf`` binding, the pieces assembled here; a family kept in its
own layout (ChatGLM2) through its ``convert`` binding's ``merge_checkpoint``. ChatGLM2 shards (glm-finetune's
at any tensor-parallel size) are merged by the family's own rule,
``chatglm2.weights.tensor_parallel_merge`` (the inverse of its split: ``query_key_value`` as ``[Q | K | V]``
with replicated key/value groups, ``dense_h_to_4h`` as ``[gate | up]``), into THUDM's names and layout
(safetensors shards of at most 2 GB + index, ``config.json`` with model_type "chatglm", ``tokenizer.model``),
which ``chatglm2.weights.load_pretrained``, glm-generate, glm-chat and ``glm-convert --to transformers`` read.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

import shim as torch
from glm_port.dtypes import METAVAR as DTYPE_METAVAR
from glm_port.dtypes import dtype_argument, parse_dtype
from glm_port.models import WeightsError, family_at
from glm_port.outputs import OutputError, check_apart, check_directory_output, discard, publish, work_directory

PROG = "glm-merge"
# Files that make a GLM tokenizer (GLMTokenizer.from_pretrained reads them), copied from the source, and
# transformers' generation defaults, which travel with the weights too.


class ConvertError(ValueError):
    """Bad input to glm-merge / glm-export: one line, exit status 2."""


# ---- the output directory ----------------------------------------------------------------------------


def torch_dtype(dtype):
    """``--dtype`` in either spelling (``glm_port.dtypes``) as a torch dtype (None: keep); ConvertError otherwise."""
    try:
        return parse_dtype(dtype)
    except ValueError as error:
        raise ConvertError(f"--dtype: {error}") from None


def check_not_adapter(path: Path, flag: str = "SRC") -> None:
    if (path / "adapter_config.json").is_file():
        raise ConvertError(f"{flag} {path} is a PEFT LoRA adapter, not a model: fold it into its base with "
                           f"glm-export --model_name_or_path BASE --lora_path {path}")


def check_output(out: Path, overwrite: bool, *sources: tuple[str, Path | None], out_flag: str = "OUT") -> None:
    """Refuse an output that would clobber an input (``outputs.check_apart``: OUT may neither be, contain nor
    lie inside any of ``sources``, ``(flag, path)`` pairs, whatever ``overwrite`` says) or cannot be written,
    before any work is done."""
    check_apart(out, sources, out_flag)
    check_directory_output(out, out_flag, overwrite=overwrite)


def hf_config(config, dtype) -> dict:
    """``config.json`` for a ``GLMConfig``: transformers' fields, our class, the stored dtype."""
    config.architectures = ["GLMForConditionalGeneration"]
    config.dtype = dtype
    fields = config.to_dict()
    fields.pop("_name_or_path", None)
    return fields


def check_against_architecture(hf, state: dict, config, where) -> None:
    """Every weight the architecture needs, with its shape, and nothing else (checked on the meta device);
    ``hf``: the family's ``hf`` binding."""
    with torch.device("meta"):
        model = hf.model_class(config)
    expected = {k[len(hf.HF_PREFIX):]: list(v.shape) for k, v in model.state_dict().items()}
    for name, tensor in state.items():
        if name not in expected:
            raise ConvertError(f"{where}: unexpected weight {name} (not a GLM of this architecture?)")
        if list(tensor.shape) != expected[name]:
            raise ConvertError(f"{where}: {name} is {list(tensor.shape)}, the architecture in config.json "
                               f"needs {expected[name]}")
    missing = [k for k in expected if k not in state]
    if missing:
        raise ConvertError(f"{where}: missing {len(missing)} weight(s), e.g. {missing[0]}")


def source_tokenizer(hf, path: Path, tokenizer_type: str | None, tokenizer_path: Path | None, vocab_size: int):
    """The tokenizer glm-generate would use for ``path`` with these flags (``hf``: the family's ``hf`` binding).
    With no flags and no vocabulary file beside the weights, glm-generate falls back to the built-in
    vocabulary: taken only when the model's vocabulary size is that one's (a model trained on it), an error
    otherwise."""
    try:
        tokenizer = hf.load_tokenizer(path, tokenizer_type, tokenizer_path)
    except (OSError, ValueError) as error:
        raise ConvertError(f"tokenizer: {str(error).strip().splitlines()[0]}") from None
    named = tokenizer_type or tokenizer_path
    found = any(f.name not in hf.TOKENIZER_FILES for f in hf.tokenizer_files(path))
    if not named and not found and tokenizer.vocab_size != vocab_size:
        raise ConvertError(f"no vocabulary file beside {path} (and the model's {vocab_size} tokens are not the "
                           f"built-in vocabulary's): name it with --tokenizer-path (and --tokenizer-type)")
    return tokenizer


def write_model_directory(hf, state: dict, config, dtype, tokenizer, files: list[Path], out: Path,
                          extra=None) -> Path:
    """Assemble ``out``: single-shard ``model.safetensors`` + ``config.json`` (the ``hf`` binding's ``save_hf``),
    the tokenizer ``files`` (or a ``tokenizer_config.json`` naming a built-in vocabulary), then ``extra(work)``
    (more files, e.g. graphs); published atomically. The written tokenizer is read back and must be
    ``tokenizer`` (same fingerprint): a vocabulary that would not load beside the weights is an error."""
    if tokenizer.vocab.num_tokens > config.vocab_size:
        raise ConvertError(f"the {tokenizer.vocab.name} vocabulary has {tokenizer.vocab.num_tokens} tokens, more "
                           f"than the model's {config.vocab_size}: name the one it was trained with "
                           f"(--tokenizer-type / --tokenizer-path)")
    work = work_directory(out)
    try:
        hf.save_hf(state, work, hf_config(config, dtype), shown_as=out)
        for file in files:
            shutil.copy2(file, work / file.name)
        if not (work / "tokenizer_config.json").is_file():
            hf.tokenizer_class(tokenizer.vocab).save_pretrained(work)  # names the vocabulary's type
        written = hf.load_tokenizer(work)
        if written.vocab.fingerprint != tokenizer.vocab.fingerprint:
            raise ConvertError(f"the tokenizer files written ({', '.join(sorted(p.name for p in work.iterdir()))}) "
                               f"load as {written.vocab.name}, not the source's {tokenizer.vocab.name}: "
                               f"name the vocabulary with --tokenizer-path")
        if extra is not None:
            extra(work)
        publish(work, out)
    finally:
        discard(work)
        discard(work.with_name(f".{work.name}.tmp"))  # save_hf's own temporary, should it have failed
    return out


# ---- merging -----------------------------------------------------------------------------------------


def merged_state(hf, source, dtype=None) -> dict:
    """Every weight of ``source`` whole (shards merged by Megatron's rules), upstream's names."""
    state = {}
    for name, tensor in tqdm(hf.iter_tensors(source, tp_size=1, tp_rank=0), unit="tensor",
                             desc=PROG, leave=False, disable=not sys.stderr.isatty()):
        if "lora_" in name or name.startswith("base_model."):
            raise ConvertError(f"{source.path} holds a LoRA training checkpoint ({name}); export the saved "
                               f"adapter with glm-export --model_name_or_path BASE --lora_path ADAPTER")
        if not isinstance(tensor, torch.Tensor):
            tensor = tensor[:]
        tensor = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        state[name] = tensor.contiguous()
    return state


def merge(src, out, *, dtype: str | None = None, tokenizer_type: str | None = None, tokenizer_path=None,
          num_attention_heads: int | None = None, overwrite: bool = False) -> dict:
    """Merge the weights at ``src`` into one directory ``out`` (GLM: a Hugging Face directory; ChatGLM2: THUDM's
    layout); returns a summary."""
    src, out = Path(src).expanduser(), Path(out).expanduser()
    tokenizer_path = Path(tokenizer_path).expanduser() if tokenizer_path else None
    check_output(out, overwrite, ("SRC", src), ("--tokenizer-path", tokenizer_path))
    dtype = torch_dtype(dtype)
    check_not_adapter(src)
    family = family_at(src)  # its config.json, or the config its shards carry; GLM without one
    if "merge" not in family.supports:  # declared by the family (Family.supports), before anything is read
        raise ConvertError(f"SRC {src}: glm-merge does not merge the {family.name} family")
    if family.hf is None:  # kept in its own layout: its convert binding merges
        return merge_own_layout(family, src, out, dtype=dtype, tokenizer_type=tokenizer_type,
                                tokenizer_path=tokenizer_path, num_attention_heads=num_attention_heads,
                                overwrite=overwrite)
    hf = family.binding("hf")
    source = hf.find_source(src)
    overrides = {"num_attention_heads": num_attention_heads} if num_attention_heads else {}
    config = hf.source_config(source, overrides)
    tokenizer = source_tokenizer(hf, source.path, tokenizer_type, tokenizer_path, config.vocab_size)
    state = merged_state(hf, source, dtype)
    check_against_architecture(hf, state, config, src)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    stored = dtype or (dtypes.pop() if len(dtypes) == 1 else torch.float32)
    write_model_directory(hf, state, config, stored, tokenizer, hf.tokenizer_files(source.path, tokenizer_path), out)
    return {"source": str(src), "kind": source.kind, "shards": source.mp_size, "output": str(out),
            "tensors": len(state), "parameters": sum(t.numel() for t in state.values()),
            "dtype": str(stored).replace("torch.", ""), "tokenizer": tokenizer.vocab.name}


def merge_own_layout(family, src: Path, out: Path, *, dtype=None, tokenizer_type=None, tokenizer_path=None,
                     num_attention_heads=None, overwrite=False) -> dict:
    """A family kept in its own layout (ChatGLM2's shards, or a THUDM directory) -> one directory in that layout,
    by its ``convert`` binding's ``merge_checkpoint`` (ChatGLM2: the parts put together by
    ``chatglm2.weights.tensor_parallel_merge``, the inverse of its split)."""
    merge_checkpoint = family.binding("convert").merge_checkpoint
    if tokenizer_type is not None:
        raise ConvertError(f"--tokenizer-type is for GLM vocabularies; the {family.name} family reads its "
                           f"tokenizer.model (--tokenizer-path)")
    if num_attention_heads is not None:
        raise ConvertError(f"--num-attention-heads is for upstream GLM files; {family.name} checkpoints carry "
                           f"their config")
    return merge_checkpoint(src, out, dtype=dtype, tokenizer_path=tokenizer_path,
                            overwrite=overwrite)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Merge any GLM weights into one Hugging Face directory (single-shard safetensors, "
        "config.json, tokenizer files) that glm-generate and from_pretrained load; ChatGLM2 shards into one "
        "THUDM-layout ChatGLM2 directory (what glm-chat, glm-generate and glm-convert read).",
        epilog="SRC: tensor-parallel shards (mp_rank_XX_model_states.pt of glm-finetune, glm-pretrain or upstream; "
        "a checkpoint directory with its tracker, or an iteration directory), or a Hugging Face GLM directory "
        "(sharded or not). The family (GLM or ChatGLM2) comes from SRC's config.json or the config its shards "
        "carry. OUT is written whole or not at all.")
    parser.add_argument("src", metavar="SRC", help="the weights to merge")
    parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist, or be empty)")
    parser.add_argument("--dtype", type=dtype_argument, metavar=DTYPE_METAVAR, default=None,
                        help="store the weights in this dtype; torch's float32, bfloat16, float16 too (default: as the "
                        "source stores them)")
    parser.add_argument("--tokenizer-type", default=None,
                        help="vocabulary type as glm-pretrain takes it (default: read beside SRC, else the built-in)")
    parser.add_argument("--tokenizer-path", default=None,
                        help="vocabulary file or directory to copy into OUT (default: the files beside SRC)")
    parser.add_argument("--num-attention-heads", type=int, default=None,
                        help="for upstream files that carry no architecture: the head count (default hidden/64, "
                        "as every GLM release)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it exists (default: refuse a non-empty OUT)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        summary = merge(args.src, args.out, dtype=args.dtype, tokenizer_type=args.tokenizer_type,
                        tokenizer_path=args.tokenizer_path, num_attention_heads=args.num_attention_heads,
                        overwrite=args.overwrite)
    except (ConvertError, WeightsError, OutputError, OSError, ValueError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)
    shards = (f"{summary['shards']} tensor-parallel shards" if summary["kind"] == "megatron"
              else "a Hugging Face directory")
    print(f"{PROG}: {summary['source']} ({shards}) -> {summary['output']}: {summary['tensors']} tensors, "
          f"{summary['parameters']:,} parameters in {summary['dtype']}, {summary['tokenizer']} vocabulary\n"
          f"{PROG}: load it with: glm-generate --model {summary['output']} \"...\"", flush=True)


if __name__ == "__main__":
    main()
