"""``glm-pretrain``: GLM blank-infilling pretraining on one CPU/GPU or under ``torchrun``.

    glm-pretrain                                   # tiny GLM, embedded corpus, CPU, about a minute
    glm-pretrain --train-data corpus.jsonl --tokenizer-type BertWordPieceTokenizer \\
        --tokenizer-path vocab.txt --num-layers 12 --hidden-size 768 --num-attention-heads 12 \\
        --seq-length 512 --train-iters 10000 --save ckpt --bf16
    torchrun --nproc_per_node 4 -m glm_port.pretrain_glm --model-parallel-size 2 ...

The log keeps upstream's line, ``iteration N/M | elapsed time per iteration (ms): T | learning rate L
| lm loss X |``, so existing parsers keep working; on a terminal a tqdm bar shows loss, tokens/s, ETA.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

import shim as torch
from glm_port import data
from glm_port.arguments import parse_args
from glm_port.checkpoint_io import CheckpointError, load_checkpoint, save_checkpoint
from glm_port.distributed import ParallelEnv, local_state_dict
from glm_port.models.glm import GLMConfig, GLMModel
from glm_port.training import OptimizerSettings, Precision, TrainingLoop, build_optimizer


def set_random_seed(seed: int, env: ParallelEnv) -> None:
    """Same seed on every rank, as upstream; the tensor-parallel RNG tracker adds its per-rank offset."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env.seed_tracker(seed)


def model_config(args, vocab_size: int) -> GLMConfig:
    return GLMConfig(
        vocab_size=vocab_size,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        max_sequence_length=args.max_position_embeddings,
        embedding_dropout_prob=args.hidden_dropout,
        attention_dropout_prob=args.attention_dropout,
        output_dropout_prob=args.hidden_dropout,
        layernorm_epsilon=args.layernorm_epsilon,
        checkpoint_activations=args.checkpoint_activations,
        checkpoint_num_layers=args.checkpoint_num_layers,
        checkpoint_policy=args.checkpoint_policy or "full",
    )


@dataclass
class Run:
    """Everything a training run holds between steps."""

    env: ParallelEnv
    config: GLMConfig
    model: GLMModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    batches: Iterator[dict]
    iteration: int


def setup(args) -> Run:
    """Everything before the first step; bad input fails here, before anything is written."""
    if args.local_rank is not None:  # older launchers pass --local_rank instead of setting LOCAL_RANK
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    env = ParallelEnv.from_environment(args.model_parallel_size, args.distributed_backend, args.device)
    if args.train_batch_size is not None:
        expected = args.batch_size * args.gradient_accumulation_steps * env.dp_size
        if args.train_batch_size != expected:
            raise ValueError(
                f"--deepspeed_config train_batch_size {args.train_batch_size} != micro batch {args.batch_size}"
                f" x accumulation {args.gradient_accumulation_steps} x data-parallel {env.dp_size}"
            )
    set_random_seed(args.seed, env)
    tokenizer = data.get_tokenizer(args.tokenizer_type, args.tokenizer_path)
    config = model_config(args, tokenizer.vocab_size)
    model = GLMModel(config).to(env.device)  # after ParallelEnv: its layout splits the layers
    if args.compile:
        model.transformer.compile_layers()
    decay_iters = args.lr_decay_iters or args.train_iters
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(
        lr=args.lr, weight_decay=args.weight_decay, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
        warmup=args.warmup, decay_iters=max(decay_iters, 1), decay_style=args.lr_decay_style,
        decay_ratio=args.lr_decay_ratio,
    ))
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    precision = Precision(env.device, dtype, args.loss_scale)
    iteration = 0
    if args.load is not None:
        iteration = load_checkpoint(
            args.load, model, tp_rank=env.tp_rank, optimizer=optimizer, scheduler=scheduler,
            grad_scaler=precision.scaler, load_optimizer=not args.no_load_optim, load_rng=not args.no_load_rng,
        )
    masker_kwargs = dict(avg_block_length=args.avg_block_length, bert_prob=args.bert_prob,
                         gap_sentence_prob=args.gap_sentence_prob, gpt_min_ratio=args.gpt_min_ratio,
                         task_mask=args.task_mask)
    # The data stream has its own seeds; fork so that setting it up (a DataLoader draws a base seed)
    # leaves the training RNG, just restored from the checkpoint, untouched.
    with torch.random.fork_rng(devices=[]):
        batches = data.build_train_batches(
            args.train_data, tokenizer, seq_length=args.seq_length, batch_size=args.batch_size, seed=args.seed,
            masker_kwargs=masker_kwargs, rank=env.dp_rank, world_size=env.dp_size, text_key=args.text_key,
            start_batch=iteration * args.gradient_accumulation_steps,  # resume the data where it stopped
        )
    return Run(env, config, model, optimizer, scheduler, precision, batches, iteration)


def train(args, run: Run) -> None:
    env = run.env
    if env.is_main:
        parameters = sum(p.numel() for p in local_state_dict(run.model).values())
        print(f" > number of parameters on model parallel rank {env.tp_rank}: {parameters}", flush=True)
    loop = TrainingLoop(
        env.wrap_data_parallel(run.model), run.optimizer, run.scheduler, run.precision, env,
        total_iters=args.train_iters, accumulation=args.gradient_accumulation_steps, clip_grad=args.clip_grad,
        log_interval=args.log_interval,
        tokens_per_iter=args.batch_size * args.seq_length * args.gradient_accumulation_steps * env.dp_size,
    )

    def save_now(iteration: int) -> None:
        run.iteration = iteration
        save(args, run)

    run.iteration = loop.run(run.batches, run.iteration, [(args.save_interval, save_now)] if args.save else [])


def save(args, run: Run) -> None:
    keep_optim = not args.no_save_optim
    path = save_checkpoint(
        args.save, run.iteration, local_state_dict(run.model), config=run.config,
        optimizer=run.optimizer if keep_optim else None, scheduler=run.scheduler if keep_optim else None,
        grad_scaler=run.precision.scaler if keep_optim else None, save_rng=not args.no_save_rng,
        tp_rank=run.env.tp_rank, writer=run.env.dp_rank == 0,
    )
    if run.env.is_main:
        print(f" saved checkpoint at iteration {run.iteration:7d} to {path}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run = setup(args)
    except (CheckpointError, OSError, ValueError) as error:
        sys.exit(f"glm-pretrain: error: {error}")
    start = run.iteration
    try:
        train(args, run)
        if args.save and run.iteration != start and run.iteration % args.save_interval:
            save(args, run)  # the last iterations, as upstream saves at the end
    finally:
        run.env.close()


if __name__ == "__main__":
    main()
