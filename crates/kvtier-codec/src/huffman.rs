//! A canonical Huffman coder of single bytes, for one byte plane of the lossless codec.
//!
//! KV's planes are order-0 sources: the high byte of a bf16 value (sign and exponent)
//! carries about 3 bits, its low byte nearly 8, and nothing repeats at a distance worth a
//! match. A Huffman code of the plane's own histogram reaches that bound within a few
//! percent, at several times the speed of a general compressor that first looks for
//! matches it will not find (ADR 0021 has the measurements).
//!
//! ```text
//! 128 bytes  code length of each byte value, 4 bits each (low nibble: the even value);
//!            0 for a value that does not occur, else 1..=11
//! 3 × u32 LE byte lengths of streams 0, 1 and 2 (stream 3 is the rest)
//!            four bit streams: stream k codes symbols [k·q, (k+1)·q) of the plane,
//!            q = ⌈n / 4⌉, least significant bit first, the last byte zero-padded
//! ```
//!
//! Four streams are decoded in lockstep so their table lookups overlap; every code is at
//! most 11 bits, so a 64-bit buffer refilled to at least 56 bits yields five lookups of a
//! table that gives one or two symbols each. They are encoded one at a time (a writer's
//! state then stays in registers), five codes between stores of the 64-bit buffer. The
//! code is built from a sample of the plane ([`estimated_counts`]), not a count of every
//! byte: a third less work, at 0.02% of the size on KV-like pages and 1.5% on real bf16
//! KV (ADR 0021).

use crate::DecodeError;

/// Longest code, in bits: the decoding table has `2^MAX_LEN` entries.
const MAX_LEN: u32 = 11;
/// Independent bit streams per plane.
const STREAMS: usize = 4;
/// Bytes of the code-length table.
const TABLE: usize = 128;
/// Bytes before the streams.
const HEAD: usize = TABLE + 4 * (STREAMS - 1);
/// Entries of the decoding table: one per `MAX_LEN`-bit window.
const TABLE_ENTRIES: usize = 1 << MAX_LEN;
/// A decoding table entry: the window's first symbol (bits 0..8) and, when its code fits
/// in the window after the first, the second (8..16); the first code's length (16..20),
/// the bits both take (20..25) and how many symbols the entry holds (25..27). Two
/// symbols a lookup halve the lookups of a plane of short codes (a high byte plane
/// averages 2–3 bits).
type Table = [u32; TABLE_ENTRIES];
const FIRST_LEN_AT: u32 = 16;
const TOTAL_AT: u32 = 20;
const COUNT_AT: u32 = 25;
/// Table lookups between refills: each takes at most [`MAX_LEN`] bits of the 56 or more
/// a refill leaves.
const PAIRS_PER_REFILL: usize = 5;
/// Codes written between flushes of an encoder's 64-bit buffer: a flush leaves at most 7
/// bits, and 7 + 5 × [`MAX_LEN`] = 62.
const CODES_PER_FLUSH: usize = 5;

/// How often each byte value occurs in `plane` (the encoder builds its code from a
/// sample, [`estimated_counts`]; tests compare against every byte counted).
#[cfg(test)]
pub(crate) fn histogram(plane: &[u8]) -> [u64; 256] {
    let mut out = [0u64; 256];
    for &b in plane {
        out[usize::from(b)] += 1;
    }
    out
}

/// How often each byte value occurs among every `step`-th byte of `plane`: what a plane
/// is judged ([`could_pay`]) and its code built ([`estimated_counts`]) from.
pub(crate) fn sampled_histogram(plane: &[u8], step: usize) -> [u64; 256] {
    let step = step.max(1);
    // Four tables: a high plane's samples repeat a few values, and consecutive equal
    // values would otherwise wait on one counter's store.
    let mut t = [[0u32; 256]; 4];
    let mut groups = plane.chunks_exact(4 * step);
    for g in &mut groups {
        t[0][usize::from(g[0])] += 1;
        t[1][usize::from(g[step])] += 1;
        t[2][usize::from(g[2 * step])] += 1;
        t[3][usize::from(g[3 * step])] += 1;
    }
    for &b in groups.remainder().iter().step_by(step) {
        t[0][usize::from(b)] += 1;
    }
    let mut out = [0u64; 256];
    for (s, o) in out.iter_mut().enumerate() {
        *o = t.iter().map(|t| u64::from(t[s])).sum();
    }
    out
}

/// Counts to build the code of `plane` from, without counting every byte: `sample` (the
/// counts of every `step`-th byte, [`sampled_histogram`]) scaled up, and 1 for every byte
/// value whose low 7 bits lie in the range that the plane's bytes' low 7 bits span. Every
/// byte of the plane is among those, so each gets a code. The range takes one pass that
/// vectorizes, about a twelfth of a counting pass; for a high byte plane (sign and
/// exponent) it is the range of exponents in use. Values in that range the sample did
/// not see take code space: 0.02% of the coded size on KV-like pages, 1.5% on real Gemma
/// bf16 KV, whose exponents span a wide range (ADR 0021).
pub(crate) fn estimated_counts(plane: &[u8], sample: &[u64; 256], step: usize) -> [u64; 256] {
    const LANES: usize = 32;
    let (mut low, mut high) = ([0x7fu8; LANES], [0u8; LANES]);
    let mut chunks = plane.chunks_exact(LANES);
    for chunk in &mut chunks {
        for ((lo, hi), &b) in low.iter_mut().zip(&mut high).zip(chunk) {
            *lo = (*lo).min(b & 0x7f);
            *hi = (*hi).max(b & 0x7f);
        }
    }
    for &b in chunks.remainder() {
        low[0] = low[0].min(b & 0x7f);
        high[0] = high[0].max(b & 0x7f);
    }
    let low = low.iter().copied().min().unwrap_or(0);
    let high = high.iter().copied().max().unwrap_or(0x7f);
    let mut counts = sample.map(|c| c * step.max(1) as u64);
    for (value, count) in counts.iter_mut().enumerate() {
        if (low..=high).contains(&(value as u8 & 0x7f)) {
            *count += 1;
        }
    }
    counts
}

/// Whether a code of `counts` could save 1/32 of the bytes they count: whether their
/// order-0 entropy, which no code beats, is under 31/32 of 8 bits. Cheaper than building
/// the code, which decides whether one does.
pub(crate) fn could_pay(counts: &[u64; 256]) -> bool {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return false;
    }
    let total_f = total as f64;
    // Σ c·log2(total / c), in bits.
    let bits: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| c as f64 * (total_f / c as f64).log2())
        .sum();
    bits < total_f * 8.0 * 31.0 / 32.0
}

/// Bits a plane of `counts` takes coded with `lens`.
fn coded_bits(counts: &[u64; 256], lens: &[u8; 256]) -> u64 {
    counts
        .iter()
        .zip(lens)
        .map(|(c, l)| c * u64::from(*l))
        .sum()
}

/// Code lengths (at most [`MAX_LEN`]) of a Huffman code for `counts`; 0 for values that
/// do not occur. A single value present gets a 1-bit code.
pub(crate) fn lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut scaled = *counts;
    loop {
        let lens = unlimited_lengths(&scaled);
        if lens.iter().all(|&l| u32::from(l) <= MAX_LEN) {
            return lens;
        }
        // Too deep: flatten the distribution (rare; costs a little ratio, never
        // correctness) and build again.
        for c in scaled.iter_mut().filter(|c| **c > 0) {
            *c = (*c >> 1).max(1);
        }
    }
}

/// Huffman code lengths for `counts`, however long.
fn unlimited_lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut lens = [0u8; 256];
    let present: Vec<usize> = (0..256).filter(|&s| counts[s] > 0).collect();
    match present.len() {
        0 => return lens,
        1 => {
            lens[present[0]] = 1;
            return lens;
        }
        _ => {}
    }
    // Nodes 0..256 are leaves; internal nodes follow. Two sorted queues: leaves by
    // weight, and internal nodes in the order made (their weights never decrease).
    let mut leaves: Vec<(u64, usize)> = present.iter().map(|&s| (counts[s], s)).collect();
    leaves.sort_unstable();
    let mut parent = [0usize; 512];
    let mut internal: Vec<(u64, usize)> = Vec::with_capacity(leaves.len());
    let (mut li, mut ii) = (0, 0);
    let mut next = 256;
    for _ in 0..leaves.len() - 1 {
        let a = lightest(&leaves, &internal, &mut li, &mut ii);
        let b = lightest(&leaves, &internal, &mut li, &mut ii);
        parent[a.1] = next;
        parent[b.1] = next;
        internal.push((a.0 + b.0, next));
        next += 1;
    }
    let root = next - 1;
    // Depths of internal nodes, from the root down (parents are made after children).
    let mut depth = [0u8; 512];
    for node in (256..root).rev() {
        depth[node] = depth[parent[node]] + 1;
    }
    for &s in &present {
        lens[s] = depth[parent[s]].saturating_add(1);
    }
    lens
}

/// The lighter of the two queues' heads, taken off its queue (a leaf on a tie).
fn lightest(
    leaves: &[(u64, usize)],
    internal: &[(u64, usize)],
    li: &mut usize,
    ii: &mut usize,
) -> (u64, usize) {
    match (leaves.get(*li), internal.get(*ii)) {
        (Some(l), Some(n)) if l.0 <= n.0 => {
            *li += 1;
            *l
        }
        (Some(l), None) => {
            *li += 1;
            *l
        }
        (_, Some(n)) => {
            *ii += 1;
            *n
        }
        // Not reached: n leaves make n − 1 merges, each from two queued nodes.
        (None, None) => (0, 0),
    }
}

/// Canonical codes for `lens`, bit-reversed for a least-significant-bit-first stream:
/// `(code, length)` per byte value.
fn codes(lens: &[u8; 256]) -> [(u16, u8); 256] {
    let mut out = [(0u16, 0u8); 256];
    let mut code = 0u32;
    for len in 1..=MAX_LEN as u8 {
        for s in 0..256 {
            if lens[s] == len {
                let reversed = (code.reverse_bits() >> (32 - u32::from(len))) as u16;
                out[s] = (reversed, len);
                code += 1;
            }
        }
        code <<= 1;
    }
    out
}

/// Bytes [`encode`] would write for a plane of `counts` coded with `lens`.
pub(crate) fn coded_len(counts: &[u64; 256], lens: &[u8; 256]) -> usize {
    // Each stream's last byte may be partly padding.
    HEAD + (coded_bits(counts, lens) / 8) as usize + STREAMS
}

/// Appends `plane` coded with `lens` (from [`lengths`] of its histogram) to `out`;
/// `streams` is scratch space, reused between calls.
pub(crate) fn encode(plane: &[u8], lens: &[u8; 256], out: &mut Vec<u8>, streams: &mut Streams) {
    for pair in lens.chunks_exact(2) {
        out.push(pair[0] | (pair[1] << 4));
    }
    let code = Code::new(lens);
    let q = plane.len().div_ceil(STREAMS).max(1);
    let mut parts = [&[][..]; STREAMS];
    for (part, chunk) in parts.iter_mut().zip(plane.chunks(q)) {
        *part = chunk;
    }
    let mut written = [0usize; STREAMS];
    for ((stream, part), written) in streams.0.iter_mut().zip(parts).zip(&mut written) {
        // Every code fits in MAX_LEN bits; 8 bytes of slack for the whole-word stores.
        let room = part.len() * MAX_LEN as usize / 8 + 16;
        if stream.len() < room {
            stream.resize(room, 0);
        }
        *written = encode_stream(part, &code, stream);
    }
    for len in &written[..STREAMS - 1] {
        out.extend_from_slice(&(*len as u32).to_le_bytes());
    }
    for (stream, len) in streams.0.iter().zip(written) {
        out.extend_from_slice(&stream[..len]);
    }
}

/// The four bit streams of a plane being encoded: space only, longer than any stream
/// written into it (kept at its longest, so it is not zeroed again for every plane).
#[derive(Default)]
pub(crate) struct Streams([Vec<u8>; STREAMS]);

/// A code as the encoder reads it: each byte value's bits and their count, in two
/// tables, so a code costs two plain loads (the count is added straight from memory).
struct Code {
    bits: [u16; 256],
    lens: [u32; 256],
}

impl Code {
    fn new(lens: &[u8; 256]) -> Self {
        let mut code = Code {
            bits: [0; 256],
            lens: lens.map(u32::from),
        };
        for (bits, (c, _)) in code.bits.iter_mut().zip(codes(lens)) {
            *bits = c;
        }
        code
    }
}

/// Codes `part` into `out` (room for its longest coding plus 8 bytes); gives back the
/// bytes written. One stream at a time: two interleaved ran a third slower here, their
/// writers' state no longer fitting in registers.
fn encode_stream(part: &[u8], code: &Code, out: &mut [u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("bmi2") {
        return bmi2::encode_stream(part, code, out);
    }
    encode_stream_portable(part, code, out)
}

/// One stream being written: a 64-bit buffer stored 8 bytes at a time.
struct Writer<'a> {
    out: &'a mut [u8],
    /// Bytes stored for good.
    pos: usize,
    buf: u64,
    /// Valid bits in `buf`.
    n: u32,
}

impl<'a> Writer<'a> {
    fn new(out: &'a mut [u8]) -> Self {
        Self {
            out,
            pos: 0,
            buf: 0,
            n: 0,
        }
    }

    #[inline(always)]
    fn put(&mut self, code: &Code, s: u8) {
        self.buf |= u64::from(code.bits[usize::from(s)]) << self.n;
        self.n += code.lens[usize::from(s)];
    }

    /// Stores the buffer's eight bytes (always), keeps its partial byte: at most 7 bits
    /// remain (n ≤ 7 + 5 × MAX_LEN < 64), so [`CODES_PER_FLUSH`] codes fit before the
    /// next flush.
    #[inline(always)]
    fn flush(&mut self) {
        if let Some(dst) = self.out.get_mut(self.pos..self.pos + 8) {
            dst.copy_from_slice(&self.buf.to_le_bytes());
        }
        self.pos += (self.n / 8) as usize;
        self.buf >>= self.n & 0x38;
        self.n &= 7;
    }

    /// The stream's length, its last partial byte stored.
    #[inline(always)]
    fn finish(mut self) -> usize {
        self.flush();
        if self.n > 0 {
            if let Some(b) = self.out.get_mut(self.pos) {
                *b = self.buf as u8;
            }
            self.pos += 1;
        }
        self.pos
    }
}

#[inline(always)]
fn encode_stream_portable(part: &[u8], code: &Code, out: &mut [u8]) -> usize {
    let mut w = Writer::new(out);
    let mut chunks = part.chunks_exact(CODES_PER_FLUSH);
    for chunk in &mut chunks {
        for &s in chunk {
            w.put(code, s);
        }
        w.flush();
    }
    for &s in chunks.remainder() {
        w.put(code, s);
    }
    w.finish()
}

/// The same encoder and decoder compiled for CPUs with BMI2, whose shifts take their
/// count from any register (fewer instructions per code: the encoder about 1.3× and the
/// decoder 1.2× as fast here).
#[cfg(target_arch = "x86_64")]
mod bmi2 {
    #![expect(
        unsafe_code,
        reason = "a function compiled for a CPU feature checked at run time"
    )]

    use super::Code;

    /// [`super::encode_stream_portable`]; only called where BMI2 was detected.
    pub(super) fn encode_stream(part: &[u8], code: &Code, out: &mut [u8]) -> usize {
        // SAFETY: the caller checked that this CPU has BMI2.
        unsafe { with_bmi2(part, code, out) }
    }

    #[target_feature(enable = "bmi2")]
    fn with_bmi2(part: &[u8], code: &Code, out: &mut [u8]) -> usize {
        super::encode_stream_portable(part, code, out)
    }

    /// [`super::decode_portable`]; only called where BMI2 was detected.
    pub(super) fn decode(stream: &[u8], out: &mut [u8]) -> Result<(), crate::DecodeError> {
        // SAFETY: the caller checked that this CPU has BMI2.
        unsafe { decode_bmi2(stream, out) }
    }

    #[target_feature(enable = "bmi2")]
    fn decode_bmi2(stream: &[u8], out: &mut [u8]) -> Result<(), crate::DecodeError> {
        super::decode_portable(stream, out)
    }
}

/// A least-significant-bit-first reader of one stream.
struct Bits<'a> {
    bytes: &'a [u8],
    /// Next byte to load.
    pos: usize,
    buf: u64,
    /// Valid bits in `buf`.
    n: u32,
}

impl<'a> Bits<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            buf: 0,
            n: 0,
        }
    }

    /// Loads bytes until at least 56 bits are valid; past the end, zeros (caught by
    /// [`Bits::finish`]).
    #[inline(always)]
    fn refill(&mut self) {
        if let Some(word) = self.bytes.get(self.pos..self.pos + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            self.buf |= u64::from_le_bytes(w) << self.n;
            let took = (63 - self.n) / 8;
            self.pos += took as usize;
            self.n += took * 8;
        } else {
            while self.n <= 56 {
                let b = self.bytes.get(self.pos).copied().unwrap_or(0);
                self.buf |= u64::from(b) << self.n;
                self.pos += 1;
                self.n += 8;
            }
        }
    }

    /// The next entry of `table` (one or two symbols), consumed; needs at least
    /// [`MAX_LEN`] valid bits (a refill leaves 56 or more).
    #[inline(always)]
    fn pair(&mut self, table: &Table) -> u32 {
        let e = table[(self.buf as usize) & (TABLE_ENTRIES - 1)];
        let len = (e >> TOTAL_AT) & 0x1f;
        self.buf >>= len;
        self.n -= len;
        e
    }

    /// One symbol only (the first of its entry), consumed.
    #[inline(always)]
    fn symbol(&mut self, table: &Table) -> u8 {
        let e = table[(self.buf as usize) & (TABLE_ENTRIES - 1)];
        let len = (e >> FIRST_LEN_AT) & 0xf;
        self.buf >>= len;
        self.n -= len;
        e as u8
    }

    /// The stream must end exactly here: every bit read was in it, and no whole byte
    /// is left over.
    fn finish(&self) -> Result<(), DecodeError> {
        let used = self.pos * 8 - self.n as usize;
        if used.div_ceil(8) != self.bytes.len() {
            return Err(DecodeError::Invalid("huffman stream length"));
        }
        Ok(())
    }
}

/// The decoding table of the code `lens` (checked: non-empty, at most [`MAX_LEN`] bits,
/// Kraft sum at most 1).
fn table(lens: &[u8; 256]) -> Box<Table> {
    // One symbol per window first. A window no code starts with (an incomplete code: one
    // symbol alone) decodes as a 1-bit code of value 0; such bytes are wrong, and the
    // frame's checksum of the decoded segment refuses them. Every entry consumes at least
    // one bit and at most MAX_LEN, so a refilled buffer never runs dry.
    let mut single = vec![(0u8, 1u32); TABLE_ENTRIES];
    for (s, &(code, len)) in codes(lens).iter().enumerate() {
        if len == 0 {
            continue;
        }
        let step = 1usize << len;
        let mut at = usize::from(code);
        while at < TABLE_ENTRIES {
            single[at] = (s as u8, u32::from(len));
            at += step;
        }
    }
    let mut table = Box::new([0u32; TABLE_ENTRIES]);
    for (w, entry) in table.iter_mut().enumerate() {
        let (s1, l1) = single[w];
        // The second code is known only if it ends inside the window.
        let (s2, l2) = single[w >> l1];
        let (count, total, s2) = if l1 + l2 <= MAX_LEN {
            (2, l1 + l2, u32::from(s2))
        } else {
            (1, l1, 0)
        };
        *entry = u32::from(s1)
            | (s2 << 8)
            | (l1 << FIRST_LEN_AT)
            | (total << TOTAL_AT)
            | (count << COUNT_AT);
    }
    table
}

/// Decodes a plane written by [`encode`] from `stream` (exactly its bytes) into `out`
/// (exactly the plane's length).
pub(crate) fn decode(stream: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("bmi2") {
        return bmi2::decode(stream, out);
    }
    decode_portable(stream, out)
}

#[inline(always)]
fn decode_portable(stream: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    if stream.len() < HEAD {
        return Err(DecodeError::Truncated);
    }
    let mut lens = [0u8; 256];
    for (i, b) in stream[..TABLE].iter().enumerate() {
        lens[2 * i] = b & 0x0f;
        lens[2 * i + 1] = b >> 4;
    }
    let longest = u32::from(lens.iter().copied().max().unwrap_or(0));
    if longest == 0 && out.is_empty() && stream.len() == HEAD {
        return Ok(()); // an empty plane
    }
    if longest == 0 || longest > MAX_LEN {
        return Err(DecodeError::Invalid("huffman lengths"));
    }
    // Kraft: a prefix code uses at most the whole code space.
    let space: u64 = lens
        .iter()
        .filter(|&&l| l > 0)
        .map(|&l| 1u64 << (MAX_LEN - u32::from(l)))
        .sum();
    if space > 1 << MAX_LEN {
        return Err(DecodeError::Invalid("huffman lengths"));
    }
    let table = table(&lens);
    let mut sizes = [0usize; STREAMS];
    let mut at = TABLE;
    for size in sizes.iter_mut().take(STREAMS - 1) {
        let b = &stream[at..at + 4];
        *size = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        at += 4;
    }
    let rest = &stream[HEAD..];
    let first: usize = sizes[..STREAMS - 1].iter().sum();
    if first > rest.len() {
        return Err(DecodeError::Truncated);
    }
    sizes[STREAMS - 1] = rest.len() - first;
    let mut bounds = [0usize; STREAMS + 1];
    for k in 0..STREAMS {
        bounds[k + 1] = bounds[k] + sizes[k];
    }
    // Local state, not behind a pointer: the decoded bytes written below cannot alias it,
    // so it stays in registers.
    let mut r: [Bits<'_>; STREAMS] =
        std::array::from_fn(|k| Bits::new(&rest[bounds[k]..bounds[k + 1]]));

    let q = out.len().div_ceil(STREAMS).max(1);
    let mut parts: Vec<&mut [u8]> = out.chunks_mut(q).collect();
    parts.resize_with(STREAMS, || &mut []);
    let [p0, p1, p2, p3] = &mut parts[..] else {
        return Err(DecodeError::Invalid("huffman streams"));
    };
    let t = &*table;
    // Every stream at once while each has room for a refill's entries of two symbols
    // (and the second byte a one-symbol entry writes and the next overwrites), then each
    // one's tail a symbol at a time.
    let mut at = [0usize; STREAMS];
    let room = |part: &[u8], at: usize| part.len().saturating_sub(at) > 2 * PAIRS_PER_REFILL;
    while room(p0, at[0]) && room(p1, at[1]) && room(p2, at[2]) && room(p3, at[3]) {
        r[0].refill();
        r[1].refill();
        r[2].refill();
        r[3].refill();
        for _ in 0..PAIRS_PER_REFILL {
            put_pair(p0, &mut at[0], r[0].pair(t));
            put_pair(p1, &mut at[1], r[1].pair(t));
            put_pair(p2, &mut at[2], r[2].pair(t));
            put_pair(p3, &mut at[3], r[3].pair(t));
        }
    }
    for ((part, reader), at) in [p0, p1, p2, p3].into_iter().zip(r.iter_mut()).zip(at) {
        for b in part[at..].iter_mut() {
            reader.refill();
            *b = reader.symbol(t);
        }
        reader.finish()?;
    }
    Ok(())
}

/// Writes an entry's one or two symbols at `at` of `part` (which has room for two) and
/// moves `at` past them.
#[inline(always)]
fn put_pair(part: &mut [u8], at: &mut usize, e: u32) {
    if let Some(dst) = part.get_mut(*at..*at + 2) {
        dst.copy_from_slice(&(e as u16).to_le_bytes());
    }
    *at += ((e >> COUNT_AT) & 3) as usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(plane: &[u8]) -> Vec<u8> {
        let counts = histogram(plane);
        let lens = lengths(&counts);
        let mut enc = Vec::new();
        encode(plane, &lens, &mut enc, &mut Streams::default());
        assert!(
            enc.len() <= coded_len(&counts, &lens),
            "the estimate is an upper bound"
        );
        let mut out = vec![0u8; plane.len()];
        decode(&enc, &mut out).unwrap();
        assert_eq!(out, plane);
        enc
    }

    #[test]
    fn skewed_uniform_single_and_tiny_planes_come_back_exactly() {
        let mut x = 7u32;
        let skewed: Vec<u8> = (0..100_003)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                0x3c + (x.trailing_zeros() as u8 % 9)
            })
            .collect();
        let enc = round_trip(&skewed);
        assert!(enc.len() < skewed.len() / 3, "{}", enc.len());
        let uniform: Vec<u8> = (0..70_001u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        round_trip(&uniform);
        round_trip(&[42; 1000]);
        for n in 0..9 {
            round_trip(&skewed[..n]);
        }
    }

    /// The coder compiled for BMI2, where this CPU runs it, writes the same bits as the
    /// portable one, and both decoders give the plane back.
    #[test]
    fn the_bmi2_coder_writes_and_reads_what_the_portable_one_does() {
        let mut x = 11u32;
        let plane: Vec<u8> = (0..20_011)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                0x38 + (x.trailing_zeros() as u8 % 13) + (x as u8 & 0x80)
            })
            .collect();
        let code = Code::new(&lengths(&histogram(&plane)));
        for len in [0, 1, 4, 5, 6, 999, 20_011] {
            let part = &plane[..len];
            let room = len * MAX_LEN as usize / 8 + 16;
            let (mut a, mut b) = (vec![0u8; room], vec![0u8; room]);
            let n = encode_stream_portable(part, &code, &mut a);
            let m = encode_stream(part, &code, &mut b);
            assert_eq!(a[..n], b[..m], "{len} symbols");
        }
        let mut enc = Vec::new();
        encode(
            &plane,
            &lengths(&histogram(&plane)),
            &mut enc,
            &mut Streams::default(),
        );
        let (mut a, mut b) = (vec![0u8; plane.len()], vec![0u8; plane.len()]);
        decode_portable(&enc, &mut a).unwrap();
        decode(&enc, &mut b).unwrap();
        assert_eq!((&a, &b), (&plane, &plane));
    }

    #[test]
    fn a_sample_based_code_codes_every_byte_of_the_plane() {
        // Values the every-8th-byte sample never sees (rare exponents, never at a multiple
        // of 8) must still get codes: the plane comes back exactly.
        let mut plane: Vec<u8> = (0..40_000u32).map(|i| 0x3c + (i % 3) as u8).collect();
        for (k, i) in (3..plane.len() - 1).step_by(8 * 125).enumerate() {
            plane[i] = 0x21 + (k % 5) as u8;
            plane[i + 1] = 0xbf;
        }
        let sample = sampled_histogram(&plane, 8);
        assert!(
            plane.iter().any(|&b| sample[usize::from(b)] == 0),
            "a value unsampled"
        );
        assert!(could_pay(&sample));
        let counts = estimated_counts(&plane, &sample, 8);
        let lens = lengths(&counts);
        assert!(plane.iter().all(|&b| lens[usize::from(b)] > 0));
        let mut enc = Vec::new();
        encode(&plane, &lens, &mut enc, &mut Streams::default());
        let mut out = vec![0u8; plane.len()];
        decode(&enc, &mut out).unwrap();
        assert_eq!(out, plane);
        // A plane of noise: its sample says a code could not pay.
        let noise: Vec<u8> = (0..40_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert!(!could_pay(&sampled_histogram(&noise, 8)));
    }

    #[test]
    fn a_geometric_distribution_is_held_to_eleven_bits() {
        // Counts 2^0 .. 2^39: an unlimited code would be 39 bits deep.
        let mut counts = [0u64; 256];
        for (i, c) in counts.iter_mut().take(40).enumerate() {
            *c = 1 << i;
        }
        let lens = lengths(&counts);
        assert!(lens.iter().all(|&l| u32::from(l) <= MAX_LEN));
        assert!(lens.iter().take(40).all(|&l| l > 0));
        let space: u64 = lens
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_LEN - u32::from(l)))
            .sum();
        assert!(space <= 1 << MAX_LEN);
    }

    #[test]
    fn damaged_streams_are_errors_or_other_bytes_never_a_panic() {
        let plane: Vec<u8> = (0..5000u32).map(|i| (i % 7 + (i % 13) / 5) as u8).collect();
        let counts = histogram(&plane);
        let mut enc = Vec::new();
        encode(&plane, &lengths(&counts), &mut enc, &mut Streams::default());
        let mut out = vec![0u8; plane.len()];
        for i in 0..enc.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = enc.clone();
                bad[i] ^= bit;
                let _ = decode(&bad, &mut out);
            }
        }
        for cut in [0, 10, HEAD, enc.len() - 1] {
            assert!(decode(&enc[..cut], &mut out).is_err(), "cut at {cut}");
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out).is_err());
    }
}
