//! Encoding helpers shared by the signer, the client and the emulator: the RFC 3986 percent-encoding
//! the Alibaba Cloud signatures use, UTC timestamps, nonces and hex.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Percent-encodes `s` as the Alibaba Cloud signatures require: `A-Z a-z 0-9 - _ . ~` stay as they
/// are, every other byte of the UTF-8 encoding becomes `%XY` (upper-case hex). So a space is `%20`,
/// `*` is `%2A` and `~` is not encoded (unlike `application/x-www-form-urlencoded`).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX_UPPER[(b >> 4) as usize] as char);
            out.push(HEX_UPPER[(b & 15) as usize] as char);
        }
    }
    out
}

/// Decodes `%XY` escapes (and `+` as a space, as HTML forms send it). `None` on a broken escape or
/// a result that is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hi = (hex[0] as char).to_digit(16)?;
                let lo = (hex[1] as char).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(HEX_LOWER[(b >> 4) as usize] as char);
        out.push(HEX_LOWER[(b & 15) as usize] as char);
    }
    out
}

/// `time` as ISO 8601 UTC with second precision, `yyyy-MM-ddTHH:mm:ssZ` (the form of the
/// `Timestamp` parameter, the `x-acs-date` header and STS expirations); times before the epoch
/// are the epoch.
pub fn iso8601(time: SystemTime) -> String {
    let ts = jiff::Timestamp::try_from(time.max(UNIX_EPOCH)).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Parses `yyyy-MM-ddTHH:mm:ssZ` (what STS and the metadata service return). `None` when `s` has
/// another shape or is before the epoch.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 20 || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let t = SystemTime::from(s.parse::<jiff::Timestamp>().ok()?);
    (t >= UNIX_EPOCH).then_some(t)
}

/// A fresh random nonce (32 hex characters) from the system CSPRNG; also used as `ClientToken`.
pub fn nonce() -> String {
    use ring::rand::SecureRandom;
    let mut buf = [0u8; 16];
    // The system RNG only fails when the OS has no entropy source at all; fall back to the clock
    // so a request still carries a unique value.
    if ring::rand::SystemRandom::new().fill(&mut buf).is_err() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos();
        buf = t.to_le_bytes();
    }
    hex(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_follows_rfc3986_unreserved() {
        assert_eq!(percent_encode("a b*c~d/e"), "a%20b%2Ac~d%2Fe");
        assert_eq!(
            percent_encode("2016-02-23T12:46:24Z"),
            "2016-02-23T12%3A46%3A24Z"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(
            percent_decode("a%20b%2Ac~d%2Fe").as_deref(),
            Some("a b*c~d/e")
        );
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn timestamps_round_trip() {
        // 2016-02-23T12:46:24Z is 1456231584 seconds after the epoch (date -u -d ... +%s).
        let t = UNIX_EPOCH + Duration::from_secs(1_456_231_584);
        assert_eq!(iso8601(t), "2016-02-23T12:46:24Z");
        assert_eq!(parse_iso8601("2016-02-23T12:46:24Z"), Some(t));
        assert_eq!(iso8601(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(parse_iso8601("2016-02-23 12:46:24"), None);
        assert_eq!(parse_iso8601("2016-13-23T12:46:24Z"), None);
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 32);
    }
}
