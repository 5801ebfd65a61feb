//! `tracer stack`'s output: a table like a traceback's, innermost frame
//! first, or one JSON object.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{CurrentThreadState, Stacks, TaskTls, ThreadStack};
use crate::text::display;

/// Each thread's frames under a heading that says which thread it is.
/// The names and paths are the target's to choose: escaped
/// ([`crate::text`]), as every other table escapes them.
#[must_use]
pub fn table(stacks: &Stacks) -> String {
    let image = display(&stacks.image.to_string_lossy());
    let mut out = format!("PID {}: Python {} ({image})\n", stacks.pid, stacks.version);
    for thread in &stacks.threads {
        let mut marks = Vec::new();
        if thread.main {
            marks.push("main thread");
        }
        if thread.holds_gil {
            marks.push("holds the GIL");
        }
        let marks = if marks.is_empty() { String::new() } else { format!(" ({})", marks.join(", ")) };
        // Before 3.11 a thread state records its pthread_t only.
        let id = thread.native_thread_id.map_or_else(|| format!("pthread {:#x}", thread.thread_id), |t| t.to_string());
        let _ = writeln!(out, "Thread {id}{marks}:");
        match &thread.frames {
            Ok(frames) if frames.frames.is_empty() => out.push_str("    (no Python frames)\n"),
            Ok(frames) => {
                for f in &frames.frames {
                    let line = f.line.map_or_else(|| "?".to_owned(), |l| l.to_string());
                    let _ = writeln!(out, "    {} ({}:{line})", display(&f.function), display(&f.file));
                }
                if frames.truncated {
                    out.push_str("    ... (truncated at the depth limit)\n");
                }
            }
            Err(e) => {
                let _ = writeln!(out, "    (cannot read its frames: {})", display(&e.to_string()));
            }
        }
    }
    if let Some(why) = &stacks.cut {
        let _ = writeln!(out, "(cut: {why})");
    }
    out
}

/// The JSON form (docs/stack.md).
#[must_use]
pub fn json(stacks: &Stacks) -> Value {
    let mut v = json!({
        "type": "stacks",
        "pid": stacks.pid,
        "python": {"version": stacks.version.to_string(), "image": stacks.image.display().to_string()},
        "current_thread_state": current(&stacks.current),
        "threads": stacks.threads.iter().map(thread).collect::<Vec<_>>(),
    });
    let Some(map) = v.as_object_mut() else { return v };
    if let Some(why) = &stacks.cut {
        map.insert("cut".to_owned(), why.as_str().into());
    }
    if let Some(ns) = stacks.pid_in_namespace {
        map.insert("pid_in_namespace".to_owned(), ns.into());
    }
    if let Some(check) = &stacks.tls_check {
        map.insert("tls_check".to_owned(), tls_check(check));
    }
    v
}

fn thread(t: &ThreadStack) -> Value {
    let mut v = json!({
        "tid": t.native_thread_id,
        "pthread": format!("{:#x}", t.thread_id),
        "thread_state": format!("{:#x}", t.tstate),
        "main": t.main,
        "holds_gil": t.holds_gil,
    });
    let Some(map) = v.as_object_mut() else { return v };
    match &t.frames {
        Ok(frames) => {
            let list: Vec<Value> = frames
                .frames
                .iter()
                .map(|f| {
                    json!({
                        "function": f.function,
                        "file": f.file,
                        "line": f.line,
                        "code": format!("{:#x}", f.code),
                        "offset": f.offset,
                    })
                })
                .collect();
            map.insert("frames".to_owned(), list.into());
            map.insert("truncated".to_owned(), frames.truncated.into());
        }
        Err(e) => {
            map.insert("error".to_owned(), e.to_string().into());
        }
    }
    v
}

/// How the BPF side would find the current thread's state in this
/// process.
fn current(c: &Result<CurrentThreadState, String>) -> Value {
    match c {
        Ok(CurrentThreadState::Gilstate { address, now }) => json!({
            "via": "_PyRuntime.gilstate.tstate_current",
            "address": format!("{address:#x}"),
            "thread_state": format!("{now:#x}"),
        }),
        Ok(CurrentThreadState::FsRelative { offset }) => json!({"via": "fsbase", "offset": offset}),
        Ok(CurrentThreadState::Dynamic { module, offset }) => json!({"via": "dtv", "module": module, "offset": offset}),
        Err(e) => json!({"via": null, "error": e}),
    }
}

fn tls_check(check: &Result<Vec<TaskTls>, String>) -> Value {
    match check {
        Ok(tasks) => json!({"tasks": tasks.iter().map(|t| json!({
            "tid": t.tid,
            "fsbase": format!("{:#x}", t.fsbase),
            "thread_state": t.thread_state.map(|s| format!("{s:#x}")),
        })).collect::<Vec<_>>()}),
        Err(e) => json!({"error": e}),
    }
}
