//! Where a 3.12+ thread keeps its own thread state: the thread-local
//! `_Py_tss_tstate`, found without debug info, for the BPF side, which at
//! an event knows the current task and nothing else.
//!
//! `_Py_tss_tstate` is a local symbol that only `.symtab` names; LTO builds
//! ship without `.symtab` (Debian's python3.13 and python3.14 here). But
//! every build exports `_PyThreadState_GetCurrent` (Python/pystate.c at
//! v3.12.1 and later), whose whole body reads it, and the compiler's TLS
//! access model for it shows where it is:
//!
//! - an executable (local-exec; the forky root's LTO 3.13 and 3.14):
//!   `mov %fs:OFFSET,%rax`, so the variable is at the thread's fsbase plus
//!   a constant (negative: x86-64's static TLS lies below the thread
//!   pointer);
//! - a shared libpython (general dynamic; pyenv's 3.12.1 and 3.13.0):
//!   `lea TLS_INDEX(%rip),%rdi; call __tls_get_addr`, where `TLS_INDEX` is
//!   a GOT pair `{ module id, offset }` that ld.so fills in at load time.
//!   The variable is at `dtv[module] + offset`, where `dtv` is the thread's
//!   dynamic thread vector: glibc x86-64 keeps it in the TCB at fsbase
//!   (`tcbhead_t { void *tcb; dtv_t *dtv; ... }`, `sysdeps/x86_64/nptl/tls.h`),
//!   as an array of 16-byte `dtv_t` (`{ void *val; void *to_free; }`,
//!   `sysdeps/generic/dl-dtv.h`) indexed by module id (checked with
//!   pyenv's builds on Debian 12's glibc 2.36; musl lays its TLS out
//!   otherwise). libpython is loaded at
//!   startup (`DT_NEEDED`), so its block is static TLS, allocated with every
//!   thread; a `dlopen`ed one would have `val == -1` until first use.
//!
//! For the BPF step: the fsbase of the task at an event is
//! `task_struct->thread.fsbase` (x86-64; `bpf_get_current_task_btf()` and
//! BTF give it), so the thread state is one read (`FsRelative`) or three
//! (`TlsIndex`, with the module id and offset read once in userspace from
//! the target's GOT: [`TlsSlot::resolve`]).
//!
//! What it holds: the thread's state while the thread is attached to the
//! interpreter (holds the GIL), and NULL once it has released the GIL, seen
//! on all four 3.12+ builds here for threads in `time.sleep` and waiting on
//! a lock (`tracer stack --check-tls`). An event on a thread without the
//! GIL (a `PyMem_RawMalloc` from a C extension's released section) so has
//! no Python stack to start from: the BPF side should count it as such, not
//! read through NULL.
//!
//! 3.11 has no thread-local thread state; see
//! [`crate::python::frames::CurrentThread`]. Its `tstate_current` is NULL
//! likewise while no thread holds the GIL, and the GIL holder's otherwise.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use thiserror::Error;

use super::remote::Remote;
use crate::discover::elf::ElfImage;

/// The function whose body reads `_Py_tss_tstate` (exported since 3.12).
pub const READER: &str = "_PyThreadState_GetCurrent";

/// How far into [`READER`] the access is looked for: it is the whole body.
const SCAN_BYTES: usize = 64;

/// Why the thread-local could not be located.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{image} has no {READER} to find _Py_tss_tstate by")]
    NoReader { image: String },
    #[error("cannot read {READER} in {image}: {cause}")]
    Read { image: String, cause: crate::discover::elf::ElfError },
    #[error(
        "{READER} in {image} reads no thread-local that tracer knows how to locate (neither `mov %fs:OFFSET` nor `lea; call __tls_get_addr`): {code}"
    )]
    Unrecognised { image: String, code: String },
}

/// Where `_Py_tss_tstate` is for a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsSlot {
    /// At the thread's fsbase plus `offset`.
    FsRelative { offset: i64 },
    /// Through `__tls_get_addr`, with the `tls_index` pair at this
    /// link-time address of the image.
    TlsIndex { tls_index: u64 },
}

/// A [`TlsSlot::TlsIndex`] resolved in one process: what ld.so put in its
/// `tls_index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicTls {
    /// The module id: the image's entry in each thread's DTV.
    pub module: u64,
    /// The variable's offset in the module's TLS block.
    pub offset: u64,
}

impl TlsSlot {
    /// Finds the slot from [`READER`]'s code in `elf` (named `image` in
    /// errors).
    pub fn find(elf: &ElfImage, image: &str) -> Result<Self, TlsError> {
        let f = elf.function(READER).ok_or_else(|| TlsError::NoReader { image: image.to_owned() })?;
        let len = usize::try_from(f.size).ok().filter(|&n| n > 0).map_or(SCAN_BYTES, |n| n.min(SCAN_BYTES));
        let code =
            elf.read_at(f.file_offset, len).map_err(|cause| TlsError::Read { image: image.to_owned(), cause })?;
        decode(&code, f.address).ok_or_else(|| TlsError::Unrecognised { image: image.to_owned(), code: hex(&code) })
    }

    /// The address of the thread's `_Py_tss_tstate`, for the thread whose
    /// fsbase is `fsbase`, in the process `remote` reads; `runtime` turns
    /// the image's link-time addresses into that process's. `None` where
    /// the module's block is not allocated in that thread.
    pub fn resolve(
        self,
        remote: &Remote,
        fsbase: u64,
        runtime: impl Fn(u64) -> Option<u64>,
    ) -> Result<Option<u64>, super::StackError> {
        match self {
            Self::FsRelative { offset } => Ok(Some(fsbase.wrapping_add_signed(offset))),
            Self::TlsIndex { tls_index } => {
                let dynamic = read_index(remote, tls_index, &runtime)?;
                if dynamic.module == 0 {
                    // ld.so has not filled it in: nothing to read through.
                    return Ok(None);
                }
                // glibc x86-64: tcbhead_t.dtv is the second word of the TCB,
                // which fsbase points to; each dtv_t is 16 bytes.
                let dtv = remote.u64(fsbase.wrapping_add(8), "the thread's DTV pointer")?;
                let block =
                    remote.u64(dtv.wrapping_add(dynamic.module.wrapping_mul(16)), "the DTV entry of libpython")?;
                // TLS_DTV_UNALLOCATED is (void *) -1.
                Ok((block != u64::MAX && block != 0).then(|| block.wrapping_add(dynamic.offset)))
            }
        }
    }

    /// For [`TlsSlot::TlsIndex`], what ld.so put in its `tls_index` in the
    /// process `remote` reads: the pair the BPF side needs.
    pub fn dynamic(
        self,
        remote: &Remote,
        runtime: impl Fn(u64) -> Option<u64>,
    ) -> Result<Option<DynamicTls>, super::StackError> {
        match self {
            Self::FsRelative { .. } => Ok(None),
            Self::TlsIndex { tls_index } => read_index(remote, tls_index, &runtime).map(Some),
        }
    }
}

/// The `tls_index` pair at the image's link-time address `tls_index`, as
/// the process `remote` reads has it.
fn read_index(
    remote: &Remote,
    tls_index: u64,
    runtime: &impl Fn(u64) -> Option<u64>,
) -> Result<DynamicTls, super::StackError> {
    let at = runtime(tls_index).ok_or(super::StackError::NotMapped {
        pid: remote.pid(),
        what: "the tls_index",
        address: tls_index,
    })?;
    let module = remote.u64(at, "the tls_index module id")?;
    let offset = remote.u64(at.wrapping_add(8), "the tls_index offset")?;
    Ok(DynamicTls { module, offset })
}

/// The slot `code` (at link-time address `address`) reads, if it is one
/// of the two shapes.
fn decode(code: &[u8], address: u64) -> Option<TlsSlot> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut lea_rdi = None;
    while decoder.can_decode() {
        let i = decoder.decode();
        if i.is_invalid() {
            return None;
        }
        let memory = (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Memory);
        if i.mnemonic() == Mnemonic::Mov
            && memory
            && i.segment_prefix() == Register::FS
            && i.memory_base() == Register::None
            && i.memory_index() == Register::None
        {
            // The displacement is a sign-extended 32-bit value.
            return Some(TlsSlot::FsRelative { offset: i64::from_le_bytes(i.memory_displacement64().to_le_bytes()) });
        }
        if i.mnemonic() == Mnemonic::Lea && i.op0_register() == Register::RDI && i.is_ip_rel_memory_operand() {
            lea_rdi = Some(i.ip_rel_memory_address());
        } else if i.mnemonic() == Mnemonic::Call {
            return lea_rdi.map(|tls_index| TlsSlot::TlsIndex { tls_index });
        } else if i.mnemonic() == Mnemonic::Ret {
            return None;
        }
    }
    None
}

fn hex(code: &[u8]) -> String {
    code.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_local_exec() {
        // endbr64; mov %fs:0xffffffffffffffe8,%rax; ret (the forky root's
        // python3.14).
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x64, 0x48, 0x8b, 0x04, 0x25, 0xe8, 0xff, 0xff, 0xff, 0xc3];
        assert_eq!(decode(&code, 0x76_d7d0), Some(TlsSlot::FsRelative { offset: -0x18 }));
    }

    #[test]
    fn decodes_general_dynamic() {
        // sub $8,%rsp; data16 lea 0x26dbd4(%rip),%rdi; data16 data16 rex.W
        // call __tls_get_addr@plt; mov (%rax),%rax (pyenv's 3.12.1).
        let code = [
            0x48, 0x83, 0xec, 0x08, 0x66, 0x48, 0x8d, 0x3d, 0xd4, 0xdb, 0x26, 0x00, 0x66, 0x66, 0x48, 0xe8, 0xbf, 0x22,
            0xe3, 0xff, 0x48, 0x8b, 0x00,
        ];
        assert_eq!(decode(&code, 0x2d_6310), Some(TlsSlot::TlsIndex { tls_index: 0x54_3ef0 }));
    }

    #[test]
    fn refuses_other_code() {
        // mov (%rdi),%rax; ret
        assert_eq!(decode(&[0x48, 0x8b, 0x07, 0xc3], 0), None);
    }
}
