"""``glm-pretrain``: GLM blank-infilling pretraining on one CPU/GPU or under ``torchrun``.

    glm-pretrain                                   # tiny GLM, embedded corpus, CPU, about 15 s on 2 idle cores
    glm-pretrain --train-data corpus.jsonl --tokenizer-type BertWordPieceTokenizer \\
        --tokenizer-path vocab.txt --num-layers 12 --hidden-size 768 --num-attention-heads 12 \\
        --seq-length 512 --train-iters 10000 --save ckpt --bf16
    torchrun --nproc_per_node 4 -m glm_port.pretrain_glm --model-parallel-size 2 ...

The log keeps upstream's lines, ``iteration N/M | elapsed time per iteration (ms): T | learning rate L
| lm loss X |`` and, every ``--eval-interval`` iterations and at the end, the validation block
``validation loss at iteration N | LM loss: X | LM PPL: Y`` (then the test set's), so existing parsers keep
working; on a terminal a tqdm bar shows loss, tokens/s, ETA. ``--summary-dir`` writes the same numbers (and
grad norm, loss scale, tokens/s) for TensorBoard.
"""

from __future__ import annotations

import math
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from tqdm import tqdm

import shim as torch
from glm_port import data
from glm_port.arguments import parse_args
from glm_port.checkpoint_io import (CheckpointError, find_checkpoint, is_sharded_checkpoint, load_checkpoint,
                                   save_checkpoint, save_sharded_checkpoint, saved_config)
from glm_port.outputs import check_apart, check_directory_output
from glm_port.distributed import ParallelEnv, local_state_dict
from glm_port.data.batches import DataOptions, build_batches, corpus_splits
from glm_port.models import FAMILIES
from glm_port.training import OptimizerSettings, Precision, TrainingLoop, build_optimizer, lm_loss


def glm_family():
    """GLM's declaration: glm-pretrain trains GLM (upstream's pretrain_glm.py), reached through the registry, on
    first use (looked up at import, it would load the family's bindings for ``--help``)."""
    return FAMILIES["glm"]


def set_random_seed(seed: int, env: ParallelEnv) -> None:
    """Same seed on every rank, as upstream; the tensor-parallel RNG tracker adds its per-rank offset."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env.seed_tracker(seed)


def padded_vocab_size(args, tokenizer) -> int:
    """The tokenizer's tokens, plus --sentinel-token's 2 * (positions - 1), padded to a multiple of
    --make-vocab-size-divisible-by (upstream's 128 by default)."""
    tokens = tokenizer.num_tokens + (2 * (args.max_position_embeddings - 1) if args.sentinel_token else 0)
    multiple = args.make_vocab_size_divisible_by
    return -(-tokens // multiple) * multiple


def model_config(args, vocab_size: int):
    """GLM's config (``glm_family().config_class``) from the flags."""
    return glm_family().config_class(
        vocab_size=vocab_size,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        max_sequence_length=args.max_position_embeddings,
        embedding_dropout_prob=args.hidden_dropout,
        attention_dropout_prob=args.attention_dropout,
        output_dropout_prob=args.hidden_dropout,
        layernorm_epsilon=args.layernorm_epsilon,
        intermediate_size=args.intermediate_size,
        checkpoint_activations=args.checkpoint_activations,
        checkpoint_num_layers=args.checkpoint_num_layers,
        checkpoint_policy=args.checkpoint_policy or "full",
    )


def eval_lines(prefix: str, loss: float, ppl: float) -> list[str]:
    """Upstream's ``report_evaluate_metrics`` block, character for character."""
    line = f" validation loss at {prefix} | LM loss: {loss:.6E} | LM PPL: {ppl:.6E}"
    return ["-" * 100, "-" * (len(line) + 1), line, "-" * (len(line) + 1)]


def experiment_save_dir(args, now: datetime | None = None) -> tuple[str, str | None]:
    """Upstream's names: ``(experiment name, checkpoint directory)``. With --load (and no
    --new-save-directory) the run continues in --save/<loaded directory's name>; otherwise it is
    NAME<month-day-hour-minute>. Without --experiment-name, checkpoints go in --save itself."""
    stamp = (now or datetime.now()).strftime("%m-%d-%H-%M")
    if args.load and not args.new_save_directory:
        name = os.path.basename(os.path.normpath(args.load))
    else:
        name = (args.experiment_name or "glm") + stamp
    if args.save is None or args.experiment_name is None:
        return name, args.save
    return name, os.path.join(args.save, name)


def summary_writer(args, name: str, iteration: int):
    """TensorBoard writer at SUMMARY_DIR/runs/NAME (upstream's place), dropping events past ``iteration``."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("--summary-dir needs TensorBoard: pip install 'glm-migrate[tensorboard]'") from None
    return SummaryWriter(log_dir=os.path.join(args.summary_dir, "runs", name), purge_step=iteration)


def check_outputs(args) -> None:
    """--save and --summary-dir, before the first step: directories this run can write, and --save apart from
    everything it reads (``outputs.check_apart``). --save may hold --load (a run resumes in place: it adds
    later iterations beside the loaded one) when --load is a checkpoint of ours, which carries its iteration;
    an upstream or Hugging Face one starts again at iteration 0, whose saves would replace its files."""
    if args.save is not None:
        check_directory_output(args.save, "--save")
        inputs = [("--tokenizer-path", args.tokenizer_path)]
        for flag in ("train_data", "valid_data", "test_data"):
            inputs += [(f"--{flag.replace('_', '-')}", f) for f in getattr(args, flag + "_files", None) or ()]
        if args.load is not None and saved_config(find_checkpoint(args.load)) is None:
            inputs.append(("--load", args.load))
        check_apart(args.save, inputs, "--save")
    if args.summary_dir is not None:
        check_directory_output(args.summary_dir, "--summary-dir")


@dataclass
class Run:
    """Everything a training run holds between steps."""

    env: ParallelEnv
    config: Any  # GLM's config (glm_family().config_class)
    model: Any  # GLM's model (glm_family().model_class)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    batches: Iterator[dict]
    iteration: int
    valid: Iterator[dict] | None = None
    test: Iterator[dict] | None = None
    writer: object = None
    name: str = ""
    notes: list[str] = field(default_factory=list)
    tokenizer: object = None  # recorded beside the checkpoints (record_tokenizer)


def masker_kwargs(args, tokenizer) -> dict:
    """BlockMasker's knobs from upstream's flags."""
    return dict(avg_block_length=args.avg_block_length, bert_prob=args.bert_prob,
                gap_sentence_prob=args.gap_sentence_prob, gap_sentence_ratio=args.gap_sentence_ratio,
                gpt_infill_prob=args.gpt_infill_prob, gpt_min_ratio=args.gpt_min_ratio, task_mask=args.task_mask,
                block_mask_prob=args.block_mask_prob, context_mask_ratio=args.context_mask_ratio,
                short_seq_prob=args.short_seq_prob, single_span_prob=args.single_span_prob,
                shuffle_blocks=not args.no_shuffle_block, block_position_encoding=not args.no_block_position,
                sentinel_base=tokenizer.num_tokens if args.sentinel_token else None)


def build_data(args, tokenizer, env: ParallelEnv, iteration: int, notes: list[str]):
    """Train, valid and test batch streams (valid/test None where there is no such data), as upstream
    builds them: --split shares of --train-data unless --valid-data/--test-data are given."""
    scatter, rank, world = args.loader_scatter, env.dp_rank, env.dp_size
    if scatter and world % scatter:
        notes.append(f" > --loader-scatter {scatter}: {world} data-parallel rank(s) is not a multiple of it "
                     "(upstream asserts); every rank reads the whole corpus")
        scatter = None
    if scatter:
        rank, world = env.dp_rank // scatter, env.dp_size // scatter
    part = env.dp_rank % scatter if scatter else 0
    options = DataOptions(split=args.split, valid_given=args.valid_data is not None,
                          test_given=args.test_data is not None, filter_english=args.filter_english,
                          non_sentence_start=args.non_sentence_start, sample_one_document=args.sample_one_document,
                          loader_scatter=scatter)

    def splits(files, options):
        corpus = data.load_corpus(files, tokenizer, text_key=args.text_key, progress=env.is_main)
        return corpus_splits(corpus, tokenizer, options, seed=args.seed, scatter_part=part, progress=env.is_main)

    train, valid, test = splits(args.train_data_files, options)
    whole = DataOptions(split="1", filter_english=args.filter_english, loader_scatter=scatter)
    if args.valid_data_files is not None:
        valid = splits(args.valid_data_files, whole)[0]
    if args.test_data_files is not None:
        test = splits(args.test_data_files, whole)[0]
    common = dict(rank=rank, world_size=world, masker_kwargs=masker_kwargs(args, tokenizer), options=options,
                  num_workers=args.num_workers)
    streams = [build_batches(train, tokenizer, seq_length=args.seq_length, batch_size=args.batch_size,
                             seed=args.seed, start_batch=iteration * args.gradient_accumulation_steps, **common)]
    # Validation goes on where the last evaluation stopped (upstream's resumed start); test starts afresh.
    for split, stream, start in ((valid, 1, (iteration // args.eval_interval) * args.eval_iters), (test, 2, 0)):
        seed = int(np.random.SeedSequence([args.seed, stream]).generate_state(1)[0])
        streams.append(None if split is None or args.eval_iters == 0 else build_batches(
            split, tokenizer, seq_length=args.eval_seq_length, batch_size=args.eval_batch_size, seed=seed,
            start_batch=start, **common))
    return streams


def compile_by_default(device) -> bool:
    """Whether glm-pretrain compiles its layers when neither --compile nor --no-compile is given: where it
    measured faster (CUDA), not elsewhere (on CPU compiling measured slower than eager)."""
    return torch.device(device).type == "cuda"


def compile_mode_by_default(device) -> str:
    """torch.compile's mode when --compile-mode is not given: CUDA graphs on a CUDA device, where a GLM-Large
    step measured bound by kernel launches (docs/performance.md), inductor's default elsewhere."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def setup(args) -> Run:
    """Everything before the first step; bad input fails here, before anything is written."""
    if args.local_rank is not None:  # older launchers pass --local_rank instead of setting LOCAL_RANK
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    env = ParallelEnv.from_environment(args.model_parallel_size, args.distributed_backend, args.device,
                                       sharding_stage=args.zero_stage)
    if args.train_batch_size is not None:
        expected = args.batch_size * args.gradient_accumulation_steps * env.dp_size
        if args.train_batch_size != expected:
            raise ValueError(
                f"--deepspeed_config train_batch_size {args.train_batch_size} != micro batch {args.batch_size}"
                f" x accumulation {args.gradient_accumulation_steps} x data-parallel {env.dp_size}"
            )
    notes = []
    if args.zero_stage and env.sharding is not None:
        notes.append(f" > ZeRO stage {args.zero_stage}: parameters, gradients and optimizer state sharded over the "
                     f"{env.sharding.degree} data-parallel ranks (FSDP2" + (
                         f" on the (dp, tp) mesh, tensor parallel {env.tp_size}" if env.tp_size > 1 else "")
                     + "; checkpoints as torch.distributed.checkpoint)")
    elif args.zero_stage:
        notes.append(f" > ZeRO stage {args.zero_stage}: one data-parallel rank, nothing to shard")
    name, args.save = experiment_save_dir(args)
    check_outputs(args)
    set_random_seed(args.seed, env)
    tokenizer = data.get_tokenizer(args.tokenizer_type, args.tokenizer_path, lowercase=args.tokenizer_lowercase)
    config = model_config(args, padded_vocab_size(args, tokenizer))
    model = glm_family().model_class(config).to(env.device)  # after ParallelEnv: its layout splits the layers
    if args.compile is None:
        args.compile = compile_by_default(env.device)
    if args.compile:
        mode = args.compile_mode or compile_mode_by_default(env.device)
        model.transformer.compile_layers(mode=mode)
        notes.append(f" > torch.compile (mode {mode}): each of the {len(model.transformer.layers)} layers is compiled "
                     "during the first iteration" + (" (the CUDA default; --no-compile runs eager)"
                                                     if env.device.type == "cuda" else ""))
    loaded_plain = None
    if env.sharding is not None and args.load is not None and not is_sharded_checkpoint(
            find_checkpoint(args.load).parent):  # an unsharded checkpoint: its weights in before sharding
        loaded_plain = load_checkpoint(args.load, model, tp_rank=env.tp_rank, load_rng=not args.no_load_rng)
    model = env.shard(model, torch.bfloat16 if args.bf16 else None)  # ZeRO: FSDP2 units, before the optimizer
    decay_iters = args.lr_decay_iters or args.train_iters
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(
        lr=args.lr, weight_decay=args.weight_decay, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
        warmup=args.warmup, decay_iters=max(decay_iters, 1), decay_style=args.lr_decay_style,
        decay_ratio=args.lr_decay_ratio,
    ))
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    precision = Precision(env.device, dtype, args.loss_scale, window=args.loss_scale_window,
                          hysteresis=args.hysteresis, min_scale=args.min_scale, init_scale=args.initial_loss_scale)
    iteration = 0
    if loaded_plain is not None:
        iteration = loaded_plain
        notes.append(f" > --load {args.load} is unsharded: its weights and iteration are loaded, its optimizer "
                     "state is not (a sharded run starts it afresh)")
    elif args.load is not None:
        iteration = load_checkpoint(
            args.load, model, tp_rank=env.tp_rank, optimizer=optimizer,
            scheduler=None if args.no_load_lr_scheduler else scheduler,
            grad_scaler=precision.scaler, load_optimizer=not args.no_load_optim, load_rng=not args.no_load_rng,
        )
        if args.no_load_lr_scheduler:  # the loaded optimizer brought its old lr: back to the fresh schedule's
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
        if env.is_main:
            print(f" loaded checkpoint {find_checkpoint(args.load, env.tp_rank).parent} at iteration {iteration}",
                  flush=True)
    # The data streams have their own seeds; fork so that setting them up (a DataLoader draws a base seed)
    # leaves the training RNG, just restored from the checkpoint, untouched.
    with torch.random.fork_rng(devices=[]):
        batches, valid, test = build_data(args, tokenizer, env, iteration, notes)
    writer = summary_writer(args, name, iteration) if args.summary_dir and env.is_main else None
    return Run(env, config, model, optimizer, scheduler, precision, batches, iteration, valid, test, writer, name,
               notes, tokenizer)


def evaluate(args, run: Run, batches: Iterator[dict]) -> float:
    """Mean over --eval-iters batches of each global batch's loss (dropout off, the training masking):
    one process at batch N*b gives what N data-parallel ranks at b give."""
    env = run.env
    run.model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(args.eval_iters):
            batch = {key: value.to(env.device, non_blocking=True) for key, value in next(batches).items()}
            with run.precision.autocast():
                _, value = lm_loss(run.model, batch, env.dp_group, env.dp_size, env.tp_group)
            total += value.item()
    run.model.train()
    return total / args.eval_iters


def evaluate_and_report(args, run: Run, batches, prefix: str, step: int | None = None) -> float:
    """One evaluation and upstream's report of it (TensorBoard too, for the validations during training)."""
    loss = evaluate(args, run, batches)
    ppl = math.exp(min(20.0, loss))
    if run.env.is_main:
        for line in eval_lines(prefix, loss, ppl):
            if sys.stderr.isatty():
                tqdm.write(line)  # above the training bar
            else:
                print(line, flush=True)
        if run.writer is not None and step is not None:
            run.writer.add_scalar("Train/valid_ppl", ppl, step)
            run.writer.add_scalar("Train/valid_loss", loss, step)
    return loss


def train(args, run: Run) -> None:
    env = run.env
    if env.is_main:
        for note in run.notes:
            print(note, flush=True)
        if env.sharding is not None:  # what this tensor-parallel rank holds, gathered over data parallel
            from glm_port.sharding import tensor_parallel_numel

            parameters = tensor_parallel_numel(run.model.state_dict().values())
        else:
            parameters = sum(p.numel() for p in local_state_dict(run.model).values())
        print(f" > number of parameters on model parallel rank {env.tp_rank}: {parameters}", flush=True)

    def summarize(iteration: int, scalars: dict) -> None:
        for key, value in scalars.items():
            run.writer.add_scalar(f"Train/{key}", value, iteration)

    loop = TrainingLoop(
        env.wrap_data_parallel(run.model), run.optimizer, run.scheduler, run.precision, env,
        total_iters=args.train_iters, accumulation=args.gradient_accumulation_steps, clip_grad=args.clip_grad,
        log_interval=args.log_interval,
        tokens_per_iter=args.batch_size * args.seq_length * args.gradient_accumulation_steps * env.dp_size,
        summary=summarize if run.writer is not None else None,
        first_step_note="torch.compile included" if args.compile else None,
    )

    def save_now(iteration: int) -> None:
        run.iteration = iteration
        save(args, run)

    def validate(iteration: int) -> None:
        evaluate_and_report(args, run, run.valid, f"iteration {iteration}", iteration)

    periodic = [(args.save_interval, save_now)] if args.save else []
    if run.valid is not None:
        periodic.append((args.eval_interval, validate))  # after the save, as upstream
    run.iteration = loop.run(run.batches, run.iteration, periodic)


def save(args, run: Run) -> None:
    keep_optim = not args.no_save_optim
    if run.env.sharding is not None:  # each rank its shards (DCP), loadable at another world size
        path = save_sharded_checkpoint(
            args.save, run.iteration, run.model, config=run.config, optimizer=run.optimizer if keep_optim else None,
            scheduler=run.scheduler if keep_optim else None, grad_scaler=run.precision.scaler if keep_optim else None,
            save_rng=not args.no_save_rng)
    else:
        path = save_checkpoint(
            args.save, run.iteration, local_state_dict(run.model), config=run.config,
            optimizer=run.optimizer if keep_optim else None, scheduler=run.scheduler if keep_optim else None,
            grad_scaler=run.precision.scaler if keep_optim else None, save_rng=not args.no_save_rng,
            tp_rank=run.env.tp_rank, writer=run.env.dp_rank == 0,
        )
    if run.env.is_main:
        record_tokenizer(args, run.tokenizer, args.save)
        print(f" saved checkpoint at iteration {run.iteration:7d} to {path}", flush=True)


def record_tokenizer(args, tokenizer, directory) -> None:
    """The run's tokenizer beside its checkpoints, as ``save_pretrained`` records one, so glm-finetune,
    glm-generate and glm-merge read the directory alone: ``tokenizer_config.json`` naming the type (with
    ``do_lower_case`` when --tokenizer-model-type set it) and a copy of the vocabulary files."""
    import filecmp
    import shutil
    from pathlib import Path

    hf = glm_family().binding("hf")  # GLM's tokenizer class and the files it reads
    directory = Path(directory)
    if args.tokenizer_path is not None:
        for file in hf.tokenizer_files(directory, Path(args.tokenizer_path).expanduser()):
            target = directory / file.name
            if file.name == "tokenizer_config.json" or target.is_file() and filecmp.cmp(file, target, shallow=False):
                continue
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            shutil.copyfile(file, tmp)
            os.replace(tmp, target)
    hf.tokenizer_class(tokenizer).save_pretrained(directory, lowercase=args.tokenizer_lowercase)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run = setup(args)
    except (CheckpointError, OSError, ValueError, ImportError) as error:
        print(f"glm-pretrain: error: {error}", file=sys.stderr)  # one line; exit 2 as for a bad flag
        sys.exit(2)
    start = run.iteration
    if start >= args.train_iters:
        if run.env.is_main:
            print(f" nothing to train: the checkpoint is at iteration {start} and --train-iters is "
                  f"{args.train_iters} (raise --train-iters to train on)", flush=True)
        if run.writer is not None:
            run.writer.close()
        run.env.close()
        return
    try:
        train(args, run)
        # Then as upstream: validation, the last checkpoint, the test set.
        if run.valid is not None:
            evaluate_and_report(args, run, run.valid, "the end of training for val data")
        if args.save and run.iteration != start and run.iteration % args.save_interval:
            save(args, run)  # the last iterations, as upstream saves at the end
        if run.test is not None:
            evaluate_and_report(args, run, run.test, "the end of training for test data")
    finally:
        if run.writer is not None:
            run.writer.close()
        run.env.close()


if __name__ == "__main__":
    main()
