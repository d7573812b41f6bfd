//! The journal on disk: one JSON line per event, appended and fsync'd before the event is fanned
//! out, so a subscriber resuming with `from_seq` after a restart misses nothing.
//!
//! The file keeps at most about twice the in-memory capacity: when it grows past that, it is
//! rewritten (tmp, fsync, rename) with the events the memory journal still keeps. At start-up a
//! torn last line (a crash mid-append) or any other unreadable line is skipped with a warning.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use super::{EventHubOptions, EventJournal};
use crate::actors::messages::CompletionEvent;

/// The append side of the disk journal.
#[derive(Debug)]
pub struct DiskJournal {
    path: PathBuf,
    file: File,
    /// Lines in the file now.
    lines: usize,
    /// Lines allowed before a compaction.
    max_lines: usize,
}

impl DiskJournal {
    /// Opens (creating) the journal at `path`; returns it and the last `capacity` events read.
    pub fn open(path: &Path, capacity: usize) -> io::Result<(Self, Vec<CompletionEvent>)> {
        let (events, bad, total) = read_events(path)?;
        let skip = events.len().saturating_sub(capacity);
        let events: Vec<CompletionEvent> = events.into_iter().skip(skip).collect();
        if bad > 0 {
            tracing::warn!(path = %path.display(), bad, "skipped unreadable event journal lines");
        }
        let max_lines = capacity.saturating_mul(2).max(16);
        let mut journal = Self {
            path: path.to_owned(),
            file: open_append(path)?,
            lines: total,
            max_lines,
        };
        if bad > 0 || skip > 0 {
            journal.rewrite(&events)?;
        }
        Ok((journal, events))
    }

    /// Appends one event and makes it durable.
    pub fn append(&mut self, event: &CompletionEvent) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        self.lines += 1;
        Ok(())
    }

    /// Whether the file has grown enough to be rewritten with only the kept events.
    pub fn wants_compaction(&self) -> bool {
        self.lines > self.max_lines
    }

    /// Replaces the file's content with `events` (atomically: tmp, fsync, rename).
    pub fn rewrite<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a CompletionEvent>,
    ) -> io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut out = io::BufWriter::new(File::create(&tmp)?);
        let mut lines = 0;
        for e in events {
            serde_json::to_writer(&mut out, e).map_err(io::Error::other)?;
            out.write_all(b"\n")?;
            lines += 1;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            // Some filesystems cannot fsync a directory; the rename is still in place.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        self.file = open_append(&self.path)?;
        self.lines = lines;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// An [`EventJournal`] restored from the disk journal at `path`, appending to it from now on.
pub fn open_journal(options: &EventHubOptions, path: &Path) -> io::Result<EventJournal> {
    let (disk, events) = DiskJournal::open(path, options.journal_capacity)?;
    Ok(EventJournal::restore(options, events).with_disk(disk))
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Every readable event in the file, the number of unreadable lines and the number of lines.
fn read_events(path: &Path) -> io::Result<(Vec<CompletionEvent>, usize, usize)> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0, 0)),
        Err(e) => return Err(e),
    };
    let mut events = Vec::new();
    let (mut bad, mut total) = (0, 0);
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        total += 1;
        match serde_json::from_slice::<CompletionEvent>(&line) {
            Ok(e) => events.push(e),
            Err(_) => bad += 1,
        }
    }
    Ok((events, bad, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::messages::{EventKind, RequestId};

    fn options(capacity: usize) -> EventHubOptions {
        EventHubOptions {
            journal_capacity: capacity,
            subscriber_capacity: 4,
            mailbox: 4,
        }
    }

    fn publish(j: &mut EventJournal, id: &str) -> u64 {
        let kind = EventKind::Completed {
            path: PathBuf::from(format!("/o/{id}.safetensors")),
            num_tokens: 3,
            layer_ids: vec![0, 2],
            bytes: 10,
            output_token_ids: vec![7],
        };
        j.publish(RequestId::new(id).unwrap(), kind).seq
    }

    #[test]
    fn survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut j = open_journal(&options(100), &path).unwrap();
        assert_eq!(publish(&mut j, "a"), 1);
        j.publish(
            RequestId::new("b").unwrap(),
            EventKind::Failed { error: "x".into() },
        );
        let before = j.replay_after(0).events;
        drop(j);
        let mut j = open_journal(&options(100), &path).unwrap();
        assert_eq!(j.replay_after(0).events, before);
        assert_eq!(publish(&mut j, "c"), 3);
    }

    #[test]
    fn torn_line_is_skipped_and_file_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut j = open_journal(&options(4), &path).unwrap();
        for i in 0..40 {
            publish(&mut j, &format!("r{i}"));
        }
        let lines = fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines <= 16 + 1, "{lines} lines");
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"seq\": 41, \"id\":").unwrap();
        drop(f);
        let mut j = open_journal(&options(4), &path).unwrap();
        let seqs: Vec<u64> = j.replay_after(0).events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [37, 38, 39, 40]);
        assert_eq!(publish(&mut j, "next"), 41);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(
            text.lines()
                .all(|l| serde_json::from_str::<CompletionEvent>(l).is_ok())
        );
    }
}
