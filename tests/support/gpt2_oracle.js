#!/usr/bin/env node
// The outside oracle for spmd tokenize (tests/cli/test_cli_tokenize.c): the
// npm package gpt-3-encoder's own JavaScript encoder on text files.
//   node tests/support/gpt2_oracle.js ENCODER_DIR FILE...
// prints, for each file in turn, 50256 (<|endoftext|>) and then the file's
// token ids, space-separated on one line, as spmd tokenize writes a shard.
//
// Valid UTF-8 goes through the package's exported encode() itself, in
// pieces cut only where its regex must cut too (after a "\n" with no white
// space on either side), because encode() concatenates its output array
// once per token, which is quadratic over a megabyte.  A file that is not
// valid UTF-8 has no JavaScript string that encode() could take byte for
// byte, so for it this script runs the package's own regex, BPE and tables
// (read from its Encoder.js) on the text with each invalid byte as a
// private-use character (a class of its own, as the C encoder treats it),
// and maps that character back to its byte before the BPE.
'use strict';
const fs = require('fs');
const path = require('path');
const Module = require('module');

const dir = process.argv[2];
const encoderJs = path.join(dir, 'Encoder.js');
// The package's module with its internals exported beside encode/decode.
const m = new Module(encoderJs, module);
m.filename = encoderJs;
m.paths = Module._nodeModulePaths(dir);
m._compile(fs.readFileSync(encoderJs, 'utf8') +
           '\nmodule.exports.internals = {pat, bpe, byte_encoder, encoder};\n', encoderJs);
const { encode, internals } = m.exports;

const PLACEHOLDER = 0xF0000; // U+F0000 + byte: supplementary private use

// Decodes bytes as the C encoder does (tools/bpe.c utf8_char): the code
// points of valid UTF-8, and PLACEHOLDER + b for each byte b that starts
// no valid character.  Returns [string, valid].
function decodeBytes(buf) {
  let out = '', valid = true;
  for (let i = 0; i < buf.length;) {
    const c = buf[i];
    let len = 0, v = 0, min = 0;
    if (c < 0x80) { out += String.fromCodePoint(c); i++; continue; }
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
    let ok = len > 0 && i + len <= buf.length;
    for (let k = 1; ok && k < len; k++) {
      if ((buf[i + k] & 0xC0) !== 0x80) ok = false;
      else v = (v << 6) | (buf[i + k] & 0x3F);
    }
    if (ok && (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))) ok = false;
    if (ok) { out += String.fromCodePoint(v); i += len; }
    else { out += String.fromCodePoint(PLACEHOLDER + c); valid = false; i++; }
  }
  return [out, valid];
}

function encodeValid(text) {
  const ids = [];
  let start = 0;
  const ws = /\s/u;
  for (let i = 1; i + 1 < text.length; i++) {
    if (text[i] !== '\n' || ws.test(text[i - 1]) || ws.test(text[i + 1])) continue;
    if (i + 1 - start >= 4096) {
      for (const id of encode(text.slice(start, i + 1))) ids.push(id);
      start = i + 1;
    }
  }
  for (const id of encode(text.slice(start))) ids.push(id);
  return ids;
}

function encodeWithPlaceholders(text) {
  const { pat, bpe, byte_encoder, encoder } = internals;
  const ids = [];
  for (const match of text.matchAll(pat)) {
    const bytes = [];
    for (const ch of match[0]) {
      const cp = ch.codePointAt(0);
      if (cp >= PLACEHOLDER && cp < PLACEHOLDER + 256) bytes.push(cp - PLACEHOLDER);
      else for (const b of Buffer.from(ch, 'utf8')) bytes.push(b);
    }
    const token = bytes.map((b) => byte_encoder[b]).join('');
    for (const piece of bpe(token).split(' ')) ids.push(encoder[piece]);
  }
  return ids;
}

for (const file of process.argv.slice(3)) {
  const [text, valid] = decodeBytes(fs.readFileSync(file));
  const ids = valid ? encodeValid(text) : encodeWithPlaceholders(text);
  process.stdout.write([50256, ...ids].join(' ') + '\n');
}
