//! How far the census goes outside the pools ([`Limits`]), and what it
//! found there ([`Found`]): shared by the walk outside the pools
//! ([`super::outside`]) and the dicts' tables it reads ([`super::dicts`]).

/// How far the census goes outside the pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// GC heads read at most.
    pub gc_objects: u64,
    /// Items of item arrays read at most.
    pub items: u64,
    /// Objects outside the pools read at most.
    pub referenced: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { gc_objects: 10_000_000, items: 200_000_000, referenced: 10_000_000 }
    }
}

/// What the census found outside the pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// GC objects found on the collector's lists.
    pub gc_objects: u64,
    /// Objects found as items of tuples and lists and in dicts.
    pub referenced_objects: u64,
    /// Items of item arrays read.
    pub items_read: u64,
    /// Which limit was reached, if one was.
    pub gc_truncated: bool,
    pub items_truncated: bool,
    pub referenced_truncated: bool,
}
