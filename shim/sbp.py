"""OneFlow's SBP signatures, which are DTensor placements.

=====================  ==========================  =====================================
OneFlow                DTensor                     each rank holds
=====================  ==========================  =====================================
``sbp.split(dim)``     ``Shard(dim)``              one contiguous slice along ``dim``
``sbp.broadcast``      ``Replicate()``             the whole tensor
``sbp.partial_sum``    ``Partial("sum")``          a summand; the tensor is their sum
=====================  ==========================  =====================================
"""

from torch.distributed.tensor import Partial, Placement, Replicate, Shard

__all__ = ["broadcast", "partial_sum", "sbp", "split"]

# The type of every SBP value, as ``oneflow.sbp.sbp``.
sbp = Placement

broadcast = Replicate()
partial_sum = Partial("sum")


def split(dim: int) -> Shard:
    """Each rank holds one contiguous slice along ``dim``."""
    return Shard(dim)
