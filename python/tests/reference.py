"""float64 numpy reference of LayerNorm / RMSNorm forward and backward (rows = leading axes)."""

import numpy as np


def forward(norm, x, weight=None, bias=None, eps=1e-5):
    """Returns (y, mean, rstd) in float64; mean is None for RMSNorm."""
    x = np.asarray(x, dtype=np.float64)
    if norm == "layer_norm":
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    else:
        mean = np.zeros(x.shape[:-1] + (1,))
        var = (x**2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    return y, (mean[..., 0] if norm == "layer_norm" else None), rstd[..., 0]


def backward(norm, dy, x, weight=None, eps=1e-5):
    """Returns (dx, dweight, dbias) in float64 (dweight/dbias summed over all rows)."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    _, mean, rstd = forward(norm, x, eps=eps)
    mean = np.zeros_like(rstd) if mean is None else mean
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy if weight is None else dy * np.asarray(weight, dtype=np.float64)
    c2 = (g * xhat).mean(axis=-1, keepdims=True)
    if norm == "layer_norm":
        c1 = g.mean(axis=-1, keepdims=True)
        dx = (g - c1 - xhat * c2) * rstd[..., None]
    else:
        dx = (g - xhat * c2) * rstd[..., None]
    n = x.shape[-1]
    dweight = (dy * xhat).reshape(-1, n).sum(axis=0)
    dbias = dy.reshape(-1, n).sum(axis=0)
    return dx, dweight, dbias
