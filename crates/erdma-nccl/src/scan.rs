//! Lines and their ` NCCL ` markers found in a whole read buffer at once.
//!
//! Looking for the end of every line and then for the marker inside it costs two searches per
//! line (each with its own set-up) on logs whose lines are ~80 bytes. [`scan_lines`] instead
//! reads the buffer 64 bytes at a time into two bit masks, one for `\n` and one for `N`, and walks
//! their set bits: each line costs a few bit operations, and only an `N` that starts a line or
//! follows a space is compared with `NCCL `. The result is the same as cutting the buffer at
//! every `\n` and calling [`crate::line::marker`] on each line.

use crate::line;

/// Calls `f(line, marker)` for every complete line of `buf` (every line followed by a `\n`): the
/// line without its `\n` and without a trailing `\r`, cut to `max_len` bytes (at least 1), and
/// where its ` NCCL ` marker starts ([`line::marker`] of the line as handed out). Returns the
/// number of bytes consumed (up to and including the last `\n`; the rest is an unfinished line)
/// and how many lines were cut.
pub fn scan_lines(
    buf: &[u8],
    max_len: usize,
    mut f: impl FnMut(&[u8], Option<usize>),
) -> (usize, u64) {
    let max_len = max_len.max(1);
    let mut start = 0; // first byte of the current line
    let mut marker = None; // first marker of the current line, found so far
    let mut truncated = 0;
    let mut base = 0;
    while base < buf.len() {
        let (mut nl, mut cand) = match buf.get(base..base + 64) {
            Some(block) => masks(block),
            None => {
                // The tail: zero padding holds neither byte.
                let mut block = [0u8; 64];
                block[..buf.len() - base].copy_from_slice(&buf[base..]);
                masks(&block)
            }
        };
        loop {
            // The next `\n` of the block as a bit (0 when there is none) and the bits before it
            // (all bits when there is none).
            let newline = nl & nl.wrapping_neg();
            let before = newline.wrapping_sub(1);
            if marker.is_none() {
                let mut c = cand & before;
                while c != 0 {
                    let p = base + c.trailing_zeros() as usize;
                    if is_marker(buf, start, p) {
                        marker = Some(p);
                        break;
                    }
                    c &= c - 1;
                }
            }
            if nl == 0 {
                break;
            }
            let end = base + newline.trailing_zeros() as usize;
            let line = &buf[start..end];
            if line.len() > max_len {
                truncated += 1;
                let cut = strip_cr(&line[..max_len]);
                f(cut, line::marker(cut));
            } else {
                // A marker ends with a space, so it stays inside the line without its `\r`.
                f(strip_cr(line), marker.map(|p| p - start));
            }
            start = end + 1;
            marker = None;
            cand &= !(newline | before);
            nl ^= newline;
        }
        base += 64;
    }
    (start, truncated)
}

/// Whether `NCCL ` starts at `p` of `buf`, at the start of the line that starts at `start` or after
/// a space. `NCCL ` holds no `\n`, so a match lies inside that line.
#[inline]
fn is_marker(buf: &[u8], start: usize, p: usize) -> bool {
    buf.get(p..p + 5) == Some(b"NCCL ") && (p == start || buf[p - 1] == b' ')
}

/// Whether `f(i)` holds for some position `i` of `hay` whose byte is one of `set`, trying them in
/// order: 16 bytes are compared with the four values at once, so a line with no such byte costs
/// one pass without a call per candidate.
pub fn any_of4(hay: &[u8], set: [u8; 4], mut f: impl FnMut(usize) -> bool) -> bool {
    let mut base = 0;
    while base < hay.len() {
        let mut m = match hay.get(base..base + 16) {
            Some(chunk) => mask4(chunk, set),
            None => {
                // The tail, padded; the padding's bits are dropped.
                let tail = &hay[base..];
                let mut chunk = [0u8; 16];
                chunk[..tail.len()].copy_from_slice(tail);
                mask4(&chunk, set) & ((1 << tail.len()) - 1)
            }
        };
        while m != 0 {
            if f(base + m.trailing_zeros() as usize) {
                return true;
            }
            m &= m - 1;
        }
        base += 16;
    }
    false
}

/// Bit mask of the bytes of `chunk` equal to one of `set` (bit i: byte i).
#[inline]
pub fn mask16(chunk: &[u8; 16], set: [u8; 4]) -> u32 {
    mask4(chunk, set)
}

/// Bit mask of the bytes of a 16-byte chunk equal to one of `set`.
#[cfg(target_arch = "x86_64")]
#[inline]
fn mask4(chunk: &[u8], set: [u8; 4]) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let Some(chunk) = chunk.first_chunk::<16>() else {
        return 0;
    };
    // SAFETY: SSE2 is part of the x86_64 baseline, and the load reads the 16 bytes of `chunk`
    // with no alignment requirement.
    unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        let eq = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
        let any = _mm_or_si128(
            _mm_or_si128(eq(set[0]), eq(set[1])),
            _mm_or_si128(eq(set[2]), eq(set[3])),
        );
        _mm_movemask_epi8(any) as u32 & 0xffff
    }
}

/// Bit mask of the bytes of a 16-byte chunk equal to one of `set`.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn mask4(chunk: &[u8], set: [u8; 4]) -> u32 {
    mask4_portable(chunk, set)
}

/// [`mask4`] without SIMD (CPUs other than x86_64; compared with the SSE2 one in the tests).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn mask4_portable(chunk: &[u8], set: [u8; 4]) -> u32 {
    let mut m = 0;
    for (i, b) in chunk.iter().take(16).enumerate() {
        m |= u32::from(set.contains(b)) << i;
    }
    m
}

#[inline]
fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Bit masks of the `\n` bytes and the `N` bytes of a 64-byte block (bit i: byte i), with SSE2:
/// four 16-byte compares per byte value.
#[cfg(target_arch = "x86_64")]
#[inline]
fn masks(block: &[u8]) -> (u64, u64) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    let block: &[u8; 64] = match block.first_chunk() {
        Some(b) => b,
        None => return (0, 0),
    };
    // SAFETY: SSE2 is part of the x86_64 baseline (every x86_64 CPU has it), and each load reads
    // 16 bytes inside `block` with no alignment requirement.
    unsafe {
        let nl = _mm_set1_epi8(b'\n' as i8);
        let n = _mm_set1_epi8(b'N' as i8);
        let p = block.as_ptr();
        let v0 = _mm_loadu_si128(p.cast::<__m128i>());
        let v1 = _mm_loadu_si128(p.add(16).cast::<__m128i>());
        let v2 = _mm_loadu_si128(p.add(32).cast::<__m128i>());
        let v3 = _mm_loadu_si128(p.add(48).cast::<__m128i>());
        let bits =
            |v: __m128i, c: __m128i| u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(v, c)) as u16);
        let m_nl = bits(v0, nl) | bits(v1, nl) << 16 | bits(v2, nl) << 32 | bits(v3, nl) << 48;
        let m_n = bits(v0, n) | bits(v1, n) << 16 | bits(v2, n) << 32 | bits(v3, n) << 48;
        (m_nl, m_n)
    }
}

/// Bit masks of the `\n` bytes and the `N` bytes of a 64-byte block (bit i: byte i).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn masks(block: &[u8]) -> (u64, u64) {
    masks_portable(block)
}

/// [`masks`] without SIMD (CPUs other than x86_64; compared with the SSE2 one in the tests).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn masks_portable(block: &[u8]) -> (u64, u64) {
    let mut m_nl = 0u64;
    let mut m_n = 0u64;
    for (i, &b) in block.iter().take(64).enumerate() {
        m_nl |= u64::from(b == b'\n') << i;
        m_n |= u64::from(b == b'N') << i;
    }
    (m_nl, m_n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines with their markers, bytes consumed, lines cut.
    type Scanned = (Vec<(Vec<u8>, Option<usize>)>, usize, u64);

    /// The plain way: cut at every `\n`, cut each line to `max_len`, drop a trailing `\r`, and
    /// look for the marker in what is left.
    fn reference(buf: &[u8], max_len: usize) -> Scanned {
        let mut out = Vec::new();
        let mut truncated = 0;
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|&b| b == b'\n') {
            let mut line = &buf[start..start + i];
            if line.len() > max_len {
                truncated += 1;
                line = &line[..max_len];
            }
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            out.push((line.to_vec(), line::marker(line)));
            start += i + 1;
        }
        (out, start, truncated)
    }

    fn scanned(buf: &[u8], max_len: usize) -> Scanned {
        let mut out = Vec::new();
        let (used, truncated) = scan_lines(buf, max_len, |l, m| out.push((l.to_vec(), m)));
        (out, used, truncated)
    }

    #[test]
    fn markers_at_line_start_after_space_and_across_blocks() {
        let mut buf = b"NCCL INFO a\nx NCCL WARN b\nxNCCL INFO c\n".to_vec();
        // A line that crosses the 64-byte block boundary with its marker in the next block.
        buf.extend_from_slice(&[b'h'; 60]);
        buf.extend_from_slice(b" NCCL INFO d\r\nunfinished NCCL ");
        let (lines, used, cut) = scanned(&buf, 1000);
        let got: Vec<Option<usize>> = lines.iter().map(|l| l.1).collect();
        assert_eq!(got, vec![Some(0), Some(2), None, Some(61)]);
        assert_eq!(lines[3].0.last(), Some(&b'd'), "\\r is dropped");
        assert_eq!(used, buf.len() - b"unfinished NCCL ".len());
        assert_eq!(cut, 0);
    }

    #[test]
    fn long_lines_are_cut_and_looked_at_as_cut() {
        let (lines, _, cut) = scanned(b"abcdef NCCL INFO x\nab NCCL INFO y\n", 9);
        assert_eq!(lines[0], (b"abcdef NC".to_vec(), None));
        assert_eq!(lines[1], (b"ab NCCL I".to_vec(), Some(3)));
        assert_eq!(cut, 2);
    }

    proptest::proptest! {
        #[test]
        fn portable_masks_equal_the_simd_ones(
            block in proptest::collection::vec(proptest::sample::select(vec![b'\n', b'N', b'W', b'D', b'F', b'x', 0u8, 0xff]), 64),
        ) {
            proptest::prop_assert_eq!(masks(&block), masks_portable(&block));
            proptest::prop_assert_eq!(mask4(&block[..16], *b"NWDF"), mask4_portable(&block[..16], *b"NWDF"));
        }

        #[test]
        fn any_of4_tries_every_matching_position_in_order(
            hay in proptest::collection::vec(proptest::sample::select(vec![b'N', b'W', b'x', b'F', b'D', b' ']), 0..70),
            stop in 0usize..70,
        ) {
            let mut tried = Vec::new();
            let found = any_of4(&hay, *b"NWDF", |i| { tried.push(i); i >= stop });
            let expect: Vec<usize> = (0..hay.len()).filter(|&i| hay[i] != b'x' && hay[i] != b' ').collect();
            let until = expect.iter().position(|&i| i >= stop);
            proptest::prop_assert_eq!(found, until.is_some());
            proptest::prop_assert_eq!(&tried[..], &expect[..until.map_or(expect.len(), |u| u + 1)]);
        }

        #[test]
        fn equals_cutting_line_by_line(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                &b"NCCL "[..], b" NCCL ", b"N", b"NC", b"NCCL", b" ", b"\n", b"\r", b"\r\n", b"a",
                b"INFO ", b"node-1:2:3 [0]", &[0xff], &[0u8], b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            ]), 0..80),
            max_len in 1usize..120,
        ) {
            let buf = pieces.concat();
            proptest::prop_assert_eq!(scanned(&buf, max_len), reference(&buf, max_len));
        }
    }
}
