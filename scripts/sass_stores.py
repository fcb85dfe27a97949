#!/usr/bin/env python3
"""Developer tool: the global stores of each kernel in a CUDA object or library, by width.

    scripts/sass_stores.py build/CMakeFiles/fusednorm_objects.dir/src/cuda/backward.cu.o
    scripts/sass_stores.py --filter bwd_batch --narrow build/libfusednorm.a

Prints, for each kernel (demangled), how many STG instructions of each width its machine code
holds (STG.E is 32 bits, .64 and .128 wider; .U8/.U16 narrower). A kernel that means to store
16-byte vectors but shows 32- or 64-bit stores beside its 128-bit ones has had some of its vector
stores split: the compiler wrote a 16-byte store as several narrower ones where the values did not
sit in four consecutive registers. That cost the backward's batch tier 10% at rows of 16384
(ncu31, session 54: a quarter of dx's stores in three pieces, 16.8 million more L2 sectors read)
and cost the forward 2-10 points before store_vec's ONE_STORE (A/B run BC). Some narrow stores are
meant (mean and rstd, one float a row), so read the counts against the kernel's source.

--narrow lists only kernels with 128-bit stores and more than --allow narrower ones (default 4).
The disassembler is $CUOBJDUMP, else `cuobjdump` on the PATH.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys


def sass(path):
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_stores.py: no cuobjdump (set CUOBJDUMP or put it on the PATH)")
    return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return out.splitlines() if out else names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("object", help="a .o, .a, .so or cubin with sm_90 (or other) machine code")
    ap.add_argument("--filter", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--narrow", action="store_true", help="only kernels whose stores look split")
    ap.add_argument("--allow", type=int, default=4, help="narrow stores allowed with --narrow")
    args = ap.parse_args()

    counts = collections.OrderedDict()
    kernel = None
    for line in sass(args.object).splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            kernel = m.group(1)
            counts.setdefault(kernel, collections.Counter())
            continue
        m = re.search(r"\bSTG\.E(\.U8|\.S8|\.U16|\.S16|\.64|\.128)?\b", line)
        if kernel and m:
            counts[kernel]["STG" + (m.group(1) or ".32")] += 1

    rows = []
    for name, c in counts.items():
        if args.filter not in name:
            continue
        narrow = sum(n for w, n in c.items() if w != "STG.128")
        if args.narrow and not (c["STG.128"] and narrow > args.allow):
            continue
        rows.append((name, c))
    for (_, c), pretty in zip(rows, demangle([r[0] for r in rows])):
        widths = " ".join(f"{w}:{c[w]}" for w in sorted(c))
        print(f"{widths or 'no global stores'}\t{pretty}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
