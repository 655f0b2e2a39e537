//! The ECS client against the local ECS/STS emulator: both signature schemes, rejection of bad
//! signatures, retries on throttling and 5xx, ClientToken idempotency, and each credential type.
//! Mocked: the cloud itself (the emulator); everything in this crate runs for real over HTTP.

use erdma_cloud::credentials::{SecretSource, aes_cbc_encrypt};
use erdma_cloud::ecs::CreateEni;
use erdma_cloud::emulator::{EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, EcsError, RetryPolicy,
    SignatureVersion,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    base: Duration::from_millis(1),
    max: Duration::from_millis(5),
};

async fn emulator() -> EcsEmulator {
    let emu = EcsEmulator::start().await.expect("emulator starts");
    {
        let mut st = emu.state();
        st.add_key("AKID", "s3cr3t");
        st.add_type(EmuInstanceType {
            id: "ecs.g8ae.4xlarge".into(),
            eri_quantity: Some(1),
            network_cards: 1,
            queue_pairs: 8,
            gpus: 0,
        });
        st.add_instance(EmuInstance {
            id: "i-one".into(),
            instance_type: "ecs.g8ae.4xlarge".into(),
            private_ip: "10.0.0.5".into(),
            vswitch_id: "vsw-1".into(),
            security_groups: vec!["sg-1".into()],
            jumbo_frame: Some(true),
        });
    }
    emu
}

fn client(emu: &EcsEmulator, source: CredentialSource, sig: SignatureVersion) -> EcsClient {
    EcsClient::new(
        EcsConfig {
            endpoint: emu.endpoint(),
            region: "emu-region".into(),
            signature: sig,
            retry: FAST,
        },
        Arc::new(CredentialProvider::new(source)),
    )
    .expect("client")
}

fn ak(secret: &str) -> CredentialSource {
    CredentialSource::AccessKey(Credentials::access_key("AKID", secret))
}

#[tokio::test]
async fn both_signature_versions_are_accepted_and_typed_answers_decode() {
    let emu = emulator().await;
    for sig in [SignatureVersion::V3, SignatureVersion::V2] {
        let c = client(&emu, ak("s3cr3t"), sig);
        let found = c
            .describe_instances_by_ip(&["10.0.0.5"])
            .await
            .expect("describe");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].instance_id, "i-one");
        assert_eq!(found[0].vswitch_id, "vsw-1");
        assert_eq!(found[0].security_group_ids, vec!["sg-1".to_string()]);
        let t = c
            .describe_instance_type("ecs.g8ae.4xlarge")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.eri_quantity, t.network_card_quantity, t.queue_pair_number),
            (Some(1), 1, 8)
        );
        let enis = c.describe_network_interfaces_of("i-one").await.unwrap();
        assert_eq!(enis.len(), 1);
        assert!(enis[0].is_primary());
        assert!(c.jumbo_frame_enabled("i-one").await.unwrap());
    }
    let st = emu.state();
    assert!(st.calls.iter().any(|c| c.scheme == "V2"));
    assert!(st.calls.iter().any(|c| c.scheme == "V3"));
    // RegionId goes exactly where the SDK defines it (not DescribeInstanceTypes and
    // DescribeInstanceAttribute, which are not regional).
    let spec = erdma_cloud::apispec::ecs().expect("SDK data");
    for c in &st.calls {
        let defines = spec
            .action(&c.action)
            .expect("an ECS action")
            .params
            .iter()
            .any(|p| p == "RegionId");
        let sent = c.params.get("RegionId").map(String::as_str);
        assert_eq!(sent, defines.then_some("emu-region"), "{}", c.action);
    }
}

#[tokio::test]
async fn a_wrong_secret_is_rejected_without_retries_and_not_logged() {
    let emu = emulator().await;
    for sig in [SignatureVersion::V3, SignatureVersion::V2] {
        let c = client(&emu, ak("wrong-secret-value"), sig);
        let err = c.describe_instances_by_id(&["i-one"]).await.unwrap_err();
        assert_eq!(err.code(), Some("SignatureDoesNotMatch"), "{err}");
        assert!(!err.is_retryable());
        let text = format!("{err} {err:?}");
        assert!(!text.contains("wrong-secret-value"), "{text}");
        assert!(text.contains("accessKeySecret"), "the fix is named: {text}");
    }
    assert_eq!(emu.state().rejected.len(), 2, "exactly one try each");
}

#[tokio::test]
async fn throttling_and_5xx_are_retried_with_backoff_then_surface() {
    let emu = emulator().await;
    let c = client(&emu, ak("s3cr3t"), SignatureVersion::V3);
    emu.state()
        .inject_error(Some("DescribeInstances"), 400, "Throttling.User", 2);
    emu.state()
        .inject_error(Some("DescribeInstances"), 503, "ServiceUnavailable", 1);
    let found = c
        .describe_instances_by_id(&["i-one"])
        .await
        .expect("succeeds on the 4th try");
    assert_eq!(found.len(), 1);
    assert_eq!(emu.state().calls_of("DescribeInstances").len(), 4);

    emu.state().inject_error(None, 500, "InternalError", 10);
    let err = c.jumbo_frame_enabled("i-one").await.unwrap_err();
    assert_eq!(err.code(), Some("InternalError"));
    assert_eq!(
        emu.state().calls_of("DescribeInstanceAttribute").len(),
        4,
        "max_attempts tries"
    );

    // Non-retryable API errors surface at once.
    emu.state().inject.clear();
    let err = c
        .attach_network_interface("eni-nope", "i-one", 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidEniId.NotFound"));
    assert_eq!(emu.state().calls_of("AttachNetworkInterface").len(), 1);
}

#[tokio::test]
async fn client_token_makes_creation_idempotent_across_retries() {
    let emu = emulator().await;
    let c = client(&emu, ak("s3cr3t"), SignatureVersion::V3);
    let req = CreateEni {
        vswitch_id: "vsw-1".into(),
        security_group_ids: vec!["sg-1".into()],
        name: "eri-i-one-1".into(),
        queue_pair_number: 8,
        tags: BTreeMap::from([(
            "creator".to_string(),
            "alibabacloud-erdma-controller".to_string(),
        )]),
        client_token: "erdma-i-one-1".into(),
    };
    // The first answer is lost (503 after the emulator would have created it is modelled by the
    // second identical call): both calls must yield one ENI.
    let (a, mac_a) = c.create_network_interface(&req).await.unwrap();
    let (b, mac_b) = c.create_network_interface(&req).await.unwrap();
    assert_eq!((a.as_str(), mac_a.as_str()), (b.as_str(), mac_b.as_str()));
    let st = emu.state();
    let created: Vec<_> = st
        .enis
        .values()
        .filter(|e| e.name == "eri-i-one-1")
        .collect();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].traffic_mode, "HighPerformance");
    assert_eq!(created[0].queue_pairs, Some(8));
    assert_eq!(
        created[0].tags.get("creator").map(String::as_str),
        Some("alibabacloud-erdma-controller")
    );
    assert!(
        st.calls_of("CreateNetworkInterface")
            .iter()
            .all(|c| c.params["ClientToken"] == "erdma-i-one-1")
    );
}

#[tokio::test]
async fn attach_latency_shows_attaching_then_in_use() {
    let emu = emulator().await;
    emu.state().attach_latency = Duration::from_millis(200);
    let eni = emu
        .state()
        .add_secondary_eni("i-one", 0, "HighPerformance", "Available", &[]);
    let c = client(&emu, ak("s3cr3t"), SignatureVersion::V3);
    c.attach_network_interface(&eni, "i-one", 1).await.unwrap();
    let e = &c.describe_network_interfaces_by_id(&[&eni]).await.unwrap()[0];
    assert_eq!((e.status.as_str(), e.network_card_index), ("Attaching", 1));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let e = &c.describe_network_interfaces_by_id(&[&eni]).await.unwrap()[0];
    assert_eq!(e.status, "InUse");
    assert_eq!(
        emu.state().calls_of("AttachNetworkInterface")[0].params["NetworkCardIndex"],
        "1"
    );
}

#[tokio::test]
async fn oidc_role_credentials_come_from_sts_and_carry_the_token() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "oidc-jwt\n").unwrap();
    emu.state()
        .oidc_tokens
        .insert("oidc-jwt".into(), "acs:ram::1:role/erdma".into());
    let source = CredentialSource::OidcRole(erdma_cloud::credentials::OidcRole {
        role_arn: "acs:ram::1:role/erdma".into(),
        provider_arn: "acs:ram::1:oidc-provider/ack".into(),
        token_file: token_file.clone(),
        session_name: "erdma-controller".into(),
        sts_endpoint: emu.endpoint(),
    });
    let c = client(&emu, source, SignatureVersion::V3);
    c.describe_instances_by_id(&["i-one"])
        .await
        .expect("STS credentials accepted");
    c.describe_instances_by_id(&["i-one"])
        .await
        .expect("cached");
    {
        let st = emu.state();
        assert_eq!(
            st.calls_of("AssumeRoleWithOIDC").len(),
            1,
            "credentials are cached"
        );
        let ecs = st.calls_of("DescribeInstances");
        assert!(ecs.iter().all(|c| c.access_key_id.starts_with("STS.")));
    }

    // A bad token is an error naming the role, not a panic.
    std::fs::write(&token_file, "forged").unwrap();
    let source = CredentialSource::OidcRole(erdma_cloud::credentials::OidcRole {
        role_arn: "acs:ram::1:role/erdma".into(),
        provider_arn: "p".into(),
        token_file,
        session_name: "s".into(),
        sts_endpoint: emu.endpoint(),
    });
    let err = client(&emu, source, SignatureVersion::V3)
        .describe_instances_by_id(&["i-one"])
        .await
        .unwrap_err();
    assert!(matches!(err, EcsError::Credentials { .. }), "{err}");
    assert!(err.to_string().contains("role/erdma"), "{err}");
}

#[tokio::test]
async fn ecs_ram_role_credentials_come_from_the_metadata_service() {
    let emu = emulator().await;
    emu.state().keys.insert(
        "STS.ram".into(),
        ("ram-secret".into(), Some("ram-token".into())),
    );
    let md = erdma_cloud::imds_emulator::MetadataEmulator::start()
        .await
        .unwrap();
    md.set(
        "/latest/meta-data/ram/security-credentials/",
        "erdma-node-role",
    );
    md.set(
        "/latest/meta-data/ram/security-credentials/erdma-node-role",
        r#"{"AccessKeyId":"STS.ram","AccessKeySecret":"ram-secret","SecurityToken":"ram-token","Expiration":"2099-01-01T00:00:00Z","Code":"Success","LastUpdated":"2026-11-29T00:00:00Z"}"#,
    );
    let source = CredentialSource::EcsRamRole {
        metadata_endpoint: md.endpoint(),
        role_name: None,
    };
    for sig in [SignatureVersion::V2, SignatureVersion::V3] {
        let c = client(&emu, source.clone(), sig);
        c.describe_instances_by_id(&["i-one"])
            .await
            .expect("RAM role credentials accepted");
    }
    // Without the token the same key is refused: the token really is sent.
    let c = client(
        &emu,
        CredentialSource::AccessKey(Credentials::access_key("STS.ram", "ram-secret")),
        SignatureVersion::V3,
    );
    let err = c.describe_instances_by_id(&["i-one"]).await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidSecurityToken.Mismatch"));
}

struct FixedSecret(Vec<u8>);
impl SecretSource for FixedSecret {
    fn read(&self) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + '_>> {
        let v = self.0.clone();
        Box::pin(async move { Ok(v) })
    }
}

#[tokio::test]
async fn sts_secret_credentials_are_decrypted_and_used() {
    let emu = emulator().await;
    emu.state().keys.insert(
        "STS.addon".into(),
        ("addon-secret".into(), Some("addon-token".into())),
    );
    let key = b"0123456789abcdef0123456789abcdef";
    let enc = |s: &str, iv: u8| aes_cbc_encrypt(s.as_bytes(), key, [iv; 16]).unwrap();
    let raw = serde_json::json!({
        "access.key.id": enc("STS.addon", 1), "access.key.secret": enc("addon-secret", 2),
        "security.token": enc("addon-token", 3), "expiration": "2099-01-01T00:00:00Z",
        "keyring": std::str::from_utf8(key).unwrap(),
    });
    let source = CredentialSource::StsSecret(Arc::new(FixedSecret(raw.to_string().into_bytes())));
    let c = client(&emu, source, SignatureVersion::V3);
    c.describe_instances_by_id(&["i-one"])
        .await
        .expect("addon token accepted");
    assert_eq!(
        emu.state().calls_of("DescribeInstances")[0].access_key_id,
        "STS.addon"
    );
}
