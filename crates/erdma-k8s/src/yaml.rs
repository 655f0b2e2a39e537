//! YAML output (serde-saphyr): single documents and `---`-joined streams for `kubectl apply -f`.

use serde::Serialize;

/// `value` as one YAML document.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, crate::Error> {
    // Through serde_json first: k8s-openapi types serialise `Option::None` as absent and maps
    // in order, and the JSON value has no YAML-only features, so the YAML is plain and stable.
    let json = serde_json::to_value(value).map_err(|e| crate::Error::Serialize(e.to_string()))?;
    serde_saphyr::to_string(&json).map_err(|e| crate::Error::Serialize(e.to_string()))
}

/// A multi-document YAML stream (`---` before each document).
pub fn to_yaml_stream<T: Serialize>(values: &[T]) -> Result<String, crate::Error> {
    let mut out = String::new();
    for v in values {
        out.push_str("---\n");
        out.push_str(&to_yaml(v)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}
