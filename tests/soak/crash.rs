//! Crash-consistency harness: runs the real `hsx serve` binary on the llama fixture, submits
//! requests over the socket, SIGKILLs the daemon at a random moment, checks what is on disk,
//! restarts it, resumes (resubmits every request without a `completed` event or without its
//! file) and checks again. Shared by tests/reliability_crash.rs (CI) and the soak binary.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// What one trial found.
#[derive(Debug, Default, Clone)]
pub struct Trial {
    pub requests: usize,
    /// Requests with a `completed` event before the kill.
    pub completed_before_kill: usize,
    /// Milliseconds between the first submit and the SIGKILL.
    pub kill_after_ms: u64,
    /// `*.safetensors` files under their final names that do not parse, or are short, or hold
    /// the wrong tokens (after the kill, and after the resumed run).
    pub partial_or_corrupt: usize,
    /// `completed` events whose file is missing or wrong.
    pub completed_missing_or_wrong: usize,
    /// `*.tmp` files present after the kill (left by the killed writer, plus one planted).
    pub tmp_after_kill: usize,
    /// `*.tmp` files still present once the restarted daemon is up (must be 0).
    pub tmp_after_restart: usize,
    /// Requests with a `completed` event and a valid file at the end (must be `requests`).
    pub finished_after_restart: usize,
    /// Journal lines that did not parse (a torn last line of the killed daemon).
    pub torn_journal_lines: usize,
}

impl Trial {
    pub fn ok(&self) -> bool {
        self.partial_or_corrupt == 0
            && self.completed_missing_or_wrong == 0
            && self.tmp_after_restart == 0
            && self.finished_after_restart == self.requests
    }
}

pub fn prompt(i: usize) -> Vec<u32> {
    (0..3 + i % 13)
        .map(|j| ((i * 7 + j * 13) % 500 + 1) as u32)
        .collect()
}

pub fn id(i: usize) -> String {
    format!("r{i:04}")
}

/// Writes the daemon config into `dir` (output `dir/out`, socket `dir/d.sock`).
pub fn write_config(dir: &Path, model: &Path, max_waiting: usize) -> PathBuf {
    let config = format!(
        "[model]\npath = {model:?}\nthreads = 2\n[engine]\nlayer_ids = [0, 2, 4]\n\
         max_num_batched_tokens = 64\nmax_waiting = {max_waiting}\n\
         [output]\ndir = \"out\"\n[socket]\npath = \"d.sock\"\n[logging]\nformat = \"json\"\n"
    );
    let path = dir.join("c.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// Starts `hsx serve` and waits until its socket answers. The caller ends it with [`sigkill`]
/// (which waits for it).
#[allow(clippy::zombie_processes)]
pub fn start(bin: &Path, dir: &Path) -> Child {
    let mut child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(dir.join("c.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn hsx serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Ready once `status` answers: the engine is up (and stale tmp files are gone).
        if let Ok(mut c) = Client::connect(&dir.join("d.sock"))
            && c.send(&json!({"op": "status"})).is_ok()
            && matches!(c.recv(), Ok(Some(v)) if v["event"] == "status")
        {
            return child;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("daemon did not start");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn sigkill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A line-based socket client.
pub struct Client {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
}

impl Client {
    pub fn connect(socket: &Path) -> std::io::Result<Client> {
        let s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(Client {
            rd: BufReader::new(s.try_clone()?),
            wr: s,
        })
    }
    pub fn send(&mut self, v: &Value) -> std::io::Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        self.wr.write_all(line.as_bytes())
    }
    pub fn recv(&mut self) -> std::io::Result<Option<Value>> {
        let mut line = String::new();
        if self.rd.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        Ok(serde_json::from_str(&line).ok())
    }
}

/// Checks one file against its prompt: parses, `[T, K, H]` with T = prompt length, the right
/// token ids, finite values.
pub fn file_ok(path: &Path, tokens: &[u32]) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let Ok(st) = safetensors::SafeTensors::deserialize(&bytes) else {
        return false;
    };
    let (Ok(hs), Ok(tok)) = (st.tensor("hidden_states"), st.tensor("token_ids")) else {
        return false;
    };
    if hs.shape().len() != 3 || hs.shape()[0] != tokens.len() || tok.shape() != [tokens.len()] {
        return false;
    }
    let ids: Vec<i64> = bytemuck::pod_collect_to_vec(tok.data());
    if ids.iter().zip(tokens).any(|(&a, &b)| a != i64::from(b)) {
        return false;
    }
    match hs.dtype() {
        safetensors::Dtype::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(hs.data())
            .iter()
            .all(|x| x.is_finite()),
        safetensors::Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, half::bf16>(hs.data())
            .iter()
            .all(|x| x.to_f32().is_finite()),
        _ => true,
    }
}

/// The journal's `completed` events (last per id) and the count of unparsable lines.
pub fn journal(out: &Path) -> (HashMap<String, PathBuf>, usize) {
    let text = std::fs::read_to_string(out.join("hsx-events.jsonl")).unwrap_or_default();
    let mut done = HashMap::new();
    let mut torn = 0;
    for line in text.lines() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v["event"] == "completed" => {
                let id = v["id"].as_str().unwrap_or_default().to_owned();
                done.insert(id, PathBuf::from(v["path"].as_str().unwrap_or_default()));
            }
            Ok(_) => {}
            Err(_) => torn += 1,
        }
    }
    (done, torn)
}

fn files(out: &Path, suffix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(out)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(suffix))
                .collect()
        })
        .unwrap_or_default()
}

/// (partial or corrupt files under final names, completed events with a missing/wrong file).
fn check_disk(out: &Path, n: usize) -> (usize, usize, HashMap<String, PathBuf>, usize) {
    let prompts: HashMap<String, Vec<u32>> = (0..n).map(|i| (id(i), prompt(i))).collect();
    let mut bad_files = 0;
    for f in files(out, ".safetensors") {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        if !prompts.get(&stem).is_some_and(|p| file_ok(&f, p)) {
            bad_files += 1;
        }
    }
    let (done, torn) = journal(out);
    let bad_events = done
        .iter()
        .filter(|(id, path)| !prompts.get(*id).is_some_and(|p| file_ok(path, p)))
        .count();
    (bad_files, bad_events, done, torn)
}

/// Submits the requests `ids` on one connection, reading the replies.
fn submit_all(socket: &Path, ids: &[usize]) {
    let Ok(mut c) = Client::connect(socket) else {
        return;
    };
    for &i in ids {
        let op = json!({"op": "submit", "id": id(i), "token_ids": prompt(i)});
        if c.send(&op).is_err() {
            return;
        }
    }
    for _ in ids {
        if !matches!(c.recv(), Ok(Some(_))) {
            return;
        }
    }
}

/// One trial in the fresh directory `dir`: `n` requests, a SIGKILL after a random delay below
/// `max_kill_ms`, a restart and a resumed run to the end.
pub fn run_trial(
    bin: &Path,
    model: &Path,
    dir: &Path,
    n: usize,
    seed: u64,
    max_kill_ms: u64,
) -> Trial {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    write_config(dir, model, n.max(1024));
    let out = dir.join("out");
    let socket = dir.join("d.sock");
    let mut t = Trial {
        requests: n,
        kill_after_ms: rng.random_range(0..max_kill_ms.max(1)),
        ..Trial::default()
    };
    let child = start(bin, dir);
    let all: Vec<usize> = (0..n).collect();
    let submitter = {
        let socket = socket.clone();
        std::thread::spawn(move || submit_all(&socket, &all))
    };
    std::thread::sleep(Duration::from_millis(t.kill_after_ms));
    sigkill(child);
    let _ = submitter.join();

    let (bad_files, bad_events, done, torn) = check_disk(&out, n);
    t.partial_or_corrupt += bad_files;
    t.completed_missing_or_wrong += bad_events;
    t.completed_before_kill = done.len();
    t.torn_journal_lines += torn;
    // What a kill in the middle of a write leaves behind, in case this one did not.
    std::fs::write(out.join("planted.safetensors.tmp"), b"half a file").unwrap();
    t.tmp_after_kill = files(&out, ".tmp").len();

    let old_seq = max_seq(&out);
    let child = start(bin, dir);
    t.tmp_after_restart = files(&out, ".tmp").len();
    // Subscribe first (everything since seq 0), then resubmit what is not done.
    let mut sub = Client::connect(&socket).expect("subscribe connection");
    sub.send(&json!({"op": "subscribe", "from_seq": 0}))
        .unwrap();
    let mut completed: HashSet<String> = HashSet::new();
    for _round in 0..3 {
        let todo: Vec<usize> = (0..n)
            .filter(|&i| {
                let path = out.join(format!("{}.safetensors", id(i)));
                !(completed.contains(&id(i)) || done.contains_key(&id(i)) && path.exists())
            })
            .collect();
        if todo.is_empty() {
            break;
        }
        let socket2 = socket.clone();
        let todo_ids: HashSet<String> = todo.iter().map(|&i| id(i)).collect();
        let submitter = std::thread::spawn(move || submit_all(&socket2, &todo));
        let mut ended: HashSet<String> = HashSet::new();
        while ended.len() < todo_ids.len() {
            let Ok(Some(v)) = sub.recv() else { break };
            let Some(eid) = v["id"].as_str() else {
                continue;
            };
            if !todo_ids.contains(eid) {
                continue;
            }
            // Replayed events of the killed run come first; only the newest run's count.
            if v["seq"].as_u64().is_some_and(|s| s <= old_seq) {
                continue;
            }
            match v["event"].as_str() {
                Some("completed") => {
                    completed.insert(eid.to_owned());
                    ended.insert(eid.to_owned());
                }
                Some("failed") => {
                    ended.insert(eid.to_owned());
                }
                _ => {}
            }
        }
        let _ = submitter.join();
    }
    sigkill(child);
    let (bad_files, bad_events, done, torn) = check_disk(&out, n);
    t.partial_or_corrupt += bad_files;
    t.completed_missing_or_wrong += bad_events;
    t.torn_journal_lines += torn;
    t.finished_after_restart = (0..n)
        .filter(|&i| done.get(&id(i)).is_some_and(|p| file_ok(p, &prompt(i))))
        .count();
    t
}

/// The largest `seq` in the journal.
fn max_seq(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out.join("hsx-events.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["seq"].as_u64())
        .max()
        .unwrap_or(0)
}
