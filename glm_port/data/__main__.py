"""``python -m glm_port.data``: tokenize corpora into their caches and show what training will see."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from glm_port.data import BlockMasker, get_tokenizer, load_corpus
from glm_port.data.batches import Windows
from glm_port.data.tokenization import DEFAULT_TOKENIZER


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m glm_port.data",
        description="Tokenize corpora into their caches and show decoded blank-infilling samples. Run it once "
                    "before a multi-process launch so that the ranks find the cache instead of all tokenizing, "
                    "or to check a corpus and the masker's knobs by eye.")
    parser.add_argument("--train-data", nargs="+", default=None, metavar="PATH",
                        help="JSON lines (.json/.jsonl) or text files; default: the embedded tiny corpus")
    parser.add_argument("--text-key", default="text", help="JSON field holding a document (default: text)")
    parser.add_argument("--tokenizer-type", default=None, help=f"upstream's name; default: {DEFAULT_TOKENIZER}")
    parser.add_argument("--tokenizer-path", default=None, help="vocabulary file or a directory holding it")
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per sample (default 128)")
    parser.add_argument("--show", type=int, default=2, metavar="N", help="decode N masked samples (default 2)")
    parser.add_argument("--seed", type=int, default=1234, help="data seed, as glm-pretrain's --seed")
    parser.add_argument("--bert-prob", type=float, default=0.5, help="share of samples with token spans")
    parser.add_argument("--gap-sentence-prob", type=float, default=0.0, help="share with sentence spans")
    parser.add_argument("--gpt-min-ratio", type=float, default=0.5, help="shortest generation span, of the text")
    parser.add_argument("--avg-block-length", type=float, default=3, help="Poisson mean of token-span lengths")
    parser.add_argument("--task-mask", action="store_true", help="[gMASK]/[sMASK] instead of [MASK]")
    return parser.parse_args(argv)


def describe(sample: dict[str, np.ndarray], tokenizer) -> str:
    """Part A, then each Part B block with what it predicts."""
    sep = int(sample["attention_mask"])
    text, target, block = sample["text"], sample["target"], sample["position_id"][1]
    lines = [f"  Part A ({sep} tokens): {tokenizer.decode(text[:sep])}"]
    starts = [i for i in range(sep, len(text)) if block[i] == 1] + [sep + int((block[sep:] > 0).sum())]
    for start, end in zip(starts, starts[1:]):
        lines.append(f"  Part B at position {sample['position_id'][0, start]}: {tokenizer.decode(target[start:end])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        tokenizer = get_tokenizer(args.tokenizer_type, args.tokenizer_path)
        corpus = load_corpus(args.train_data, tokenizer, text_key=args.text_key)
        masker = BlockMasker(tokenizer, seed=args.seed, seq_length=args.seq_length, bert_prob=args.bert_prob,
                             gap_sentence_prob=args.gap_sentence_prob, gpt_min_ratio=args.gpt_min_ratio,
                             avg_block_length=args.avg_block_length, task_mask=args.task_mask)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    windows = Windows(corpus, args.seq_length, args.seed, tokenizer.cls_id, tokenizer.eos_id)
    lengths = np.diff(corpus.offsets)
    print(f"{tokenizer!r}")
    print(f"{len(corpus)} documents, {corpus.num_tokens} tokens (median {int(np.median(lengths))} per document), "
          f"{windows.per_epoch} samples of {args.seq_length} per epoch")
    for i in range(args.show):
        print(f"sample {i}:\n{describe(masker(windows[i], index=i), tokenizer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
