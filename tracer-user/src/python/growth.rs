//! What heap growth sampling (`--growth`) needs of CPython: the function
//! where pymalloc takes a pool from empty, where it finds the arena it
//! takes it from, and the call that marks a new arena used. What differs
//! between versions follows from where pymalloc keeps its state
//! ([`super::heap::Obmalloc`], in each version module).
//!
//! Objects/obmalloc.c at v3.11.2: `static void* allocate_from_new_pool(uint
//! size)` reads the file-static `usable_arenas`; when it is NULL,
//! `new_arena()` (inlined into it on every build here) maps an arena and
//! calls `arena_map_mark_used(uintptr_t arena_base, int is_used)`.
//! At v3.12.1, v3.13.0, v3.13.15 and v3.14.8 both take `OMState *state`
//! first (`allocate_from_new_pool(OMState *state, uint size)`,
//! `arena_map_mark_used(OMState *state, uintptr_t arena_base, int
//! is_used)`), and `usable_arenas` is `state->mgmt.usable_arenas`. Both
//! functions are static: found in a symbol table only (`.lto_priv.0`
//! suffixed on LTO builds, whose debug file has the table).

use super::{
    Abi,
    heap::{Obmalloc, obmalloc_state},
};

/// pymalloc's slow path: takes a pool from empty for a size class with
/// none that has room.
pub const TAKE_FUNCTION: &str = "allocate_from_new_pool";
/// Marks a new arena's address range used in pymalloc's radix tree: called
/// once per arena mapped, with its address.
pub const MARK_USED_FUNCTION: &str = "arena_map_mark_used";

/// DWARF x86-64 numbers of the argument registers used here.
pub const RDI: u16 = 5;
pub const RSI: u16 = 4;

/// Where `allocate_from_new_pool` finds `usable_arenas`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usable {
    /// 3.11: a file-static variable of this name (its address from a
    /// symbol table).
    Static(&'static str),
    /// 3.12+: at this offset in the `OMState *` of the first argument.
    InState { offset: u64 },
}

/// What growth sampling needs of a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthKnowledge {
    pub usable: Usable,
    /// The argument register (DWARF number) of `arena_map_mark_used` that
    /// holds the new arena's address.
    pub arena_register: u16,
    /// pymalloc's pool size: what one pool sampled stands for.
    pub pool_size: u64,
}

/// Why growth sampling cannot serve `abi`'s version, where it cannot.
#[must_use]
pub fn refusal(abi: &dyn Abi) -> Option<String> {
    match abi.minor() {
        // Objects/obmalloc.c at v3.9.18: no `WITH_PYMALLOC_RADIX_TREE`, so
        // `new_arena` calls no [`MARK_USED_FUNCTION`] (pyenv's 3.9.18 has
        // no such symbol). That call is where growth tells an arena
        // pymalloc maps from the C library's heap growing: without it
        // every new arena would be counted as the C library's (tried: on
        // tests/python/growth.py, `churn` then carried about half of the
        // growth, all of it arenas).
        9 => Some(format!(
            "Python 3.{} is not sampled: it has no `{MARK_USED_FUNCTION}` (pymalloc's radix tree came in 3.10), where growth tells pymalloc's new arenas from the C library's heap growing",
            abi.minor()
        )),
        _ => None,
    }
}

/// What growth sampling needs of `abi`'s version.
#[must_use]
pub fn knowledge(abi: &dyn Abi) -> GrowthKnowledge {
    let pool_size = abi.heap().geometry.pool;
    match abi.heap().obmalloc {
        // `static struct arena_object* usable_arenas` (Objects/obmalloc.c
        // at v3.11.2, l.1257; the same at v3.9.18 and v3.10.13, where 3.9
        // has no `arena_map_mark_used`: no radix tree before 3.10).
        Obmalloc::Statics { .. } => {
            GrowthKnowledge { usable: Usable::Static("usable_arenas"), arena_register: RDI, pool_size }
        }
        Obmalloc::Embedded { .. } | Obmalloc::Pointer { .. } => GrowthKnowledge {
            usable: Usable::InState { offset: obmalloc_state::USABLE_ARENAS },
            arena_register: RSI,
            pool_size,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::heap::{POOL_SIZE, arena_object};

    #[test]
    fn the_kernel_reads_the_fields_the_census_knows() {
        use tracer_common::growth as g;
        assert_eq!(g::ARENA_FREEPOOLS, arena_object::FREEPOOLS as u64);
        assert_eq!(g::ARENA_POOL_ADDRESS, arena_object::POOL_ADDRESS as u64);
        assert_eq!(g::POOL_SIZE, POOL_SIZE);
        let v = |minor| crate::python::PythonVersion { major: 3, minor, micro: 0, level: 0xf, serial: 0 };
        let of = |minor| knowledge(crate::python::abi_for_image(std::path::Path::new("x"), v(minor)).unwrap());
        assert_eq!(
            of(11),
            GrowthKnowledge { usable: Usable::Static("usable_arenas"), arena_register: RDI, pool_size: POOL_SIZE }
        );
        assert_eq!(of(9).pool_size, 4096);
        for minor in 12..=14 {
            assert_eq!(of(minor).usable, Usable::InState { offset: 536 });
            assert_eq!(of(minor).arena_register, RSI);
        }
    }
}
