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

/// Writes `text` to stdout and flushes it. A closed pipe is [`OutputClosed`]; any other failure
/// (a full disk, `/dev/full`) is an error naming it, never a panic.
pub fn emit(text: &str) -> anyhow::Result<()> {
    write_to(&mut std::io::stdout().lock(), text)
}

/// [`emit`] with a newline.
pub fn emitln(text: &str) -> anyhow::Result<()> {
    emit(&format!("{text}\n"))
}

/// [`emit`] to any writer (the check behind it, testable).
pub fn write_to(out: &mut dyn Write, text: &str) -> anyhow::Result<()> {
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
