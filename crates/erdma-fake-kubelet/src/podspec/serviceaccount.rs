//! The API server's ServiceAccount admission plugin (`plugin/pkg/admission/serviceaccount`), for
//! a pod that does not pass through an API server: `spec.serviceAccountName` defaults to
//! `default`, and unless `automountServiceAccountToken` is false (the pod's field wins over the
//! service account's) the pod gets the projected volume `kube-api-access-<5 characters>` (the
//! token, `ca.crt` from the `kube-root-ca.crt` ConfigMap, the namespace from the downward API,
//! mode 0644) mounted read-only at `/var/run/secrets/kubernetes.io/serviceaccount` in every init
//! and app container that has no mount there yet. A pod that already has a `kube-api-access-`
//! volume went through the plugin and is left alone.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, Pod, PodSpec, ProjectedVolumeSource, ServiceAccount,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use std::io::Read;

/// Where the token volume is mounted.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the token volume's name.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The token's lifetime the plugin asks (`WarnOnlyBoundTokenExpirationSeconds`).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// The service account a pod runs as: `serviceAccountName`, else the deprecated
/// `serviceAccount`, else `default`.
pub fn service_account_name(spec: &PodSpec) -> String {
    spec.service_account_name
        .clone()
        .filter(|s| !s.is_empty())
        .or_else(|| spec.service_account.clone().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "default".into())
}

/// Whether the pod has the plugin's token volume already.
pub fn has_token_volume(spec: &PodSpec) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.name.starts_with(VOLUME_PREFIX))
}

/// What the plugin did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// The volume was added (its name) and mounted in the containers named.
    Mounted {
        /// The volume's name.
        volume: String,
        /// The containers that got the mount.
        containers: Vec<String>,
    },
    /// `automountServiceAccountToken: false` on the pod or (the pod not saying) the service
    /// account.
    NotRequested {
        /// `pod` or `service account`.
        by: &'static str,
    },
    /// The pod has the volume already.
    AlreadyAdmitted,
}

/// Five characters of Kubernetes' name generator's alphabet (no vowels, no ambiguous digits).
fn suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let got = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if got.is_err() {
        b = std::process::id().to_le_bytes().repeat(2)[..5]
            .try_into()
            .unwrap_or([0; 5]);
    }
    b.iter()
        .map(|x| ALPHABET[usize::from(*x) % ALPHABET.len()] as char)
        .collect()
}

/// The projected volume the plugin adds.
pub fn token_volume(name: &str) -> Volume {
    Volume {
        name: name.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}

/// Applies the plugin to `pod` with its service account `sa` (which must exist: the plugin
/// refuses a pod whose service account does not).
pub fn admit(pod: &mut Pod, sa: &ServiceAccount) -> Admitted {
    let Some(spec) = pod.spec.as_mut() else {
        return Admitted::AlreadyAdmitted;
    };
    spec.service_account_name = Some(service_account_name(spec));
    if has_token_volume(spec) {
        return Admitted::AlreadyAdmitted;
    }
    match (
        spec.automount_service_account_token,
        sa.automount_service_account_token,
    ) {
        (Some(false), _) => return Admitted::NotRequested { by: "pod" },
        (None, Some(false)) => {
            return Admitted::NotRequested {
                by: "service account",
            };
        }
        _ => {}
    }
    let volume = format!("{VOLUME_PREFIX}{}", suffix());
    let mount = VolumeMount {
        name: volume.clone(),
        mount_path: TOKEN_MOUNT_PATH.into(),
        read_only: Some(true),
        ..Default::default()
    };
    let mut containers = Vec::new();
    let inits = spec.init_containers.iter_mut().flatten();
    for c in inits.chain(spec.containers.iter_mut()) {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if mounts.iter().any(|m| m.mount_path == TOKEN_MOUNT_PATH) {
            continue;
        }
        mounts.push(mount.clone());
        containers.push(c.name.clone());
    }
    if !containers.is_empty() {
        spec.volumes
            .get_or_insert_with(Vec::new)
            .push(token_volume(&volume));
    }
    Admitted::Mounted { volume, containers }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn pod(automount: Option<bool>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                automount_service_account_token: automount,
                init_containers: Some(vec![Container {
                    name: "init".into(),
                    ..Default::default()
                }]),
                containers: vec![
                    Container {
                        name: "app".into(),
                        ..Default::default()
                    },
                    Container {
                        name: "own".into(),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "mine".into(),
                            mount_path: TOKEN_MOUNT_PATH.into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_plugins_volume_and_mounts() {
        let mut p = pod(None);
        let sa = ServiceAccount::default();
        let Admitted::Mounted { volume, containers } = admit(&mut p, &sa) else {
            panic!("mounted");
        };
        assert!(
            volume.starts_with("kube-api-access-") && volume.len() == 21,
            "{volume}"
        );
        assert!(
            volume[16..]
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
        assert_eq!(
            containers,
            ["init", "app"],
            "a container with its own mount there is skipped"
        );
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("default"));
        let v = &spec.volumes.as_ref().unwrap()[0];
        let proj = v.projected.as_ref().unwrap();
        assert_eq!(proj.default_mode, Some(420), "0644");
        let s = proj.sources.as_ref().unwrap();
        let t = s[0].service_account_token.as_ref().unwrap();
        assert_eq!(
            (t.path.as_str(), t.expiration_seconds),
            ("token", Some(3607))
        );
        let cm = s[1].config_map.as_ref().unwrap();
        assert_eq!(cm.name, "kube-root-ca.crt");
        assert_eq!(cm.items.as_ref().unwrap()[0].key, "ca.crt");
        let d = &s[2].downward_api.as_ref().unwrap().items.as_ref().unwrap()[0];
        assert_eq!(
            (
                d.path.as_str(),
                d.field_ref.as_ref().unwrap().field_path.as_str()
            ),
            ("namespace", "metadata.namespace")
        );
        let m = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.name.as_str(), m.mount_path.as_str(), m.read_only),
            (volume.as_str(), TOKEN_MOUNT_PATH, Some(true))
        );
        // Once admitted, a second pass changes nothing (a container added since keeps none).
        let before = p.clone();
        assert_eq!(admit(&mut p, &sa), Admitted::AlreadyAdmitted);
        assert_eq!(p, before);
    }

    #[test]
    fn the_pods_choice_wins_over_the_service_accounts() {
        let no = ServiceAccount {
            automount_service_account_token: Some(false),
            ..Default::default()
        };
        let mut p = pod(None);
        assert_eq!(
            admit(&mut p, &no),
            Admitted::NotRequested {
                by: "service account"
            }
        );
        assert!(p.spec.as_ref().unwrap().volumes.is_none());
        let mut p = pod(Some(true));
        assert!(matches!(admit(&mut p, &no), Admitted::Mounted { .. }));
        let mut p = pod(Some(false));
        assert_eq!(
            admit(&mut p, &ServiceAccount::default()),
            Admitted::NotRequested { by: "pod" }
        );
    }

    #[test]
    fn service_account_names() {
        let mut s = PodSpec::default();
        assert_eq!(service_account_name(&s), "default");
        s.service_account = Some("old".into());
        assert_eq!(service_account_name(&s), "old");
        s.service_account_name = Some("new".into());
        assert_eq!(service_account_name(&s), "new");
    }
}
