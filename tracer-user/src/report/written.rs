//! The files written from a run's summary: folded stacks and flame graphs
//! of the events (`--folded`, `--flamegraph`) and of growth
//! (`--growth-folded`, `--growth-flamegraph`), and pprof (`--pprof`); at
//! the end of `attach` and `run`, or later by `tracer report` from a
//! record. Each says where it wrote what, as a note; where there is no
//! stack to write, no file is made (an empty folded file, or the SVG
//! inferno leaves half written when it refuses to draw nothing, would be
//! taken for a result), and a warning says which files and why.

use super::files::{OutputError, OutputFile};
use crate::{
    config::Weight,
    model::{Growth, Level, Note, NoteCode, Snapshot, StackCount},
};

/// The two files a set of stacks can go to.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackFiles<'a> {
    pub folded: Option<&'a OutputFile>,
    pub flamegraph: Option<&'a OutputFile>,
}

/// Writes the summary's event stacks, weighed by `weight`, of `what` (the
/// target, as the title says it), one event in `sample` recorded.
pub fn stacks(
    files: StackFiles<'_>,
    (weight, sample): (Weight, u64),
    what: &str,
    last: &Snapshot,
) -> Result<Vec<Note>, OutputError> {
    let all = last.stacks.as_deref().unwrap_or_default();
    let lines = super::stacks::folded(all, weight);
    if lines.is_empty() {
        let why = if all.is_empty() {
            "no stacks recorded".to_owned()
        } else {
            // Only what weighs nothing: `--stacks refs` by bytes.
            format!("the stacks recorded have no {weight} (--weight {weight}; --weight calls counts their calls)")
        };
        return Ok(not_written(files, &why).into_iter().collect());
    }
    let mut notes = Vec::new();
    let sampled = if sample > 1 { format!(", 1 in {sample} sampled, scaled") } else { String::new() };
    if let Some(file) = files.folded {
        super::stacks::write_folded(file, &lines)?;
        notes.push(written(format!("wrote {} folded stacks by {weight} to {}", lines.len(), file.path.display())));
    }
    if let Some(file) = files.flamegraph {
        let title = format!("tracer: allocations of {what} by {weight}{sampled}");
        super::stacks::write_flamegraph(file, &lines, &title, weight)?;
        notes.push(written(format!("wrote the flame graph of {} stacks to {}", lines.len(), file.path.display())));
    }
    Ok(notes)
}

/// Writes the summary's growth stacks (the pools each holds, in bytes).
pub fn growth(files: StackFiles<'_>, what: &str, last: &Snapshot) -> Result<Vec<Note>, OutputError> {
    let sampled = last.growth.as_ref().and_then(Growth::sampled);
    let stacks: Vec<StackCount> = sampled
        .and_then(|g| g.stacks.as_ref())
        .into_iter()
        .flatten()
        .map(|s| StackCount {
            probe: "[heap grown]".to_owned(),
            frames: s.frames.clone(),
            truncated: s.truncated,
            calls: s.samples,
            bytes: s.in_use_bytes,
            ..StackCount::default()
        })
        .collect();
    let lines = super::stacks::folded(&stacks, Weight::Bytes);
    if lines.is_empty() {
        let why = no_growth_sample(last)
            .map_or_else(|| "no growth stacks recorded".to_owned(), |why| format!("no growth stacks recorded ({why})"));
        return Ok(not_written(files, &why).into_iter().collect());
    }
    let mut notes = Vec::new();
    if let Some(file) = files.folded {
        super::stacks::write_folded(file, &lines)?;
        notes.push(written(format!(
            "wrote {} folded growth stacks by bytes (sampled estimates) to {}",
            lines.len(),
            file.path.display()
        )));
    }
    if let Some(file) = files.flamegraph {
        let every = sampled.map_or(0, |g| g.sample_every);
        let probed = sampled.map(|g| g.takes.probed).unwrap_or_default();
        let title = format!(
            "tracer: heap growth of {what} by Python stack, pools in use by {} (1 {} in {every} sampled)",
            probed.holder(),
            probed.one()
        );
        super::stacks::write_flamegraph(file, &lines, &title, Weight::Bytes)?;
        notes.push(written(format!(
            "wrote the flame graph of {} growth stacks to {}",
            lines.len(),
            file.path.display()
        )));
    }
    Ok(notes)
}

/// Writes `--pprof` from the summary's stacks, and says where and what.
pub fn pprof(file: &OutputFile, last: &Snapshot, started_unix_s: Option<f64>) -> Result<Note, OutputError> {
    let profile = super::pprof::profile(last, started_unix_s);
    let samples = super::pprof::write(file, &profile)?;
    let what = match (last.stacks.is_some(), last.growth.as_ref().and_then(Growth::sampled)) {
        (true, Some(_)) => {
            "the stacks' events (alloc_*, and free_objects of the frees) and growth's stacks (inuse_*, sampled estimates)"
        }
        (true, None) => "the stacks' events (alloc_*, and free_objects of the frees)",
        (false, _) => "growth's stacks (inuse_*, sampled estimates)",
    };
    if samples == 0 {
        let why = no_growth_sample(last).unwrap_or_else(|| "no stack was recorded in the run".to_owned());
        return Ok(Note::new(
            Level::Warning,
            NoteCode::Written,
            format!("wrote a pprof profile with no sample to {}: {why}", file.path.display()),
        ));
    }
    Ok(written(format!("wrote a pprof profile of {samples} samples, {what}, to {}", file.path.display())))
}

/// Why the summary holds no growth sample, where the run says.
fn no_growth_sample(last: &Snapshot) -> Option<String> {
    match &last.growth {
        Some(Growth::Unavailable { unavailable }) => Some(format!("growth is unavailable: {unavailable}")),
        Some(Growth::Sampled(g)) => {
            g.stopped.as_ref().map(|s| format!("growth stopped before it held a sample ({})", s.reason))
        }
        None => None,
    }
}

/// The warning that `files` were not written, and `why`; none where no
/// file was asked for.
fn not_written(files: StackFiles<'_>, why: &str) -> Option<Note> {
    let named: Vec<String> = [files.folded, files.flamegraph]
        .into_iter()
        .flatten()
        .map(|f| format!("{} {}", f.flag, f.path.display()))
        .collect();
    (!named.is_empty())
        .then(|| Note::new(Level::Warning, NoteCode::Written, format!("{why}: {} not written", named.join(" and "))))
}

fn written(message: String) -> Note {
    Note::new(Level::Note, NoteCode::Written, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_stack_makes_no_file_and_says_so() {
        let dir = std::env::temp_dir().join(format!("tracer-written-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (f, s) = (dir.join("a.folded"), dir.join("a.svg"));
        let folded = OutputFile::check("--folded", &f, false).unwrap();
        let flamegraph = OutputFile::check("--flamegraph", &s, false).unwrap();
        let files = StackFiles { folded: Some(&folded), flamegraph: Some(&flamegraph) };
        let mut last = Snapshot { stacks: Some(Vec::new()), ..Snapshot::default() };
        let notes = stacks(files, (Weight::Calls, 1), "PID 1", &last).unwrap();
        let message =
            format!("no stacks recorded: --folded {} and --flamegraph {} not written", f.display(), s.display());
        assert_eq!(notes, [Note::new(Level::Warning, NoteCode::Written, message)]);
        // `--stacks refs` weighs no bytes.
        let refs = StackCount { probe: "_Py_NewReference".into(), calls: 3, ..StackCount::default() };
        last.stacks = Some(vec![refs]);
        let only = StackFiles { folded: None, flamegraph: Some(&flamegraph) };
        let notes = stacks(only, (Weight::Bytes, 1), "PID 1", &last).unwrap();
        assert_eq!(
            notes[0].message,
            format!(
                "the stacks recorded have no bytes (--weight bytes; --weight calls counts their calls): --flamegraph {} not written",
                s.display()
            )
        );
        let growth_files = StackFiles { folded: Some(&folded), flamegraph: None };
        last.growth = Some(Growth::Unavailable { unavailable: "no symbol".into() });
        let notes = growth(growth_files, "PID 1", &last).unwrap();
        assert_eq!(
            notes[0].message,
            format!(
                "no growth stacks recorded (growth is unavailable: no symbol): --folded {} not written",
                f.display()
            )
        );
        assert!(!f.exists() && !s.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
