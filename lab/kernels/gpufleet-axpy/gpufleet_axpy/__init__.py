"""gpufleet-axpy: ``axpy(alpha, x, y)`` computes ``y <- alpha * x + y`` in place with a CUDA kernel.

Importing the package loads the compiled extension (``gpufleet_axpy._C``): that needs the CUDA runtime
and torch of the build (no GPU); calling ``axpy`` needs a GPU of an architecture the wheel was built for.
"""

import torch  # noqa: F401 - loads libtorch and the CUDA runtime before the extension

from gpufleet_axpy import _C

__version__ = "0.1.0"


def axpy(alpha: float, x, y):
    """``y <- alpha * x + y`` (CUDA tensors of the same shape and dtype, contiguous); returns ``y``."""
    return _C.axpy(float(alpha), x, y)
