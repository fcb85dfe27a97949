"""PyTorch operators over the C library: ``fusednorm::norm_fwd`` and ``fusednorm::norm_bwd``.

One pair of custom ops serves both norms (``is_rms`` selects RMSNorm). They are opaque to
torch.compile (no graph break), have fake (meta) implementations for tracing, and are linked
by ``register_autograd``. CUDA tensors run on the current stream of their device; CPU tensors
run on the CPU backend. Eager calls that nothing traces (no torch.compile, dispatch or function
mode, or torch.func transform) skip the ops' dispatch and run the same implementation directly
(with a plain ``autograd.Function`` when a graph is recorded): the same results, bitwise, for
about half the host time a call.

Numerics and dtypes:
  * Inputs of float32, float16 or bfloat16; statistics and reductions in fp32 inside the
    kernels; the output has the input's dtype.
  * Parameters have the input's dtype, or float32 with float16/bfloat16 input (fp32 master
    weights); the public functions cast other combinations to one of these.
  * Under ``torch.autocast`` PyTorch's own ``layer_norm`` is on the "run in fp32" list and
    returns fp32. These ops keep the input's dtype instead (computing in fp32 inside, as
    Apex and Liger do) and return the input's dtype, so a bf16 activation stays bf16.
"""

import functools
import math
from typing import Optional, Sequence, Tuple, Union

import torch

from . import _lib

__all__ = ["layer_norm", "rms_norm", "norm_forward", "norm_backward"]

_DTYPE_CODES = {
    torch.float32: _lib.DTYPE_F32,
    torch.float16: _lib.DTYPE_F16,
    torch.bfloat16: _lib.DTYPE_BF16,
}


def _check_tensor(t, what, op):
    if t.dtype not in _DTYPE_CODES:
        raise TypeError(
            f"fusednorm.{op}: {what} has dtype {t.dtype}; supported dtypes are torch.float32, "
            "torch.float16 and torch.bfloat16"
            + (" (the library has no float64 kernels)" if t.dtype == torch.float64 else "")
        )
    if t.device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(
            f"fusednorm.{op}: {what} is on device {t.device}; supported devices are cpu and cuda"
        )


def _device_code(t):
    return _lib.DEVICE_CUDA if t.device.type == "cuda" else _lib.DEVICE_CPU


def _param_dtype_code(x, weight, bias, op):
    """The C param_dtype for these tensors (SAME or F32), or a TypeError."""
    dtypes = {p.dtype for p in (weight, bias) if p is not None}
    if not dtypes or dtypes == {x.dtype}:
        return _lib.DTYPE_SAME
    if dtypes == {torch.float32} and x.dtype in (torch.float16, torch.bfloat16):
        return _lib.DTYPE_F32
    raise TypeError(
        f"fusednorm.{op}: parameters of dtype {sorted(map(str, dtypes))} with input of dtype "
        f"{x.dtype}: parameters must have the input's dtype, or float32 with float16/bfloat16 input"
    )


def _row_stride(t, n):
    """Row stride (elements) viewing t, whose trailing dims hold n elements, as [rows][stride].

    The trailing block must be packed with unit stride and the leading dims must collapse to one
    dim with a stride >= n. Returns None when no such view exists (the caller copies).
    """
    if t.is_contiguous():
        return n
    sizes, strides = t.shape, t.stride()
    dim = t.dim() - 1
    expected = 1
    count = 1
    while count < n:
        if sizes[dim] != 1 and strides[dim] != expected:
            return None
        expected *= sizes[dim]
        count *= sizes[dim]
        dim -= 1
    if count != n:
        return None
    row_stride = None
    for d in range(dim, -1, -1):
        if sizes[d] == 1:
            continue
        if row_stride is None:
            row_stride = strides[d]
            expected = strides[d] * sizes[d]
        elif strides[d] != expected:
            return None
        else:
            expected *= sizes[d]
    if row_stride is None:  # a single row
        return n
    return row_stride if row_stride >= n else None


def _as_rows(t, n):
    """(tensor, row stride) for the C call: t itself when it is a strided row view, else a copy."""
    stride = _row_stride(t, n)
    if stride is None:
        t = t.contiguous()
        stride = n
    return t, stride


def _ptr(t):
    return None if t is None else t.data_ptr()


class _OnDevice:
    """Context in which the C call runs: the tensor's CUDA device and its current stream."""

    def __init__(self, t):
        self.cuda = t.device.type == "cuda"
        self.device = t.device
        self._ctx = None

    def __enter__(self):
        if not self.cuda:
            return None
        self._ctx = torch.cuda.device(self.device)
        self._ctx.__enter__()
        return torch.cuda.current_stream(self.device).cuda_stream

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


def _cpu_threads(t):
    # The CPU backend uses OpenMP; follow torch's thread setting so both agree.
    return torch.get_num_threads() if t.device.type == "cpu" else 0


def _direct(*tensors):
    """True when a C call may skip the op's dispatch (saving tens of microseconds of host time a
    call): outside torch.compile, with no dispatch or function mode and no torch.func transform
    active (tracing, fake tensors, functionalization, vmap/grad and a user's modes all see the
    op), on plain CPU or CUDA tensors (meta tensors take the op's fake implementation)."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() != 0
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
    ):
        return False
    for t in tensors:  # (a loop: a generator costs more than the call it would save)
        if t is not None and (type(t) not in _PLAIN_TYPES or t.device.type not in _DEVICE_TYPES):
            return False
    return True


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_DEVICE_TYPES = ("cpu", "cuda")


@functools.lru_cache(maxsize=512)
def _desc(*args, **kwargs):
    """_lib.make_desc, built once per shape and option set (the C calls only read it); looked
    up at each miss, so that a test's spy on it sees the arguments."""
    return _lib.make_desc(*args, **kwargs)


def _fwd_outputs(x, n, is_rms):
    rows = x.numel() // n
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty((0 if is_rms else rows,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    return y, mean, rstd


def _norm_fwd_impl(x, weight, bias, n, is_rms, eps):
    op = "rms_norm" if is_rms else "layer_norm"
    _check_tensor(x, "input", op)
    pd = _param_dtype_code(x, weight, bias, op)
    y, mean, rstd = _fwd_outputs(x, n, is_rms)
    rows = x.numel() // n
    if rows == 0:
        return y, mean, rstd
    x2, x_stride = _as_rows(x, n)
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    desc = _desc(
        _device_code(x),
        _lib.RMSNORM if is_rms else _lib.LAYERNORM,
        _DTYPE_CODES[x.dtype],
        rows,
        n,
        param_dtype=pd,
        eps=eps,
        x_stride=x_stride,
        cpu_threads=_cpu_threads(x),
    )
    with _OnDevice(x) as stream:
        _lib.forward(
            desc,
            _ptr(x2),
            _ptr(y),
            gamma=_ptr(w),
            beta=_ptr(b),
            mean=None if is_rms else _ptr(mean),
            rstd=_ptr(rstd),
            stream=stream,
        )
    return y, mean, rstd


@torch.library.custom_op("fusednorm::norm_fwd", mutates_args=())
def norm_fwd(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    n: int,
    is_rms: bool,
    eps: float,
    memory_efficient: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalizes each run of n trailing elements of x.

    Returns (y, mean, rstd): y contiguous with x's shape and dtype; mean and rstd fp32 with one
    entry per row (mean is empty for RMSNorm). memory_efficient only changes what autograd
    saves (y instead of x).
    """
    return _norm_fwd_impl(x, weight, bias, n, is_rms, eps)


def _no_graph(*tensors):
    """True when autograd records nothing for a call on these tensors."""
    return not torch.is_grad_enabled() or not any(
        t is not None and t.requires_grad for t in tensors
    )


def _forward(x, weight, bias, n, is_rms, eps, memory_efficient):
    """norm_fwd, or, when nothing needs to see the op (_direct), its implementation: called
    directly when autograd records nothing, else through _EagerNorm (the same saved tensors
    and backward as the op's autograd registration, at a fraction of its host time)."""
    if _direct(x, weight, bias):
        if _no_graph(x, weight, bias):
            return _norm_fwd_impl(x, weight, bias, n, is_rms, eps)
        return _EagerNorm.apply(x, weight, bias, n, is_rms, eps, memory_efficient)
    return torch.ops.fusednorm.norm_fwd(x, weight, bias, n, is_rms, eps, memory_efficient)


@norm_fwd.register_fake
def _norm_fwd_fake(x, weight, bias, n, is_rms, eps, memory_efficient):
    return _fwd_outputs(x, n, is_rms)


def _bwd_outputs(dy, weight, bias, need_dx, need_dweight, need_dbias):
    # Gradients not asked for are empty tensors: a custom op returns tensors, not None.
    dx = torch.empty(dy.shape if need_dx else (0,), dtype=dy.dtype, device=dy.device)
    dw_dtype = weight.dtype if weight is not None else dy.dtype
    dw = torch.empty(
        weight.shape if need_dweight and weight is not None else (0,),
        dtype=dw_dtype,
        device=dy.device,
    )
    db_dtype = bias.dtype if bias is not None else dw_dtype
    db = torch.empty(
        bias.shape if need_dbias and bias is not None else (0,), dtype=db_dtype, device=dy.device
    )
    return dx, dw, db


def _norm_bwd_impl(
    dy, saved, mean, rstd, weight, bias, n, is_rms, eps, saved_is_y, need_dx, need_dw, need_db
):
    op = "rms_norm" if is_rms else "layer_norm"
    _check_tensor(dy, "grad_output", op)
    pd = _param_dtype_code(dy, weight, bias, op)
    dx, dw, db = _bwd_outputs(dy, weight, bias, need_dx, need_dw, need_db)
    rows = dy.numel() // n
    if rows == 0:
        dw.zero_()
        db.zero_()
        return dx, dw, db
    if saved.dtype != dy.dtype:
        raise TypeError(
            f"fusednorm.{op} backward: saved tensor {saved.dtype} and grad {dy.dtype} differ"
        )
    dy2, dy_stride = _as_rows(dy, n)
    s2, s_stride = _as_rows(saved, n)
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    desc = _desc(
        _device_code(dy),
        _lib.RMSNORM if is_rms else _lib.LAYERNORM,
        _DTYPE_CODES[dy.dtype],
        rows,
        n,
        param_dtype=pd,
        eps=eps,
        x_stride=0 if saved_is_y else s_stride,
        y_stride=s_stride if saved_is_y else 0,
        dy_stride=dy_stride,
        cpu_threads=_cpu_threads(dy),
    )
    with _OnDevice(dy) as stream:
        ws_bytes = _lib.backward_workspace_size(desc)
        # The caching allocator serves this (and inside CUDA graph capture, the graph's pool);
        # its blocks are 512-byte aligned, above the 16 bytes the C API asks.
        ws = torch.empty((ws_bytes,), dtype=torch.uint8, device=dy.device) if ws_bytes else None
        _lib.backward(
            desc,
            _ptr(dy2),
            _ptr(rstd),
            x=None if saved_is_y else _ptr(s2),
            y=_ptr(s2) if saved_is_y else None,
            mean=None if (saved_is_y or is_rms) else _ptr(mean),
            gamma=_ptr(w),
            beta=_ptr(b) if saved_is_y else None,
            dx=_ptr(dx) if need_dx else None,
            dgamma=_ptr(dw) if need_dw and weight is not None else None,
            dbeta=_ptr(db) if need_db and bias is not None else None,
            workspace=_ptr(ws),
            workspace_bytes=ws_bytes,
            stream=stream,
        )
    return dx, dw, db


@torch.library.custom_op("fusednorm::norm_bwd", mutates_args=())
def norm_bwd(
    dy: torch.Tensor,
    saved: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    n: int,
    is_rms: bool,
    eps: float,
    saved_is_y: bool,
    need_dx: bool,
    need_dweight: bool,
    need_dbias: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of norm_fwd: returns (dx, dweight, dbias), each empty when not requested.

    `saved` is the forward's input x (with mean for LayerNorm), or with saved_is_y its output y
    (the memory-efficient form, which needs weight and bias as the forward had them; weight must
    have no zero).
    """
    flags = (saved_is_y, need_dx, need_dweight, need_dbias)
    return _norm_bwd_impl(dy, saved, mean, rstd, weight, bias, n, is_rms, eps, *flags)


@norm_bwd.register_fake
def _norm_bwd_fake(
    dy,
    saved,
    mean,
    rstd,
    weight,
    bias,
    n,
    is_rms,
    eps,
    saved_is_y,
    need_dx,
    need_dweight,
    need_dbias,
):
    return _bwd_outputs(dy, weight, bias, need_dx, need_dweight, need_dbias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, n, is_rms, eps, memory_efficient = inputs
    y, mean, rstd = output
    ctx.save_for_backward(y if memory_efficient else x, mean, rstd, weight, bias)
    ctx.n = n
    ctx.is_rms = is_rms
    ctx.eps = eps
    ctx.memory_efficient = memory_efficient
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, dy, _dmean, _drstd):
    saved, mean, rstd, weight, bias = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    # The engine runs this with grad mode off unless create_graph asked for a graph of the
    # backward, which only the op (raising, having no autograd) handles as PyTorch would.
    direct = not torch.is_grad_enabled() and _direct(dy, saved, mean, rstd, weight, bias)
    dx, dw, db = (_norm_bwd_impl if direct else torch.ops.fusednorm.norm_bwd)(
        dy,
        saved,
        mean,
        rstd,
        weight,
        bias,
        ctx.n,
        ctx.is_rms,
        ctx.eps,
        ctx.memory_efficient,
        need_dx,
        need_dw and weight is not None,
        need_db and bias is not None,
    )
    return (
        dx if need_dx else None,
        dw if need_dw and weight is not None else None,
        db if need_db and bias is not None else None,
        None,
        None,
        None,
        None,
    )


torch.library.register_autograd("fusednorm::norm_fwd", _backward, setup_context=_setup_context)


class _EagerNorm(torch.autograd.Function):
    """norm_fwd's autograd, for eager calls that nothing traces (see _forward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, n, is_rms, eps, memory_efficient):
        out = _norm_fwd_impl(x, weight, bias, n, is_rms, eps)
        _setup_context(ctx, (x, weight, bias, n, is_rms, eps, memory_efficient), out)
        return out

    @staticmethod
    def backward(ctx, dy, dmean, drstd):
        return _backward(ctx, dy, dmean, drstd)


# ---------------------------------------------------------------------------------------------
# Public functions with the semantics of torch.nn.functional.layer_norm / rms_norm.
# ---------------------------------------------------------------------------------------------
_ShapeLike = Union[int, Sequence[int], torch.Size]


def _normalized(normalized_shape):
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _prepare(op, x, normalized_shape, weight, bias):
    """Checks shapes like torch does; returns (normalized shape, n, weight, bias) with the
    parameters cast to a dtype the library takes."""
    shape = _normalized(normalized_shape)
    if len(shape) == 0:
        raise RuntimeError(f"fusednorm.{op}: normalized_shape must have at least one dimension")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise RuntimeError(
            f"fusednorm.{op}: given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], but got input of size {list(x.shape)}"
        )
    _check_tensor(x, "input", op)
    for p, what in ((weight, "weight"), (bias, "bias")):
        if p is None:
            continue
        if tuple(p.shape) != shape:
            raise RuntimeError(
                f"fusednorm.{op}: expected {what} of shape {list(shape)}, got {list(p.shape)}"
            )
        _check_tensor(p, what, op)
        if p.device != x.device:
            raise RuntimeError(
                f"fusednorm.{op}: {what} is on {p.device} but the input is on {x.device}"
            )
    n = math.prod(shape)
    if n == 0:
        raise RuntimeError(f"fusednorm.{op}: normalized_shape {list(shape)} has no elements")
    # Parameters of another dtype are cast (differentiably) to the input's dtype, or to fp32
    # when the input is half precision and any parameter is fp32 (fp32 master weights).
    params = [p for p in (weight, bias) if p is not None]
    if x.dtype != torch.float32 and any(p.dtype == torch.float32 for p in params):
        target = torch.float32
    else:
        target = x.dtype
    weight = weight if weight is None or weight.dtype == target else weight.to(target)
    bias = bias if bias is None or bias.dtype == target else bias.to(target)
    return shape, n, weight, bias


def layer_norm(
    input: torch.Tensor,
    normalized_shape: _ShapeLike,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    memory_efficient: bool = False,
) -> torch.Tensor:
    """LayerNorm with the semantics of ``torch.nn.functional.layer_norm``.

    ``memory_efficient=True`` saves the output instead of the input for the backward (which
    then recovers the normalized input from it); the weight must then have no zero.
    """
    _, n, weight, bias = _prepare("layer_norm", input, normalized_shape, weight, bias)
    y, _, _ = _forward(input, weight, bias, n, False, float(eps), memory_efficient)
    return y


def rms_norm(
    input: torch.Tensor,
    normalized_shape: _ShapeLike,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    *,
    memory_efficient: bool = False,
) -> torch.Tensor:
    """RMSNorm with the semantics of ``torch.nn.functional.rms_norm``.

    ``eps=None`` means ``torch.finfo(input.dtype).eps``, as in PyTorch.
    """
    _, n, weight, _ = _prepare("rms_norm", input, normalized_shape, weight, None)
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    y, _, _ = _forward(input, weight, None, n, True, float(eps), memory_efficient)
    return y


def norm_forward(
    input, normalized_shape, weight=None, bias=None, eps=1e-5, *, rms=False, memory_efficient=False
):
    """Like layer_norm / rms_norm, but returns ``(y, mean, rstd)`` (mean empty for RMSNorm)."""
    op = "rms_norm" if rms else "layer_norm"
    _, n, weight, bias = _prepare(op, input, normalized_shape, weight, bias)
    return _forward(input, weight, bias, n, rms, float(eps), memory_efficient)


def norm_backward(
    grad_output,
    input,
    mean,
    rstd,
    normalized_shape,
    weight=None,
    bias=None,
    *,
    rms=False,
    eps=1e-5,
    from_output=False,
):
    """The backward kernel on its own: returns ``(dx, dweight, dbias)`` (None where absent).

    With ``from_output=True``, ``input`` is the forward's output y (memory-efficient form).
    """
    op = "rms_norm" if rms else "layer_norm"
    _, n, weight, bias = _prepare(op, grad_output, normalized_shape, weight, bias)
    tensors = (grad_output, input, mean, rstd, weight, bias)
    direct = _no_graph(*tensors) and _direct(*tensors)
    dx, dw, db = (_norm_bwd_impl if direct else torch.ops.fusednorm.norm_bwd)(
        grad_output,
        input,
        mean,
        rstd,
        weight,
        bias,
        n,
        rms,
        float(eps),
        from_output,
        True,
        weight is not None,
        bias is not None,
    )
    return dx, (dw if weight is not None else None), (db if bias is not None else None)
