//! Objects created, by type: with `--types`, each new reference reads the
//! object's type pointer and counts one creation under it.

/// Key of the types map: which process created an object of which type.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TypeKey {
    /// Thread-group id (the process id) that created the object.
    pub tgid: u32,
    /// Always 0: spells out the padding before `type_address`, so that the
    /// kernel hashes no uninitialised bytes.
    pub reserved: u32,
    /// The address of the type object in that process (`ob_type`).
    pub type_address: u64,
}

const _: () = assert!(core::mem::size_of::<TypeKey>() == 16);

/// Default size of the types map in the object file; the loader sets the
/// real size.
pub const DEFAULT_TYPE_ENTRIES: u32 = 4096;

#[cfg(feature = "user")]
// SAFETY: TypeKey is #[repr(C)], Copy, has no padding (the padding is the
// named `reserved` field, asserted by the size above) and every bit pattern
// is valid.
unsafe impl aya::Pod for TypeKey {}
