//! JSON Patch (RFC 6902) over JSON Pointers (RFC 6901), as the API server applies the `JSONPatch`
//! a mutating admission webhook answers (`admit`): the operations `add`, `remove`, `replace`,
//! `move`, `copy` and `test`, applied in order to the object, all or nothing.
//!
//! Array indices are as the RFC writes them: decimal without leading zeros, `-` (after the last
//! element) only as the target of `add`, `move` and `copy`. (The API server's Go library also
//! takes negative indices counted from the end; a webhook that relies on them is refused here,
//! naming the operation.)

use serde_json::Value;
use std::fmt;

/// Why a patch was not applied: the operation (by its index in the patch), its path, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchError {
    /// Index of the failing operation in the patch (0 for a patch that is not a list).
    pub index: usize,
    /// The operation's `op` (empty when it had none).
    pub op: String,
    /// The operation's `path` (empty when it had none).
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "JSON patch operation {} ({} {:?}): {}",
            self.index, self.op, self.path, self.reason
        )
    }
}

impl std::error::Error for PatchError {}

/// One operation of a patch.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// `add`: `value` at `path` (inserted into an array, set in an object, or the whole
    /// document at `""`).
    Add {
        /// Target.
        path: String,
        /// Value.
        value: Value,
    },
    /// `remove` the value at `path`.
    Remove {
        /// Target.
        path: String,
    },
    /// `replace` the existing value at `path`.
    Replace {
        /// Target.
        path: String,
        /// Value.
        value: Value,
    },
    /// `move` the value at `from` to `path`.
    Move {
        /// Source.
        from: String,
        /// Target.
        path: String,
    },
    /// `copy` the value at `from` to `path`.
    Copy {
        /// Source.
        from: String,
        /// Target.
        path: String,
    },
    /// `test` that the value at `path` equals `value`.
    Test {
        /// Target.
        path: String,
        /// Expected value.
        value: Value,
    },
}

impl Operation {
    /// The operation's name.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Add { .. } => "add",
            Operation::Remove { .. } => "remove",
            Operation::Replace { .. } => "replace",
            Operation::Move { .. } => "move",
            Operation::Copy { .. } => "copy",
            Operation::Test { .. } => "test",
        }
    }

    /// The operation's `path`.
    pub fn path(&self) -> &str {
        match self {
            Operation::Add { path, .. }
            | Operation::Remove { path }
            | Operation::Replace { path, .. }
            | Operation::Move { path, .. }
            | Operation::Copy { path, .. }
            | Operation::Test { path, .. } => path,
        }
    }
}

/// Reads a patch: a JSON array of operation objects.
pub fn parse(patch: &Value) -> Result<Vec<Operation>, PatchError> {
    let Value::Array(items) = patch else {
        return Err(PatchError {
            index: 0,
            op: String::new(),
            path: String::new(),
            reason: "a JSON patch is a list of operations".into(),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_one(index, item))
        .collect()
}

fn parse_one(index: usize, item: &Value) -> Result<Operation, PatchError> {
    let field = |name: &str| item.get(name).and_then(Value::as_str).map(str::to_string);
    let op = field("op").unwrap_or_default();
    let path = field("path");
    let fail = |reason: String| PatchError {
        index,
        op: op.clone(),
        path: path.clone().unwrap_or_default(),
        reason,
    };
    if !item.is_object() {
        return Err(fail("an operation is a JSON object".into()));
    }
    let path = path
        .clone()
        .ok_or_else(|| fail("has no \"path\" string".into()))?;
    let value = || {
        item.get("value")
            .cloned()
            .ok_or_else(|| fail(format!("a {op:?} operation needs a \"value\"")))
    };
    let from =
        || field("from").ok_or_else(|| fail(format!("a {op:?} operation needs a \"from\" string")));
    Ok(match op.as_str() {
        "add" => Operation::Add {
            path,
            value: value()?,
        },
        "remove" => Operation::Remove { path },
        "replace" => Operation::Replace {
            path,
            value: value()?,
        },
        "move" => Operation::Move {
            from: from()?,
            path,
        },
        "copy" => Operation::Copy {
            from: from()?,
            path,
        },
        "test" => Operation::Test {
            path,
            value: value()?,
        },
        "" => return Err(fail("has no \"op\" string".into())),
        other => {
            return Err(fail(format!(
                "unknown op {other:?} (add, remove, replace, move, copy, test)"
            )));
        }
    })
}

/// The reference tokens of a JSON Pointer (`""` is the whole document; `~1` is `/`, `~0` is `~`).
pub fn tokens(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON pointer (it must start with '/')"
        ));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => return Err(format!("{pointer:?} has a '~' not followed by 0 or 1")),
                }
            }
            Ok(out)
        })
        .collect()
}

/// A reference token written for a pointer (`/` as `~1`, `~` as `~0`).
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// An array index token: `Some(n)` for a decimal without leading zeros, `None` for `-`.
fn index_of(token: &str, len: usize, allow_end: bool) -> Result<Option<usize>, String> {
    if token == "-" {
        return if allow_end {
            Ok(None)
        } else {
            Err("\"-\" names no element here".into())
        };
    }
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return Err(format!(
            "{token:?} is not an array index (a decimal without leading zeros, or \"-\")"
        ));
    }
    let i: usize = token
        .parse()
        .map_err(|_| format!("array index {token} is too large"))?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if (allow_end && i > len) || (!allow_end && (len == 0 || i > limit)) {
        return Err(format!(
            "array index {i} is out of range (the array has {len} elements)"
        ));
    }
    Ok(Some(i))
}

/// The value at `pointer` in `doc`.
pub fn get<'a>(doc: &'a Value, pointer: &str) -> Result<&'a Value, String> {
    let mut at = doc;
    let mut walked = String::new();
    for t in tokens(pointer)? {
        at = step(at, &t, &walked)?;
        walked.push('/');
        walked.push_str(&escape(&t));
    }
    Ok(at)
}

fn step<'a>(at: &'a Value, token: &str, walked: &str) -> Result<&'a Value, String> {
    match at {
        Value::Object(o) => o
            .get(token)
            .ok_or_else(|| format!("{walked:?} has no member {token:?}")),
        Value::Array(a) => {
            let i = index_of(token, a.len(), false)?.unwrap_or(0);
            Ok(&a[i])
        }
        _ => Err(format!(
            "{walked:?} is a {}, not an object or array",
            kind(at)
        )),
    }
}

fn step_mut<'a>(at: &'a mut Value, token: &str, walked: &str) -> Result<&'a mut Value, String> {
    let what = kind(at);
    match at {
        Value::Object(o) => o
            .get_mut(token)
            .ok_or_else(|| format!("{walked:?} has no member {token:?}")),
        Value::Array(a) => {
            let i = index_of(token, a.len(), false)?.unwrap_or(0);
            Ok(&mut a[i])
        }
        _ => Err(format!("{walked:?} is a {what}, not an object or array")),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The container of the last token of `pointer`, and that token (`None` for the root).
fn parent_mut<'a>(
    doc: &'a mut Value,
    pointer: &str,
) -> Result<Option<(&'a mut Value, String)>, String> {
    let mut toks = tokens(pointer)?;
    let Some(last) = toks.pop() else {
        return Ok(None);
    };
    let mut at = doc;
    let mut walked = String::new();
    for t in toks {
        at = step_mut(at, &t, &walked)?;
        walked.push('/');
        walked.push_str(&escape(&t));
    }
    Ok(Some((at, last)))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let Some((parent, last)) = parent_mut(doc, path)? else {
        *doc = value;
        return Ok(());
    };
    let what = kind(parent);
    match parent {
        Value::Object(o) => {
            o.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            match index_of(&last, a.len(), true)? {
                Some(i) => a.insert(i, value),
                None => a.push(value),
            }
            Ok(())
        }
        _ => Err(format!(
            "the parent of {path:?} is a {what}, not an object or array"
        )),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let Some((parent, last)) = parent_mut(doc, path)? else {
        return Err("the whole document cannot be removed".into());
    };
    let what = kind(parent);
    match parent {
        Value::Object(o) => o
            .remove(&last)
            .ok_or_else(|| format!("{path:?} does not exist")),
        Value::Array(a) => {
            let i = index_of(&last, a.len(), false)?.unwrap_or(0);
            Ok(a.remove(i))
        }
        _ => Err(format!(
            "the parent of {path:?} is a {what}, not an object or array"
        )),
    }
}

fn apply_one(doc: &mut Value, op: &Operation) -> Result<(), String> {
    match op {
        Operation::Add { path, value } => add(doc, path, value.clone()),
        Operation::Remove { path } => remove(doc, path).map(drop),
        Operation::Replace { path, value } => {
            // The target must exist.
            get(doc, path)?;
            match parent_mut(doc, path)? {
                None => *doc = value.clone(),
                Some((parent, last)) => {
                    let slot = step_mut(parent, &last, "")?;
                    *slot = value.clone();
                }
            }
            Ok(())
        }
        Operation::Move { from, path } => {
            if from == path {
                return get(doc, from).map(drop);
            }
            let (f, p) = (tokens(from)?, tokens(path)?);
            if p.len() > f.len() && p[..f.len()] == f[..] {
                return Err(format!(
                    "{from:?} cannot be moved into its own child {path:?}"
                ));
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        Operation::Copy { from, path } => {
            let v = get(doc, from)?.clone();
            add(doc, path, v)
        }
        Operation::Test { path, value } => {
            let have = get(doc, path)?;
            if have == value {
                Ok(())
            } else {
                Err(format!("the value is {have}, not {value}"))
            }
        }
    }
}

/// Applies `ops` to `doc` in order; on an error `doc` is left as it was.
pub fn apply(doc: &mut Value, ops: &[Operation]) -> Result<(), PatchError> {
    let mut work = doc.clone();
    for (index, op) in ops.iter().enumerate() {
        apply_one(&mut work, op).map_err(|reason| PatchError {
            index,
            op: op.name().into(),
            path: op.path().into(),
            reason,
        })?;
    }
    *doc = work;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn run(doc: Value, patch: Value) -> Result<Value, String> {
        let ops = parse(&patch).map_err(|e| e.to_string())?;
        let mut d = doc;
        apply(&mut d, &ops).map_err(|e| e.to_string())?;
        Ok(d)
    }

    #[test]
    fn each_operation_as_the_rfc_defines_it() {
        // add: a member, into an array (before the index), at the end, and the whole document.
        assert_eq!(
            run(
                json!({"a": 1}),
                json!([{"op": "add", "path": "/b", "value": [2]}])
            ),
            Ok(json!({"a": 1, "b": [2]}))
        );
        assert_eq!(
            run(
                json!({"l": ["x", "z"]}),
                json!([{"op": "add", "path": "/l/1", "value": "y"}])
            ),
            Ok(json!({"l": ["x", "y", "z"]}))
        );
        assert_eq!(
            run(
                json!({"l": ["x"]}),
                json!([{"op": "add", "path": "/l/-", "value": "y"}, {"op": "add", "path": "/l/2", "value": "z"}])
            ),
            Ok(json!({"l": ["x", "y", "z"]})),
            "an index equal to the length appends"
        );
        assert_eq!(
            run(
                json!({"a": 1}),
                json!([{"op": "add", "path": "", "value": [1]}])
            ),
            Ok(json!([1]))
        );
        assert_eq!(
            run(
                json!({"a": 1}),
                json!([{"op": "add", "path": "/a", "value": 2}])
            ),
            Ok(json!({"a": 2})),
            "add replaces an existing member"
        );
        // remove, replace.
        assert_eq!(
            run(
                json!({"a": 1, "l": [1, 2, 3]}),
                json!([{"op": "remove", "path": "/a"}, {"op": "remove", "path": "/l/0"}])
            ),
            Ok(json!({"l": [2, 3]}))
        );
        assert_eq!(
            run(
                json!({"a": {"b": 1}}),
                json!([{"op": "replace", "path": "/a/b", "value": null}])
            ),
            Ok(json!({"a": {"b": null}}))
        );
        // move, copy.
        assert_eq!(
            run(
                json!({"a": {"x": 1}, "b": {}}),
                json!([{"op": "move", "from": "/a/x", "path": "/b/y"}])
            ),
            Ok(json!({"a": {}, "b": {"y": 1}}))
        );
        assert_eq!(
            run(
                json!({"l": [1, 2, 3]}),
                json!([{"op": "move", "from": "/l/0", "path": "/l/-"}])
            ),
            Ok(json!({"l": [2, 3, 1]}))
        );
        assert_eq!(
            run(
                json!({"a": [1]}),
                json!([{"op": "copy", "from": "/a", "path": "/b"}])
            ),
            Ok(json!({"a": [1], "b": [1]}))
        );
        // test.
        assert_eq!(
            run(
                json!({"a": "x"}),
                json!([{"op": "test", "path": "/a", "value": "x"}])
            ),
            Ok(json!({"a": "x"}))
        );
        // Escaped tokens: "a/b" and "m~n".
        assert_eq!(
            run(
                json!({"a/b": 1, "m~n": 2}),
                json!([{"op": "replace", "path": "/a~1b", "value": 3}, {"op": "remove", "path": "/m~0n"}])
            ),
            Ok(json!({"a/b": 3}))
        );
        // The webhook's injection: an init container list made, or extended.
        let c = json!({"name": "smcr-init"});
        assert_eq!(
            run(
                json!({"spec": {"containers": []}}),
                json!([{"op": "add", "path": "/spec/initContainers", "value": [c]}])
            ),
            Ok(json!({"spec": {"containers": [], "initContainers": [{"name": "smcr-init"}]}}))
        );
    }

    #[test]
    fn failures_name_the_operation_and_change_nothing() {
        let doc = json!({"a": {"b": [1]}});
        let cases: &[(Value, &str)] = &[
            (
                json!([{"op": "add", "path": "/x/y", "value": 1}]),
                "operation 0 (add \"/x/y\"): \"\" has no member \"x\"",
            ),
            (
                json!([{"op": "remove", "path": "/a/c"}]),
                "\"/a/c\" does not exist",
            ),
            (
                json!([{"op": "replace", "path": "/a/b/1", "value": 2}]),
                "array index 1 is out of range (the array has 1 elements)",
            ),
            (
                json!([{"op": "add", "path": "/a/b/01", "value": 2}]),
                "not an array index",
            ),
            (
                json!([{"op": "add", "path": "/a/b/-1", "value": 2}]),
                "not an array index",
            ),
            (
                json!([{"op": "remove", "path": "/a/b/-"}]),
                "\"-\" names no element here",
            ),
            (
                json!([{"op": "test", "path": "/a/b/0", "value": 2}]),
                "the value is 1, not 2",
            ),
            (
                json!([{"op": "move", "from": "/a", "path": "/a/b/c"}]),
                "cannot be moved into its own child",
            ),
            (
                json!([{"op": "add", "path": "a", "value": 1}]),
                "must start with '/'",
            ),
            (
                json!([{"op": "add", "path": "/a~2", "value": 1}]),
                "'~' not followed by 0 or 1",
            ),
            (json!([{"op": "remove", "path": ""}]), "cannot be removed"),
            (json!([{"op": "add", "path": "/q"}]), "needs a \"value\""),
            (json!([{"op": "copy", "path": "/q"}]), "needs a \"from\""),
            (
                json!([{"op": "merge", "path": "/q"}]),
                "unknown op \"merge\"",
            ),
            (json!([{"path": "/q"}]), "has no \"op\""),
            (json!([7]), "is a JSON object"),
            (json!({"op": "add"}), "a list of operations"),
            (
                json!([{"op": "add", "path": "/a/b/0/x", "value": 1}]),
                "is a number, not an object or array",
            ),
        ];
        for (patch, want) in cases {
            let got = run(doc.clone(), patch.clone()).expect_err("must fail");
            assert!(got.contains(want), "{patch}: {got}");
        }
        // A later failure leaves the earlier operations unapplied.
        let ops = parse(&json!([
            {"op": "add", "path": "/z", "value": 1},
            {"op": "remove", "path": "/missing"}
        ]))
        .unwrap();
        let mut d = doc.clone();
        let e = apply(&mut d, &ops).unwrap_err();
        assert_eq!(
            (e.index, e.op.as_str(), e.path.as_str()),
            (1, "remove", "/missing")
        );
        assert_eq!(d, doc);
    }

    /// JSON values of a few levels.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z~/]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z~/]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn an_added_member_reads_back_and_removing_it_restores(
            doc in prop::collection::btree_map("[a-z]{1,4}", value(), 0..4),
            key in "[a-z~/]{1,6}",
            v in value(),
        ) {
            let doc = Value::Object(doc.into_iter().collect());
            prop_assume!(doc.get(&key).is_none());
            let path = format!("/{}", escape(&key));
            let mut d = doc.clone();
            apply(&mut d, &[Operation::Add { path: path.clone(), value: v.clone() }]).unwrap();
            prop_assert_eq!(get(&d, &path).unwrap(), &v);
            prop_assert_eq!(d.get(&key), Some(&v), "the key is the unescaped token");
            apply(&mut d, &[Operation::Test { path: path.clone(), value: v.clone() }]).unwrap();
            apply(&mut d, &[Operation::Remove { path }]).unwrap();
            prop_assert_eq!(d, doc);
        }

        #[test]
        fn inserting_into_an_array_shifts_the_rest(
            items in prop::collection::vec(value(), 0..6),
            at in 0usize..7,
            v in value(),
        ) {
            prop_assume!(at <= items.len());
            let mut d = json!({"l": items.clone()});
            apply(&mut d, &[Operation::Add { path: format!("/l/{at}"), value: v.clone() }]).unwrap();
            let mut want = items.clone();
            want.insert(at, v);
            prop_assert_eq!(&d["l"], &Value::Array(want));
            // And appending with "-" puts it last.
            let mut e = json!({"l": items.clone()});
            apply(&mut e, &[Operation::Add { path: "/l/-".into(), value: json!("end") }]).unwrap();
            prop_assert_eq!(e["l"].as_array().unwrap().last(), Some(&json!("end")));
            prop_assert_eq!(e["l"].as_array().unwrap().len(), items.len() + 1);
        }

        #[test]
        fn escaping_round_trips(key in "[a-z~/0-9]{0,8}") {
            let p = format!("/{}", escape(&key));
            prop_assert_eq!(tokens(&p).unwrap(), vec![key]);
        }

        #[test]
        fn patches_of_random_operations_never_panic_and_fail_atomically(
            doc in value(),
            ops in prop::collection::vec(
                (
                    prop::sample::select(vec!["add", "remove", "replace", "move", "copy", "test"]),
                    "(/[a-z0-9~-]{0,3}){0,3}",
                    "(/[a-z0-9~-]{0,3}){0,3}",
                    value(),
                ),
                0..5,
            ),
        ) {
            let patch = Value::Array(
                ops.into_iter()
                    .map(|(op, path, from, v)| json!({"op": op, "path": path, "from": from, "value": v}))
                    .collect(),
            );
            let ops = parse(&patch).unwrap();
            let mut d = doc.clone();
            if apply(&mut d, &ops).is_err() {
                prop_assert_eq!(d, doc);
            }
        }

        #[test]
        fn arbitrary_patches_never_panic_and_fail_atomically(doc in value(), patch in value()) {
            let mut d = doc.clone();
            if let Ok(ops) = parse(&patch) && apply(&mut d, &ops).is_err() {
                prop_assert_eq!(d, doc);
            }
        }
    }
}
