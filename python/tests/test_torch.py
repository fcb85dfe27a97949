"""PyTorch layer: custom ops, autograd, compile, CUDA graphs, autocast, strides, modules.

Runs on the CPU everywhere torch is installed; the CUDA cases skip without a GPU or without the
library's CUDA backend, and say why.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusednorm  # noqa: E402
from fusednorm import _lib, ops  # noqa: E402


def _cuda_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    status = _lib.device_available(_lib.DEVICE_CUDA)
    if status != 0:
        return f"libfusednorm has no usable CUDA backend: {_lib.status_name(status)}"
    return None


CUDA_SKIP = _cuda_skip_reason()
needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Tolerance relative to the largest reference magnitude, per input dtype.
TOL = {torch.float32: 3e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _fresh_descriptors():
    # ops caches descriptors per shape; tests that spy on _lib.make_desc must see every call.
    ops._desc.cache_clear()


def _assert_close(got, ref, tol, what=""):
    got = got.detach().double()
    ref = ref.detach().double().to(got.device)
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    scale = ref.abs().max().clamp_min(1e-30)
    err = ((got - ref).abs() / (ref.abs() + scale)).max().item()
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def _ref(rms, x, shape, w, b, eps):
    """fp64 PyTorch reference of the forward, differentiable."""
    x64 = x.double()
    w64 = None if w is None else w.double()
    if rms:
        return F.rms_norm(x64, shape, w64, eps)
    return F.layer_norm(x64, shape, w64, None if b is None else b.double(), eps)


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _make(device, dtype, shape, nshape, affine, param_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pdt = param_dtype or dtype
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(device=device, dtype=dtype)
    w = (1 + 0.3 * torch.randn(nshape, generator=gen)).to(device=device, dtype=pdt)
    b = (0.2 * torch.randn(nshape, generator=gen)).to(device=device, dtype=pdt)
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    return _leaf(x), (_leaf(w) if affine else None), (_leaf(b) if affine == "wb" else None), dy


def _run(fn, rms, x, nshape, w, b, eps, **kw):
    if rms:
        return fn(x, nshape, w, eps, **kw)
    return fn(x, nshape, w, b, eps, **kw)


def _grads(y, inputs, dy):
    live = [t for t in inputs if t is not None]
    got = iter(torch.autograd.grad(y, live, dy))
    return [next(got) if t is not None else None for t in inputs]


def _check_against_fp64(rms, x, nshape, w, b, dy, eps, tol, **kw):
    fn = fusednorm.rms_norm if rms else fusednorm.layer_norm
    y = _run(fn, rms, x, nshape, w, b, eps, **kw)
    assert y.dtype == x.dtype and y.shape == x.shape and y.device == x.device
    xr, wr, br = (None if t is None else _leaf(t) for t in (x, w, b))
    yr = _ref(rms, xr, nshape, wr, br, eps)
    _assert_close(y, yr, tol, "y")
    got = _grads(y, [x, w, None if rms else b], dy)
    ref = _grads(yr, [xr, wr, None if rms else br], dy.double())
    for g, r, t, what in zip(got, ref, [x, w, b], ["dx", "dweight", "dbias"]):
        if r is not None:
            assert g.dtype == t.dtype, what
            _assert_close(g, r, tol, what)
    return y


# ---------------------------------------------------------------------------------------------
# Values and gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("affine", [None, "w", "wb"])
def test_matches_fp64_reference(device, dtype, rms, affine):
    x, w, b, dy = _make(device, dtype, (4, 5, 96), (96,), affine)
    _check_against_fp64(rms, x, (96,), w, b, dy, 1e-5, TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_matches_torch_functional(device, rms):
    x, w, b, dy = _make(device, torch.float32, (6, 3, 4, 10), (4, 10), "wb")
    fn, ref = (fusednorm.rms_norm, F.rms_norm) if rms else (fusednorm.layer_norm, F.layer_norm)
    y = _run(fn, rms, x, (4, 10), w, b, 1e-5)
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    yr = _run(ref, rms, xr, (4, 10), wr, br, 1e-5)
    _assert_close(y, yr, 3e-5, "y")
    for g, r in zip(
        _grads(y, [x, w, None if rms else b], dy), _grads(yr, [xr, wr, None if rms else br], dy)
    ):
        if r is not None:
            assert g.shape == r.shape
            _assert_close(g, r, 3e-5)


def test_rms_norm_default_eps_is_finfo_eps(monkeypatch):
    seen = []
    real = _lib.make_desc
    monkeypatch.setattr(_lib, "make_desc", lambda *a, **k: seen.append(k) or real(*a, **k))
    for dtype in DTYPES:
        fusednorm.rms_norm(torch.randn(2, 8, dtype=dtype), [8])
        assert seen[-1]["eps"] == torch.finfo(dtype).eps
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    _assert_close(
        fusednorm.rms_norm(x, 8),
        F.rms_norm(x.double(), (8,), eps=torch.finfo(x.dtype).eps),
        TOL[torch.bfloat16],
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_fp32_params_with_half_input(device, dtype, rms, monkeypatch):
    x, w, b, dy = _make(device, dtype, (33, 128), (128,), "wb", param_dtype=torch.float32)
    seen = []
    real = _lib.make_desc
    monkeypatch.setattr(_lib, "make_desc", lambda *a, **k: seen.append(k) or real(*a, **k))
    _check_against_fp64(rms, x, (128,), w, b, dy, 1e-5, TOL[dtype])
    assert {k["param_dtype"] for k in seen} == {_lib.DTYPE_F32}  # passed as is, not cast


@pytest.mark.parametrize("device", DEVICES)
def test_other_param_dtypes_are_cast(device):
    x, w, b, dy = _make(device, torch.bfloat16, (8, 64), (64,), "wb", param_dtype=torch.float16)
    y = fusednorm.layer_norm(x, (64,), w, b)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    assert dw.dtype == torch.float16 and db.dtype == torch.float16
    _assert_close(y, _ref(False, x, (64,), w, b, 1e-5), TOL[torch.bfloat16])


# ---------------------------------------------------------------------------------------------
# Custom op machinery
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_opcheck(device, rms, memory_efficient):
    x, w, b, dy = _make(device, torch.float32, (5, 7, 32), (32,), "wb")
    b = None if rms else b
    torch.library.opcheck(
        torch.ops.fusednorm.norm_fwd.default, (x, w, b, 32, rms, 1e-5, memory_efficient)
    )
    torch.library.opcheck(
        torch.ops.fusednorm.norm_fwd.default, (x, None, None, 32, rms, 1e-5, memory_efficient)
    )
    y, mean, rstd = torch.ops.fusednorm.norm_fwd(
        x.detach(), w.detach(), None if b is None else b.detach(), 32, rms, 1e-5, memory_efficient
    )
    saved = y if memory_efficient else x.detach()
    torch.library.opcheck(
        torch.ops.fusednorm.norm_bwd.default,
        (
            dy,
            saved,
            mean,
            rstd,
            w.detach(),
            None if b is None else b.detach(),
            32,
            rms,
            1e-5,
            memory_efficient,
            True,
            True,
            b is not None,
        ),
    )
    torch.library.opcheck(
        torch.ops.fusednorm.norm_bwd.default,
        (
            dy,
            saved,
            mean,
            rstd,
            w.detach(),
            None,
            32,
            rms,
            1e-5,
            memory_efficient,
            False,
            True,
            False,
        ),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_torch_compile_fullgraph(device, rms):
    x, w, b, dy = _make(device, torch.float32, (16, 64), (64,), "wb")

    def f(x, w, b):
        h = x * 2.0 + 1.0
        if rms:
            return torch.tanh(fusednorm.rms_norm(h, (64,), w, 1e-6))
        return torch.tanh(fusednorm.layer_norm(h, (64,), w, b, 1e-5))

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)  # a graph break raises
    y = compiled(x, w, b)
    ye = f(x, w, b)
    _assert_close(y, ye, 1e-5, "y")
    for g, r in zip(
        torch.autograd.grad(y, [x, w, b], dy, allow_unused=True),
        torch.autograd.grad(ye, [x, w, b], dy, allow_unused=True),
    ):
        if r is not None:
            _assert_close(g, r, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_memory_efficient_saves_output_not_input(device):
    for rms in (False, True):
        x, w, b, dy = _make(device, torch.float32, (12, 80), (80,), "wb")
        b = None if rms else b
        grads = {}
        for me in (False, True):
            saved = []

            def pack(t, saved=saved):
                saved.append(t)
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = _run(
                    fusednorm.rms_norm if rms else fusednorm.layer_norm,
                    rms,
                    x,
                    (80,),
                    w,
                    b,
                    1e-5,
                    memory_efficient=me,
                )
            ptrs = {t.data_ptr() for t in saved}
            assert (x.data_ptr() in ptrs) != me
            assert (y.data_ptr() in ptrs) == me
            grads[me] = _grads(y, [x, w, b], dy)
        for g0, g1 in zip(grads[False], grads[True]):
            if g0 is not None:
                _assert_close(g1, g0, 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_need_no_copy(device, monkeypatch):
    seen = []
    real = _lib.make_desc
    monkeypatch.setattr(_lib, "make_desc", lambda *a, **k: seen.append(k) or real(*a, **k))
    wide = torch.randn(4, 6, 200, device=device)
    x = _leaf(wide)[..., 8:136]  # [4, 6, 128] view, rows 200 apart
    w = _leaf(torch.randn(128, device=device))
    dy_wide = torch.randn(24, 150, device=device)
    y = fusednorm.layer_norm(x, 128, w)
    assert seen[-1]["x_stride"] == 200
    yr = _ref(False, x, (128,), w, None, 1e-5)
    _assert_close(y, yr, 3e-5, "y")
    dy = dy_wide[:, :128].unflatten(0, (4, 6))  # strided grad: rows 150 apart
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    assert seen[-1]["dy_stride"] == 150 and seen[-1]["x_stride"] == 200
    rdx, rdw = torch.autograd.grad(yr, [x, w], dy.double())
    _assert_close(dx, rdx, 3e-5, "dx")
    _assert_close(dw, rdw, 3e-5, "dweight")


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_and_expanded_inputs_are_copied(device, monkeypatch):
    seen = []
    real = _lib.make_desc
    monkeypatch.setattr(_lib, "make_desc", lambda *a, **k: seen.append(k) or real(*a, **k))
    x = _leaf(torch.randn(64, 10, device=device)).t()  # [10, 64], unit stride between rows
    assert not x.is_contiguous()
    y = fusednorm.rms_norm(x, [64], None, 1e-5)
    assert seen[-1]["x_stride"] == 64  # packed copy
    yr = _ref(True, x, (64,), None, None, 1e-5)
    _assert_close(y, yr, 3e-5, "y")
    # y.sum() sends an expanded (stride 0) gradient: it must be copied, not misread.
    (dx,) = torch.autograd.grad(y.sum(), [x])
    (rdx,) = torch.autograd.grad(yr.sum(), [x])
    _assert_close(dx, rdx, 1e-4, "dx")


def test_row_stride_rules():
    t = torch.empty(4, 6, 200)
    assert ops._row_stride(t[..., :128], 128) == 200
    assert ops._row_stride(t[:, :3, :128], 128) is None  # leading dims do not collapse
    assert ops._row_stride(t[:, :1, :128], 128) == 1200  # size-1 dims do not matter
    assert ops._row_stride(t[..., ::2], 100) is None
    assert ops._row_stride(t.view(4, 6, 10, 20)[..., :5, :], 100) == 200  # 2-D normalized block
    assert ops._row_stride(t.view(4, 6, 10, 20)[..., :, :5], 50) is None
    assert ops._row_stride(torch.empty(1, 8).expand(5, 8), 8) is None
    assert ops._row_stride(t[:1, :1, :7], 7) == 7


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows_and_meta(device):
    x = _leaf(torch.randn(0, 16, device=device))
    w = _leaf(torch.randn(16, device=device))
    y = fusednorm.layer_norm(x, 16, w)
    assert y.shape == (0, 16)
    dx, dw = torch.autograd.grad(y, [x, w], torch.ones_like(y))
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros_like(w))
    m = fusednorm.layer_norm(torch.empty(3, 16, device="meta"), 16)
    assert m.device.type == "meta" and m.shape == (3, 16)


def test_errors():
    with pytest.raises(TypeError, match="float64"):
        fusednorm.layer_norm(torch.randn(2, 4, dtype=torch.float64), 4)
    with pytest.raises(TypeError, match="int32"):
        fusednorm.rms_norm(torch.ones(2, 4, dtype=torch.int32), 4)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        fusednorm.layer_norm(torch.randn(2, 4), (3,))
    with pytest.raises(RuntimeError, match="weight"):
        fusednorm.layer_norm(torch.randn(2, 4), (4,), torch.ones(5))
    with pytest.raises(fusednorm.FusedNormError) as info:
        fusednorm.layer_norm(torch.randn(2, 4), (4,), eps=-1.0)
    assert info.value.status_name == "FNORM_ERR_BAD_EPS"
    assert info.value.device == "cpu" and info.value.shape == (2, 4)


# ---------------------------------------------------------------------------------------------
# Autocast
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_autocast_keeps_input_dtype(device, dtype, rms):
    if device == "cpu" and dtype == torch.float16 and not torch.amp.is_autocast_available("cpu"):
        pytest.skip("no CPU autocast")
    torch.manual_seed(0)
    lin1 = torch.nn.Linear(64, 64).to(device)
    norm = (fusednorm.RMSNorm(64) if rms else fusednorm.LayerNorm(64)).to(device)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(8, 64, device=device)
    with torch.autocast(device_type=device, dtype=dtype):
        h = lin1(x)
        assert h.dtype == dtype
        y = norm(h)
        loss = y.float().square().mean()
    assert y.dtype == dtype  # kept, where torch's own layer_norm would give fp32
    loss.backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    assert lin1.weight.grad is not None and torch.isfinite(lin1.weight.grad).all()
    ref = _ref(
        rms,
        h.detach(),
        (64,),
        norm.weight.detach(),
        None if rms else norm.bias.detach(),
        norm.eps if norm.eps is not None else torch.finfo(dtype).eps,
    )
    _assert_close(y, ref, TOL[dtype], "y")


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_under_compile(device):
    norm = fusednorm.LayerNorm(32).to(device)
    lin = torch.nn.Linear(32, 32).to(device)
    torch._dynamo.reset()
    f = torch.compile(lambda x: norm(lin(x)), fullgraph=True, dynamic=False)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        y = f(torch.randn(4, 32, device=device))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert norm.weight.grad is not None


# ---------------------------------------------------------------------------------------------
# CUDA only: graph capture, device placement
# ---------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_capture_forward_backward(rms, dtype):
    n = 1024
    norm = (fusednorm.RMSNorm(n) if rms else fusednorm.LayerNorm(n)).to("cuda", dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(256, n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(256, n, device="cuda", dtype=dtype)

    def step():
        y = norm(x)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up outside the capture, as the CUDA graphs docs ask
            x.grad = None
            norm.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    norm.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        with torch.no_grad():
            x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
            dy.copy_(torch.randn(dy.shape, device="cuda", generator=gen))
            x.grad.zero_()
            norm.weight.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        # Compare the replay with an eager run on the same inputs.
        xe = _leaf(x)
        ne = copy.deepcopy(norm)
        ne.zero_grad(set_to_none=True)
        ye = ne(xe)
        ye.backward(dy)
        assert torch.equal(static_y, ye)  # deterministic kernels: bitwise
        assert torch.equal(x.grad, xe.grad)
        assert torch.equal(norm.weight.grad, ne.weight.grad)


@needs_cuda
def test_cuda_runs_on_tensor_device_and_current_stream():
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    x, w, b, dy = _make(dev, torch.bfloat16, (64, 512), (512,), "wb")
    stream = torch.cuda.Stream(device=dev)
    stream.wait_stream(torch.cuda.current_stream(dev))  # the inputs were made on the default one
    with torch.cuda.stream(stream):
        y = fusednorm.layer_norm(x, 512, w, b)
        g = torch.autograd.grad(y, [x, w, b], dy)
    stream.synchronize()
    _assert_close(y, _ref(False, x, (512,), w, b, 1e-5), TOL[torch.bfloat16], "y")
    assert all(t.device == dev for t in g)


# ---------------------------------------------------------------------------------------------
# Modules and model surgery
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-6}]
)
def test_layer_norm_module_state_dict_round_trip(kwargs):
    shape = (3, 16)
    ours = fusednorm.LayerNorm(shape, **kwargs)
    theirs = torch.nn.LayerNorm(shape, **kwargs)
    assert isinstance(ours, torch.nn.LayerNorm)
    assert ours.extra_repr() == theirs.extra_repr()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if ours.weight is not None:
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
            if theirs.bias is not None:
                theirs.bias.uniform_(-1, 1)
    ours.load_state_dict(theirs.state_dict())  # strict
    back = torch.nn.LayerNorm(shape, **kwargs)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(5, *shape)
    _assert_close(ours(x), theirs(x), 3e-5)
    _assert_close(back(x), theirs(x), 0)
    ours.reset_parameters()
    if ours.weight is not None:
        assert torch.equal(ours.weight, torch.ones(shape))


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-6}])
def test_rms_norm_module_state_dict_round_trip(kwargs):
    ours = fusednorm.RMSNorm(24, **kwargs)
    theirs = torch.nn.RMSNorm(24, **kwargs)
    assert isinstance(ours, torch.nn.RMSNorm)
    assert ours.extra_repr() == theirs.extra_repr()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if theirs.weight is not None:
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
    ours.load_state_dict(theirs.state_dict())
    back = torch.nn.RMSNorm(24, **kwargs)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(7, 24)
    _assert_close(ours(x), theirs(x), 3e-5)
    _assert_close(back(x), theirs(x), 0)


class _LlamaStyleRMSNorm(torch.nn.Module):
    """The Hugging Face pattern (LlamaRMSNorm), written out here."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class _GemmaStyleRMSNorm(torch.nn.Module):
    """Same name pattern, different function (scales by 1 + weight): must be left alone."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def test_replace_norms_keeps_parameters_and_skips_look_alikes():
    shared = torch.nn.LayerNorm(16)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16),
        shared,
        torch.nn.Sequential(shared, _LlamaStyleRMSNorm(16)),
        torch.nn.RMSNorm(16),
        _GemmaStyleRMSNorm(16),
    )
    params_before = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="_GemmaStyleRMSNorm"):
        out = fusednorm.replace_norms(model)
    assert out is model
    assert type(model[1]) is fusednorm.LayerNorm and model[2][0] is model[1]
    assert type(model[2][1]) is fusednorm.HFStyleRMSNorm
    assert type(model[3]) is fusednorm.RMSNorm
    assert type(model[4]) is _GemmaStyleRMSNorm
    for name, p in model.named_parameters(remove_duplicate=False):
        assert p is params_before[name]
    loss = model(torch.randn(4, 16)).square().sum()
    loss.backward()
    before = model[3].weight.detach().clone()
    opt.step()  # the optimizer built before the swap updates the swapped modules' parameters
    assert not torch.equal(before, model[3].weight)
    assert isinstance(fusednorm.replace_norms(torch.nn.LayerNorm(8)), fusednorm.LayerNorm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_style_rms_norm_mirrors_original(device, dtype):
    orig = _LlamaStyleRMSNorm(64).to(device)  # fp32 weight
    with torch.no_grad():
        orig.weight.uniform_(0.5, 1.5)
    fused = fusednorm.replace_norms(copy.deepcopy(orig))
    assert isinstance(fused, fusednorm.HFStyleRMSNorm)
    x = torch.randn(10, 64, device=device, dtype=dtype)
    a, b = orig(x), fused(x)
    assert a.dtype == b.dtype  # fp32 weight with bf16 input promotes to fp32, as in the original
    _assert_close(b, a, TOL[dtype] if dtype != torch.float32 else 3e-5)


def _hf_models():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    # No dropout: the two models must see the same function.
    gpt2 = transformers.GPT2Config(
        vocab_size=128,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return [
        ("llama", lambda: transformers.LlamaForCausalLM(llama), "RMSNorm"),
        ("gpt2", lambda: transformers.GPT2LMHeadModel(gpt2), "LayerNorm"),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_replace_norms_on_hugging_face_models(device, which):
    name, build, kind = {m[0]: m for m in _hf_models()}[which]
    torch.manual_seed(0)
    original = build().to(device)
    original.config._attn_implementation = "eager"
    with torch.no_grad():  # make the norm weights non-trivial
        for mod in original.modules():
            if type(mod).__name__.endswith(kind) and getattr(mod, "weight", None) is not None:
                mod.weight.uniform_(0.5, 1.5)
    fused = copy.deepcopy(original)
    n_before = sum(type(m).__name__.endswith(kind) for m in fused.modules())
    assert n_before > 0
    fusednorm.replace_norms(fused)
    assert list(fused.state_dict()) == list(original.state_dict())
    ours = (fusednorm.HFStyleRMSNorm, fusednorm.RMSNorm, fusednorm.LayerNorm)
    n_ours = sum(isinstance(m, ours) for m in fused.modules())
    assert n_ours == n_before, f"replaced {n_ours} of {n_before} {kind} modules"
    tokens = torch.randint(
        0, 128, (2, 24), device=device, generator=torch.Generator(device=device).manual_seed(3)
    )
    losses = {}
    for label, model in (("original", original), ("fused", fused)):
        model.train()
        out = model(input_ids=tokens, labels=tokens)
        out.loss.backward()
        losses[label] = out.loss.detach()
    _assert_close(losses["fused"], losses["original"], 1e-5, "loss")
    grads_o = dict(original.named_parameters())
    for pname, p in fused.named_parameters():
        assert p.grad is not None, pname
        _assert_close(p.grad, grads_o[pname].grad, 1e-3, pname)
    # One optimizer step on each keeps them in step.
    for model in (original, fused):
        torch.optim.SGD(model.parameters(), lr=1e-2).step()
    with torch.no_grad():
        lo = original(input_ids=tokens, labels=tokens).loss
        lf = fused(input_ids=tokens, labels=tokens).loss
    _assert_close(lf, lo, 1e-4, "loss after a step")


class _SeeOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ops dispatched under it (and makes fusednorm take its custom ops)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["x", "y"])
def test_eager_fast_path_matches_the_ops(device, rms, memory_efficient):
    # Eager calls skip the custom ops' dispatch (ops._direct); with a dispatch mode active they
    # go through the ops, which the mode sees. Both must give bitwise the same y and gradients.
    x, w, b, dy = _make(device, torch.float32, (24, 96), (96,), "wb")
    b = None if rms else b
    fn = fusednorm.rms_norm if rms else fusednorm.layer_norm
    inputs = [t for t in (x, w, b) if t is not None]
    assert ops._direct(x, w, b)

    def run():
        y = _run(fn, rms, x, (96,), w, b, 1e-5, memory_efficient=memory_efficient)
        return [y] + list(torch.autograd.grad(y, inputs, dy))

    fast = run()
    mode = _SeeOps()
    with mode:
        traced = run()
    assert "fusednorm.norm_fwd.default" in mode.ops and "fusednorm.norm_bwd.default" in mode.ops
    for got, ref in zip(fast, traced):
        assert torch.equal(got, ref)
    with torch.no_grad():  # inference: the implementation directly, no autograd node
        y = _run(fn, rms, x, (96,), w, b, 1e-5)
    assert y.grad_fn is None and torch.equal(y, fast[0])
