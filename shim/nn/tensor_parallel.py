"""Tensor-parallel layers (LiBai's ``Linear1D`` / Megatron's ``VocabParallelEmbedding``) on DTensor.

A layer is built whole on every rank, then ``parallelize_module`` shards its
weight over the tensor-parallel dim of the layer's mesh
(``shim.distributed.layer_mesh(layer_idx)["tp"]``), scattering rank 0's
values. Inputs and outputs stay plain local tensors, so these layers drop into
ordinary modules:

=============  ===================  ==============  ===============  =================
``parallel``   torch style          weight          input            output
=============  ===================  ==============  ===============  =================
``"col"``      ``ColwiseParallel``  ``Shard(0)``    whole            this rank's slice
                                                                     (whole with
                                                                     ``gather_output``)
``"row"``      ``RowwiseParallel``  ``Shard(1)``    this rank's      whole (summed)
                                                    slice (whole if
                                                    not ``input_is_parallel``)
``"data"``     none                 whole           whole            whole
=============  ===================  ==============  ===============  =================

With a tensor-parallel size of 1, or before any layout is set up, the layers stay plain
``nn.Linear`` / ``nn.Embedding`` (no process group is started and DTensor is not imported), so a
model declares its split once and runs unchanged in one process.

``skip_bias_add=True`` (Megatron's): ``forward`` returns ``(x @ W.T, bias)`` with this rank's parts,
the bias left for the caller to fuse into the next elementwise op (bias + GELU, bias + dropout +
residual). The input and output are then local tensors as in the table; the layer does the DTensor
wrapping itself instead of ``parallelize_module``'s hooks.

``stride`` (Megatron's, for fused projections such as Q|K|V): the split dim is
``stride`` blocks, each split over the ranks, so rank ``r`` holds
``[q_r; k_r; v_r]``. The layer's global weight then lists the ranks' shards in
rank order (Megatron's per-rank checkpoints, concatenated); ``strided_order``
converts between that order and the natural one. ``sections`` does the same for blocks of unequal
sizes (ChatGLM2's ``[Q heads | K groups | V groups]``): rank ``r`` holds each block's ``r``-th part.

``section_replicas`` (with ``sections``; vLLM's key/value head replication): block ``b`` is cut into
``tensor_parallel_size / section_replicas[b]`` parts only, and ``section_replicas[b]`` neighbouring ranks
hold the same part (ChatGLM2's 2 key/value groups on 4 ranks: ranks 0, 1 hold group 0; ranks 2, 3 group 1).
The layer's DTensor then lists each rank's rows in rank order, so a replicated part appears once per rank
holding it (more rows than ``out_features``); ``section_part`` / ``sections_whole`` convert between a
natural-order tensor and the ranks' parts. Training stays one process's arithmetic: the replicated rows'
gradients are summed over the ranks holding them (in the backward of ``forward``), so the copies take the
same steps, and every copy but the first is marked ``tensor_parallel_duplicate_rows`` on its parameter,
rows that ``shim.mpu.clip_grad_norm`` leaves out of the norm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sys

import torch
from torch import nn
from torch.nn import functional as F

from shim.distributed.layout import current_layout, ensure_divisible, layer_mesh
from shim.nn.split_plan import Split, merge_ranks, slice_for_rank

__all__ = ["Linear1D", "VocabParallelEmbedding", "heads_per_rank", "is_dtensor", "section_part", "sections_whole",
           "strided_order"]

_PARALLEL_MODES = ("col", "row", "data")


def heads_per_rank(num_attention_heads: int) -> int:
    """Attention heads on each tensor-parallel rank; a one-line error if they do not divide.

    Call it before building the attention's layers, so a bad size fails before any collective.
    """
    return ensure_divisible(
        num_attention_heads, _tensor_parallel_size(), "num_attention_heads", "tensor_parallel_size"
    )


def _tensor_parallel_mesh(layer_idx: int):
    return layer_mesh(layer_idx)["tp"]


def _tensor_parallel_size() -> int:
    """The layout's tensor-parallel size; 1 before any layout is set up (nothing is started for it)."""
    layout = current_layout()
    return 1 if layout is None else layout.tensor_parallel_size


def is_dtensor(tensor) -> bool:
    """Whether ``tensor`` is a DTensor (a tensor-parallel layer's shard), without importing DTensor: it takes
    seconds to import, and before it is imported no tensor can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def _local(tensor):
    return tensor.to_local() if is_dtensor(tensor) else tensor


class Linear1D(nn.Linear):
    """``nn.Linear`` split over the tensor-parallel ranks by columns (``"col"``) or rows (``"row"``).

    ``init_method`` (optional) initialises the whole weight before it is split,
    and the bias is then zeroed, as Megatron does; otherwise ``nn.Linear``'s
    initialisation is kept.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        parallel: str = "data",
        layer_idx: int = 0,
        *,
        gather_output: bool = False,
        input_is_parallel: bool = True,
        init_method: Callable[[torch.Tensor], object] | None = None,
        stride: int = 1,
        skip_bias_add: bool = False,
        sections: Sequence[int] | None = None,
        section_replicas: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ):
        if parallel not in _PARALLEL_MODES:
            raise ValueError(f"Linear1D parallel={parallel!r}: expected one of {_PARALLEL_MODES}")
        tp_size = _tensor_parallel_size()
        if parallel == "col":
            what, split_size = "Linear1D(parallel='col') out_features", out_features
        else:
            what, split_size = "Linear1D(parallel='row') in_features", in_features
        if sections is not None:
            if parallel != "col" or stride != 1 or sum(sections) != out_features:
                raise ValueError(f"Linear1D sections={tuple(sections)}: column-split only, without stride, "
                                 f"summing to out_features ({out_features})")
            replicas = tuple(section_replicas) if section_replicas is not None else (1,) * len(sections)
            if len(replicas) != len(sections) or min(replicas) < 1:
                raise ValueError(f"Linear1D section_replicas={replicas}: one count of at least 1 per section "
                                 f"({len(sections)} sections)")
            if tp_size == 1:
                replicas = (1,) * len(sections)  # one process holds every section whole
            for size, copies in zip(sections, replicas):
                parts = ensure_divisible(tp_size, copies, "tensor_parallel_size", "Linear1D section_replicas") \
                    if copies > 1 else tp_size
                ensure_divisible(size, parts, "Linear1D(parallel='col') section",
                                 "tensor_parallel_size" if copies == 1 else "tensor_parallel_size / section_replicas")
        elif section_replicas is not None:
            raise ValueError("Linear1D section_replicas needs sections")
        elif parallel != "data":
            by = "tensor_parallel_size" if stride == 1 else f"tensor_parallel_size * stride ({tp_size} * {stride})"
            ensure_divisible(split_size, tp_size * stride, what, by)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.parallel, self.layer_idx, self.stride = parallel, layer_idx, stride
        # The output rows' natural blocks, each split over the ranks (stride: equal blocks); LoRA reads them.
        self.output_sections = tuple(sections) if sections is not None else None
        # How many neighbouring ranks hold each section's part (None: one each, every section split T ways).
        self.output_replicas = replicas if sections is not None and max(replicas) > 1 else None
        self.skip_bias_add = skip_bias_add
        if init_method is not None:
            with torch.no_grad():
                init_method(self.weight)
                if self.bias is not None:
                    self.bias.zero_()
        if parallel == "data" or tp_size == 1:
            return
        if sections is not None:
            with torch.no_grad():
                if self.output_replicas is None:
                    self.weight.copy_(_sections_order(self.weight, sections, tp_size))
                    if self.bias is not None:
                        self.bias.copy_(_sections_order(self.bias, sections, tp_size))
                else:  # a replicated part appears once per rank holding it: more rows than out_features
                    self.weight = nn.Parameter(_sections_order(self.weight, sections, tp_size, replicas))
                    if self.bias is not None:
                        self.bias = nn.Parameter(_sections_order(self.bias, sections, tp_size, replicas))
        if stride > 1:
            with torch.no_grad():
                self.weight.copy_(strided_order(self.weight, 0 if parallel == "col" else 1, stride, tp_size))
                if parallel == "col" and self.bias is not None:
                    self.bias.copy_(strided_order(self.bias, 0, stride, tp_size))
        from torch.distributed.tensor import Replicate, Shard, distribute_module
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        if skip_bias_add or self.output_replicas is not None:
            # Weights only: forward wraps its input itself and returns local tensors.
            distribute_module(self, _tensor_parallel_mesh(layer_idx), _shard_linear(parallel))
            if self.output_replicas is not None:
                self._replica_rows, self._duplicate_rows = _replica_rows(
                    sections, replicas, self.weight.device_mesh.get_local_rank(), tp_size)
                self.mark_duplicate_rows(self.weight, self.bias)
            return
        if parallel == "col":
            style = ColwiseParallel(output_layouts=Replicate() if gather_output else Shard(-1))
        else:
            style = RowwiseParallel(input_layouts=Shard(-1) if input_is_parallel else Replicate())
        parallelize_module(self, _tensor_parallel_mesh(layer_idx), style)

    def forward(self, x):
        replicated = self.output_replicas is not None and is_dtensor(self.weight)
        if not self.skip_bias_add and not replicated:
            return super().forward(x)
        if not is_dtensor(self.weight):
            return F.linear(x, self.weight), self.bias
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        mesh = self.weight.device_mesh
        if replicated:  # whole input (its gradient summed over the ranks), this rank's rows: plain tensors
            self.mark_duplicate_rows(self.weight, self.bias)  # (again: a dtype change swaps the parameters)
            weight = self.sum_replica_grads(self.weight.to_local())
            bias = None if self.bias is None else self.sum_replica_grads(self.bias.to_local())
            x = DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
            return (F.linear(x, weight), bias) if self.skip_bias_add else F.linear(x, weight, bias)
        if self.parallel == "col":  # whole input, this rank's output columns
            out = F.linear(DTensor.from_local(x, mesh, [Replicate()], run_check=False), self.weight).to_local()
        else:  # this rank's input slice, outputs summed over the ranks
            partial = F.linear(DTensor.from_local(x, mesh, [Shard(-1)], run_check=False), self.weight)
            out = partial.redistribute(mesh, [Replicate()]).to_local()
        return out, None if self.bias is None else _local(self.bias)

    def extra_repr(self) -> str:
        stride = f", stride={self.stride}" if self.stride > 1 else ""
        replicas = f", section_replicas={self.output_replicas}" if self.output_replicas else ""
        return f"{super().extra_repr()}, parallel={self.parallel!r}, layer_idx={self.layer_idx}{stride}{replicas}"

    # ---- replicated sections (section_replicas) -----------------------------------------------------------

    def local_rows(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's rows, in the layer's row layout, of a tensor in the natural order of ``sections``
        (the weight, the bias, a LoRA ``B``), replicated sections included; ``whole`` in one process."""
        if self.output_sections is None or not is_dtensor(self.weight):
            raise ValueError("Linear1D.local_rows is for a layer with sections under tensor parallel")
        mesh = self.weight.device_mesh
        return section_part(whole, self.output_sections, mesh.get_local_rank(), mesh.size(), self.output_replicas)

    def sum_replica_grads(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` (a tensor in this rank's row layout: the weight's, the bias's, a LoRA ``B``'s) as is,
        whose backward sums the replicated rows' gradients over the ranks holding the same part."""
        if self.output_replicas is None or not hasattr(self, "_replica_rows"):
            return local
        return _SumReplicaGrads.apply(local, self._replica_rows, self.weight.device_mesh.get_group())

    def mark_duplicate_rows(self, *params) -> None:
        """Mark, on parameters in this rank's row layout, the rows another rank also holds and counts
        (``tensor_parallel_duplicate_rows``: ``(start, stop)`` ranges; gradient clipping leaves them out)."""
        for param in params:
            if param is not None and getattr(self, "_duplicate_rows", None):
                param.tensor_parallel_duplicate_rows = self._duplicate_rows


def _shard_linear(parallel: str):
    """``distribute_module``'s partition function for a column- or row-split ``nn.Linear``."""

    def partition(name, module, mesh):
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        for param_name, param in list(module.named_parameters(recurse=False)):
            if parallel == "col":
                placement = Shard(0)
            else:
                placement = Shard(1) if param_name == "weight" else Replicate()
            module.register_parameter(param_name, nn.Parameter(distribute_tensor(param, mesh, [placement])))

    return partition


def strided_order(tensor: torch.Tensor, dim: int, stride: int, parts: int) -> torch.Tensor:
    """Reorder ``dim`` from ``stride`` blocks of ``parts`` pieces each to ``parts`` groups of ``stride``.

    ``[q0 q1 | k0 k1 | v0 v1]`` (stride 3, parts 2) becomes ``[q0 k0 v0 | q1 k1 v1]``;
    ``strided_order(t, dim, parts, stride)`` undoes it.
    """
    pieces = tensor.chunk(stride * parts, dim=dim)
    return torch.cat([pieces[block * parts + part] for part in range(parts) for block in range(stride)], dim=dim)


def section_part(tensor: torch.Tensor, sections: Sequence[int], rank: int, size: int,
                 replicas: Sequence[int] | None = None) -> torch.Tensor:
    """Rank ``rank``'s rows of ``tensor``, whose rows are blocks of ``sections`` sizes in natural order
    (``[A | B | C]``): ``[A_r; B_r; C_r]``, block ``b`` cut into ``size / replicas[b]`` parts of which the
    rank holds part ``rank // replicas[b]`` (``shim.nn.split_plan.slice_for_rank`` of ``Split(0, sections=)``)."""
    return slice_for_rank(tensor, Split(0, sections=sections, section_replicas=replicas), rank, size)


def sections_whole(parts: Sequence[torch.Tensor], sections: Sequence[int],
                   replicas: Sequence[int] | None = None) -> torch.Tensor:
    """The natural-order tensor from every rank's part (``section_part``'s inverse; ``parts`` in rank order,
    a replicated block read from the first rank holding each of its parts; ``merge_ranks``)."""
    return merge_ranks(parts, Split(0, sections=sections, section_replicas=replicas))


def _sections_order(tensor: torch.Tensor, sections: Sequence[int], parts: int,
                    replicas: Sequence[int] | None = None) -> torch.Tensor:
    """Rows ``[A | B | C]`` (blocks of ``sections`` sizes) to ``[A_0 B_0 C_0 | A_1 B_1 C_1 | ...]``: rank order."""
    return torch.cat([section_part(tensor, sections, rank, parts, replicas) for rank in range(parts)], dim=0)


def _replica_rows(sections, replicas, rank: int, size: int):
    """For this rank's row layout: ``(start, stop, slot, slots)`` of each replicated section (its part is
    slot ``rank // k`` of ``size // k``), and the ``(start, stop)`` rows another rank counts (this rank is
    not the first holding them)."""
    summed, duplicates, start = [], [], 0
    for size_b, k in zip(sections, replicas):
        stop = start + size_b // (size // k)
        if k > 1:
            summed.append((start, stop, rank // k, size // k))
            if rank % k:
                duplicates.append((start, stop))
        start = stop
    return tuple(summed), tuple(duplicates)


class _SumReplicaGrads(torch.autograd.Function):
    """Identity; backward: each replicated row block's gradient summed over the ranks holding that part.

    One all-reduce over the tensor-parallel group: every rank writes its block into its part's slot of a
    zero buffer, so slot ``p`` sums the gradients of part ``p``'s holders.
    """

    @staticmethod
    def forward(ctx, local, rows, group):
        ctx.rows, ctx.group = rows, group
        return local.view_as(local)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        buffers = []
        for start, stop, slot, slots in ctx.rows:
            buffer = grad.new_zeros((slots, stop - start, *grad.shape[1:]))
            buffer[slot] = grad[start:stop]
            buffers.append(buffer)
        flat = torch.cat([b.flatten() for b in buffers])
        torch.distributed.all_reduce(flat, group=ctx.group)
        offset = 0
        for (start, stop, slot, slots), buffer in zip(ctx.rows, buffers):
            grad[start:stop] = flat[offset:offset + buffer.numel()].view_as(buffer)[slot]
            offset += buffer.numel()
        return grad, None, None


class VocabParallelEmbedding(nn.Embedding):
    """``nn.Embedding`` whose vocabulary is split over the tensor-parallel ranks.

    Each rank looks up the ids in its own vocab slice; the partial embeddings are
    summed, so every rank gets the whole output (torch's ``RowwiseParallel`` on
    an embedding). ``init_method`` initialises the whole table before the split.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        layer_idx: int = 0,
        init_method: Callable[[torch.Tensor], object] | None = None,
        device=None,
        dtype=None,
    ):
        tp_size = _tensor_parallel_size()
        ensure_divisible(num_embeddings, tp_size, "VocabParallelEmbedding num_embeddings", "tensor_parallel_size")
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.layer_idx = layer_idx
        if init_method is not None:
            with torch.no_grad():
                init_method(self.weight)
        if tp_size > 1:
            from torch.distributed.tensor import Replicate
            from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

            parallelize_module(
                self,
                _tensor_parallel_mesh(layer_idx),
                RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            )
            _keep_grad_layout(self.weight)


    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden @ table.T`` (an output layer tied to this embedding): under tensor parallel, this
        rank's vocabulary slice of the logits (Megatron's ``parallel_output``)."""
        if not is_dtensor(self.weight):
            return F.linear(hidden, self.weight)
        from torch.distributed.tensor import DTensor, Replicate

        mesh = self.weight.device_mesh
        return F.linear(DTensor.from_local(hidden, mesh, [Replicate()], run_check=False), self.weight).to_local()


def _keep_grad_layout(param) -> None:
    # DTensor's embedding backward returns a Replicate gradient for a Shard(0)
    # table; slicing it back (no communication) keeps one vocab slice per rank,
    # the layout optimizers, FSDP and gradient clipping expect.
    param.register_hook(lambda grad: grad.redistribute(grad.device_mesh, param.placements))
