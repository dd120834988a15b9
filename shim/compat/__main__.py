"""``python -m shim.compat``: list what ``shim.compat.install()`` would change on this machine (changes nothing)."""

import argparse

import shim.compat
from shim._device import active_device


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m shim.compat",
        description="List the torch attributes shim.compat.install() would patch here, without patching them. "
        "What is patched depends on the active device (SHIM_DEVICE, else cuda:LOCAL_RANK when CUDA is "
        "available, else cpu): on a CUDA device only torch._six and torch.load's old weights_only=False default.",
    )
    parser.parse_args()
    changes = shim.compat.planned_changes()
    print(f"active device: {active_device()}; install() would patch {len(changes)} attributes:")
    for name in changes:
        print(f"  {name}")


if __name__ == "__main__":
    main()
