#!/usr/bin/env python3
"""Throughput of fusednorm beside PyTorch eager, torch.compile, Liger-Kernel and QuACK.

One GPU run over the grid of the C benchmark (bench/fnbench.c): LayerNorm and RMSNorm, forward
and backward, bf16/fp16/fp32, N in {256 ... 262144} with M = 2^27 / N, plus 64 x 802816 fp32
and 576000 x 384 bf16. The inputs are those of fnbench with its default seed, bit for bit (the
same counter-based generator, evaluated on the GPU): x = 0.25 + U(-1, 1), dy = U(-1, 1),
gamma = 1 + 0.1 U(-1, 1), beta = 0.1 U(-1, 1), parameters in the input's dtype, eps = 1e-5,
RMSNorm without beta.

What is timed:
  * forward: the training forward (inputs require grad, so every library also writes the
    statistics its backward needs), one call = one y.
  * backward: the forward is run once; one call is
    torch.autograd.grad(y, [x, weight, bias], dy, retain_graph=True), i.e. the backward
    kernels only (dx, dweight, dbias and any reduction a library launches for them). QuACK's
    LayerNorm, which has no autograd function, is timed through its layernorm_bwd.
  * each measurement is the median over batches of the per-call time of K back-to-back calls
    between two CUDA events; a GPU sleep queued before each batch lets the host enqueue the
    whole batch first, so the time is the GPU's, not Python's dispatch overhead (--timer
    events instead brackets every call with its own events, as fnbench does, to cross-check).
  * bytes counted: forward 2*M*N*elem (read x, write y), backward 3*M*N*elem (read x and dy,
    write dx), as fnbench counts them. The ceiling is a device-to-device copy of the same
    M*N*elem bytes, measured in this run, counted read + write.

Before it is timed, every library's output (y; dx, dweight, dbias) is compared with an fp32
PyTorch reference computed on the same inputs and with fusednorm's output. The error is
normwise, max|got - ref| / max|ref|, with fnbench's tolerances (bf16 3e-2, fp16 4e-3, fp32
5e-4). A library that raises, fails to compile or is wrong is reported as such in the table
and not timed; one that is not installed is listed as such.

Outputs in --out DIR: compare.md (table), compare.csv (one row per library and cell),
compare.png (GB/s against N). Progress goes to stderr.
"""

import argparse
import csv
import gc
import importlib
import math
import pathlib
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

try:
    import fusednorm
except ImportError:  # running from the source tree
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import fusednorm

GRID_N = [256, 384, 512, 768, 1024, 2048, 4096, 5120, 8192, 16384, 32768, 65536, 262144]
QUICK_N = [1024, 4096, 32768]
TOTAL_ELEMENTS = 1 << 27
EXTRA_SHAPES = [("fp32", 64, 802816), ("bf16", 576000, 384)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"bf16": 3e-2, "fp16": 4e-3, "fp32": 5e-4}
OPS = {"ln": "LayerNorm", "rms": "RMSNorm"}
EPS = 1e-5
LIBRARIES = ["fusednorm", "torch", "compile", "liger", "quack"]
LIB_TITLES = {
    "fusednorm": "fusednorm",
    "torch": "torch eager",
    "compile": "torch.compile",
    "liger": "Liger",
    "quack": "QuACK",
}

START = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - START:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Inputs: fnbench's generator (splitmix64 finalizer of seed + i * golden ratio), on the GPU in
# int64 arithmetic, which wraps like uint64; right shifts are made logical by masking.
# ---------------------------------------------------------------------------------------------
def _s64(u):
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >= 1 << 63 else u


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)


def _lsr(z, k):
    return (z >> k) & ((1 << (64 - k)) - 1)


def fill_random(numel, dtype, device, seed, offset, scale, chunk=1 << 24):
    """offset + scale * U(-1, 1) per element, as fnbench's fill_random (fp32, then rounded)."""
    out = torch.empty(numel, dtype=dtype, device=device)
    for start in range(0, numel, chunk):
        stop = min(numel, start + chunk)
        z = torch.arange(start, stop, dtype=torch.int64, device=device)
        z.mul_(_GOLDEN).add_(_s64(seed))
        z = (z ^ _lsr(z, 30)).mul_(_MIX1)
        z = (z ^ _lsr(z, 27)).mul_(_MIX2)
        z ^= _lsr(z, 31)
        u = _lsr(z, 40).to(torch.float32).mul_(1.0 / 16777216.0)
        del z
        out[start:stop] = u.mul_(2.0).sub_(1.0).mul_(scale).add_(offset)
        del u
    return out


def make_inputs(m, n, dtype, device, seed=1):
    base = seed * 0x100000001B3
    x = fill_random(m * n, dtype, device, base + 1, 0.25, 1.0).view(m, n)
    dy = fill_random(m * n, dtype, device, base + 2, 0.0, 1.0).view(m, n)
    w = fill_random(n, dtype, device, base + 3, 1.0, 0.1)
    b = fill_random(n, dtype, device, base + 4, 0.0, 0.1)
    return x, dy, w, b


# ---------------------------------------------------------------------------------------------
# Libraries. Each gives, for one cell, a `forward()` returning y and a `backward_setup()`
# returning a callable that runs the backward once and returns (dx, dweight, dbias).
# ---------------------------------------------------------------------------------------------
class Unavailable(Exception):
    """The library is not installed or lacks this operation."""


class AutogradCell:
    """A library exposed as a differentiable function f(x, w, b) -> y."""

    def __init__(self, fn, op, x, w, b):
        self.fn = fn
        self.op = op
        self.inputs = [x, w] + ([b] if op == "ln" else [])

    def forward(self):
        return self.fn(*self.inputs)

    def backward_setup(self, dy):
        y = self.fn(*self.inputs)
        inputs = self.inputs

        def run():
            grads = torch.autograd.grad(y, inputs, dy, retain_graph=True)
            return tuple(grads) + ((None,) if len(grads) == 2 else ())

        return run


def _fusednorm_fn(op, n):
    if op == "ln":
        return lambda x, w, b: fusednorm.layer_norm(x, (n,), w, b, EPS)
    return lambda x, w: fusednorm.rms_norm(x, (n,), w, EPS)


def _torch_fn(op, n):
    if op == "ln":
        return lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS)
    return lambda x, w: F.rms_norm(x, (n,), w, EPS)


def make_cell(lib, op, n, x, w, b):
    if lib == "fusednorm":
        return AutogradCell(_fusednorm_fn(op, n), op, x, w, b)
    if lib == "torch":
        return AutogradCell(_torch_fn(op, n), op, x, w, b)
    if lib == "compile":
        torch._dynamo.reset()  # one compile per cell; no recompile limit across the grid
        return AutogradCell(torch.compile(_torch_fn(op, n), dynamic=False), op, x, w, b)
    if lib == "liger":
        return _liger_cell(op, x, w, b)
    if lib == "quack":
        return _quack_cell(op, x, w, b)
    raise ValueError(lib)


def _liger_cell(op, x, w, b):
    try:
        if op == "ln":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return AutogradCell(
                lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS), op, x, w, b
            )
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError as e:
        raise Unavailable(f"not installed ({e})") from None
    # offset 0, Llama casting, and in_place=False: in place, the backward would overwrite dy,
    # which the repeated timed backward reuses.
    return AutogradCell(
        lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False), op, x, w, b
    )


class QuackLayerNormCell:
    """QuACK's LayerNorm has forward and backward functions but no autograd function, and
    takes fp32 weight and bias."""

    def __init__(self, fwd, bwd, x, w, b):
        self.fwd, self.bwd = fwd, bwd
        self.x, self.w32, self.b32 = x.detach(), w.detach().float(), b.detach().float()

    def forward(self):
        return self.fwd(self.x, self.w32, self.b32, EPS, return_rstd=True, return_mean=True)[0]

    def backward_setup(self, dy):
        _, rstd, mean = self.fwd(
            self.x, self.w32, self.b32, EPS, return_rstd=True, return_mean=True
        )
        return lambda: self.bwd(self.x, self.w32, dy, rstd, mean, has_bias=True)


def _quack_cell(op, x, w, b):
    try:
        quack_rmsnorm = importlib.import_module("quack.rmsnorm")
    except Exception as e:  # ImportError, or CuTe DSL failing to initialize
        raise Unavailable(f"not installed ({type(e).__name__}: {e})") from None
    if op == "rms":
        fn = getattr(quack_rmsnorm, "rmsnorm", None)
        if fn is None:
            raise Unavailable("quack.rmsnorm.rmsnorm not found in this version")
        return AutogradCell(lambda x, w: fn(x, w, eps=EPS), op, x, w, b)
    fwd = getattr(quack_rmsnorm, "layernorm_fwd", None)
    bwd = getattr(quack_rmsnorm, "layernorm_bwd", None)
    if fwd is None or bwd is None:
        raise Unavailable("no LayerNorm forward+backward in this QuACK version")
    return QuackLayerNormCell(fwd, bwd, x, w, b)


# ---------------------------------------------------------------------------------------------
# Checking and timing
# ---------------------------------------------------------------------------------------------
def normwise_error(got, ref):
    if got is None or ref is None:
        return float("nan")
    got = got.detach()
    ref = ref.detach()
    if got.shape != ref.shape:
        return float("inf")
    diff = (got.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    if not math.isfinite(diff):
        return float("inf")
    return diff / scale if scale > 0 else diff


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


class Timer:
    """Median per-call time. On CUDA: events around a batch of calls queued behind a GPU sleep.
    On the CPU (--device cpu, a smoke test of this script, not a benchmark): wall clock."""

    def __init__(self, reps, calls, device, mode="sleep"):
        self.reps = reps
        self.calls = calls
        self.device = device
        self.mode = mode
        self.sleep = getattr(torch.cuda, "_sleep", None) if device == "cuda" else None
        self.cycles_per_ms = None

    def _calibrate(self):
        if self.sleep is None:
            return
        # Cycles of torch.cuda._sleep per millisecond on this GPU.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.sleep(1_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_ms = 1_000_000 / max(start.elapsed_time(end), 1e-3)

    def median_ms(self, fn, host_ms_per_call):
        """Median per-call GPU time of fn, in ms."""
        if self.device != "cuda":
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                for _ in range(self.calls):
                    fn()
                times.append((time.perf_counter() - t0) * 1e3 / self.calls)
            return statistics.median(times)
        if self.mode == "events":
            return self._median_ms_events(fn)
        if self.cycles_per_ms is None:
            self._calibrate()
        torch.cuda.synchronize()
        times = []
        retries = 0
        while len(times) < self.reps:
            sleep_ms = 2.0 * self.calls * host_ms_per_call + 1.0
            slept = torch.cuda.Event(enable_timing=True)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if self.sleep is not None:
                # Long enough for the host to queue the whole batch behind it.
                cycles = int(self.cycles_per_ms * sleep_ms)
                slept.record()
                self.sleep(cycles)
            t0 = time.perf_counter()
            start.record()
            for _ in range(self.calls):
                fn()
            end.record()
            queued_ms = (time.perf_counter() - t0) * 1e3
            end.synchronize()
            if self.sleep is not None:
                # The sleep's length as the GPU ran it: a calibration taken while the GPU's
                # clock was still low (the first cell of a run, after an idle GPU) makes every
                # later sleep shorter than asked, and batches the host queued more slowly than
                # the GPU ran them then measured the host: compare.py's backward figures for
                # fusednorm (autograd and ctypes a call) read 60-79% of the copy at the start
                # of a run and 86-95% later in the same machine's session, fnbench 88-96%
                # (session 31). Recalibrate from each sleep.
                slept_ms = slept.elapsed_time(start)
                if slept_ms > 0:
                    self.cycles_per_ms = cycles / slept_ms
            else:
                slept_ms = sleep_ms
            # A batch the host queued more slowly than the sleep lasted measured the host (a
            # busy CPU: torch.compile's workers, the GC), not the GPU: size the sleep from it
            # and measure again (a few times at most).
            if self.sleep is not None and queued_ms > 0.8 * slept_ms and retries < 3 * self.reps:
                retries += 1
                host_ms_per_call = max(host_ms_per_call, 1.5 * queued_ms / self.calls)
                continue
            times.append(start.elapsed_time(end) / self.calls)
        return statistics.median(times)

    def _median_ms_events(self, fn):
        """fnbench's way (--timer events): events around every call, the median over all of
        them. Gaps the host leaves between calls fall outside the events, so this measures the
        GPU's time per call even when the host cannot keep up."""
        torch.cuda.synchronize()
        pairs = []
        for _ in range(self.reps * self.calls):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in pairs)


def host_time_ms(fn, device, calls=3):
    """Host time per call (dispatch overhead plus any blocking), to size the sleep."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync(device)
    return (t1 - t0) * 1e3 / calls


def empty_cache(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def copy_gbps(numel, dtype, timer, cache):
    """GB/s of a device-to-device copy of numel elements, read + written: the fastest of copies
    of numel, of numel rounded down to a whole MiB and of one MiB less, as fnbench measures it.
    The copy's rate depends on the exact size (H200: 2^27 - 128 bf16 elements 6.5% below 2^27
    through copy_ in run BH; through cudaMemcpyAsync 2^30 bytes 1.2% below 2^30 - 2^20 in runs
    BI-BJ): the ceiling is the device's, not the copy kernel's way with a size."""
    key = (numel, dtype)
    if key not in cache:
        src = torch.empty(numel, dtype=dtype, device=timer.device).fill_(1.0)
        dst = torch.empty_like(src)
        elem = src.element_size()
        counts = [numel]
        mib = (1 << 20) // elem
        if numel >= 4 * mib:
            whole = numel // mib * mib
            counts += [c for c in (whole, whole - mib) if c != numel]
        best = 0.0
        for count in counts:
            s, d = src[:count], dst[:count]
            ms = timer.median_ms(lambda: d.copy_(s), host_time_ms(lambda: d.copy_(s), timer.device))
            best = max(best, 2 * count * elem / (ms * 1e6))
            del s, d
        cache[key] = best
        del src, dst
        empty_cache(timer.device)
    return cache[key]


def reference(op, n, x, dy, w, b):
    """fp32 PyTorch reference: y, dx, dw, db (db None for RMSNorm)."""
    x32 = x.detach().float().requires_grad_(True)
    w32 = w.detach().float().requires_grad_(True)
    if op == "ln":
        b32 = b.detach().float().requires_grad_(True)
        y = F.layer_norm(x32, (n,), w32, b32, EPS)
        dx, dw, db = torch.autograd.grad(y, [x32, w32, b32], dy.float())
    else:
        y = F.rms_norm(x32, (n,), w32, EPS)
        (dx, dw), db = torch.autograd.grad(y, [x32, w32], dy.float()), None
    return y.detach(), dx, dw, db


def short_error(e):
    text = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return text[:160]


def run_cell(op, dtype_name, m, n, libs, timer, copy_cache, args, deadline, results):
    dtype = DTYPES[dtype_name]
    elem = torch.empty((), dtype=dtype).element_size()
    cell = dict(op=op, dtype=dtype_name, M=m, N=n)
    ceiling = copy_gbps(m * n, dtype, timer, copy_cache)
    device = timer.device
    x, dy, w, b = make_inputs(m, n, dtype, device)
    x.requires_grad_(True)
    w.requires_grad_(True)
    if op == "ln":
        b.requires_grad_(True)
    ref = reference(op, n, x, dy, w, b)
    ours = None  # fusednorm's outputs, to compare the peers with
    tol = TOLERANCE[dtype_name]
    for lib in libs:
        rows = {d: dict(cell, direction=d, library=lib, copy_gbps=ceiling) for d in ("fwd", "bwd")}
        jit_heavy = lib in ("compile", "quack")
        if jit_heavy and time.monotonic() > deadline:
            for r in rows.values():
                r["status"] = "skipped (time budget)"
            results.extend(rows.values())
            continue
        try:
            t0 = time.monotonic()
            try:
                impl = make_cell(lib, op, n, x, w, b)
                y = impl.forward()  # first call: compiles where the library compiles
                sync(device)
            except Unavailable:
                raise
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                label = "compile failed" if lib == "compile" else "error"
                raise RuntimeError(f"{label}: {short_error(e)}") from e
            warmup_s = time.monotonic() - t0
            err_y = normwise_error(y, ref[0])
            err_y_ours = normwise_error(y, ours[0]) if ours else float("nan")
            try:
                bwd = impl.backward_setup(dy)
                grads = bwd()
                sync(device)
            except Exception as e:  # noqa: BLE001
                rows["fwd"].update(
                    status="ok" if err_y <= tol else "WRONG",
                    err_ref=err_y,
                    err_fusednorm=err_y_ours,
                    warmup_s=warmup_s,
                )
                rows["bwd"].update(status=f"error: {short_error(e)}")
                del y
                if err_y <= tol:
                    fwd_ms = timer.median_ms(impl.forward, host_time_ms(impl.forward, device))
                    rows["fwd"].update(ms=fwd_ms, gbps=2 * m * n * elem / (fwd_ms * 1e6))
                results.extend(rows.values())
                empty_cache(device)
                continue
            errs = [normwise_error(g, r) for g, r in zip(grads, ref[1:]) if r is not None]
            err_g = max(errs)
            err_g_ours = (
                max(normwise_error(g, o) for g, o in zip(grads, ours[1:]) if o is not None)
                if ours
                else float("nan")
            )
            if lib == "fusednorm":
                ours = (y.detach(),) + tuple(None if g is None else g.detach() for g in grads)
            del grads, y
            warmup_s = time.monotonic() - t0
            for d, err, err_ours in (("fwd", err_y, err_y_ours), ("bwd", err_g, err_g_ours)):
                rows[d].update(
                    err_ref=err,
                    err_fusednorm=err_ours,
                    warmup_s=warmup_s,
                    status="ok" if err <= tol else "WRONG",
                )
            if err_y <= tol:
                fwd_ms = timer.median_ms(impl.forward, host_time_ms(impl.forward, device))
                rows["fwd"].update(ms=fwd_ms, gbps=2 * m * n * elem / (fwd_ms * 1e6))
            if err_g <= tol:
                bwd_ms = timer.median_ms(bwd, host_time_ms(bwd, device))
                rows["bwd"].update(ms=bwd_ms, gbps=3 * m * n * elem / (bwd_ms * 1e6))
            del bwd, impl
        except Unavailable as e:
            for r in rows.values():
                r["status"] = str(e)
        except Exception as e:  # noqa: BLE001
            status = (
                str(e)
                if str(e).startswith(("compile failed", "error"))
                else f"error: {short_error(e)}"
            )
            if args.verbose:
                traceback.print_exc()
            for r in rows.values():
                r.setdefault("status", status)
        results.extend(rows.values())
        empty_cache(device)
    del x, dy, w, b, ref, ours
    empty_cache(device)
    summary = " ".join(
        (
            f"{r['library']}:{r['direction']}={r['gbps']:.0f}"
            if r.get("gbps")
            else f"{r['library']}:{r['direction']}={r['status'][:20]}"
        )
        for r in results
        if (r["op"], r["dtype"], r["M"], r["N"]) == (op, dtype_name, m, n)
    )
    log(f"{OPS[op]} {dtype_name} {m}x{n} copy={ceiling:.0f} GB/s  {summary}")


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------
CSV_FIELDS = [
    "op",
    "direction",
    "dtype",
    "M",
    "N",
    "library",
    "status",
    "ms",
    "gbps",
    "copy_gbps",
    "err_ref",
    "err_fusednorm",
    "warmup_s",
]


def write_csv(path, results):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in results:
            writer.writerow({k: r.get(k, "") for k in CSV_FIELDS})


def _cell_key(r):
    return (r["op"], r["direction"], r["dtype"], r["M"], r["N"])


def write_markdown(path, results, libs, meta):
    cells = {}
    for r in results:
        cells.setdefault(_cell_key(r), {})[r["library"]] = r
    lines = [
        "# fusednorm against its peers",
        "",
        f"{meta}",
        "",
        "GB/s: forward 2*M*N*elem, backward 3*M*N*elem bytes over the median per-call GPU time "
        "(backward = the backward kernels only). % copy: fusednorm against a device-to-device "
        "copy of the same bytes measured in this run. Speedup: fusednorm GB/s over the best "
        "peer's. A peer that failed or gave wrong results says so instead of a number.",
        "",
        "| op | dir | dtype | M | N | "
        + " | ".join(LIB_TITLES[lib_] + " GB/s" for lib_ in libs)
        + " | copy GB/s | % copy | speedup vs best peer |",
        "|" + "---|" * (5 + len(libs) + 3),
    ]
    notes = {}
    order = {"ln": 0, "rms": 1}
    dorder = {"fwd": 0, "bwd": 1}
    for key in sorted(cells, key=lambda k: (order[k[0]], dorder[k[1]], k[2], k[4], k[3])):
        row = cells[key]
        values = []
        for lib in libs:
            r = row.get(lib)
            if r is None:
                values.append("")
            elif r.get("gbps"):
                values.append(f"{r['gbps']:.0f}")
            else:
                status = r.get("status", "?")
                if status.startswith("not installed"):
                    values.append("n/a")
                else:
                    notes.setdefault(status, len(notes) + 1)
                    short = "WRONG" if status == "WRONG" else status.split(":")[0]
                    values.append(f"{short} [{notes[status]}]")
        ours = row.get("fusednorm", {}).get("gbps")
        ceiling = next(iter(row.values())).get("copy_gbps")
        peers = [
            (row[lib_]["gbps"], lib_)
            for lib_ in libs
            if lib_ != "fusednorm" and row.get(lib_, {}).get("gbps")
        ]
        pct = f"{100 * ours / ceiling:.0f}%" if ours and ceiling else ""
        if ours and peers:
            best, best_lib = max(peers)
            speedup = f"{ours / best:.2f}x ({LIB_TITLES[best_lib]})"
        else:
            speedup = ""
        op, direction, dtype, m, n = key
        lines.append(
            f"| {OPS[op]} | {direction} | {dtype} | {m} | {n} | "
            + " | ".join(values)
            + f" | {ceiling:.0f} | {pct} | {speedup} |"
        )
    wrong = [r for r in results if r.get("status") == "WRONG"]
    if notes:
        lines += ["", "Notes:", ""]
        for status, i in notes.items():
            lines.append(f"{i}. {status}")
    if wrong:
        lines += ["", "Wrong results (normwise error against the fp32 reference):", ""]
        for r in wrong:
            lines.append(
                f"- {LIB_TITLES[r['library']]} {OPS[r['op']]} {r['direction']} "
                f"{r['dtype']} {r['M']}x{r['N']}: {r.get('err_ref', float('nan')):.3g}"
            )
    missing = sorted(
        {r["library"] for r in results if r.get("status", "").startswith("not installed")}
    )
    if missing:
        lines += ["", "Not installed: " + ", ".join(LIB_TITLES[lib_] for lib_ in missing) + "."]
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def write_plot(path, results, libs, dtypes, ops, total):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no plot")
        return
    panels = [(op, d) for op in ops for d in ("fwd", "bwd")]
    fig, axes = plt.subplots(
        len(panels), len(dtypes), figsize=(5.5 * len(dtypes), 3.6 * len(panels)), squeeze=False
    )
    colors = {"fusednorm": "C3", "torch": "C0", "compile": "C2", "liger": "C1", "quack": "C4"}
    for i, (op, direction) in enumerate(panels):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            sel = [
                r
                for r in results
                if r["op"] == op and r["direction"] == direction and r["dtype"] == dtype
            ]
            for lib in libs:
                pts = sorted(
                    (r["N"], r["gbps"])
                    for r in sel
                    if r["library"] == lib and r.get("gbps") and r["M"] * r["N"] == total
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        ms=3,
                        color=colors[lib],
                        label=LIB_TITLES[lib],
                    )
                extra = [
                    (r["N"], r["gbps"])
                    for r in sel
                    if r["library"] == lib and r.get("gbps") and r["M"] * r["N"] != total
                ]
                for nn, g in extra:
                    ax.plot([nn], [g], marker="x", ms=7, color=colors[lib], linestyle="none")
            ceilings = [r["copy_gbps"] for r in sel if r["M"] * r["N"] == total]
            if ceilings:
                ax.axhline(
                    statistics.median(ceilings),
                    color="k",
                    linestyle="--",
                    linewidth=1,
                    label="copy",
                )
            ax.set_xscale("log", base=2)
            ax.set_title(f"{OPS[op]} {direction} {dtype}")
            ax.set_xlabel(f"N (M = {total} / N; x: extra shapes)")
            ax.set_ylabel("GB/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help=f"N in {QUICK_N}, no extra shapes, fewer repetitions"
    )
    p.add_argument("--ops", default="ln,rms", help="comma list of ln, rms (default both)")
    p.add_argument("--dtypes", default="bf16,fp16,fp32", help="comma list of bf16, fp16, fp32")
    p.add_argument(
        "--n",
        default=None,
        help="comma list of N (M = 2^27 // N, as in the grid); disables extras",
    )
    p.add_argument(
        "--libs", default=",".join(LIBRARIES), help="comma list of " + ", ".join(LIBRARIES)
    )
    p.add_argument("--no-extra", action="store_true", help="skip the two extra shapes")
    p.add_argument("--extra", action="store_true", help="with --n: keep the two extra shapes")
    p.add_argument("--out", default="out/compare", help="output directory (default out/compare)")
    p.add_argument(
        "--budget",
        type=float,
        default=420.0,
        help="seconds after which compile/QuACK (JIT-heavy) are skipped (default 420)",
    )
    p.add_argument(
        "--timer",
        default="sleep",
        choices=["sleep", "events"],
        help="sleep: batches of calls queued behind a GPU sleep (default); events: events "
        "around every call (fnbench's way), to cross-check",
    )
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    p.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: smoke-test this script on small shapes (numbers meaningless)",
    )
    p.add_argument(
        "--total",
        type=int,
        default=TOTAL_ELEMENTS,
        help="M*N per grid cell (default 2^27, fnbench's); lower for smoke tests",
    )
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.libs = [lib_ for lib_ in args.libs.split(",") if lib_]
    for values, allowed, what in (
        (args.ops, OPS, "--ops"),
        (args.dtypes, DTYPES, "--dtypes"),
        (args.libs, LIBRARIES, "--libs"),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"{what}: unknown {bad}; choose from {list(allowed)}")
    if "fusednorm" not in args.libs:
        args.libs.insert(0, "fusednorm")  # the others are compared with it
    if args.n:
        args.n = [int(v) for v in args.n.split(",")]
        bad = [v for v in args.n if v <= 0 or v > args.total]
        if bad:
            p.error(f"--n: {bad} not in 1..{args.total}")
        args.no_extra = not args.extra
    else:
        args.n = QUICK_N if args.quick else GRID_N
    if args.quick:
        args.no_extra = True
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("compare.py needs a CUDA GPU (or --device cpu for a smoke test)")
        status = fusednorm._lib.device_available(fusednorm._lib.DEVICE_CUDA)
        if status != 0:
            sys.exit(
                f"libfusednorm ({fusednorm.library_path}) cannot run on CUDA: "
                f"{fusednorm._lib.status_name(status)}"
            )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(
        reps=5 if args.quick else 9,
        calls=3 if args.quick else 5,
        device=args.device,
        mode=args.timer,
    )
    cells = [(op, d, args.total // n, n) for op in args.ops for d in args.dtypes for n in args.n]
    if not args.no_extra:
        cells += [(op, d, m, n) for op in args.ops for d, m, n in EXTRA_SHAPES if d in args.dtypes]
    versions = [f"torch {torch.__version__}", f"fusednorm {fusednorm.__version__}"]
    for mod in ("triton", "liger_kernel", "quack"):
        try:
            versions.append(f"{mod} {getattr(importlib.import_module(mod), '__version__', '?')}")
        except Exception:  # noqa: BLE001
            versions.append(f"{mod} not installed")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU smoke test"
    meta = f"{device_name} ({platform.node()}), {time.strftime('%Y-%m-%d %H:%M')}; " + ", ".join(
        versions
    )
    log(meta)
    log(f"{len(cells)} cells x {len(args.libs)} libraries -> {out}")
    deadline = START + args.budget
    results = []
    copy_cache = {}
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i, (op, d, m, n) in enumerate(cells):
        log(f"cell {i + 1}/{len(cells)}: {OPS[op]} {d} {m}x{n}")
        run_cell(op, d, m, n, args.libs, timer, copy_cache, args, deadline, results)
        write_csv(out / "compare.csv", results)  # a run cut short keeps what it measured
    write_markdown(out / "compare.md", results, args.libs, meta)
    write_plot(out / "compare.png", results, args.libs, args.dtypes, args.ops, args.total)
    peak = (
        f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB; "
        if args.device == "cuda"
        else ""
    )
    log(f"{peak}wrote {out / 'compare.md'}, {out / 'compare.csv'}, {out / 'compare.png'}")


if __name__ == "__main__":
    main()
