#!/usr/bin/env python3
"""Minimal, schema-less reader for Nsight Compute .ncu-rep files (stdlib only).

Layout recovered empirically (see README section at the bottom / summary.md):

  file    := "NVR\\0" record*
  record  := uint32_le length, protobuf message of that length
  The first record is a tiny file header ({1: 7}).  After that, records come in
  pairs: a *block header* followed by payload records whose total size
  (including their own 4-byte length prefixes) equals header field 5.
    block header fields:  1 = block kind (0 = profile results, 1 = cubin/module)
                          2 = number of results in the payload
                          4 = (results blocks) string table: repeated {1: string}
                              -- metric names; cumulative across blocks
                          5 = payload byte size
  Profile-result message (one per profiled kernel launch):
     1 pid, 2 launch api-call id, 5 mangled name, 6 function name,
     7 demangled name, 9 {1,2,3} ?, 10 grid {1:x,2:y,3:z}, 11 block {1:x,2:y,3:z},
     13 repeated metric entry, 17 section descriptors, 19 rule results, ...
  Metric entry: 1 = index into string table (metric name),
                2 = value message, 3 = repeated instance {1: key value, 2: value},
                4 = varint (always 0 here)
  Value message: 1 = string, 3 = double (fixed64), 5 = uint64 (varint).
     Any other tag is reported as 'undecoded:<tag>/<wiretype>' instead of guessed.

Usage:  ncurep_dump.py FILE.ncu-rep [--outdir DIR] [--tree N] [--no-instances] [--rules] [--sass]
  Writes one CSV per profiled kernel: <report>_<short-name>[_callN].csv
  (metric,value,type,num_instances; then instanced rows metric[key],value
  e.g. sass__inst_executed_per_opcode[HGMMA]; the per-PC inst_executed
  instances are skipped) and prints a short overview.
  --tree N: generic protobuf dump of the first N records (no ncu knowledge).
  --sass: also <report>_<short-name>_sass.txt, one row per executed PC: warp-level executions,
  PC samples and the stall reasons sampled there, and the instruction, from the cubin the report
  carries (an ELF image inside it) disassembled by cuobjdump; offsets count from the lowest
  executed PC, the function's entry.
"""
import csv
import os
import struct
import sys


# --------------------------------------------------------------------------
# generic protobuf wire-format walker
# --------------------------------------------------------------------------
class PBError(Exception):
    pass


def read_varint(buf, pos):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise PBError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PBError("varint too long")


def parse_message(buf):
    """Return list of (field_number, wire_type, value) or raise PBError.

    value: int for varint, bytes(8) for fixed64, bytes(4) for fixed32,
    bytes for length-delimited.  Groups (wire types 3/4) are rejected."""
    pos = 0
    fields = []
    n = len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos)
        field, wtype = key >> 3, key & 7
        if field == 0:
            raise PBError("field number 0")
        if wtype == 0:
            val, pos = read_varint(buf, pos)
        elif wtype == 1:
            if pos + 8 > n:
                raise PBError("truncated fixed64")
            val = buf[pos:pos + 8]
            pos += 8
        elif wtype == 2:
            ln, pos = read_varint(buf, pos)
            if pos + ln > n:
                raise PBError("truncated bytes")
            val = buf[pos:pos + ln]
            pos += ln
        elif wtype == 5:
            if pos + 4 > n:
                raise PBError("truncated fixed32")
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise PBError("unsupported wire type %d" % wtype)
        fields.append((field, wtype, val))
    return fields


def try_parse(buf):
    try:
        return parse_message(buf)
    except PBError:
        return None


def as_text(b):
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(c.isprintable() or c in "\n\t\r" for c in s):
        return s
    return None


def dump_tree(buf, indent=0, depth=6, limit=40, out=sys.stdout):
    """Generic recursive dump: length-delimited payloads are shown as nested
    messages when they parse cleanly, else as text/bytes."""
    fields = try_parse(buf)
    if fields is None:
        out.write(" " * indent + "<not a message>\n")
        return
    for i, (f, w, v) in enumerate(fields):
        pad = " " * indent
        if i >= limit:
            out.write(pad + "... (%d more fields)\n" % (len(fields) - limit))
            break
        if w == 0:
            out.write("%s%d: varint %d\n" % (pad, f, v))
        elif w == 1:
            out.write("%s%d: fixed64 double=%r u64=%d\n" % (pad, f, struct.unpack("<d", v)[0], struct.unpack("<Q", v)[0]))
        elif w == 5:
            out.write("%s%d: fixed32 float=%r u32=%d\n" % (pad, f, struct.unpack("<f", v)[0], struct.unpack("<I", v)[0]))
        else:
            txt = as_text(v)
            sub = try_parse(v) if (v and depth > 0) else None
            # prefer text when it is clearly text (mostly letters)
            if txt is not None and (sub is None or sum(c.isalpha() for c in txt) > 0.6 * len(txt)):
                out.write("%s%d: str %r\n" % (pad, f, txt[:160]))
            elif sub is not None:
                out.write("%s%d: msg (%d bytes)\n" % (pad, f, len(v)))
                dump_tree(v, indent + 2, depth - 1, limit, out)
            else:
                out.write("%s%d: bytes (%d) %s\n" % (pad, f, len(v), v[:24].hex()))


# --------------------------------------------------------------------------
# ncu-rep specific layer
# --------------------------------------------------------------------------
def iter_records(data):
    if data[:4] != b"NVR\x00":
        raise ValueError("not an NVR file")
    pos = 4
    while pos < len(data):
        (ln,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + ln > len(data):
            raise ValueError("record at %d overruns file" % pos)
        yield pos, data[pos + 4:pos + 4 + ln]
        pos += 4 + ln


def first(fields, num, default=None):
    for f, w, v in fields:
        if f == num:
            return v
    return default


def all_of(fields, num):
    return [v for f, w, v in fields if f == num]


def decode_value(buf):
    """Value message -> (python value, type tag)."""
    fields = try_parse(buf)
    if fields is None:
        return None, "undecoded:not-a-message"
    if not fields:
        return None, "empty"
    if len(fields) != 1:
        return None, "undecoded:multi(%s)" % ",".join("%d/%d" % (f, w) for f, w, _ in fields)
    f, w, v = fields[0]
    if f == 1 and w == 2:
        return v.decode("utf-8", "replace"), "str"
    if f == 3 and w == 1:
        return struct.unpack("<d", v)[0], "double"
    if f == 5 and w == 0:
        return v, "uint64"
    return None, "undecoded:%d/%d" % (f, w)


class Result:
    def __init__(self):
        self.fields = {}
        self.metrics = {}      # name -> (value, type)
        self.instances = {}    # name -> list[(key, keytype, value, valtype)]
        self.order = []


def load_report(path):
    data = open(path, "rb").read()
    strings = []
    results = []
    recs = list(iter_records(data))
    i = 0
    while i < len(recs):
        pos, rec = recs[i]
        hdr = try_parse(rec)
        i += 1
        if hdr is None:
            raise ValueError("record at %d is not a protobuf message" % pos)
        if len(hdr) == 1 and hdr[0][0] == 1 and i == 1:
            continue  # file header {1: version}
        payload_size = first(hdr, 5, 0)
        kind = first(hdr, 1)
        st = first(hdr, 4)
        if isinstance(st, bytes) and st:
            entries = try_parse(st)
            if entries and all(f == 1 and w == 2 for f, w, _ in entries):
                strings.extend(v.decode("utf-8", "replace") for _, _, v in entries)
        # consume payload records belonging to this block
        consumed = 0
        while consumed < payload_size and i < len(recs):
            ppos, prec = recs[i]
            consumed += 4 + len(prec)
            i += 1
            if kind != 0:
                continue
            msg = try_parse(prec)
            if msg is None or first(msg, 6) is None:
                continue
            results.append((ppos, msg))
        if consumed != payload_size:
            sys.stderr.write("warning: block at %d payload size mismatch %d vs %d\n" % (pos, consumed, payload_size))

    out = []
    for ppos, msg in results:
        r = Result()
        r.offset = ppos
        r.mangled = first(msg, 5, b"").decode("utf-8", "replace")
        r.name = first(msg, 6, b"").decode("utf-8", "replace")
        r.demangled = first(msg, 7, b"").decode("utf-8", "replace")
        r.pid = first(msg, 1)
        r.api_id = first(msg, 2)
        for key, num in (("grid", 10), ("block", 11)):
            sub = try_parse(first(msg, num, b"")) or []
            r.fields[key] = tuple(first(sub, k, 0) for k in (1, 2, 3))
        for ent in all_of(msg, 13):
            e = try_parse(ent)
            if e is None:
                continue
            idx = first(e, 1)
            name = strings[idx] if idx is not None and idx < len(strings) else "<bad-index-%r>" % idx
            vbuf = first(e, 2)
            if vbuf is None:
                val, typ = None, "missing"
            else:
                val, typ = decode_value(vbuf)
            r.metrics[name] = (val, typ)
            r.order.append(name)
            inst = []
            for ib in all_of(e, 3):
                ie = try_parse(ib) or []
                k = first(ie, 1)
                v = first(ie, 2)
                kv, kt = decode_value(k) if k is not None else (None, "missing")
                vv, vt = decode_value(v) if v is not None else (None, "missing")
                inst.append((kv, kt, vv, vt))
            if inst:
                r.instances[name] = inst
        r.rules = rule_texts(msg)
        out.append(r)
    return strings, out


def rule_texts(msg_fields):
    """Human-readable rule messages (result field 19): list of (rule_id, text).
    Texts are found by walking nested messages and keeping printable strings
    that contain spaces (these are ncu's own rendered sentences)."""
    out = []

    def walk(buf, acc):
        fs = try_parse(buf)
        if fs is None:
            return
        for f, w, v in fs:
            if w != 2 or not v:
                continue
            t = as_text(v)
            if t is not None and len(t) > 30 and " " in t:
                acc.append(t)
            else:
                walk(v, acc)

    for v in all_of(msg_fields, 19):
        fs = try_parse(v) or []
        rid = (first(fs, 1) or b"").decode("utf-8", "replace")
        body = first(fs, 3)
        acc = []
        if isinstance(body, bytes):
            walk(body, acc)
        for t in acc:
            out.append((rid, t))
    return out


def short_name(r):
    n = r.name
    if n.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_"):
        n = n[len("cudnn_generated_fort_native_sdpa_sm90_flash_"):]
        n = n.split("_wgmma")[0]
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in n)[:60]


def fmt(v):
    if isinstance(v, float):
        return repr(v)
    return "" if v is None else str(v)


def write_csv(r, path, with_instances=False):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["metric", "value", "type", "num_instances"])
        w.writerow(["#kernel_function_name", r.name, "str", 0])
        w.writerow(["#kernel_demangled", r.demangled, "str", 0])
        w.writerow(["#grid(from result field 10)", "%d,%d,%d" % r.fields["grid"], "str", 0])
        w.writerow(["#block(from result field 11)", "%d,%d,%d" % r.fields["block"], "str", 0])
        for name in sorted(r.metrics):
            val, typ = r.metrics[name]
            w.writerow([name, fmt(val), typ, len(r.instances.get(name, []))])
        if with_instances:
            for name in sorted(r.instances):
                if name == "inst_executed":
                    continue  # per-PC, thousands of rows
                for kv, kt, vv, vt in r.instances[name]:
                    w.writerow(["%s[%s]" % (name, fmt(kv)), fmt(vv), vt, ""])


# --------------------------------------------------------------------------
# per-instruction view: the per-PC counters joined with the report's own SASS
# --------------------------------------------------------------------------
STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


def embedded_cubins(data):
    """The ELF images the report carries (the profiled modules), each cut to its extent."""
    out, i = [], data.find(b"\x7fELF")
    while i != -1:
        e = data[i:]
        try:
            phoff, shoff = struct.unpack_from("<QQ", e, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", e, 0x36)
            size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            for k in range(shnum):
                off = shoff + k * shentsize
                typ = struct.unpack_from("<I", e, off + 4)[0]
                o, sz = struct.unpack_from("<QQ", e, off + 0x18)
                if typ != 8:  # SHT_NOBITS occupies no file bytes
                    size = max(size, o + sz)
            if 0 < size <= len(e):
                out.append(e[:size])
        except struct.error:
            pass
        i = data.find(b"\x7fELF", i + 1)
    return out


def sass_functions(cubin_bytes, cuobjdump="cuobjdump"):
    """{mangled name: {offset: instruction text}} of every function of one cubin, from one
    cuobjdump -sass run ({} if cuobjdump is unavailable)."""
    import re
    import shutil
    import subprocess
    import tempfile
    if shutil.which(cuobjdump) is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin_bytes)
        path = fh.name
    try:
        text = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    funcs, insts = {}, None
    for line in text.splitlines():
        if "Function :" in line:
            insts = funcs.setdefault(line.split("Function :")[1].strip(), {})
            continue
        if insts is not None:
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*/\*", line)
            if m:
                insts[int(m.group(1), 16)] = m.group(2).rstrip(" ;")
    return funcs


def write_sass_profile(r, cubins, path):
    """cubins: sass_functions of each cubin the report carries. One row per executed PC (offset from the lowest executed PC, which is the function's entry):
    warp-level instructions executed, PC samples, the stall reasons sampled there (count), and the
    SASS text when the report's cubin and cuobjdump give it. Returns (rows, sampled, matched)."""
    execd = {kv: vv for kv, _, vv, _ in r.instances.get("inst_executed", [])}
    if not execd:
        return 0, 0, 0
    base = min(execd)
    samples = {kv: vv for kv, _, vv, _ in r.instances.get("smsp__pcsamp_sample_count", [])}
    reasons = [n for n in r.instances if n.startswith(STALL_PREFIX) and not n.endswith("_not_issued")]
    per_reason = {n[len(STALL_PREFIX):]: {kv: vv for kv, _, vv, _ in r.instances[n]} for n in reasons}
    sass = next((f[r.mangled] for f in cubins if f.get(r.mangled)), None)
    pcs = sorted(set(execd) | set(samples))
    matched = 0
    with open(path, "w") as fh:
        fh.write("# %s\n# offset  inst_executed  samples  stalls (reason:count, most first)  sass\n" % r.name)
        for pc in pcs:
            off = pc - base
            st = sorted(((c.get(pc, 0) or 0, n) for n, c in per_reason.items()), reverse=True)
            st = " ".join("%s:%d" % (n, v) for v, n in st if v)
            txt = sass.get(off, "?") if sass else ""
            matched += sass is not None and off in sass
            fh.write("%06x %12d %8d  %-60s %s\n" % (off, execd.get(pc, 0) or 0, samples.get(pc, 0) or 0, st, txt))
    return len(pcs), sum(v or 0 for v in samples.values()), matched


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--outdir", default=None, help="write per-kernel CSVs here")
    ap.add_argument("--tree", type=int, default=0, help="generic dump of the first N records")
    ap.add_argument("--no-instances", action="store_true", help="do not write instanced values (per-opcode etc.) to CSV")
    ap.add_argument("--rules", action="store_true", help="print ncu rule messages decoded from each result")
    ap.add_argument("--sass", action="store_true",
                    help="with --outdir: per-instruction rows (executions, PC samples and stall reasons per PC) "
                         "joined with the SASS of the cubin the report carries (needs cuobjdump on PATH)")
    a = ap.parse_args(argv)
    data = open(a.report, "rb").read()
    if a.tree:
        for k, (pos, rec) in enumerate(iter_records(data)):
            if k >= a.tree:
                break
            print("==== record @%d (%d bytes)" % (pos, len(rec)))
            dump_tree(rec, 2, 6, 40)
        return
    strings, results = load_report(a.report)
    base = os.path.basename(a.report).replace(".ncu-rep", "")
    print("%s: %d strings, %d profiled kernels" % (base, len(strings), len(results)))
    shorts = [short_name(r) for r in results]
    cubins = [sass_functions(cb) for cb in embedded_cubins(data)] if a.sass else []
    for k, r in enumerate(results):
        dur = r.metrics.get("gpu__time_duration.sum", (None, ""))[0]
        types = {}
        for v, t in r.metrics.values():
            types[t] = types.get(t, 0) + 1
        print("  [%d] %s grid=%s block=%s regs=%s dur=%s ns metrics=%d types=%s" % (
            k, r.name, r.fields["grid"], r.fields["block"],
            r.metrics.get("launch__registers_per_thread", (None,))[0], dur, len(r.metrics), types))
        if a.outdir:
            os.makedirs(a.outdir, exist_ok=True)
            sn = shorts[k]
            if shorts.count(sn) > 1:
                sn = "%s_call%d" % (sn, shorts[:k + 1].count(sn))
            p = os.path.join(a.outdir, "%s_%s.csv" % (base, sn))
            write_csv(r, p, not a.no_instances)
            print("      -> %s" % p)
            if a.sass:
                ps = p[:-4] + "_sass.txt"
                rows, sampled, matched = write_sass_profile(r, cubins, ps)
                per_pc = sum(vv or 0 for _, _, vv, _ in r.instances.get("inst_executed", []))
                total = r.metrics.get("smsp__inst_executed.sum", (None,))[0]
                print("      -> %s (%d PCs, %d samples, %d with SASS text; executions per PC sum to %d, "
                      "smsp__inst_executed.sum %s)" % (ps, rows, sampled, matched, per_pc, fmt(total)))
        if a.rules:
            for rid, t in r.rules:
                print("      rule[%s] %s" % (rid, t.replace("\n", " ")))


if __name__ == "__main__":
    main(sys.argv[1:])
