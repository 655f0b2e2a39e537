//! The kubelet's `$(VAR)` expansion of env values, commands and args (its vendored
//! `third_party/forked/golang/expansion`): `$(NAME)` becomes the variable's value when it is
//! defined and stays as written when it is not, `$$` is a literal `$`, and any other `$` (with
//! what follows it) is kept.

/// Expands `$(NAME)` references in `input`; `lookup` answers a defined variable's value.
///
/// The scan works on characters; the kubelet's works on bytes and, for a `$` followed by a
/// multi-byte character, writes that byte as a character of its own (mangling the text). Here
/// the character is kept, which is what the kubelet means to do.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(next) = after.chars().next() else {
            // A `$` at the very end is text.
            out.push('$');
            rest = after;
            break;
        };
        match next {
            '$' => {
                out.push('$');
                rest = &after[1..];
            }
            '(' => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..1 + close];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 2..];
                }
                None => {
                    // An unterminated reference is text; scanning goes on after the `(`.
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            c => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("NODE_NAME".to_string(), "lab-node".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("A".to_string(), "x$(B)".to_string()),
        ])
    }

    fn run(s: &str) -> String {
        let e = env();
        expand(s, |k| e.get(k).cloned())
    }

    #[test]
    fn the_kubelets_cases() {
        // Cases written from the kubelet's expansion rules.
        assert_eq!(run("--node=$(NODE_NAME)"), "--node=lab-node");
        assert_eq!(run("$(NODE_NAME)$(NODE_NAME)"), "lab-nodelab-node");
        assert_eq!(
            run("$(MISSING)"),
            "$(MISSING)",
            "undefined: kept as written"
        );
        assert_eq!(run("a$(EMPTY)b"), "ab", "defined as empty: replaced");
        assert_eq!(
            run("$$(NODE_NAME)"),
            "$(NODE_NAME)",
            "$$ escapes the reference"
        );
        assert_eq!(run("$$$(NODE_NAME)"), "$lab-node");
        assert_eq!(run("cost: $5"), "cost: $5", "a $ not before ( or $ is text");
        assert_eq!(run("trailing $"), "trailing $");
        assert_eq!(run("$(NODE_NAME"), "$(NODE_NAME", "unterminated");
        assert_eq!(run("$(()"), "$(()", "the name runs to the first )");
        assert_eq!(run("$()"), "$()", "an empty name is undefined");
        assert_eq!(
            run("$(A)"),
            "x$(B)",
            "one pass: a value is not expanded again"
        );
        assert_eq!(run("$é"), "$é");
        assert_eq!(run("$(NODE_NAME)é$(NODE_NAME)"), "lab-nodeélab-node");
    }

    proptest! {
        #[test]
        fn never_panics(s in any::<String>()) {
            let _ = run(&s);
        }

        #[test]
        fn text_without_references_is_unchanged(s in "[^$]*") {
            prop_assert_eq!(run(&s), s);
        }

        #[test]
        fn nothing_defined_changes_only_escapes(s in any::<String>()) {
            // With no variable defined, only `$$` changes (to `$`).
            prop_assume!(!s.contains("$$"));
            prop_assert_eq!(expand(&s, |_| None), s);
        }

        #[test]
        fn a_defined_reference_is_replaced(prefix in "[a-z ]*", value in "[^$]*", suffix in "[a-z ]*") {
            let s = format!("{prefix}$(V){suffix}");
            let got = expand(&s, |k| (k == "V").then(|| value.clone()));
            prop_assert_eq!(got, format!("{prefix}{value}{suffix}"));
        }
    }
}
