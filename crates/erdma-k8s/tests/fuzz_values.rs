//! Fuzzing the values-file reader of `erdmactl install -f FILE` (`Values::from_values_file`: YAML
//! or JSON, coalesced over the chart's defaults, checked against the chart's schema): arbitrary
//! bytes, the chart's own `values.yaml` and the CI values files of `deploy/helm/ci/` mutated,
//! values files built from the chart's real keys with hostile values, and the YAML resource
//! attacks (alias expansion "billion laughs", deep nesting, anchor storms, huge keys).
//!
//! Every input must give `Ok` or `Err`, never a panic, a stack overflow or unbounded memory. A
//! counting global allocator measures the peak heap of the attacks: serde-saphyr's default budget
//! (depth 64, 50 000 aliases, 1 000 000 events and recorded anchor events, the alias/anchor
//! ratio) must refuse them with an error while the heap stays within a fixed bound, whatever the
//! expansion would have been. Time is bounded by the same budget (events, not wall-clock, are
//! counted); the generous 30 s per attack below only catches a hang on a loaded machine.

use erdma_k8s::install::{CHART_VALUES_YAML, Values, check_schema, parse_values_file};
use proptest::prelude::*;
use proptest::sample::Index;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

struct Counting;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    let _ = HELD.try_with(|h| {
        let now = h.get().saturating_add(n);
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn sub(n: usize) {
    let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only touches
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: same layout, as the caller promised.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Reads `text` as `erdmactl install -f` does; returns whether it was accepted, the peak heap
/// above what was held before, and the time taken.
fn read(text: &str) -> (bool, usize, Duration) {
    let base = HELD.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let t = Instant::now();
    let ok = match Values::from_values_file(text) {
        Ok(v) => {
            // What install does next with accepted values.
            let _ = v.validate();
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    };
    (ok, PEAK.with(Cell::get) - base, t.elapsed())
}

const MIB: usize = 1 << 20;

/// The chart's values files: its defaults and every CI values and contract file.
fn real_files() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/ci");
    let mut out = vec![CHART_VALUES_YAML.to_string()];
    for dir in ["values", "contract"] {
        let mut names: Vec<_> = std::fs::read_dir(root.join(dir))
            .expect("deploy/helm/ci values")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        names.sort();
        out.extend(
            names
                .iter()
                .map(|p| std::fs::read_to_string(p).expect("read")),
        );
    }
    out
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Duplicate(Index, usize),
    Truncate(Index),
}

/// YAML's structural bytes and values that break schemas.
fn nasty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8),
        prop::sample::select(vec![
            &b"\n"[..],
            b"  ",
            b"\t",
            b": ",
            b"- ",
            b"{",
            b"}",
            b"[",
            b"]",
            b"&a ",
            b"*a",
            b"<<: *a",
            b"!!binary ",
            b"!!str ",
            b"---\n",
            b"...\n",
            b"? ",
            b"|\n",
            b">-\n",
            b"\"",
            b"'",
            b"#",
            b"~",
            b"null",
            b".inf",
            b"-.nan",
            b"0x7fffffffffffffffff",
            b"1e400",
            b"\0",
            b"\xef\xbb\xbf",
            b"\xff",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        4 => (any::<Index>(), nasty()).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<Index>(), 0usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        2 => (any::<Index>(), 0usize..256).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    let at = |i: &Index, len: usize| i.index(len + 1);
    for e in edits {
        match e {
            Edit::Flip(i, b) => {
                if !data.is_empty() {
                    let p = i.index(data.len());
                    data[p] ^= b | 1;
                }
            }
            Edit::Insert(i, bytes) => {
                let p = at(i, data.len());
                data.splice(p..p, bytes.iter().copied());
            }
            Edit::Delete(i, n) => {
                let p = at(i, data.len());
                data.drain(p..(p + n).min(data.len()));
            }
            Edit::Duplicate(i, n) => {
                let p = at(i, data.len());
                let end = (p + n).min(data.len());
                let copy = data[p..end].to_vec();
                data.splice(end..end, copy);
            }
            Edit::Truncate(i) => {
                let p = at(i, data.len());
                data.truncate(p);
            }
        }
    }
    data
}

/// A scalar as a values file may spell it, hostile ones included.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "[a-zA-Z0-9_./:-]{0,24}",
        any::<String>().prop_map(|s| format!("{s:?}")),
        Just("null".to_string()),
        Just("~".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
    ]
}

/// A values file built from the chart's real key paths (so most cases get past the YAML and into
/// the schema check and the typed values), each set to a hostile scalar, in flow style.
fn keyed_file() -> impl Strategy<Value = String> {
    let paths = chart_paths();
    prop::collection::vec((prop::sample::select(paths), scalar()), 0..12).prop_map(|sets| {
        let mut root = serde_json::Map::new();
        for (path, value) in sets {
            let mut node = &mut root;
            let (last, parents) = path.split_last().expect("non-empty path");
            for p in parents {
                let entry = node
                    .entry(p.clone())
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                if !entry.is_object() {
                    *entry = serde_json::Value::Object(Default::default());
                }
                node = entry.as_object_mut().expect("object");
            }
            node.insert(last.clone(), serde_json::Value::String(value));
        }
        // Every leaf as an unquoted YAML scalar: `key: <scalar>` lines, indented by depth.
        let mut out = String::new();
        write_yaml(&root, 0, &mut out);
        out
    })
}

fn write_yaml(m: &serde_json::Map<String, serde_json::Value>, depth: usize, out: &mut String) {
    for (k, v) in m {
        out.push_str(&"  ".repeat(depth));
        out.push_str(k);
        out.push(':');
        match v {
            serde_json::Value::Object(child) => {
                out.push('\n');
                write_yaml(child, depth + 1, out);
            }
            serde_json::Value::String(s) => {
                out.push(' ');
                out.push_str(s);
                out.push('\n');
            }
            other => {
                out.push(' ');
                out.push_str(&other.to_string());
                out.push('\n');
            }
        }
    }
}

/// Every key path of the chart's defaults.
fn chart_paths() -> Vec<Vec<String>> {
    fn walk(v: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if let serde_json::Value::Object(m) = v {
            for (k, child) in m {
                path.push(k.clone());
                out.push(path.clone());
                walk(child, path, out);
                path.pop();
            }
        }
    }
    let defaults = parse_values_file(CHART_VALUES_YAML).expect("chart defaults");
    let mut out = Vec::new();
    walk(&defaults, &mut Vec::new(), &mut out);
    out
}

/// The heap a values file of `len` bytes may cost: the chart's defaults and schema, parsed and
/// merged (a few MiB with the parser's buffers), plus a generous factor of the file.
fn heap_bound(len: usize) -> usize {
    16 * MIB + 64 * len
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&data);
        let (_, peak, _) = read(&text);
        prop_assert!(peak <= heap_bound(text.len()), "peak {}", peak);
    }

    #[test]
    fn yaml_token_soup(parts in prop::collection::vec(nasty(), 0..200)) {
        let text = String::from_utf8_lossy(&parts.concat()).into_owned();
        let (_, peak, _) = read(&text);
        prop_assert!(peak <= heap_bound(text.len()), "peak {}", peak);
    }

    /// The chart's values.yaml and the CI values files, mutated.
    #[test]
    fn mutated_real_values_files(n in any::<Index>(), edits in prop::collection::vec(edit(), 1..8)) {
        let files = real_files();
        let text = String::from_utf8_lossy(&apply(files[n.index(files.len())].clone().into_bytes(), &edits)).into_owned();
        let (_, peak, _) = read(&text);
        prop_assert!(peak <= heap_bound(text.len()), "peak {}", peak);
    }

    /// Real keys, hostile values. YAML is a superset of JSON: the file's parsed value written
    /// as JSON and read again gets the same verdict.
    #[test]
    fn real_keys_hostile_values(text in keyed_file()) {
        let (ok, peak, _) = read(&text);
        prop_assert!(peak <= heap_bound(text.len()), "peak {}", peak);
        if let Ok(v) = parse_values_file(&text) {
            let json = v.to_string();
            prop_assert_eq!(read(&json).0, ok, "{} as JSON: {}", text, json);
        }
    }

    /// The schema checker over any JSON value, not only what YAML gives (numbers beyond i64,
    /// deep arrays, keys near the known ones).
    #[test]
    fn schema_check_of_any_json(v in json_value()) {
        let schema: serde_json::Value = serde_json::from_str(erdma_k8s::install::CHART_VALUES_SCHEMA).expect("schema");
        let problems = check_schema(&schema, &v);
        // One problem per offending node at most, plus the required keys: bounded by the size.
        let size = v.to_string().len();
        prop_assert!(problems.len() <= 64 + size, "{} problems for {} bytes", problems.len(), size);
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-zA-Z]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec![
                        "agent",
                        "config",
                        "dra",
                        "image",
                        "images",
                        "nri",
                        "smcr",
                        "agnet",
                        "namespace",
                        "serviceAccount",
                        "tests",
                        "resources",
                    ])
                    .prop_map(str::to_string),
                    "[a-zA-Z]{1,10}",
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One attack: refused by the limit named in `why` (serde-saphyr's error text), within `heap`
/// bytes of peak heap and a generous time, never a crash.
fn attack(name: &str, text: &str, why: &str, heap: usize) {
    let (ok, peak, took) = read(text);
    assert!(!ok, "{name}: accepted");
    let err = Values::from_values_file(text)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains(why),
        "{name}: refused for another reason: {err:.300}"
    );
    assert!(peak <= heap, "{name}: peak heap {peak} > {heap}");
    assert!(took < Duration::from_secs(30), "{name}: {took:?}");
}

const BUDGET: &str = "budget breached";

#[test]
fn billion_laughs() {
    // Ten levels of ten aliases: 10^10 nodes if expanded. The budget stops the expansion at
    // 250 000 nodes (measured peak ~65 MiB in a debug build).
    let mut text = String::from(
        "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(",");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text.push_str("agent: *a9\n");
    attack("billion laughs", &text, BUDGET, 128 * MIB);
}

#[test]
fn quadratic_blowup_by_one_big_anchor() {
    // One 64 KiB string aliased 40 000 times: 2.5 GiB if copied. The budget stops at 64 MiB of
    // scalar text.
    let big = "x".repeat(64 * 1024);
    let mut text = format!("a: &a \"{big}\"\nagent:\n  extra: [");
    text.push_str(&vec!["*a"; 40_000].join(","));
    text.push_str("]\n");
    attack("one big anchor", &text, BUDGET, 128 * MIB);
}

#[test]
fn deep_flow_nesting() {
    // 100 000 levels of `[`: a recursive reader would overflow the stack; refused at depth 64.
    let text = format!("agent: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    attack("deep flow nesting", &text, "recursion limit", 16 * MIB);
    let text = format!("agent: {}\n", "{a: ".repeat(100_000));
    attack("deep unclosed maps", &text, BUDGET, 16 * MIB);
}

#[test]
fn deep_block_nesting() {
    let mut text = String::new();
    for depth in 0..5_000 {
        text.push_str(&" ".repeat(depth));
        text.push_str("k:\n");
    }
    attack("deep block nesting", &text, BUDGET, 16 * MIB);
}

#[test]
fn anchor_and_document_storms() {
    let anchors: String = (0..100_000).map(|i| format!("    - &x{i} {i}\n")).collect();
    attack(
        "anchor storm",
        &format!("agent:\n  extra:\n{anchors}"),
        BUDGET,
        64 * MIB,
    );
    let docs = "---\nagent: {}\n".repeat(5_000);
    attack("document storm", &docs, "multiple YAML documents", 16 * MIB);
    let merges: String = (0..20_000)
        .map(|i| format!("  <<: {{k{i}: 1}}\n"))
        .collect();
    attack(
        "merge-key storm",
        &format!("agent:\n{merges}"),
        BUDGET,
        64 * MIB,
    );
}

#[test]
fn a_huge_unknown_key_is_refused_with_a_bounded_hint() {
    // The nearest-key hint compares the unknown key with each known one (edit distance): linear
    // in the key, quadratic in nothing the user controls twice.
    let key = "preferDrvier".repeat(8_000);
    let text = format!("agent:\n  {key}: ofed\n");
    let (ok, peak, took) = read(&text);
    assert!(!ok);
    assert!(peak <= heap_bound(text.len()) + 64 * MIB, "peak {peak}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn every_real_values_file_reads() {
    // The defaults must be accepted; the CI files are accepted or refused as Helm does
    // (tests/chart.rs checks which): here only that each gives an answer within the bound.
    let files = real_files();
    assert!(read(&files[0]).0, "the chart's own values.yaml is refused");
    for f in &files {
        let (_, peak, _) = read(f);
        assert!(peak <= heap_bound(f.len()));
    }
}
