#!/usr/bin/env python3
"""The LayerNorm correction's sum S1 = sum(x - m1) on 16-bit rows, two ways (forward.cu,
centred_sum_from_sum): as the kernels took it up to session 41 (each thread adds its centred values,
an add a value) and from the thread's plain sum s in one rounding (fmaf(-n, m1, s)). Simulates in
float32 with numpy the packed rows form (fwd_rows_packed_kernel: 256 threads a row, 8 16-bit
elements a vector, VPL vectors a thread, four partial sums a thread, the warps' butterfly sums, the
warps added in order, ln_stats, y = fma(x - m1, rstd, -c * rstd) rounded to the row's dtype) and
compares y both ways against a float64 reference rounded the same way, in ulps of the 16-bit dtype.
The fused multiply-adds are taken in float64 and rounded once to float32 (exact for these
operands). Rows: N(0, 1), far from zero (1e4 + N(0, 1), 1e3 + N(0, 10)), values spread over many
binades (random signs, magnitudes 10^U(-4, 4)), and a row far from zero with a tenth of its values
tiny (the case where a thread's plain sum rounds). Prints the worst element of 8 rows each."""
import numpy as np

f32, f64 = np.float32, np.float64


def to16(a, dt):
    if dt == "fp16":
        return a.astype(np.float16).astype(f32)
    u = a.astype(f32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(f32)


def fma(a, b, c):
    return (a.astype(f64) * b.astype(f64) + c.astype(f64)).astype(f32)


def cta_sum(t):
    """t: (256,) float32, thread j of warp w at 32 w + j. Butterfly within each warp, then the
    eight warps' sums added in order (group_sum, warps_sum)."""
    w = t.reshape(8, 32).copy()
    off = 16
    while off:
        w = (w + w[:, np.arange(32) ^ off]).astype(f32)
        off //= 2
    s = w[0, 0]
    for i in range(1, 8):
        s = f32(s + w[i, 0])
    return s


def packed_y(x, dt, vpl, from_sum, own_mean=False):
    n = x.size
    inv_n = f32(1.0 / n)
    # vector k of thread (warp, lane) at ((k * 8 + warp) * 32 + lane) * 8: thread t = 32 warp + lane
    v = x.reshape(vpl, 256, 8).transpose(1, 0, 2)  # (thread, k, element)
    p = np.zeros((256, 4), f32)
    for k in range(vpl):
        for j in range(8):
            p[:, j & 3] = (p[:, j & 3] + v[:, k, j]).astype(f32)
    own = ((p[:, 0] + p[:, 1]).astype(f32) + (p[:, 2] + p[:, 3]).astype(f32)).astype(f32)
    m1 = f32(cta_sum(own) * inv_n)
    mt = (own * f32(1.0 / (vpl * 8))).astype(f32)
    centre = mt if own_mean else np.full(256, m1, f32)
    c2 = np.zeros((256, 2), f32)
    q2 = np.zeros((256, 2), f32)
    for k in range(vpl):
        for j in range(8):
            d = (v[:, k, j] - centre).astype(f32)
            c2[:, j & 1] = (c2[:, j & 1] + d).astype(f32)
            q2[:, j & 1] = fma(d, d, q2[:, j & 1])
    if from_sum:
        t0 = fma(np.full(256, -f32(vpl * 8), f32), np.full(256, m1, f32), own)
    else:
        t0 = (c2[:, 0] + c2[:, 1]).astype(f32)
    t1 = (q2[:, 0] + q2[:, 1]).astype(f32)
    if own_mean:
        t1 = fma(t0, (mt - m1).astype(f32), t1)
    s1, s2 = cta_sum(t0), cta_sum(t1)
    c = f32(s1 * inv_n)
    var = f32(f32(s2 * inv_n) - f32(c * c))
    rstd = f32(1.0 / np.sqrt(f64(f32(max(var, f32(0)) + f32(1e-5)))))
    shift = f32(-c * rstd)
    y = fma((x - m1).astype(f32), np.full(n, rstd, f32), np.full(n, shift, f32))
    return to16(y, dt)


def main():
    rng = np.random.default_rng(7)
    print("dtype N input | worst |y - ref| in ulps of y: centred sum, from the plain sum, and that "
          "with the squares about the thread's own mean | elements differing between the first "
          "two, of 8 rows")
    rows = {
        "N(0,1)": lambda n: rng.standard_normal(n),
        "1e4+N(0,1)": lambda n: 1e4 + rng.standard_normal(n),
        "1e3+N(0,10)": lambda n: 1e3 + 10 * rng.standard_normal(n),
        "spread": lambda n: rng.choice([-1, 1], n) * 10.0 ** rng.uniform(-4, 4, n),
        "1e4, a tenth tiny": lambda n: np.where(rng.uniform(size=n) < 0.1,
                                                1e-3 * rng.standard_normal(n),
                                                1e4 + rng.standard_normal(n)),
    }
    for dt in ("bf16", "fp16"):
        for n in (16384, 32768):
            vpl = n // 2048
            for name, gen in rows.items():
                worst_a = worst_b = worst_c = 0.0
                differ = 0
                for _ in range(8):
                    x = to16(gen(n), dt)
                    xd = x.astype(f64)
                    mean, var = xd.mean(), xd.var()
                    ref = (xd - mean) / np.sqrt(var + 1e-5)
                    ya = packed_y(x, dt, vpl, False).astype(f64)
                    yb = packed_y(x, dt, vpl, True).astype(f64)
                    yc = packed_y(x, dt, vpl, True, True).astype(f64)
                    bits = 7 if dt == "bf16" else 10
                    ulp = np.maximum(np.abs(ref), 2.0 ** -14) * 2.0 ** -bits
                    worst_a = max(worst_a, float(np.max(np.abs(ya - ref) / ulp)))
                    worst_b = max(worst_b, float(np.max(np.abs(yb - ref) / ulp)))
                    worst_c = max(worst_c, float(np.max(np.abs(yc - ref) / ulp)))
                    differ += int(np.count_nonzero(ya != yb))
                print("%s %d %s | %.3f %.3f %.3f | %d of %d" % (dt, n, name, worst_a, worst_b,
                                                                worst_c, differ, 8 * n))


if __name__ == "__main__":
    main()
