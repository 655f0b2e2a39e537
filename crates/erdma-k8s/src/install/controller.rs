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
    if !v.config.local_eri_discovery {
        volumes.push(Volume {
            name: "credential".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(v.name.clone()),
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
        name: "controller".into(),
        image: Some(v.controller.image.reference("controller")?),
        image_pull_policy: Some(v.controller.image.pull_policy.clone()),
        args: Some(vec![
            "--config-path=/etc/erdma-controller/config.json".into(),
            "--credential-path=/etc/erdma-controller-credential/credential.json".into(),
        ]),
        env: Some(vec![field_env("POD_NAME", "metadata.name")]),
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
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("256Mi".into()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
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
            template: PodTemplateSpec {
                metadata: Some(pod_meta(v, "controller")),
                spec: Some(PodSpec {
                    service_account_name: Some(v.controller_sa()),
                    priority_class_name: Some("system-cluster-critical".into()),
                    image_pull_secrets: non_empty(&v.controller.image_pull_secrets),
                    node_selector: non_empty_map(&v.controller.node_selector),
                    affinity: some_affinity(&v.controller.affinity),
                    tolerations: non_empty(&v.tolerations),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}
