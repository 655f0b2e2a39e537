//! The agent's settings as `erdma_model::settings::AGENT_SETTINGS` describes them, checked
//! against each place that describes them too: the agent's flags (`Flags::command()`), its
//! config file's keys, and the chart (`deploy/helm/values.yaml`, `values.schema.json`, the agent
//! DaemonSet's template). `erdmactl install`'s flags are checked in bins/erdmactl.

use clap::CommandFactory;
use erdma_agent::cli::{Flags, read_config};
use erdma_model::settings::{AGENT_SETTINGS, AgentDefault, Chart, Setting};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The value at dotted `path` in `v`.
fn at<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// A values.yaml scalar or list as the table writes it.
fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

#[test]
fn the_agents_flags_are_the_tables() {
    let cmd = Flags::command();
    let mut from_clap = BTreeSet::new();
    let mut wrong = Vec::new();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if ["help", "version"].contains(&long) {
            continue;
        }
        from_clap.insert(long.to_string());
        let s = AGENT_SETTINGS
            .iter()
            .find(|s| s.flag == long)
            .unwrap_or_else(|| panic!("--{long} is not in erdma_model::settings::AGENT_SETTINGS"));
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            s.env,
            "--{long}: environment variable"
        );
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let says = match s.default {
            AgentDefault::Value(d) => help.contains(&format!("[default: {d}")),
            AgentDefault::Computed => help.contains("[default:"),
            AgentDefault::Unset => !help.contains("[default:"),
        };
        if !says {
            wrong.push(format!("--{long}: table {:?}, help: {help}", s.default));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let table: BTreeSet<String> = AGENT_SETTINGS.iter().map(|s| s.flag.to_string()).collect();
    assert_eq!(from_clap, table, "agent flags vs AGENT_SETTINGS");
}

/// `{"<key>": null}`: accepted by every `Option` field the key names, refused (unknown field)
/// otherwise.
fn file_accepts(key: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.json");
    std::fs::write(&file, serde_json::json!({ key: null }).to_string()).unwrap();
    read_config(&file).map(|_| ()).map_err(|e| format!("{e:#}"))
}

#[test]
fn the_config_files_keys_are_the_tables() {
    let mut keys = BTreeSet::new();
    for s in AGENT_SETTINGS {
        if let Some(k) = s.file_key {
            keys.insert(k);
            keys.extend(s.file_alias);
            file_accepts(k).unwrap_or_else(|e| panic!("{}: file key {k}: {e}", s.flag));
        }
        if let Some(a) = s.file_alias {
            file_accepts(a).unwrap_or_else(|e| panic!("{}: file alias {a}: {e}", s.flag));
        }
        if s.file_key.is_none() {
            assert!(
                file_accepts(s.flag).is_err(),
                "--{}: the file takes it",
                s.flag
            );
        }
    }
    // The file's own list of keys, from its refusal of an unknown one.
    let e = file_accepts("no-such-key").unwrap_err();
    let listed: BTreeSet<&str> = e
        .split("expected one of")
        .nth(1)
        .unwrap_or_else(|| panic!("{e}"))
        .split('`')
        .skip(1)
        .step_by(2)
        .collect();
    assert_eq!(listed, keys, "config file keys vs AGENT_SETTINGS");
}

fn charted() -> impl Iterator<Item = (&'static Setting, &'static str, &'static str)> {
    AGENT_SETTINGS
        .iter()
        .filter_map(|s| Some((s, s.chart_path()?, s.chart_default()?)))
}

#[test]
fn the_charts_values_and_schema_are_the_tables() {
    let values: serde_json::Value =
        serde_saphyr::from_str(&read("deploy/helm/values.yaml")).expect("values.yaml");
    let schema: serde_json::Value =
        serde_json::from_str(&read("deploy/helm/values.schema.json")).expect("values.schema.json");
    for (s, path, default) in charted() {
        let v =
            at(&values, path).unwrap_or_else(|| panic!("--{}: values.yaml has no {path}", s.flag));
        assert_eq!(scalar(v), default, "--{}: values.yaml {path}", s.flag);
        let schema_path = path.replace('.', ".properties.");
        assert!(
            at(&schema["properties"], &schema_path).is_some(),
            "--{}: values.schema.json has no {path}",
            s.flag
        );
    }
}

#[test]
fn the_agents_template_passes_what_the_table_says() {
    let template = read("deploy/helm/templates/agent.yaml");
    for s in AGENT_SETTINGS {
        let passed = template.lines().map(str::trim).any(|l| {
            l.strip_prefix("- --")
                .or_else(|| l.strip_prefix("- {{ printf \"--"))
                .is_some_and(|rest| {
                    rest.strip_prefix(s.flag)
                        .is_some_and(|r| r.is_empty() || r.starts_with('='))
                })
        });
        match s.chart {
            Chart::Value { path, .. } | Chart::Derived { path, .. } => {
                assert!(passed, "--{}: the template does not pass it", s.flag);
                let last = path.rsplit('.').next().unwrap();
                assert!(
                    template.contains(last),
                    "--{}: the template does not read {path}",
                    s.flag
                );
            }
            Chart::Fixed => assert!(passed, "--{}: the template does not set it", s.flag),
            Chart::Env => {
                let env = s.env.expect("an Env setting names its variable");
                assert!(
                    template.contains(&format!("name: {env}")),
                    "--{}: the template does not set {env}",
                    s.flag
                );
            }
            Chart::None => assert!(
                !passed,
                "--{}: the template passes it, the table says the chart does not",
                s.flag
            ),
        }
    }
}

/// The other way round: each value of `agent.*` and `dra.*` in values.yaml is an agent setting
/// of the table, or one of the chart's own (image, pod shape, extra arguments).
#[test]
fn every_agent_value_of_the_chart_is_in_the_table() {
    const THE_CHARTS_OWN: &[&str] = &[
        "agent.image",
        "agent.extraArgs",
        "agent.imagePullSecrets",
        "agent.nameOverride",
        "agent.fullnameOverride",
        "agent.priorityClassName",
        "agent.updateStrategy",
        "agent.securityContext",
        "agent.extraEnv",
        "agent.extraVolumes",
        "agent.extraVolumeMounts",
        // The chart's ValidatingAdmissionPolicy, not the agent's.
        "agent.admissionPolicy",
        // The container's AppArmor profile (pod shape).
        "agent.appArmorProfile",
    ];
    let values: serde_json::Value =
        serde_saphyr::from_str(&read("deploy/helm/values.yaml")).expect("values.yaml");
    let table: BTreeSet<&str> = charted().map(|(_, path, _)| path).collect();
    let mut missing = Vec::new();
    for top in ["agent", "dra"] {
        let mut stack = vec![top.to_string()];
        while let Some(path) = stack.pop() {
            if THE_CHARTS_OWN.contains(&path.as_str()) || table.contains(path.as_str()) {
                continue;
            }
            match at(&values, &path) {
                Some(serde_json::Value::Object(m)) => {
                    stack.extend(m.keys().map(|k| format!("{path}.{k}")))
                }
                _ => missing.push(path),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "values.yaml values not in AGENT_SETTINGS: {missing:?}"
    );
}
