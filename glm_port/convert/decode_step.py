"""The decoding step of ``GLMForConditionalGeneration`` as a graph for serving: ONNX and ``torch.export``.

One graph does both halves of generation: new tokens after a key/value cache of ``past`` positions
(``past = 0``: the prompt forward; ``query = 1``: one decode step). Batch, query and past lengths are
dynamic. The cache travels as two plain tensors; inside, they fill a transformers ``DynamicCache``, and
the model's own forward (2D positions, the full attention mask) runs unchanged.

==================  ==========================================  =======================================
name                shape                                       meaning
==================  ==========================================  =======================================
``input_ids``       ``[batch, query]`` int64                    the new tokens
``position_ids``    ``[batch, 2, query]`` int64                 GLM's 2D positions (position, block)
``attention_mask``  ``[batch, 1, query, past + query]`` bool    True where a new token may attend
``past_keys``       ``[layers, batch, heads, past, head_dim]``  the cache's keys (``past`` may be 0)
``past_values``     ``[layers, batch, heads, past, head_dim]``  the cache's values
``logits``          ``[batch, query, vocab]``                   next-token logits at every new token
``present_keys``    ``[layers, batch, heads, past + query, d]`` the cache for the next step
``present_values``  ``[layers, batch, heads, past + query, d]``
==================  ==========================================  =======================================

``tokenizer.build_inputs_for_generation`` gives the rows to feed: ``position_ids[:, :, past:past + q]``
and ``generation_attention_mask[:, :, past:past + q, :past + q]``.
"""

from __future__ import annotations

from pathlib import Path

from transformers.cache_utils import DynamicCache

import shim as torch

INPUT_NAMES = ("input_ids", "position_ids", "attention_mask", "past_keys", "past_values")
OUTPUT_NAMES = ("logits", "present_keys", "present_values")
ONNX_DYNAMIC_AXES = {
    "input_ids": {0: "batch", 1: "query"},
    "position_ids": {0: "batch", 2: "query"},
    "attention_mask": {0: "batch", 2: "query", 3: "keys"},
    "past_keys": {1: "batch", 3: "past"},
    "past_values": {1: "batch", 3: "past"},
    "logits": {0: "batch", 1: "query"},
    "present_keys": {1: "batch", 3: "keys"},
    "present_values": {1: "batch", 3: "keys"},
}
ONNX_OPSET = 17  # LayerNormalization is a single op from 17 on


class DecodeStep(torch.nn.Module):
    """``GLMForConditionalGeneration`` with its cache as plain tensors in and out (see the module doc)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_layers

    def forward(self, input_ids, position_ids, attention_mask, past_keys, past_values):
        cache = DynamicCache()
        for layer in range(self.num_layers):
            cache.update(past_keys[layer], past_values[layer], layer)
        out = self.model(input_ids, position_ids=position_ids, attention_mask=attention_mask, cache=cache,
                         use_cache=True)
        keys = torch.stack([cache.layers[i].keys for i in range(self.num_layers)])
        values = torch.stack([cache.layers[i].values for i in range(self.num_layers)])
        return out.logits, keys, values


def example_inputs(config, *, batch: int = 2, query: int = 3, past: int = 5, dtype=torch.float32, seed: int = 0):
    """Inputs of the given sizes: random tokens, positions within the model's range, a mask whose last
    column (the token itself) is always visible, a random cache."""
    generator = torch.Generator().manual_seed(seed)
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    keys = past + query
    input_ids = torch.randint(0, config.vocab_size, (batch, query), generator=generator)
    positions = torch.randint(0, config.max_sequence_length, (batch, 2, query), generator=generator)
    mask = torch.rand(batch, 1, query, keys, generator=generator) > 0.3
    mask[..., past:] |= torch.eye(query, dtype=torch.bool)  # each new token sees itself
    cache = [torch.randn(config.num_layers, batch, heads, past, head_dim, generator=generator).to(dtype)
             for _ in range(2)]
    return input_ids, positions, mask, cache[0], cache[1]


ONNX_MODULES = ("onnx", "onnxruntime")  # torch.onnx's TorchScript exporter writes through onnx; the check runs onnxruntime
ONNX_INSTALL = "pip install 'glm-migrate[onnx]'"


def missing_onnx_modules() -> list[str]:
    """Which of the modules ``--onnx`` needs (:data:`ONNX_MODULES`) cannot be imported here."""
    import importlib

    missing = []
    for name in ONNX_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def export_onnx(model, path, *, opset: int = ONNX_OPSET) -> Path:
    """Write the decoding step of ``model`` (eval mode, its dtype) as ONNX to ``path``.

    torch's TorchScript-based exporter (``dynamo=False``): the dynamo exporter needs ``onnxscript``, which
    this project does not depend on. The trace is taken at query 3, past 5 (neither 0 nor 1, so no size is
    specialised); every size is a dynamic axis."""
    import warnings

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    step = DecodeStep(model).eval()
    dtype = next(model.parameters()).dtype
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice and tracer warnings
        torch.onnx.export(step, example_inputs(model.config, dtype=dtype), str(path), dynamo=False,
                          input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES),
                          dynamic_axes=ONNX_DYNAMIC_AXES, opset_version=opset)
    return path


def export_program(model, path) -> Path:
    """Write the decoding step as a ``torch.export`` program (``torch.export.save``, a ``.pt2`` file);
    ``torch.export.load(path).module()(*inputs)`` runs it. Batch, query (from 1) and past (from 0) are dynamic."""
    import torch.fx.experimental._config as symbolic_config
    from torch.export import Dim

    step = DecodeStep(model).eval()
    dtype = next(model.parameters()).dtype
    # Sizes 0 and 1 are what serving uses (an empty cache, one new token): without size-oblivious reasoning
    # export would specialise them away (dynamic dims start at 2).
    batch, query, past, keys = Dim("batch", min=1), Dim("query", min=1), Dim("past", min=0), Dim("keys", min=1)
    shapes = {"input_ids": {0: batch, 1: query}, "position_ids": {0: batch, 2: query},
              "attention_mask": {0: batch, 2: query, 3: keys},
              "past_keys": {1: batch, 3: past}, "past_values": {1: batch, 3: past}}
    with symbolic_config.patch(backed_size_oblivious=True), torch.no_grad():
        program = torch.export.export(step, example_inputs(model.config, dtype=dtype), dynamic_shapes=shapes,
                                      strict=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def onnx_session(path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session, inputs) -> list:
    """The session's outputs for torch ``inputs`` (as torch tensors)."""
    feed = {name: tensor.numpy() for name, tensor in zip(INPUT_NAMES, inputs)}
    return [torch.from_numpy(out) for out in session.run(list(OUTPUT_NAMES), feed)]


def check_onnx(model, path, *, batch: int = 2, prompt: int = 6, steps: int = 3) -> float:
    """Largest |ONNX - eager| over the logits of a prompt forward (empty cache) and ``steps`` one-token decode
    steps, each side feeding back its own cache; relative to the largest eager logit."""
    step = DecodeStep(model).eval()
    session = onnx_session(path)
    dtype = next(model.parameters()).dtype
    inputs = example_inputs(model.config, batch=batch, query=prompt, past=0, dtype=dtype, seed=1)
    worst, scale = 0.0, 0.0
    ours_cache = theirs_cache = inputs[3:]
    generator = torch.Generator().manual_seed(2)
    for index in range(steps + 1):
        with torch.no_grad():
            ours = step(*inputs[:3], *ours_cache)
        theirs = run_onnx(session, (*inputs[:3], *theirs_cache))
        worst = max(worst, (ours[0].float() - theirs[0].float()).abs().max().item())
        scale = max(scale, ours[0].float().abs().max().item())
        ours_cache, theirs_cache = ours[1:], theirs[1:]
        past = ours_cache[0].size(3)
        token = ours[0][:, -1].argmax(-1, keepdim=True)  # greedy, as a server would
        position = torch.randint(0, model.config.max_sequence_length, (batch, 2, 1), generator=generator)
        mask = torch.ones(batch, 1, 1, past + 1, dtype=torch.bool)
        inputs = (token, position, mask)
    return worst / max(scale, 1e-12)
