//! The controller's Deployment.

use super::*;

pub(super) fn controller_deployment(v: &Values) -> Result<Deployment, Error> {
    let ns = v.namespace.as_str();
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: v.name.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut mounts = vec![mount("config", "/etc/erdma-controller", true)];
    let c = &v.controller;
    if !v.config.local_eri_discovery {
        volumes.push(Volume {
            name: "credential".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(v.credentials_secret()),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(
            "credential",
            "/etc/erdma-controller-credential",
            true,
        ));
    }
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(8080),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(v.controller.image.reference("controller")?),
        image_pull_policy: Some(v.controller.image.pull_policy.clone()),
        args: Some(
            [
                "--config-path=/etc/erdma-controller/config.json".to_string(),
                "--credential-path=/etc/erdma-controller-credential/credential.json".to_string(),
            ]
            .into_iter()
            .chain(log_args(v))
            .chain(c.extra_args.iter().cloned())
            .collect(),
        ),
        env: Some(
            std::iter::once(field_env("POD_NAME", "metadata.name"))
                .chain(c.extra_env.iter().cloned())
                .collect(),
        ),
        ports: Some(vec![
            ContainerPort {
                name: Some("webhook".into()),
                container_port: 9443,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        liveness_probe: Some(probe("/healthz")),
        // 503 until the webhook port serves, when the controller serves one.
        readiness_probe: Some(probe("/readyz")),
        resources: some_nonempty(&c.resources),
        security_context: some_nonempty(&c.security_context),
        volume_mounts: Some(
            mounts
                .into_iter()
                .chain(c.extra_volume_mounts.clone())
                .collect(),
        ),
        ..Default::default()
    };
    Ok(Deployment {
        metadata: meta(CONTROLLER_NAME, Some(ns), labels(v, "controller")),
        spec: Some(DeploymentSpec {
            replicas: Some(v.controller.replica_count),
            selector: LabelSelector {
                match_labels: Some(selector(v, "controller")),
                ..Default::default()
            },
            strategy: some_nonempty(&c.strategy),
            template: PodTemplateSpec {
                metadata: Some(pod_meta(v, "controller")),
                spec: Some(PodSpec {
                    service_account_name: Some(v.controller_sa()),
                    priority_class_name: (!c.priority_class_name.is_empty())
                        .then(|| c.priority_class_name.clone()),
                    image_pull_secrets: non_empty(&v.controller.image_pull_secrets),
                    node_selector: non_empty_map(&v.controller.node_selector),
                    affinity: some_affinity(&v.controller.affinity),
                    tolerations: non_empty(&v.tolerations),
                    containers: vec![container],
                    volumes: Some(volumes.into_iter().chain(c.extra_volumes.clone()).collect()),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The longest webhook timeout rendered: every pod creation the webhook sees waits for it.
pub(super) const WEBHOOK_TIMEOUT_MAX: i32 = 5;

/// The namespaces the webhook sees: all but kube-system and the release's own (the controller's
/// pods must be creatable while no replica serves).
pub(super) fn webhook_namespaces(ns: &str) -> LabelSelector {
    let mut skipped = vec!["kube-system".to_string()];
    if ns != "kube-system" {
        skipped.push(ns.to_string());
    }
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "NotIn".into(),
            values: Some(skipped),
        }]),
        ..Default::default()
    }
}

/// One controller replica at a time may be evicted by a voluntary disruption (a node drain):
/// the others keep serving the webhook. Rendered only with more than one replica.
pub(super) fn controller_disruption_budget(v: &Values) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(CONTROLLER_NAME, Some(&v.namespace), labels(v, "controller")),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector(v, "controller")),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
