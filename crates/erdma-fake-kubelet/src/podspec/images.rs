//! The kubelet's image step before `CreateContainer` (`EnsureImageExists`): the pull policy
//! (explicit, or the API server's default from the tag), `ImageStatus`, and what the lab does
//! instead of a pull: it has no registry, so an image must already be in the runtime.

use erdma_cri::runtime::v1 as cri;
use serde::{Deserialize, Serialize};

/// `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    /// Pull every time.
    Always,
    /// Pull only when absent.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// `(tag, digest)` of an image reference: the tag is what follows the last `:` of the last path
/// element (so a registry port is no tag), the digest what follows `@`.
pub fn tag_and_digest(image: &str) -> (Option<&str>, Option<&str>) {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.rsplit_once(':').map(|(_, t)| t);
    (tag, digest)
}

/// The policy of a container: its `imagePullPolicy`, else the API server's default: `Always`
/// for the tag `latest` or no tag (without a digest), `IfNotPresent` otherwise.
pub fn pull_policy(image: &str, explicit: Option<&str>) -> Result<PullPolicy, String> {
    match explicit.unwrap_or("") {
        "Always" => Ok(PullPolicy::Always),
        "IfNotPresent" => Ok(PullPolicy::IfNotPresent),
        "Never" => Ok(PullPolicy::Never),
        "" => Ok(match tag_and_digest(image) {
            (_, Some(_)) => PullPolicy::IfNotPresent,
            (None, None) | (Some("latest"), None) => PullPolicy::Always,
            (Some(_), None) => PullPolicy::IfNotPresent,
        }),
        other => Err(format!(
            "imagePullPolicy {other:?} is not Always, IfNotPresent or Never"
        )),
    }
}

/// The reference the kubelet looks up: `:latest` added when there is neither tag nor digest (it
/// does not add `docker.io/`; the runtime normalises names).
pub fn with_default_tag(image: &str) -> String {
    match tag_and_digest(image) {
        (None, None) => format!("{image}:latest"),
        _ => image.to_string(),
    }
}

/// The image a container ran, in the pod record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The pod's `image`.
    pub reference: String,
    /// The policy applied.
    pub pull_policy: PullPolicy,
    /// The image ID the runtime reported (`sha256:...`), which `CreateContainer` named.
    pub id: String,
    /// Its tags in the runtime.
    #[serde(default)]
    pub repo_tags: Vec<String>,
    /// Its digests in the runtime.
    #[serde(default)]
    pub repo_digests: Vec<String>,
}

/// The note recorded for an `Always` image that was present.
pub const NOT_PULLED: &str = "not pulled (pullPolicy Always; the lab has no registry)";

/// The kubelet's decision for `reference` under `policy`, given what `ImageStatus` answered:
/// the record (and, for `Always`, the note that nothing was pulled), or the kubelet's error
/// (`ErrImageNeverPull`, `ErrImagePull`) with what to do in the lab.
pub fn decide(
    reference: &str,
    policy: PullPolicy,
    status: Option<&cri::Image>,
) -> Result<(ImageRecord, Option<&'static str>), String> {
    let fix = "the lab has no registry: import the image into the runtime first (ctr -n k8s.io images import IMAGE.tar)";
    let Some(image) = status else {
        return Err(match policy {
            PullPolicy::Never => format!(
                "ErrImageNeverPull: Container image {reference:?} is not present with pull policy of Never; {fix}"
            ),
            p => format!(
                "ErrImagePull: container image {reference:?} is not present and the kubelet would pull it (pull policy {}), but {fix}",
                p.as_str()
            ),
        });
    };
    let record = ImageRecord {
        reference: reference.to_string(),
        pull_policy: policy,
        id: image.id.clone(),
        repo_tags: image.repo_tags.clone(),
        repo_digests: image.repo_digests.clone(),
    };
    let note = (policy == PullPolicy::Always).then_some(NOT_PULLED);
    Ok((record, note))
}

/// The image's user as the kubelet reads it: `(uid, username)`; neither set means root (uid 0).
pub fn image_user(image: &cri::Image) -> (Option<i64>, String) {
    match (&image.uid, image.username.as_str()) {
        (Some(u), _) => (Some(u.value), String::new()),
        (None, "") => (Some(0), String::new()),
        (None, name) => (None, name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policies_follow_the_tag() {
        use PullPolicy::*;
        assert_eq!(pull_policy("busybox", None), Ok(Always));
        assert_eq!(pull_policy("busybox:latest", None), Ok(Always));
        assert_eq!(
            pull_policy("lab.local/rdma-tools:1", None),
            Ok(IfNotPresent)
        );
        assert_eq!(
            pull_policy("registry:5000/agent", None),
            Ok(Always),
            "a port is no tag"
        );
        assert_eq!(
            pull_policy("registry:5000/agent:v2", None),
            Ok(IfNotPresent)
        );
        assert_eq!(pull_policy("agent@sha256:abcd", None), Ok(IfNotPresent));
        assert_eq!(
            pull_policy("agent:latest@sha256:abcd", None),
            Ok(IfNotPresent)
        );
        assert_eq!(pull_policy("busybox", Some("Never")), Ok(Never));
        assert_eq!(pull_policy("busybox:1", Some("Always")), Ok(Always));
        assert!(pull_policy("busybox", Some("Sometimes")).is_err());
        assert_eq!(with_default_tag("busybox"), "busybox:latest");
        assert_eq!(
            with_default_tag("registry:5000/agent"),
            "registry:5000/agent:latest"
        );
        assert_eq!(with_default_tag("agent:1"), "agent:1");
        assert_eq!(with_default_tag("agent@sha256:ab"), "agent@sha256:ab");
    }

    #[test]
    fn the_lab_never_pulls() {
        let present = cri::Image {
            id: "sha256:0123".into(),
            repo_tags: vec!["lab.local/erdma-agent:1".into()],
            ..Default::default()
        };
        let (r, note) = decide(
            "lab.local/erdma-agent:1",
            PullPolicy::IfNotPresent,
            Some(&present),
        )
        .unwrap();
        assert_eq!(r.id, "sha256:0123");
        assert_eq!(note, None);
        let (_, note) =
            decide("lab.local/erdma-agent:1", PullPolicy::Never, Some(&present)).unwrap();
        assert_eq!(note, None);
        let (_, note) = decide(
            "lab.local/erdma-agent:1",
            PullPolicy::Always,
            Some(&present),
        )
        .unwrap();
        assert_eq!(
            note,
            Some("not pulled (pullPolicy Always; the lab has no registry)")
        );

        let e = decide("busybox:1", PullPolicy::Never, None).unwrap_err();
        assert!(
            e.starts_with("ErrImageNeverPull: Container image \"busybox:1\" is not present with pull policy of Never")
                && e.contains("no registry")
                && e.contains("import"),
            "{e}"
        );
        for p in [PullPolicy::IfNotPresent, PullPolicy::Always] {
            let e = decide("busybox:1", p, None).unwrap_err();
            assert!(
                e.starts_with("ErrImagePull: container image \"busybox:1\" is not present")
                    && e.contains(p.as_str())
                    && e.contains("no registry"),
                "{e}"
            );
        }
    }

    #[test]
    fn image_users() {
        let mut i = cri::Image::default();
        assert_eq!(image_user(&i), (Some(0), String::new()), "no user: root");
        i.username = "nobody".into();
        assert_eq!(image_user(&i), (None, "nobody".to_string()));
        i.uid = Some(cri::Int64Value { value: 65534 });
        assert_eq!(image_user(&i), (Some(65534), String::new()), "a uid wins");
    }
}
