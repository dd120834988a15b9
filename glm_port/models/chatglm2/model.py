"""ChatGLM2 / ChatGLM3: the model of THUDM's ``modeling_chatglm.py``, written to be read as the math.

Parameter names are THUDM's, so a ``chatglm2-6b`` directory's weights load as they are::

    transformer.embedding.word_embeddings.weight                          [vocab, h]
    transformer.encoder.layers.{i}.input_layernorm.weight                 RMSNorm
    transformer.encoder.layers.{i}.self_attention.query_key_value.{weight,bias}
                                                                          [(H + 2G) * d, h]: Q | K | V
    transformer.encoder.layers.{i}.self_attention.dense.weight            [h, H * d]
    transformer.encoder.layers.{i}.post_attention_layernorm.weight        RMSNorm
    transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight               [2 * ffn, h]: gate | up
    transformer.encoder.layers.{i}.mlp.dense_4h_to_h.weight               [h, ffn]
    transformer.encoder.final_layernorm.weight
    transformer.output_layer.weight                                       [vocab, h], not tied

(``transformer.rotary_pos_emb.inv_freq`` in THUDM's files is a buffer of constants: ignored on load.)

P-Tuning v2 (THUDM's ``ptuning/``; config ``pre_seq_len`` P set): the model also holds

    transformer.prefix_encoder.embedding.weight                           [P, L * 2 * G * d]
    transformer.prefix_encoder.trans.{0,2}.{weight,bias}                  with prefix_projection: Linear-Tanh-Linear

and every layer's attention sees P learned keys and values before the sequence's own (``get_prompt``:
row ``p`` of the encoder's output, read as ``[L, 2 (key | value), G, d]``, gives layer ``l`` its key and
value at prefix position ``p``; no rotary on them; dropout 0.1 in training). The tokens' positions do not
count the prefix (position 0 is the first token), the attention mask gets P ones in front, and the rest
of the model is frozen (``requires_grad`` off), as THUDM's ``ChatGLMModel`` does. With a key/value cache
the prefix is written into the empty cache first (so a cache's length counts it); without one (training)
each layer gets its prefix directly, which activation checkpointing can recompute.

One layer, pre-norm: ``x += dense(attn(rope(q), rope(k), v))`` on ``rmsnorm(x)``, then
``x += dense_4h_to_h(silu(gate) * up)`` on ``rmsnorm(x)``. Attention is causal, multi-query: H query
heads share G key/value groups (ChatGLM2-6B: 32 heads of 128, 2 groups), and SDPA reads the G groups
directly (``enable_gqa``), so the cache and the attention never hold H copies. Rotary embedding turns
the first half of each head in interleaved pairs ``(x0, x1), (x2, x3), ...`` with base
``10000 * rope_ratio``. Tensors are ``[batch, seq, hidden]`` (THUDM's are ``[seq, batch, hidden]``;
the numbers are the same). The key/value cache is a transformers ``Cache`` (``DynamicCache``).

Tensor parallel (T ranks, ``shim.nn.Linear1D``): each rank holds H/T query heads and, when T divides G,
G/T key/value groups; when T is a multiple of G, the one group its heads belong to (rank r: group
``r // (T/G)``), replicated on T/G neighbouring ranks (``Linear1D(section_replicas=)``), so the cache holds
one group per rank. Other degrees are a one-line ``ValueError`` (docs/chatglm2.md, "Tensor parallel").
"""

from __future__ import annotations

import shim as torch
import shim.nn as nn
import shim.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from glm_port.models.chatglm2.config import CACHE_KWARG as _CACHE, ChatGLM2Config
from glm_port.models.chatglm2.splits import layer_split

logger = logging.get_logger(__name__)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, the statistics in fp32 (THUDM's order of casts)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (self.weight * (x * torch.rsqrt(variance + self.eps))).to(x.dtype)


def _norm(config: ChatGLM2Config):
    if config.rmsnorm:
        return RMSNorm(config.hidden_size, eps=config.layernorm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)


def rotary_cos_sin(config: ChatGLM2Config, position_ids, dtype):
    """cos and sin of ``position * theta_i`` for the rotated half of a head: ``[batch, 1, seq, d/4]`` each.

    ``theta_i = base^(-2i / (d/2))`` over the ``d/2`` rotated dims, ``base = 10000 * rope_ratio``
    (or, for chatglm2-6b-32k, positions divided by ``rope_ratio``). Computed in fp32, then cast to the
    activations' dtype as THUDM does.
    """
    rotary_dim = config.kv_channels // 2
    base, positions = 10000.0, position_ids.float()
    if config.rope_ratio_scales == "base":
        base *= config.rope_ratio
    else:
        positions = positions / config.rope_ratio
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=positions.device) / rotary_dim))
    angles = positions[:, None, :, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x, cos, sin):
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of the first ``2 * cos.shape[-1]`` dims of each head."""
    rotary_dim = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x0, x1 = x_rot.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, x_pass), dim=-1)


def attention_mask_4d(attention_mask, query_len: int, past_len: int):
    """Which keys each query sees, ``[batch, 1, query, past + query]`` (True = attend), or None.

    None means "no padding": the caller then lets SDPA apply causality itself. Causal, minus the
    padded keys of ``attention_mask`` (``[batch, past + query]``, 1 = token, left padding); a row with
    no key left (a padding query) sees every key, as THUDM's ``get_masks`` does, so it stays finite.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    key_len = past_len + query_len
    device = attention_mask.device
    causal = torch.arange(key_len, device=device)[None, :] <= (past_len + torch.arange(query_len, device=device))[:, None]
    mask = causal[None] & attention_mask[:, None, -key_len:].bool()
    mask = mask | ~mask.any(-1, keepdim=True)
    return mask[:, None]


def static_attention_mask(attention_mask, cache_position, key_len: int):
    """``attention_mask_4d`` for a preallocated cache (transformers' ``StaticCache``): ``[batch or 1, 1,
    query, key_len]`` over the whole buffer, with no host synchronisation (a compiled step replays it).

    Query ``i`` (at ``cache_position[i]``) sees the keys at positions ``<= cache_position[i]`` that
    ``attention_mask`` keeps: ``[batch, <= key_len]`` (1 = token; columns past its end are not written
    yet), or the 4-D mask ``generate`` builds for such a cache (boolean, True = attend; or additive, 0 =
    attend), taken as it is. A row with no key left sees every key, as ``attention_mask_4d``'s do: a
    padding query then stays finite instead of turning into NaN, which would reach real queries through
    the values it writes to the cache.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        mask = mask[..., :key_len]
    else:
        keys = torch.arange(key_len, device=cache_position.device)
        mask = (keys[None, :] <= cache_position[:, None])[None]
        if attention_mask is not None:
            kept = attention_mask[:, :key_len].bool()
            kept = F.pad(kept, (0, key_len - kept.shape[-1]), value=False)
            mask = mask & kept[:, None, :]
        mask = mask[:, None]
    return mask | ~mask.any(-1, keepdim=True)


class SelfAttention(nn.Module):
    def __init__(self, config: ChatGLM2Config, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        # This rank's query heads and key/value groups (all of them in one process).
        heads, groups = config.num_attention_heads, config.num_key_value_heads
        self.num_heads = nn.heads_per_rank(heads)
        ranks = heads // self.num_heads
        # More ranks than groups: each group is held by ranks / groups neighbouring ranks, whose query heads
        # are that group's (rank r: heads [r H/T, (r+1) H/T), group r // (T/G)), as vLLM replicates them.
        self.group_replicas = 1
        if config.multi_query_attention and ranks > groups:
            if ranks % groups:
                raise ValueError(f"ChatGLM2: {groups} key/value groups do not replicate evenly over {ranks} "
                                 f"tensor-parallel ranks (the size must divide {groups} or be a multiple of it)")
            self.group_replicas, self.num_groups = ranks // groups, 1
        else:
            self.num_groups = groups * self.num_heads // heads
            if self.num_groups * heads != groups * self.num_heads:
                raise ValueError(f"ChatGLM2: {groups} key/value groups do not split over {ranks} tensor-parallel ranks")
        self.head_dim = config.kv_channels
        qkv_size = (heads + 2 * groups) * self.head_dim
        # Split as ChatGLM2's split plan says (splits.py: the table tensor_parallel_slice cuts THUDM's rows by):
        # column-split, rank r holds [Q_r; K_r; V_r]; multi-query: Q | K | V blocks, each split (a random init in
        # rank order too), key/value groups replicated over T / G ranks when T > G.
        self.query_key_value = nn.Linear1D(
            config.hidden_size, qkv_size, bias=config.add_qkv_bias or config.add_bias_linear,
            **layer_split(config, ranks, layer_idx, "self_attention.query_key_value"),
        )
        self.dense = nn.Linear1D(config.num_attention_heads * self.head_dim, config.hidden_size,
                                 bias=config.add_bias_linear,
                                 **layer_split(config, ranks, layer_idx, "self_attention.dense"))

    def split_qkv(self, qkv):
        """``[b, s, (H + 2G) d]`` -> q ``[b, H, s, d]``, k and v ``[b, G, s, d]``.

        Multi-query weights are ``Q | K | V`` blocks; without multi-query attention THUDM's fused weight
        is per head ``[q_h; k_h; v_h]``.
        """
        b, s, _ = qkv.shape
        d = self.head_dim
        if self.config.multi_query_attention:
            q, k, v = qkv.split([self.num_heads * d, self.num_groups * d, self.num_groups * d], dim=-1)
            q, k, v = (t.view(b, s, -1, d) for t in (q, k, v))
        else:
            q, k, v = qkv.view(b, s, self.num_heads, 3 * d).split(d, dim=-1)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, cos, sin, mask, cache: Cache | None, prompt=None):
        q, k, v = self.split_qkv(self.query_key_value(x))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if prompt is not None:  # a P-Tuning prefix's keys and values, before the sequence's own
            prefix_k, prefix_v = prompt[0].to(k.dtype), prompt[1].to(v.dtype)
            if cache is not None:  # an empty cache: the prefix goes in first
                cache.update(prefix_k, prefix_v, self.layer_idx)
            else:
                k, v = torch.cat([prefix_k, k], dim=2), torch.cat([prefix_v, v], dim=2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        dropout = self.config.attention_dropout if self.training else 0.0
        is_causal = mask is None and q.shape[2] == k.shape[2] and q.shape[2] > 1
        if mask is None and not is_causal and q.shape[2] > 1:  # a chunk after a cache: causal with an offset
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - q.shape[2])
        b, heads, length, d = q.shape
        if length == 1 and self.num_groups != heads:
            # One new token (decoding): a group's query heads are queries of the same keys, so they are
            # folded into the query dim, [b, G, H/G, d], and SDPA runs G plain heads: the same arithmetic,
            # about twice as fast on CPU as enable_gqa with one query at ChatGLM2-6B's shape (docs/chatglm2.md).
            q = q.reshape(b, self.num_groups, heads // self.num_groups, d)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout).reshape(b, heads, 1, d)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal,
                enable_gqa=self.num_groups != heads,
            )
        return self.dense(out.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    """SwiGLU: ``dense_4h_to_h(silu(gate) * up)`` with ``gate | up = dense_h_to_4h(x)``."""

    def __init__(self, config: ChatGLM2Config, layer_idx: int = 0):
        super().__init__()
        # The split plan's: gate and up split together (stride 2), rank r holds [gate_r; up_r], so
        # silu(gate_r) * up_r is local; dense_4h_to_h row-split. (Neither depends on the size.)
        self.dense_h_to_4h = nn.Linear1D(config.hidden_size, 2 * config.ffn_hidden_size, bias=config.add_bias_linear,
                                         **layer_split(config, 1, layer_idx, "mlp.dense_h_to_4h"))
        self.dense_4h_to_h = nn.Linear1D(config.ffn_hidden_size, config.hidden_size, bias=config.add_bias_linear,
                                         **layer_split(config, 1, layer_idx, "mlp.dense_4h_to_h"))

    def forward(self, x):
        gate, up = self.dense_h_to_4h(x).chunk(2, dim=-1)
        return self.dense_4h_to_h(F.silu(gate) * up)


class GLMBlock(nn.Module):
    def __init__(self, config: ChatGLM2Config, layer_idx: int):
        super().__init__()
        self.post_ln_residual = config.apply_residual_connection_post_layernorm
        self.hidden_dropout = config.hidden_dropout
        self.input_layernorm = _norm(config)
        self.self_attention = SelfAttention(config, layer_idx)
        self.post_attention_layernorm = _norm(config)
        self.mlp = MLP(config, layer_idx)

    def forward(self, x, cos, sin, mask, cache, prompt=None):
        normed = self.input_layernorm(x)
        attn = F.dropout(self.self_attention(normed, cos, sin, mask, cache, prompt), self.hidden_dropout,
                         self.training)
        x = (normed if self.post_ln_residual else x) + attn
        normed = self.post_attention_layernorm(x)
        mlp = F.dropout(self.mlp(normed), self.hidden_dropout, self.training)
        return (normed if self.post_ln_residual else x) + mlp


class GLMTransformer(nn.Module):
    # Activation checkpointing (glm-finetune --recompute): transformers' ``activation_checkpointing_enable()``
    # (``gradient_checkpointing_enable()`` before 5.x's rename) sets this flag and ``_gradient_checkpointing_func``
    # (torch.utils.checkpoint, non-reentrant: the dropout masks are drawn again the same on recompute).
    gradient_checkpointing = False

    def __init__(self, config: ChatGLM2Config):
        super().__init__()
        self.layers = nn.ModuleList(GLMBlock(config, i) for i in range(config.num_layers))
        if config.post_layer_norm:
            self.final_layernorm = _norm(config)

    def checkpointing(self) -> bool:
        """Whether this forward keeps only each layer's input, its activations recomputed in backward."""
        return self.gradient_checkpointing and self.training and torch.is_grad_enabled()

    def forward(self, x, cos, sin, mask, cache, prompts=None):
        """``prompts``: each layer's P-Tuning prefix ``(keys, values)``, ``[batch, G, P, d]`` each, put before
        the keys, or first into ``cache`` (then empty)."""
        checkpointing = self.checkpointing() and cache is None  # a cache would be written twice on recompute
        for index, layer in enumerate(self.layers):
            prompt = prompts[index] if prompts is not None else None
            if checkpointing:
                x = self._gradient_checkpointing_func(layer.__call__, x, cos, sin, mask, None, prompt)
            else:
                x = layer(x, cos, sin, mask, cache, prompt)
        return self.final_layernorm(x) if hasattr(self, "final_layernorm") else x


class Embedding(nn.Module):
    def __init__(self, config: ChatGLM2Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)

    def forward(self, input_ids):
        return self.word_embeddings(input_ids)


# THUDM's get_prompt drops this share of the prefix's keys and values in training (a constant there too).
PREFIX_DROPOUT = 0.1


class PrefixEncoder(nn.Module):
    """THUDM's ``PrefixEncoder``: prefix position -> that position's keys and values for every layer,
    ``[..., L * 2 * G * d]`` (an embedding, or with ``prefix_projection`` an embedding through
    ``Linear(w, m) -> Tanh -> Linear(m, w)``, ``w = L * 2 * G * d``, ``m`` = ``prefix_hidden_size`` or
    ``hidden_size``). Initialised as torch initialises these layers (THUDM's model leaves them so)."""

    def __init__(self, config: ChatGLM2Config):
        super().__init__()
        width = prefix_width(config)
        self.prefix_projection = bool(config.prefix_projection)
        self.embedding = nn.Embedding(config.pre_seq_len, width)
        if self.prefix_projection:
            middle = config.prefix_hidden_size or config.hidden_size
            self.trans = nn.Sequential(nn.Linear(width, middle), nn.Tanh(), nn.Linear(middle, width))
        for module in self.modules():
            module._prefix_init = True  # ChatGLM2PreTrainedModel._init_weights: reset_parameters, not N(0, 0.02)

    def reset_parameters(self):
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def forward(self, prefix):
        embedded = self.embedding(prefix)
        return self.trans(embedded) if self.prefix_projection else embedded


def prefix_width(config: ChatGLM2Config) -> int:
    """One prefix position's keys and values over every layer: ``L * 2 * G * d`` (THUDM's ``kv_size``)."""
    return config.num_layers * 2 * config.num_key_value_heads * config.kv_channels


class ChatGLM2PreTrainedModel(PreTrainedModel):
    config_class = ChatGLM2Config
    config: ChatGLM2Config
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True  # each GLMBlock (GLMTransformer.gradient_checkpointing)
    _no_split_modules = ["GLMBlock"]
    _supports_sdpa = True
    _keys_to_ignore_on_load_unexpected = [r"rotary_pos_emb\.inv_freq"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if getattr(module, "_prefix_init", False):  # the prefix encoder: torch's own initialisation (THUDM's)
            if isinstance(module, PrefixEncoder):
                module.reset_parameters()
            return
        if isinstance(module, nn.Linear1D) and module.output_replicas is not None and hasattr(module.weight, "to_local"):
            # Key/value groups replicated over ranks: every copy of a group gets the same numbers (THUDM's
            # rows drawn whole, with the seed every rank shares; this rank's rows kept).
            with torch.no_grad():
                whole = torch.empty(module.out_features, module.in_features).normal_(mean=0.0, std=std)
                module.weight.to_local().copy_(module.local_rows(whole))
                if module.bias is not None:
                    module.bias.to_local().zero_()
            return
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


class ChatGLM2Model(ChatGLM2PreTrainedModel):
    """THUDM's ``ChatGLMModel``: embedding, encoder and (as THUDM places it) the output layer."""

    def __init__(self, config: ChatGLM2Config):
        super().__init__(config)
        config.check_supported(quantized=True, prefix=True)  # built in float; weights.load_pretrained quantizes
        self.embedding = Embedding(config)
        self.encoder = GLMTransformer(config)
        self.output_layer = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.pre_seq_len = config.pre_seq_len or 0
        if self.pre_seq_len:  # P-Tuning v2: the model frozen, the prefix encoder alone trains (THUDM's order)
            if nn.heads_per_rank(config.num_attention_heads) != config.num_attention_heads:
                raise ValueError("ChatGLM2: a P-Tuning prefix (pre_seq_len) is not split by tensor parallelism")
            for param in self.parameters():
                param.requires_grad = False
            self.prefix_encoder = PrefixEncoder(config)
        self.post_init()

    def get_prompt(self, batch: int, device, dtype):
        """The P-Tuning prefix as each layer's ``(keys, values)``, ``[batch, G, P, d]`` each (THUDM's
        ``get_prompt``: the encoder's output per prefix position read as ``[L, 2, G, d]``, in ``dtype``,
        dropout 0.1 in training drawn per batch row)."""
        config = self.config
        tokens = torch.arange(self.pre_seq_len, device=device)
        encoded = self.prefix_encoder(tokens).to(dtype)
        encoded = encoded.view(1, self.pre_seq_len, config.num_layers * 2, config.num_key_value_heads,
                               config.kv_channels).expand(batch, -1, -1, -1, -1)
        encoded = F.dropout(encoded, PREFIX_DROPOUT, self.training)
        encoded = encoded.permute(2, 0, 3, 1, 4)  # [L * 2, batch, G, P, d]
        return [(encoded[2 * i], encoded[2 * i + 1]) for i in range(config.num_layers)]

    def get_input_embeddings(self):
        return self.embedding.word_embeddings

    def set_input_embeddings(self, value):
        self.embedding.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, **kwargs):
        """Final hidden states ``[batch, seq, hidden]`` (``output_layer`` is applied by the LM head)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("ChatGLM2: pass exactly one of input_ids and inputs_embeds")
        x = self.embedding(input_ids) if inputs_embeds is None else inputs_embeds
        batch, seq = x.shape[:2]
        if self.encoder.checkpointing() and (use_cache or cache is not None):
            # Under activation checkpointing a layer's forward runs twice: no cache (as transformers' models do).
            logger.warning_once("ChatGLM2: a key/value cache is incompatible with activation checkpointing in "
                                "training; running without one")
        if self.encoder.checkpointing():
            use_cache, cache = False, None
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        cache_position = kwargs.get("cache_position")
        prefix, prompts = self.pre_seq_len, None
        if prefix:  # the prefix's keys and values go to the layers: without a cache, or into an empty one
            if cache is not None and getattr(cache, "is_compileable", False):
                raise ValueError("ChatGLM2: a P-Tuning prefix (pre_seq_len) does not run with a static cache")
            if cache is None or cache.get_seq_length() == 0:
                prompts = self.get_prompt(batch, x.device, x.dtype)
            if attention_mask is not None:  # the mask covers the tokens; the prefix is always seen
                attention_mask = torch.cat([attention_mask.new_ones(batch, prefix), attention_mask], dim=-1)
        if cache is not None and getattr(cache, "is_compileable", False):
            # A preallocated cache: attention reads its whole buffer, so the mask spans it; positions come
            # from generate's cache_position (no read of the cache's length: a compiled step replays this).
            if cache_position is None:
                past = cache.get_seq_length()
                cache_position = torch.arange(seq, device=x.device) + past
            if position_ids is None:
                position_ids = cache_position.expand(batch, seq)
            mask = static_attention_mask(attention_mask, cache_position, cache.get_mask_sizes(seq, 0)[0])
        else:
            past = (cache.get_seq_length() if cache is not None else 0) + (prefix if prompts is not None else 0)
            before = past - prefix  # tokens before this chunk: the prefix has no position
            if before + seq > self.config.seq_length:
                raise ValueError(f"ChatGLM2: {before + seq} tokens exceed the model's seq_length "
                                 f"({self.config.seq_length})")
            if position_ids is None:
                position_ids = torch.arange(before, before + seq, device=x.device).expand(batch, seq)
            mask = attention_mask_4d(attention_mask, seq, past)
        cos, sin = rotary_cos_sin(self.config, position_ids, x.dtype)
        hidden = self.encoder(x, cos, sin, mask, cache, prompts)
        return BaseModelOutputWithPast(last_hidden_state=hidden, **{_CACHE: cache if use_cache else None})


class ChatGLM2ForCausalLM(ChatGLM2PreTrainedModel, GenerationMixin):
    """ChatGLM2 with its LM head, for ``generate``, ``pipeline("text-generation")``, ``chat`` and training."""

    _tied_weights_keys = {}

    def __init__(self, config: ChatGLM2Config):
        super().__init__(config)
        self.transformer = ChatGLM2Model(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.embedding.word_embeddings

    def set_input_embeddings(self, value):
        self.transformer.embedding.word_embeddings = value

    def get_output_embeddings(self):
        return self.transformer.output_layer

    def set_output_embeddings(self, value):
        self.transformer.output_layer = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep: int = 0, past_key_values=None, **kwargs):
        """Logits ``[batch, seq, vocab]`` (the last ``logits_to_keep`` positions when it is set).

        ``labels`` (``-100`` = not counted) give the mean next-token loss over counted positions, in
        fp32: ``sum(loss * mask) / mask.sum()``.
        """
        cache = past_key_values if cache is None else cache
        out = self.transformer(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache,
                               cache_position=kwargs.get("cache_position"))
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.transformer.output_layer(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE: getattr(out, _CACHE)})

    # THUDM's chat API: ChatGLM2's [Round i] prompt or ChatGLM3's role tokens, as the tokenizer's chat_format says.
    def chat(self, tokenizer, query: str, history=None, role: str = "user", **generate_kwargs):
        from glm_port.models.chatglm2.chat import chat

        return chat(self, tokenizer, query, history, role, **generate_kwargs)

    def stream_chat(self, tokenizer, query: str, history=None, role: str = "user", past_key_values=None,
                    return_past_key_values: bool = False, **generate_kwargs):
        from glm_port.models.chatglm2.chat import stream_chat

        return stream_chat(self, tokenizer, query, history, role, past_key_values=past_key_values,
                           return_past_key_values=return_past_key_values, **generate_kwargs)


def attach_prefix(model: "ChatGLM2ForCausalLM", pre_seq_len: int, prefix_projection: bool = False,
                  prefix_hidden_size: int | None = None, state: dict | None = None) -> "ChatGLM2ForCausalLM":
    """A P-Tuning v2 prefix put on a loaded model without one, in place (what building it with ``pre_seq_len``
    in its config gives, the base weights kept): the config records the prefix, the model is frozen, a new
    ``PrefixEncoder`` (torch's initialisation, fp32, on the model's device) takes ``state`` when given
    (its names under ``transformer.prefix_encoder.``, exactly)."""
    transformer, config = model.transformer, model.config
    if transformer.pre_seq_len:
        raise ValueError(f"ChatGLM2: the model has a P-Tuning prefix already (pre_seq_len={transformer.pre_seq_len})")
    if nn.heads_per_rank(config.num_attention_heads) != config.num_attention_heads:
        raise ValueError("ChatGLM2: a P-Tuning prefix (pre_seq_len) is not split by tensor parallelism")
    config.pre_seq_len, config.prefix_projection = pre_seq_len, bool(prefix_projection)
    config.prefix_hidden_size = prefix_hidden_size
    config.check_supported(quantized=True, prefix=True)
    for param in model.parameters():
        param.requires_grad = False
    device = next(model.parameters()).device
    encoder = PrefixEncoder(config).to(device=device, dtype=torch.float32)
    if state is not None:
        encoder.load_state_dict(state, strict=True)
    transformer.prefix_encoder, transformer.pre_seq_len = encoder, pre_seq_len
    return model


def num_parameters_expected(config: ChatGLM2Config) -> int:
    """Parameter count of a config (ChatGLM2-6B: 6,243,584,000), from the shapes above."""
    h, d = config.hidden_size, config.kv_channels
    qkv_out = (config.num_attention_heads + 2 * config.num_key_value_heads) * d
    attn = h * qkv_out + qkv_out * (config.add_qkv_bias or config.add_bias_linear) + config.num_attention_heads * d * h
    mlp = 3 * h * config.ffn_hidden_size
    layer = attn + mlp + 2 * h
    return 2 * config.padded_vocab_size * h + config.num_layers * layer + h * config.post_layer_norm


__all__ = [
    "ChatGLM2ForCausalLM", "ChatGLM2Model", "ChatGLM2PreTrainedModel", "PrefixEncoder", "apply_rotary",
    "attach_prefix", "attention_mask_4d", "prefix_width",
    "rotary_cos_sin", "num_parameters_expected", "static_attention_mask",
]
