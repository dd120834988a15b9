"""GLM's data pipeline: tokenizers with GLM's command tokens, blank infilling, corpora and training batches.

    tok = get_tokenizer()                      # built-in default; or ("BertWordPieceTokenizer", vocab_dir)
    batches = build_train_batches(None, tok, seq_length=128, batch_size=8, seed=1)   # embedded corpus
    batch = next(batches)                      # text, target, loss_mask, attention_mask (sep), position_id
"""

from glm_port.data.batches import DataOptions, build_batches, build_train_batches, collate, corpus_splits
from glm_port.data.blocklm import BlockMasker
from glm_port.data.corpora import resolve_corpora
from glm_port.data.corpus import TokenizedCorpus, load_corpus, read_documents, tokenize_file
from glm_port.data.tokenization import DEFAULT_TOKENIZER, GLMTokenizer, get_tokenizer

__all__ = [
    "DEFAULT_TOKENIZER", "BlockMasker", "DataOptions", "GLMTokenizer", "TokenizedCorpus", "build_batches",
    "build_train_batches", "collate", "corpus_splits", "get_tokenizer", "load_corpus", "read_documents",
    "resolve_corpora", "tokenize_file",
]
