//! Rewriting of the HTTP/2 `:authority` pseudo-header on a client-to-server byte stream.
//!
//! Older kubelets (grpc-go dialing a bare socket path) send the socket path, e.g.
//! `/var/lib/kubelet/device-plugins/x.sock`, as `:authority`. That is not a valid URI authority, and
//! the Rust HTTP/2 stack (h2) resets such streams with `PROTOCOL_ERROR`. Newer kubelets send
//! `localhost`. The device plugin must accept both, so its server runs every accepted connection
//! through an [`AuthorityRewriter`] that replaces an invalid `:authority` by `localhost` before h2
//! parses the request. The fake kubelet uses the same rewriter on its *outgoing* bytes to send the
//! socket path, as an old kubelet does.
//!
//! How: the rewriter follows the HTTP/2 framing of the client's byte stream. Every frame other than
//! a header block passes unchanged. A header block (HEADERS plus CONTINUATION frames) is decoded
//! with an HPACK decoder that mirrors the client's encoder. When no block has needed a change the
//! original bytes pass unchanged; once one has, that block and every later one are re-encoded as
//! HPACK literals without indexing, so the receiver's dynamic table never diverges from what the
//! rewritten blocks reference.

use std::io;
use tonic::codegen::http::uri::Authority;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload every HTTP/2 peer must accept (SETTINGS_MAX_FRAME_SIZE default).
const DEFAULT_MAX_FRAME: usize = 16_384;
/// Largest header block the rewriter buffers (a gRPC request has a few hundred bytes).
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// What to do with the `:authority` of each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityPolicy {
    /// Server side: replace an authority that is not a valid URI authority (such as a socket path)
    /// by `localhost`; keep valid ones.
    FixInvalid,
    /// Client side: send this value (for instance a socket path) as `:authority`.
    ReplaceWith(String),
}

/// Incremental rewriter of a client-to-server HTTP/2 byte stream. Feed it bytes as they arrive;
/// it emits the rewritten bytes.
pub struct AuthorityRewriter {
    policy: AuthorityPolicy,
    preface_seen: usize,
    /// Not HTTP/2 (bad preface): pass everything through and let the HTTP/2 layer complain.
    passthrough: bool,
    pending: Vec<u8>,
    block: Option<HeaderBlock>,
    decoder: loona_hpack::Decoder<'static>,
    reencode: bool,
    rewritten: u64,
}

struct HeaderBlock {
    stream_id: u32,
    end_stream: bool,
    fragment: Vec<u8>,
    raw: Vec<u8>,
}

impl std::fmt::Debug for AuthorityRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityRewriter")
            .field("policy", &self.policy)
            .field("reencode", &self.reencode)
            .field("rewritten", &self.rewritten)
            .finish()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl AuthorityRewriter {
    /// A rewriter for one connection, starting before the connection preface.
    pub fn new(policy: AuthorityPolicy) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        // The peer (h2) never advertises more than the default 4096-byte table, and our own
        // re-encoding never indexes; allow a generous bound for size updates anyway.
        decoder.set_max_allowed_table_size(1 << 16);
        AuthorityRewriter {
            policy,
            preface_seen: 0,
            passthrough: false,
            pending: Vec::new(),
            block: None,
            decoder,
            reencode: false,
            rewritten: 0,
        }
    }

    /// How many header blocks had their `:authority` changed so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Consumes `input`, appending the rewritten bytes to `out`. Bytes of an incomplete frame are
    /// kept until the rest arrives. An error (malformed HPACK, oversized header block) means the
    /// connection cannot be rewritten consistently and must be closed.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        if self.passthrough {
            out.extend_from_slice(input);
            return Ok(());
        }
        let mut input = input;
        while self.preface_seen < PREFACE.len() && !input.is_empty() {
            let n = (PREFACE.len() - self.preface_seen).min(input.len());
            if input[..n] != PREFACE[self.preface_seen..self.preface_seen + n] {
                self.passthrough = true;
                out.extend_from_slice(input);
                return Ok(());
            }
            out.extend_from_slice(&input[..n]);
            self.preface_seen += n;
            input = &input[n..];
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        while self.pending.len() - at >= FRAME_HEADER_LEN {
            let h = &self.pending[at..at + FRAME_HEADER_LEN];
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let total = FRAME_HEADER_LEN + len;
            if self.pending.len() - at < total {
                break;
            }
            let frame = self.pending[at..at + total].to_vec();
            at += total;
            self.frame(&frame, out)?;
        }
        self.pending.drain(..at);
        Ok(())
    }

    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        let kind = frame[3];
        let flags = frame[4];
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER_LEN..];
        match (kind, self.block.is_some()) {
            (TYPE_HEADERS, false) => {
                let fragment = headers_fragment(flags, payload)?;
                self.block = Some(HeaderBlock {
                    stream_id,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    fragment: fragment.to_vec(),
                    raw: frame.to_vec(),
                });
            }
            (TYPE_CONTINUATION, true) => {
                if let Some(block) = self.block.as_mut() {
                    if block.stream_id != stream_id {
                        return Err(invalid(format!(
                            "HTTP/2 CONTINUATION for stream {stream_id} inside the header block of stream {}",
                            block.stream_id
                        )));
                    }
                    block.fragment.extend_from_slice(payload);
                    block.raw.extend_from_slice(frame);
                    if block.raw.len() > MAX_HEADER_BLOCK {
                        return Err(invalid(format!(
                            "HTTP/2 header block larger than {MAX_HEADER_BLOCK} bytes"
                        )));
                    }
                }
            }
            (_, true) => {
                return Err(invalid(format!(
                    "HTTP/2 frame of type {kind} interrupts a header block"
                )));
            }
            _ => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        if flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.finish_block(block, out)?;
        }
        Ok(())
    }

    fn finish_block(&mut self, block: HeaderBlock, out: &mut Vec<u8>) -> io::Result<()> {
        let headers = self.decoder.decode(&block.fragment).map_err(|e| {
            invalid(format!(
                "HTTP/2 header block of stream {} is not valid HPACK: {e:?}",
                block.stream_id
            ))
        })?;
        let mut changed = false;
        let headers: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| {
                if name.as_slice() != b":authority" {
                    return (name, value);
                }
                let new = match &self.policy {
                    AuthorityPolicy::FixInvalid
                        if Authority::try_from(value.as_slice()).is_err() =>
                    {
                        b"localhost".to_vec()
                    }
                    AuthorityPolicy::FixInvalid => value.clone(),
                    AuthorityPolicy::ReplaceWith(v) => v.as_bytes().to_vec(),
                };
                if new != value {
                    changed = true;
                }
                (name, new)
            })
            .collect();
        if changed {
            self.rewritten += 1;
            self.reencode = true;
        }
        if !self.reencode {
            out.extend_from_slice(&block.raw);
            return Ok(());
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() + 32);
        for (name, value) in &headers {
            encode_literal(name, value, &mut encoded);
        }
        let mut chunks = encoded.chunks(DEFAULT_MAX_FRAME).peekable();
        let mut first = true;
        // An empty header block is still one HEADERS frame.
        if chunks.peek().is_none() {
            write_frame(
                out,
                TYPE_HEADERS,
                FLAG_END_HEADERS | end_stream(block.end_stream),
                block.stream_id,
                &[],
            );
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let mut flags = if last { FLAG_END_HEADERS } else { 0 };
            let kind = if first {
                flags |= end_stream(block.end_stream);
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            write_frame(out, kind, flags, block.stream_id, chunk);
            first = false;
        }
        Ok(())
    }
}

fn end_stream(yes: bool) -> u8 {
    if yes { FLAG_END_STREAM } else { 0 }
}

/// The header-block fragment of a HEADERS frame, without padding and priority fields.
fn headers_fragment(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & FLAG_PADDED != 0 {
        let (&n, rest) = p
            .split_first()
            .ok_or_else(|| invalid("HTTP/2 HEADERS frame: padding length missing".into()))?;
        pad = usize::from(n);
        p = rest;
    }
    if flags & FLAG_PRIORITY != 0 {
        p = p
            .get(5..)
            .ok_or_else(|| invalid("HTTP/2 HEADERS frame: priority fields missing".into()))?;
    }
    let keep = p
        .len()
        .checked_sub(pad)
        .ok_or_else(|| invalid("HTTP/2 HEADERS frame: padding longer than the frame".into()))?;
    Ok(&p[..keep])
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// HPACK "literal header field without indexing — new name" with raw (non-Huffman) strings.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_int(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// HPACK integer with an N-bit prefix (RFC 7541 §5.1).
fn encode_int(mut v: usize, prefix_bits: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix_bits) - 1;
    if v < max {
        out.push(first_byte_flags | v as u8);
        return;
    }
    out.push(first_byte_flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_bytes(
        headers: &[(&str, &str)],
        stream: u32,
        enc: &mut loona_hpack::Encoder<'_>,
    ) -> Vec<u8> {
        let payload = enc.encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let mut out = Vec::new();
        write_frame(&mut out, TYPE_HEADERS, FLAG_END_HEADERS, stream, &payload);
        out
    }

    fn decode_all(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut dec = loona_hpack::Decoder::new();
        let mut at = PREFACE.len();
        let mut blocks = Vec::new();
        while at < bytes.len() {
            let len = usize::from(bytes[at]) << 16
                | usize::from(bytes[at + 1]) << 8
                | usize::from(bytes[at + 2]);
            if bytes[at + 3] == TYPE_HEADERS {
                blocks.push(dec.decode(&bytes[at + 9..at + 9 + len]).unwrap());
            }
            at += 9 + len;
        }
        blocks
    }

    fn authority(block: &[(Vec<u8>, Vec<u8>)]) -> String {
        block
            .iter()
            .find(|(n, _)| n == b":authority")
            .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
            .unwrap()
    }

    #[test]
    fn socket_path_becomes_localhost_and_later_blocks_stay_consistent() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        let path = "/var/lib/kubelet/device-plugins/x-erdma.sock";
        let hdrs = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1beta1.DevicePlugin/Allocate"),
            (":authority", path),
        ];
        input.extend(block_bytes(&hdrs, 1, &mut enc));
        // A SETTINGS frame in between passes unchanged.
        write_frame(&mut input, 0x4, 0, 0, &[]);
        // The second request reuses dynamic-table entries of the first.
        input.extend(block_bytes(&hdrs, 3, &mut enc));
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
        let mut out = Vec::new();
        // Byte by byte: partial frames must be buffered.
        for b in &input {
            rw.feed(std::slice::from_ref(b), &mut out).unwrap();
        }
        let blocks = decode_all(&out);
        assert_eq!(blocks.len(), 2);
        for b in &blocks {
            assert_eq!(authority(b), "localhost");
            assert!(
                b.iter()
                    .any(|(n, v)| n == b":path" && v == b"/v1beta1.DevicePlugin/Allocate")
            );
        }
        assert_eq!(rw.rewritten(), 2);
    }

    #[test]
    fn valid_authority_passes_byte_for_byte() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(block_bytes(
            &[(":method", "POST"), (":authority", "localhost")],
            1,
            &mut enc,
        ));
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
        let mut out = Vec::new();
        rw.feed(&input, &mut out).unwrap();
        assert_eq!(out, input);
        assert_eq!(rw.rewritten(), 0);
    }

    #[test]
    fn client_policy_sends_the_path() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(block_bytes(
            &[(":method", "POST"), (":authority", "localhost")],
            1,
            &mut enc,
        ));
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::ReplaceWith("/tmp/a.sock".into()));
        let mut out = Vec::new();
        rw.feed(&input, &mut out).unwrap();
        assert_eq!(authority(&decode_all(&out)[0]), "/tmp/a.sock");
    }

    #[test]
    fn large_blocks_are_split_into_continuations() {
        let big = "x".repeat(40_000);
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(block_bytes(
            &[(":authority", "/a.sock"), ("x-big", &big)],
            1,
            &mut enc,
        ));
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
        let mut out = Vec::new();
        rw.feed(&input, &mut out).unwrap();
        // Reassemble HEADERS + CONTINUATION and decode.
        let mut at = PREFACE.len();
        let mut frag = Vec::new();
        let mut frames = 0;
        while at < out.len() {
            let len = usize::from(out[at]) << 16
                | usize::from(out[at + 1]) << 8
                | usize::from(out[at + 2]);
            assert!(len <= DEFAULT_MAX_FRAME);
            frag.extend_from_slice(&out[at + 9..at + 9 + len]);
            frames += 1;
            at += 9 + len;
        }
        assert!(frames >= 3);
        let h = loona_hpack::Decoder::new().decode(&frag).unwrap();
        assert_eq!(authority(&h), "localhost");
        assert!(h.iter().any(|(n, v)| n == b"x-big" && v.len() == 40_000));
    }

    #[test]
    fn garbage_hpack_is_an_error_not_a_panic() {
        let mut input = PREFACE.to_vec();
        write_frame(
            &mut input,
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        );
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
        assert!(rw.feed(&input, &mut Vec::new()).is_err());
    }

    #[test]
    fn non_http2_bytes_pass_through() {
        let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
        let mut out = Vec::new();
        rw.feed(b"GET / HTTP/1.1\r\n\r\n", &mut out).unwrap();
        assert_eq!(out, b"GET / HTTP/1.1\r\n\r\n");
    }

    proptest::proptest! {
        #[test]
        fn rewriting_preserves_every_other_header_for_any_split(
            values in proptest::collection::vec(("[a-z][a-z0-9-]{0,12}", "[ -~]{0,40}"), 0..8),
            authority in "(/[a-z0-9._-]{1,20}){1,4}|localhost|[a-z]{1,10}\\.example",
            requests in 1usize..4,
            split in 1usize..64,
        ) {
            let mut enc = loona_hpack::Encoder::new();
            let mut input = PREFACE.to_vec();
            let mut expected = Vec::new();
            for r in 0..requests {
                let mut hdrs: Vec<(String, String)> = vec![
                    (":method".into(), "POST".into()),
                    (":path".into(), format!("/svc/M{r}")),
                    (":authority".into(), authority.clone()),
                ];
                hdrs.extend(values.iter().cloned());
                let refs: Vec<(&str, &str)> = hdrs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                input.extend(block_bytes(&refs, 1 + 2 * r as u32, &mut enc));
                expected.push(hdrs);
            }
            let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
            let mut out = Vec::new();
            for chunk in input.chunks(split) {
                rw.feed(chunk, &mut out).unwrap();
            }
            let blocks = decode_all(&out);
            proptest::prop_assert_eq!(blocks.len(), requests);
            let valid = Authority::try_from(authority.as_str()).is_ok();
            for (got, want) in blocks.iter().zip(&expected) {
                let got: Vec<(String, String)> = got
                    .iter()
                    .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
                    .collect();
                let want: Vec<(String, String)> = want
                    .iter()
                    .map(|(n, v)| {
                        let v = if n == ":authority" && !valid { "localhost".to_string() } else { v.clone() };
                        (n.clone(), v)
                    })
                    .collect();
                proptest::prop_assert_eq!(got, want);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut rw = AuthorityRewriter::new(AuthorityPolicy::FixInvalid);
            let mut input = PREFACE.to_vec();
            input.extend(bytes);
            let _ = rw.feed(&input, &mut Vec::new());
        }
    }
}
