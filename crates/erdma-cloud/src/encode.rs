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
/// `Timestamp` parameter, the `x-acs-date` header and STS expirations).
pub fn iso8601(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Parses `yyyy-MM-ddTHH:mm:ssZ` (what STS and the metadata service return). `None` when `s` has
/// another shape.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<i64>().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

// Howard Hinnant's civil-calendar algorithms (public domain description).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
