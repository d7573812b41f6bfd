//! The `hsx serve`, `hsx submit` and `hsx subscribe` binaries, end to end, with SIGTERM.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn hsx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hsx"))
}

fn start_serve(dir: &Path) -> Child {
    let config = format!(
        "[model]\npath = {:?}\nthreads = 2\n[engine]\nlayer_ids = [0, 4]\nmax_num_batched_tokens = 16\n\
         [output]\ndir = \"out\"\n[socket]\npath = \"d.sock\"\n[logging]\nformat = \"json\"\n",
        common::model_dir("llama")
    );
    std::fs::write(dir.join("c.toml"), config).unwrap();
    let child = hsx()
        .args(["serve", "--config"])
        .arg(dir.join("c.toml"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("d.sock").exists() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn sigterm_and_wait(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            return;
        }
        assert!(Instant::now() < deadline, "daemon did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_submit_subscribe_and_graceful_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let child = start_serve(dir.path());
    let socket = dir.path().join("d.sock");
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\": \"a\", \"token_ids\": [1, 2, 3]}\n{\"id\": \"b\", \"text\": \"Hello world!\"}\n\
         {\"id\": \"c\", \"token_ids\": [1, 600]}\n",
    )
    .unwrap();
    let out = hsx()
        .args(["submit", "--wait", "--socket"])
        .arg(&socket)
        .arg(&input)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!out.status.success(), "one line is rejected: exit code 1");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["accepted", "accepted", "rejected", "completed", "completed"],
        "{stdout}"
    );
    assert!(dir.path().join("out/a.safetensors").exists());

    let out = hsx()
        .args(["subscribe", "--from-seq", "0", "--count", "2", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let seqs: Vec<u64> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2]);

    // SIGTERM while a long request runs: it is finished, its event journaled, the socket removed.
    let long: Vec<String> = (0..1500).map(|i| (i % 500).to_string()).collect();
    std::fs::write(
        &input,
        format!(
            "{{\"id\": \"long\", \"token_ids\": [{}]}}\n",
            long.join(",")
        ),
    )
    .unwrap();
    let out = hsx()
        .args(["submit", "--socket"])
        .arg(&socket)
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    sigterm_and_wait(child);
    assert!(!socket.exists(), "socket file removed");
    assert!(
        dir.path().join("out/long.safetensors").exists(),
        "in-flight work drained"
    );
    let journal = std::fs::read_to_string(dir.path().join("out/hsx-events.jsonl")).unwrap();
    assert!(
        journal.lines().last().unwrap().contains("\"long\""),
        "{journal}"
    );
}
