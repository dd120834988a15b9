"""GLM's data pipeline: tokenizers with GLM's command tokens, blank infilling, corpora and training batches.

    tok = get_tokenizer()                      # built-in default; or ("BertWordPieceTokenizer", vocab_dir)
    batches = build_train_batches(None, tok, seq_length=128, batch_size=8, seed=1)   # embedded corpus
    batch = next(batches)                      # text, target, loss_mask, attention_mask (sep), position_id
"""

from glm_port.data.batches import build_train_batches, collate
from glm_port.data.blocklm import BlockMasker
from glm_port.data.corpus import TokenizedCorpus, load_corpus, read_documents, tokenize_file
from glm_port.data.tokenization import DEFAULT_TOKENIZER, GLMTokenizer, get_tokenizer

__all__ = [
    "DEFAULT_TOKENIZER", "BlockMasker", "GLMTokenizer", "TokenizedCorpus", "build_train_batches", "collate",
    "get_tokenizer", "load_corpus", "read_documents", "tokenize_file",
]
