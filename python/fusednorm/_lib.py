"""ctypes binding of the fusednorm C library (include/fusednorm.h).

This module has no dependency beyond the standard library. It finds and loads
``libfusednorm.so``, mirrors the public structs, declares every function's signature,
checks at import time that the Python and C views of the structs agree, and turns a
non-success status into :class:`FusedNormError`.
"""

import ctypes
import os
import pathlib

__all__ = [
    "FusedNormError",
    "Desc",
    "ForwardArgs",
    "BackwardArgs",
    "DEVICE_CPU",
    "DEVICE_CUDA",
    "LAYERNORM",
    "RMSNORM",
    "DTYPE_SAME",
    "DTYPE_F32",
    "DTYPE_F16",
    "DTYPE_BF16",
    "DTYPE_NAMES",
    "library_path",
    "lib",
    "version",
    "status_name",
    "status_string",
    "device_available",
    "make_desc",
    "forward",
    "backward_workspace_size",
    "backward",
]

# Enumerations; the C enums are `int`. The values are fixed by the header.
DEVICE_CPU = 1
DEVICE_CUDA = 2
LAYERNORM = 1
RMSNORM = 2
DTYPE_SAME = 0
DTYPE_F32 = 1
DTYPE_F16 = 2
DTYPE_BF16 = 3
DTYPE_NAMES = {
    DTYPE_SAME: "same",
    DTYPE_F32: "float32",
    DTYPE_F16: "float16",
    DTYPE_BF16: "bfloat16",
}
_NORM_NAMES = {LAYERNORM: "layer_norm", RMSNORM: "rms_norm"}
_DEVICE_NAMES = {DEVICE_CPU: "cpu", DEVICE_CUDA: "cuda"}

_c_enum = ctypes.c_int


class Desc(ctypes.Structure):
    """Mirror of ``fnorm_desc``: same fields, same order, same C types."""

    _fields_ = [
        ("device", _c_enum),
        ("norm", _c_enum),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("dtype", _c_enum),
        ("param_dtype", _c_enum),
        ("eps", ctypes.c_float),
        ("x_stride", ctypes.c_int64),
        ("y_stride", ctypes.c_int64),
        ("dy_stride", ctypes.c_int64),
        ("dx_stride", ctypes.c_int64),
        ("cpu_threads", ctypes.c_int),
        ("flags", ctypes.c_uint32),
    ]


class ForwardArgs(ctypes.Structure):
    """Mirror of ``fnorm_forward_args``."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("gamma", ctypes.c_void_p),
        ("beta", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("mean", ctypes.c_void_p),  # float *
        ("rstd", ctypes.c_void_p),  # float *
    ]


class BackwardArgs(ctypes.Structure):
    """Mirror of ``fnorm_backward_args``."""

    _fields_ = [
        ("dy", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("mean", ctypes.c_void_p),  # const float *
        ("rstd", ctypes.c_void_p),  # const float *
        ("gamma", ctypes.c_void_p),
        ("beta", ctypes.c_void_p),
        ("dx", ctypes.c_void_p),
        ("dgamma", ctypes.c_void_p),
        ("dbeta", ctypes.c_void_p),
    ]


# Field layouts as the header declares them, as (name, size, alignment) on an LP64 ABI
# (Linux x86-64 and aarch64: int 4, int64_t 8, float 4, pointers 8). They are laid out below
# by the C rules, independently of ctypes, and the result must agree with ctypes: a
# disagreement means the header changed without this file, and calling would corrupt memory.
_EXPECTED_FIELDS = {
    Desc: [
        ("device", 4, 4),
        ("norm", 4, 4),
        ("rows", 8, 8),
        ("cols", 8, 8),
        ("dtype", 4, 4),
        ("param_dtype", 4, 4),
        ("eps", 4, 4),
        ("x_stride", 8, 8),
        ("y_stride", 8, 8),
        ("dy_stride", 8, 8),
        ("dx_stride", 8, 8),
        ("cpu_threads", 4, 4),
        ("flags", 4, 4),
    ],
    ForwardArgs: [(n, 8, 8) for n in ("x", "gamma", "beta", "y", "mean", "rstd")],
    BackwardArgs: [
        (n, 8, 8)
        for n in ("dy", "x", "y", "mean", "rstd", "gamma", "beta", "dx", "dgamma", "dbeta")
    ],
}


def _c_layout(fields):
    """Offsets and total size of a C struct with these (name, size, alignment) fields."""
    offsets = {}
    offset = 0
    max_align = 1
    for name, size, align in fields:
        offset = (offset + align - 1) // align * align
        offsets[name] = offset
        offset += size
        max_align = max(max_align, align)
    return offsets, (offset + max_align - 1) // max_align * max_align


def _check_struct_layouts():
    if ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(ctypes.c_int) != 4:
        raise ImportError("fusednorm: the Python binding supports LP64 platforms only")
    for struct, fields in _EXPECTED_FIELDS.items():
        offsets, size = _c_layout(fields)
        names = [f[0] for f in struct._fields_]
        if names != [f[0] for f in fields]:
            raise ImportError(
                f"fusednorm: {struct.__name__} fields {names} do not match the header"
            )
        for name, fsize, _ in fields:
            got = getattr(struct, name)
            if got.offset != offsets[name] or got.size != fsize:
                raise ImportError(
                    f"fusednorm: {struct.__name__}.{name} is at offset {got.offset} "
                    f"size {got.size}, "
                    f"expected offset {offsets[name]} size {fsize}"
                )
        if ctypes.sizeof(struct) != size:
            raise ImportError(
                f"fusednorm: sizeof({struct.__name__}) is {ctypes.sizeof(struct)}, expected {size}"
            )


_check_struct_layouts()


class FusedNormError(RuntimeError):
    """A fusednorm C call returned an error status.

    Attributes: ``status`` (int), ``status_name`` (e.g. ``"FNORM_ERR_BAD_STRIDE"``),
    ``status_string`` (the library's sentence), and the call's context: ``op``, ``shape``
    (rows, cols), ``dtype`` and ``device``.
    """

    def __init__(
        self, status, status_name, status_string, op=None, shape=None, dtype=None, device=None
    ):
        self.status = status
        self.status_name = status_name
        self.status_string = status_string
        self.op = op
        self.shape = shape
        self.dtype = dtype
        self.device = device
        context = ", ".join(
            f"{k}={v}"
            for k, v in (("shape", shape), ("dtype", dtype), ("device", device))
            if v is not None
        )
        where = f"fusednorm {op}" if op else "fusednorm"
        if context:
            where += f" ({context})"
        super().__init__(f"{where}: {status_name}: {status_string}")


# ---------------------------------------------------------------------------------------------
# Finding and loading the shared library.
# ---------------------------------------------------------------------------------------------
_LIB_NAME = "libfusednorm.so"
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# Developer mode: python/fusednorm/_lib.py inside a source checkout; the repository root is
# two levels above the package.
_REPO_DIR = _PACKAGE_DIR.parent.parent


def _candidate_paths():
    env = os.environ.get("FUSEDNORM_LIBRARY")
    if env:
        # An explicit choice is honoured or fails; it never falls back silently.
        return [pathlib.Path(env)], True
    found = [_PACKAGE_DIR / _LIB_NAME]
    # Newest build first, so the library just rebuilt is the one tested. Sanitizer builds are
    # skipped: loading an ASan library into a Python not started under ASan aborts the process.
    builds = [
        p
        for p in _REPO_DIR.glob("build*/" + _LIB_NAME)
        if p.is_file() and not _is_sanitizer_build(p.parent)
    ]
    builds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return found + builds, False


def _is_sanitizer_build(build_dir):
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    return any(
        line.startswith("FNORM_SANITIZE:")
        and line.split("=", 1)[-1].strip().upper() in ("ON", "1", "TRUE", "YES")
        for line in cache.splitlines()
    )


def _load():
    paths, explicit = _candidate_paths()
    errors = []
    for path in paths:
        if not path.is_file():
            if explicit:
                errors.append(f"{path}: FUSEDNORM_LIBRARY names no file")
            continue
        try:
            return ctypes.CDLL(str(path)), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    tried = "\n  ".join(errors or [str(p) for p in paths])
    raise ImportError(
        "fusednorm: cannot load libfusednorm.so. Install the package with `pip install .`, "
        "build it with `cmake -S . -B build && cmake --build build`, or point "
        "FUSEDNORM_LIBRARY at the library. Tried:\n  " + tried
    )


lib, library_path = _load()

_P = ctypes.c_void_p
_SIGNATURES = {
    "fnorm_version_number": (ctypes.c_uint, []),
    "fnorm_version_string": (ctypes.c_char_p, []),
    "fnorm_status_name": (ctypes.c_char_p, [_c_enum]),
    "fnorm_status_string": (ctypes.c_char_p, [_c_enum]),
    "fnorm_dtype_size": (ctypes.c_size_t, [_c_enum]),
    "fnorm_desc_init": (
        _c_enum,
        [ctypes.POINTER(Desc), _c_enum, _c_enum, _c_enum, ctypes.c_int64, ctypes.c_int64],
    ),
    "fnorm_device_available": (_c_enum, [_c_enum]),
    "fnorm_forward": (_c_enum, [ctypes.POINTER(Desc), ctypes.POINTER(ForwardArgs), _P]),
    "fnorm_backward_workspace_size": (
        _c_enum,
        [ctypes.POINTER(Desc), ctypes.POINTER(ctypes.c_size_t)],
    ),
    "fnorm_backward": (
        _c_enum,
        [ctypes.POINTER(Desc), ctypes.POINTER(BackwardArgs), _P, ctypes.c_size_t, _P],
    ),
}
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"fusednorm: {library_path} does not export {_name}") from None
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def version():
    """The linked library's version string, e.g. ``"0.1.0"``."""
    return lib.fnorm_version_string().decode()


def status_name(status):
    return lib.fnorm_status_name(status).decode()


def status_string(status):
    return lib.fnorm_status_string(status).decode()


def _check_desc_against_library():
    """Cross-check the Desc layout with the library itself.

    fnorm_desc_init zeroes the C struct and sets known values; reading them back through the
    ctypes mirror catches a field at the wrong offset, and a guard zone after the struct
    catches a C struct larger than ours (the library would write past our buffer).
    """
    guard = 64
    buf = (ctypes.c_uint8 * (ctypes.sizeof(Desc) + guard))(
        *([0xA5] * (ctypes.sizeof(Desc) + guard))
    )
    desc = Desc.from_buffer(buf)
    rows, cols = 0x123456789A, 0x0BCDEF0123
    status = lib.fnorm_desc_init(ctypes.byref(desc), DEVICE_CUDA, RMSNORM, DTYPE_BF16, rows, cols)
    if status != 0:
        raise ImportError(f"fusednorm: fnorm_desc_init failed: {status_name(status)}")
    expected = dict(
        device=DEVICE_CUDA,
        norm=RMSNORM,
        rows=rows,
        cols=cols,
        dtype=DTYPE_BF16,
        param_dtype=DTYPE_SAME,
        x_stride=0,
        y_stride=0,
        dy_stride=0,
        dx_stride=0,
        cpu_threads=0,
        flags=0,
    )
    for name, value in expected.items():
        if getattr(desc, name) != value:
            raise ImportError(
                f"fusednorm: fnorm_desc layout mismatch with {library_path}: field {name} reads "
                f"{getattr(desc, name)!r}, expected {value!r}"
            )
    if abs(desc.eps - 1e-5) > 1e-12:
        raise ImportError(f"fusednorm: fnorm_desc layout mismatch: eps reads {desc.eps!r}")
    if any(b != 0xA5 for b in buf[ctypes.sizeof(Desc) :]):
        raise ImportError(
            f"fusednorm: {library_path} writes past the {ctypes.sizeof(Desc)}-byte fnorm_desc "
            "this binding declares: the header and the binding disagree"
        )
    for dtype, size in ((DTYPE_F32, 4), (DTYPE_F16, 2), (DTYPE_BF16, 2), (DTYPE_SAME, 0)):
        if lib.fnorm_dtype_size(dtype) != size:
            raise ImportError(f"fusednorm: fnorm_dtype_size({dtype}) disagrees with the binding")


_check_desc_against_library()


def device_available(device):
    """Status of fnorm_device_available(device) (0 when usable)."""
    return lib.fnorm_device_available(device)


def _raise(status, op, norm, desc):
    raise FusedNormError(
        status,
        status_name(status),
        status_string(status),
        op=f"{_NORM_NAMES.get(norm, norm)} {op}",
        shape=(desc.rows, desc.cols),
        dtype=DTYPE_NAMES.get(desc.dtype, desc.dtype)
        + (
            ""
            if desc.param_dtype == DTYPE_SAME
            else f" (params {DTYPE_NAMES.get(desc.param_dtype)})"
        ),
        device=_DEVICE_NAMES.get(desc.device, desc.device),
    )


def make_desc(
    device,
    norm,
    dtype,
    rows,
    cols,
    *,
    param_dtype=DTYPE_SAME,
    eps=1e-5,
    x_stride=0,
    y_stride=0,
    dy_stride=0,
    dx_stride=0,
    cpu_threads=0,
):
    """A filled-in ``fnorm_desc``."""
    desc = Desc()
    status = lib.fnorm_desc_init(ctypes.byref(desc), device, norm, dtype, rows, cols)
    if status != 0:
        _raise(status, "descriptor", norm, desc)
    desc.param_dtype = param_dtype
    desc.eps = eps
    desc.x_stride = x_stride
    desc.y_stride = y_stride
    desc.dy_stride = dy_stride
    desc.dx_stride = dx_stride
    desc.cpu_threads = cpu_threads
    return desc


def forward(desc, x, y, gamma=None, beta=None, mean=None, rstd=None, stream=None):
    """fnorm_forward with raw addresses (ints or None); raises FusedNormError on failure."""
    args = ForwardArgs(x, gamma, beta, y, mean, rstd)
    status = lib.fnorm_forward(ctypes.byref(desc), ctypes.byref(args), stream)
    if status != 0:
        _raise(status, "forward", desc.norm, desc)


def backward_workspace_size(desc):
    size = ctypes.c_size_t(0)
    status = lib.fnorm_backward_workspace_size(ctypes.byref(desc), ctypes.byref(size))
    if status != 0:
        _raise(status, "backward workspace query", desc.norm, desc)
    return size.value


def backward(
    desc,
    dy,
    rstd,
    *,
    x=None,
    y=None,
    mean=None,
    gamma=None,
    beta=None,
    dx=None,
    dgamma=None,
    dbeta=None,
    workspace=None,
    workspace_bytes=0,
    stream=None,
):
    """fnorm_backward with raw addresses (ints or None); raises FusedNormError on failure."""
    args = BackwardArgs(dy, x, y, mean, rstd, gamma, beta, dx, dgamma, dbeta)
    status = lib.fnorm_backward(
        ctypes.byref(desc), ctypes.byref(args), workspace, workspace_bytes, stream
    )
    if status != 0:
        _raise(status, "backward", desc.norm, desc)
