"""GLM architecture as data: one dataclass, the same numbers upstream's GLMModel takes."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

from transformers import PretrainedConfig


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


class GLMPretrainedConfig(PretrainedConfig):
    """GLM's ``config.json`` (THUDM's field names), as transformers configs go.

    ``to_glm_config()`` gives glm_port's ``GLMConfig``. Fields THUDM's config carries for other
    variants (``relative_encoding``, ``attention_scale`` other than 1, ``spell_length``) are refused
    by ``to_glm_config`` rather than ignored.
    """

    model_type = "glm"
    attribute_map = {"num_hidden_layers": "num_layers", "max_position_embeddings": "max_sequence_length"}

    def __init__(self, num_layers=24, vocab_size=30592, hidden_size=1024, num_attention_heads=16,
                 embedding_dropout_prob=0.1, attention_dropout_prob=0.1, output_dropout_prob=0.1,
                 max_sequence_length=512, block_position_encoding=True, relative_encoding=False,
                 attention_scale=1.0, layernorm_epsilon=1e-5, initializer_range=0.02, attention_impl="fused",
                 spell_length=None, intermediate_size=None, **kwargs):
        self.num_layers = num_layers
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.embedding_dropout_prob = embedding_dropout_prob
        self.attention_dropout_prob = attention_dropout_prob
        self.output_dropout_prob = output_dropout_prob
        self.max_sequence_length = max_sequence_length
        self.block_position_encoding = block_position_encoding
        self.relative_encoding = relative_encoding
        self.attention_scale = attention_scale
        self.layernorm_epsilon = layernorm_epsilon
        self.initializer_range = initializer_range
        self.attention_impl = attention_impl
        self.spell_length = spell_length
        self.intermediate_size = intermediate_size  # None: 4 * hidden_size (upstream's --intermediate-size)
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)

    def to_glm_config(self) -> GLMConfig:
        if self.relative_encoding:
            raise ValueError("config.json: relative_encoding (Transformer-XL positions) is not supported")
        if self.attention_scale not in (None, 1, 1.0):
            raise ValueError(f"config.json: attention_scale {self.attention_scale} is not supported (only 1.0)")
        if self.spell_length:
            raise ValueError("config.json: spell_length (P-tuning prompts) is not supported")
        return GLMConfig(**{field: getattr(self, name) for field, name in config_json_fields().items()})

    @classmethod
    def from_glm_config(cls, config: GLMConfig, **kwargs) -> "GLMPretrainedConfig":
        fields = config.to_dict()
        return cls(**{name: fields[field] for field, name in config_json_fields().items()}, **kwargs)


# GLMConfig's fields config.json spells otherwise; every other field of both is spelled alike.
JSON_NAMES = {"init_method_std": "initializer_range"}
# GLMConfig's fields that are how a model is run (trained), not what it is: never in config.json.
RUN_ONLY_FIELDS = ("max_memory_length", "checkpoint_activations", "checkpoint_num_layers", "checkpoint_policy")


def config_json_fields() -> dict[str, str]:
    """GLMConfig field -> its config.json name (``GLMPretrainedConfig``'s argument), for every field but the
    run-only ones: the one mapping both conversions use, so a field added to one config and not the other
    is an error here (``test_one_forward``) rather than a silently dropped value."""
    arguments = inspect.signature(GLMPretrainedConfig.__init__).parameters
    mapping = {}
    for field in dataclasses.fields(GLMConfig):
        if field.name in RUN_ONLY_FIELDS:
            continue
        name = JSON_NAMES.get(field.name, field.name)
        if name not in arguments:
            raise TypeError(f"GLMConfig.{field.name} has no config.json field ({name}): add it to "
                            f"GLMPretrainedConfig or to RUN_ONLY_FIELDS")
        mapping[field.name] = name
    return mapping
