//! `--name PATTERN`: the CPython process whose command line matches, as
//! `pgrep -f` matches (a regular expression searched for in the
//! arguments joined by spaces). A process that matches but is not CPython
//! (a shell wrapper, `sudo`, a supervisor) is followed down to the CPython
//! processes it started, so that the pattern of a command line reaches its
//! interpreter; one that is CPython is taken as it is (its CPython
//! children, `multiprocessing`'s workers, match on their own or not at
//! all). tracer itself and the processes that started it (`sudo`, the
//! shell, a script that runs tracer with the pattern in its own
//! arguments) are never candidates.

use std::collections::{BTreeSet, HashMap};

use thiserror::Error;

use super::process::Target;

/// The most candidates an error lists.
const LISTED: usize = 5;
/// The most characters of a command line an error shows.
const SHOWN: usize = 80;

/// `--name` that selects no one process.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    #[error("--name {pattern:?} is not a regular expression: {reason}; e.g. --name 'manage.py runserver'")]
    BadPattern { pattern: String, reason: String },
    #[error("no CPython process matches --name {pattern:?}{seen}; check the pattern with `pgrep -af {pattern:?}`")]
    NoMatch { pattern: String, seen: String },
    #[error(
        "--name {pattern:?} matches {count} CPython processes: {listed}; pass one with --pid, narrow the pattern, or use --exe PATH to trace every process of one interpreter"
    )]
    Several { pattern: String, count: usize, listed: String },
    #[error("--name {pattern:?} matches PID {pid}, which tracer cannot inspect: {cause}")]
    Inspect { pattern: String, pid: u32, cause: String },
}

impl crate::error::Classify for NameError {
    /// The pattern given, and the processes it names.
    fn is_bad_input(&self) -> bool {
        true
    }
}

/// One process in /proc: its parent and its command line.
struct Entry {
    ppid: u32,
    command: String,
}

/// Every process's parent and command line (arguments joined by spaces,
/// as `pgrep -f` matches them; a kernel thread's is empty).
fn processes() -> HashMap<u32, Entry> {
    let mut all = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return all };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // Gone between the listing and the read: not a candidate.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The fields after the command name, which may hold spaces and
        // parentheses: the last ')' ends it.
        let Some(parent) = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        else {
            continue;
        };
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let command = String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ");
        all.insert(pid, Entry { ppid: parent, command });
    }
    all
}

/// The PID of the one CPython process `pattern` selects, and, where the
/// pattern also matched processes tracer may not inspect (another user's,
/// without `CAP_SYS_PTRACE`), which might be the one meant, a line that
/// says so.
pub fn select(pattern: &str) -> Result<(u32, Option<String>), NameError> {
    let regex = regex::Regex::new(pattern)
        .map_err(|e| NameError::BadPattern { pattern: pattern.to_owned(), reason: first_line(&e.to_string()) })?;
    let all = processes();
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, entry) in &all {
        children.entry(entry.ppid).or_default().push(*pid);
    }
    // tracer and the chain of processes that started it.
    let mut excluded = BTreeSet::new();
    let mut up = std::process::id();
    while up > 1 && excluded.insert(up) {
        up = all.get(&up).map_or(0, |e| e.ppid);
    }
    // A process tracer may not inspect (PID 1 in a container, say) is the
    // error only where no CPython process matched, and a warning where one
    // did: a broad pattern that also matches it still names the processes
    // it selects. By PID: one reached both directly and below a matching
    // wrapper counts once.
    let mut uninspectable: std::collections::BTreeMap<u32, String> = std::collections::BTreeMap::new();
    let mut is_python = |pid: u32| match Target::inspect(pid) {
        Ok(_) => true,
        // Not CPython, or gone since the listing.
        Err(e) if e.is_not_a_target() => false,
        Err(e) => {
            uninspectable.insert(pid, e.to_string());
            false
        }
    };
    let mut found = BTreeSet::new();
    let mut others = Vec::new();
    let mut matching: Vec<u32> = all
        .iter()
        .filter(|(pid, e)| !excluded.contains(*pid) && !e.command.is_empty() && regex.is_match(&e.command))
        .map(|(p, _)| *p)
        .collect();
    matching.sort_unstable();
    for pid in matching {
        if is_python(pid) {
            found.insert(pid);
            continue;
        }
        // Down the tree to the first CPython process on each branch.
        let mut below = children.get(&pid).cloned().unwrap_or_default();
        let mut reached = false;
        while let Some(child) = below.pop() {
            if excluded.contains(&child) {
                continue;
            }
            if is_python(child) {
                found.insert(child);
                reached = true;
            } else {
                below.extend(children.get(&child).into_iter().flatten().copied());
            }
        }
        if !reached {
            others.push(pid);
        }
    }
    let show = |pid: u32| format!("{pid} ({})", shown(&all[&pid].command));
    match found.len() {
        1 => {
            let pid = found.into_iter().next().unwrap_or_default();
            let skipped = uninspectable.iter().next().map(|(other, cause)| {
                let more = match uninspectable.len() - 1 {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!(
                    "--name {pattern:?} also matches PID {other}{more}, which tracer cannot inspect ({cause}): tracing PID {pid}, the one CPython process it matches that tracer can; pass --pid to choose"
                )
            });
            Ok((pid, skipped))
        }
        0 if !uninspectable.is_empty() => {
            let (pid, cause) = uninspectable.pop_first().unwrap_or_default();
            Err(NameError::Inspect { pattern: pattern.to_owned(), pid, cause })
        }
        0 => {
            let seen = if others.is_empty() {
                String::new()
            } else {
                let listed: Vec<String> = others.iter().take(LISTED).map(|p| show(*p)).collect();
                let more = others.len().saturating_sub(LISTED);
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                format!(" (it matches {}, none CPython nor started by one{more})", listed.join(", "))
            };
            Err(NameError::NoMatch { pattern: pattern.to_owned(), seen })
        }
        count => {
            let mut listed: Vec<String> = found.iter().take(LISTED).map(|p| show(*p)).collect();
            if count > LISTED {
                listed.push(format!("and {} more", count - LISTED));
            }
            Err(NameError::Several { pattern: pattern.to_owned(), count, listed: listed.join(", ") })
        }
    }
}

/// A command line as an error shows it: escaped, and cut.
fn shown(command: &str) -> String {
    let escaped = crate::text::display(command);
    match escaped.char_indices().nth(SHOWN) {
        Some((end, _)) => crate::text::cut(&escaped[..end]),
        None => escaped,
    }
}

/// The regex crate's errors span lines (the pattern, a caret, the
/// reason): the reason alone.
fn first_line(message: &str) -> String {
    message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(message)
        .trim()
        .trim_start_matches("error: ")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_pattern_says_why_on_one_line() {
        let e = select("(unclosed").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--name \"(unclosed\" is not a regular expression: unclosed group; e.g. --name 'manage.py runserver'"
        );
    }

    #[test]
    fn a_pattern_nothing_matches_says_so() {
        let e = select("^no such command line 1f0c9e$").unwrap_err();
        assert_eq!(
            e.to_string(),
            "no CPython process matches --name \"^no such command line 1f0c9e$\"; check the pattern with `pgrep -af \"^no such command line 1f0c9e$\"`"
        );
    }

    #[test]
    fn long_command_lines_are_cut_and_escaped() {
        assert_eq!(shown("a\u{1b}b"), "a\\x1bb");
        assert_eq!(shown(&"x".repeat(200)).chars().count(), SHOWN + 1);
    }
}
