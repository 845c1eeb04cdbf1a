#!/usr/bin/env python3
"""Captures what a CUDA driver reports: every device attribute, and how the entry points the
simulator exports behave. Its output has the format of tools/simgpu/profile/stock-hopper.json,
the stock-driver profile the simulated GPU (tools/simgpu) reports its attributes from.

    python3 tools/simgpu/capture-profile.py [--profile P] [--device N] [--out FILE]
                                            [--compare PROFILE] [--check]

--profile  the profile that names the attributes (and their ids) and entry points to read;
           its notes, per_device flags and not_simulated list are carried into the output
           (default: tools/simgpu/profile/stock-hopper.json)
--device   the device ordinal to read (default 0)
--out      write the captured profile there (JSON, the same format)
--compare  print one line per attribute or entry point whose captured value differs from
           PROFILE's (per_device attributes skipped; not_simulated ones reported as
           "stock X, simulator 0 (not simulated)"); exits 0
--check    as --compare (against --compare's PROFILE, or else --profile), but exit 1 on any
           difference outside per_device / not_simulated

Python 3 standard library only (ctypes). Works on a real GPU and under the simulator
(`bash scripts/sim-gpu.sh python3 tools/simgpu/capture-profile.py --check` is what
`cargo test -p ferroccl-simgpu` runs: the simulator must report the profile's values).
Every line is printed (and flushed) as it is measured, so a hang shows where it is.

Replacing the committed profile with a capture, on a machine with a stock driver (no MPS
daemon, the nvidia module loaded without NVreg_EnableStreamMemOPs):

    python3 tools/simgpu/capture-profile.py --out /tmp/stock.json \\
        --compare tools/simgpu/profile/stock-hopper.json
    # read the differences; each is a value the simulator reported wrongly
    cp /tmp/stock.json tools/simgpu/profile/stock-hopper.json
    cargo test --release -p ferroccl-simgpu   # the simulator now reports the captured values
    # and update docs/sim-gpu.md where it quotes a value that changed

The capture keeps the committed profile's notes, per_device flags and not_simulated list
(they describe the simulator, not the driver); review them against the new values.
"""

import argparse
import ctypes
import datetime
import json
import mmap
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROFILE = os.path.join(HERE, "profile", "stock-hopper.json")

CU_STREAM_NON_BLOCKING = 0x1
CU_MEMHOSTREGISTER_PORTABLE = 0x1
CU_MEMHOSTREGISTER_DEVICEMAP = 0x2
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1
CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2
CUDA_ERROR_NOT_READY = 600
# cuDeviceGetName under tools/simgpu.
SIMULATED_NAME = "ferroccl simulated GPU"
# A wait whose value is already there completes at once; this bounds a driver that hangs.
SYNC_LIMIT_S = 10.0

# The stream memory operation entry points probed by running them: name -> (kind, width).
MEMOPS = {
    "cuStreamWaitValue32": ("wait", 32),
    "cuStreamWaitValue64": ("wait", 64),
    "cuStreamWriteValue32": ("write", 32),
    "cuStreamWriteValue64": ("write", 64),
    "cuStreamBatchMemOp": ("batch", 32),
    "cuStreamWaitValue32_v2": ("wait", 32),
    "cuStreamWaitValue64_v2": ("wait", 64),
    "cuStreamWriteValue32_v2": ("write", 32),
    "cuStreamWriteValue64_v2": ("write", 64),
    "cuStreamBatchMemOp_v2": ("batch", 32),
}


def say(line):
    print(line, flush=True)


class CuError(Exception):
    pass


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.c_void_p = ctypes.c_void_p

    def has(self, name):
        try:
            getattr(self.lib, name)
            return True
        except AttributeError:
            return False

    def fn(self, name, *argtypes):
        f = getattr(self.lib, name)
        f.restype = ctypes.c_int
        f.argtypes = list(argtypes)
        return f

    def name(self, rc):
        s = ctypes.c_char_p()
        f = self.fn("cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        if f(rc, ctypes.byref(s)) != 0 or not s.value:
            return "CUresult %d" % rc
        return s.value.decode()

    def call(self, what, rc):
        if rc != 0:
            raise CuError("%s -> %s" % (what, self.name(rc)))


def load_profile(path):
    with open(path) as f:
        return json.load(f)


def dump(profile):
    """The profile as JSON, one attribute or entry point a line (small diffs on replace)."""
    out = ["{"]
    keys = [k for k in profile if k not in ("attributes", "not_simulated", "entry_points")]
    for k in keys:
        out.append("  %s: %s," % (json.dumps(k), json.dumps(profile[k])))
    out.append('  "attributes": {')
    items = sorted(profile["attributes"].items(), key=lambda kv: kv[1]["id"])
    for i, (name, entry) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        out.append("    %s: %s%s" % (json.dumps(name), json.dumps(entry), comma))
    out.append("  },")
    out.append('  "not_simulated": [')
    ns = profile.get("not_simulated", [])
    for i, entry in enumerate(ns):
        comma = "," if i + 1 < len(ns) else ""
        out.append("    %s%s" % (json.dumps(entry), comma))
    out.append("  ],")
    out.append('  "entry_points": {')
    eps = sorted(profile.get("entry_points", {}).items())
    for i, (name, v) in enumerate(eps):
        comma = "," if i + 1 < len(eps) else ""
        out.append("    %s: %s%s" % (json.dumps(name), json.dumps(v), comma))
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def read_attributes(cu, base, dev):
    get = cu.fn("cuDeviceGetAttribute", ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int)
    attrs = {}
    for name, entry in sorted(base["attributes"].items(), key=lambda kv: kv[1]["id"]):
        v = ctypes.c_int(0)
        rc = get(ctypes.byref(v), entry["id"], dev)
        new = {"id": entry["id"]}
        if rc == 0:
            new["value"] = v.value
            say("attribute %s (%d) = %d" % (name, entry["id"], v.value))
        else:
            new["value"] = None
            new["error"] = cu.name(rc)
            say("attribute %s (%d): %s" % (name, entry["id"], new["error"]))
        for k in ("per_device", "note"):
            if k in entry:
                new[k] = entry[k]
        attrs[name] = new
    return attrs


def sync(cu, stream):
    """cuStreamQuery until done, at most SYNC_LIMIT_S: a stuck wait must not hang the capture."""
    query = cu.fn("cuStreamQuery", cu.c_void_p)
    t0 = time.monotonic()
    while True:
        rc = query(stream)
        if rc != CUDA_ERROR_NOT_READY:
            return rc
        if time.monotonic() - t0 > SYNC_LIMIT_S:
            return None
        time.sleep(0.001)


class BatchOp(ctypes.Structure):
    # CUstreamBatchMemOpParams (a 48-byte union) as its wait/write member: operation at 0,
    # address at 8, value at 16, flags at 24, alias at 32.
    _fields_ = [
        ("operation", ctypes.c_uint32),
        ("_pad0", ctypes.c_uint32),
        ("address", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("_pad1", ctypes.c_uint32),
        ("alias", ctypes.c_uint64),
        ("_pad2", ctypes.c_uint64),
    ]


def probe_memop(cu, name, kind, width, host, dev_ptr, slot):
    """One wait or write (a batch: one of each) on a registered word, on a fresh stream,
    then synchronised. Returns "available" or what went wrong (a CUresult name)."""
    if not cu.has(name):
        return "missing"
    stream = ctypes.c_void_p()
    cu.call("cuStreamCreate", cu.fn("cuStreamCreate", ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint)(
        ctypes.byref(stream), CU_STREAM_NON_BLOCKING))
    try:
        word = ctypes.c_uint64 if width == 64 else ctypes.c_uint32
        vt = ctypes.c_uint64 if width == 64 else ctypes.c_uint32
        off = 8 * slot
        target = word.from_address(host + off)
        flag = word.from_address(host + 512 + off)
        flag.value = 7
        target.value = 0
        if kind == "wait":
            rc = cu.fn(name, cu.c_void_p, ctypes.c_uint64, vt, ctypes.c_uint)(
                stream, dev_ptr + 512 + off, 7, CU_STREAM_WAIT_VALUE_GEQ)
        elif kind == "write":
            rc = cu.fn(name, cu.c_void_p, ctypes.c_uint64, vt, ctypes.c_uint)(stream, dev_ptr + off, 9, 0)
        else:
            ops = (BatchOp * 2)()
            ops[0].operation, ops[0].address, ops[0].value = CU_STREAM_MEM_OP_WAIT_VALUE_32, dev_ptr + 512 + off, 7
            ops[1].operation, ops[1].address, ops[1].value = CU_STREAM_MEM_OP_WRITE_VALUE_32, dev_ptr + off, 9
            rc = cu.fn(name, cu.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint)(stream, 2, ops, 0)
        if rc != 0:
            return cu.name(rc)
        done = sync(cu, stream)
        if done is None:
            return "hang (not complete after %.0f s)" % SYNC_LIMIT_S
        if done != 0:
            return cu.name(done)
        if kind != "wait" and target.value != 9:
            return "wrong result (the word is %d after the write)" % target.value
        return "available"
    finally:
        cu.fn("cuStreamDestroy_v2", cu.c_void_p)(stream)


def probe(cu, base, dev):
    """The entry points' behaviour: memory operations by running them, cuIpcGetMemHandle on
    cuMemAlloc memory, the rest by whether libcuda.so.1 exports them."""
    ctx = ctypes.c_void_p()
    cu.call("cuDevicePrimaryCtxRetain",
            cu.fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(ctypes.byref(ctx), dev))
    cu.call("cuCtxSetCurrent", cu.fn("cuCtxSetCurrent", cu.c_void_p)(ctx))
    results = {}
    # The words: page-aligned host memory registered (page-locked, mapped) for the device,
    # the way the library makes its control words.
    page = mmap.mmap(-1, 4096)
    buf = ctypes.c_char.from_buffer(page)
    host = ctypes.addressof(buf)
    register = cu.fn("cuMemHostRegister_v2", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
    cu.call("cuMemHostRegister_v2(DEVICEMAP)",
            register(host, 4096, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP))
    dptr = ctypes.c_uint64()
    cu.call("cuMemHostGetDevicePointer_v2", cu.fn(
        "cuMemHostGetDevicePointer_v2", ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint)(
        ctypes.byref(dptr), host, 0))
    try:
        for slot, (name, (kind, width)) in enumerate(sorted(MEMOPS.items())):
            r = probe_memop(cu, name, kind, width, host, dptr.value, slot)
            results[name] = r
            say("entry point %s (one %s on a registered word, synchronised): %s" % (name, kind, r))
    finally:
        cu.fn("cuMemHostUnregister", ctypes.c_void_p)(host)
        del buf
        page.close()
    if cu.has("cuIpcGetMemHandle"):
        d = ctypes.c_uint64()
        cu.call("cuMemAlloc_v2", cu.fn("cuMemAlloc_v2", ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(
            ctypes.byref(d), 1 << 20))
        handle = (ctypes.c_char * 64)()
        rc = cu.fn("cuIpcGetMemHandle", ctypes.c_void_p, ctypes.c_uint64)(handle, d.value)
        cu.fn("cuMemFree_v2", ctypes.c_uint64)(d.value)
        results["cuIpcGetMemHandle"] = "available" if rc == 0 else cu.name(rc)
    else:
        results["cuIpcGetMemHandle"] = "missing"
    say("entry point cuIpcGetMemHandle (on cuMemAlloc memory): %s" % results["cuIpcGetMemHandle"])
    for name in sorted(base.get("entry_points", {})):
        if name not in results:
            results[name] = "available" if cu.has(name) else "missing"
            say("entry point %s: %s" % (name, "exported" if results[name] == "available" else "not exported"))
    cu.fn("cuDevicePrimaryCtxRelease_v2", ctypes.c_int)(dev)
    return results


def capture(cu, base, dev):
    cu.call("cuInit", cu.fn("cuInit", ctypes.c_uint)(0))
    version = ctypes.c_int()
    cu.call("cuDriverGetVersion", cu.fn("cuDriverGetVersion", ctypes.POINTER(ctypes.c_int))(ctypes.byref(version)))
    say("driver_version = %d" % version.value)
    device = ctypes.c_int()
    cu.call("cuDeviceGet", cu.fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)(ctypes.byref(device), dev))
    name = ctypes.create_string_buffer(256)
    cu.call("cuDeviceGetName", cu.fn("cuDeviceGetName", ctypes.c_char_p, ctypes.c_int, ctypes.c_int)(
        name, 256, device.value))
    say("device %d: %s" % (dev, name.value.decode()))
    out = {
        "profile": base.get("profile", "captured"),
        "source": "captured by tools/simgpu/capture-profile.py on %s %s" % (
            socket.gethostname(), datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        "driver_version": version.value,
        "device_name": name.value.decode(),
    }
    if "notes" in base:
        out["notes"] = base["notes"]
    if out["device_name"] == SIMULATED_NAME:
        out["source"] += " (under the simulator: these are the simulator's values, not a driver's)"
    out["attributes"] = read_attributes(cu, base, device.value)
    out["not_simulated"] = base.get("not_simulated", [])
    out["entry_points"] = probe(cu, base, device.value)
    return out


def compare(captured, reference):
    """Lines describing every difference, and how many of them count (outside per_device
    and not_simulated)."""
    lines, failures = [], 0
    ns = {e["name"] for e in reference.get("not_simulated", [])}
    # Under the simulator the captured values are its own: not_simulated ones must be 0.
    simulated = captured.get("device_name") == SIMULATED_NAME
    if captured["driver_version"] != reference.get("driver_version"):
        lines.append("driver_version: captured %s, profile %s" % (
            captured["driver_version"], reference.get("driver_version")))
        failures += 1
    ref_attrs = reference.get("attributes", {})
    for name, entry in sorted(captured["attributes"].items(), key=lambda kv: kv[1]["id"]):
        ref = ref_attrs.get(name)
        if ref is None:
            lines.append("%s (%d): captured %s, not in the profile" % (name, entry["id"], entry["value"]))
            failures += 1
            continue
        if ref.get("per_device"):
            continue
        got = entry["value"]
        if name in ns and simulated:
            # The simulator must report 0 for what it does not implement.
            if got != 0:
                lines.append("%s (%d): the simulator reports %s for a capability it does not implement (must be 0)" % (
                    name, entry["id"], got))
                failures += 1
            elif ref.get("value") != 0:
                lines.append("%s (%d): stock %s, simulator 0 (not simulated)" % (name, entry["id"], ref.get("value")))
            continue
        if name in ns:
            if got != 0 or ref.get("value") != 0:
                lines.append("%s (%d): stock %s, simulator 0 (not simulated)%s" % (
                    name, entry["id"], got, "" if got == ref.get("value") else "; profile says %s" % ref.get("value")))
            continue
        if got != ref.get("value"):
            lines.append("%s (%d): captured %s, profile %s" % (name, entry["id"], got, ref.get("value")))
            failures += 1
    for name in sorted(set(ref_attrs) - set(captured["attributes"])):
        lines.append("%s: in the profile, not captured" % name)
        failures += 1
    ref_eps = reference.get("entry_points", {})
    for name, got in sorted(captured["entry_points"].items()):
        want = ref_eps.get(name)
        if want is None:
            lines.append("entry point %s: captured %s, not in the profile" % (name, got))
            failures += 1
        elif got != want:
            lines.append("entry point %s: captured %s, profile %s" % (name, got, want))
            failures += 1
    return lines, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--compare", metavar="PROFILE")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    base = load_profile(args.profile)
    try:
        cu = Driver()
    except OSError as e:
        say("cannot load libcuda.so.1: %s" % e)
        return 2
    try:
        captured = capture(cu, base, args.device)
    except CuError as e:
        say("capture failed: %s" % e)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            f.write(dump(captured))
        say("wrote %s" % args.out)
    if args.compare or args.check:
        ref_path = args.compare or args.profile
        lines, failures = compare(captured, load_profile(ref_path))
        say("compared with %s: %d difference(s), %d outside per_device / not_simulated" % (
            ref_path, len(lines), failures))
        for line in lines:
            say("  " + line)
        if args.check and failures:
            say("check failed: the driver does not report what %s says" % ref_path)
            return 1
        if args.check:
            say("check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
