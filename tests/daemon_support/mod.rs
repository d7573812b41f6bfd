//! Starting the real daemon (`hsx::server::run`) on a temporary socket and a loopback port,
//! and small clients for its two protocols.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hsx::config::{Config, HttpSection};
use hsx::server::client::Connection;
use hsx::server::{Listeners, ServerOptions, bind_unix, run, start_engine};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common;

/// A config for the llama fixture with every daemon file under `dir`.
pub fn daemon_config(dir: &Path) -> Config {
    let mut c = common::config("llama", &dir.join("out"), 64, Some(vec![0, 2, 4]));
    c.socket.path = dir.join("hsx.sock");
    c.http = Some(HttpSection {
        address: "127.0.0.1:0".into(),
        max_body_bytes: 1 << 20,
    });
    c
}

pub struct TestDaemon {
    pub socket: PathBuf,
    pub http: SocketAddr,
    pub out: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestDaemon {
    /// Starts the daemon of `cfg` and returns once it accepts connections.
    pub async fn start(cfg: &Config) -> TestDaemon {
        Self::start_with_options(cfg, ServerOptions::from_config(cfg)).await
    }

    /// [`Self::start`] with frontend options of the test's choosing (e.g. a short HTTP timeout).
    pub async fn start_with_options(cfg: &Config, options: ServerOptions) -> TestDaemon {
        let unix = bind_unix(&cfg.socket.path, cfg.socket.mode).expect("bind socket");
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = http.local_addr().unwrap();
        let engine = start_engine(cfg).await.expect("engine starts");
        let out = engine.info().output_dir.clone();
        let listeners = Listeners {
            unix,
            unix_path: cfg.socket.path.clone(),
            http: Some(http),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(run(engine, listeners, options, async move {
            let _ = rx.await;
        }));
        TestDaemon {
            socket: cfg.socket.path.clone(),
            http: addr,
            out,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.socket).await.expect("connect")
    }

    /// Graceful shutdown; returns once `run` returned.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("daemon stops in time")
            .unwrap()
            .expect("run returns Ok");
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http(self.http, "GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = http(self.http, "POST", path, Some(&body.to_string())).await;
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, v)
    }
}

/// A minimal HTTP/1.1 client (one request per connection).
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_raw(addr, method, path, body.unwrap_or("").as_bytes()).await
}

pub async fn http_raw(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // The server may answer (413) before reading the whole body.
    let _ = s.write_all(body).await;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// Sends a `submit` and returns the reply.
pub async fn submit(conn: &mut Connection, id: &str, tokens: &[u32]) -> Value {
    conn.request(&json!({"op": "submit", "id": id, "token_ids": tokens}))
        .await
        .unwrap()
}

/// Subscribes on a fresh connection; returns it after the `subscribed` reply.
pub async fn subscriber(d: &TestDaemon, from_seq: Option<u64>) -> Connection {
    let mut c = d.connect().await;
    let reply = c
        .request(&json!({"op": "subscribe", "from_seq": from_seq}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "subscribed", "{reply}");
    c
}

/// The next line, failing the test after `secs` seconds.
pub async fn recv_within(conn: &mut Connection, secs: u64) -> Option<Value> {
    tokio::time::timeout(Duration::from_secs(secs), conn.recv())
        .await
        .expect("a line in time")
        .unwrap()
}

/// Checks that a completed event's file is complete: T rows, matching token ids.
pub fn check_file(event: &Value, tokens: &[u32]) {
    assert_eq!(event["event"], "completed", "{event}");
    let path = PathBuf::from(event["path"].as_str().unwrap());
    let f = common::HsFile::read(&path);
    assert_eq!(f.shape[0], tokens.len(), "{}", path.display());
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    assert_eq!(f.token_ids, ids);
}
