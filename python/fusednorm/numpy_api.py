"""numpy interface to the CPU backend: forward and backward of LayerNorm and RMSNorm.

Arrays are host arrays. The normalized dimension is the last axis; the others are rows.
Element types: ``float32``, ``float16``, and bfloat16, which numpy lacks: pass bfloat16 data
as ``uint16`` bit patterns with ``dtype="bfloat16"`` (see :func:`float32_to_bfloat16_bits`
and :func:`bfloat16_bits_to_float32`), or as an ``ml_dtypes.bfloat16`` array.

Parameters (weight, bias) have the input's element type, or float32 with float16/bfloat16
input (fp32 master parameters). Outputs: ``y``/``dx`` of the input's element type and shape;
``mean``/``rstd`` float32 of shape ``x.shape[:-1]``; ``dweight``/``dbias`` of the parameters'
element type.

A 2-D input whose rows are evenly spaced with unit stride inside a row (e.g. ``a[:, :n]`` of a
wider array) is passed to the library as strided rows, without a copy.
"""

import numpy as np

from . import _lib

__all__ = [
    "float32_to_bfloat16_bits",
    "bfloat16_bits_to_float32",
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm_forward",
    "rms_norm_backward",
    "forward",
    "backward",
]

_DTYPE_ALIASES = {
    "float32": _lib.DTYPE_F32,
    "fp32": _lib.DTYPE_F32,
    "f32": _lib.DTYPE_F32,
    "float16": _lib.DTYPE_F16,
    "fp16": _lib.DTYPE_F16,
    "f16": _lib.DTYPE_F16,
    "half": _lib.DTYPE_F16,
    "bfloat16": _lib.DTYPE_BF16,
    "bf16": _lib.DTYPE_BF16,
}


def float32_to_bfloat16_bits(a):
    """bfloat16 bit patterns (uint16) of ``a``, rounded to nearest even; NaN stays NaN."""
    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    # Round to nearest even on the 16 bits dropped: add 0x7FFF plus the lowest kept bit.
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        # Keep the sign, force a quiet NaN (rounding could carry a NaN's payload into Inf).
        rounded = np.where(nan, ((bits >> 16).astype(np.uint16) | np.uint16(0x0040)), rounded)
    return rounded.astype(np.uint16)


def bfloat16_bits_to_float32(b):
    """float32 values of bfloat16 bit patterns (uint16); exact."""
    b = np.asarray(b)
    if b.dtype.name == "bfloat16":
        b = b.view(np.uint16)
    if b.dtype != np.uint16:
        raise TypeError(f"bfloat16 bit patterns must be uint16, got {b.dtype}")
    return (b.astype(np.uint32) << 16).view(np.float32)


def _fnorm_dtype(array, dtype, what):
    """The fnorm dtype of `array`, given an optional explicit dtype name."""
    name = array.dtype.name
    if dtype is not None:
        key = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        if key not in _DTYPE_ALIASES:
            raise TypeError(f"fusednorm: unsupported dtype {dtype!r} for {what}")
        code = _DTYPE_ALIASES[key]
        storage = {
            _lib.DTYPE_F32: ("float32",),
            _lib.DTYPE_F16: ("float16",),
            _lib.DTYPE_BF16: ("uint16", "bfloat16"),
        }[code]
        if name not in storage:
            raise TypeError(
                f"fusednorm: {what} has numpy dtype {name}, which cannot hold {key} data "
                f"(expected {' or '.join(storage)})"
            )
        return code
    if name == "float32":
        return _lib.DTYPE_F32
    if name == "float16":
        return _lib.DTYPE_F16
    if name == "bfloat16":  # ml_dtypes.bfloat16
        return _lib.DTYPE_BF16
    if name == "uint16":
        raise TypeError(
            f"fusednorm: {what} is uint16: pass dtype='bfloat16' for bfloat16 bit patterns"
        )
    raise TypeError(
        f"fusednorm: {what} has unsupported dtype {name}; the library supports float32, float16 "
        "and bfloat16 (there is no float64 kernel: convert with .astype(np.float32))"
    )


def _rows(a, cols):
    """(array, row stride in elements, 0 = packed): `a` as rows, without a copy if possible."""
    item = a.dtype.itemsize
    if a.ndim == 2 and a.flags.aligned:
        if a.flags.c_contiguous:
            return a, 0
        s0, s1 = a.strides
        if (cols == 1 or s1 == item) and s0 > 0 and s0 % item == 0 and s0 // item >= cols:
            return a, s0 // item
    return np.ascontiguousarray(a).reshape(-1, cols), 0


def _ptr(a):
    return None if a is None else a.ctypes.data


def _param(p, cols, what):
    if p is None:
        return None
    p = np.ascontiguousarray(p)
    if p.shape != (cols,):
        raise ValueError(f"fusednorm: {what} has shape {p.shape}, expected ({cols},)")
    return p


def _param_dtype(x_code, weight, bias, param_dtype):
    if param_dtype is not None:
        key = param_dtype if isinstance(param_dtype, str) else np.dtype(param_dtype).name
        if key not in _DTYPE_ALIASES:
            raise TypeError(f"fusednorm: unsupported param_dtype {param_dtype!r}")
        code = _DTYPE_ALIASES[key]
    else:
        codes = set()
        for p, what in ((weight, "weight"), (bias, "bias")):
            if p is not None:
                p = np.asarray(p)
                codes.add(
                    x_code
                    if p.dtype.name == "uint16" and x_code == _lib.DTYPE_BF16
                    else _fnorm_dtype(p, None, what)
                )
        if len(codes) > 1:
            raise TypeError("fusednorm: weight and bias have different dtypes")
        code = codes.pop() if codes else x_code
    for p, what in ((weight, "weight"), (bias, "bias")):
        if p is not None:
            _fnorm_dtype(
                np.asarray(p),
                {_lib.DTYPE_F32: "float32", _lib.DTYPE_F16: "float16", _lib.DTYPE_BF16: "bfloat16"}[
                    code
                ],
                what,
            )
    if code == x_code:
        return code, _lib.DTYPE_SAME
    if code == _lib.DTYPE_F32:
        return code, _lib.DTYPE_F32
    raise TypeError(
        f"fusednorm: parameters of {_lib.DTYPE_NAMES[code]} with input of "
        f"{_lib.DTYPE_NAMES[x_code]}: parameters must have the input's dtype or float32"
    )


def _aligned_workspace(nbytes):
    """A uint8 buffer of nbytes whose start is 16-byte aligned (the C API's requirement)."""
    if nbytes == 0:
        return None, None
    raw = np.empty(nbytes + 16, dtype=np.uint8)
    shift = (-raw.ctypes.data) % 16
    return raw, raw.ctypes.data + shift


def forward(
    norm,
    x,
    weight=None,
    bias=None,
    eps=1e-5,
    *,
    dtype=None,
    param_dtype=None,
    return_stats=True,
    cpu_threads=0,
):
    """Forward of ``norm`` (``"layer_norm"`` or ``"rms_norm"``).

    Returns ``(y, mean, rstd)``; mean is None for RMSNorm, and both stats are None when
    ``return_stats`` is false (inference).
    """
    code = _norm_code(norm)
    x = np.asarray(x)
    x_code = _fnorm_dtype(x, dtype, "x")
    if x.ndim == 0:
        raise ValueError("fusednorm: x must have at least one dimension")
    cols = x.shape[-1]
    lead = x.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    _, pd = _param_dtype(x_code, weight, bias, param_dtype)
    weight = _param(weight, cols, "weight")
    bias = _param(bias, cols, "bias")
    y = np.empty(x.shape, dtype=x.dtype)
    mean = np.empty(lead, dtype=np.float32) if return_stats and code == _lib.LAYERNORM else None
    rstd = np.empty(lead, dtype=np.float32) if return_stats else None
    if rows == 0 or cols == 0:
        if cols == 0 and rows > 0:
            raise ValueError("fusednorm: the normalized dimension has size 0")
        return y, mean, rstd
    x2, x_stride = _rows(x if x.ndim == 2 else x.reshape(-1, cols), cols)
    desc = _lib.make_desc(
        _lib.DEVICE_CPU,
        code,
        x_code,
        rows,
        cols,
        param_dtype=pd,
        eps=eps,
        x_stride=x_stride,
        cpu_threads=cpu_threads,
    )
    _lib.forward(
        desc,
        _ptr(x2),
        _ptr(y),
        gamma=_ptr(weight),
        beta=_ptr(bias),
        mean=_ptr(mean),
        rstd=_ptr(rstd),
    )
    return y, mean, rstd


def backward(
    norm,
    dy,
    rstd,
    *,
    x=None,
    y=None,
    mean=None,
    weight=None,
    bias=None,
    eps=1e-5,
    dtype=None,
    param_dtype=None,
    need_dx=True,
    need_dweight=True,
    need_dbias=True,
    cpu_threads=0,
):
    """Backward of ``norm``: returns ``(dx, dweight, dbias)``.

    Give the forward's input ``x`` (with ``mean`` for LayerNorm), or its output ``y`` (the
    memory-efficient form, which needs the forward's ``weight`` and ``bias``). ``dweight`` is
    None without a weight or when not needed, ``dbias`` likewise.
    """
    code = _norm_code(norm)
    if (x is None) == (y is None):
        raise ValueError("fusednorm: give exactly one of x and y to the backward")
    dy = np.asarray(dy)
    src = np.asarray(x if x is not None else y)
    x_code = _fnorm_dtype(dy, dtype, "dy")
    src_name = "x" if x is not None else "y"
    if _fnorm_dtype(src, _lib.DTYPE_NAMES[x_code], src_name) != x_code:
        raise TypeError(f"fusednorm: {src_name} and dy have different dtypes")
    if src.shape != dy.shape:
        raise ValueError(
            f"fusednorm: dy has shape {dy.shape} but the forward's tensor has {src.shape}"
        )
    if dy.ndim == 0:
        raise ValueError("fusednorm: dy must have at least one dimension")
    cols = dy.shape[-1]
    lead = dy.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    p_code, pd = _param_dtype(x_code, weight, bias, param_dtype)
    weight = _param(weight, cols, "weight")
    bias = _param(bias, cols, "bias")
    rstd = np.ascontiguousarray(rstd, dtype=np.float32).reshape(-1)
    if mean is not None:
        mean = np.ascontiguousarray(mean, dtype=np.float32).reshape(-1)
    for s, what in ((rstd, "rstd"), (mean, "mean")):
        if s is not None and s.shape[0] != rows:
            raise ValueError(f"fusednorm: {what} has {s.shape[0]} elements, expected {rows}")
    param_np = weight.dtype if weight is not None else (bias.dtype if bias is not None else None)
    dx = np.empty(dy.shape, dtype=dy.dtype) if need_dx else None
    dweight = np.empty(cols, dtype=param_np) if need_dweight and weight is not None else None
    dbias = np.empty(cols, dtype=param_np) if need_dbias and bias is not None else None
    if rows == 0:
        for g in (dweight, dbias):
            if g is not None:
                g.fill(0)
        return dx, dweight, dbias
    if cols == 0:
        raise ValueError("fusednorm: the normalized dimension has size 0")
    dy2, dy_stride = _rows(dy if dy.ndim == 2 else dy.reshape(-1, cols), cols)
    src2, src_stride = _rows(src if src.ndim == 2 else src.reshape(-1, cols), cols)
    desc = _lib.make_desc(
        _lib.DEVICE_CPU,
        code,
        x_code,
        rows,
        cols,
        param_dtype=pd,
        eps=eps,
        x_stride=src_stride if x is not None else 0,
        y_stride=src_stride if y is not None else 0,
        dy_stride=dy_stride,
        cpu_threads=cpu_threads,
    )
    ws_bytes = _lib.backward_workspace_size(desc)
    ws_keep, ws_ptr = _aligned_workspace(ws_bytes)
    _lib.backward(
        desc,
        _ptr(dy2),
        _ptr(rstd),
        x=_ptr(src2) if x is not None else None,
        y=_ptr(src2) if y is not None else None,
        mean=_ptr(mean),
        gamma=_ptr(weight),
        beta=_ptr(bias) if y is not None else None,
        dx=_ptr(dx),
        dgamma=_ptr(dweight),
        dbeta=_ptr(dbias),
        workspace=ws_ptr,
        workspace_bytes=ws_bytes,
    )
    del ws_keep
    return dx, dweight, dbias


def _norm_code(norm):
    if norm in ("layer_norm", _lib.LAYERNORM):
        return _lib.LAYERNORM
    if norm in ("rms_norm", _lib.RMSNORM):
        return _lib.RMSNORM
    raise ValueError(f"fusednorm: unknown norm {norm!r} (expected 'layer_norm' or 'rms_norm')")


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, **kwargs):
    """LayerNorm over the last axis: returns ``(y, mean, rstd)``."""
    return forward("layer_norm", x, weight, bias, eps, **kwargs)


def layer_norm_backward(dy, x, mean, rstd, weight=None, bias=None, **kwargs):
    """LayerNorm backward from the forward's input: returns ``(dx, dweight, dbias)``."""
    return backward("layer_norm", dy, rstd, x=x, mean=mean, weight=weight, bias=bias, **kwargs)


def rms_norm_forward(x, weight=None, bias=None, eps=1e-5, **kwargs):
    """RMSNorm over the last axis: returns ``(y, rstd)``."""
    y, _, rstd = forward("rms_norm", x, weight, bias, eps, **kwargs)
    return y, rstd


def rms_norm_backward(dy, x, rstd, weight=None, bias=None, **kwargs):
    """RMSNorm backward from the forward's input: returns ``(dx, dweight, dbias)``."""
    return backward("rms_norm", dy, rstd, x=x, weight=weight, bias=bias, **kwargs)
