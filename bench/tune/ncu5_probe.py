"""ncu5 (developer probe): what torch.compile generates for the forward at three bf16 shapes, and
one profiled launch of each for Nsight Compute. Run on the GPU machine:

    TORCH_LOGS=output_code python3 bench/tune/ncu5_probe.py      # the generated Triton source
    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats \\
        --section WarpStateStats python3 bench/tune/ncu5_probe.py

The autotuner's choices are in TORCHINDUCTOR_CACHE_DIR's *.best_config files. Other shapes:
`python3 bench/tune/ncu5_probe.py 524288x256 262144x512` (M x N, bf16).
"""

import sys

import torch
import torch.nn.functional as F

SHAPES = [(8192, 16384), (131072, 1024), (32768, 4096)]  # (M, N), bf16


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def main():
    runs = []
    shapes = [tuple(int(v) for v in arg.split("x")) for arg in sys.argv[1:]] or SHAPES
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ln = torch.compile(layer_norm, dynamic=False)
        rms = torch.compile(rms_norm, dynamic=False)
        for _ in range(5):  # compile, autotune and warm up outside the profiled range
            ln(x, w, b)
            rms(x, w)
        torch.cuda.synchronize()
        runs.append((ln, rms, x, w, b))
    torch.cuda.cudart().cudaProfilerStart()
    for ln, rms, x, w, b in runs:
        ln(x, w, b)
        rms(x, w)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("done")


if __name__ == "__main__":
    main()
