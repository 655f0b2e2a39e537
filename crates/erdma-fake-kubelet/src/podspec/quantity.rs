//! Kubernetes resource quantities (`50m`, `64Mi`, `1.5`, `2e3`), exactly, as the kubelet reads
//! them: a signed decimal number with a binary-SI (`Ki` … `Ei`), decimal-SI (`n` `u` `m` `k` `M`
//! `G` `T` `P` `E`) or exponent (`e3`, `E-2`) suffix. `Value()` and `MilliValue()` round up.

/// A parsed quantity: `num / den` exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    num: i128,
    den: i128,
}

/// Largest power of ten kept exact (a quantity beyond it is refused).
const MAX_EXP10: u32 = 30;

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

impl Quantity {
    /// Parses `s`; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Quantity, String> {
        let t = s.trim();
        if t.is_empty() {
            return Err("an empty quantity".into());
        }
        let (neg, body) = match t.as_bytes()[0] {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_end);
        let (int, frac) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(format!("{s:?} does not start with a number"));
        }
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(format!("{s:?} has more digits than the lab kubelet keeps"));
        }
        let mut num: i128 = if digits.is_empty() {
            0
        } else {
            digits
                .parse()
                .map_err(|_| format!("{s:?} does not start with a number"))?
        };
        let frac_len = u32::try_from(frac.len()).map_err(|_| format!("{s:?} is too long"))?;
        let (exp10, exp2): (i32, u32) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            other => match other.strip_prefix(['e', 'E']) {
                Some(e) if !e.is_empty() => {
                    let v: i32 = e
                        .parse()
                        .map_err(|_| format!("{s:?} has an invalid exponent {other:?}"))?;
                    if v.unsigned_abs() > MAX_EXP10 {
                        return Err(format!("{s:?}: exponent {v} is out of range"));
                    }
                    (v, 0)
                }
                _ => {
                    return Err(format!(
                        "{s:?} has an unknown suffix {other:?} (use Ki, Mi, Gi, ..., m, k, M, G, ... or eN)"
                    ));
                }
            },
        };
        let too_big = || format!("{s:?} is too large");
        num = num.checked_mul(1i128 << exp2).ok_or_else(too_big)?;
        let scale = exp10 - i32::try_from(frac_len).map_err(|_| too_big())?;
        let mut den: i128 = 1;
        if scale >= 0 {
            let p = pow10(scale.unsigned_abs()).ok_or_else(too_big)?;
            num = num.checked_mul(p).ok_or_else(too_big)?;
        } else {
            den = pow10(scale.unsigned_abs()).ok_or_else(too_big)?;
        }
        if neg {
            num = -num;
        }
        // Keep headroom for the milli scaling below.
        num.checked_mul(1000).ok_or_else(too_big)?;
        Ok(Quantity { num, den })
    }

    /// Whether the quantity is zero.
    pub fn is_zero(&self) -> bool {
        self.num == 0
    }

    /// Whether the quantity is negative.
    pub fn is_negative(&self) -> bool {
        self.num < 0
    }

    /// The value in units, rounded up (the kubelet's `Value()`).
    pub fn value(&self) -> i128 {
        div_ceil(self.num, self.den)
    }

    /// The value in thousandths, rounded up (the kubelet's `MilliValue()`).
    pub fn milli_value(&self) -> i128 {
        div_ceil(self.num * 1000, self.den)
    }

    /// Whether the quantity is a whole number.
    pub fn is_integer(&self) -> bool {
        self.num % self.den == 0
    }
}

fn div_ceil(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a > 0) == (b > 0)) {
        q + 1
    } else {
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn values_as_the_kubelet_reads_them() {
        assert_eq!(q("50m").milli_value(), 50);
        assert_eq!(q("50m").value(), 1, "Value() rounds up");
        assert_eq!(q("2").milli_value(), 2000);
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("0.5").value(), 1);
        assert_eq!(q("64Mi").value(), 67_108_864);
        assert_eq!(q("1Gi").value(), 1_073_741_824);
        assert_eq!(q("128M").value(), 128_000_000);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("1E3").value(), 1000);
        assert_eq!(q("1E").value(), 1_000_000_000_000_000_000, "E alone is exa");
        assert_eq!(q("1.5Gi").value(), 1_610_612_736);
        assert_eq!(q("100n").milli_value(), 1, "MilliValue() rounds up");
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("5.").milli_value(), 5000);
        assert_eq!(q("+3").value(), 3);
        assert!(q("-1").is_negative());
        assert!(q("0").is_zero() && q("0Mi").is_zero());
        assert!(q("2").is_integer() && !q("1500m").is_integer() && q("2000m").is_integer());
        for bad in [
            "", "m", "1x", "1.2.3", "Mi", "1ee", "1e", "1e99", "--1", "1 Mi",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in any::<String>()) {
            if let Ok(v) = Quantity::parse(&s) {
                let _ = (v.value(), v.milli_value());
            }
        }

        #[test]
        fn whole_numbers_with_suffixes(n in 0i64..1_000_000_000) {
            prop_assert_eq!(q(&n.to_string()).milli_value(), i128::from(n) * 1000);
            prop_assert_eq!(q(&format!("{n}m")).milli_value(), i128::from(n));
            prop_assert_eq!(q(&format!("{n}Ki")).value(), i128::from(n) * 1024);
            prop_assert_eq!(q(&format!("{n}Mi")).value(), i128::from(n) << 20);
            prop_assert_eq!(q(&format!("{n}k")).value(), i128::from(n) * 1000);
        }
    }
}
