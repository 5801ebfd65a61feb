//! What the BPF programs need to know of the running kernel's own
//! structures, from its BTF (`/sys/kernel/btf/vmlinux`): where a task keeps
//! its thread pointer, by which a thread-local of the target is found.

use std::path::Path;

use thiserror::Error;

/// The running kernel's BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Why a kernel structure's layout is not known.
#[derive(Debug, Error)]
pub enum BtfError {
    #[error(
        "cannot read the kernel's BTF at {path}: {cause}; Python stacks on 3.12+ need a kernel built with CONFIG_DEBUG_INFO_BTF"
    )]
    Read { path: String, cause: String },
    #[error("the kernel's BTF at {path} has no {what}")]
    Missing { path: String, what: String },
}

/// `offsetof(struct task_struct, thread.fsbase)`: the x86-64 thread
/// pointer of a task (arch/x86/include/asm/processor.h, `struct
/// thread_struct`).
pub fn task_fsbase() -> Result<u64, BtfError> {
    task_fsbase_in(Path::new(VMLINUX))
}

fn task_fsbase_in(path: &Path) -> Result<u64, BtfError> {
    let shown = path.display().to_string();
    let btf = btf_rs::Btf::from_file(path).map_err(|e| BtfError::Read { path: shown.clone(), cause: e.to_string() })?;
    let thread = member(&btf, "task_struct", "thread", &shown)?;
    let fsbase = member(&btf, "thread_struct", "fsbase", &shown)?;
    Ok(thread + fsbase)
}

/// The byte offset of `field` in `struct name`.
fn member(btf: &btf_rs::Btf, name: &str, field: &str, path: &str) -> Result<u64, BtfError> {
    let missing = || BtfError::Missing { path: path.to_owned(), what: format!("struct {name} with a member {field}") };
    let types = btf.resolve_types_by_name(name).map_err(|_| missing())?;
    for t in types {
        let btf_rs::Type::Struct(s) = t else { continue };
        for m in &s.members {
            if btf.resolve_name(m).is_ok_and(|n| n == field) {
                return Ok(u64::from(m.bit_offset() / 8));
            }
        }
    }
    Err(missing())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine's kernel has BTF (see ../shared/TOOLCHAIN.md); the
    /// offset lies inside a `task_struct` of several KB.
    #[test]
    fn finds_the_thread_pointer_of_a_task() {
        let offset = task_fsbase().expect("the kernel's BTF");
        assert!((1000..20_000).contains(&offset), "{offset}");
        let err = task_fsbase_in(Path::new("/nonexistent")).expect_err("no such file");
        assert!(err.to_string().starts_with("cannot read the kernel's BTF at /nonexistent:"), "{err}");
    }
}
