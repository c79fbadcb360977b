#!/usr/bin/env python3
"""Reads shardsim checkpoints with h5py (an independent HDF5 reader) and checks them against the C++ side.

usage: ckpt_h5py.py CHECKPOINT.h5 DUMP.json [CHECKPOINT.h5 DUMP.json ...]
DUMP.json is `shardsim ckpt inspect CHECKPOINT --dump TENSOR` output (the values the C++ reader reports).
For each pair: h5py's values of the tensor equal the dump's exactly; the checksum recomputed here with numpy
from h5py's data (definition in checkpoint/checkpoint.h) equals the stored attribute and the dump's; the dataset's
shape, dtype attribute and HDF5 element size agree. bf16 is read through HDF5's conversion to float32
(ds.astype('f4')), which is exact. Exit 0 if all hold, 1 otherwise (each problem printed).
"""
import json
import sys

import h5py
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def fmix64(x):
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def checksum(bits):
    bits = bits.reshape(-1).astype(np.uint64)
    i = np.arange(bits.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(fmix64(bits ^ (i * GOLDEN)).sum(dtype=np.uint64))


def stored_bits(ds, dtype):
    """The tensor's stored bit patterns as unsigned integers, plus float64 values, read by h5py."""
    if dtype == "bf16":
        f32 = ds.astype("f4")[()]
        u32 = f32.view(np.uint32)
        if np.any(u32 & 0xFFFF):
            raise ValueError("bf16 values widened to fp32 have non-zero low bits: not bf16 data")
        return (u32 >> 16).astype(np.uint16), f32.astype(np.float64)
    if dtype == "fp8_e4m3":
        raise ValueError("fp8_e4m3 is stored as raw bits; this checker does not decode it")
    arr = ds[()]
    return arr.view(BITS[arr.dtype.itemsize]), arr.astype(np.float64)


def check(path, dump_path):
    problems = []
    with open(dump_path) as f:
        dump = json.load(f)
    name, dtype = dump["name"], dump["dtype"]
    with h5py.File(path, "r") as h5:
        if h5.attrs.get("format") not in (b"shardsim-checkpoint", "shardsim-checkpoint"):
            problems.append("root attribute format is not shardsim-checkpoint")
        ds = h5[name]
        attr_dtype = ds.attrs["dtype"]
        attr_dtype = attr_dtype.decode() if isinstance(attr_dtype, bytes) else str(attr_dtype)
        if attr_dtype != dtype:
            problems.append(f"{name}: dtype attribute {attr_dtype}, the C++ dump says {dtype}")
        if list(ds.shape) != dump["shape"] or list(ds.attrs["global_shape"]) != dump["shape"]:
            problems.append(f"{name}: h5py shape {ds.shape} / global_shape {list(ds.attrs['global_shape'])}, "
                            f"C++ {dump['shape']}")
        # The file's element type: a float of the right size and bit layout (h5py may widen bf16 to float32 in
        # memory, since numpy has no bfloat16; the file keeps 2 bytes per element).
        ftype = ds.id.get_type()
        layouts = {"bf16": (2, (15, 7, 8, 0, 7), 127), "fp16": (2, (15, 10, 5, 0, 10), 15),
                   "fp32": (4, (31, 23, 8, 0, 23), 127), "fp64": (8, (63, 52, 11, 0, 52), 1023)}
        if dtype in layouts:
            size, fields, ebias = layouts[dtype]
            got = (ftype.get_size(), tuple(ftype.get_fields()), ftype.get_ebias())
            if got != (size, fields, ebias):
                problems.append(f"{name}: HDF5 float type (size, fields, ebias) = {got}, expected "
                                f"{(size, fields, ebias)} for {dtype}")
        if dtype in ("bf16", "fp16", "fp32", "fp64") and ds.dtype.kind != "f":
            problems.append(f"{name}: h5py sees {ds.dtype}, not a float type")
        bits, values = stored_bits(ds, dtype)
        cpp = np.array(dump["values"], dtype=np.float64).reshape(dump["shape"])
        if values.shape != cpp.shape:
            problems.append(f"{name}: h5py shape {values.shape}, C++ dump shape {cpp.shape}")
        elif not np.array_equal(values, cpp):
            k = int(np.argmax(values.reshape(-1) != cpp.reshape(-1)))
            problems.append(f"{name}: element {k} differs: h5py {values.reshape(-1)[k]!r}, C++ {cpp.reshape(-1)[k]!r}")
        mine = checksum(bits)
        stored = int(ds.attrs["checksum"])
        if mine != stored:
            problems.append(f"{name}: numpy checksum 0x{mine:016x} != stored attribute 0x{stored:016x}")
        if f"0x{stored:016x}" != dump["checksum"]:
            problems.append(f"{name}: stored attribute 0x{stored:016x} != C++ report {dump['checksum']}")
        print(f"{path} {name}: {dtype} {list(ds.shape)} (h5py dtype {ds.dtype}), {values.size} values equal, "
              f"checksum 0x{mine:016x} {'ok' if mine == stored else 'MISMATCH'}")
    return problems


def main(argv):
    if len(argv) < 3 or len(argv) % 2 == 0:
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    for path, dump in zip(argv[1::2], argv[2::2]):
        problems += check(path, dump)
    for p in problems:
        print("FAIL " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
