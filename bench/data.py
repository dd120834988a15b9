"""Throughput of glm_port's data pipeline: blank infilling (samples/s), whole batches, and tokenization.

    python bench/data.py                                  # embedded corpus, default tokenizer
    python bench/data.py --seq-length 512 --tokenizer-type GPT2BPETokenizer --tokenizer-path ../shared/vocab
"""

from __future__ import annotations

import argparse
import itertools
import time

from glm_port.data import BlockMasker, build_train_batches, get_tokenizer, load_corpus, read_documents
from glm_port.data.batches import Windows
from glm_port.data.corpus import DEFAULT_CORPUS

MIXES = {
    "token spans (GLM-Large)": dict(bert_prob=1.0),
    "mixed 0.5/0.3/0.2 (GLM-10B)": dict(bert_prob=0.5, gap_sentence_prob=0.3, gpt_min_ratio=0.25, task_mask=True),
}


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:9.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="samples to mask per measurement")
    parser.add_argument("--tokenizer-type", default=None)
    parser.add_argument("--tokenizer-path", default=None)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers for the batch measurement")
    args = parser.parse_args()

    tokenizer = get_tokenizer(args.tokenizer_type, args.tokenizer_path)
    documents = list(read_documents(DEFAULT_CORPUS))
    start = time.perf_counter()
    tokenizer.encode_batch(documents)
    elapsed = time.perf_counter() - start
    size = DEFAULT_CORPUS.stat().st_size
    print(f"tokenize ({tokenizer.name}): {rate(len(documents), elapsed)} documents, {size / elapsed / 1e6:.1f} MB/s")

    corpus = load_corpus(None, tokenizer, progress=False)
    windows = Windows(corpus, args.seq_length, seed=0, cls_id=tokenizer.cls_id, eos_id=tokenizer.eos_id)
    inputs = [windows[i] for i in range(args.samples)]
    for name, knobs in MIXES.items():
        masker = BlockMasker(tokenizer, seed=0, seq_length=args.seq_length, **knobs)
        start = time.perf_counter()
        for i, window in enumerate(inputs):
            masker(window, index=i)
        elapsed = time.perf_counter() - start
        print(f"mask {name:28s} seq {args.seq_length}: {rate(args.samples, elapsed)} samples "
              f"({1e6 * elapsed / args.samples:.0f} us each)")

    batches = build_train_batches(None, tokenizer, seq_length=args.seq_length, batch_size=args.batch_size, seed=0,
                                  masker_kwargs=MIXES["mixed 0.5/0.3/0.2 (GLM-10B)"], num_workers=args.workers)
    next(batches)  # start-up (workers, first epoch) is not throughput
    count = max(1, args.samples // args.batch_size)
    start = time.perf_counter()
    for _ in itertools.islice(batches, count):
        pass
    elapsed = time.perf_counter() - start
    print(f"batches of {args.batch_size} x {args.seq_length}, {args.workers} workers: {rate(count, elapsed)} batches, "
          f"{rate(count * args.batch_size, elapsed)} samples")


if __name__ == "__main__":
    main()
