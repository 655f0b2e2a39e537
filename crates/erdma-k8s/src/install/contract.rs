//! One values contract for the chart and `erdmactl install`: a values file is read exactly as
//! `helm install -f` reads it. The chart's own `values.yaml` is the defaults, the file is
//! coalesced over them as Helm coalesces (maps merge key by key, `null` removes a default, lists
//! and scalars replace), and the result is checked against the chart's `values.schema.json`
//! (both files compiled in from `deploy/helm`, so there is one copy of each). A key the schema
//! does not know is refused with the nearest known key named.
//!
//! The schema checker covers the JSON Schema keywords the chart's schema uses (`type`, `enum`,
//! `const`, `pattern`, `minLength`, `maxLength`, `minimum`, `maximum`, `properties`,
//! `additionalProperties`, `items`, `required`, `anyOf`); a test fails if the schema starts
//! using another. Helm's verdicts on the same files are recorded by `deploy/helm/ci/check.py`
//! (`deploy/helm/ci/contract.json`) and `tests/chart.rs` holds this module to them.

use super::Values;
use crate::Error;
use serde_json::{Map, Value};

/// The chart's `values.yaml`: the defaults.
pub const CHART_VALUES_YAML: &str = include_str!("../../../../deploy/helm/values.yaml");
/// The chart's `values.schema.json`.
pub const CHART_VALUES_SCHEMA: &str = include_str!("../../../../deploy/helm/values.schema.json");

/// The keywords [`check_schema`] understands (annotations included).
pub const SCHEMA_KEYWORDS: &[&str] = &[
    "$schema",
    "title",
    "description",
    "type",
    "enum",
    "const",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "anyOf",
];

/// Parses a values file (YAML or JSON) into a JSON value; an empty file is `{}`.
pub fn parse_values_file(text: &str) -> Result<Value, Error> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let v: Value = serde_saphyr::from_str(text)
        .map_err(|e| Error::Invalid(format!("not a valid values file: {e}")))?;
    match v {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::Object(_) => Ok(v),
        other => Err(Error::Invalid(format!(
            "a values file is a map of keys (as the chart's values.yaml), not {}",
            kind_of(&other)
        ))),
    }
}

/// The chart's defaults as JSON.
pub fn chart_defaults() -> Result<Value, Error> {
    parse_values_file(CHART_VALUES_YAML)
        .map_err(|e| Error::Invalid(format!("the chart's values.yaml: {e}")))
}

fn chart_schema() -> Result<Value, Error> {
    serde_json::from_str(CHART_VALUES_SCHEMA)
        .map_err(|e| Error::Invalid(format!("the chart's values.schema.json: {e}")))
}

/// Helm's coalescing of user values over defaults: maps merge recursively, a user `null`
/// removes the default, anything else replaces it. Returns the paths `null` removed, with the
/// default each had.
pub fn coalesce(base: &mut Value, user: &Value) -> Vec<(Vec<String>, Value)> {
    let mut removed = Vec::new();
    coalesce_at(base, user, &mut Vec::new(), &mut removed);
    removed
}

fn coalesce_at(
    base: &mut Value,
    user: &Value,
    path: &mut Vec<String>,
    removed: &mut Vec<(Vec<String>, Value)>,
) {
    match (base, user) {
        (Value::Object(b), Value::Object(u)) => {
            for (k, uv) in u {
                path.push(k.clone());
                if uv.is_null() {
                    if let Some(old) = b.remove(k) {
                        removed.push((path.clone(), old));
                    }
                } else {
                    match b.get_mut(k) {
                        Some(bv) if bv.is_object() && uv.is_object() => {
                            coalesce_at(bv, uv, path, removed)
                        }
                        _ => {
                            b.insert(k.clone(), uv.clone());
                        }
                    }
                }
                path.pop();
            }
        }
        (b, u) => *b = u.clone(),
    }
}

/// What a template reads where a default was removed: nothing, which renders as the empty value
/// of the default's kind (`with` skips it); an object is absent (`null`: `None` in [`Values`]).
fn empty_like(v: &Value) -> Value {
    match v {
        Value::Object(m) if m.is_empty() => Value::Object(Map::new()),
        Value::Object(_) => Value::Null,
        Value::Array(_) => Value::Array(Vec::new()),
        Value::String(_) => Value::String(String::new()),
        Value::Number(_) => Value::from(0),
        Value::Bool(_) => Value::Bool(false),
        Value::Null => Value::Null,
    }
}

/// The values a file gives, as Helm computes them: the chart's defaults with the file coalesced
/// over them, checked against the chart's schema. A default the file removed (`null`) is
/// present here as an empty value of its kind, which is what the templates see.
pub fn merged_values(file: &Value) -> Result<Value, Error> {
    let mut merged = chart_defaults()?;
    let removed = coalesce(&mut merged, file);
    let problems = check_schema(&chart_schema()?, &merged);
    if !problems.is_empty() {
        return Err(Error::Invalid(format!(
            "values don't meet the chart's schema:\n- {}",
            problems.join("\n- ")
        )));
    }
    for (path, old) in removed {
        let Some((last, parents)) = path.split_last() else {
            continue;
        };
        let pointer: String = parents
            .iter()
            .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
            .collect();
        if let Some(Value::Object(m)) = merged.pointer_mut(&pointer) {
            m.insert(last.clone(), empty_like(&old));
        }
    }
    Ok(merged)
}

impl Values {
    /// The values of a values file (YAML or JSON, the chart's `values.yaml` format), read as
    /// `helm install -f FILE` reads it; then [`Values::validate`] for what the templates check.
    /// The release name and namespace are not values (defaults here; flags set them).
    pub fn from_values_file(text: &str) -> Result<Values, Error> {
        let merged = merged_values(&parse_values_file(text)?)?;
        serde_json::from_value(merged)
            .map_err(|e| Error::Invalid(format!("values don't fit erdma's values: {e}")))
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if is_integer(n) => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => matches!(v, Value::Number(n) if is_integer(n)),
        _ => false,
    }
}

fn show(path: &str) -> &str {
    if path.is_empty() { "(top level)" } else { path }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Every way `v` breaks `schema`, each naming the key path, the value and the rule.
pub fn check_schema(schema: &Value, v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_at(schema, v, "", &mut out);
    out
}

fn check_at(s: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    let Some(s) = s.as_object() else {
        return;
    };
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.iter().any(|t| has_type(v, t)) {
            out.push(format!(
                "{}: {} is {}, want {}",
                show(path),
                v,
                kind_of(v),
                types.join(" or ")
            ));
            return;
        }
    }
    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(format!(
            "{}: {v} is not one of {}",
            show(path),
            list.join(", ")
        ));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        out.push(format!("{}: {v} is not {c}", show(path)));
    }
    if let Value::String(text) = v {
        let chars = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && chars < min
        {
            out.push(format!(
                "{}: {v} is shorter than {min} characters",
                show(path)
            ));
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && chars > max
        {
            out.push(format!(
                "{}: {v} is longer than {max} characters",
                show(path)
            ));
        }
        if let Some(p) = s.get("pattern").and_then(Value::as_str) {
            match regex::Regex::new(p) {
                Ok(re) if re.is_match(text) => {}
                Ok(_) => out.push(format!("{}: {v} does not match {p:?}", show(path))),
                Err(e) => out.push(format!("{}: the schema's pattern {p:?}: {e}", show(path))),
            }
        }
    }
    if let Value::Number(n) = v
        && let Some(x) = n.as_f64()
    {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && x < min
        {
            out.push(format!("{}: {v} is less than {min}", show(path)));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && x > max
        {
            out.push(format!("{}: {v} is more than {max}", show(path)));
        }
    }
    if let Some(Value::Array(options)) = s.get("anyOf")
        && !options.iter().any(|o| check_schema(o, v).is_empty())
    {
        let why: Vec<String> = options
            .iter()
            .flat_map(|o| check_schema(o, v))
            .map(|m| m.rsplit(": ").next().unwrap_or_default().to_string())
            .collect();
        out.push(format!(
            "{}: {v} matches none of the allowed forms ({})",
            show(path),
            why.join("; ")
        ));
    }
    if let (Some(Value::Array(items)), Some(item_schema)) = (Some(v), s.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check_at(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
    let Value::Object(map) = v else {
        return;
    };
    if let Some(Value::Array(required)) = s.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                out.push(format!("{}: {r} is required", show(path)));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    for (k, child) in map {
        let at = join(path, k);
        if let Some(ps) = props.and_then(|p| p.get(k)) {
            check_at(ps, child, &at, out);
            continue;
        }
        match s.get("additionalProperties") {
            Some(Value::Bool(false)) => {
                let known: Vec<&str> = props
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let hint = nearest(k, &known)
                    .map(|n| format!("; did you mean {}?", join(path, n)))
                    .unwrap_or_else(|| format!("; known keys here: {}", known.join(", ")));
                out.push(format!("{at}: unknown key{hint}"));
            }
            Some(extra @ Value::Object(_)) => check_at(extra, child, &at, out),
            _ => {}
        }
    }
}

/// The known key nearest to `key` (case-insensitive edit distance, transpositions counting one),
/// when it is close enough to be the one meant.
pub fn nearest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let k = key.to_lowercase();
    known
        .iter()
        .map(|c| (distance(&k, &c.to_lowercase()), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4))
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}

/// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_schema_uses_only_keywords_the_checker_knows() {
        fn walk(s: &Value, out: &mut Vec<String>) {
            let Some(m) = s.as_object() else { return };
            for (k, v) in m {
                if !SCHEMA_KEYWORDS.contains(&k.as_str()) {
                    out.push(k.clone());
                }
                match k.as_str() {
                    "properties" => v
                        .as_object()
                        .into_iter()
                        .flatten()
                        .for_each(|(_, c)| walk(c, out)),
                    "anyOf" => v
                        .as_array()
                        .into_iter()
                        .flatten()
                        .for_each(|c| walk(c, out)),
                    "items" | "additionalProperties" => walk(v, out),
                    _ => {}
                }
            }
        }
        let mut unknown = Vec::new();
        walk(&chart_schema().unwrap(), &mut unknown);
        assert_eq!(
            unknown,
            Vec::<String>::new(),
            "keywords the checker ignores"
        );
    }

    #[test]
    fn the_chart_defaults_meet_the_schema_and_are_the_rust_defaults() {
        let merged = merged_values(&json!({})).expect("defaults valid");
        let parsed: Values = serde_json::from_value(merged.clone()).expect("fits Values");
        assert_eq!(
            super::super::render(&parsed).unwrap(),
            super::super::render(&Values::default()).unwrap(),
            "values.yaml and Values::default render differently"
        );
        // Every default key is a field of Values: nothing in values.yaml is silently dropped.
        let back = serde_json::to_value(&parsed).unwrap();
        fn keys(v: &Value, path: &str, out: &mut Vec<String>) {
            if let Value::Object(m) = v {
                for (k, c) in m {
                    let p = join(path, k);
                    out.push(p.clone());
                    keys(c, &p, out);
                }
            }
        }
        let (mut want, mut have) = (Vec::new(), Vec::new());
        keys(&merged, "", &mut want);
        keys(&back, "", &mut have);
        let missing: Vec<&String> = want.iter().filter(|k| !have.contains(k)).collect();
        assert!(
            missing.is_empty(),
            "values.yaml keys Values drops: {missing:?}"
        );
    }

    #[test]
    fn a_typo_is_refused_naming_the_key_meant() {
        let e = Values::from_values_file("agent:\n  preferDrvier: ofed\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("agent.preferDrvier: unknown key; did you mean agent.preferDriver?"),
            "{msg}"
        );
        let e = Values::from_values_file("config:\n  enableWebhok: true\n").unwrap_err();
        assert!(
            e.to_string().contains("did you mean config.enableWebhook?"),
            "{e}"
        );
        let e = Values::from_values_file("zzz: 1\n").unwrap_err();
        assert!(
            e.to_string().contains(
                "zzz: unknown key; known keys here: affinity, agent, allowExistingInstallation"
            ),
            "{e}"
        );
    }

    #[test]
    fn helm_coalescing_merges_maps_and_null_removes_a_default() {
        let v = Values::from_values_file(
            "agent:\n  securityContext:\n    capabilities:\n      add: [NET_ADMIN]\ncontroller:\n  resources: null\n",
        )
        .unwrap();
        let sc = v.agent.security_context.clone().expect("kept");
        assert_eq!(
            sc.privileged,
            Some(false),
            "sibling default kept by the merge"
        );
        let caps = sc.capabilities.expect("caps");
        assert_eq!(
            caps.add,
            Some(vec!["NET_ADMIN".to_string()]),
            "lists replace"
        );
        assert_eq!(caps.drop, Some(vec!["NET_RAW".to_string()]));
        assert!(
            super::super::render(&v)
                .unwrap()
                .iter()
                .all(|o| o["kind"] != "Deployment"
                    || o["spec"]["template"]["spec"]["containers"][0]
                        .get("resources")
                        .is_none()),
            "controller.resources: null renders no resources"
        );
    }

    #[test]
    fn wrong_types_ranges_and_patterns_name_the_path() {
        for (file, words) in [
            (
                "agent:\n  jumboFrameMTU: 100\n",
                "agent.jumboFrameMTU: 100 matches none",
            ),
            (
                "webhookTimeoutSeconds: 60\n",
                "webhookTimeoutSeconds: 60 is more than 30",
            ),
            (
                "agent:\n  allocateAllDevices: yes please\n",
                "agent.allocateAllDevices: \"yes please\" is a string, want boolean",
            ),
            (
                "agent:\n  imagePullSecrets: [{}]\n",
                "agent.imagePullSecrets[0]: name is required",
            ),
            (
                "nameOverride: Foo\n",
                "nameOverride: \"Foo\" does not match",
            ),
            ("- a\n", "not a list"),
        ] {
            let e = Values::from_values_file(file).unwrap_err().to_string();
            assert!(e.contains(words), "{file:?}: {e}");
        }
    }

    #[test]
    fn nearest_prefers_close_keys_and_gives_up_on_far_ones() {
        let known = ["preferDriver", "priorityClassName", "nri", "nriMemlock"];
        assert_eq!(nearest("preferDrvier", &known), Some("preferDriver"));
        assert_eq!(nearest("PreferDriver", &known), Some("preferDriver"));
        assert_eq!(nearest("nriMemLok", &known), Some("nriMemlock"));
        assert_eq!(nearest("completelyDifferent", &known), None);
        assert_eq!(distance("ab", "ba"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
