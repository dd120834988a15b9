"""PEFT LoRA on shim's tensor-parallel ``Linear1D`` (any model family).

PEFT's ``lora.Linear`` sizes ``lora_B`` by the layer's whole ``out_features`` and ``lora_A`` by its whole
``in_features``; under tensor parallel a ``Linear1D`` computes only this rank's slice of its output
(column-parallel) or takes only this rank's slice of its input (row-parallel). ``TensorParallelLoraLinear``
is registered for ``Linear1D`` with PEFT's custom-module hook (``LoraConfig._register_custom_module``) and
splits the adapter the way Megatron splits a layer (PEFT's own ``LoraParallelLinear`` needs Megatron-LM):

==============  ===========================================  ==================================================
base            ``lora_A`` ``[r, in]``                       ``lora_B`` ``[out, r]``
==============  ===========================================  ==================================================
column-split    whole on every rank; ``A x`` goes through    this rank's output rows, in the base's layout
                Megatron's copy-to-region (gradient summed   (``[Q_r; K_r; V_r]`` for a fused Q|K|V:
                over the tensor-parallel group)              ``output_sections``)
row-split       this rank's input columns; the partial       whole on every rank
                ``A x_r`` summed over the group (all-reduce)
==============  ===========================================  ==================================================

The split parts are plain tensors marked ``model_parallel`` (Megatron's flag, which gradient clipping reads),
so the optimizer and clip see them as Megatron's per-rank shards. The adapter stays PEFT's on disk: a
whole adapter in the natural row order is sliced when loaded (``PeftModel.from_pretrained`` at any
tensor-parallel size), and ``full_adapter_state_dict`` gathers the slices back for ``save_pretrained``.

A fused layer whose output is several blocks split separately (Q|K|V) names its blocks' sizes in the
natural order: ``output_sections`` on the layer, else ``stride`` equal blocks (``Linear1D(stride=3)``); the
adapter is cut and put back by the layer's own split (``shim.nn.split_plan.Split.of_layer``, the split the
family's plan gave it).
With replicated sections (``Linear1D(section_replicas=)``: ChatGLM2's key/value groups on more ranks than
groups) ``lora_B`` holds the rows the base holds, the same part of a group on each of its ranks: those
rows' gradients are summed over the ranks holding them (the layer's ``sum_replica_grads``), so the copies
take the same steps, the extra copies are left out of the clipped norm, and the whole adapter is read
back from the first rank holding each part.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import peft
import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn

from glm_port.checkpoint_io import weights_fingerprint
from shim.nn.split_plan import Split, merge_ranks, slice_for_rank
from shim.nn.tensor_parallel import Linear1D, is_dtensor

__all__ = ["TensorParallelLoraLinear", "full_adapter_state_dict", "lora_config", "register"]


def adapter_problem(path) -> str | None:
    """Why ``path`` (a ``--lora_path``) is not a PEFT adapter directory, in words; None when it is one."""
    path = Path(path)
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file; a PEFT adapter is a directory with adapter_config.json"
    if not (path / "adapter_config.json").is_file():
        return "not a PEFT adapter (no adapter_config.json)"
    return None


def register(config: peft.LoraConfig) -> peft.LoraConfig:
    """``config`` with ``TensorParallelLoraLinear`` as PEFT's LoRA layer for every ``Linear1D``."""
    config._register_custom_module({Linear1D: TensorParallelLoraLinear})
    return config


def lora_config(**kwargs) -> peft.LoraConfig:
    return register(peft.LoraConfig(**kwargs))


def _replicas(base):
    """How many ranks hold each section's part (None: one each)."""
    return getattr(base, "output_replicas", None)


class TensorParallelLoraLinear(LoraLinear):
    """PEFT's ``lora.Linear`` for a ``Linear1D``: the adapter split as the layer is (module docstring).

    In one process (or on a ``"data"`` layer) it is ``lora.Linear``, also for ``skip_bias_add`` layers,
    whose ``(out, bias)`` it returns with the adapter's term added to ``out``.
    """

    def __init__(self, base_layer, adapter_name, config, **kwargs):
        base = base_layer.get_base_layer() if hasattr(base_layer, "get_base_layer") else base_layer
        self.split = base.parallel if is_dtensor(base.weight) else None  # "col", "row" or None
        if self.split:
            self.mesh = base.weight.device_mesh
            self.tp_size, self.tp_rank = self.mesh.size(), self.mesh.get_local_rank()
        super().__init__(base_layer, adapter_name, config=config, **kwargs)
        if self.split:
            # A whole adapter loaded from disk (PEFT's format) is sliced to this rank's part.
            self.register_load_state_dict_pre_hook(TensorParallelLoraLinear._slice_loaded)

    def _get_in_out_features(self, module):
        return module.in_features, module.out_features  # the whole layer's (PEFT would read the local shard's)

    # ---- the split -------------------------------------------------------------------------------------

    def _local(self, kind: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of a whole ``lora_A`` / ``lora_B`` weight (``kind`` "A" or "B")."""
        if self.split == "row" and kind == "A":  # the base's input columns
            return slice_for_rank(full, Split(1), self.tp_rank, self.tp_size)
        if self.split == "col" and kind == "B":  # the base's output rows, cut as its weight is
            return slice_for_rank(full, Split.of_layer(self.get_base_layer()), self.tp_rank, self.tp_size)
        return full

    def _whole(self, kind: str, local: torch.Tensor) -> torch.Tensor:
        """The whole weight from this rank's part (a collective: every rank of the group calls it)."""
        if not ((self.split == "row" and kind == "A") or (self.split == "col" and kind == "B")):
            return local
        from torch.distributed.tensor import DTensor, Replicate, Shard

        dim = 1 if kind == "A" else 0
        parts = DTensor.from_local(local.contiguous(), self.mesh, [Shard(dim)], run_check=False)
        gathered = parts.redistribute(self.mesh, [Replicate()]).to_local()  # the ranks' parts in rank order
        if kind == "A":
            return gathered
        return merge_ranks(gathered.chunk(self.tp_size, dim=0), Split.of_layer(self.get_base_layer()))

    def update_layer(self, adapter_name, r, lora_alpha, config, **kwargs):
        super().update_layer(adapter_name, r, lora_alpha, config=config, **kwargs)
        if not self.split:
            return
        # PEFT initialised the whole adapter (the same numbers on every rank: one seed); keep this rank's part.
        for kind, modules in (("A", self.lora_A), ("B", self.lora_B)):
            if adapter_name not in modules:
                continue
            layer = modules[adapter_name]
            part = self._local(kind, layer.weight.data)
            if part.shape != layer.weight.shape:
                layer.weight = nn.Parameter(part.clone(), requires_grad=layer.weight.requires_grad)
                layer.weight.model_parallel = True  # a per-rank shard (gradient clipping sums its norm)
                layer.in_features, layer.out_features = part.shape[1], part.shape[0]
                if kind == "B" and self.split == "col":  # rows other ranks hold too: counted once
                    self.get_base_layer().mark_duplicate_rows(layer.weight)

    @staticmethod
    def _slice_loaded(self, state_dict, prefix, *args):
        for key in list(state_dict):
            if not key.startswith(prefix) or not key.endswith(".weight"):
                continue
            kind = {"lora_A.": "A", "lora_B.": "B"}.get(key[len(prefix):len(prefix) + 7])
            if kind is None:
                continue
            adapter = key[len(prefix) + 7:-len(".weight")]
            modules = self.lora_A if kind == "A" else self.lora_B
            if adapter in modules and state_dict[key].shape != modules[adapter].weight.shape:
                state_dict[key] = self._local(kind, state_dict[key])

    # ---- forward ---------------------------------------------------------------------------------------

    def forward(self, x, *args, **kwargs):
        skip_bias_add = getattr(self.get_base_layer(), "skip_bias_add", False)
        if not self.split and not skip_bias_add:
            return super().forward(x, *args, **kwargs)  # PEFT's own
        if self.disable_adapters and self.merged:
            self.unmerge()
        result = self.base_layer(x)
        if self.disable_adapters or self.merged:
            return result
        if skip_bias_add:
            out, bias = result
            return self._add_adapters(out, x), bias
        return self._add_adapters(result, x)

    def _add_adapters(self, out, x):
        if self.split:
            from torch.distributed.tensor import DTensor, Partial, Replicate
        dtype = out.dtype
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            lora_A, lora_B = self.lora_A[name], self.lora_B[name]
            h = lora_A(self._cast_input_dtype(self._dropout(name, x), lora_A.weight.dtype))
            if self.split == "col":  # identity forward; backward: the ranks' gradients of A x summed
                h = DTensor.from_local(h, self.mesh, [Replicate()], run_check=False).to_local(
                    grad_placements=[Partial()])
            elif self.split == "row":  # the partial products summed before lora_B
                h = DTensor.from_local(h, self.mesh, [Partial()], run_check=False).redistribute(
                    self.mesh, [Replicate()]).to_local()
            if self.split == "col" and _replicas(self.get_base_layer()) is not None:
                # Replicated rows (a key/value group on several ranks): their gradients summed over its ranks.
                base = self.get_base_layer()
                base.mark_duplicate_rows(lora_B.weight)  # (again, should the parameter have been replaced)
                delta = F.linear(h, base.sum_replica_grads(lora_B.weight), lora_B.bias)
            else:
                delta = lora_B(h)
            out = out + delta * self.scaling[name]
        return out.to(dtype)

    def _dropout(self, name, x):
        dropout = self.lora_dropout[name]
        if self.split != "row" or not isinstance(dropout, nn.Dropout) or not dropout.training:
            return dropout(x)  # a whole input: the same mask on every rank (one seed), as in one process
        # This rank's columns of the mask one process draws for the whole input (same random numbers).
        whole = x.new_ones(*x.shape[:-1], x.shape[-1] * self.tp_size)
        return x * dropout(whole).chunk(self.tp_size, dim=-1)[self.tp_rank]

    def get_delta_weight(self, adapter):
        if self.split:
            raise NotImplementedError("merging a LoRA adapter into tensor-parallel shards is not supported")
        return super().get_delta_weight(adapter)


def full_adapter_state_dict(model) -> dict:
    """The LoRA weights of a PEFT model as one process holds them (tensor-parallel slices gathered in the
    natural row order), keyed as ``model.state_dict()`` is: ``save_pretrained(state_dict=...)``'s input.
    A collective under tensor parallel: every rank calls it."""
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, TensorParallelLoraLinear):
            continue
        for kind, modules in (("A", module.lora_A), ("B", module.lora_B)):
            for adapter, layer in modules.items():
                out[f"{name}.lora_{kind}.{adapter}.weight"] = module._whole(kind, layer.weight.detach())
    for key, value in model.state_dict().items():  # other PEFT layers (targets that are not Linear1D)
        if "lora_" in key and key not in out:
            out[key] = value.full_tensor() if is_dtensor(value) else value
    return out


def base_state_dict(model) -> dict:
    """The weights of the base model under a PEFT ``model`` (one process), keyed as the base alone is
    (``.base_layer.`` / ``.original_module.`` dropped; LoRA weights and ``modules_to_save`` copies left out):
    what ``checkpoint_io.weights_fingerprint`` takes to record the base an adapter was trained on."""
    state = {}
    for key, value in model.get_base_model().state_dict().items():
        if "lora_" in key or ".modules_to_save." in key:
            continue
        state[key.replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    return state


_FINGERPRINTS = weakref.WeakKeyDictionary()  # a frozen base's fingerprint, taken at the run's first save


def base_fingerprint(model) -> str:
    """``weights_fingerprint`` of the frozen base under the PEFT ``model`` (one process), taken once."""
    if model not in _FINGERPRINTS:
        _FINGERPRINTS[model] = weights_fingerprint(base_state_dict(model))
    return _FINGERPRINTS[model]
