#!/usr/bin/env python3
"""Where compare.py's fusednorm backward loses time: the op called directly, against the same
op reached through torch.autograd.grad (as compare.py times every library's backward).

LayerNorm bf16, 262144 x 512 (2^27 elements), 12 trials, each with freshly allocated inputs at
shifted addresses (to expose any dependence on where the caching allocator puts them). Each
call is bracketed by its own CUDA events (fnbench's way); the median of 40 calls per trial.
Prints per trial: the inputs' addresses modulo 256 MiB, then GB/s of the direct backward, the
forward, and the backward through autograd (3*M*N*elem and 2*M*N*elem bytes).

    FUSEDNORM_LIBRARY=build/libfusednorm.so PYTHONPATH=python python3 bench/autograd_probe.py
"""

import statistics

import torch

import fusednorm

M, N, DTYPE, EPS = 262144, 512, torch.bfloat16, 1e-5


def gbps(ms, arrays):
    return arrays * M * N * 2 / (ms * 1e6)


def timed(fn, calls=40):
    fn()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(calls)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main():
    keep = []  # allocations that shift the next trial's tensors
    for trial in range(12):
        keep.append(
            torch.empty((trial * 5 + 1) << 20 | trial << 16, dtype=torch.uint8, device="cuda")
        )
        x = torch.randn(M, N, device="cuda", dtype=DTYPE)
        dy = torch.randn_like(x)
        w = torch.randn(N, device="cuda", dtype=DTYPE)
        b = torch.randn_like(w)
        y, mean, rstd = torch.ops.fusednorm.norm_fwd(x, w, b, N, False, EPS, False)
        direct = lambda: torch.ops.fusednorm.norm_bwd(  # noqa: E731
            dy, x, mean, rstd, w, b, N, False, EPS, False, True, True, True
        )
        forward = lambda: torch.ops.fusednorm.norm_fwd(x, w, b, N, False, EPS, False)  # noqa: E731
        xr, wr, br = (t.detach().requires_grad_(True) for t in (x, w, b))
        yr = fusednorm.layer_norm(xr, (N,), wr, br, EPS)
        via_autograd = lambda: torch.autograd.grad(yr, [xr, wr, br], dy, retain_graph=True)  # noqa
        t_direct, t_fwd, t_autograd = timed(direct), timed(forward), timed(via_autograd)
        addrs = " ".join("%07x" % (t.data_ptr() % (1 << 28)) for t in (x, dy, y))
        print(
            f"{trial:2d} x/dy/y at {addrs}: backward {gbps(t_direct, 3):.0f} GB/s, forward "
            f"{gbps(t_fwd, 2):.0f}, backward through autograd {gbps(t_autograd, 3):.0f}",
            flush=True,
        )
        del x, dy, y, mean, rstd, xr, wr, br, yr


if __name__ == "__main__":
    main()
