//! An unmodified TCP workload for the SMC-R lab: plain `std::net` sockets (SMC only through the
//! BPF policy or `tcp2smc`), plus a look at its own first connection through `smc_diag`.
//!
//!   tcpbench server PORT CONNS          accept CONNS connections, read each to EOF
//!   tcpbench client HOST:PORT SHORT MIB  one bulk connection of MIB MiB (its mode read
//!                                        from smc_diag right after connect), then SHORT short connections;
//!                                        prints one JSON line with timings

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let r = match args.get(1).map(String::as_str) {
        Some("server") => server(&args[2..]),
        Some("client") => client(&args[2..]),
        _ => Err("usage: tcpbench server PORT CONNS | client HOST:PORT SHORT MIB".to_string()),
    };
    if let Err(e) = r {
        eprintln!("tcpbench: {e}");
        std::process::exit(1);
    }
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> Result<T, String> {
    a.get(i)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("missing or bad {what}"))
}

fn server(a: &[String]) -> Result<(), String> {
    let port: u16 = arg(a, 0, "PORT")?;
    let conns: usize = arg(a, 1, "CONNS")?;
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("bind: {e}"))?;
    eprintln!("tcpbench: listening on {port} for {conns} connections");
    let mut buf = vec![0u8; 1 << 16];
    for i in 0..conns {
        let (mut s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        eprintln!("tcpbench: connection {i} from {peer}: {total} bytes");
    }
    Ok(())
}

fn connect_retry(addr: &str) -> Result<(TcpStream, Duration), String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = Instant::now();
        match TcpStream::connect(addr) {
            Ok(s) => return Ok((s, t.elapsed())),
            Err(e) if Instant::now() < deadline => {
                eprintln!("tcpbench: connect {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect {addr}: {e}")),
        }
    }
}

fn client(a: &[String]) -> Result<(), String> {
    let addr: String = arg(a, 0, "HOST:PORT")?;
    let short: usize = arg(a, 1, "SHORT")?;
    let mib: usize = arg(a, 2, "MIB")?;
    let (mut bulk, first_connect) = connect_retry(&addr)?;
    let port = bulk.local_addr().map_err(|e| e.to_string())?.port();
    // The handshake is over when connect() returns: look at our own socket before sending.
    let mine = erdma_smc::diag::dump().map(|v| {
        v.into_iter()
            .find(|s| s.local.ends_with(&format!(":{port}")))
    });
    let chunk = vec![0x5au8; 1 << 16];
    let t = Instant::now();
    for _ in 0..(mib * 16) {
        bulk.write_all(&chunk).map_err(|e| format!("write: {e}"))?;
    }
    bulk.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let _ = bulk.read(&mut [0u8; 1]);
    let bulk_s = t.elapsed().as_secs_f64();
    let (mode, detail) = match mine {
        Ok(Some(s)) => (
            s.mode.as_str().to_string(),
            serde_json::to_value(&s).unwrap_or_default(),
        ),
        Ok(None) => (
            "TCP (not an SMC socket)".to_string(),
            serde_json::Value::Null,
        ),
        Err(e) => (format!("unknown ({e})"), serde_json::Value::Null),
    };
    let mut connect_us = vec![first_connect.as_micros() as u64];
    for _ in 0..short {
        let t = Instant::now();
        let mut s = TcpStream::connect(&addr).map_err(|e| format!("connect {addr}: {e}"))?;
        connect_us.push(t.elapsed().as_micros() as u64);
        s.write_all(b"x").map_err(|e| e.to_string())?;
    }
    let mut sorted = connect_us.clone();
    sorted.sort_unstable();
    let out = serde_json::json!({
        "first_connection_mode": mode,
        "first_connection": detail,
        "connect_us": connect_us,
        "connect_us_median": sorted[sorted.len() / 2],
        "bulk_mib": mib,
        "bulk_s": bulk_s,
        "bulk_mib_s": mib as f64 / bulk_s,
    });
    println!("{out}");
    Ok(())
}
