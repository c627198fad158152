#!/usr/bin/env python3
"""An independent safetensors reader, standard library only.

Checks each file as the format's reference reader does: the 8-byte
little-endian header length, a UTF-8 JSON object (trailing spaces allowed),
each entry's dtype, shape and data_offsets, entries that tile the data
with no gap or overlap, no name twice.  Then prints one line per tensor,
in header order:

    FILE<TAB>NAME<TAB>DTYPE<TAB>[d0, d1]<TAB>SUM

SUM is the values added in order as doubles, printed as Python's repr, so
a C caller can compare it exactly.  Exits 1 naming the file and the cause
when a check fails.

    usage: read_safetensors.py FILE.safetensors...
"""
import json
import struct
import sys

# Element sizes of the dtypes safetensors defines.
SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
# struct codes for the dtypes summed here.
CODES = {"F32": "f", "I32": "i", "F64": "d", "I64": "q", "U8": "B", "I8": "b"}
MAX_HEADER = 100 << 20


class Bad(Exception):
    pass


def no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise Bad("key %r appears twice" % key)
        seen[key] = value
    return seen


def count(v, what):
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise Bad("%s is not a non-negative integer: %r" % (what, v))
    return v


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Bad("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise Bad("header length %d does not fit the file of %d bytes" % (n, len(data)))
    text = data[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise Bad("the header does not start with '{'")
    if not text.rstrip(" ").endswith("}"):
        raise Bad("the header has bytes after its JSON other than spaces")
    header = json.loads(text, object_pairs_hook=no_duplicates)
    if not isinstance(header, dict):
        raise Bad("the header is not a JSON object")
    buf = data[8 + n:]
    tensors = []
    for name, e in header.items():
        if name == "__metadata__":
            if not isinstance(e, dict) or not all(isinstance(v, str) for v in e.values()):
                raise Bad("__metadata__ is not a map of strings")
            continue
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise Bad("entry %r does not have exactly dtype, shape, data_offsets" % name)
        if e["dtype"] not in SIZES:
            raise Bad("entry %r has an unknown dtype %r" % (name, e["dtype"]))
        shape = [count(d, "a dim of %r" % name) for d in e["shape"]]
        offsets = e["data_offsets"]
        if not isinstance(offsets, list) or len(offsets) != 2:
            raise Bad("entry %r: data_offsets is not [begin, end]" % name)
        begin, end = (count(x, "an offset of %r" % name) for x in offsets)
        numel = 1
        for d in shape:
            numel *= d
        if end < begin or end - begin != numel * SIZES[e["dtype"]]:
            raise Bad("entry %r: %d bytes for shape %s" % (name, end - begin, shape))
        tensors.append((name, e["dtype"], shape, begin, end, numel))
    at = 0
    for name, _, _, begin, end, _ in sorted(tensors, key=lambda t: (t[3], t[4])):
        if begin != at:
            raise Bad("entry %r starts at %d, not %d: a gap or an overlap" % (name, begin, at))
        at = end
    if at != len(buf):
        raise Bad("the entries cover %d of the %d data bytes" % (at, len(buf)))
    return tensors, buf


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in paths:
        try:
            tensors, buf = read(path)
        except (Bad, ValueError, OSError) as e:
            print("%s: not a valid safetensors file: %s" % (path, e), file=sys.stderr)
            return 1
        for name, dtype, shape, begin, _, numel in tensors:
            total = 0.0
            if dtype in CODES:
                for v in struct.unpack_from("<%d%s" % (numel, CODES[dtype]), buf, begin):
                    total += v
            print("%s\t%s\t%s\t%s\t%r" % (path, name, dtype, json.dumps(shape), total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
