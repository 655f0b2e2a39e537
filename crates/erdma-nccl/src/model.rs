//! The streaming analyser: feeds lines, keeps a bounded state per process, and groups processes
//! into jobs at the end.
//!
//! Memory is bounded by the number of distinct processes (at most [`MAX_PROCESSES`]) times small
//! capped collections, never by the length of the log.

use crate::diagnose::{self, ErrorKind};
use crate::event::{self, Event};
use crate::line::{Level, PrefixParser, SplitLine};
use crate::perf::{PerfCollector, PerfSummary};
use crate::prefix_cache::PrefixCache;
pub use crate::process::{FileState, ProblemSeen, Process, TransportCount};
use crate::reader::LineReader;
use crate::report::{self, AnalyzeReport, FileSummary};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufRead};
use std::sync::mpsc;

/// Most processes tracked; lines of further processes count towards the file only.
pub const MAX_PROCESSES: usize = 65_536;
/// Cap of small per-process collections (devices, interfaces, networks, comm ids, env values).
pub const MAX_ITEMS: usize = 64;
/// Longest sample message kept per problem.
pub const MAX_SAMPLE: usize = 400;

/// Kept lines handed from the reading stage to the analysing one, per batch (bytes, at least).
const BATCH_BYTES: usize = 64 * 1024;
/// Batches sent and not yet analysed, at most: the reader waits beyond (bounded memory).
const BATCHES_IN_FLIGHT: usize = 4;

/// Lines that may matter, copied out of the read buffer by the reading stage.
#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: Vec<Kept>,
}

/// One kept line of a [`Batch`]: it ends at `end` and starts where the previous one ended.
#[derive(Debug, Clone, Copy)]
struct Kept {
    no: u64,
    end: usize,
    marker: Option<usize>,
}

/// Options of an analysis.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Longest line in bytes; longer ones are cut.
    pub max_line: usize,
    /// Also collect nccl-tests / step-time figures.
    pub collect_perf: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_line: crate::reader::DEFAULT_MAX_LINE,
            collect_perf: false,
        }
    }
}

/// Streaming analyser over one or many inputs.
#[derive(Debug)]
pub struct Analyzer {
    opts: Options,
    parser: PrefixParser,
    foreign: diagnose::ForeignMatcher,
    processes: Vec<Process>,
    index: HashMap<String, usize>,
    last: Option<(usize, usize)>,
    prefixes: PrefixCache,
    scratch: String,
    files: Vec<FileState>,
    dropped_processes: u64,
}

impl Analyzer {
    /// A new analyser.
    pub fn new(opts: Options) -> Self {
        Self {
            opts,
            parser: PrefixParser::default(),
            foreign: diagnose::ForeignMatcher::default(),
            processes: Vec::new(),
            index: HashMap::new(),
            last: None,
            prefixes: PrefixCache::default(),
            scratch: String::new(),
            files: Vec::new(),
            dropped_processes: 0,
        }
    }

    /// Reads one whole input, line by line, in bounded memory.
    pub fn add_input<R: BufRead>(&mut self, name: &str, input: R) -> io::Result<()> {
        let file = self.begin_file(name);
        let mut reader = LineReader::new(input, self.opts.max_line);
        let mut no = 0u64;
        if self.opts.collect_perf {
            // The performance collector reads every line as text.
            reader.for_each_line(|line| {
                no += 1;
                self.line(file, no, &text_of(line));
            })?;
        } else {
            let (lines, nccl) = self.read_marked(file, &mut reader)?;
            let f = &mut self.files[file];
            f.lines += lines;
            f.nccl_lines += nccl;
        }
        let f = &mut self.files[file];
        f.truncated_lines = reader.truncated_lines();
        f.bytes = reader.bytes_read();
        Ok(())
    }

    /// Starts a new input and returns its index (for [`Analyzer::line`]).
    pub fn begin_file(&mut self, name: &str) -> usize {
        self.files.push(FileState {
            name: name.to_string(),
            lines: 0,
            nccl_lines: 0,
            truncated_lines: 0,
            bytes: 0,
            problems: BTreeMap::new(),
            versions: BTreeSet::new(),
            perf: self.opts.collect_perf.then(PerfCollector::default),
            perf_summary: None,
        });
        self.files.len() - 1
    }

    /// Feeds one line of input `file` (line number `no`, 1-based).
    pub fn line(&mut self, file: usize, no: u64, text: &str) {
        let Some(f) = self.files.get_mut(file) else {
            return;
        };
        f.lines += 1;
        if let Some(p) = f.perf.as_mut() {
            p.line(text);
        }
        let Some(split) = self.parser.split(text) else {
            self.foreign_line(file, no, text);
            return;
        };
        f.nccl_lines += 1;
        self.nccl_line(
            file,
            no,
            split.level,
            split.message,
            split.prefix_text().as_bytes(),
            false,
        );
    }

    /// The fast path of [`Analyzer::add_input`] in two stages: this thread reads, finds the lines
    /// and their markers, counts them and keeps the NCCL lines whose first bytes may matter (the
    /// INFO pre-filter of [`Analyzer::marked_line`]) and the other lines, copied into batches; a second thread analyses
    /// them in order. The pre-filter drops most lines, so the stages cost about the same and a
    /// log is read at the speed of the slower one. Without a second thread (it cannot be
    /// started) everything runs here. Returns the lines and the NCCL lines read.
    fn read_marked<R: BufRead>(
        &mut self,
        file: usize,
        reader: &mut LineReader<R>,
    ) -> io::Result<(u64, u64)> {
        let (full_tx, full_rx) = mpsc::sync_channel::<Batch>(BATCHES_IN_FLIGHT);
        let (empty_tx, empty_rx) = mpsc::channel::<Batch>();
        let mut no = 0u64;
        let mut nccl = 0u64;
        let this = &mut *self;
        let staged = std::thread::scope(|s| {
            let analyse = move || {
                for mut batch in full_rx {
                    this.analyse(file, &batch);
                    batch.bytes.clear();
                    batch.lines.clear();
                    // The reader has stopped when this fails: nothing to recycle.
                    let _ = empty_tx.send(batch);
                }
            };
            let stage = std::thread::Builder::new()
                .name("nccl-analyse".into())
                .spawn_scoped(s, analyse);
            let Ok(stage) = stage else {
                return None;
            };
            let mut batch = Batch::default();
            let read = reader.for_each_marked_line(|line, marker| {
                no += 1;
                let keep = match marker.and_then(|n| crate::line::split_at_marker(line, n)) {
                    Some(raw) => {
                        nccl += 1;
                        raw.level != Level::Info || event::may_classify(raw.message)
                    }
                    // Looked at by the analysing stage, which has less to do.
                    None => true,
                };
                if keep {
                    batch.bytes.extend_from_slice(line);
                    batch.lines.push(Kept {
                        no,
                        end: batch.bytes.len(),
                        marker,
                    });
                    if batch.bytes.len() >= BATCH_BYTES {
                        let next = empty_rx.try_recv().unwrap_or_default();
                        // Fails only when the analysing stage panicked: the join below says so.
                        let _ = full_tx.send(std::mem::replace(&mut batch, next));
                    }
                }
            });
            if !batch.lines.is_empty() {
                let _ = full_tx.send(batch);
            }
            drop(full_tx);
            if let Err(panic) = stage.join() {
                std::panic::resume_unwind(panic);
            }
            Some(read)
        });
        match staged {
            Some(read) => read.map(|()| (no, nccl)),
            None => {
                // No second thread: both stages here, line by line.
                reader.for_each_marked_line(|line, marker| {
                    no += 1;
                    nccl += u64::from(self.marked_line(file, no, line, marker));
                })?;
                Ok((no, nccl))
            }
        }
    }

    /// The analysing stage of [`Analyzer::read_marked`]: the kept lines of one batch, in order.
    fn analyse(&mut self, file: usize, batch: &Batch) {
        let mut start = 0;
        for k in &batch.lines {
            let line = &batch.bytes[start..k.end];
            start = k.end;
            match k.marker.and_then(|n| crate::line::split_at_marker(line, n)) {
                Some(raw) => {
                    self.nccl_line(file, k.no, raw.level, &text_of(raw.message), raw.pre, true)
                }
                None => {
                    if self.foreign.may_match(line) {
                        self.foreign_line(file, k.no, &text_of(line));
                    }
                }
            }
        }
    }

    /// [`Analyzer::line`] on raw bytes whose ` NCCL ` marker is known ([`crate::line::marker`]),
    /// with the same result except for the line counts, which the caller keeps: returns whether
    /// it is an NCCL line. Invalid UTF-8 is read lossily. Only the parts a line needs are checked
    /// and turned into text: the message of an NCCL line whose first bytes may matter, its prefix
    /// when the message matters, a foreign line only when one of its patterns is in it.
    #[inline]
    fn marked_line(&mut self, file: usize, no: u64, bytes: &[u8], marker: Option<usize>) -> bool {
        let Some(raw) = marker.and_then(|n| crate::line::split_at_marker(bytes, n)) else {
            if self.foreign.may_match(bytes) {
                self.foreign_line(file, no, &text_of(bytes));
            }
            return false;
        };
        if raw.level == Level::Info && !event::may_classify(raw.message) {
            // Most lines of a log end here, before any UTF-8 check.
            return true;
        }
        self.nccl_line(file, no, raw.level, &text_of(raw.message), raw.pre, true);
        true
    }

    /// The part of [`Analyzer::line`] after an NCCL line's marker was found; `pre` is the raw
    /// prefix, read as text only when the message matters (and its process is not in the
    /// [`PrefixCache`] when `cached`). Lossy conversion of the pieces equals that of the whole
    /// line, since the cuts are next to ASCII bytes.
    fn nccl_line(
        &mut self,
        file: usize,
        no: u64,
        level: Level,
        message: &str,
        raw_pre: &[u8],
        cached: bool,
    ) {
        let ev = event::classify(message, level != Level::Info);
        if matches!(ev, Event::Other) && level == Level::Info {
            // Most lines of a log end here: their prefix is never parsed.
            return;
        }
        let hit = if cached {
            self.prefixes.get(file, raw_pre)
        } else {
            None
        };
        let pi = match hit {
            Some(pi) => pi,
            None => {
                let pre = text_of(raw_pre);
                let l = SplitLine::new(level, message, &pre).parse();
                let Some(pi) = self.process_index(file, l.process, l.host) else {
                    return;
                };
                if cached {
                    self.prefixes.put(file, raw_pre, pi);
                }
                pi
            }
        };
        let pi = match ev {
            Event::Version(_) if !self.processes[pi].versions.is_empty() => {
                match self.next_incarnation(file, pi) {
                    Some(pi) => pi,
                    None => return,
                }
            }
            _ => pi,
        };
        let p = &mut self.processes[pi];
        let problem = |p: &mut Process, kind: ErrorKind| {
            if let Some(seen) = p.problems.get_mut(&kind) {
                seen.count += 1;
                return;
            }
            // The source location of a WARN line comes first in its sample message.
            let pre = text_of(raw_pre);
            let msg = match SplitLine::new(level, message, &pre).parse().location {
                Some(loc) => format!("{loc} {message}"),
                None => message.to_string(),
            };
            record(&mut p.problems, kind, file, no, &msg);
        };
        match ev {
            Event::Version(v) => insert_str(&mut p.versions, v),
            Event::IbUsing {
                devices,
                oob,
                relaxed_ordering,
            } => {
                for d in devices {
                    insert_capped(
                        &mut p.ib_devices,
                        (
                            d.index,
                            d.name.to_string(),
                            d.port,
                            d.link_layer.to_string(),
                        ),
                    );
                }
                if let Some(o) = oob {
                    insert_str(&mut p.ib_oob, o);
                }
                p.relaxed_ordering |= relaxed_ordering;
            }
            Event::SocketUsing(ifaces) => {
                for i in ifaces {
                    insert_str(&mut p.socket_ifaces, i);
                }
            }
            Event::UsingNetwork(n) => insert_str(&mut p.networks, n),
            Event::NetPluginReady(n) => insert_str(&mut p.plugins_ready, n),
            Event::NetPluginFailed(n) => insert_str(&mut p.plugins_failed, n),
            Event::Comm {
                rank,
                nranks,
                nnodes,
                comm_id,
                complete,
            } => {
                if let Some(r) = rank {
                    insert_capped(&mut p.ranks, r);
                }
                if let Some(n) = nranks {
                    p.nranks = Some(p.nranks.map_or(n, |m| m.max(n)));
                }
                if let Some(n) = nnodes {
                    p.nnodes = Some(p.nnodes.map_or(n, |m| m.max(n)));
                }
                if let Some(c) = comm_id {
                    insert_capped(&mut p.comm_ids, c);
                }
                p.init_complete |= complete;
            }
            Event::Channel(c) => {
                // Label in a reused buffer: channel lines are frequent, new labels are rare.
                let label = &mut self.scratch;
                label.clear();
                label.push_str(c.family);
                if !c.kind.is_empty() {
                    label.push('/');
                    label.push_str(c.kind);
                }
                let count = |t: &mut TransportCount| {
                    t.connections += 1;
                    t.gdr += u64::from(c.gdr);
                    if let Some(d) = c.net_dev {
                        insert_capped(&mut t.net_devs, d);
                    }
                };
                if let Some(t) = p.transports.get_mut(label.as_str()) {
                    count(t);
                } else if p.transports.len() < MAX_ITEMS {
                    count(p.transports.entry(label.clone()).or_default());
                }
            }
            Event::GdrDecision { net, enabled, hca } => {
                if p.gdr_decisions.len() < MAX_ITEMS {
                    p.gdr_decisions
                        .insert((net.to_string(), hca.to_string()), enabled);
                }
            }
            Event::EnvSet { name, value } => {
                let room = p.env.len() < MAX_ITEMS;
                match p.env.get_mut(name) {
                    Some(v) if v == value => {}
                    Some(v) => *v = value.to_string(),
                    None if room => {
                        p.env.insert(name.to_string(), value.to_string());
                    }
                    None => {}
                }
            }
            Event::GidInUse(g) => insert_capped(&mut p.gids_in_use, g),
            Event::ReturnCode(c) => {
                if p.first_result_code.is_none() && c != 0 {
                    p.first_result_code = Some(c);
                }
            }
            Event::Problem(kind) => {
                if !kind.requires_warn_level() || level != Level::Info {
                    problem(p, kind);
                }
            }
            Event::UnknownWarn | Event::Other => {
                if level == Level::Warn || level == Level::Error {
                    problem(p, ErrorKind::OtherWarning);
                }
            }
        }
    }

    fn foreign_line(&mut self, file: usize, no: u64, text: &str) {
        let f = &mut self.files[file];
        if let Some(v) = text.trim_start().strip_prefix("NCCL version ") {
            insert_capped(
                &mut f.versions,
                v.split_whitespace().next().unwrap_or("").to_string(),
            );
            return;
        }
        if let Some(kind) = self.foreign.classify(text) {
            record(&mut f.problems, kind, file, no, text.trim());
        }
    }

    /// A second version banner of process `pi`'s `host:pid`: a new run of it, tracked apart from
    /// now on (lines of this key go to the new process).
    fn next_incarnation(&mut self, file: usize, pi: usize) -> Option<usize> {
        if self.processes.len() >= MAX_PROCESSES {
            self.dropped_processes += 1;
            return None;
        }
        let old = &self.processes[pi];
        let next = Process {
            key: old.key.clone(),
            host: old.host.clone(),
            incarnation: old.incarnation + 1,
            files: BTreeSet::from([file]),
            ..Process::default()
        };
        self.processes.push(next);
        let npi = self.processes.len() - 1;
        self.index.insert(self.processes[npi].key.clone(), npi);
        self.last = Some((file, npi));
        self.prefixes.clear();
        Some(npi)
    }

    fn process_index(&mut self, file: usize, key: &str, host: &str) -> Option<usize> {
        // Lines without a prefix belong to one anonymous process per file.
        let anon;
        let key = if key.is_empty() {
            anon = format!("<{}>", self.files[file].name);
            anon.as_str()
        } else {
            key
        };
        if let Some((f, pi)) = self.last
            && f == file
            && self.processes[pi].key == key
        {
            return Some(pi);
        }
        let pi = match self.index.get(key) {
            Some(&pi) => pi,
            None => {
                if self.processes.len() >= MAX_PROCESSES {
                    self.dropped_processes += 1;
                    return None;
                }
                self.processes.push(Process {
                    key: key.to_string(),
                    host: host.to_string(),
                    ..Process::default()
                });
                self.index.insert(key.to_string(), self.processes.len() - 1);
                self.processes.len() - 1
            }
        };
        insert_capped(&mut self.processes[pi].files, file);
        self.last = Some((file, pi));
        Some(pi)
    }

    /// Ends the analysis: groups processes into jobs and builds the report.
    pub fn finish(mut self) -> AnalyzeReport {
        self.build_report()
    }

    /// Like [`Analyzer::finish`], also returning the performance figures of each input (empty
    /// unless [`Options::collect_perf`] was set).
    pub fn finish_with_perf(mut self) -> (AnalyzeReport, Vec<PerfSummary>) {
        let report = self.build_report();
        let perfs = self
            .files
            .iter_mut()
            .map(|f| f.perf_summary.take().unwrap_or_default())
            .collect();
        (report, perfs)
    }

    fn build_report(&mut self) -> AnalyzeReport {
        for f in &mut self.files {
            f.perf_summary = f.perf.take().map(PerfCollector::finish);
        }
        let groups = group_jobs(&self.processes, self.files.len());
        let files: Vec<FileSummary> = self
            .files
            .iter()
            .map(|f| FileSummary {
                name: f.name.clone(),
                lines: f.lines,
                nccl_lines: f.nccl_lines,
                truncated_lines: f.truncated_lines,
                bytes: f.bytes,
            })
            .collect();
        report::build(
            &self.processes,
            &self.files,
            groups,
            files,
            self.dropped_processes,
        )
    }
}

/// Groups process indexes into jobs: processes sharing a communicator id are one job; processes
/// with none join the only job of their file, or form one job per file. Files with no process at
/// all get a job of their own (their foreign problems still need a home).
/// Returns `(process indexes, file indexes)` per job.
pub fn group_jobs(processes: &[Process], nfiles: usize) -> Vec<(Vec<usize>, BTreeSet<usize>)> {
    let n = processes.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    // The `host:pid` keys of each root's job: one job never holds two runs of one process.
    let mut keys: Vec<BTreeSet<&str>> = processes
        .iter()
        .map(|p| BTreeSet::from([p.key.as_str()]))
        .collect();
    fn union(parent: &mut [usize], keys: &mut [BTreeSet<&str>], a: usize, b: usize) -> bool {
        let (ra, rb) = (find(parent, a), find(parent, b));
        if ra == rb {
            return true;
        }
        if !keys[ra].is_disjoint(&keys[rb]) {
            return false;
        }
        let (lo, hi) = (ra.min(rb), ra.max(rb));
        parent[hi] = lo;
        let moved = std::mem::take(&mut keys[hi]);
        keys[lo].extend(moved);
        true
    }
    let mut by_comm: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, p) in processes.iter().enumerate() {
        for c in &p.comm_ids {
            let members = by_comm.entry(*c).or_default();
            if !members.iter().any(|&j| union(&mut parent, &mut keys, i, j)) {
                members.push(i);
            }
        }
    }
    // Orphans (no communicator id): per file.
    for file in 0..nfiles {
        let members: Vec<usize> = (0..n)
            .filter(|&i| processes[i].files.contains(&file))
            .collect();
        let mut roots: BTreeSet<usize> = BTreeSet::new();
        for &i in &members {
            if !processes[i].comm_ids.is_empty() {
                roots.insert(find(&mut parent, i));
            }
        }
        let orphans: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| processes[i].comm_ids.is_empty())
            .collect();
        let anchor = if roots.len() == 1 {
            roots.first().copied()
        } else {
            orphans.first().copied()
        };
        if let Some(a) = anchor {
            for &o in &orphans {
                union(&mut parent, &mut keys, a, o);
            }
        }
    }
    let mut jobs: BTreeMap<usize, (Vec<usize>, BTreeSet<usize>)> = BTreeMap::new();
    for (i, p) in processes.iter().enumerate() {
        let r = find(&mut parent, i);
        let e = jobs.entry(r).or_default();
        e.0.push(i);
        e.1.extend(p.files.iter().copied());
    }
    let mut out: Vec<(Vec<usize>, BTreeSet<usize>)> = jobs.into_values().collect();
    for file in 0..nfiles {
        if !out.iter().any(|(_, files)| files.contains(&file)) {
            out.push((Vec::new(), BTreeSet::from([file])));
        }
    }
    out
}

/// `bytes` as text: borrowed when valid UTF-8 (`from_utf8` is much faster than the lossy scan on
/// the usual valid input), else with U+FFFD for each invalid sequence.
fn text_of(bytes: &[u8]) -> Cow<'_, str> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8. (`is_ascii` reads a word at a time; `from_utf8` costs
        // several times more on the short pieces of a log line.)
        return Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    match std::str::from_utf8(bytes) {
        Ok(t) => Cow::Borrowed(t),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

fn insert_str(set: &mut BTreeSet<String>, v: &str) {
    if !set.contains(v) && set.len() < MAX_ITEMS {
        set.insert(v.to_string());
    }
}

fn insert_capped<T: Ord>(set: &mut BTreeSet<T>, v: T) {
    if set.len() < MAX_ITEMS || set.contains(&v) {
        set.insert(v);
    }
}

fn record(
    map: &mut BTreeMap<ErrorKind, ProblemSeen>,
    kind: ErrorKind,
    file: usize,
    line: u64,
    msg: &str,
) {
    map.entry(kind)
        .and_modify(|p| p.count += 1)
        .or_insert_with(|| ProblemSeen {
            count: 1,
            file,
            line,
            message: bounded(msg),
        });
}

fn bounded(s: &str) -> String {
    if s.len() <= MAX_SAMPLE {
        return s.to_string();
    }
    let mut end = MAX_SAMPLE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
