//! Bounded line reading: constant memory whatever the input looks like.
//!
//! Logs come from many sources (kubectl, mpirun `--tag-output`, torchrun, files written by crashed
//! processes), so lines may be endless, binary or cut off. [`LineReader`] hands out each line as a
//! byte slice of at most `max_len` bytes (the rest of an over-long line is skipped and counted) and
//! never allocates per line.

use std::io::{self, BufRead};

/// Default limit of one line in bytes; NCCL's own log lines are at most a few KiB.
pub const DEFAULT_MAX_LINE: usize = 64 * 1024;

/// Reads lines from a [`BufRead`] into one reused buffer of bounded size.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max_len: usize,
    truncated: u64,
    bytes: u64,
}

impl<R: BufRead> LineReader<R> {
    /// Wraps `inner`; lines longer than `max_len` bytes are cut to `max_len` (at least 1).
    pub fn new(inner: R, max_len: usize) -> Self {
        let max_len = max_len.max(1);
        Self {
            inner,
            buf: Vec::with_capacity(max_len.min(8192)),
            max_len,
            truncated: 0,
            bytes: 0,
        }
    }

    /// The next line without its `\n` (and without a trailing `\r`), or `None` at the end.
    pub fn next_line(&mut self) -> io::Result<Option<&[u8]>> {
        self.buf.clear();
        let mut saw_any = false;
        let mut cut = false;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                break;
            }
            saw_any = true;
            let (take, consumed, done) = match memchr::memchr(b'\n', chunk) {
                Some(i) => (i, i + 1, true),
                None => (chunk.len(), chunk.len(), false),
            };
            let room = self.max_len - self.buf.len();
            if take > room {
                cut = true;
            }
            self.buf.extend_from_slice(&chunk[..take.min(room)]);
            self.inner.consume(consumed);
            self.bytes += consumed as u64;
            if done {
                break;
            }
        }
        if !saw_any {
            return Ok(None);
        }
        if cut {
            self.truncated += 1;
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        Ok(Some(&self.buf))
    }

    /// Calls `f` with every remaining line (same lines as repeated [`LineReader::next_line`]),
    /// handing out slices of the reader's own buffer when a line lies inside it, so that most lines
    /// are never copied.
    pub fn for_each_line(&mut self, mut f: impl FnMut(&[u8])) -> io::Result<()> {
        self.buf.clear();
        let mut pending = false; // a partial line is held in self.buf
        let mut cut = false;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                break;
            }
            let len = chunk.len();
            let mut start = 0;
            for nl in memchr::memchr_iter(b'\n', chunk) {
                let piece = &chunk[start..nl];
                if pending {
                    let room = self.max_len - self.buf.len();
                    cut |= piece.len() > room;
                    self.buf.extend_from_slice(&piece[..piece.len().min(room)]);
                    if cut {
                        self.truncated += 1;
                    }
                    f(strip_cr(&self.buf));
                    self.buf.clear();
                    pending = false;
                    cut = false;
                } else if piece.len() > self.max_len {
                    self.truncated += 1;
                    f(strip_cr(&piece[..self.max_len]));
                } else {
                    f(strip_cr(piece));
                }
                start = nl + 1;
            }
            if start < len {
                let piece = &chunk[start..];
                let room = self.max_len - self.buf.len();
                cut |= piece.len() > room;
                self.buf.extend_from_slice(&piece[..piece.len().min(room)]);
                pending = true;
            }
            self.inner.consume(len);
            self.bytes += len as u64;
        }
        if pending {
            if cut {
                self.truncated += 1;
            }
            f(strip_cr(&self.buf));
            self.buf.clear();
        }
        Ok(())
    }

    /// Like [`LineReader::for_each_line`], also handing out where each line's ` NCCL ` marker
    /// starts ([`crate::line::marker`] of the line): the complete lines inside the read buffer are
    /// found with [`crate::scan::scan_lines`], 64 bytes at a time.
    pub fn for_each_marked_line(
        &mut self,
        mut f: impl FnMut(&[u8], Option<usize>),
    ) -> io::Result<()> {
        self.buf.clear();
        let mut pending = false; // a partial line is held in self.buf
        let mut cut = false;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                break;
            }
            let len = chunk.len();
            let mut start = 0;
            if pending {
                // Finish the line that the previous read ended in.
                let (take, done) = match memchr::memchr(b'\n', chunk) {
                    Some(i) => (i, true),
                    None => (len, false),
                };
                let room = self.max_len - self.buf.len();
                cut |= take > room;
                self.buf.extend_from_slice(&chunk[..take.min(room)]);
                if done {
                    if cut {
                        self.truncated += 1;
                    }
                    let line = strip_cr(&self.buf);
                    f(line, crate::line::marker(line));
                    self.buf.clear();
                    pending = false;
                    cut = false;
                    start = take + 1;
                } else {
                    start = len;
                }
            }
            if start < len {
                let rest = &chunk[start..];
                let (used, truncated) = crate::scan::scan_lines(rest, self.max_len, &mut f);
                self.truncated += truncated;
                if used < rest.len() {
                    let piece = &rest[used..];
                    let room = self.max_len;
                    cut = piece.len() > room;
                    self.buf.extend_from_slice(&piece[..piece.len().min(room)]);
                    pending = true;
                }
            }
            self.inner.consume(len);
            self.bytes += len as u64;
        }
        if pending {
            if cut {
                self.truncated += 1;
            }
            let line = strip_cr(&self.buf);
            f(line, crate::line::marker(line));
            self.buf.clear();
        }
        Ok(())
    }

    /// How many lines were longer than the limit and were cut.
    pub fn truncated_lines(&self) -> u64 {
        self.truncated
    }

    /// Bytes consumed from the input so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], max: usize) -> (Vec<Vec<u8>>, u64) {
        let mut r = LineReader::new(io::BufReader::with_capacity(3, input), max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line().expect("in-memory read") {
            out.push(l.to_vec());
        }
        (out, r.truncated_lines())
    }

    #[test]
    fn splits_lines_across_small_buffers_and_strips_crlf() {
        let (lines, cut) = all(b"abc\r\ndefgh\n\nlast", 100);
        assert_eq!(
            lines,
            vec![
                b"abc".to_vec(),
                b"defgh".to_vec(),
                b"".to_vec(),
                b"last".to_vec()
            ]
        );
        assert_eq!(cut, 0);
    }

    #[test]
    fn cuts_long_lines_and_keeps_reading() {
        let (lines, cut) = all(b"0123456789\nab\n", 4);
        assert_eq!(lines, vec![b"0123".to_vec(), b"ab".to_vec()]);
        assert_eq!(cut, 1);
    }

    fn all_each(input: &[u8], max: usize, cap: usize) -> (Vec<Vec<u8>>, u64) {
        let mut r = LineReader::new(io::BufReader::with_capacity(cap, input), max);
        let mut out = Vec::new();
        r.for_each_line(|l| out.push(l.to_vec()))
            .expect("in-memory read");
        (out, r.truncated_lines())
    }

    proptest::proptest! {
        #[test]
        fn for_each_line_equals_next_line(
            data in proptest::collection::vec(proptest::sample::select(vec![b'a', b'\n', b'\r', 0xff]), 0..300),
            max in 1usize..40,
            cap in 1usize..64,
        ) {
            let mut r = LineReader::new(io::BufReader::with_capacity(cap, &data[..]), max);
            let mut expect = Vec::new();
            while let Some(l) = r.next_line().expect("read") {
                expect.push(l.to_vec());
            }
            let (got, cut) = all_each(&data, max, cap);
            proptest::prop_assert_eq!(got, expect);
            proptest::prop_assert_eq!(cut, r.truncated_lines());
        }
    }

    proptest::proptest! {
        /// Chunk-boundary independence: whatever the read buffer's size, the marked lines are the
        /// lines of `for_each_line` with their markers.
        #[test]
        fn marked_lines_equal_lines_whatever_the_buffer(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                &b"NCCL "[..], b" NCCL ", b"N", b" ", b"\n", b"\r", b"a", b"INFO ", &[0xff],
                b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            ]), 0..60),
            max in 1usize..100,
            cap in 1usize..200,
        ) {
            let data = pieces.concat();
            let (expect, cut) = all_each(&data, max, 7);
            let expect: Vec<(Vec<u8>, Option<usize>)> =
                expect.into_iter().map(|l| { let m = crate::line::marker(&l); (l, m) }).collect();
            let mut r = LineReader::new(io::BufReader::with_capacity(cap, &data[..]), max);
            let mut got = Vec::new();
            r.for_each_marked_line(|l, m| got.push((l.to_vec(), m))).expect("in-memory read");
            proptest::prop_assert_eq!(got, expect);
            proptest::prop_assert_eq!(r.truncated_lines(), cut);
            proptest::prop_assert_eq!(r.bytes_read(), data.len() as u64);
        }
    }

    #[test]
    fn empty_input_has_no_lines() {
        assert!(all(b"", 10).0.is_empty());
    }
}
