//! Output formats shared by subcommands.

use serde::Serialize;
use std::io::Write;

/// stdout was closed by its reader (`| head`): the command stops quietly, as a process that
/// SIGPIPE ends, with status [`BROKEN_PIPE`].
#[derive(Debug)]
pub struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for OutputClosed {}

/// The status of a command whose stdout reader went away (128 + SIGPIPE, as the shell reports
/// a process SIGPIPE ended).
pub const BROKEN_PIPE: u8 = 141;

/// Writes `text` to stdout, control characters escaped ([`escape_controls`]), and flushes it.
/// A closed pipe is [`OutputClosed`]; any other failure (a full disk, `/dev/full`) is an error
/// naming it, never a panic.
pub fn emit(text: &str) -> anyhow::Result<()> {
    write_to(&mut std::io::stdout().lock(), text)
}

/// Clears the terminal (`top --watch` on a terminal): the one control sequence erdmactl writes
/// itself, never built from data.
pub fn clear_screen() -> anyhow::Result<()> {
    write_raw(&mut std::io::stdout().lock(), "\x1b[2J\x1b[H")
}

/// Writes `text` and a newline to stderr, control characters escaped: messages there quote
/// API answers, node fields and pod names. A closed stderr is ignored, as `eprintln!` would
/// not be.
pub fn warn(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{}", escape_controls(text));
}

/// `text` safe to show on a terminal: C0 controls except newline and tab, DEL, the C1
/// controls (U+0080-U+009F: a terminal may take U+009B as CSI) and the bidirectional
/// overrides and isolates (U+202A-U+202E, U+2066-U+2069, which reorder what is shown) become
/// `\u001b`-style escapes (`\r` for a carriage return). Untrusted text (NCCL logs, pod and
/// node fields, events, API errors) reaches every text output; an escape sequence in it could
/// otherwise retitle the terminal, rewrite what was printed or, with OSC 52, set the
/// clipboard. The escapes are JSON's own, so JSON output (where serde escapes C0 but leaves
/// C1 and bidi characters raw) stays valid and means the same.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        matches!(c, '\x00'..='\x08' | '\x0b'..='\x1f' | '\x7f' | '\u{80}'..='\u{9f}')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// [`emit`] with a newline.
pub fn emitln(text: &str) -> anyhow::Result<()> {
    emit(&format!("{text}\n"))
}

/// [`emit`] to any writer (the check behind it, testable), control characters escaped.
pub fn write_to(out: &mut dyn Write, text: &str) -> anyhow::Result<()> {
    write_raw(out, &escape_controls(text))
}

fn write_raw(out: &mut dyn Write, text: &str) -> anyhow::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(OutputClosed.into()),
        Err(e) => Err(anyhow::anyhow!("cannot write the output to stdout: {e}")),
    }
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A human-readable table.
    Table,
    /// JSON (complete, machine-readable).
    Json,
    /// YAML (same fields as JSON).
    Yaml,
}

/// Renders `value` as JSON or YAML.
pub fn render<T: Serialize>(value: &T, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(value)? + "\n",
        Format::Yaml => serde_saphyr::to_string(value)?,
        Format::Table => anyhow::bail!("table output is rendered by the command itself"),
    })
}

/// Renders rows as a left-aligned text table with two spaces between columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count() + 2;
                s.push_str(cell);
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_escaped_and_plain_text_is_not_copied() {
        let osc52 = "copy \x1b]52;c;cm0gLXJmIH4=\x07 done";
        assert_eq!(
            escape_controls(osc52),
            "copy \\u001b]52;c;cm0gLXJmIH4=\\u0007 done"
        );
        assert_eq!(
            escape_controls("a\rb\x7fc\u{9b}31md\u{202e}e\u{2066}f\x00"),
            "a\\rb\\u007fc\\u009b31md\\u202ee\\u2066f\\u0000"
        );
        let plain = "rank 0\terdma_0:1/RoCE\n  é ü 日本\n";
        assert!(matches!(escape_controls(plain), std::borrow::Cow::Borrowed(p) if p == plain));
    }

    #[test]
    fn escaped_json_still_parses_to_the_same_text() {
        let value = serde_json::json!({"line": "x\u{9b}y\u{202e}z\x1b[31m"});
        let json = serde_json::to_string(&value).expect("json");
        let shown = escape_controls(&json);
        assert!(
            !shown.contains('\u{9b}') && !shown.contains('\u{202e}'),
            "{shown}"
        );
        let back: serde_json::Value = serde_json::from_str(&shown).expect("still JSON");
        assert_eq!(back, value);
    }

    #[test]
    fn write_to_escapes_what_it_writes() {
        let mut out = Vec::new();
        write_to(&mut out, "pod \x1b[2Jx\n").expect("written");
        assert_eq!(String::from_utf8(out).expect("utf-8"), "pod \\u001b[2Jx\n");
    }
}
