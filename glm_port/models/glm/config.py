"""GLM architecture as data: one dataclass, the same numbers upstream's GLMModel takes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class GLMConfig:
    """Shape and regularisation of a GLM; upstream's flag in brackets.

    The defaults are the tiny model of the no-argument ``glm-pretrain`` run, not GLM-Large.
    """

    vocab_size: int = 30592  # padded vocabulary (upstream pads to a multiple of 128)
    num_layers: int = 2  # --num-layers
    hidden_size: int = 128  # --hidden-size
    num_attention_heads: int = 4  # --num-attention-heads
    max_sequence_length: int = 128  # --max-position-embeddings
    embedding_dropout_prob: float = 0.1  # --hidden-dropout
    attention_dropout_prob: float = 0.1  # --attention-dropout
    output_dropout_prob: float = 0.1  # --hidden-dropout
    layernorm_epsilon: float = 1e-5  # --layernorm-epsilon
    init_method_std: float = 0.02
    intermediate_size: int | None = None  # --intermediate-size: the MLP's inner width; None = 4 * hidden_size
    max_memory_length: int = 0  # --mem-length (Transformer-XL style memory; 0 = off)
    block_position_encoding: bool = True  # 2D positions (--block-lm)
    checkpoint_activations: bool = False  # --checkpoint-activations
    checkpoint_num_layers: int = 1  # --checkpoint-num-layers
    # What checkpointing keeps of a chunk (--checkpoint-policy): "full" only its input, "selective" also
    # the outputs of its matmuls, recomputing the elementwise ops and attention in backward.
    checkpoint_policy: str = "full"
    # "fused": shim's fused_masked_attention (torch's SDPA on CUDA, a blocked kernel with dropout on CPU);
    # "sdpa": torch's scaled_dot_product_attention with a boolean mask, as it is;
    # "explicit": upstream's formula scores*mask - 65504*(1-mask), kept as the reference.
    attention_impl: str = "fused"

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden size {self.hidden_size} is not divisible by "
                f"{self.num_attention_heads} attention heads"
            )
        if self.attention_impl not in ("fused", "sdpa", "explicit"):
            raise ValueError(
                f"attention_impl must be 'fused', 'sdpa' or 'explicit', not {self.attention_impl!r}"
            )
        if self.checkpoint_policy not in ("full", "selective"):
            raise ValueError(f"checkpoint_policy must be 'full' or 'selective', not {self.checkpoint_policy!r}")
        if self.intermediate_size is not None and self.intermediate_size <= 0:
            raise ValueError(f"intermediate_size must be positive, got {self.intermediate_size}")
        for name in ("vocab_size", "num_layers", "hidden_size", "num_attention_heads", "max_sequence_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def ffn_hidden_size(self) -> int:
        """The MLP's inner width: ``intermediate_size``, else upstream's 4 * hidden_size."""
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes) -> "GLMConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
