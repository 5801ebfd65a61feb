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
    /// Rounds of items leading to objects whose items lead further: the
    /// depth, in containers outside the pools that no GC list holds
    /// (untracked tuples and dicts), that the census follows.
    pub rounds: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self { gc_objects: 10_000_000, items: 200_000_000, referenced: 10_000_000, rounds: 8 }
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
    /// Item arrays and dict tables left unread after the last round.
    pub rounds_left: u64,
}

impl Found {
    /// The limits reached, by their names in [`Limits`]: what the census's
    /// report says it left out (`outside.cut`).
    #[must_use]
    pub fn cut(&self) -> Vec<String> {
        [
            (self.gc_truncated, "gc_objects"),
            (self.items_truncated, "items"),
            (self.referenced_truncated, "referenced"),
            (self.rounds_left > 0, "rounds"),
        ]
        .iter()
        .filter(|(reached, _)| *reached)
        .map(|(_, name)| (*name).to_owned())
        .collect()
    }
}
