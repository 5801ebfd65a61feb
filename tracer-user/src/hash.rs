//! Hashing addresses, fast.

/// A hasher for addresses (pools, types, objects, instructions), which
/// share their low bits: `SplitMix64`'s finaliser spreads every bit over
/// the hash, at a fraction of `SipHash`'s cost on the census's hottest
/// path and over every instruction of an image. Addresses
/// come from the target, but a collision costs time, not correctness.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildIdentity;

impl std::hash::BuildHasher for BuildIdentity {
    type Hasher = AddressHasher;
    fn build_hasher(&self) -> AddressHasher {
        AddressHasher(0)
    }
}

/// See [`BuildIdentity`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        let mut z = n;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = z ^ (z >> 31);
    }
}
