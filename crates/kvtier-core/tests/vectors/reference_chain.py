#!/usr/bin/env python3
"""An independent reference implementation of kvtier's layout digest and block-hash chain v1,
written from docs/adr/0001-block-hash.md with nothing but the standard library (the SHA-256
compression function is spelled out here, since hashlib cannot start from a custom state).

Usage: reference_chain.py  -> prints "<case> <layout digest> <block hashes...>" lines for the
cases below, which must equal tests/vectors/hash_chain_v1.txt.
"""
import hashlib
import struct

K = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]
M = 0xFFFFFFFF


def rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & M


def compress(state, block):
    """FIPS 180-4 SHA-256 compression of one 64-byte block, with the feed-forward."""
    w = list(struct.unpack(">16I", block))
    for i in range(16, 64):
        s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
        s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
        w.append((w[i - 16] + s0 + w[i - 7] + s1) & M)
    a, b, c, d, e, f, g, h = state
    for i in range(64):
        t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) & M
        t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) & M
        a, b, c, d, e, f, g, h = (t1 + t2) & M, a, b, c, (d + t1) & M, e, f, g
    return [(x + y) & M for x, y in zip(state, [a, b, c, d, e, f, g, h])]


DTYPES = {"f32": 1, "f16": 2, "bf16": 3, "fp8_e4m3": 4, "fp8_e5m2": 5, "i8": 6}


def layout_bytes(model, weights, tokenizer, dtype, tpb, layers, kv_heads, head_dim,
                 tp=(0, 1), pp=(0, 1), lora=None, salt=b""):
    def s(b):
        return struct.pack("<I", len(b)) + b
    out = b"KVTL" + struct.pack("<H", 1)
    out += s(model.encode()) + s(weights.encode()) + s(tokenizer.encode())
    out += bytes([DTYPES[dtype]])
    out += struct.pack("<8I", tpb, layers, kv_heads, head_dim, tp[0], tp[1], pp[0], pp[1])
    out += b"\x00" if lora is None else b"\x01" + s(lora.encode())
    return out + s(salt)


def extra_tag(keys):
    h = hashlib.sha256(b"kvtier/extra-keys/v1" + struct.pack("<Q", len(keys)))
    for k in keys:
        h.update(struct.pack("<Q", len(k)) + k)
    return h.digest()[:16]


def chain(layout, tpb, tokens, extras):
    digest = hashlib.sha256(layout).digest()[:16]
    parent = digest
    out = []
    for i in range(len(tokens) // tpb):
        tag = extra_tag(extras[i]) if i in extras else bytes(16)
        state = list(struct.unpack(">8I", parent + tag))
        msg = struct.pack("<%dI" % tpb, *tokens[i * tpb:(i + 1) * tpb])
        msg += bytes(-len(msg) % 64)
        for j in range(0, len(msg), 64):
            state = compress(state, msg[j:j + 64])
        parent = struct.pack(">4I", *state[:4])
        out.append(parent.hex())
    return digest.hex(), out


def tokens(n):
    return [(i * 7919) % 262144 for i in range(n)]


def gemma(tpb, **kw):
    return layout_bytes("google/gemma-3-270m", "sha256:5f1c", "sha256:9a0e", "bf16", tpb, 18, 1, 256, **kw)


CASES = [
    ("gemma_tpb16_4_blocks", gemma(16), 16, tokens(64), {}),
    ("gemma_tpb16_partial_tail", gemma(16), 16, tokens(70), {}),
    ("gemma_tpb20_two_compressions", gemma(20), 20, tokens(60), {}),
    ("gemma_tpb8_padded", gemma(8), 8, tokens(24), {}),
    ("salted_lora_tp", gemma(16, tp=(1, 2), lora="lora-7", salt=b"tenant-a"), 16, tokens(48), {}),
    ("extras_on_block_1", gemma(16), 16, tokens(48), {1: [b"image:0f3a", b"image:77c1"]}),
    ("max_token_ids", layout_bytes("m", "", "", "f32", 16, 1, 1, 1), 16, [0xFFFFFFFF] * 32, {}),
]

if __name__ == "__main__":
    for name, layout, tpb, toks, extras in CASES:
        digest, hashes = chain(layout, tpb, toks, extras)
        print(name, digest, " ".join(hashes))
