//! Objects created and destroyed, by type: with `--types`, each new
//! reference reads the object's type pointer, counts one creation under it
//! and keeps the object's address in a table (address -> type); the object
//! domain's free looks the freed block's object up there and counts one
//! destruction under its type.

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

/// What the types map counts per (process, type).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeCounts {
    /// New references to objects of this type.
    pub created: u64,
    /// Objects of this type tracer saw created whose block the object
    /// domain's free gave back.
    pub destroyed: u64,
    /// Objects of this type tracer saw created that died without a free it
    /// saw: a later new reference was made at the same address (a free
    /// list gave the memory out again, or the object was resized in place).
    pub reused: u64,
}

const _: () = assert!(core::mem::size_of::<TypeCounts>() == 24);

impl TypeCounts {
    /// The sum of two per-CPU values.
    #[must_use]
    pub const fn merged(self, other: Self) -> Self {
        Self {
            created: self.created.wrapping_add(other.created),
            destroyed: self.destroyed.wrapping_add(other.destroyed),
            reused: self.reused.wrapping_add(other.reused),
        }
    }
}

/// Key of the objects table: an object tracer saw created, by process and
/// address; its value is the address of its type object.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Thread-group id of the process the object lives in.
    pub tgid: u32,
    /// Always 0: the padding before `address`, spelt out.
    pub reserved: u32,
    /// The object's address (`PyObject *`).
    pub address: u64,
}

const _: () = assert!(core::mem::size_of::<ObjectKey>() == 16);

/// How many pre-header sizes the free tries: a freed block starts at its
/// object minus `_PyType_PreHeaderSize` (see `tracer-user`'s python
/// module), which is one of these few values.
pub const PRE_HEADERS: usize = 3;

/// Default size of the objects table in the object file; the loader sets
/// the real size.
pub const DEFAULT_OBJECT_ENTRIES: u32 = 4096;

/// Default size of the types map in the object file; the loader sets the
/// real size.
pub const DEFAULT_TYPE_ENTRIES: u32 = 4096;

#[cfg(feature = "user")]
// SAFETY: TypeKey is #[repr(C)], Copy, has no padding (the padding is the
// named `reserved` field, asserted by the size above) and every bit pattern
// is valid.
unsafe impl aya::Pod for TypeKey {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, three u64 with no padding (asserted above);
// every bit pattern is valid.
unsafe impl aya::Pod for TypeCounts {}

#[cfg(feature = "user")]
// SAFETY: as for TypeKey: the padding is the named `reserved` field.
unsafe impl aya::Pod for ObjectKey {}
