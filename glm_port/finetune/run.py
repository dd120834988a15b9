"""``glm-finetune``: finetune a GLM for generation (full or LoRA), evaluate by beam search with ROUGE/BLEU.

    glm-finetune                                  # embedded toy task, small random GLM, CPU, scores rising
    glm-finetune --lora                           # the same with LoRA adapters
    glm-finetune --model_name_or_path chatglm2-tiny --pre_seq_len 8   # P-Tuning v2 (THUDM ptuning/)
    glm-finetune --model_name_or_path glm-large-chinese --train_file train.json --eval_file dev.json \\
        --dataset_layout dureaderqg --do_train --do_eval --lora --num_beams 5 ...
    torchrun --nproc_per_node 2 -m glm_port.finetune --tensor_parallel_degree 2 ...

The training loop, optimizer, schedule, precision and checkpoints are glm-pretrain's (``glm_port.training``,
``glm_port.checkpoint_io``); generation is the model's ``generate`` (transformers' GenerationMixin).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import shim as torch
from glm_port.checkpoint_io import (TRACKER, CheckpointError, check_resumable, find_checkpoint, load_checkpoint,
                                   save_checkpoint, save_sharded_checkpoint, trainable_state_dict, write_base_record)
from glm_port.distributed import ParallelEnv, local_state_dict
from glm_port.finetune import metrics
from glm_port.finetune.arguments import parse_args
from glm_port.finetune.datasets import DataError, Pair, read_pairs
from glm_port.finetune.toy_task import write_toy_task
from glm_port.models import FAMILIES, family_at
from glm_port.outputs import check_apart, check_directory_output, check_file_output, follow_umask
from glm_port.training import OptimizerSettings, Precision, TrainingLoop, build_optimizer

__all__ = ["PROG", "FinetuneError", "Session", "apply_lora", "base_name", "batches", "check_resume", "evaluate",
           "generate_targets", "main", "save_model", "setup", "train", "trained_part"]

PROG = "glm-finetune"
TOY_FLAGS = dict(do_train=True, do_eval=True, max_steps=300, learning_rate=2e-3, warmup_ratio=0.05,
                 per_device_train_batch_size=32, per_device_eval_batch_size=48, src_length=12, tgt_length=10,
                 logging_steps=50, eval_steps=100, num_beams=3)


class FinetuneError(ValueError):
    """Bad input found before anything is written."""


def _default_run(args, argv) -> bool:
    """No model, no data and no --do_train/--do_predict named: the embedded toy task, with its own defaults
    for the flags left unset."""
    given = {a.split("=")[0].lstrip("-") for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
    if args.model_name_or_path not in (None, *_embedded()) or args.train_file or args.eval_file or args.test_file or given & {"do_train", "do_predict"}:
        return False
    for name, value in TOY_FLAGS.items():
        if name not in given:
            setattr(args, name, value)
    if "lora" in given and "learning_rate" not in given:
        args.learning_rate = 5e-3  # adapters only: a larger step
    if "pre_seq_len" in given and "learning_rate" not in given:
        args.learning_rate = 2e-2  # a prefix only: THUDM ptuning/train.sh's rate
    return True


def _embedded() -> dict:
    """Embedded model names (``glm-tiny``, ``chatglm2-tiny``) -> family: random-init models, no download."""
    return {f.binding("finetune").EMBEDDED: f for f in FAMILIES.values() if f.finetune is not None}


@dataclass
class Session:
    env: ParallelEnv
    binding: object  # the family's finetune module (glm_port/models/<family>/finetune.py)
    model: torch.nn.Module  # the family's model, or the PEFT model around it
    base: torch.nn.Module  # the family's model
    config: object  # its config (saved with checkpoints)
    tokenizer: object
    output_dir: Path
    source: Path | None  # the directory the weights came from (None: embedded)
    tokenizer_source: Path | None = None  # where the tokenizer's files are (--tokenizer_name_or_path, or source)
    # The dtype the checkpoint held (what the finetuned model is saved in) when a full finetune keeps fp32
    # master weights (``master_weights``); None: the weights are saved as they are held.
    save_dtype: torch.dtype | None = None
    ptuning: bool = False  # a P-Tuning v2 prefix trains (saved alone, THUDM's layout)


# ---- model -------------------------------------------------------------------------------------------


def _family(args):
    """The registry's family of --model_name_or_path (GLM for the embedded default)."""
    name = args.model_name_or_path
    if name is None or name in _embedded():
        return _embedded().get(name, FAMILIES["glm"])
    path = Path(name).expanduser()
    if not path.exists():
        raise FinetuneError(f"--model_name_or_path {path}: no such file or directory")
    family = family_at(path)
    if family.finetune is None:
        raise FinetuneError(f"--model_name_or_path {path}: glm-finetune does not finetune the {family.name} family")
    return family


def _check_features(args) -> None:
    """What the flags ask for, against what the model's family declares (``Family.supports``): one line for
    anything it lacks, before anything is loaded or written."""
    ptuning = _ptuning_flag(args)
    if ptuning and (args.lora or args.lora_path):
        raise FinetuneError(f"{ptuning} with {'--lora' if args.lora else '--lora_path ' + args.lora_path}: P-Tuning "
                            f"and LoRA exclude each other (one kind of tuning a run)")
    if args.prefix_projection and args.pre_seq_len is None and not args.ptuning_checkpoint:
        raise FinetuneError("--prefix_projection needs --pre_seq_len")
    if args.ptuning_checkpoint and not Path(args.ptuning_checkpoint).is_dir():
        raise FinetuneError(f"--ptuning_checkpoint {args.ptuning_checkpoint}: no such directory")
    if ptuning and args.tensor_parallel_degree > 1:
        raise FinetuneError(f"{ptuning} with --tensor_parallel_degree {args.tensor_parallel_degree}: a P-Tuning "
                            f"prefix is not split by tensor parallelism")
    family = _family(args)
    conversation = (args.history_column and f"--history_column {args.history_column}") or \
        (args.dataset_layout == "conversations" and "--dataset_layout conversations")
    if conversation and family.chat is None:  # the prompt is the one the family's chat builds: it needs one
        raise FinetuneError(f"{conversation}: the {family.name} family has no chat format (conversations are "
                            f"ChatGLM2's and ChatGLM3's)")
    if args.sharding_stage and (args.lora or args.lora_path):
        raise FinetuneError(f"--sharding {args.sharding} with LoRA is not supported: the adapters are small, train "
                            "them with plain data parallel (drop --sharding)")
    if args.sharding_stage and (args.pre_seq_len is not None or args.ptuning_checkpoint is not None):
        raise FinetuneError(f"--sharding {args.sharding} with P-Tuning is not supported: only the prefix trains, "
                            "train it with plain data parallel (drop --sharding)")
    if args.sharding_stage:  # before anything is written (the embedded task's files included)
        from glm_port.sharding import resolve_degree

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        degree = resolve_degree(args.sharding_stage, args.sharding_degree, world_size, args.tensor_parallel_degree)
        if args.tensor_parallel_degree > 1 and degree != world_size // args.tensor_parallel_degree:
            raise FinetuneError(f"--sharding_degree {degree} with --tensor_parallel_degree > 1 is not supported: "
                                "under tensor parallel shard over every data-parallel rank (drop --sharding_degree)")
    family.require(
        (args.tensor_parallel_degree > 1 and f"--tensor_parallel_degree {args.tensor_parallel_degree}",
         "tensor_parallel"),
        (args.recompute and "--recompute", "recompute"),
        ((args.lora and "--lora") or (args.lora_path and "--lora_path"), "lora"),
        (_ptuning_flag(args), "prefix_tuning"),
    )


def _ptuning_flag(args) -> str | None:
    """How the command line asked for P-Tuning v2 (None: it did not)."""
    if args.pre_seq_len is not None:
        return f"--pre_seq_len {args.pre_seq_len}"
    return args.ptuning_checkpoint and f"--ptuning_checkpoint {args.ptuning_checkpoint}"


def _binding(args):
    """The finetune binding of --model_name_or_path's family (GLM for the embedded default)."""
    return _family(args).binding("finetune")


def apply_lora(args, glm):
    """PEFT LoRA on ``--lora_target_modules`` (new adapters, or ``--lora_path``'s); the base frozen."""
    import peft

    from glm_port.finetune import lora

    if args.lora_path:
        path = Path(args.lora_path).expanduser()
        problem = lora.adapter_problem(path)
        if problem is not None:
            raise FinetuneError(f"--lora_path {path}: {problem}")
        try:  # a whole adapter: Linear1D targets take their tensor-parallel slices (glm_port.finetune.lora)
            config = lora.register(peft.LoraConfig.from_pretrained(str(path)))
            return peft.PeftModel.from_pretrained(glm, str(path), is_trainable=args.do_train, config=config)
        except (RuntimeError, ValueError, KeyError) as error:  # shapes or module names of another base model
            lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
            detail = next((line for line in lines if "size mismatch" in line or "Missing" in line), lines[0])
            raise FinetuneError(f"--lora_path {path} was made for another base model: {detail}") from None
    names = {name.rsplit(".", 1)[-1] for name, _ in glm.named_modules()}
    for flag, wanted in (("lora_target_modules", args.lora_target_modules),
                         ("lora_modules_to_save", args.lora_modules_to_save)):
        missing = [m for m in wanted if m not in names]
        if missing:
            raise FinetuneError(f"--{flag}: the model has no module named {missing[0]!r}")
    torch.manual_seed(args.seed)  # new adapters from --seed alone, however many numbers the loader drew
    config = lora.lora_config(r=args.r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                              target_modules=args.lora_target_modules, bias="none",
                              modules_to_save=args.lora_modules_to_save or None)
    return peft.get_peft_model(glm, config)


def _trainable_line(model) -> str:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f" > trainable parameters: {trainable:,} of {total:,} ({100.0 * trainable / total:.3f}%)"


# ---- data --------------------------------------------------------------------------------------------


def _read(args, path: str, require_target: bool = True) -> list[Pair]:
    """The samples of a data file by the layout flags (--dataset_layout, --source_field, --target_field,
    --history_column)."""
    return read_pairs(path, args.dataset_layout, args.source_field, args.target_field, require_target=require_target,
                      history_column=args.history_column)


def _cached_encoding(args, session, path: str, pairs: list[Pair] | None = None) -> list:
    """Tokenize a data file once: the encoded samples are kept under ``OUTPUT/cache/`` keyed by the file's
    bytes, the vocabulary and the layout flags. ``pairs``: the file's samples when already read."""
    key = hashlib.sha256()
    key.update(Path(path).read_bytes())
    for part in (session.binding.__name__, session.binding.fingerprint(session.tokenizer), args.dataset_layout, args.source_field, args.target_field,
                 args.src_length, args.tgt_length, args.history_column):
        key.update(str(part).encode())
    cache = session.output_dir / "cache" / f"{Path(path).stem}-{key.hexdigest()[:16]}.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=False)
    pairs = pairs if pairs is not None else _read(args, path)
    samples = session.binding.encode(session.tokenizer, pairs, args.src_length, args.tgt_length)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")
    torch.save(samples, tmp)
    os.replace(tmp, cache)
    return samples


def batches(samples: list, batch_size: int, collate, seed: int, rank: int, world: int, skip: int = 0):
    """Endless shuffled batches (a new order each epoch); each data-parallel rank takes its share of a
    global batch of ``batch_size * world``. ``skip`` batches are passed over (resuming)."""
    global_batch = batch_size * world
    per_epoch = max(len(samples) // global_batch, 1)
    produced = 0
    for epoch in range(1 << 30):
        order = np.random.default_rng(seed + epoch).permutation(len(samples))
        for b in range(per_epoch):
            produced += 1
            if produced <= skip:
                continue
            chosen = order[b * global_batch:(b + 1) * global_batch][rank * batch_size:(rank + 1) * batch_size]
            yield collate([samples[i] for i in chosen])


# ---- evaluation --------------------------------------------------------------------------------------


def generate_targets(session: Session, args, samples: list) -> list[str]:
    """The model's text for each sample's prompt, by the search flags (beam search by default)."""
    search = dict(max_new_tokens=args.tgt_length, num_beams=args.num_beams, length_penalty=args.length_penalty,
                  no_repeat_ngram_size=args.no_repeat_ngram_size, min_new_tokens=args.min_tgt_length,
                  do_sample=args.select_topk)
    if args.select_topk:
        search.update(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature)
    session.model.eval()
    from glm_port.sharding import root_gathered

    with root_gathered(session.model):  # sharded: generation reaches the model's parts one by one
        return session.binding.generate(session.base if not hasattr(session.model, "peft_config") else session.model,
                                        session.tokenizer, samples, search, args.per_device_eval_batch_size,
                                        session.env.device)


def evaluate(session: Session, args, pairs: list[Pair], samples: list) -> tuple[dict, list[str]]:
    predictions = generate_targets(session, args, samples)
    return metrics.score(predictions, [p.target for p in pairs], args.metric_lang), predictions


def _print_scores(scores: dict, step: int | None) -> None:
    where = f" at step {step}" if step is not None else ""
    cells = " | ".join(f"{name} {value:6.2f}" for name, value in scores.items())
    print(f" eval{where} | {cells} |", flush=True)


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_predictions(path: Path, pairs: list[Pair], predictions: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        for pair, prediction in zip(pairs, predictions):
            f.write(json.dumps({"source": pair.source, "target": pair.target, "prediction": prediction},
                               ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# ---- the command -------------------------------------------------------------------------------------


def _check_inputs(args) -> None:
    if args.do_train and not args.train_file:
        raise FinetuneError("--do_train needs --train_file")
    if args.do_eval and not args.eval_file:
        raise FinetuneError("--do_eval needs --eval_file")
    if args.do_predict and not args.test_file:
        raise FinetuneError("--do_predict needs --test_file")
    if not (args.do_train or args.do_eval or args.do_predict):
        raise FinetuneError("nothing to do: give --do_train, --do_eval or --do_predict")
    for flag in ("train_file", "eval_file", "test_file"):
        path = getattr(args, flag)
        if path and not Path(path).is_file():
            raise FinetuneError(f"--{flag} {path}: no such file")
    if (args.lora or args.lora_path) and args.merge_lora and args.tensor_parallel_degree > 1:
        raise FinetuneError("--merge_lora with --tensor_parallel_degree > 1 is not supported: the adapter is saved "
                            "whole; merge it at tensor-parallel size 1 (--lora_path ADAPTER --merge_lora)")
    if args.merge_tensor_parallel_path and not args.do_train:
        raise FinetuneError("--merge_tensor_parallel_path merges the shards a training run saves: give --do_train "
                            "(or run glm-merge on saved shards)")
    if args.merge_tensor_parallel_path and (args.lora or args.lora_path) and not args.merge_lora:
        raise FinetuneError("--merge_tensor_parallel_path with LoRA: the adapter is saved whole, there are no shards "
                            "to merge; fold it into its base with glm-export (or train with --merge_lora at "
                            "tensor-parallel size 1)")
    if args.label_smoothing and args.tensor_parallel_degree > 1:
        raise FinetuneError("--label_smoothing with --tensor_parallel_degree > 1 is not supported "
                            "(the vocab-parallel cross entropy has no smoothing)")


def _check_outputs(args, toy: bool) -> None:
    """What this run will write (by its flags) may neither be, contain nor lie inside what it reads
    (``outputs.check_apart``), and must be writable: checked before anything is loaded or written."""
    out = Path(args.output_dir)
    model = args.model_name_or_path if args.model_name_or_path not in (None, *_embedded()) else None
    inputs = [("--model_name_or_path", model), ("--lora_path", args.lora_path),
              ("--ptuning_checkpoint", args.ptuning_checkpoint),
              ("--tokenizer_name_or_path", args.tokenizer_name_or_path)]
    if not toy:  # the embedded task is written by this run, in --output_dir/toy_task
        inputs += [("--train_file", args.train_file), ("--eval_file", args.eval_file), ("--test_file", args.test_file)]
    check_directory_output(out, "--output_dir")
    directories, files = [out / "toy_task"] if toy else [], []
    if args.do_train:
        directories += [out / "final", out / "checkpoints", out / "cache", out / "base"]
        directories += [out / "best"] if args.do_eval else []
    if args.do_eval:
        files += [out / "eval_results.json", out / "eval_predictions.jsonl"]
    if args.do_predict:
        files += [out / "test_predictions.jsonl"]
    shown = f"--output_dir {out}: the output"
    for path in directories + files:
        check_apart(path, inputs, shown)
        (check_directory_output if path in directories else check_file_output)(path, shown)
    if args.merge_tensor_parallel_path:
        merged = Path(args.merge_tensor_parallel_path)
        check_apart(merged, inputs + [("--output_dir", out / name) for name in ("final", "checkpoints", "cache",
                                                                                 "best", "base")],
                    "--merge_tensor_parallel_path")
        check_directory_output(merged, "--merge_tensor_parallel_path")


def setup(args) -> Session:
    env = ParallelEnv.from_environment(args.tensor_parallel_degree, device=args.device,
                                       sharding_stage=args.sharding_stage, sharding_degree=args.sharding_degree)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env.seed_tracker(args.seed)
    binding = _binding(args)
    embedded = args.model_name_or_path is None or args.model_name_or_path in _embedded()
    source = None if embedded else Path(args.model_name_or_path).expanduser()
    tokenizer_path = Path(args.tokenizer_name_or_path).expanduser() if args.tokenizer_name_or_path else None
    if tokenizer_path is not None and not tokenizer_path.exists():
        raise FinetuneError(f"--tokenizer_name_or_path {tokenizer_path}: no such file or directory")
    ptuning = bool(_ptuning_flag(args))
    prefix = dict(pre_seq_len=args.pre_seq_len, prefix_projection=args.prefix_projection,
                  ptuning_checkpoint=args.ptuning_checkpoint) if ptuning else {}
    full = not (args.lora or args.lora_path or ptuning)
    # Sharded full finetune (no tensor parallel): every rank builds the model on the meta device, rank 0 alone
    # reads the weights (on the CPU) and every rank gets its shards from it (``shard_from_rank0``): no rank but 0
    # ever holds the whole model, and no device does.
    from_rank0 = env.sharding is not None and env.tp_size == 1 and full
    # Under tensor parallel too: every rank builds its tensor-parallel model on the meta device, rank 0 of each
    # data-parallel group (one per tensor-parallel rank) alone reads that tensor-parallel rank's slices (on the CPU)
    # and the group's ranks get their shards from it (``shard_from_dp_rank0``): no other rank holds them whole.
    from_dp_rank0 = env.sharding is not None and env.tp_size > 1 and full
    reads = env.is_main if from_rank0 else env.dp_rank == 0 if from_dp_rank0 else False
    whole = rng = None
    try:
        if reads:
            whole, _ = binding.load(source, "cpu", args.recompute, tokenizer_path=tokenizer_path)
            rng = torch.get_rng_state()  # as an embedded model's random init left it, for every rank below
        base, tokenizer = binding.load(source, env.device, args.recompute, tokenizer_path=tokenizer_path, **prefix,
                                       **({"meta": True} if from_rank0 or from_dp_rank0 else {}))
    except BaseException as error:
        if from_rank0 or from_dp_rank0:  # the ranks wait for each other below: this one's failure stops them all
            _all_ranks_loaded(False)
        if not isinstance(error, FileNotFoundError) or tokenizer_path is not None:
            raise
        # no vocabulary recorded beside the weights
        raise FinetuneError(f"{error}; name the tokenizer with --tokenizer_name_or_path") from None
    if (from_rank0 or from_dp_rank0) and not _all_ranks_loaded(True):
        raise FinetuneError("the model did not load on another rank (its log says why)")
    _fit_lengths(args, binding, base, env.is_main)
    save_dtype = None
    if full and args.do_train:  # fp32 masters; saved in the dtype the checkpoint records, else the one loaded
        held = master_weights(base if whole is None else whole)
        save_dtype = checkpoint_dtype(source) or held
        save_dtype = None if save_dtype == torch.float32 else save_dtype
    model = base if full or ptuning else apply_lora(args, base)
    if from_rank0 or from_dp_rank0:
        # the weights, dtype and random state(s) of the rank that read them: global rank 0, or under tensor
        # parallel each data-parallel group's rank 0 (its slices, and the tensor-parallel RNG streams too)
        from glm_port.sharding import broadcast_from_rank0, shard_from_dp_rank0, shard_from_rank0

        group = env.dp_group if from_dp_rank0 else None
        held = next((p.dtype for p in whole.parameters() if p.is_floating_point()), None) \
            if whole is not None else None
        tracker = torch.recompute.get_cuda_rng_tracker() if from_dp_rank0 else None  # as its init left them
        states = tracker.get_states() if tracker is not None and whole is not None else None
        save_dtype, rng, states, held = broadcast_from_rank0((save_dtype, rng, states, held), group)
        torch.set_rng_state(rng)
        if tracker is not None:
            tracker.set_states(states)
        if held is not None and held != torch.float32:  # not trained: the weights stay in the dtype loaded
            model.to(held)
        param_dtype = torch.bfloat16 if args.bf16 else None
        model = base = (shard_from_dp_rank0(model, env.sharding, group, param_dtype, env.device, whole=whole)
                        if from_dp_rank0 else shard_from_rank0(model, env.sharding, param_dtype, env.device,
                                                               whole=whole))
        del whole
    elif env.sharding is not None:  # FSDP2 units (the parameters become DTensor shards) before the optimizer
        model = base = env.shard(model, torch.bfloat16 if args.bf16 else None)
    if env.sharding is not None:
        if env.is_main:
            mode = f"hybrid, {env.dp_size // env.sharding.degree} replicas of " if env.sharding.hybrid else ""
            print(f" > --sharding stage{env.sharding.stage}: FSDP2 over {mode}{env.sharding.degree} ranks",
                  flush=True)
    elif args.sharding_stage and env.is_main:
        print(f" > --sharding {args.sharding}: one process, nothing to shard (launch with torchrun)", flush=True)
    home = tokenizer_path or (binding.tokenizer_home(source) if source is not None else None)
    return Session(env, binding, model, base, binding.config_of(base), tokenizer, Path(args.output_dir), source,
                   home, save_dtype, ptuning)


def _all_ranks_loaded(loaded: bool) -> bool:
    """Whether every rank loaded its model (collective: each rank says whether it did)."""
    from glm_port.sharding import every_rank

    return every_rank(loaded)


def master_weights(model) -> torch.dtype | None:
    """A full finetune's weights in fp32 (master weights; AdamW's states follow their dtype), whatever dtype
    the checkpoint holds: a bf16 / fp16 update smaller than the weight's resolution would round away. The
    compute runs in --bf16 / --fp16 under autocast (``Precision``). Returns the checkpoint's floating dtype
    (the final model is saved in it), or None when the weights were fp32 already."""
    held = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if held <= {torch.float32}:
        return None
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point() and p.dtype != torch.float32)
    model.float()
    return dtype


def checkpoint_dtype(source: Path | None) -> torch.dtype | None:
    """The floating dtype a Hugging Face directory's ``config.json`` records (``dtype``, or ``torch_dtype``
    before transformers 5): what the weights were stored in, whatever dtype the loader gave them here."""
    if source is None:
        return None
    for directory in (source if source.is_dir() else source.parent, source.parent):
        config = directory / "config.json"
        if config.is_file():
            try:
                recorded = json.loads(config.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            name = recorded.get("dtype") or recorded.get("torch_dtype") if isinstance(recorded, dict) else None
            return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(name)
    return None


@contextlib.contextmanager
def stored_as(model, dtype: torch.dtype | None):
    """The model's floating parameters and buffers held in ``dtype`` while it is saved (the fp32 masters
    put back after); nothing changes when ``dtype`` is None."""
    if dtype is None:
        yield model
        return
    kept = []
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            kept.append((tensor, tensor.data))
            tensor.data = tensor.data.to(dtype)
    try:
        yield model
    finally:
        for tensor, data in kept:
            tensor.data = data


def _fit_lengths(args, binding, model, verbose: bool) -> None:
    """--src_length / --tgt_length cut to the model's positions (as transformers' run_clm cuts its block_size
    to the model's maximum), said in one line, before any data is read."""
    src, tgt = binding.fit_lengths(model, args.src_length, args.tgt_length)
    if (src, tgt) != (args.src_length, args.tgt_length) and verbose:
        print(f" > --src_length {args.src_length} / --tgt_length {args.tgt_length} exceed the model's positions: "
              f"sources cut to {src} tokens, targets to {tgt}", flush=True)
    if src < 4:
        raise FinetuneError(f"the model's positions leave {src} tokens for the source; it needs at least 4")
    args.src_length, args.tgt_length = src, tgt


def trained_part(session: Session) -> str | None:
    """What a run with a frozen base trains (its resumable checkpoints keep that alone), or None: a full
    finetune, whose checkpoints hold the whole model."""
    if session.ptuning:
        return "P-Tuning v2 prefix encoder"
    if hasattr(session.model, "peft_config"):
        return "LoRA adapters"
    return None


def base_name(session: Session) -> str:
    """The base model a run loaded, as its trained-part checkpoints record it (checked when resuming)."""
    if session.source is None:
        return f"the embedded {session.binding.EMBEDDED}"
    return str(session.source.resolve())


def check_resume(session: Session) -> None:
    """A run started again in an --output_dir whose ``checkpoints/`` it will resume: the CheckpointError
    resuming would raise (another base, another kind of run, weights that do not fit), before anything is
    written."""
    checkpoints = session.output_dir / "checkpoints"
    if (checkpoints / TRACKER).is_file():
        check_resumable(checkpoints, session.model, tp_rank=session.env.tp_rank,
                        trainable_only=trained_part(session) is not None, base_model=base_name(session))


def train(args, session: Session, train_samples, eval_data) -> int:
    """Train to the last step; returns it."""
    env, model = session.env, session.model
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * env.dp_size
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * len(train_samples) / per_step)
    truncated = sum(s.truncated_target for s in train_samples)
    if env.is_main:
        print(f" > {len(train_samples)} training samples, {total} steps"
              + (f"; {truncated} targets cut to --tgt_length {args.tgt_length}" if truncated else ""), flush=True)
        print(_trainable_line(model), flush=True)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(
        lr=args.learning_rate, weight_decay=args.weight_decay, warmup=args.warmup_ratio, decay_iters=max(total, 1),
        decay_style=args.lr_scheduler_type, decay_ratio=0.0,
    ))
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    precision = Precision(env.device, dtype)
    checkpoints = session.output_dir / "checkpoints"
    # A frozen base (P-Tuning, LoRA): the checkpoints keep the trained part alone, put back on the base loaded
    # again from --model_name_or_path when resuming; a full finetune's hold the whole model.
    part, base = trained_part(session), base_name(session)
    iteration = 0
    if (checkpoints / TRACKER).is_file():  # resume where the last run stopped
        find_checkpoint(checkpoints, env.tp_rank)
        iteration = load_checkpoint(checkpoints, model, tp_rank=env.tp_rank, optimizer=optimizer,
                                    scheduler=scheduler, grad_scaler=precision.scaler,
                                    trainable_only=part is not None, base_model=base)
        if env.is_main:
            print(f" > resumed from {checkpoints} at step {iteration}", flush=True)
    stream = batches(train_samples, args.per_device_train_batch_size,
                     lambda chosen: session.binding.collate(chosen, session.tokenizer), args.seed,
                     env.dp_rank, env.dp_size, skip=iteration * args.gradient_accumulation_steps)
    loop = TrainingLoop(env.wrap_data_parallel(model), optimizer, scheduler, precision, env, total_iters=total,
                        accumulation=args.gradient_accumulation_steps, clip_grad=args.max_grad_norm,
                        log_interval=args.logging_steps, label_smoothing=args.label_smoothing,
                        logits_fn=session.binding.logits)
    best = {"rouge-l": -1.0}

    def save(step: int) -> None:
        if env.sharding is not None:  # each rank its shards (DCP): resumable at another world size
            save_sharded_checkpoint(checkpoints, step, model, config=session.config, optimizer=optimizer,
                                    scheduler=scheduler, grad_scaler=precision.scaler)
        else:
            state = local_state_dict(model) if part is None else trainable_state_dict(model)
            save_checkpoint(checkpoints, step, state, config=session.config, optimizer=optimizer,
                            scheduler=scheduler, grad_scaler=precision.scaler, tp_rank=env.tp_rank,
                            writer=env.dp_rank == 0, trained_part=part, base_model=base if part else None)
        if env.is_main and not (checkpoints / "tokenizer_config.json").is_file():  # so glm-merge / the loaders
            session.binding.save_tokenizer(session.tokenizer, checkpoints, session.tokenizer_source)  # read them alone

    def periodic_eval(step: int) -> None:
        scores, predictions = evaluate(session, args, *eval_data)  # every rank: the model is split over them
        model.train()
        if env.is_main:
            _print_scores(scores, step)
        if scores["rouge-l"] > best["rouge-l"]:
            best.update(scores, step=step)
            save_model(args, session, session.output_dir / "best", step)
            if env.is_main:
                _write_json(session.output_dir / "best" / "eval_results.json", best)

    periodic = [(args.save_steps, save)]
    if args.do_eval and args.eval_steps:
        periodic.append((args.eval_steps, periodic_eval))
    return loop.run(stream, iteration, periodic)


def save_model(args, session: Session, directory: Path, step: int) -> None:
    """The finetuned model where glm-generate and ``from_pretrained`` read it: the PEFT adapter alone (LoRA,
    unless --merge_lora), else the weights with config and tokenizer files. Under tensor parallel (every
    rank calls this) each rank writes its shard in upstream's ``mp_rank_XX`` layout; ``glm-merge`` or
    ``from_pretrained`` at any tensor-parallel size merges them."""
    env, model, binding = session.env, session.model, session.binding
    if session.ptuning:  # THUDM's layout: the prefix encoder's weights alone, config.json, the tokenizer
        if env.is_main:
            binding.save_prefix(model, session.tokenizer, directory, session.tokenizer_source)
            follow_umask(directory)
            base_dir = session.output_dir / "base"
            if session.source is None and not base_dir.exists():  # the embedded base is random: kept beside
                binding.save_base(model, session.tokenizer, base_dir, session.tokenizer_source)
                follow_umask(base_dir)
        return
    if hasattr(model, "peft_config") and not args.merge_lora:
        from glm_port.finetune.lora import base_fingerprint, full_adapter_state_dict

        # Under tensor parallel every rank gathers the adapter's slices: rank 0 writes it whole (PEFT's format).
        adapter = full_adapter_state_dict(model) if env.tp_size > 1 else None
        base_dir = session.output_dir / "base"
        keep_base = session.source is None and not base_dir.exists()  # the embedded base is random: keep it,
        if env.tp_size > 1:  # so the adapter can be applied (and exported) later; every rank decided first
            torch.distributed.barrier()
        if env.tp_size > 1 and keep_base:
            weights = {k.replace(".base_layer.", "."): v for k, v in local_state_dict(session.base).items()
                       if "lora_" not in k}
            save_checkpoint(base_dir, step, weights, config=session.config, save_rng=False, tp_rank=env.tp_rank,
                            writer=env.dp_rank == 0)
            if env.is_main:
                binding.save_tokenizer(session.tokenizer, base_dir, session.tokenizer_source)
        base_path = (session.source if session.source is not None else base_dir).resolve()
        if env.is_main:
            directory.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(str(directory), **({} if adapter is None else {"state_dict": adapter}))
            # The base it was trained on, which glm-export checks: path and weights fingerprint (one process:
            # tensor-parallel ranks hold slices, so there the path alone). Not in PEFT's base_model_name_or_path:
            # a local path there makes PEFT's save look the directory up (Hub, config class) on every save.
            write_base_record(directory, base_path, None if env.tp_size > 1 else base_fingerprint(model))
            if keep_base and env.tp_size == 1:  # a copy without PEFT's layers (its names are the base's)
                import copy

                binding.save(copy.deepcopy(model).unload(), session.tokenizer, base_dir, session.tokenizer_source)
            follow_umask(directory)  # safetensors writes its files 0600: the umask's modes, as every other file
            if keep_base and env.tp_size == 1:
                follow_umask(base_dir)
        return
    if env.sharding is not None and env.tp_size > 1:  # gathered over dp: each tp rank's slices, as below
        from glm_port.sharding import tensor_parallel_state_dict

        state = tensor_parallel_state_dict(model, session.save_dtype)
        save_checkpoint(directory, step, state, config=session.config, save_rng=False, tp_rank=env.tp_rank,
                        writer=env.dp_rank == 0)
        if env.is_main:
            binding.save_tokenizer(session.tokenizer, directory, session.tokenizer_source)
        return
    if env.sharding is not None:  # every rank gathers; rank 0 writes the whole model as one process does
        from glm_port.sharding import full_state_dict, unsharded_twin

        state = full_state_dict(model)
        if env.is_main:
            directory.mkdir(parents=True, exist_ok=True)
            with stored_as(unsharded_twin(model, state), session.save_dtype) as whole:
                binding.save(whole, session.tokenizer, directory, session.tokenizer_source)
            follow_umask(directory)
        torch.distributed.barrier()
        return
    if env.tp_size > 1:
        with stored_as(model, session.save_dtype):  # the checkpoint's dtype, as one process saves it
            save_checkpoint(directory, step, local_state_dict(model), config=session.config, save_rng=False,
                            tp_rank=env.tp_rank, writer=env.dp_rank == 0)
        if env.is_main:
            binding.save_tokenizer(session.tokenizer, directory, session.tokenizer_source)
        return
    if not env.is_main:
        return
    directory.mkdir(parents=True, exist_ok=True)
    merged = model.merge_and_unload() if hasattr(model, "peft_config") else model
    with stored_as(merged, session.save_dtype):
        binding.save(merged, session.tokenizer, directory, session.tokenizer_source)
    follow_umask(directory)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    toy = _default_run(args, argv)
    output_dir = Path(args.output_dir)
    try:
        _check_outputs(args, toy)
        _check_features(args)
        if toy:
            args.train_file, args.eval_file = map(str, write_toy_task(output_dir / "toy_task"))
            model = args.model_name_or_path or "a small GLM"
            print(f"{PROG}: no data given (--train_file, --eval_file, --test_file) and nothing to do named "
                  f"(--do_train, --do_predict): {model} (random weights) learns the embedded task (reverse a "
                  f"phrase's words) in {output_dir}/", flush=True)
        _check_inputs(args)
        # Every data file read (before the model loads) and encoded before anything is written: a bad sample
        # is one line, nothing made.
        train_pairs = _read(args, args.train_file) if args.do_train else []
        eval_pairs = _read(args, args.eval_file) if args.do_eval else []
        test_pairs = _read(args, args.test_file, require_target=False) if args.do_predict else []
        session = setup(args)
        if args.do_train:
            check_resume(session)
        eval_data = None
        if args.do_eval:
            eval_data = (eval_pairs, session.binding.encode(session.tokenizer, eval_pairs, args.src_length,
                                                            args.tgt_length))
        test_samples = session.binding.encode(session.tokenizer, test_pairs, args.src_length, args.tgt_length,
                                              with_targets=False) if args.do_predict else []
        train_samples = _cached_encoding(args, session, args.train_file, train_pairs) if args.do_train else []
        output_dir.mkdir(parents=True, exist_ok=True)
    except (FinetuneError, DataError, CheckpointError, OSError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(2)
    try:  # every rank runs each part (the model may be split over them); rank 0 writes the files
        env = session.env
        if args.do_eval and args.do_train:
            scores, _ = evaluate(session, args, *eval_data)
            if env.is_main:
                _print_scores(scores, 0)
        if args.do_train:
            steps = train(args, session, train_samples, eval_data)
            save_model(args, session, output_dir / "final", steps)
            if env.is_main:
                print(f" > saved the finetuned model to {output_dir / 'final'}", flush=True)
            if args.merge_tensor_parallel_path and env.is_main:
                from glm_port.convert.merge import merge  # glm-merge: the shards as one directory

                merge(output_dir / "final", args.merge_tensor_parallel_path, overwrite=True)
                print(f" > merged the tensor-parallel shards into {args.merge_tensor_parallel_path}", flush=True)
        if args.do_eval:
            scores, predictions = evaluate(session, args, *eval_data)
            if env.is_main:
                _print_scores(scores, None)
                _write_predictions(output_dir / "eval_predictions.jsonl", eval_data[0], predictions)
                _write_json(output_dir / "eval_results.json", scores)
        if args.do_predict:
            predictions = generate_targets(session, args, test_samples)
            if env.is_main:
                _write_predictions(output_dir / "test_predictions.jsonl", test_pairs, predictions)
        if env.is_main:
            print(f" > results in {output_dir}/", flush=True)
    finally:
        session.env.close()
