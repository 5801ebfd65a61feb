//! What each probe's counts cover, reported with every attach: which
//! copies of the function are probed, where that knowledge came from, and
//! whether its calls and bytes are complete. A count that covers part of
//! the calls says so, with the reason and the fix; never a silent zero.

use serde::{Deserialize, Serialize};

/// Whether a count covers every event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Completeness {
    /// Every call (or every requested byte) is counted.
    Complete,
    /// Some are not; `reason` says which.
    Partial,
    /// Not measured at all (a function that requests no bytes).
    None,
}

/// One probe's coverage, in the `attached` event's `coverage` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Where the probed sites were found: `symbols` (the ELF symbol table
    /// alone), or the file whose DWARF listed the inlined copies.
    pub source: String,
    /// Out-of-line copies probed (the function's symbol): 0 or 1.
    pub out_of_line: usize,
    /// Inlined copies the DWARF lists; `null` when there is no DWARF to
    /// tell (an LTO build may have inlined the function anywhere).
    pub inlined: Option<usize>,
    /// Of those, how many are probed.
    pub inlined_probed: usize,
    /// Call sites probed instead of the entry (`--placement call-sites`).
    pub call_sites: usize,
    pub calls: Completeness,
    pub bytes: Completeness,
    /// Why a count is partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What makes it complete: a package to install, a flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Coverage {
    /// Whether anything is partial.
    #[must_use]
    pub fn is_partial(&self) -> bool {
        self.calls == Completeness::Partial || self.bytes == Completeness::Partial
    }
}

/// The package that holds the debug info of `python3.X` on the
/// distribution whose `/etc/os-release` (inside the target's root) is
/// `os_release`.
#[must_use]
pub fn debug_package(os_release: &str, (major, minor): (u8, u8)) -> String {
    let field = |k: &str| {
        os_release.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).map(|v| v.trim_matches('"').to_owned())
    };
    let (id, like) = (field("ID").unwrap_or_default(), field("ID_LIKE").unwrap_or_default());
    let is = |name: &str| id == name || like.split_whitespace().any(|l| l == name);
    if id == "ubuntu" {
        format!("apt-get install python{major}.{minor}-dbgsym (from the ddebs archive)")
    } else if is("debian") {
        format!("apt-get install python{major}.{minor}-dbg")
    } else if is("fedora") || is("rhel") {
        format!("dnf debuginfo-install python{major}")
    } else {
        format!(
            "install the debug info of this python{major}.{minor} (its build-id's .debug file), or pass --debug-dir"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_package_per_distribution() {
        assert_eq!(debug_package("ID=debian\nVERSION_ID=\"12\"\n", (3, 11)), "apt-get install python3.11-dbg");
        assert_eq!(debug_package("ID=\"debian\"\n", (3, 14)), "apt-get install python3.14-dbg");
        assert!(debug_package("ID=ubuntu\nID_LIKE=debian\n", (3, 12)).starts_with("apt-get install python3.12-dbgsym"));
        assert_eq!(debug_package("ID=fedora\n", (3, 13)), "dnf debuginfo-install python3");
        assert!(debug_package("", (3, 13)).contains("--debug-dir"));
    }
}
