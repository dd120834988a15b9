"""``glm-pretrain`` command line: upstream GLM's flag names for what it does, a refusal for the rest.

Defaults follow upstream (``arguments.py``) except the size of the run: with no arguments,
glm-pretrain trains a tiny GLM on the embedded corpus (upstream's defaults describe GLM-Large).
A DeepSpeed JSON (``--deepspeed_config``) supplies batch, accumulation, clipping, precision and
optimizer settings, overriding the flags as upstream does.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# Upstream flags glm-pretrain does not implement, grouped by why. Refused by name rather than ignored,
# so a run never silently differs from what the script asked for.
REFUSED = {
    "another model or objective than GLM blank infilling": [
        "--pretrained-bert", "--deep-init", "--attention-scale", "--masked-lm", "--output-dropout", "--vocab-size",
    ],
    "upstream's GPT-XL objective (left to right over consecutive segments, with recurrence memory), not blank "
    "infilling; no upstream pretraining config uses it": ["--transformer-xl"],
    "upstream's EncoderDecoder, two transformer stacks: another architecture, with no upstream config or "
    "released checkpoint": ["--encoder-decoder"],
    "blank-infilling variants no upstream config uses (see docs/glm_port.md)": [
        "--random-position", "--reset-position-ids", "--reset-attention-mask",
    ],
    "training features glm-pretrain does not have": [
        "--epochs", "--label-smoothing", "--switch-linear", "--save-epoch", "--no-deepspeed-load", "--finetune",
        "--DDP-impl", "--cpu-optimizer", "--cpu_torch_adam", "--optimizer", "--deepscale", "--deepscale_config",
        "--deepspeed_mpi",
    ],
    "evaluation and generation (glm-pretrain reports the validation loss only)": [
        "--eval-epoch", "--eval-max-preds-per-seq", "--overlapping-eval",
        "--temperature", "--top-p", "--top-k", "--out-seq-length", "--num-beams", "--length-penalty",
        "--no-repeat-ngram-size", "--min-tgt-length", "--select-topk", "--blank-maskratio",
    ],
    "upstream's data-loader options (corpora are JSON lines or text files, named or by path)": [
        "--data-dir", "--input-data-sizes-file", "--delim", "--eval-text-key", "--presplit-sentences",
        "--use-tfrecords", "--max-preds-per-seq", "--load-splits", "--save-splits", "--save-test-data",
        "--multi-task-data", "--multi-task-ratio", "--multi-seq-length", "--multi-batch-size",
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
        "on CPU, in about 15 s on two idle cores (minutes on a busy machine). Flags keep upstream THUDM/GLM's names; upstream flags this port does not "
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
    model.add_argument("--intermediate-size", type=int, default=None,
                       help="the MLP's inner width; default 4 * --hidden-size")
    model.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                       help="pad the embedding rows (the tokenizer's tokens) up to a multiple of this")
    model.add_argument("--mem-length", type=int, default=0,
                       help="only 0: memory belongs to --transformer-xl, which glm-pretrain does not train")
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
    data.add_argument("--train-data", nargs="+", default=None, metavar="PATH_OR_NAME",
                      help="JSON-lines ({'text': ...}) or text files, directories of them, or upstream's corpus "
                      "names (bert-large, wikibook, pile, ...) looked up in the TOML file $GLM_CORPORA "
                      "(default ~/.config/glm-migrate/corpora.toml: name = \"path\"); default: the embedded "
                      "tiny corpus")
    data.add_argument("--valid-data", nargs="*", default=None, metavar="PATH_OR_NAME",
                      help="validation corpus; given, --split gives validation no share of --train-data")
    data.add_argument("--test-data", nargs="*", default=None, metavar="PATH_OR_NAME",
                      help="test corpus; given, --split gives test no share of --train-data")
    data.add_argument("--split", default="1000,1,1",
                      help="train,valid,test shares of --train-data's documents (upstream's rule: documents "
                      "shuffled with seed 1234, then cut in this order; '949,50,1', '0.9/0.1' or '1')")
    data.add_argument("--text-key", default="text", help="JSON field holding the text (upstream: 'sentence')")
    data.add_argument("--tokenizer-type", default=None,
                      help="BertWordPieceTokenizer, GPT2BPETokenizer, RobertaBPETokenizer or ChineseSPTokenizer; "
                      "default: the built-in tokenizer of the embedded corpus")
    data.add_argument("--tokenizer-path", default=None,
                      help="vocabulary file or directory for --tokenizer-type; default: $GLM_VOCAB_DIR")
    data.add_argument("--tokenizer-model-type", default=None,
                      help="which vocabulary in a --tokenizer-path directory: 'bert-large-uncased' reads "
                      "bert-large-uncased-vocab.txt (lowercased unless '-cased'; the uncased BERT base and "
                      "large vocabularies are one file), 'roberta' picks RoBERTa's BPE layout, as upstream")
    data.add_argument("--fix-command-token", action="store_true",
                      help="accepted: ChineseSPTokenizer always has the fixed layout of the released checkpoints "
                      "(without the flag upstream gives [gMASK] the id of eop)")
    data.add_argument("--seq-length", type=int, default=128, help="tokens per sample (upstream default 512)")
    data.add_argument("--batch-size", type=int, default=8, help="samples per rank per micro-batch")
    data.add_argument("--gradient-accumulation-steps", type=int, default=1)
    data.add_argument("--bert-prob", type=float, default=0.5, help="share of samples masked with token spans")
    data.add_argument("--gap-sentence-prob", type=float, default=0.0, help="share masked with sentence spans")
    data.add_argument("--gpt-min-ratio", type=float, default=0.5, help="min kept prefix for document-suffix masks")
    data.add_argument("--avg-block-length", type=int, default=3, help="Poisson mean of span lengths")
    data.add_argument("--task-mask", action="store_true", help="[gMASK]/[sMASK] for generation/sentence spans")
    data.add_argument("--gap-sentence-ratio", type=float, default=0.15, help="share of the text in sentence spans")
    data.add_argument("--gpt-infill-prob", type=float, default=0.5,
                      help="share of single-document generation samples masked as a document suffix")
    data.add_argument("--block-mask-prob", type=float, default=0.0,
                      help="share of Part B inputs of token spans (not [sop]) hidden behind [dBLOCK]")
    data.add_argument("--context-mask-ratio", type=float, default=0.0,
                      help="token spans: this share of the text, from Part A tokens next to a span, hidden "
                      "behind [dBLOCK]")
    data.add_argument("--short-seq-prob", type=float, default=0.0,
                      help="share of samples cut to a random length in [32, seq-length - 2]")
    data.add_argument("--single-span-prob", type=float, default=0.0,
                      help="share of samples masked with one token span")
    data.add_argument("--no-shuffle-block", action="store_true", help="Part B blocks in text order, not shuffled")
    data.add_argument("--no-block-position", action="store_true",
                      help="every Part B token at block position 1 instead of 1..n")
    data.add_argument("--sentinel-token", action="store_true",
                      help="block k of Part B opens with its own sop<k> (token spans: [MASK<k>] in Part A) and "
                      "sits at position --seq-length; needs --max-position-embeddings > --seq-length; the "
                      "vocabulary grows by 2 * (--max-position-embeddings - 1) tokens")
    data.add_argument("--non-sentence-start", type=float, default=0.0,
                      help="share of samples that may start mid-sentence; the others move their start (at most "
                      "half a sample) to after a sentence end")
    data.add_argument("--sample-one-document", action="store_true",
                      help="one document per sample (long ones in consecutive pieces), not documents back to back")
    data.add_argument("--filter-english", action="store_true",
                      help="train on the documents py3langid reads as English (upstream: fastText lid.176); "
                      "needs pip install 'glm-migrate[data]'")
    data.add_argument("--shuffle", action="store_true",
                      help="accepted: documents are always drawn in a seeded random order, as upstream's "
                      "BlockDataset draws them with or without --shuffle")
    data.add_argument("--loader-scatter", type=int, default=None, metavar="N",
                      help="data-parallel rank r reads only the (r %% N)-th of N disjoint shares of the documents "
                      "(needs a multiple of N data-parallel ranks; otherwise every rank reads all, with a note)")
    data.add_argument("--lazy-loader", action="store_true",
                      help="accepted: token ids are cached once per corpus file (.glmcache.npz) and read whole")
    data.add_argument("--no-lazy-loader", action="store_true", help="accepted, as --lazy-loader")
    data.add_argument("--half-lazy-loader", action="store_true", help="accepted, as --lazy-loader")
    data.add_argument("--loose-json", action="store_true",
                      help="accepted: JSON lines and a JSON array of records are both read")
    data.add_argument("--no-pre-tokenize", action="store_true",
                      help="accepted: corpora are tokenized once and cached")
    data.add_argument("--num-workers", type=int, default=0,
                      help="DataLoader worker processes masking samples (same batches as 0; upstream default 2)")
    data.add_argument("--cache-dir", default=None,
                      help="accepted: nothing is downloaded (vocabularies come from --tokenizer-path)")
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
    train.add_argument("--bf16", action="store_true", help="bf16 autocast")
    train.add_argument("--experiment-name", default=None,
                       help="save under --save/NAME<month-day-hour-minute> (upstream's layout), or, with --load, "
                       "in --save/<the loaded directory's name>; without it, checkpoints go in --save itself")
    train.add_argument("--new-save-directory", action="store_true",
                       help="with --load and --experiment-name: save under a new NAME<timestamp> directory")
    train.add_argument("--summary-dir", default=None,
                       help="write TensorBoard scalars to SUMMARY_DIR/runs/NAME (loss, learning rate, grad norm, "
                       "loss scale, tokens/s, validation loss); needs pip install 'glm-migrate[tensorboard]'")

    fp16 = parser.add_argument_group("fp16 (torch.amp)")
    fp16.add_argument("--fp16", action="store_true",
                      help="fp16 autocast with dynamic loss scaling (on a CPU too: torch autocasts CPU ops to fp16)")
    fp16.add_argument("--loss-scale", type=float, default=None, help="static fp16 loss scale; default dynamic")
    fp16.add_argument("--loss-scale-window", type=float, default=1000,
                      help="dynamic scaling: clean steps before the scale doubles")
    fp16.add_argument("--hysteresis", type=int, default=2,
                      help="dynamic scaling: overflows tolerated before the scale halves (reset when it grows)")
    fp16.add_argument("--min-scale", type=float, default=1, help="dynamic scaling: the scale never falls below this")
    for flag, what in (("--fp32-embedding", "embeddings"), ("--fp32-layernorm", "LayerNorms"),
                       ("--fp32-tokentypes", "token-type embeddings")):
        fp16.add_argument(flag, action="store_true",
                          help=f"accepted, changes nothing: autocast keeps weights, so {what}, in fp32 "
                          "(LayerNorm and softmax also compute in fp32)")
    fp16.add_argument("--fp32-allreduce", action="store_true",
                      help="accepted, changes nothing: gradients are fp32 under autocast, so all-reduced in fp32")
    train.add_argument("--seed", type=int, default=1234)
    train.add_argument("--log-interval", type=int, default=10, help="iterations per log line (upstream 100)")
    train.add_argument("--device", default=None, help="cpu, cuda, cuda:1...; default: shim.device()")
    train.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="torch.compile each transformer layer (regional compilation; the first iteration then "
                       "compiles, and its time is printed). Default: on when training on a CUDA device (GLM-Large "
                       "bf16 batch 8 on an H100, with --compile-mode's CUDA default: 3.17x the original's --fp16 "
                       "iteration rate, docs/performance.md), off elsewhere (on CPU it measured slower than eager); --no-compile "
                       "runs eager everywhere")
    train.add_argument("--compile-mode", default=None,
                       choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                       help="torch.compile's mode for the layers. Default: reduce-overhead on a CUDA device (each "
                       "compiled layer replayed as a CUDA graph: the step no longer waits on Python's kernel "
                       "launches), default elsewhere")

    valid = parser.add_argument_group("validation")
    valid.add_argument("--eval-interval", type=int, default=1000,
                       help="iterations between validation runs (and one at the end, then the test set)")
    valid.add_argument("--eval-iters", type=int, default=10,
                       help="batches per validation or test run (upstream default 100; the run size is tiny)")
    valid.add_argument("--eval-batch-size", type=int, default=None, help="default: --batch-size")
    valid.add_argument("--eval-seq-length", type=int, default=None, help="default: --seq-length")

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--save", default=None, help="directory for checkpoints (upstream layout)")
    ckpt.add_argument("--save-interval", type=int, default=5000, help="iterations between checkpoints")
    ckpt.add_argument("--load", default=None, help="checkpoint directory or model file to resume from")
    ckpt.add_argument("--no-save-optim", action="store_true")
    ckpt.add_argument("--no-save-rng", action="store_true")
    ckpt.add_argument("--no-load-optim", action="store_true")
    ckpt.add_argument("--no-load-rng", action="store_true")
    ckpt.add_argument("--no-load-lr-scheduler", action="store_true",
                      help="start the learning-rate schedule afresh (warmup included) from the loaded weights")
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
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        parser.error(f"--deepspeed_config {path}: ZeRO stage {stage!r} is not supported (stages 0-3)")
    args.zero_stage = stage  # 1-3: sharded with FSDP2 over the data-parallel ranks (glm_port.sharding)
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
        args.loss_scale_window = config["fp16"].get("loss_scale_window", args.loss_scale_window)
        args.hysteresis = config["fp16"].get("hysteresis", args.hysteresis)
        args.min_scale = config["fp16"].get("min_loss_scale", args.min_scale)
        if "initial_scale_power" in config["fp16"]:
            args.initial_loss_scale = 2.0 ** config["fp16"]["initial_scale_power"]
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


def _resolve_tokenizer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--tokenizer-path (default $GLM_VOCAB_DIR) and --tokenizer-model-type -> the vocabulary file to read."""
    args.tokenizer_lowercase = None
    if args.tokenizer_type is None:
        if args.tokenizer_path is not None or args.tokenizer_model_type is not None:
            parser.error("--tokenizer-path and --tokenizer-model-type need --tokenizer-type")
        return
    if args.tokenizer_path is None:
        if not os.environ.get("GLM_VOCAB_DIR"):
            parser.error(f"--tokenizer-type {args.tokenizer_type} needs --tokenizer-path (or GLM_VOCAB_DIR): "
                         "the vocabulary file or a directory holding it")
        args.tokenizer_path = os.environ["GLM_VOCAB_DIR"]
    path = Path(args.tokenizer_path).expanduser()
    if not path.exists():
        parser.error(f"--tokenizer-path {args.tokenizer_path}: no such file or directory")
    model_type = args.tokenizer_model_type
    if model_type is None:
        return
    if args.tokenizer_type == "BertWordPieceTokenizer":
        args.tokenizer_lowercase = not ("-cased" in model_type or "chinese" in model_type)
        names = [f"{model_type}-vocab.txt", f"{model_type.replace('bert-large-', 'bert-base-')}-vocab.txt"]
    elif args.tokenizer_type == "GPT2BPETokenizer":
        names = ["roberta-vocab.json"] if model_type.startswith("roberta") else ["gpt2-vocab.json", "vocab.json"]
    else:
        return  # upstream reads --tokenizer-model-type for sentencepiece training only
    if path.is_dir():
        found = [path / name for name in names if (path / name).is_file()]
        if not found:
            parser.error(f"--tokenizer-model-type {model_type}: no {' or '.join(names)} in {path}")
        args.tokenizer_path = str(found[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    _refuse_unknown(parser, unknown)
    args.train_batch_size, args.zero_stage, args.initial_loss_scale = None, 0, 2.0**32
    if args.deepspeed_config is not None:
        apply_deepspeed_config(args, parser)
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16 are exclusive")
    if args.max_position_embeddings is None and args.sentinel_token:  # sentinel blocks sit at --seq-length
        args.max_position_embeddings = max(args.seq_length, args.eval_seq_length or 0) + 1
    if args.max_position_embeddings is None:
        args.max_position_embeddings = max(args.seq_length, args.eval_seq_length or 0)
    args.eval_seq_length = args.eval_seq_length or args.seq_length
    args.eval_batch_size = args.eval_batch_size or args.batch_size
    for flag, length in (("--seq-length", args.seq_length), ("--eval-seq-length", args.eval_seq_length)):
        if length > args.max_position_embeddings - (1 if args.sentinel_token else 0):
            parser.error(f"{flag} {length} exceeds --max-position-embeddings {args.max_position_embeddings}"
                         + (" - 1 (--sentinel-token puts Part B at position --seq-length)" if args.sentinel_token
                            else ""))
    args.checkpoint_activations |= args.deepspeed_activation_checkpointing or args.checkpoint_policy is not None
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "batch_size",
                 "gradient_accumulation_steps", "log_interval", "model_parallel_size", "save_interval",
                 "eval_interval", "eval_batch_size", "eval_seq_length", "hysteresis", "loss_scale_window"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.train_iters < 0:
        parser.error(f"--train-iters must not be negative, got {args.train_iters}")
    if args.mem_length:
        parser.error(f"--mem-length {args.mem_length}: {REFUSED_FLAGS['--transformer-xl']}")
    if args.intermediate_size is not None and args.intermediate_size < 1:
        parser.error(f"--intermediate-size must be at least 1, got {args.intermediate_size}")
    if args.make_vocab_size_divisible_by < 1:
        parser.error(f"--make-vocab-size-divisible-by must be at least 1, got {args.make_vocab_size_divisible_by}")
    if args.eval_iters < 0:
        parser.error(f"--eval-iters must not be negative, got {args.eval_iters}")
    if args.min_scale <= 0:
        parser.error(f"--min-scale must be positive, got {args.min_scale}")
    if args.loader_scatter is not None and args.loader_scatter < 1:
        parser.error(f"--loader-scatter must be at least 1, got {args.loader_scatter}")
    for name in ("bert_prob", "gap_sentence_prob", "gap_sentence_ratio", "gpt_min_ratio", "gpt_infill_prob",
                 "block_mask_prob", "context_mask_ratio", "short_seq_prob", "single_span_prob", "non_sentence_start"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if args.bert_prob + args.gap_sentence_prob > 1.0 + 1e-9:
        parser.error(f"--bert-prob {args.bert_prob} + --gap-sentence-prob {args.gap_sentence_prob} exceeds 1")
    _resolve_tokenizer(args, parser)
    from glm_port.data.batches import parse_split
    from glm_port.data.corpora import resolve_corpora

    args.valid_data = args.valid_data or None  # "--valid-data" with no path: none, as upstream
    args.test_data = args.test_data or None
    try:
        parse_split(args.split, valid_given=args.valid_data is not None, test_given=args.test_data is not None)
    except ValueError as error:
        parser.error(str(error))
    for flag in ("train_data", "valid_data", "test_data"):
        try:
            setattr(args, flag + "_files", resolve_corpora(getattr(args, flag)))
        except ValueError as error:
            parser.error(f"--{flag.replace('_', '-')} {error}")
    if args.load is not None and not Path(args.load).exists():
        parser.error(f"--load {args.load}: no such file or directory")
    args.block_lm = True
    return args
