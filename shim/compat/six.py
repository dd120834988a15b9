"""Stand-in for ``torch._six``, removed in torch 2.0: what GLM-era code imported from it."""

import collections.abc as container_abcs
import math

inf = math.inf
nan = math.nan
string_classes = (str, bytes)
int_classes = int

__all__ = ["inf", "nan", "string_classes", "int_classes", "container_abcs"]
