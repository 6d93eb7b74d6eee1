#!/usr/bin/env python3
"""Which physical GPU CUDA puts at each device ordinal under a given ``CUDA_VISIBLE_DEVICES`` (libcuda, no torch).

Device binding rests on this: serve-full and trials hand the engine its GPUs as ``CUDA_VISIBLE_DEVICES`` in rank
order, and the engine puts local rank r on ordinal r. For each setting (unset, indices, swapped indices, UUIDs,
UUID prefixes, a typo, a GPU named twice) a child process initialises CUDA and prints the UUID at every ordinal,
mapped back to nvidia-smi's index. Needs two GPUs or more. Usage: ``python3 scripts/gpu/cuda_order_probe.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuInit(0)
if rc != 0:
    print("cuInit rc=%d" % rc)
    raise SystemExit(0)
count = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(count))
found = []
for ordinal in range(count.value):
    device = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), ordinal)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(raw, device)
    h = bytes(raw).hex()
    found.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
print(",".join(found))
"""


def main() -> int:
    listing = subprocess.check_output(
        ["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"], text=True
    ).strip()
    rows = [line.split(", ") for line in listing.splitlines()]
    print("nvidia-smi:", rows)
    uuids = [row[1] for row in rows]
    if len(uuids) < 2:
        print("needs two GPUs or more", file=sys.stderr)
        return 2
    cases = {
        "unset": None,
        "0,1": "0,1",
        "1,0": "1,0",
        "uuid1,uuid0": f"{uuids[1]},{uuids[0]}",
        "prefix1,prefix0": f"{uuids[1][:8]},{uuids[0][:8]}",
        "0,9 (typo last)": "0,9",
        "9,0 (typo first)": "9,0",
        "0,0 (twice)": "0,0",
    }
    for name, value in cases.items():
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if value is not None:
            env["CUDA_VISIBLE_DEVICES"] = value
        got = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False)
        order = got.stdout.strip()
        if order.startswith("cuInit") or not order:
            seen = order or got.stderr.strip()[:200]
        else:
            seen = "ordinals -> nvidia-smi indices " + ",".join(
                str(uuids.index(u)) if u in uuids else u for u in order.split(",")
            )
        print(f"{name:18} CUDA_VISIBLE_DEVICES={value!r}: {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
