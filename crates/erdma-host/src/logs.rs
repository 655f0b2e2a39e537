//! The binaries' log set-up (feature `logs`), one implementation for `erdma-agent`,
//! `erdma-controller` and `smcr-init`.
//!
//! - Where: stderr, always.
//! - Format: `text` (one human line per event) or `json` (one JSON object per line, with `level`,
//!   `target` and `fields.message`; never ANSI).
//! - Colour: text carries ANSI colours only when stderr is a terminal and `NO_COLOR` is unset or
//!   empty (<https://no-color.org>), so `kubectl logs` and files never see escape sequences.
//! - Filter: `--log-level`, else `RUST_LOG`, else the binary's default (`info` for the agent and
//!   the controller), in tracing's `EnvFilter` syntax. An empty value counts as unset (a chart
//!   value left empty). An invalid filter is an error naming its value, where it came from and a
//!   valid example; a lone word that is not a level (`verbose`, `warning`) is refused too, because
//!   `EnvFilter` would read it as a target name and silently drop every other log.

use std::ffi::OsStr;
use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// The default filter of the agent and the controller.
pub const DEFAULT_FILTER: &str = "info";
/// A valid filter, named in errors as an example.
pub const EXAMPLE_FILTER: &str = "info,erdma_nri=debug";

/// How each event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `text` or `json`; empty (or blank) is the default, `text`.
    pub fn parse(value: &str) -> Result<LogFormat, LogError> {
        match value.trim() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(LogError::Format {
                value: value.to_string(),
            }),
        }
    }

    /// The name as the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl FromStr for LogFormat {
    type Err = LogError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LogFormat::parse(s)
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the filter in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterOrigin {
    /// `--log-level`.
    Flag,
    /// The `RUST_LOG` environment variable.
    Env,
    /// The binary's default.
    Default,
}

impl fmt::Display for FilterOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FilterOrigin::Flag => "--log-level",
            FilterOrigin::Env => "RUST_LOG",
            FilterOrigin::Default => "the default log filter",
        })
    }
}

/// Why logs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Not `text` or `json`.
    #[error("log format {value:?} is not text or json")]
    Format {
        /// The value given.
        value: String,
    },
    /// Not a valid `EnvFilter`.
    #[error(
        "{origin} {value:?} is not a valid log filter: {reason}; use a level (error, warn, info, debug, trace, off) or directives such as {EXAMPLE_FILTER:?}"
    )]
    Filter {
        /// Where the value came from.
        origin: FilterOrigin,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A global subscriber exists already (set up twice in one process).
    #[error("logs are already set up in this process")]
    AlreadySet,
}

/// Whether text logs carry ANSI colours: only on a terminal, and only when `NO_COLOR` (its value
/// given as `no_color`) is unset or empty.
pub fn ansi_colours(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// The filter in force and where it came from: `flag`, else `env` (`RUST_LOG`), else `default`;
/// an empty or blank value counts as unset.
pub fn choose_filter<'a>(
    flag: Option<&'a str>,
    env: Option<&'a str>,
    default: &'a str,
) -> (FilterOrigin, &'a str) {
    let given = |v: Option<&'a str>| v.map(str::trim).filter(|v| !v.is_empty());
    if let Some(v) = given(flag) {
        (FilterOrigin::Flag, v)
    } else if let Some(v) = given(env) {
        (FilterOrigin::Env, v)
    } else {
        (FilterOrigin::Default, default)
    }
}

/// Parses `value` (from `origin`) as an `EnvFilter`, refusing lone words that are not levels.
pub fn parse_filter(value: &str, origin: FilterOrigin) -> Result<EnvFilter, LogError> {
    let invalid = |reason: String| LogError::Filter {
        origin,
        value: value.to_string(),
        reason,
    };
    let directives: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(invalid("it has no directive".into()));
    }
    for d in directives {
        if !d.contains(['=', '[', '{']) && d.parse::<LevelFilter>().is_err() {
            return Err(invalid(format!(
                "{d:?} is neither a level nor TARGET=LEVEL (for every event of target {d} write {d}=trace)"
            )));
        }
    }
    EnvFilter::builder()
        .parse(value.trim())
        .map_err(|e| invalid(e.to_string()))
}

/// A subscriber writing `format` through `writer`, filtered by `filter`; `ansi` applies to text.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> tracing::Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).finish().into(),
        LogFormat::Json => builder.json().with_ansi(false).finish().into(),
    }
}

/// Sets up this process's logs on stderr: `format`, the filter from `level` (`--log-level`),
/// else `RUST_LOG`, else `default`, colours by [`ansi_colours`] of stderr and `NO_COLOR`.
pub fn init(format: LogFormat, level: Option<&str>, default: &str) -> Result<(), LogError> {
    let env = match std::env::var("RUST_LOG") {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(LogError::Filter {
                origin: FilterOrigin::Env,
                value: v.to_string_lossy().into_owned(),
                reason: "it is not UTF-8".into(),
            });
        }
    };
    let (origin, value) = choose_filter(level, env.as_deref(), default);
    let filter = parse_filter(value, origin)?;
    let ansi = ansi_colours(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    subscriber(format, filter, ansi, std::io::stderr)
        .try_init()
        .map_err(|_| LogError::AlreadySet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        let cases: [(bool, Option<&str>, bool); 8] = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false), // any non-empty value, even "0", turns colours off
            (false, None, false),
            (false, Some(""), false),
            (false, Some("1"), false),
            (false, Some("0"), false),
        ];
        for (tty, no_color, want) in cases {
            assert_eq!(
                ansi_colours(tty, no_color.map(OsStr::new)),
                want,
                "terminal={tty} NO_COLOR={no_color:?}"
            );
        }
    }

    #[test]
    fn the_flag_wins_over_rust_log_which_wins_over_the_default() {
        assert_eq!(
            choose_filter(Some("debug"), Some("warn"), "info"),
            (FilterOrigin::Flag, "debug")
        );
        assert_eq!(
            choose_filter(None, Some("warn"), "info"),
            (FilterOrigin::Env, "warn")
        );
        assert_eq!(
            choose_filter(None, None, "info"),
            (FilterOrigin::Default, "info")
        );
        // A chart value left empty (`--log-level=`) and an empty RUST_LOG count as unset.
        assert_eq!(
            choose_filter(Some(""), Some(" "), "error"),
            (FilterOrigin::Default, "error")
        );
        assert_eq!(
            choose_filter(Some("  "), Some("trace"), "info"),
            (FilterOrigin::Env, "trace")
        );
    }

    #[test]
    fn valid_filters_parse() {
        for ok in [
            "info",
            "DEBUG",
            "off",
            "warn,erdma_nri=debug",
            EXAMPLE_FILTER,
            "erdma_agent::smcr=trace",
            "info,[pod{name=x}]=debug",
        ] {
            parse_filter(ok, FilterOrigin::Flag).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn invalid_filters_name_the_value_the_origin_and_an_example() {
        for (bad, origin, origin_name) in [
            ("info,erdma_nri=loud", FilterOrigin::Flag, "--log-level"),
            ("verbose", FilterOrigin::Flag, "--log-level"),
            ("warning", FilterOrigin::Env, "RUST_LOG"),
            (",", FilterOrigin::Flag, "--log-level"),
        ] {
            let e = parse_filter(bad, origin).unwrap_err().to_string();
            assert!(e.starts_with(origin_name), "{e}");
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("\"info,erdma_nri=debug\""), "{e}");
        }
        let e = parse_filter("verbose", FilterOrigin::Flag)
            .unwrap_err()
            .to_string();
        assert!(e.contains("verbose=trace"), "names the fix: {e}");
    }

    #[test]
    fn formats_parse_and_empty_is_text() {
        assert_eq!(LogFormat::parse("text").unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse("json").unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::parse("").unwrap(), LogFormat::Text);
        let e = LogFormat::parse("xml").unwrap_err().to_string();
        assert_eq!(e, "log format \"xml\" is not text or json");
        assert_eq!("json".parse::<LogFormat>().unwrap().to_string(), "json");
    }

    /// Captures what a subscriber writes.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Capture {
        type Writer = Capture;
        fn make_writer(&'w self) -> Capture {
            self.clone()
        }
    }

    fn emit(format: LogFormat, filter: &str, ansi: bool) -> String {
        let out = Capture::default();
        let filter = parse_filter(filter, FilterOrigin::Flag).unwrap();
        let sub = subscriber(format, filter, ansi, out.clone());
        tracing::dispatcher::with_default(&sub, || {
            tracing::info!(device = "erdma_0", "device served");
            tracing::debug!("hidden at info");
            tracing::warn!(target: "erdma_nri", "budget exceeded");
        });
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn json_is_one_object_per_line_without_escapes() {
        let text = emit(LogFormat::Json, "info", true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(!text.contains('\x1b'), "{text:?}");
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["fields"]["message"], "device served");
        assert_eq!(first["fields"]["device"], "erdma_0");
        let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(second["level"], "WARN");
        assert_eq!(second["target"], "erdma_nri");
    }

    #[test]
    fn text_has_escapes_only_when_colours_are_on() {
        let plain = emit(LogFormat::Text, "info", false);
        assert_eq!(plain.lines().count(), 2, "{plain}");
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(
            plain.contains("INFO") && plain.contains("device served"),
            "{plain}"
        );
        assert!(plain.contains("device=\"erdma_0\""), "{plain}");
        let coloured = emit(LogFormat::Text, "info", true);
        assert!(coloured.contains('\x1b'), "{coloured:?}");
    }

    #[test]
    fn directives_select_per_target_levels() {
        let text = emit(LogFormat::Text, "error,erdma_nri=warn", false);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("budget exceeded"), "{text}");
    }
}
