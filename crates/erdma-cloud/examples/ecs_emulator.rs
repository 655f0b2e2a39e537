//! Runs the ECS emulator as a process for clients outside Rust: `sdk-oracle/official_client.py`
//! drives the OFFICIAL Python ECS client against it (both signature schemes), which checks the
//! emulator's signature verifier and parameter check on requests the SDK itself built and sent.
//!
//! Prints `ENDPOINT <url> <access-key-id> <secret> <instance> <primary-eni>` on one line, then
//! serves until its standard input closes; at exit prints every call it answered, one
//! `CALL <action> <scheme> <status>` line each.

use erdma_cloud::emulator::{EcsEmulator, EmuInstance, EmuInstanceType};
use std::io::Read;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let emu = EcsEmulator::start().await?;
    let primary = {
        let mut st = emu.state();
        st.add_key("AKIDofficial", "official/secret+1");
        st.add_type(EmuInstanceType {
            id: "ecs.ebmgn8v.48xlarge".into(),
            eri_quantity: Some(2),
            network_cards: 2,
            queue_pairs: 16,
            gpus: 8,
        });
        st.add_instance(EmuInstance {
            id: "i-official".into(),
            instance_type: "ecs.ebmgn8v.48xlarge".into(),
            private_ip: "10.0.0.5".into(),
            vswitch_id: "vsw-1".into(),
            security_groups: vec!["sg-1".into()],
            jumbo_frame: Some(true),
        })
    };
    println!(
        "ENDPOINT {} AKIDofficial official/secret+1 i-official {primary}",
        emu.endpoint()
    );
    // Serve until standard input closes (read on a blocking thread; the server runs meanwhile).
    tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new()))
        .await
        .map_err(std::io::Error::other)??;
    for c in &emu.state().calls {
        println!("CALL {} {} {}", c.action, c.scheme, c.status);
    }
    Ok(())
}
