#!/usr/bin/env python3
"""An independent reader of `spmd export` files, standard library + numpy.

Reads a Hugging Face GPT-2 safetensors file and an llm.c checkpoint of the
same model, checks each against its format, maps both onto libspmd's names
and layouts, and requires every tensor to be bit-identical in the two (and,
with --expect, to a raw dump of the program's parameters).

  safetensors: 8-byte little-endian header length, a JSON object (trailing
    spaces allowed) whose entries have dtype F32, a shape and data_offsets
    that tile the data with no gap or overlap, no name twice, data 8-byte
    aligned; metadata {"format": "pt", ...}; the GPT-2 names wte.weight,
    wpe.weight, h.N.*, ln_f.* (an optional "transformer." prefix), Conv1D
    weights [in, out].
  llm.c: 256 int32 (magic 20240326, version 3, maxT, V, L, NH, C, Vp), Vp a
    multiple of 128 and at least V, then exactly the fp32 parameters in
    llm.c's order; the padding rows of wte are zero.

Prints one line per tensor, in libspmd's order:

    NAME<TAB>[d0, d1]<TAB>SUM

then "all N tensors equal".  Exits 1 naming the file and the cause when a
check fails.

    usage: read_export.py --hf FILE.safetensors --llmc FILE.bin [--expect DIR]
           read_export.py --bf16 FILE.safetensors --expect DIR

DIR holds one file NAME.f32 per parameter: its values, little-endian
float32, row-major, in libspmd's layout ([out, in]).  With --bf16 the file
(spmd export --dtype bf16) must hold only BF16 tensors, each the round to
nearest even of DIR's values, computed here on the bit patterns.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

LLMC_MAGIC, LLMC_VERSION = 20240326, 3
# Per block, in llm.c's order: (name, rows, cols) in units of C; cols 0 for
# a vector.  Conv1D weights are the matrices other than the embeddings.
BLOCK = [("ln_1.weight", 1, 0), ("ln_1.bias", 1, 0),
         ("attn.c_attn.weight", 3, 1), ("attn.c_attn.bias", 3, 0),
         ("attn.c_proj.weight", 1, 1), ("attn.c_proj.bias", 1, 0),
         ("ln_2.weight", 1, 0), ("ln_2.bias", 1, 0),
         ("mlp.c_fc.weight", 4, 1), ("mlp.c_fc.bias", 4, 0),
         ("mlp.c_proj.weight", 1, 4), ("mlp.c_proj.bias", 1, 0)]


class Bad(Exception):
    pass


def unique(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise Bad("key %r appears twice" % key)
        seen[key] = value
    return seen


def read_safetensors(path, dtype="F32"):
    """{name: array} of a file of `dtype` tensors only (F32, or BF16 as
    their uint16 bit patterns), after the format's checks."""
    size, numpy_dtype = {"F32": (4, "<f4"), "BF16": (2, "<u2")}[dtype]
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Bad("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise Bad("header length %d does not fit the file of %d bytes" % (n, len(data)))
    if n % 8:
        raise Bad("the data does not start 8-byte aligned (header length %d)" % n)
    text = data[8:8 + n].decode("utf-8").rstrip(" ")
    header = json.loads(text, object_pairs_hook=unique)
    if not isinstance(header, dict):
        raise Bad("the header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        raise Bad("metadata %r lacks \"format\": \"pt\" (transformers refuses the file)" % meta)
    body = data[8 + n:]
    spans, out = [], {}
    for name, e in header.items():
        if e.get("dtype") != dtype:
            raise Bad("tensor %s has dtype %r, not %s" % (name, e.get("dtype"), dtype))
        shape, (b, end) = e["shape"], e["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - b != size * count:
            raise Bad("tensor %s: data_offsets [%d, %d] do not fit shape %s" % (name, b, end, shape))
        spans.append((b, end, name))
        out[name] = np.frombuffer(body, dtype=numpy_dtype, count=count, offset=b).reshape(shape)
    at = 0
    for b, end, name in sorted(spans):
        if b != at:
            raise Bad("tensor %s starts at %d, the previous one ends at %d" % (name, b, at))
        at = end
    if at != len(body):
        raise Bad("%d data bytes, the tensors cover %d" % (len(body), at))
    return out, meta


def gpt_names(layers):
    names = ["wte.weight", "wpe.weight"]
    names += ["h.%d.%s" % (i, b[0]) for i in range(layers) for b in BLOCK]
    return names + ["ln_f.weight", "ln_f.bias"]


def conv1d(name):
    return name.startswith("h.") and name.endswith(".weight") and (
        ".c_attn." in name or ".c_proj." in name or ".c_fc." in name)


def from_hf(path, dtype="F32"):
    raw, meta = read_safetensors(path, dtype)
    prefix = "" if "wte.weight" in raw else "transformer."
    layers = 1 + max(int(k[len(prefix):].split(".")[1]) for k in raw if k.startswith(prefix + "h."))
    out = {}
    for name in gpt_names(layers):
        if prefix + name not in raw:
            raise Bad("tensor %s is missing" % (prefix + name))
        t = raw.pop(prefix + name)
        out[name] = t.T if conv1d(name) else t  # Conv1D [in, out] -> [out, in]
    raw.pop("lm_head.weight", None)
    if raw:
        raise Bad("tensors that are not GPT-2 parameters: %s" % ", ".join(sorted(raw)))
    return out, meta


def from_llmc(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 1024:
        raise Bad("shorter than the 1024-byte header")
    h = struct.unpack("<256i", data[:1024])
    magic, version, T, V, L, NH, C, Vp = h[:8]
    if magic != LLMC_MAGIC or version != LLMC_VERSION:
        raise Bad("magic %d version %d, not %d version %d" % (magic, version, LLMC_MAGIC, LLMC_VERSION))
    if any(h[8:]):
        raise Bad("header ints past the eighth are not zero")
    if Vp % 128 or Vp < V or C % NH:
        raise Bad("Vp %d, V %d, C %d, NH %d: not a padded fp32 GPT-2 header" % (Vp, V, C, NH))
    groups = [("wte.weight", False, (Vp, C)), ("wpe.weight", False, (T, C))]
    groups += [(b[0], True, (b[1] * C, b[2] * C) if b[2] else (b[1] * C,)) for b in BLOCK]
    groups += [("ln_f.weight", False, (C,)), ("ln_f.bias", False, (C,))]
    want = 1024 + 4 * sum((L if per else 1) * int(np.prod(s)) for _, per, s in groups)
    if len(data) != want:
        raise Bad("%d bytes, the header describes %d" % (len(data), want))
    out, at = {}, 1024
    for name, per_layer, shape in groups:
        count = int(np.prod(shape))
        for i in range(L if per_layer else 1):
            t = np.frombuffer(data, dtype="<f4", count=count, offset=at).reshape(shape)
            at += 4 * count
            out["h.%d.%s" % (i, name) if per_layer else name] = t
    pad = out["wte.weight"][V:]
    if pad.view("<u4").any():
        raise Bad("padding rows %d..%d of wte are not zero" % (V, Vp - 1))
    out["wte.weight"] = out["wte.weight"][:V]
    return out, NH


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view("<u4"), b.view("<u4"))


def in_file(read, path):
    try:
        return read(path)
    except (Bad, ValueError, KeyError, IndexError) as e:
        raise Bad("%s: %s" % (path, e))


def rne_bf16(values):
    """float32 -> bf16 bit patterns, round to nearest, ties to even (the
    values are finite)."""
    u = values.astype("<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def check_bf16(args):
    hf, meta = in_file(lambda p: from_hf(p, "BF16"), args.bf16)
    for name in gpt_names(len(hf) // len(BLOCK)):
        want = rne_bf16(np.fromfile(os.path.join(args.expect, name + ".f32"), dtype="<f4"))
        got = np.ascontiguousarray(hf[name]).reshape(-1)
        if not np.array_equal(got, want):
            raise Bad("%s: %s is not the bf16 rounding of %s.f32" % (args.bf16, name, name))
        shape = "[" + ", ".join(str(d) for d in hf[name].shape) + "]"
        print("%s\t%s\tBF16" % (name, shape))
    if len(os.listdir(args.expect)) != len(hf):
        raise Bad("%s holds %d files for %d tensors" % (args.expect, len(os.listdir(args.expect)), len(hf)))
    print("all %d tensors the bf16 rounding" % len(hf))


def check(args):
    if args.bf16:
        return check_bf16(args)
    hf, meta = in_file(from_hf, args.hf)
    llmc, heads = in_file(from_llmc, args.llmc)
    if meta.get("n_head") != str(heads):
        raise Bad("%s: metadata n_head %r, %s: %d heads" % (args.hf, meta.get("n_head"), args.llmc, heads))
    if sorted(hf) != sorted(llmc):
        raise Bad("the two files hold different tensors")
    layers = len(hf) // len(BLOCK)
    for name in gpt_names(layers):
        if not same_bits(hf[name], llmc[name]):
            raise Bad("%s differs between %s and %s" % (name, args.hf, args.llmc))
        if args.expect:
            path = os.path.join(args.expect, name + ".f32")
            want = np.fromfile(path, dtype="<f4")
            if not same_bits(hf[name].reshape(-1), want):
                raise Bad("%s differs from %s" % (name, path))
        shape = "[" + ", ".join(str(d) for d in hf[name].shape) + "]"
        print("%s\t%s\t%r" % (name, shape, float(hf[name].astype(np.float64).sum())))
    if args.expect and len(os.listdir(args.expect)) != len(hf):
        raise Bad("%s holds %d files for %d tensors" % (args.expect, len(os.listdir(args.expect)), len(hf)))
    print("all %d tensors equal" % len(hf))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf")
    p.add_argument("--llmc")
    p.add_argument("--bf16")
    p.add_argument("--expect")
    args = p.parse_args()
    if not (args.bf16 and args.expect and not (args.hf or args.llmc)) and not (args.hf and args.llmc):
        p.error("--hf FILE --llmc FILE [--expect DIR], or --bf16 FILE --expect DIR")
    try:
        check(args)
    except (Bad, ValueError, KeyError, OSError) as e:
        print("read_export.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
