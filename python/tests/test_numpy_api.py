"""CPU backend through the numpy API, against a float64 numpy reference. Needs numpy only."""

import ctypes
import pathlib
import re

import numpy as np
import pytest

import fusednorm
from fusednorm import _lib
from fusednorm import numpy_api as na

import reference

REPO = pathlib.Path(__file__).resolve().parents[2]

# dtype name -> (to storage: float32 array -> array the API takes, back to float32,
#                relative tolerance of outputs against the float64 reference)
DTYPES = {
    "float32": (lambda a: a.astype(np.float32), lambda a: a.astype(np.float32), 2e-5),
    "float16": (lambda a: a.astype(np.float16), lambda a: a.astype(np.float32), 2e-3),
    "bfloat16": (na.float32_to_bfloat16_bits, na.bfloat16_bits_to_float32, 1.6e-2),
}


def _close(got, ref, tol, what):
    """Elementwise |got - ref| <= tol * (|ref| + max|ref|): relative, with a floor set by the
    largest magnitude (cancellation in dx and in the column sums makes small entries noisy)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, what
    bound = tol * (np.abs(ref) + np.abs(ref).max())
    bad = np.abs(got - ref) > bound
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} elements off, worst "
        f"{np.abs(got - ref).max():.3g} (tolerance {tol} relative)"
    )


def _inputs(rng, shape, dtype, affine, param_f32=False):
    to, back, tol = DTYPES[dtype]
    n = shape[-1]
    x = to((rng.standard_normal(shape) * 2 + 0.5).astype(np.float32))
    p_to, p_back = (DTYPES["float32"][:2]) if param_f32 else (to, back)
    weight = p_to((1 + 0.3 * rng.standard_normal(n)).astype(np.float32)) if affine else None
    bias = p_to((0.2 * rng.standard_normal(n)).astype(np.float32)) if affine == "wb" else None
    dy = to(rng.standard_normal(shape).astype(np.float32))
    return x, weight, bias, dy, back, p_back, tol


def _f(back, a):
    return None if a is None else back(a)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("affine", [None, "w", "wb"])
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 256), (1, 1000)])
def test_forward_backward_matches_reference(norm, dtype, affine, shape):
    rng = np.random.default_rng(hash((norm, dtype, affine, shape)) % 2**32)
    x, w, b, dy, back, p_back, tol = _inputs(rng, shape, dtype, affine)
    kw = {"dtype": dtype}
    y, mean, rstd = na.forward(norm, x, w, b, eps=1e-5, **kw)
    ry, rmean, rrstd = reference.forward(norm, back(x), _f(p_back, w), _f(p_back, b), 1e-5)
    assert y.dtype == x.dtype and y.shape == x.shape
    _close(back(y), ry, tol, "y")
    _close(rstd, rrstd, 1e-5, "rstd")
    if norm == "layer_norm":
        _close(mean, rmean, 1e-5, "mean")
    else:
        assert mean is None

    dx, dw, db = na.backward(norm, dy, rstd, x=x, mean=mean, weight=w, bias=b, **kw)
    rdx, rdw, rdb = reference.backward(norm, back(dy), back(x), _f(p_back, w), 1e-5)
    _close(back(dx), rdx, tol, "dx")
    if w is None:
        assert dw is None
    else:
        assert dw.dtype == w.dtype
        _close(p_back(dw), rdw, tol, "dweight")
    if b is None:
        assert db is None
    else:
        _close(p_back(db), rdb, tol, "dbias")


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fp32_params_with_half_input(norm, dtype):
    rng = np.random.default_rng(5)
    x, w, b, dy, back, _, tol = _inputs(rng, (9, 160), dtype, "wb", param_f32=True)
    assert w.dtype == np.float32
    y, mean, rstd = na.forward(norm, x, w, b, dtype=dtype)
    ry, _, _ = reference.forward(norm, back(x), w, b)
    _close(back(y), ry, tol, "y")
    dx, dw, db = na.backward(norm, dy, rstd, x=x, mean=mean, weight=w, bias=b, dtype=dtype)
    rdx, rdw, rdb = reference.backward(norm, back(dy), back(x), w)
    assert dw.dtype == np.float32 and db.dtype == np.float32
    _close(back(dx), rdx, tol, "dx")
    # The parameter gradients are fp32 sums of exact products: much tighter than the input.
    _close(dw, rdw, 1e-4, "dweight")
    _close(db, rdb, 1e-4, "dbias")


def _record_descs(monkeypatch):
    seen = []
    real = _lib.make_desc

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(_lib, "make_desc", spy)
    return seen


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_strided_rows_are_passed_without_copy(norm, monkeypatch):
    rng = np.random.default_rng(11)
    wide = rng.standard_normal((6, 100)).astype(np.float32)
    wide_dy = rng.standard_normal((6, 120)).astype(np.float32)
    x = wide[:, 10:74]  # 64 columns, row stride 100
    dy = wide_dy[:, :64]  # row stride 120
    w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    seen = _record_descs(monkeypatch)
    y, mean, rstd = na.forward(norm, x, w)
    assert seen[-1]["x_stride"] == 100
    dx, dw, _ = na.backward(norm, dy, rstd, x=x, mean=mean, weight=w)
    assert seen[-1]["x_stride"] == 100 and seen[-1]["dy_stride"] == 120
    # Same numbers as with packed copies.
    y2, mean2, rstd2 = na.forward(norm, np.ascontiguousarray(x), w)
    dx2, dw2, _ = na.backward(
        norm, np.ascontiguousarray(dy), rstd2, x=np.ascontiguousarray(x), mean=mean2, weight=w
    )
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(dx, dx2)
    np.testing.assert_array_equal(dw, dw2)
    ry, _, _ = reference.forward(norm, x, w)
    _close(y, ry, 2e-5, "y")


def test_non_row_strided_input_is_copied(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 8)).astype(np.float32).T  # columns strided: needs a copy
    seen = _record_descs(monkeypatch)
    y, _, _ = na.forward("layer_norm", x)
    assert seen[-1]["x_stride"] == 0
    _close(y, reference.forward("layer_norm", x)[0], 2e-5, "y")


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_memory_efficient_backward_from_y(norm, dtype):
    rng = np.random.default_rng(21)
    x, w, b, dy, back, p_back, tol = _inputs(rng, (10, 96), dtype, "wb")
    y, mean, rstd = na.forward(norm, x, w, b, dtype=dtype)
    dx_x, dw_x, db_x = na.backward(norm, dy, rstd, x=x, mean=mean, weight=w, bias=b, dtype=dtype)
    dx_y, dw_y, db_y = na.backward(norm, dy, rstd, y=y, weight=w, bias=b, dtype=dtype)
    rdx, rdw, rdb = reference.backward(norm, back(dy), back(x), p_back(w))
    # From y, xhat is only as accurate as y's dtype: allow a few of its rounding errors.
    for got, ref, what in ((dx_y, rdx, "dx"), (dw_y, rdw, "dweight"), (db_y, rdb, "dbias")):
        _close(back(got), ref, 4 * tol, what)
    np.testing.assert_array_equal(db_x, db_y)  # dbias = sum(dy) either way


def test_results_are_deterministic():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((300, 257)).astype(np.float32)
    dy = rng.standard_normal((300, 257)).astype(np.float32)
    w = rng.standard_normal(257).astype(np.float32)
    runs = []
    for _ in range(2):
        y, mean, rstd = na.forward("layer_norm", x, w, w)
        runs.append((y, *na.backward("layer_norm", dy, rstd, x=x, mean=mean, weight=w, bias=w)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_inference_without_stats():
    x = np.random.default_rng(1).standard_normal((4, 50)).astype(np.float32)
    y, mean, rstd = na.forward("layer_norm", x, return_stats=False)
    assert mean is None and rstd is None
    _close(y, reference.forward("layer_norm", x)[0], 2e-5, "y")


def test_bad_eps_raises_fused_norm_error():
    x = np.ones((3, 8), dtype=np.float16)
    with pytest.raises(fusednorm.FusedNormError) as info:
        na.forward("layer_norm", x, eps=0.0)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.status_name == "FNORM_ERR_BAD_EPS"
    assert err.status == 4
    assert err.shape == (3, 8) and err.device == "cpu" and err.dtype == "float16"
    assert "FNORM_ERR_BAD_EPS" in str(err) and "layer_norm forward" in str(err)
    assert err.status_string == _lib.status_string(4)


def test_too_small_workspace_is_reported():
    x = np.ones((3, 8), dtype=np.float32)
    desc = _lib.make_desc(_lib.DEVICE_CPU, _lib.LAYERNORM, _lib.DTYPE_F32, 3, 8)
    need = _lib.backward_workspace_size(desc)
    if need == 0:
        pytest.skip("the CPU backend needs no workspace for this shape")
    rstd = np.ones(3, np.float32)
    dx = np.empty_like(x)
    with pytest.raises(fusednorm.FusedNormError) as info:
        _lib.backward(
            desc,
            x.ctypes.data,
            rstd.ctypes.data,
            x=x.ctypes.data,
            mean=rstd.ctypes.data,
            dx=dx.ctypes.data,
            workspace=None,
            workspace_bytes=0,
        )
    assert info.value.status_name == "FNORM_ERR_WORKSPACE_TOO_SMALL"


def test_unsupported_dtypes_raise_type_error():
    with pytest.raises(TypeError, match="float64"):
        na.forward("layer_norm", np.ones((2, 4)))
    with pytest.raises(TypeError, match="bfloat16"):
        na.forward("layer_norm", np.ones((2, 4), dtype=np.uint16))
    with pytest.raises(TypeError, match="int32"):
        na.forward("rms_norm", np.ones((2, 4), dtype=np.int32))
    with pytest.raises(TypeError):  # fp16 parameters with bf16 input: not a supported pair
        na.forward("layer_norm", np.ones((2, 4), np.uint16), np.ones(4, np.float16), dtype="bf16")


def test_bfloat16_conversions():
    f = np.array([1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, 3.0e38, 1e-40], dtype=np.float32)
    bits = na.float32_to_bfloat16_bits(f)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(na.bfloat16_bits_to_float32(bits)[:6], f[:6])
    assert bits[0] == 0x3F80 and bits[1] == 0xC020
    # Ties round to even; above a tie rounds up.
    ties = np.array([0x3F808000, 0x3F818000, 0x3F808001], dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(na.float32_to_bfloat16_bits(ties), [0x3F80, 0x3F82, 0x3F81])
    # The largest float32 rounds to infinity; NaN stays NaN (sign kept).
    assert na.float32_to_bfloat16_bits(np.float32(3.4028235e38)) == 0x7F80
    nan_bits = na.float32_to_bfloat16_bits(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(na.bfloat16_bits_to_float32(nan_bits)).all()
    assert nan_bits[1] & 0x8000
    # Every bfloat16 value survives a round trip.
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = na.bfloat16_bits_to_float32(every)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(na.float32_to_bfloat16_bits(values)[finite], every[finite])


def test_struct_layouts_and_version():
    assert ctypes.sizeof(_lib.Desc) == 80
    assert ctypes.sizeof(_lib.ForwardArgs) == 48
    assert ctypes.sizeof(_lib.BackwardArgs) == 80
    assert _lib.Desc.eps.offset == 32 and _lib.Desc.x_stride.offset == 40
    header = (REPO / "include" / "fusednorm.h").read_text()
    parts = [
        re.search(rf"#define FNORM_VERSION_{p} (\d+)", header).group(1)
        for p in ("MAJOR", "MINOR", "PATCH")
    ]
    assert fusednorm.__version__ == ".".join(parts) == fusednorm.library_version()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == fusednorm.__version__


def test_layout_checker_detects_a_mismatch():
    offsets, size = _lib._c_layout([("a", 4, 4), ("b", 8, 8), ("c", 4, 4)])
    assert offsets == {"a": 0, "b": 8, "c": 16} and size == 24
    assert _lib._c_layout(_lib._EXPECTED_FIELDS[_lib.Desc])[1] == 80


def _import_in_subprocess(env_library):
    import os
    import subprocess
    import sys

    env = dict(
        os.environ,
        FUSEDNORM_LIBRARY=env_library,
        PYTHONPATH=str(pathlib.Path(fusednorm.__file__).resolve().parents[1]),
    )
    return subprocess.run(
        [sys.executable, "-c", "import fusednorm; print(fusednorm.library_path)"],
        env=env,
        capture_output=True,
        text=True,
    )


def test_library_override_is_honoured_or_fails_loudly(tmp_path):
    ok = _import_in_subprocess(str(_lib.library_path))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(_lib.library_path)
    missing = _import_in_subprocess(str(tmp_path / "libfusednorm.so"))
    assert missing.returncode != 0
    assert "FUSEDNORM_LIBRARY names no file" in missing.stderr
    not_a_library = tmp_path / "libfusednorm.so"
    not_a_library.write_text("not an ELF file")
    bad = _import_in_subprocess(str(not_a_library))
    assert bad.returncode != 0 and "cannot load libfusednorm.so" in bad.stderr
