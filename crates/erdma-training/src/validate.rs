//! Syntax checks for the values users type: Kubernetes quantities, qualified names, label values,
//! DNS-1123 labels, environment variable names and Go-style durations. Pure functions, no I/O.

/// A quantity a container may request: a [`quantity`] that is not negative (the API server
/// refuses negative requests and limits: "must be greater than or equal to 0").
pub fn resource_quantity(s: &str) -> Result<(), String> {
    quantity(s)?;
    if s.starts_with('-') && s.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        return Err(format!(
            "'{s}' is negative; a request or limit must be greater than or equal to 0"
        ));
    }
    Ok(())
}

/// Checks a Kubernetes `resource.Quantity` string (`<number><suffix>`): an optionally signed
/// decimal number followed by nothing, a binary suffix (`Ki Mi Gi Ti Pi Ei`), a decimal suffix
/// (`m k M G T P E`) or a decimal exponent (`e3`, `E-2`).
pub fn quantity(s: &str) -> Result<(), String> {
    let bytes = s.as_bytes();
    let mut i = 0;
    if i < bytes.len() && (bytes[i] == b'+' || bytes[i] == b'-') {
        i += 1;
    }
    let digits_start = i;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let mut digits = i - digits_start;
    if i < bytes.len() && bytes[i] == b'.' {
        i += 1;
        let frac_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        digits += i - frac_start;
    }
    if digits == 0 {
        return Err(format!(
            "'{s}' is not a valid quantity: it must start with a number, e.g. 1, 500m, 4Gi"
        ));
    }
    let suffix = &s[i..];
    let ok = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => {
            true
        }
        _ => decimal_exponent(suffix),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{s}' is not a valid quantity: unknown suffix '{suffix}' (use Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or an exponent like e3)"
        ))
    }
}

fn decimal_exponent(suffix: &str) -> bool {
    let Some(rest) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
}

/// Checks a DNS-1123 label: at most `max` characters of lower-case alphanumerics and `-`,
/// starting and ending with an alphanumeric.
pub fn dns1123_label(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!(
            "must be at most {max} characters (it has {})",
            s.len()
        ));
    }
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(|&c| alnum(c) || c == b'-') || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Err(
            "must consist of lower case alphanumeric characters or '-', and start and end with an alphanumeric character"
                .into(),
        );
    }
    Ok(())
}

/// Checks a DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err(format!(
            "must be at most 253 characters (it has {})",
            s.len()
        ));
    }
    for part in s.split('.') {
        dns1123_label(part, 63).map_err(|e| format!("'{part}' {e}"))?;
    }
    Ok(())
}

fn name_part(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("the name part must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!(
            "the name part must be at most 63 characters (it has {})",
            s.len()
        ));
    }
    let b = s.as_bytes();
    let ok_inner = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.';
    if !b.iter().all(|&c| ok_inner(c))
        || !b[0].is_ascii_alphanumeric()
        || !b[b.len() - 1].is_ascii_alphanumeric()
    {
        return Err(
            "the name part must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"
                .into(),
        );
    }
    Ok(())
}

/// Checks a Kubernetes qualified name (`[prefix/]name`), as used for resource names, label keys
/// and annotation keys.
pub fn qualified_name(s: &str) -> Result<(), String> {
    match s.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Err("the prefix part must not be empty".into());
            }
            dns1123_subdomain(prefix).map_err(|e| format!("the prefix part {e}"))?;
            name_part(name)
        }
        None => name_part(s),
    }
}

/// Checks a label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending
/// with an alphanumeric.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    name_part(s).map_err(|e| e.replacen("the name part", "a label value", 1))
}

/// Checks an environment variable name: letters, digits, `_`, `-`, `.`, not starting with a digit.
pub fn env_name(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.');
    if ok {
        Ok(())
    } else {
        Err("an environment variable name must consist of letters, digits, '_', '-' or '.', and must not start with a digit".into())
    }
}

/// Parses a Go-style duration (`90s`, `1h30m`, `2h`, `0`) into whole seconds.
pub fn duration_seconds(s: &str) -> Result<u64, String> {
    if s == "0" {
        return Ok(0);
    }
    let err = || format!("'{s}' is not a valid duration: use e.g. 90s, 30m, 1h30m");
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let n_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n_len == 0 {
            return Err(err());
        }
        let n: u64 = rest[..n_len].parse().map_err(|_| err())?;
        rest = &rest[n_len..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let factor = match &rest[..unit_len] {
            "h" => 3600,
            "m" => 60,
            "s" => 1,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(factor)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(err)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quantities() {
        for ok in [
            "1", "0", "500m", "4Gi", "1.5", ".5", "2e3", "1E", "1E-2", "+3", "100Mi", "64",
        ] {
            assert!(quantity(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "one", "1GB", "Gi", "1.2.3", "1e", "1 Gi", "--1", "1gi", ".",
        ] {
            let e = quantity(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn names() {
        assert!(qualified_name("aliyun/erdma").is_ok());
        assert!(qualified_name("nvidia.com/gpu").is_ok());
        assert!(qualified_name("cpu").is_ok());
        assert!(qualified_name("/x").is_err());
        assert!(qualified_name("a/").is_err());
        assert!(qualified_name("Bad_Prefix/x").is_err());
        assert!(qualified_name("a/b/c").is_err());
        assert!(qualified_name(&"x".repeat(64)).is_err());
        assert!(dns1123_label("pt-erdma", 49).is_ok());
        assert!(dns1123_label("PT", 49).is_err());
        assert!(dns1123_label("-a", 49).is_err());
        assert!(
            dns1123_label(&"a".repeat(50), 49)
                .unwrap_err()
                .contains("49")
        );
        assert!(label_value("").is_ok());
        assert!(label_value("v1.2_x").is_ok());
        assert!(label_value("a b").is_err());
        assert!(env_name("NCCL_DEBUG").is_ok());
        assert!(env_name("1X").is_err());
        assert!(env_name("A=B").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_seconds("0"), Ok(0));
        assert_eq!(duration_seconds("90s"), Ok(90));
        assert_eq!(duration_seconds("1h30m"), Ok(5400));
        assert_eq!(duration_seconds("2h"), Ok(7200));
        for bad in ["", "h", "10", "1d", "1h-", "99999999999999999999h"] {
            assert!(duration_seconds(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn negative_requests_are_refused(n in 1u64..1_000_000) {
            let neg = format!("-{}", n);
            prop_assert!(resource_quantity(&neg).is_err());
            prop_assert!(resource_quantity(&n.to_string()).is_ok());
        }

        #[test]
        fn quantity_never_panics(s in "\\PC{0,12}") {
            let _ = quantity(&s);
            let _ = qualified_name(&s);
            let _ = duration_seconds(&s);
        }

        #[test]
        fn integer_with_suffix_is_a_quantity(n in 0u64..1_000_000, suffix in prop::sample::select(vec!["", "Ki", "Mi", "Gi", "m", "k", "M", "G", "e2"])) {
            let q = format!("{}{}", n, suffix);
            prop_assert!(quantity(&q).is_ok(), "{}", q);
        }
    }
}
