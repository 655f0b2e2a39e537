//! The IMDSv2 client against the local metadata-service emulator.

use erdma_cloud::imds::{ImdsClient, Metadata, MetadataError};
use erdma_cloud::imds_emulator::MetadataEmulator;
use erdma_model::MacAddr;
use std::net::Ipv4Addr;
use std::time::Duration;

fn mac() -> MacAddr {
    "00:16:3e:0a:1b:2c".parse().unwrap()
}

async fn emulator() -> MetadataEmulator {
    let emu = MetadataEmulator::start().await.expect("bind 127.0.0.1");
    emu.add_eni(mac(), "172.16.1.9", "172.16.1.0/24", "172.16.1.253");
    emu
}

fn client(emu: &MetadataEmulator) -> ImdsClient {
    ImdsClient::new(&emu.endpoint())
        .unwrap()
        .with_backoff(Duration::from_millis(10))
}

#[tokio::test]
async fn token_flow_and_values() {
    let emu = emulator().await;
    let c = client(&emu);
    let a = c.eni_addressing(mac()).await.expect("addressing");
    assert_eq!(a.primary_ip, Ipv4Addr::new(172, 16, 1, 9));
    assert_eq!(
        (a.network, a.prefix_len),
        (Ipv4Addr::new(172, 16, 1, 0), 24)
    );
    assert_eq!(a.gateway, Ipv4Addr::new(172, 16, 1, 253));
    // One token for all three reads (cached for half its lifetime).
    assert_eq!(
        emu.log(),
        [
            "PUT /latest/api/token",
            "GET /latest/meta-data/network/interfaces/macs/00:16:3e:0a:1b:2c/primary-ip-address",
            "GET /latest/meta-data/network/interfaces/macs/00:16:3e:0a:1b:2c/vswitch-cidr-block",
            "GET /latest/meta-data/network/interfaces/macs/00:16:3e:0a:1b:2c/gateway",
        ]
    );
}

#[tokio::test]
async fn expired_token_is_refreshed_once() {
    let emu = emulator().await;
    let c = client(&emu);
    c.eni_addressing(mac()).await.unwrap();
    emu.expire_tokens();
    emu.with(|s| s.log.clear());
    c.eni_addressing(mac()).await.unwrap();
    let log = emu.log();
    assert_eq!(
        log.iter().filter(|l| l.starts_with("PUT")).count(),
        1,
        "{log:?}"
    );
    assert_eq!(
        log.len(),
        5,
        "401, new token, retry, then the two other fields: {log:?}"
    );
}

#[tokio::test]
async fn transient_errors_are_retried() {
    let emu = emulator().await;
    emu.with(|s| s.fail_next = 3);
    let c = client(&emu);
    c.eni_addressing(mac())
        .await
        .expect("succeeds on the 4th try");
    emu.with(|s| s.fail_next = 100);
    let e = client(&emu).eni_addressing(mac()).await.unwrap_err();
    assert!(matches!(e, MetadataError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string().contains("4 tries failed, last: HTTP 503"),
        "{e}"
    );
}

#[tokio::test]
async fn unreachable_and_unknown_and_garbage_are_clear_errors() {
    let emu = emulator().await;
    let endpoint = emu.endpoint();
    drop(emu);
    let e = ImdsClient::new(&endpoint)
        .unwrap()
        .with_backoff(Duration::from_millis(5))
        .eni_addressing(mac())
        .await
        .unwrap_err();
    let t = e.to_string();
    assert!(
        t.contains(&endpoint) && t.contains("/latest/api/token") && t.contains("Fix:"),
        "{t}"
    );

    let emu = emulator().await;
    let other: MacAddr = "00:16:3e:ff:ff:ff".parse().unwrap();
    let t = client(&emu)
        .eni_addressing(other)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        t.contains("HTTP 404") && t.contains("00:16:3e:ff:ff:ff") && t.contains("attached"),
        "{t}"
    );

    emu.set(
        "/latest/meta-data/network/interfaces/macs/00:16:3e:0a:1b:2c/vswitch-cidr-block",
        "<html>oops</html>",
    );
    let e = client(&emu).eni_addressing(mac()).await.unwrap_err();
    assert!(matches!(e, MetadataError::Garbage { .. }), "{e}");
    assert!(
        e.to_string().contains("vswitch-cidr-block") && e.to_string().contains("<html>"),
        "{e}"
    );
}
