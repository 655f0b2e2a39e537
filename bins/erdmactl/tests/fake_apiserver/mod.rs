//! A minimal HTTP/1.1 stand-in for kube-apiserver (the one boundary that cannot exist here): it
//! answers from a route table of recorded JSON bodies and records every request, so the real kube
//! client in `erdmactl` is exercised end to end (kubeconfig, URL paths, selectors, bodies, status
//! codes).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Path with the query string, percent-decoded.
    pub target: String,
    pub body: String,
}

/// A route: method, path prefix (matched against the decoded target), status and body.
pub type Route = (&'static str, String, u16, String);

pub struct FakeApiServer {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(stream: TcpStream, routes: Arc<Vec<Route>>, requests: Arc<Mutex<Vec<Request>>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = decode(parts.next().unwrap_or_default());
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        requests.lock().unwrap().push(Request {
            method: method.clone(),
            target: target.clone(),
            body,
        });
        let (status, reply) = routes
            .iter()
            .find(|(m, p, _, _)| *m == method && target.starts_with(p.as_str()))
            .map(|(_, _, s, b)| (*s, b.clone()))
            .unwrap_or((
                404,
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#.to_string(),
            ));
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if stream
            .write_all(head.as_bytes())
            .and_then(|_| stream.write_all(reply.as_bytes()))
            .is_err()
        {
            return;
        }
    }
}

impl FakeApiServer {
    pub fn start(routes: Vec<Route>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let reqs = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, q) = (routes.clone(), reqs.clone());
                std::thread::spawn(move || serve(stream, r, q));
            }
        });
        FakeApiServer { port, requests }
    }

    /// Writes a kubeconfig pointing at this server (plain HTTP, no credentials).
    pub fn kubeconfig(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: dev\n    namespace: default\n\
             current-context: fake\nusers:\n- name: dev\n  user: {{}}\n",
            port = self.port
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}
