//! `config.json`: the default `smcr-init` image is erdma's own, released at the workspace version
//! (the chart's appVersion), and it is the image the chart writes into `config.json`, so what the
//! chart deploys and what the controller falls back to are the same.

use erdma_controller::config::{Config, DEFAULT_SMC_INIT_IMAGE};
use std::path::Path;

fn chart() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/helm"))
}

fn app_version() -> String {
    let raw = std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml");
    raw.lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion")
}

#[test]
fn the_default_smcr_init_image_is_erdmas_at_the_charts_app_version() {
    let want = format!("ghcr.io/erdma/smcr-init:{}", app_version());
    assert_eq!(DEFAULT_SMC_INIT_IMAGE, want);
    let empty: Config = serde_json::from_str(r#"{"smcInitImage": ""}"#).expect("config");
    assert_eq!(empty.smc_init_image(), want);
    assert_eq!(Config::default().smc_init_image(), want);
    let set: Config =
        serde_json::from_str(r#"{"smcInitImage": "registry.example/erdma/smcr-init:dev"}"#)
            .expect("config");
    assert_eq!(set.smc_init_image(), "registry.example/erdma/smcr-init:dev");
}

#[test]
fn the_chart_renders_the_controllers_default_smcr_init_image() {
    let path = chart().join("ci/rendered/defaults.json");
    let raw = std::fs::read_to_string(&path).expect("rendered defaults (deploy/helm/ci/check.sh)");
    let rendered: serde_json::Value = serde_json::from_str(&raw).expect("JSON");
    let cm = rendered["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("the controller's ConfigMap");
    let cfg: Config =
        serde_json::from_str(cm["data"]["config.json"].as_str().expect("config.json"))
            .expect("the chart's config.json loads");
    assert_eq!(cfg.smc_init_image, DEFAULT_SMC_INIT_IMAGE);
}
