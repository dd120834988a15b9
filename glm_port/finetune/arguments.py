"""``glm-finetune``'s command line: PaddleNLP's flag names (``finetune_generation.py``), so its documented
commands run as they are with ``torchrun`` in place of ``python -m paddle.distributed.launch``."""

from __future__ import annotations

import argparse

from glm_port.finetune.datasets import LAYOUTS

# PaddleNLP / Hugging Face TrainingArguments flags this command does not implement: refused by name.
REFUSED = {
    "--pipeline_parallel_degree": "pipeline parallel finetuning is not implemented (glm-generate does pipeline inference)",
    "--prefix_tuning": "PaddleNLP's prefix tuning is not implemented; THUDM's P-Tuning v2 is --pre_seq_len N "
                       "(ChatGLM2 family), or use --lora",
    "--ptq": "post-training quantization is not implemented",
    "--qat": "quantization-aware training is not implemented",
    "--quantize": "quantized layers are for inference (no gradient); finetune in float, then glm-chat/glm-generate --quantize",
    "--use_flash_attention": "attention already goes through torch's SDPA kernels where they apply",
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "y"):
        return True
    if text.lower() in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default (argparse's ArgumentDefaultsHelpFormatter, with ``none`` and
    ``false`` spelled as a user types them), unless the help already says what the default does."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "default" in text.lower():
            return text
        default = action.default
        if default is None or default == "":
            value = "none"
        elif isinstance(default, bool):
            value = str(default).lower()
        else:
            value = str(default)
        return f"{text} (default: {value.replace('%', '%%')})".lstrip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-finetune",
        formatter_class=_DefaultsFormatter,
        description="Finetune a GLM for generation (full or LoRA), evaluate with beam search and ROUGE/BLEU. "
        "With no arguments: a small GLM learns an embedded toy task on CPU and shows its scores rising.",
        epilog="Boolean flags take PaddleNLP's forms too: '--do_train', '--do_train true', '--lora 1'.",
    )
    groups = []  # flags go into the group opened last, so --help lists them by section

    def flag(*names, **kw):
        groups[-1].add_argument(*names, **kw)

    def switch(name, help):
        groups[-1].add_argument(name, nargs="?", const=True, default=False, type=_bool, help=help)

    groups.append(parser.add_argument_group("model and data"))
    flag("--model_name_or_path", default=None, help="a Hugging Face GLM directory, a glm-pretrain --save directory, "
         "or upstream mp_rank_XX files; default: a small random GLM for the embedded task")
    flag("--tokenizer_name_or_path", "--tokenizer_name", default=None,
         help="the tokenizer: a directory or vocabulary file (GLM: vocab.txt, vocab.json + merges.txt, a "
         "sentencepiece .model, or tokenizer_config.json naming the type; ChatGLM2: tokenizer.model); "
         "default: the one recorded with the model (Hugging Face, glm-pretrain --save and glm-finetune "
         "directories record theirs)")
    flag("--lora_path", default=None, help="a PEFT LoRA adapter directory to apply to the model (eval / predict)")
    flag("--train_file", default=None, help="training samples: JSON lines or a JSON list")
    flag("--eval_file", default=None, help="evaluation samples (same format)")
    flag("--test_file", default=None, help="samples to predict with --do_predict (target field optional)")
    flag("--dataset_layout", default="plain", choices=LAYOUTS,
         help="which fields make (source, target): plain (--source_field/--target_field), dureaderqg "
         "(PaddleNLP's question-generation prompt), adgen (content -> summary), belle (instruction/input -> output), "
         "conversations (ChatGLM3 finetune_demo's 'conversations': system/user/assistant/observation turns, 'tools' "
         "on the system turn; the loss on every assistant turn; ChatGLM2/ChatGLM3 models)")
    flag("--source_field", "--prompt_column", default="source",
         help="the source field of the plain layout (THUDM ptuning's --prompt_column)")
    flag("--target_field", "--response_column", default="target",
         help="the target field of the plain layout (THUDM ptuning's --response_column)")
    flag("--history_column", default=None,
         help="THUDM ChatGLM2 ptuning's history: the field holding a list of [query, response] pairs before "
         "each sample, put in the prompt as chat builds it ([Round i] for ChatGLM2; the loss on the last response); "
         "ChatGLM2/ChatGLM3 models; default: none, one turn")
    flag("--src_length", type=int, default=608, help="tokens of the source, [CLS]/[gMASK]/[eos] included (cut "
         "beyond; lowered to fit the model's positions)")
    flag("--tgt_length", type=int, default=160, help="tokens of the target, sop/eop included (cut beyond, counted; lowered to "
         "fit the model's positions)")
    flag("--output_dir", default="./glm-finetune-out", help="checkpoints, adapters, predictions and metrics")

    groups.append(parser.add_argument_group("training"))
    switch("--do_train", "train on --train_file")
    switch("--do_eval", "generate for --eval_file and score ROUGE-1/2/L and BLEU-4")
    switch("--do_predict", "write predictions for --test_file")
    flag("--num_train_epochs", type=float, default=3.0, help="epochs over the training data (unless --max_steps)")
    flag("--max_steps", type=int, default=-1, help="optimizer steps in all; overrides --num_train_epochs when > 0")
    flag("--per_device_train_batch_size", type=int, default=8, help="samples per process per micro-batch")
    flag("--per_device_eval_batch_size", type=int, default=8, help="prompts generated together in evaluation")
    flag("--gradient_accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
    flag("--learning_rate", type=float, default=5e-5, help="peak AdamW learning rate (the embedded run: 2e-3)")
    flag("--warmup_ratio", type=float, default=0.0, help="share of the steps with a linear warmup")
    flag("--weight_decay", type=float, default=0.0, help="AdamW weight decay (none on biases and norms)")
    flag("--lr_scheduler_type", default="linear", choices=("linear", "cosine", "constant"),
         help="learning rate decay after the warmup")
    flag("--max_grad_norm", type=float, default=1.0, help="clip gradients to this global norm (0: off)")
    flag("--label_smoothing", type=float, default=0.0, help="label smoothing of the target-token cross entropy")
    flag("--logging_steps", type=int, default=10, help="steps per log line (upstream GLM's line)")
    flag("--save_steps", type=int, default=0, help="save a checkpoint every N steps (0: at the end only)")
    flag("--eval_steps", type=int, default=0, help="evaluate every N steps (with --do_eval), keeping the best")
    flag("--seed", type=int, default=42, help="seed of the model's initialisation, dropout and data order")
    switch("--fp16", "fp16 autocast with dynamic loss scaling (CUDA)")
    switch("--bf16", "bf16 autocast")
    flag("--fp16_opt_level", default="O1", choices=("O1", "O2"),
         help="accepted: autocast is O1; O2 (half master weights) is not used, weights stay fp32")
    switch("--recompute", "activation checkpointing of every layer (less memory, more time)")
    flag("--tensor_parallel_degree", type=int, default=1, help="split the model over this many processes (torchrun)")
    flag("--sharding", default="", metavar="STAGE",
         help="shard parameters, gradients and optimizer state over the data-parallel ranks with torch's FSDP2: "
         "stage1, stage2 (layers' parameters kept gathered from forward to backward) or stage3 (gathered again "
         "for the backward); full finetunes, tensor parallel 1; default: off (plain data parallel)")
    flag("--sharding_degree", "--sharding_parallel_degree", type=int, default=-1,
         help="ranks each parameter is split over (-1: every data-parallel rank); fewer: hybrid sharding, "
         "replicas of that many shards")
    flag("--merge_tensor_parallel_path", default=None,
         help="after training at --tensor_parallel_degree > 1, merge the saved shards into one directory "
         "there (as glm-merge does: GLM's layout, or THUDM's for ChatGLM2); full finetunes only (a LoRA adapter "
         "is saved whole)")
    flag("--device", default=None, help="cpu, cuda, cuda:1... (default: the GPU if there is one)")

    groups.append(parser.add_argument_group("LoRA (PEFT)"))
    switch("--lora", "train LoRA adapters only (PEFT), the base weights frozen")
    flag("--r", type=int, default=8, help="LoRA rank")
    flag("--lora_alpha", type=int, default=16, help="LoRA scaling numerator (the update is scaled by alpha / r)")
    flag("--lora_dropout", type=float, default=0.05, help="dropout on the adapters' input")
    flag("--lora_target_modules", default="query_key_value", help="comma-separated module names to adapt")
    flag("--lora_modules_to_save", default="",
         help="comma-separated modules trained whole beside the adapters (PEFT's modules_to_save), "
         "e.g. final_layernorm")
    switch("--merge_lora", "fold the adapters into the weights when saving the final model")

    groups.append(parser.add_argument_group("P-Tuning v2 (THUDM ChatGLM2 ptuning/; ChatGLM2 family)"))
    flag("--pre_seq_len", type=int, default=None,
         help="train a prefix of this many learned key/value positions before every layer's keys, the model frozen; "
         "saved as THUDM does (pytorch_model.bin of transformer.prefix_encoder.* and config.json)")
    switch("--prefix_projection", "the prefix through THUDM's Linear-Tanh-Linear projection (P-Tuning v2 with "
           "reparameterization)")
    flag("--ptuning_checkpoint", default=None,
         help="a P-Tuning checkpoint (THUDM's or this command's output) to evaluate, predict with or train on "
         "further, its base --model_name_or_path")

    groups.append(parser.add_argument_group("generation (evaluation, prediction)"))
    flag("--num_beams", type=int, default=1, help="beam search width (1: greedy; the embedded run: 3)")
    flag("--min_tgt_length", type=int, default=0, help="generate at least this many tokens")
    flag("--length_penalty", type=float, default=1.0, help="beam scores divided by length ** this")
    flag("--no_repeat_ngram_size", type=int, default=0, help="never repeat an n-gram of this size (0: off)")
    switch("--select_topk", "sample from the top-k (k = --top_k) instead of searching")
    flag("--top_k", type=int, default=1, help="with --select_topk: sample among the k likeliest tokens")
    flag("--top_p", type=float, default=1.0, help="with --select_topk: nucleus sampling mass")
    flag("--temperature", type=float, default=1.0, help="with --select_topk: softmax temperature")
    flag("--metric_lang", default="auto", choices=("auto", "zh", "en"),
         help="zh: jieba + rouge_chinese and nltk BLEU-4 on characters (THUDM / MindFormers); en: rouge-score "
         "and sacrebleu; auto: zh when the references hold CJK characters")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        name = unknown[0].split("=")[0]
        reason = REFUSED.get(name)
        parser.error(f"{name} is not supported: {reason}" if reason else f"unrecognized argument {name}")
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16 exclude each other")
    for name in ("src_length", "tgt_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                 "gradient_accumulation_steps", "tensor_parallel_degree", "num_beams"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.pre_seq_len is not None and args.pre_seq_len < 1:
        parser.error(f"--pre_seq_len must be at least 1, got {args.pre_seq_len}")
    from glm_port.sharding import parse_stage

    try:
        args.sharding_stage = parse_stage(args.sharding)
    except ValueError as error:
        parser.error(str(error))
    if args.sharding_degree == 0 or args.sharding_degree < -1:
        parser.error(f"--sharding_degree must be -1 or at least 1, got {args.sharding_degree}")
    if not 0.0 <= args.label_smoothing < 1.0:
        parser.error(f"--label_smoothing must be in [0, 1), got {args.label_smoothing}")
    args.lora_target_modules = [m.strip() for m in args.lora_target_modules.split(",") if m.strip()]
    args.lora_modules_to_save = [m.strip() for m in args.lora_modules_to_save.split(",") if m.strip()]
    return args
