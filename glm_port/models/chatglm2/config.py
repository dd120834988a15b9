"""ChatGLM2/ChatGLM3 architecture as data: THUDM's ``config.json`` field names, read as they are.

``ChatGLM2Config.from_pretrained(DIR)`` reads a THUDM ``chatglm2-6b`` / ``chatglm3-6b`` directory's
``config.json`` unchanged (``model_type`` "chatglm"); the defaults are ChatGLM2-6B's. The standard
transformers names (``num_hidden_layers``, ``vocab_size``, ``num_key_value_heads``, ...) are aliases
of THUDM's, so transformers' generation utilities and caches find what they look for.
"""

from __future__ import annotations

from transformers import PretrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

# P-Tuning v2 (THUDM's ptuning/): what a command that does not run a prefix (glm-convert, glm-merge, glm-export,
# glm-serve...) says when a config sets pre_seq_len.
_PREFIX_REFUSED = ("not supported here (a P-Tuning v2 prefix: glm-chat and glm-generate run one with "
                   "--ptuning_checkpoint, glm-finetune trains one with --pre_seq_len)")


# The keyword transformers names the key/value cache by, in model outputs and generate's model kwargs
# ("cache" since transformers 5 renamed it, "past_key_values" before): model.py and chat.py both use it.
CACHE_KWARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class ChatGLM2Config(PretrainedConfig):
    """Shape of a ChatGLM2-family model (THUDM's ``ChatGLMConfig`` fields; defaults = ChatGLM2-6B)."""

    model_type = "chatglm"
    attribute_map = {
        "num_hidden_layers": "num_layers",
        "vocab_size": "padded_vocab_size",
        "max_position_embeddings": "seq_length",
        "intermediate_size": "ffn_hidden_size",
        "head_dim": "kv_channels",
        "rms_norm_eps": "layernorm_epsilon",
    }

    def __init__(
        self,
        num_layers: int = 28,
        padded_vocab_size: int = 65024,
        hidden_size: int = 4096,
        ffn_hidden_size: int = 13696,
        kv_channels: int = 128,
        num_attention_heads: int = 32,
        seq_length: int = 32768,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        layernorm_epsilon: float = 1e-5,
        rmsnorm: bool = True,
        apply_residual_connection_post_layernorm: bool = False,
        post_layer_norm: bool = True,
        add_bias_linear: bool = False,
        add_qkv_bias: bool = True,
        multi_query_attention: bool = True,
        multi_query_group_num: int = 2,
        apply_query_key_layer_scaling: bool = True,
        attention_softmax_in_fp32: bool = True,
        fp32_residual_connection: bool = False,
        rope_ratio: float = 1.0,
        rope_ratio_scales: str = "base",
        initializer_range: float = 0.02,
        pre_seq_len=None,
        prefix_projection: bool = False,
        prefix_hidden_size=None,
        quantization_bit: int = 0,
        use_cache: bool = True,
        **kwargs,
    ):
        self.use_cache = use_cache
        self.num_layers = num_layers
        self.padded_vocab_size = padded_vocab_size
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.kv_channels = kv_channels
        self.num_attention_heads = num_attention_heads
        self.seq_length = seq_length
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.layernorm_epsilon = layernorm_epsilon
        self.rmsnorm = rmsnorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.post_layer_norm = post_layer_norm
        self.add_bias_linear = add_bias_linear
        self.add_qkv_bias = add_qkv_bias
        self.multi_query_attention = multi_query_attention
        self.multi_query_group_num = multi_query_group_num
        # Kept for round trips: with SDPA (THUDM's own torch >= 2 path) layer scaling cancels out, and the
        # softmax is computed in fp32 whatever the flag says.
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        self.attention_softmax_in_fp32 = attention_softmax_in_fp32
        self.fp32_residual_connection = fp32_residual_connection
        # ChatGLM3 (and GLM-4) scale the rotary base by rope_ratio; chatglm2-6b-32k divided the positions
        # by it instead (linear interpolation): set rope_ratio_scales="positions" for that checkpoint.
        self.rope_ratio = rope_ratio
        if rope_ratio_scales not in ("base", "positions"):
            raise ValueError(f"rope_ratio_scales={rope_ratio_scales!r}: expected 'base' or 'positions'")
        self.rope_ratio_scales = rope_ratio_scales
        self.initializer_range = initializer_range
        # P-Tuning v2 (THUDM's ptuning/): pre_seq_len learned key/value positions before every layer's keys, from
        # an embedding (with prefix_projection, through a Linear-Tanh-Linear whose middle width is
        # prefix_hidden_size, THUDM's hidden_size when None). None: no prefix.
        self.pre_seq_len = pre_seq_len
        self.prefix_projection = prefix_projection
        self.prefix_hidden_size = prefix_hidden_size
        self.quantization_bit = quantization_bit
        kwargs.setdefault("eos_token_id", 2)
        kwargs.setdefault("pad_token_id", 0)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def num_key_value_heads(self) -> int:
        """Key/value heads: the multi-query groups, or one per query head without multi-query attention."""
        return self.multi_query_group_num if self.multi_query_attention else self.num_attention_heads

    def check_supported(self, quantized: bool = False, prefix: bool = False) -> None:
        """A one-line error for values out of range and for THUDM options the caller does not run: a P-Tuning
        prefix (``pre_seq_len``) unless ``prefix``, ``quantization_bit`` unless ``quantized``."""
        if self.pre_seq_len not in (None, 0):
            if not prefix:
                raise ValueError(f"ChatGLM2 config sets pre_seq_len={self.pre_seq_len!r}: {_PREFIX_REFUSED}")
            if not isinstance(self.pre_seq_len, int) or isinstance(self.pre_seq_len, bool) or self.pre_seq_len < 0:
                raise ValueError(f"ChatGLM2 config sets pre_seq_len={self.pre_seq_len!r}: expected a number of "
                                 f"prefix tokens >= 1 (or null for none)")
        if self.prefix_hidden_size is not None and (not isinstance(self.prefix_hidden_size, int)
                                                    or self.prefix_hidden_size < 1):
            raise ValueError(f"ChatGLM2 config sets prefix_hidden_size={self.prefix_hidden_size!r}: expected a "
                             f"width >= 1 (or null: hidden_size)")
        if self.quantization_bit and not quantized:  # glm-convert, glm-merge, glm-export, glm-finetune...
            raise ValueError(f"ChatGLM2 config sets quantization_bit={self.quantization_bit!r}: a quantized checkpoint "
                             f"is read by glm-chat, glm-generate and load_pretrained only, not here")
        if self.quantization_bit not in (0, None, 4, 8):
            raise ValueError(f"ChatGLM2 config sets quantization_bit={self.quantization_bit!r}: expected 4 or 8 "
                             f"(THUDM's int4/int8), or 0 for none")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ChatGLM2 config: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"multi_query_group_num ({self.num_key_value_heads})"
            )


# The shape of the embedded default model (glm-chat with no --model): ChatGLM2-6B's layout at a width
# a laptop runs instantly. The vocabulary is sized by the tokenizer built with it.
TINY = dict(
    num_layers=2, hidden_size=64, ffn_hidden_size=160, kv_channels=16, num_attention_heads=4,
    multi_query_group_num=2, seq_length=512,
)
