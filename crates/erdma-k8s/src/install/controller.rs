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
        readiness_probe: Some(probe("/healthz")),
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
