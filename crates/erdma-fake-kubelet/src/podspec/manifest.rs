//! Reading a pod from a manifest file: a `Pod`, or the pod template (`spec.template`) of a
//! `DaemonSet`, `Deployment`, `StatefulSet` or `Job`, as JSON or YAML (one document or several,
//! as `helm template` prints them; a `List` is opened).

use crate::error::{FakeKubeletError, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::path::Path;

/// The kinds whose pod `pod run --manifest` runs, with their `apiVersion`.
pub const KINDS: &[(&str, &str)] = &[
    ("Pod", "v1"),
    ("DaemonSet", "apps/v1"),
    ("Deployment", "apps/v1"),
    ("StatefulSet", "apps/v1"),
    ("Job", "batch/v1"),
];

/// A pod read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestPod {
    /// Where it came from: `DaemonSet kube-system/erdma-agent in FILE`.
    pub source: String,
    /// The object's kind.
    pub kind: String,
    /// The pod: name and namespace of the object (`default` when it has none), labels and
    /// annotations of its template, the template's spec; a `Pod` keeps its UID.
    pub pod: Pod,
}

fn refused(msg: String) -> FakeKubeletError {
    FakeKubeletError::Refused(msg)
}

/// `kind namespace/name` of a document, for messages.
fn describe(doc: &Value) -> String {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("(no kind)");
    let meta = doc.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The documents of `text`: JSON when it starts with `{` or `[`, else YAML (several documents
/// separated by `---`). `List` objects, top-level arrays and rendered chart files (an object
/// without a kind holding `objects`, as `deploy/helm/ci/rendered/*.json`) are opened.
pub(crate) fn documents(text: &str, origin: &str) -> Result<Vec<Value>> {
    let trimmed = text.trim_start();
    let docs: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            refused(format!(
                "manifest {origin} is not valid JSON: {e}. Fix: pass a Kubernetes object as JSON or YAML"
            ))
        })?;
        vec![v]
    } else {
        // As kubectl reads YAML (YAML 1.1): `0440` is octal, so `defaultMode: 0440` is 288.
        let mut options = serde_saphyr::Options::default();
        options.legacy_octal_numbers = true;
        serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| {
            refused(format!(
                "manifest {origin} is not valid YAML: {e}. Fix: pass a Kubernetes object as JSON or YAML"
            ))
        })?
    };
    let mut out = Vec::new();
    let mut pending = docs;
    while let Some(d) = pending.pop() {
        match d {
            Value::Array(items) => pending.extend(items.into_iter().rev()),
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                if let Some(Value::Array(items)) = o.get("items") {
                    pending.extend(items.iter().rev().cloned());
                }
            }
            Value::Object(ref o) if !o.contains_key("kind") && o.contains_key("objects") => {
                if let Some(Value::Array(items)) = o.get("objects") {
                    pending.extend(items.iter().rev().cloned());
                }
            }
            Value::Null => {}
            other => out.push(other),
        }
    }
    out.reverse();
    Ok(out)
}

/// Reads `path` and picks its pod ([`parse`]).
pub fn load(path: &Path, select: Option<&str>) -> Result<ManifestPod> {
    let text = std::fs::read_to_string(path).map_err(|source| FakeKubeletError::Io {
        what: "read the manifest",
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string(), select)
}

/// The pod of the one workload object in `text` (`origin` names the file in messages).
/// `select` (`KIND/NAME` or `NAME`) picks one object when the text holds several.
pub fn parse(text: &str, origin: &str, select: Option<&str>) -> Result<ManifestPod> {
    let docs = documents(text, origin)?;
    let workloads: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| KINDS.iter().any(|(kind, _)| *kind == k))
        })
        .collect();
    let kinds = KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ");
    let chosen: Vec<&Value> = match select {
        None => workloads.clone(),
        Some(sel) => {
            let (kind, name) = match sel.split_once('/') {
                Some((k, n)) => (Some(k), n),
                None => (None, sel),
            };
            workloads
                .iter()
                .filter(|d| {
                    d.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                        && kind.is_none_or(|k| {
                            d.get("kind")
                                .and_then(Value::as_str)
                                .is_some_and(|dk| dk.eq_ignore_ascii_case(k))
                        })
                })
                .copied()
                .collect()
        }
    };
    let doc = match chosen.as_slice() {
        [one] => *one,
        [] => {
            let found = docs.iter().map(describe).collect::<Vec<_>>();
            let what = match select {
                Some(s) => format!("no {kinds} matching --object {s:?}"),
                None => format!("no {kinds}"),
            };
            return Err(refused(format!(
                "manifest {origin} holds {what} (found: {}). Fix: pass a manifest with one pod or workload",
                if found.is_empty() {
                    "nothing".to_string()
                } else {
                    found.join(", ")
                }
            )));
        }
        many => {
            let names = many.iter().map(|d| describe(d)).collect::<Vec<_>>();
            return Err(refused(format!(
                "manifest {origin} holds {} workloads ({}). Fix: pick one with --object KIND/NAME",
                many.len(),
                names.join(", ")
            )));
        }
    };
    from_document(doc, origin)
}

fn from_document(doc: &Value, origin: &str) -> Result<ManifestPod> {
    let what = describe(doc);
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let want = KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| *v)
        .unwrap_or_default();
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != want {
        return Err(refused(format!(
            "manifest {origin}: {what} has apiVersion {api_version:?}; the lab kubelet reads {kind} of apiVersion {want}. Fix: render the object as {want}"
        )));
    }
    let bad = |e: serde_json::Error| {
        refused(format!(
            "manifest {origin}: {what} does not parse as a {want} {kind}: {e}. Fix: correct the field the message names"
        ))
    };
    let (meta, template): (ObjectMeta, PodTemplateSpec) = match kind.as_str() {
        "Pod" => {
            let p: Pod = serde_json::from_value(doc.clone()).map_err(bad)?;
            let template = PodTemplateSpec {
                metadata: Some(p.metadata.clone()),
                spec: p.spec,
            };
            (p.metadata, template)
        }
        "DaemonSet" => {
            let o: DaemonSet = serde_json::from_value(doc.clone()).map_err(bad)?;
            (o.metadata, o.spec.map(|s| s.template).unwrap_or_default())
        }
        "Deployment" => {
            let o: Deployment = serde_json::from_value(doc.clone()).map_err(bad)?;
            (o.metadata, o.spec.map(|s| s.template).unwrap_or_default())
        }
        "StatefulSet" => {
            let o: StatefulSet = serde_json::from_value(doc.clone()).map_err(bad)?;
            (o.metadata, o.spec.map(|s| s.template).unwrap_or_default())
        }
        _ => {
            let o: Job = serde_json::from_value(doc.clone()).map_err(bad)?;
            (o.metadata, o.spec.map(|s| s.template).unwrap_or_default())
        }
    };
    let name = meta.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
        refused(format!(
            "manifest {origin}: {what} has no metadata.name. Fix: name the object"
        ))
    })?;
    let namespace = meta
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let field = if kind == "Pod" {
        "spec"
    } else {
        "spec.template.spec"
    };
    let spec = template.spec.ok_or_else(|| {
        refused(format!(
            "manifest {origin}: {what} has no {field}. Fix: give it a pod spec"
        ))
    })?;
    let tmeta = template.metadata.unwrap_or_default();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: if kind == "Pod" {
                meta.uid.clone()
            } else {
                None
            },
            labels: tmeta.labels.filter(|l| !l.is_empty()),
            annotations: tmeta.annotations.filter(|a| !a.is_empty()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    Ok(ManifestPod {
        source: format!("{kind} {namespace}/{name} in {origin}"),
        kind,
        pod,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: erdma-agent
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: erdma-agent
  namespace: kube-system
  labels: {app: ignored-object-label}
spec:
  selector: {matchLabels: {app: erdma-agent}}
  template:
    metadata:
      labels: {app: erdma-agent}
      annotations: {a: b}
    spec:
      containers:
        - name: agent
          image: lab.local/erdma-agent:1
"#;

    #[test]
    fn a_daemonsets_template_with_the_objects_name() {
        let m = parse(DS, "agent.yaml", None).unwrap();
        assert_eq!(m.kind, "DaemonSet");
        assert_eq!(m.source, "DaemonSet kube-system/erdma-agent in agent.yaml");
        assert_eq!(m.pod.metadata.name.as_deref(), Some("erdma-agent"));
        assert_eq!(m.pod.metadata.namespace.as_deref(), Some("kube-system"));
        let labels = m.pod.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("app").map(String::as_str), Some("erdma-agent"));
        assert_eq!(
            m.pod
                .metadata
                .annotations
                .unwrap()
                .get("a")
                .map(String::as_str),
            Some("b")
        );
        let spec = m.pod.spec.unwrap();
        assert_eq!(spec.containers[0].name, "agent");
    }

    #[test]
    fn json_pods_lists_and_namespaces() {
        let pod = r#"{"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "u-1", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}"#;
        let m = parse(pod, "p.json", None).unwrap();
        assert_eq!(m.pod.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            m.pod.metadata.uid.as_deref(),
            Some("u-1"),
            "a Pod keeps its UID"
        );
        let list = format!(r#"{{"apiVersion": "v1", "kind": "List", "items": [{pod}]}}"#);
        assert_eq!(parse(&list, "l.json", None).unwrap().pod, m.pod);
        let rendered = format!(r#"{{"notes": "n", "values": {{}}, "objects": [{pod}]}}"#);
        assert_eq!(parse(&rendered, "r.json", None).unwrap().pod, m.pod);
        // YAML 1.1 as kubectl reads it: a leading zero is octal.
        let y = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: i}]\n  volumes: [{name: v, secret: {secretName: s, defaultMode: 0440}}]\n";
        let spec = parse(y, "p.yaml", None).unwrap().pod.spec.unwrap();
        let mode = spec.volumes.unwrap()[0]
            .secret
            .as_ref()
            .unwrap()
            .default_mode;
        assert_eq!(mode, Some(0o440));
    }

    #[test]
    fn choosing_among_several_and_refusals() {
        let two = format!(
            "{DS}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: ctl, namespace: kube-system}}\nspec:\n  selector: {{}}\n  template:\n    spec:\n      containers: [{{name: c, image: i}}]\n"
        );
        let e = parse(&two, "all.yaml", None).unwrap_err().to_string();
        assert!(
            e.contains("2 workloads")
                && e.contains("DaemonSet kube-system/erdma-agent")
                && e.contains("Deployment kube-system/ctl")
                && e.contains("--object"),
            "{e}"
        );
        let m = parse(&two, "all.yaml", Some("Deployment/ctl")).unwrap();
        assert_eq!(m.kind, "Deployment");
        assert_eq!(
            parse(&two, "all.yaml", Some("erdma-agent")).unwrap().kind,
            "DaemonSet"
        );
        let e = parse(&two, "all.yaml", Some("Job/x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("matching --object \"Job/x\""), "{e}");

        let e = parse(
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
            "s.yaml",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("found: Service s"), "{e}");
        let e = parse(
            "apiVersion: extensions/v1beta1\nkind: DaemonSet\nmetadata: {name: d}\n",
            "d.yaml",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("apiVersion \"extensions/v1beta1\"") && e.contains("apps/v1"),
            "{e}"
        );
        let e = parse(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: {selector: {}}\n",
            "d.yaml",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no spec.template.spec"), "{e}");
        let e = parse(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 7}\n",
            "p.yaml",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("Pod p does not parse as a v1 Pod"), "{e}");
        assert!(
            parse("{not json", "x.json", None)
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
        assert!(
            parse(": : :\n- [", "x.yaml", None)
                .unwrap_err()
                .to_string()
                .contains("not valid YAML")
        );
    }
}
