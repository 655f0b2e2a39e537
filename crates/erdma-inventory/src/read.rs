//! Small helpers that turn sysfs reads into values or findings.

use erdma_host::{Sysfs, SysfsError};
use erdma_model::Finding;
use std::path::Path;

/// Collects findings while a device is read.
#[derive(Default)]
pub(crate) struct Notes {
    pub findings: Vec<Finding>,
}

impl Notes {
    /// Reads an attribute; a missing file is `None` silently when `optional`, otherwise a finding.
    pub fn attr(&mut self, sysfs: &dyn Sysfs, rel: &Path, optional: bool) -> Option<String> {
        match sysfs.read_attr(rel) {
            Ok(v) => Some(v),
            Err(e) if e.is_missing() && optional => None,
            Err(e) => {
                self.findings
                    .push(Finding::error(format!("cannot read {}", describe(&e))));
                None
            }
        }
    }

    /// Reads and parses an attribute, recording a finding that names the file and value on failure.
    pub fn parsed<T, E: std::fmt::Display>(
        &mut self,
        sysfs: &dyn Sysfs,
        rel: &Path,
        optional: bool,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        let text = self.attr(sysfs, rel, optional)?;
        match parse(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                self.findings
                    .push(Finding::error(format!("{}: {e}", sysfs_path(sysfs, rel))));
                None
            }
        }
    }
}

/// The full path of `rel` for messages.
pub(crate) fn sysfs_path(sysfs: &dyn Sysfs, rel: &Path) -> String {
    Path::new(&sysfs.describe()).join(rel).display().to_string()
}

fn describe(e: &SysfsError) -> String {
    e.to_string()
}
