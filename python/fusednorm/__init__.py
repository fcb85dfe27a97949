"""fusednorm: fused LayerNorm and RMSNorm (forward and backward) for NVIDIA GPUs and the CPU.

With PyTorch installed:
    fusednorm.layer_norm / fusednorm.rms_norm   -- torch.nn.functional semantics
    fusednorm.LayerNorm / fusednorm.RMSNorm     -- drop-in nn.Module subclasses
    fusednorm.replace_norms(model)              -- swap a model's norm layers in place
Without it (numpy only): fusednorm.numpy_api, on the CPU backend.
Errors from the C library raise fusednorm.FusedNormError.
"""

from ._lib import FusedNormError, library_path
from ._lib import version as library_version

# Kept equal to FNORM_VERSION_* in include/fusednorm.h (a test checks it).
__version__ = "0.1.0"

if library_version() != __version__:
    raise ImportError(
        f"fusednorm: the Python package is {__version__} but {library_path} is "
        f"{library_version()}; rebuild or reinstall so that both match"
    )

__all__ = ["FusedNormError", "library_path", "library_version", "__version__"]

try:
    from . import numpy_api  # noqa: F401

    __all__.append("numpy_api")
except ImportError:  # numpy missing: only the torch layer (if any) is usable
    pass

try:
    import torch  # noqa: F401
except ImportError:
    _HAVE_TORCH = False
else:
    _HAVE_TORCH = True

# The names that need PyTorch: exported with it, a clear AttributeError without it.
_TORCH_NAMES = (
    "layer_norm",
    "rms_norm",
    "norm_forward",
    "norm_backward",
    "LayerNorm",
    "RMSNorm",
    "HFStyleRMSNorm",
    "replace_norms",
)

if _HAVE_TORCH:
    from .modules import HFStyleRMSNorm, LayerNorm, RMSNorm, replace_norms
    from .ops import layer_norm, norm_backward, norm_forward, rms_norm

    __all__ += list(_TORCH_NAMES)


def __getattr__(name):
    if name in _TORCH_NAMES or name in ("ops", "modules"):
        raise AttributeError(f"fusednorm.{name} needs PyTorch, which is not installed")
    raise AttributeError(f"module 'fusednorm' has no attribute {name!r}")
