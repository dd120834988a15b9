"""``amp_C``, apex's multi-tensor CUDA extension, on ``torch._foreach_*`` (see :mod:`shim.ops.multi_tensor`)."""

from shim.ops.multi_tensor import (  # noqa: F401
    NOT_PROVIDED,
    multi_tensor_adagrad,
    multi_tensor_adam,
    multi_tensor_adam_capturable,
    multi_tensor_adam_capturable_master,
    multi_tensor_axpby,
    multi_tensor_l2norm,
    multi_tensor_l2norm_mp,
    multi_tensor_l2norm_scale,
    multi_tensor_scale,
    multi_tensor_sgd,
    multi_tensor_unscale_l2norm,
)

__all__ = ['multi_tensor_adagrad', 'multi_tensor_adam', 'multi_tensor_adam_capturable', 'multi_tensor_adam_capturable_master', 'multi_tensor_axpby', 'multi_tensor_l2norm', 'multi_tensor_l2norm_mp', 'multi_tensor_l2norm_scale', 'multi_tensor_scale', 'multi_tensor_sgd', 'multi_tensor_unscale_l2norm']


def __getattr__(name: str):
    if name in NOT_PROVIDED:
        raise AttributeError(f"amp_C.{name} ({NOT_PROVIDED[name]}) has no shim equivalent: use a torch.optim optimizer")
    raise AttributeError(f"module 'amp_C' (shim stand-in) has no attribute {name!r}")
