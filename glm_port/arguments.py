"""``glm-pretrain`` command line: upstream GLM's flag names for what it does, a refusal for the rest.

Defaults follow upstream (``arguments.py``) except the size of the run: with no arguments,
glm-pretrain trains a tiny GLM on the embedded corpus (upstream's defaults describe GLM-Large).
A DeepSpeed JSON (``--deepspeed_config``) supplies batch, accumulation, clipping, precision and
optimizer settings, overriding the flags as upstream does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Upstream flags glm-pretrain does not implement, grouped by why. Refused by name rather than ignored,
# so a run never silently differs from what the script asked for.
REFUSED = {
    "another model or objective than GLM blank infilling": [
        "--transformer-xl", "--pretrained-bert", "--encoder-decoder", "--intermediate-size", "--deep-init",
        "--mem-length", "--attention-scale", "--masked-lm", "--no-block-position", "--sentinel-token",
        "--output-dropout", "--vocab-size", "--make-vocab-size-divisible-by",
    ],
    "blank-infilling knobs the masker does not expose": [
        "--gpt-infill-prob", "--gap-sentence-ratio", "--short-seq-prob", "--single-span-prob",
        "--no-shuffle-block", "--block-mask-prob", "--context-mask-ratio", "--random-position",
        "--reset-position-ids", "--reset-attention-mask",
    ],
    "apex/DeepSpeed fp16 internals (torch.amp scales the loss)": [
        "--fp32-embedding", "--fp32-layernorm", "--fp32-tokentypes", "--fp32-allreduce", "--hysteresis",
        "--loss-scale-window", "--min-scale",
    ],
    "training features glm-pretrain does not have": [
        "--experiment-name", "--epochs", "--label-smoothing", "--summary-dir", "--switch-linear",
        "--new-save-directory", "--save-epoch", "--no-load-lr-scheduler", "--no-deepspeed-load", "--finetune",
        "--DDP-impl", "--cpu-optimizer", "--cpu_torch_adam", "--optimizer", "--deepscale", "--deepscale_config",
        "--deepspeed_mpi",
    ],
    "evaluation and generation (glm-pretrain only trains)": [
        "--eval-batch-size", "--eval-iters", "--eval-interval", "--eval-epoch", "--eval-seq-length",
        "--eval-max-preds-per-seq", "--overlapping-eval", "--valid-data", "--test-data", "--split",
        "--temperature", "--top-p", "--top-k", "--out-seq-length", "--num-beams", "--length-penalty",
        "--no-repeat-ngram-size", "--min-tgt-length", "--select-topk", "--blank-maskratio",
    ],
    "upstream's data-loader options (corpora are JSON lines or text files given by path)": [
        "--shuffle", "--filter-english", "--data-dir", "--input-data-sizes-file", "--delim",
        "--eval-text-key", "--no-lazy-loader", "--half-lazy-loader", "--loader-scatter", "--loose-json",
        "--presplit-sentences", "--num-workers", "--tokenizer-model-type", "--fix-command-token",
        "--no-pre-tokenize", "--cache-dir", "--use-tfrecords", "--max-preds-per-seq", "--non-sentence-start",
        "--sample-one-document", "--load-splits", "--save-splits", "--save-test-data", "--multi-task-data",
        "--multi-task-ratio", "--multi-seq-length", "--multi-batch-size",
    ],
    "fine-tuning (finetune_glm.py)": [
        "--task", "--load-pretrained", "--pool-token", "--cloze-eval", "--multi-token", "--segment-length",
        "--loss-func", "--block-lm-ratio", "--adapet", "--pattern-id", "--fast-decode", "--few-superglue",
        "--eval-valid", "--validation-metric", "--unidirectional", "--src-seq-length", "--tgt-seq-length",
        "--wsc-negative", "--overwrite", "--no-validation", "--continuous-prompt", "--num-prompt-tokens",
        "--prompt-func", "--freeze-transformer", "--tune-prefix-layers", "--prefix-prompt", "--prompt-init",
        "--mask-pad-token",
    ],
}
REFUSED_FLAGS = {flag: reason for reason, flags in REFUSED.items() for flag in flags}

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-pretrain",
        description="Pretrain GLM with blank infilling. With no arguments: a tiny GLM on the embedded corpus, "
        "on CPU, in about 25 s on two idle cores (minutes on a busy machine). Flags keep upstream THUDM/GLM's names; upstream flags this port does not "
        "implement are refused by name.",
        allow_abbrev=False,  # "--load" must never silently mean "--load-pretrained"
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--num-layers", type=int, default=2, help="transformer layers (upstream default 24)")
    model.add_argument("--hidden-size", type=int, default=128, help="hidden size (upstream default 1024)")
    model.add_argument("--num-attention-heads", type=int, default=4, help="attention heads (upstream default 16)")
    model.add_argument("--max-position-embeddings", type=int, default=None,
                       help="position embedding rows; default: --seq-length")
    model.add_argument("--hidden-dropout", type=float, default=0.1, help="dropout on embeddings and layer outputs")
    model.add_argument("--attention-dropout", type=float, default=0.1, help="dropout on attention probabilities")
    model.add_argument("--layernorm-epsilon", type=float, default=1e-5)
    model.add_argument("--block-lm", action="store_true",
                       help="blank-infilling objective with 2D positions; the only objective, so always on")
    model.add_argument("--checkpoint-activations", action="store_true",
                       help="recompute layers in backward (dropout replayed exactly)")
    model.add_argument("--checkpoint-num-layers", type=int, default=1, help="layers per checkpointed chunk")
    model.add_argument("--checkpoint-policy", choices=("full", "selective"), default=None,
                       help="what checkpointing keeps of each chunk: 'full' (the default) only its input; "
                       "'selective' also its matmul outputs, recomputing LayerNorms, GELU, dropout and "
                       "attention: more memory than 'full', less recompute. Implies "
                       "--checkpoint-activations")
    model.add_argument("--deepspeed-activation-checkpointing", action="store_true",
                       help="same as --checkpoint-activations (shim.checkpointing is DeepSpeed's API)")

    data = parser.add_argument_group("data")
    data.add_argument("--train-data", nargs="+", default=None, metavar="PATH",
                      help="JSON-lines ({'text': ...}) or text files; default: the embedded tiny corpus")
    data.add_argument("--text-key", default="text", help="JSON field holding the text (upstream: 'sentence')")
    data.add_argument("--tokenizer-type", default=None,
                      help="BertWordPieceTokenizer, GPT2BPETokenizer, RobertaBPETokenizer or ChineseSPTokenizer; "
                      "default: the built-in tokenizer of the embedded corpus")
    data.add_argument("--tokenizer-path", default=None, help="vocabulary file or directory for --tokenizer-type")
    data.add_argument("--seq-length", type=int, default=128, help="tokens per sample (upstream default 512)")
    data.add_argument("--batch-size", type=int, default=8, help="samples per rank per micro-batch")
    data.add_argument("--gradient-accumulation-steps", type=int, default=1)
    data.add_argument("--bert-prob", type=float, default=0.5, help="share of samples masked with token spans")
    data.add_argument("--gap-sentence-prob", type=float, default=0.0, help="share masked with sentence spans")
    data.add_argument("--gpt-min-ratio", type=float, default=0.5, help="min kept prefix for document-suffix masks")
    data.add_argument("--avg-block-length", type=int, default=3, help="Poisson mean of span lengths")
    data.add_argument("--task-mask", action="store_true", help="[gMASK]/[sMASK] for generation/sentence spans")

    train = parser.add_argument_group("training")
    train.add_argument("--train-iters", type=int, default=200, help="optimizer steps (upstream default 0)")
    train.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (upstream default 1e-4)")
    train.add_argument("--warmup", type=float, default=0.01, help="warmup as a fraction of the decay iterations")
    train.add_argument("--lr-decay-style", default="linear", choices=("constant", "linear", "cosine", "exponential"))
    train.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    train.add_argument("--lr-decay-ratio", type=float, default=0.1, help="final lr as a fraction of --lr")
    train.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decoupled weight decay")
    train.add_argument("--adam-beta1", type=float, default=0.9)
    train.add_argument("--adam-beta2", type=float, default=0.999)
    train.add_argument("--adam-eps", type=float, default=1e-8)
    train.add_argument("--clip-grad", type=float, default=1.0, help="global gradient-norm clip; 0 disables")
    train.add_argument("--fp16", action="store_true", help="fp16 autocast with dynamic loss scaling")
    train.add_argument("--bf16", action="store_true", help="bf16 autocast")
    train.add_argument("--loss-scale", type=float, default=None, help="static fp16 loss scale; default dynamic")
    train.add_argument("--seed", type=int, default=1234)
    train.add_argument("--log-interval", type=int, default=10, help="iterations per log line (upstream 100)")
    train.add_argument("--device", default=None, help="cpu, cuda, cuda:1...; default: shim.device()")
    train.add_argument("--compile", action="store_true",
                       help="torch.compile each transformer layer (the first steps then compile; on CPU it "
                       "measured slower than eager, see docs/performance.md)")

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--save", default=None, help="directory for checkpoints (upstream layout)")
    ckpt.add_argument("--save-interval", type=int, default=5000, help="iterations between checkpoints")
    ckpt.add_argument("--load", default=None, help="checkpoint directory or model file to resume from")
    ckpt.add_argument("--no-save-optim", action="store_true")
    ckpt.add_argument("--no-save-rng", action="store_true")
    ckpt.add_argument("--no-load-optim", action="store_true")
    ckpt.add_argument("--no-load-rng", action="store_true")
    ckpt.add_argument("--resume-dataloader", action="store_true",
                      help="continue the data where the checkpoint stopped; always done, accepted for scripts")

    par = parser.add_argument_group("parallelism (under torchrun)")
    par.add_argument("--model-parallel-size", type=int, default=1, help="tensor-parallel ranks")
    par.add_argument("--distributed-backend", default=None, choices=("nccl", "gloo"),
                     help="default: nccl with CUDA, gloo without")
    par.add_argument("--local_rank", type=int, default=None, help="set by older launchers; LOCAL_RANK wins")
    par.add_argument("--deepspeed", action="store_true", help="read --deepspeed_config (no DeepSpeed engine needed)")
    par.add_argument("--deepspeed_config", default=None, metavar="JSON",
                     help="DeepSpeed config: batch, accumulation, gradient_clipping, fp16/bf16, optimizer")
    return parser


def _refuse_unknown(parser: argparse.ArgumentParser, unknown: list[str]) -> None:
    for token in unknown:
        flag = token.split("=", 1)[0]
        if flag in REFUSED_FLAGS:
            parser.error(f"upstream flag {flag} is not supported: {REFUSED_FLAGS[flag]}")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def apply_deepspeed_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Take batch, accumulation, clipping, precision and optimizer settings from the JSON, as upstream."""
    path = Path(args.deepspeed_config)
    try:
        config = json.loads(path.read_text())
    except OSError as error:
        parser.error(f"--deepspeed_config {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        parser.error(f"--deepspeed_config {path}: not valid JSON ({error})")
    if config.get("zero_optimization", {}).get("stage", 0):
        parser.error(f"--deepspeed_config {path}: ZeRO stages are not supported (use stage 0)")
    if "scheduler" in config:
        parser.error(f"--deepspeed_config {path}: a DeepSpeed 'scheduler' is not supported "
                     "(glm-pretrain uses upstream's --lr-decay-* schedule)")
    args.batch_size = config.get("train_micro_batch_size_per_gpu", args.batch_size)
    args.gradient_accumulation_steps = config.get("gradient_accumulation_steps", args.gradient_accumulation_steps)
    args.clip_grad = config.get("gradient_clipping", args.clip_grad)
    args.train_batch_size = config.get("train_batch_size")
    if config.get("fp16", {}).get("enabled"):
        args.fp16 = True
        scale = config["fp16"].get("loss_scale", 0)
        args.loss_scale = scale or None  # DeepSpeed: 0 means dynamic
    if config.get("bf16", {}).get("enabled"):
        args.bf16 = True
    optimizer = config.get("optimizer")
    if optimizer is not None:
        if optimizer.get("type", "").lower() not in ("adam", "adamw"):
            parser.error(f"--deepspeed_config {path}: optimizer {optimizer.get('type')!r} is not supported "
                         "(Adam/AdamW, both meaning AdamW as in DeepSpeed)")
        params = optimizer.get("params", {})
        args.lr = params.get("lr", args.lr)
        args.weight_decay = params.get("weight_decay", args.weight_decay)
        args.adam_beta1, args.adam_beta2 = params.get("betas", (args.adam_beta1, args.adam_beta2))
        args.adam_eps = params.get("eps", args.adam_eps)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    _refuse_unknown(parser, unknown)
    args.train_batch_size = None
    if args.deepspeed_config is not None:
        apply_deepspeed_config(args, parser)
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16 are exclusive")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.seq_length > args.max_position_embeddings:
        parser.error(f"--seq-length {args.seq_length} exceeds --max-position-embeddings "
                     f"{args.max_position_embeddings}")
    args.checkpoint_activations |= args.deepspeed_activation_checkpointing or args.checkpoint_policy is not None
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "batch_size",
                 "gradient_accumulation_steps", "log_interval", "model_parallel_size", "save_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.train_iters < 0:
        parser.error(f"--train-iters must not be negative, got {args.train_iters}")
    if args.tokenizer_path is not None and args.tokenizer_type is None:
        parser.error("--tokenizer-path needs --tokenizer-type")
    if args.tokenizer_path is not None and not Path(args.tokenizer_path).exists():
        parser.error(f"--tokenizer-path {args.tokenizer_path}: no such file or directory")
    for path in args.train_data or ():
        if not Path(path).exists():
            parser.error(f"--train-data {path}: no such file")
    if args.load is not None and not Path(args.load).exists():
        parser.error(f"--load {args.load}: no such file or directory")
    args.block_lm = True
    return args
