//! The driver reload guard on a DRA node whose kubelet does not report claims (its feature gate
//! `KubeletPodResourcesDynamicResources` off: pod-resources `List` without `dynamic_resources`):
//! the DRA driver's checkpoint of prepared claims is the record, and the node is busy while it
//! holds claims.

use erdma_agent::reload_guard::WithPreparedClaims;
use erdma_driver::{PodResourceUsage, UsageError};
use erdma_kubelet::podresources::{ClaimedDevice, Held, Holder};

/// What the kubelet answered.
struct Kubelet(Vec<Holder>);

impl PodResourceUsage for Kubelet {
    async fn holders(&self, _: &Held) -> Result<Vec<Holder>, UsageError> {
        Ok(self.0.clone())
    }
}

fn held() -> Held {
    Held::both("aliyun/erdma", "erdma.alibabacloud.com")
}

/// A checkpoint as the DRA driver writes it: its snapshot line, then one appended record.
fn checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("checkpoint.json");
    let claim = |ns: &str, name: &str| {
        serde_json::json!({"namespace": ns, "name": name, "devices": [{
            "request": "rdma", "pool": "n1", "device": "erdma-0", "ibdev": "erdma_0",
            "cdi_ids": [], "shares": 1, "limits": {"hca_handle": 0, "hca_object": 0}}],
            "cdi_spec": "/var/run/cdi/x.json"})
    };
    let snapshot =
        serde_json::json!({"version": 2, "claims": {"uid-a": claim("team-a", "train-0")}});
    let record =
        serde_json::json!({"prepared": {"uid": "uid-b", "claim": claim("team-b", "train-1")}});
    std::fs::write(&path, format!("{snapshot}\n{record}\n")).unwrap();
    path
}

#[tokio::test]
async fn prepared_claims_the_kubelet_does_not_report_make_the_node_busy() {
    let dir = tempfile::tempdir().unwrap();
    let guard = WithPreparedClaims {
        inner: Kubelet(Vec::new()),
        checkpoint: checkpoint(dir.path()),
    };
    let e = guard.holders(&held()).await.expect_err("busy");
    assert!(
        e.detail
            .contains("2 prepared claim(s) (team-a/train-0, team-b/train-1)"),
        "{e}"
    );
    assert!(e.fix.contains("KubeletPodResourcesDynamicResources"), "{e}");
}

#[tokio::test]
async fn the_kubelets_claims_are_trusted_when_it_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Holder::of_ids("team-a", "train-0", "main", Vec::new());
    h.claimed.push(ClaimedDevice {
        claim_namespace: "team-a".into(),
        claim_name: "train-0".into(),
        pool: "n1".into(),
        device: "erdma-0".into(),
    });
    let guard = WithPreparedClaims {
        inner: Kubelet(vec![h.clone()]),
        checkpoint: checkpoint(dir.path()),
    };
    assert_eq!(guard.holders(&held()).await.unwrap(), vec![h]);
}

#[tokio::test]
async fn without_prepared_claims_an_idle_node_stays_idle() {
    let dir = tempfile::tempdir().unwrap();
    let guard = WithPreparedClaims {
        inner: Kubelet(Vec::new()),
        checkpoint: dir.path().join("checkpoint.json"),
    };
    assert_eq!(guard.holders(&held()).await.unwrap(), Vec::new());
    std::fs::write(
        dir.path().join("checkpoint.json"),
        "{\"version\":2,\"claims\":{}}\n",
    )
    .unwrap();
    assert_eq!(guard.holders(&held()).await.unwrap(), Vec::new());
}

#[tokio::test]
async fn an_unreadable_record_refuses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("checkpoint.json"), "{\"version\":").unwrap();
    let guard = WithPreparedClaims {
        inner: Kubelet(Vec::new()),
        checkpoint: dir.path().join("checkpoint.json"),
    };
    let e = guard.holders(&held()).await.expect_err("refused");
    assert!(e.detail.contains("cannot be read"), "{e}");
}
