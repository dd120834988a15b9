"""Sharded data parallel (ZeRO / PaddleNLP's ``--sharding``) on torch's FSDP2, for every training command.

The engine is torch's: ``torch.distributed.fsdp.fully_shard`` on each transformer layer and on the root
module, over the data-parallel ``DeviceMesh`` of the run's layout (``shim.distributed.setup_layout``).
Nothing here shards a tensor itself; this module only says which modules become FSDP units, with what
policy, and how the training loop's norm and the checkpoints treat the resulting DTensor parameters.

Stages (PaddleNLP's ``--sharding stageN``, DeepSpeed's ``zero_optimization.stage``) map to one switch,
``reshard_after_forward``: stage 3 frees each layer's gathered parameters after its forward (gathered
again for the backward), stages 1 and 2 keep them from the forward to the backward. FSDP2 always shards
parameters, gradients and optimizer state between steps, so stages 1 and 2 hold less than ZeRO's (which
keep whole parameters, and for stage 1 whole gradients) and differ from stage 3 only in the memory of
the gathered parameters during a step.

``degree`` below the data-parallel size gives hybrid sharding (HSDP): the data-parallel ranks split into
``dp / degree`` replicas of ``degree`` shards, a 2-D mesh ``(replicate, shard)``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from dataclasses import dataclass

import shim as torch
import shim.distributed as dist

STAGES = ("stage1", "stage2", "stage3")


@dataclass(frozen=True)
class Sharding:
    """A run's sharding: its ZeRO stage (1-3) and how many ranks each parameter is split over."""

    stage: int
    degree: int
    mesh: object = None  # the FSDP mesh: 1-D ("dp",), or 2-D ("replicate", "shard") for HSDP

    @property
    def reshard_after_forward(self) -> bool:
        return self.stage == 3

    @property
    def hybrid(self) -> bool:
        return self.mesh is not None and self.mesh.ndim == 2


def parse_stage(text: str | int | None) -> int:
    """``stage1``/``stage2``/``stage3`` (PaddleNLP's words; ``1``-``3`` too) as 1-3; ``""``/None/0: 0 (off)."""
    if text in (None, "", 0, "0"):
        return 0
    words = str(text).split()  # PaddleNLP allows "stage2 offload": offload is not implemented
    if len(words) != 1 or words[0] not in (*STAGES, "1", "2", "3"):
        raise ValueError(f"--sharding {text!r}: choose stage1, stage2 or stage3 (offload is not implemented)")
    return int(words[0][-1])


def resolve_degree(stage: int, degree: int | None, world_size: int, tensor_parallel_size: int = 1) -> int:
    """The ranks each parameter is sharded over: ``degree``, or the whole data-parallel group when it is
    None or -1 (PaddleNLP's default); a one-line ValueError when it does not divide the data-parallel
    size (the world size over tensor parallel)."""
    if not stage:
        return 1
    data_parallel = world_size // max(tensor_parallel_size, 1)
    if degree is None or degree == -1:
        return data_parallel
    if degree < 1 or data_parallel % degree:
        raise ValueError(f"--sharding_degree {degree} does not divide the {data_parallel} data-parallel processes "
                         f"(world size {world_size}" + (f" / tensor parallel {tensor_parallel_size})"
                                                        if tensor_parallel_size > 1 else ")"))
    return degree


def fsdp_mesh(layout, degree: int):
    """The data-parallel mesh of ``layout`` (shim's root mesh ``("pp", "dp", "tp")``), or, for a degree below
    the data-parallel size, that dimension unflattened into ``("replicate", "shard")``."""
    dp = layout.data_parallel_size
    if degree == dp:
        return layout.mesh["dp"]
    return layout.mesh._unflatten("dp", (dp // degree, degree), ("replicate", "shard"))["replicate", "shard"]


def transformer_layers(model) -> list:
    """The model's repeated blocks: the children of its ``nn.ModuleList`` holding the most parameters
    (GLM's ``transformer.layers``, ChatGLM2's ``encoder.layers``)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return []
    blocks = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(blocks)


def shard_model(model, sharding: Sharding, param_dtype=None):
    """``fully_shard`` every transformer layer, then the root (embeddings, final norm, head), in place.

    ``param_dtype`` (bf16 under --bf16): the layers compute in it, gradients are reduced in fp32 and the
    sharded (master) parameters and optimizer state stay fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    options = dict(mesh=sharding.mesh, reshard_after_forward=sharding.reshard_after_forward)
    if policy is not None:
        options["mp_policy"] = policy
    duplicates = _duplicate_rows(model)
    for layer in transformer_layers(model):
        fully_shard(layer, **options)
    # The root's own parameters are needed until the loss (tied output embedding): never resharded early.
    fully_shard(model, **{**options, "reshard_after_forward": False})
    _mark_sharded_duplicates(model, duplicates, sharding.mesh)
    return model


def _duplicate_rows(model) -> dict:
    """``{(module name, parameter name): (its tensor-parallel rows on this rank, duplicate row ranges)}`` for the
    parameters whose rows another tensor-parallel rank also holds (ChatGLM2's key/value groups replicated over
    the ranks: ``tensor_parallel_duplicate_rows`` on every copy but the first), before ``fully_shard``."""
    found = {}
    for module_name, module in model.named_modules():
        params = dict(module.named_parameters(recurse=False))
        if hasattr(module, "mark_duplicate_rows"):  # shim's Linear1D: marked again (a dtype change, a load with
            module.mark_duplicate_rows(*params.values())  # assign=True, swaps parameters for unmarked ones)
        for name, param in params.items():
            ranges = getattr(param, "tensor_parallel_duplicate_rows", None)
            if ranges:
                local = param.to_local() if hasattr(param, "to_local") else param
                found[module_name, name] = (local.shape[0], tuple(ranges))
    return found


def _mark_sharded_duplicates(model, duplicates: dict, mesh) -> None:
    """Carry the duplicate rows onto the FSDP2 shards as ``sharded_duplicate_rows``, in the shard's own rows:
    FSDP2 cuts the rank's tensor-parallel rows into ``torch.chunk`` pieces over the shard dimension of
    ``mesh``, this rank holding the piece at its place there (``fully_shard`` makes new parameters, which
    lose the attribute, and the duplicate ranges must be cut as the rows were)."""
    if not duplicates:
        return
    dim = "shard" if mesh.ndim == 2 else None
    ranks, rank = mesh.size(1 if dim else 0), mesh.get_local_rank(dim)
    for (module_name, name), (rows, ranges) in duplicates.items():
        param = getattr(model.get_submodule(module_name), name)
        chunk = -(-rows // ranks)
        start, stop = min(rank * chunk, rows), min((rank + 1) * chunk, rows)
        held = param.to_local().shape[0] if hasattr(param, "to_local") else param.shape[0]
        if held != stop - start:
            raise RuntimeError(f"{module_name}.{name}: FSDP2 shard of {held} rows, expected rows [{start}, {stop}) "
                               f"of {rows}: cannot place its duplicate rows")
        param.sharded_duplicate_rows = tuple((max(b, start) - start, min(e, stop) - start)
                                             for b, e in ranges if min(e, stop) > max(b, start))


def is_sharded(model) -> bool:
    if "torch.distributed.fsdp" not in sys.modules:  # never imported: nothing is sharded (and a one-process
        return False  # run does not pay for the import)
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def as_root_forward(model, logits_fn):
    """``logits_fn(model, batch, counted)`` run as a forward of the sharded root: a family whose logits call a
    submodule and then use the root's weights directly (ChatGLM2: ``model.transformer``, then its output
    layer's weight) gets the root's parameters gathered around it and the root's backward hooks on its output,
    as a call of the model would. The same function back for an unsharded model."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    if not is_sharded(model):
        return logits_fn
    if "_root_logits" not in vars(model):
        model._root_logits = types.MethodType(lambda self, fn, batch, counted: fn(self, batch, counted), model)
        register_fsdp_forward_method(model, "_root_logits")  # torch's hook for forward methods other than forward
    return lambda root, batch, counted: root._root_logits(logits_fn, batch, counted)


@contextlib.contextmanager
def root_gathered(model):
    """For code that reaches a sharded model's parts without calling the model itself (generation through a
    wrapper that runs its embedding, layers and head one by one): the root's FSDP pre-forward is run first
    (it initialises the root and gathers the root's own parameters: embeddings, final norm), the layers still
    gather theirs in their forward; every unit is resharded after. Nothing happens for an unsharded model."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if not is_sharded(model):
        yield model
        return
    if "_gather_root" not in vars(model):
        model._gather_root = types.MethodType(lambda self: None, model)
        register_fsdp_forward_method(model, "_gather_root")  # torch's hook for forward methods other than forward
    model._gather_root()
    try:
        yield model
    finally:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0):
    """Clip by the global norm of gradients that are DTensors (FSDP shards, possibly also replicated over
    an HSDP replica dimension): each element counted once, the rows of a shard that another tensor-parallel
    rank also holds (``sharded_duplicate_rows``) left out. Returns the norm (a float tensor)."""
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        return torch.zeros(())
    norm_type = float(norm_type)
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    counted = [_counted_rows(piece, getattr(p, "sharded_duplicate_rows", ())) for p, piece in zip(params, local)]
    if math.isinf(norm_type):
        total = torch.stack([g.detach().abs().max().float() if g.numel() else g.new_zeros(()).float()
                             for g in local]).max()
        if dist.is_initialized():
            dist.all_reduce(total, op=dist.ReduceOp.MAX)
    else:
        powers, world = [], dist.get_world_size() if dist.is_initialized() else 1
        for g, piece in zip(grads, counted):
            # copies held by several ranks (HSDP's replica dimension; a tensor-parallel rank's parameter that
            # tensor parallel leaves whole, sharded over dp alone) are divided out: the world's sum counts once
            # (a dimension that splits the tensor: Shard, or FSDP's _StridedShard over a tensor-parallel Shard)
            copies = world // math.prod(g.device_mesh.size(i) for i, p in enumerate(g.placements)
                                        if not p.is_replicate()) if isinstance(g, DTensor) else world
            value = torch.linalg.vector_norm(piece.detach().float(), norm_type) ** norm_type if piece.numel() \
                else piece.new_zeros((), dtype=torch.float32)
            powers.append(value / copies)
        total = torch.stack(powers).sum()
        if dist.is_initialized():
            dist.all_reduce(total)
        total = total ** (1.0 / norm_type)
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1:
        scale = coefficient.item()
        for piece in local:  # the shards in place: the DTensor gradients follow
            piece.mul_(scale)
    return total


def _counted_rows(piece, duplicates):
    """``piece`` without the row ranges ``duplicates`` (counted by the rank holding the first copy)."""
    if not duplicates:
        return piece
    kept, start = [], 0
    for begin, end in sorted(duplicates):
        kept.append(piece[start:begin])
        start = end
    kept.append(piece[start:])
    return torch.cat([k.reshape(-1) for k in kept])


def tensor_parallel_numel(tensors) -> int:
    """Elements of ``tensors`` one tensor-parallel rank holds once gathered over data parallel: a DTensor's
    whole size over the ranks of its mesh's "tp" dimension when that dimension splits it (upstream's count
    of parameters "on model parallel rank N"); no collective."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if isinstance(t, DTensor):
            names = t.device_mesh.mesh_dim_names or ()
            split = math.prod(t.device_mesh.size(i) for i, (name, p) in enumerate(zip(names, t.placements))
                              if name == "tp" and not p.is_replicate())
            total += t.numel() // split
        else:
            total += t.numel()
    return total


def local_numel(tensors) -> int:
    """Elements this rank holds of ``tensors`` (a DTensor's local shard; a plain tensor whole)."""
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors)


# ---- whole weights out of a sharded model ----------------------------------------------------------------


def full_state_dict(model) -> dict:
    """The whole model's weights on CPU, on global rank 0 (empty elsewhere); collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def tensor_parallel_state_dict(model, dtype=None) -> dict:
    """Under tensor parallel: this rank's tensor-parallel slices of the weights, gathered over the
    data-parallel dimension only, on CPU in ``dtype`` (None: as held): what a tensor-parallel run without
    sharding saves per rank (``distributed.local_state_dict``, upstream's ``mp_rank_XX``); collective over
    the data-parallel ranks. A tensor that tensor parallel leaves whole (sharded over dp alone) comes whole."""
    from torch.distributed.tensor import DTensor, Replicate

    state = {}
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            names = value.device_mesh.mesh_dim_names or ()
            placements = [p if dim == "tp" else Replicate() for dim, p in zip(names, value.placements)]
            value = value.redistribute(value.device_mesh, placements).to_local()
        value = value.detach().cpu()
        state[name] = value.to(dtype) if dtype is not None and value.is_floating_point() else value.clone()
    return state


def unsharded_twin(model, state: dict):
    """A plain (unsharded) instance of ``model``'s class holding ``state``: built from ``model.config`` on
    the meta device, its tensors then taken from ``state``. What a family's ``save`` writes as one process
    writes it."""
    from torch.distributed.fsdp import FSDPModule

    import torch as _torch

    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with _torch.device("meta"):
        twin = cls(model.config)
    twin.load_state_dict(state, assign=True)
    for name, buffer in list(twin.named_buffers()):  # non-persistent buffers (not in the state dict)
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            source = model.get_buffer(name)
            twin.get_submodule(owner).register_buffer(leaf, source.detach().cpu().clone(), persistent=False)
    return twin.eval()


# ---- a sharded model filled from rank 0's weights (every other rank builds it on the meta device) ----------


def non_persistent_buffers(model) -> list[str]:
    """The names of ``model``'s buffers that its state dict leaves out (rotary ``inv_freq`` and the like)."""
    kept = set(model.state_dict(keep_vars=True))
    return [name for name, _ in model.named_buffers() if name not in kept]


def shard_from_rank0(model, sharding: Sharding, param_dtype=None, device="cpu", whole=None):
    """``shard_model`` for a model whose weights global rank 0 alone holds: ``model`` is built on the meta device
    (nothing read, nothing allocated) on every rank but 0, and on rank 0 too when ``whole`` (rank 0's loaded
    model, e.g. on the CPU; None elsewhere) is given, else ``model`` is rank 0's loaded model itself. Every rank's
    FSDP2 units are made, the shards allocated on ``device`` (``to_empty``) and filled from rank 0's weights by
    torch's ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`` (rank 0 broadcasts the
    tensors one by one, each rank keeps its shard); the non-persistent buffers, outside the state dict, are
    broadcast from rank 0 likewise. Collective. No rank but 0 ever holds more of the model than its shards and
    one whole tensor in flight."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank0 = dist.get_rank() == 0
    source = model if whole is None else whole
    state = dict(source.state_dict()) if rank0 else {}  # rank 0's whole tensors, kept while the model is sharded
    buffers = non_persistent_buffers(model)
    kept = {name: source.get_buffer(name) for name in buffers} if rank0 else {}
    shard_model(model, sharding, param_dtype)
    if not rank0 or whole is not None:
        model.to_empty(device=device)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del state
    with torch.no_grad():
        for name in buffers:
            buffer = model.get_buffer(name)
            if name in kept:
                buffer.copy_(kept[name])
            dist.broadcast(buffer, src=0)
    return model


def broadcast_from_rank0(value, group=None):
    """A picklable ``value`` as rank 0 of ``group`` holds it (None: the global rank 0, every rank), on every rank
    of ``group`` (collective over it)."""
    box = [value]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


def every_rank(flag: bool) -> bool:
    """True when ``flag`` is true on every rank (collective)."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return all(flags)


# ---- under tensor parallel: a sharded model filled from rank 0 of each data-parallel group ----------------------


def shard_from_dp_rank0(model, sharding: Sharding, group, param_dtype=None, device="cpu", whole=None):
    """``shard_from_rank0`` under tensor parallel (TP x FSDP2 on one (dp, tp) mesh): ``model`` is this rank's
    tensor-parallel model built on the meta device (its split layers' weights meta DTensors on the tp
    dimension), on every rank; ``whole`` is the same model loaded (e.g. on the CPU: this tensor-parallel rank's
    slices, read whole) on rank 0 of each data-parallel ``group`` (torch.distributed's; one group per
    tensor-parallel rank), None elsewhere. Every rank's FSDP2 units are made over ``sharding.mesh`` (the dp
    dimension), the shards allocated on ``device`` (``to_empty``; the duplicate-row marks ``shard_model`` made,
    ``sharded_duplicate_rows``, carried over) and filled tensor by tensor: the group's rank 0 broadcasts its
    slice over ``group`` and each rank keeps the piece FSDP2 gave it (``torch.chunk`` of the slice's rows over
    the shard dimension, as ``_mark_sharded_duplicates`` places them). The non-persistent buffers come from
    that rank likewise. Collective over ``group``. No rank but a group's rank 0 ever holds more than its shards
    and one slice of one tensor in flight."""
    from torch.distributed.tensor import DTensor

    source = dist.get_rank(group) == 0
    if (whole is not None) != source:
        raise ValueError("shard_from_dp_rank0: the loaded model (whole) on the data-parallel rank 0 alone")
    local = (lambda t: t.to_local() if isinstance(t, DTensor) else t)
    state = {name: local(value) for name, value in whole.state_dict().items()} if source else {}
    buffers = non_persistent_buffers(model)
    kept = {name: local(whole.get_buffer(name)) for name in buffers} if source else {}
    shapes = broadcast_from_rank0({name: (tuple(t.shape), t.dtype) for name, t in {**state, **kept}.items()},
                                     group)
    shard_model(model, sharding, param_dtype)
    marks = {name: p.sharded_duplicate_rows for name, p in model.named_parameters()
             if hasattr(p, "sharded_duplicate_rows")}
    model.to_empty(device=device)
    for name, rows in marks.items():  # to_empty makes new parameters, which lose the attribute
        model.get_parameter(name).sharded_duplicate_rows = rows
    mesh = sharding.mesh
    dim = "shard" if mesh.ndim == 2 else None
    ranks, rank = mesh.size(1 if dim else 0), mesh.get_local_rank(dim)
    targets = dict(model.state_dict())
    if {*targets, *buffers} != shapes.keys():  # every rank alike (shapes are the loaded model's, broadcast)
        raise RuntimeError(f"shard_from_dp_rank0: the loaded model's tensors {sorted(set(shapes) ^ set(targets))} "
                           "differ from the meta model's")
    with torch.no_grad():
        for name in [*targets, *buffers]:
            shape, dtype = shapes[name]
            held = state.pop(name) if name in state else kept.get(name)
            slice_ = held.detach().to(device) if source else torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(slice_, group=group, group_src=0)
            target = model.get_buffer(name) if name in buffers else targets[name]
            if isinstance(target, DTensor):  # an FSDP2 shard: this rank's piece of the slice's rows
                piece = target.to_local()
                chunk = -(-shape[0] // ranks) if shape else 0
                part = slice_[min(rank * chunk, shape[0]):min((rank + 1) * chunk, shape[0])]
                if piece.shape != part.shape:
                    raise RuntimeError(f"{name}: FSDP2 shard of shape {tuple(piece.shape)}, expected "
                                       f"{tuple(part.shape)} of the slice's {tuple(shape)}")
                piece.copy_(part)
            else:  # left whole (a buffer)
                local(target).copy_(slice_)
            del slice_
    return model
