//! Writes the checkpoint file ([`crate::checkpoint`]): one [`Record`] line appended per prepare
//! or unprepare, and from time to time a fresh snapshot in place of snapshot and records
//! (compaction, written by rename as before).
//!
//! An append is one `write` of the whole line to a file opened for appending: on the kubelet's
//! disk (ext4) it costs a few microseconds, where rewriting every prepared claim and renaming it
//! over the old file costs hundreds of them (ext4 starts writing the new file's blocks out at
//! such a rename) and milliseconds at p99, inside the time the runtime waits for the prepare.
//! Durability is the same as before (no fsync; see [`Checkpoint::save`]): the records describe one
//! boot. An append that failed may have left part of a line, so the next write is a compaction.
//!
//! Compaction happens when the file is opened (agent start), at an unprepare once
//! [`COMPACT_AFTER`] records have accumulated (unprepare is not on a container's start path),
//! and at any write once [`COMPACT_ALWAYS_AFTER`] have (a node that only ever prepares).

use crate::checkpoint::{Checkpoint, PreparedClaim, Record};
use crate::error::{DraError, Result, io_err};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Records after which an unprepare compacts.
pub const COMPACT_AFTER: usize = 512;
/// Records after which any write compacts.
pub const COMPACT_ALWAYS_AFTER: usize = 8192;

/// The open checkpoint file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Option<std::fs::File>,
    records: usize,
}

impl Journal {
    /// Writes `cp` as a fresh snapshot at `path` and opens it for appending.
    pub fn open(path: &Path, cp: &Checkpoint) -> Result<Journal> {
        let mut j = Journal {
            path: path.to_path_buf(),
            file: None,
            records: 0,
        };
        j.compact(cp)?;
        Ok(j)
    }

    /// Records appended since the last snapshot.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Replaces the file by a snapshot of `cp` (rename) and reopens it for appending.
    pub fn compact(&mut self, cp: &Checkpoint) -> Result<()> {
        self.file = None;
        cp.save(&self.path)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io_err("open for appending", &self.path))?;
        self.file = Some(f);
        self.records = 0;
        Ok(())
    }

    /// Records that `uid` was prepared as `claim`; `cp` already holds the change (the snapshot
    /// written instead when a compaction is due).
    pub fn prepared(&mut self, cp: &Checkpoint, uid: &str, claim: &PreparedClaim) -> Result<()> {
        let r = Record::Prepared {
            uid: uid.to_string(),
            claim: claim.clone(),
        };
        self.write(cp, &r, COMPACT_ALWAYS_AFTER)
    }

    /// Records that `uid` was unprepared; `cp` already holds the change.
    pub fn unprepared(&mut self, cp: &Checkpoint, uid: &str) -> Result<()> {
        let r = Record::Unprepared {
            uid: uid.to_string(),
        };
        self.write(cp, &r, COMPACT_AFTER)
    }

    fn write(&mut self, cp: &Checkpoint, r: &Record, compact_after: usize) -> Result<()> {
        if self.records >= compact_after {
            return self.compact(cp);
        }
        let Some(f) = self.file.as_mut() else {
            // The last append failed (perhaps halfway): start from a snapshot.
            return self.compact(cp);
        };
        let mut line = serde_json::to_vec(r).map_err(|source| DraError::Json {
            what: "DRA checkpoint record",
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        if let Err(e) = f.write_all(&line) {
            self.file = None;
            return Err(io_err("append to", &self.path)(e));
        }
        self.records += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::RdmaLimits;
    use crate::checkpoint::PreparedDevice;

    fn claim(name: &str) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: name.into(),
            devices: vec![PreparedDevice {
                request: "rdma".into(),
                pool: "n".into(),
                device: "erdma-0".into(),
                ibdev: "erdma_0".into(),
                cdi_ids: vec![format!("x/claim={name}")],
                share_id: None,
                shares: 1,
                limits: RdmaLimits {
                    hca_handle: 4,
                    hca_object: 10,
                },
                admin: false,
            }],
            cdi_spec: PathBuf::from(format!("/cdi/{name}.json")),
        }
    }

    #[test]
    fn appended_records_replay_to_the_same_claims() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        let mut cp = Checkpoint {
            version: crate::checkpoint::VERSION,
            ..Default::default()
        };
        cp.claims.insert("a".into(), claim("a"));
        let mut j = Journal::open(&p, &cp).expect("open");
        let snapshot_only = std::fs::read(&p).expect("read");
        assert_eq!(snapshot_only.iter().filter(|&&b| b == b'\n').count(), 1);
        for uid in ["b", "c"] {
            cp.claims.insert(uid.into(), claim(uid));
            j.prepared(&cp, uid, &claim(uid)).expect("append");
        }
        cp.claims.remove("a");
        j.unprepared(&cp, "a").expect("append");
        assert_eq!(j.records(), 3);
        let text = std::fs::read_to_string(&p).expect("read");
        assert_eq!(
            text.lines().count(),
            4,
            "snapshot and three records:\n{text}"
        );
        assert!(
            text.lines()
                .nth(3)
                .is_some_and(|l| l == r#"{"unprepared":{"uid":"a"}}"#)
        );
        assert_eq!(Checkpoint::load(&p).expect("load"), cp);
        // Reopening compacts: one snapshot line with the same claims.
        drop(j);
        let j = Journal::open(&p, &Checkpoint::load(&p).expect("load")).expect("reopen");
        assert_eq!(j.records(), 0);
        assert_eq!(
            std::fs::read_to_string(&p).expect("read").lines().count(),
            1
        );
        assert_eq!(Checkpoint::load(&p).expect("load"), cp);
    }

    #[test]
    fn an_unfinished_last_record_is_left_out_and_a_corrupt_one_is_an_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        let mut cp = Checkpoint {
            version: crate::checkpoint::VERSION,
            ..Default::default()
        };
        cp.claims.insert("a".into(), claim("a"));
        let mut j = Journal::open(&p, &cp).expect("open");
        cp.claims.insert("b".into(), claim("b"));
        j.prepared(&cp, "b", &claim("b")).expect("append");
        let good = std::fs::read(&p).expect("read");
        // The process died inside the next append (no newline): b stays, the half record goes.
        let mut torn = good.clone();
        torn.extend_from_slice(br#"{"prepared":{"uid":"c","cla"#);
        std::fs::write(&p, &torn).expect("write");
        assert_eq!(Checkpoint::load(&p).expect("load"), cp);
        // A complete line that is not a record is corruption, not an unfinished append.
        let mut bad = good;
        bad.extend_from_slice(b"{\"prepared\":7}\n");
        std::fs::write(&p, &bad).expect("write");
        assert!(Checkpoint::load(&p).is_err());
    }

    #[test]
    fn a_version_1_file_is_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        let v1 = serde_json::json!({"version": 1, "claims": {"a": claim("a")}});
        std::fs::write(&p, serde_json::to_vec_pretty(&v1).expect("json")).expect("write");
        let cp = Checkpoint::load(&p).expect("load");
        assert_eq!(cp.version, 1);
        assert_eq!(cp.claims["a"], claim("a"));
    }

    #[test]
    fn unprepares_compact_after_enough_records() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        let mut cp = Checkpoint::default();
        let mut j = Journal::open(&p, &cp).expect("open");
        for i in 0..COMPACT_AFTER {
            let uid = format!("u{i}");
            cp.claims.insert(uid.clone(), claim(&uid));
            j.prepared(&cp, &uid, &claim(&uid)).expect("append");
        }
        assert_eq!(j.records(), COMPACT_AFTER);
        cp.claims.remove("u0");
        j.unprepared(&cp, "u0").expect("compacts");
        assert_eq!(j.records(), 0);
        assert_eq!(
            std::fs::read_to_string(&p).expect("read").lines().count(),
            1
        );
        assert_eq!(Checkpoint::load(&p).expect("load").claims, cp.claims);
    }
}
