#!/usr/bin/env python3
"""Lead (13) of bench/RESULTS.md: what the correction sum in `held_moments` (forward.cu) is worth on
16-bit rows. Simulates, in float32 with numpy, one CTA's chunk of a 65536-element row in the
clustered GB kernel (512 threads, four 8-element vectors a thread, vector k of thread t at t + k *
512, each pair of vectors centred on its own mean and the pairs merged as the FULL form does) with
and without the correction sum, the threads then combined exactly in float64 (the same for both),
and compares mean, variance and y = (x - mean) * rstd against a float64 reference, on bf16 and
fp16 rows of N(offset, scale). numpy has no fused multiply-add: the sums of squares round twice
where the kernel rounds once (the same for both variants). Prints the worst of four rows each."""
import numpy as np

f32 = np.float32


def thread_stats(v, use_rel):
    """v: (threads, 4, 8) float32. The thread's mean (mt + rel) and sum of squares about it."""
    t = v.shape[0]
    bm, br, bq = (np.zeros((2, t), f32) for _ in range(3))
    for b in range(2):
        raw = v[:, 2 * b : 2 * b + 2, :]
        p0, p1 = np.zeros(t, f32), np.zeros(t, f32)
        for k in range(2):
            for e in range(0, 8, 2):
                p0 = f32(p0 + raw[:, k, e])
                p1 = f32(p1 + raw[:, k, e + 1])
        m = f32(f32(p0 + p1) * f32(1 / 16))
        d0, d1, q0, q1 = (np.zeros(t, f32) for _ in range(4))
        for k in range(2):
            for e in range(0, 8, 2):
                x0, x1 = f32(raw[:, k, e] - m), f32(raw[:, k, e + 1] - m)
                d0, d1 = f32(d0 + x0), f32(d1 + x1)
                q0, q1 = f32(q0 + f32(x0 * x0)), f32(q1 + f32(x1 * x1))
        if use_rel:
            s1 = f32(d0 + d1)
            rel = f32(s1 * f32(1 / 16))
            m2 = f32(f32(q0 + q1) - f32(s1 * rel))
        else:
            rel, m2 = np.zeros(t, f32), f32(q0 + q1)
        bm[b], br[b], bq[b] = m, rel, m2
    delta = f32(f32(bm[1] - bm[0]) + f32(br[1] - br[0]))
    rel = f32(f32(0.5) * delta + br[0])
    m2t = f32(f32(bq[0] + bq[1]) + f32(f32(8) * delta) * delta)
    return bm[0].astype(np.float64) + rel.astype(np.float64), m2t.astype(np.float64)


def row_stats(x, threads, use_rel):
    mean_t, m2_t = thread_stats(x.reshape(4, threads, 8).transpose(1, 0, 2), use_rel)
    mean = mean_t.mean()  # equal counts
    return mean, (m2_t.sum() + (32 * (mean_t - mean) ** 2).sum()) / x.size


def to16(a, dt):
    if dt == "fp16":
        return a.astype(np.float16).astype(np.float32)
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def main():
    rng = np.random.default_rng(1)
    n, threads = 16384, 512
    print("dtype offset scale | mean error / std: with, without | variance relative error: with,"
          " without | largest |y with - y without|, in ulps of y's 16-bit dtype")
    for dt in ("bf16", "fp16"):
        for off, sc in ((0, 1), (10, 1), (100, 1), (1000, 10), (30000, 100), (1e4, 1)):
            worst = [0.0] * 5
            for _ in range(4):
                x = to16(off + sc * rng.standard_normal(n), dt)
                ref_mean, ref_var = x.astype(np.float64).mean(), x.astype(np.float64).var()
                if ref_var == 0:
                    continue
                (ma, va), (mb, vb) = row_stats(x, threads, True), row_stats(x, threads, False)
                sd = np.sqrt(ref_var)
                ya, yb = (x - ma) / np.sqrt(va), (x - mb) / np.sqrt(vb)
                yr = np.abs((x - ref_mean) / sd)
                bits = 7 if dt == "bf16" else 10
                ulp = np.maximum(yr, 2.0 ** -14) * 2.0 ** -bits
                worst = [max(worst[0], abs(ma - ref_mean) / sd), max(worst[1], abs(mb - ref_mean) / sd),
                         max(worst[2], abs(va / ref_var - 1)), max(worst[3], abs(vb / ref_var - 1)),
                         max(worst[4], float(np.max(np.abs(ya - yb) / ulp)))]
            print("%s %g %g | %.1e %.1e | %.1e %.1e | %.2e" % (dt, off, sc, *worst))


if __name__ == "__main__":
    main()
