//! Whole-number Kubernetes quantities (`4`, `8k`, `2Mi`), as DRA capacities of erdma's driver use
//! them: the driver that publishes them and the lab's allocator that consumes them read them with
//! this one parser. Fractions and milli-units are refused: every capacity counts whole things.

/// Parses a whole, non-negative quantity. The error says what was expected.
pub fn parse(q: &str) -> Result<u64, String> {
    let t = q.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!("quantity {q:?} is not a whole number"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("quantity {q:?} is out of range"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "quantity {q:?} is not a whole number with an optional k/M/G/T/Ki/Mi/Gi/Ti suffix"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("quantity {q:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn whole_quantities() {
        assert_eq!(parse("4"), Ok(4));
        assert_eq!(parse("8k"), Ok(8000));
        assert_eq!(parse("2Mi"), Ok(2_097_152));
        assert_eq!(parse("0"), Ok(0));
        for bad in ["", "1.5", "500m", "-1", "k", "1e3", "99999999999999999999"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
