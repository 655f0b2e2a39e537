//! Which process a raw line prefix belongs to, remembered: a small direct-mapped cache from the
//! bytes before the ` NCCL ` marker (`host:pid:tid [dev]`) to a process index.
//!
//! Ranks interleave in a log, so the last process rarely writes the next line, but a few
//! thousand distinct prefixes (`host:pid:tid`, one per thread) cover a whole job: a hit skips the prefix parse (UTF-8 check, tokens
//! from the right) and the `host:pid` hash lookup. The process of a prefix is a pure function of
//! its bytes and the input file, which both make up the key.

/// Slots of the cache (a power of two).
const SLOTS: usize = 8192;
/// Longest prefix kept; longer ones (launcher noise) are parsed every time.
const MAX_KEY: usize = 118;

/// Direct-mapped cache: prefix bytes and file → process index. A slot holds its key inline (two
/// cache lines, one for the usual short prefix), so a look-up reads one place in memory: 1 MiB at
/// most, allocated at the first insertion.
#[derive(Debug, Default)]
pub struct PrefixCache {
    slots: Vec<Slot>,
}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Slot {
    process: u32,
    file: u32,
    /// Key length plus one; 0 for an empty slot.
    len: u8,
    key: [u8; MAX_KEY],
}

const EMPTY: Slot = Slot {
    process: 0,
    file: 0,
    len: 0,
    key: [0; MAX_KEY],
};

impl PrefixCache {
    /// Forgets every prefix (a process index they name was superseded: a process restarted).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| s.len = 0);
    }

    /// The process remembered for `pre` in `file`.
    #[inline]
    pub fn get(&self, file: usize, pre: &[u8]) -> Option<usize> {
        let slot = self.slots.get(slot_of(pre))?;
        let len = usize::from(slot.len);
        (len == pre.len() + 1
            && u32::try_from(file) == Ok(slot.file)
            && same(&slot.key[..pre.len()], pre))
        .then_some(slot.process as usize)
    }

    /// Remembers that `pre` in `file` belongs to `process` (replacing what the slot held).
    pub fn put(&mut self, file: usize, pre: &[u8], process: usize) {
        let (Ok(len), Ok(file), Ok(process)) = (
            u8::try_from(pre.len() + 1),
            u32::try_from(file),
            u32::try_from(process),
        ) else {
            return;
        };
        if pre.len() > MAX_KEY {
            return;
        }
        if self.slots.is_empty() {
            self.slots.resize(SLOTS, EMPTY);
        }
        let slot = &mut self.slots[slot_of(pre)];
        slot.len = len;
        slot.key[..pre.len()].copy_from_slice(pre);
        slot.file = file;
        slot.process = process;
    }
}

/// `a == b` for two slices of the same length, 8 bytes at a time without a call (prefixes are
/// a few dozen bytes; `memcmp`'s call and dispatch cost more than the comparison).
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut x = a.chunks_exact(8);
    let mut y = b.chunks_exact(8);
    for (p, q) in (&mut x).zip(&mut y) {
        if p.first_chunk::<8>() != q.first_chunk::<8>() {
            return false;
        }
    }
    x.remainder().iter().zip(y.remainder()).all(|(p, q)| p == q)
}

/// Slot of a key: a multiplicative hash of its 8-byte words (the varying part of a prefix, pid
/// and tid, is in its last bytes).
fn slot_of(key: &[u8]) -> usize {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    }
    let mut b = [0u8; 8];
    b[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(23) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    (h >> 51) as usize % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_per_file_and_key_and_forgets_on_collision() {
        let mut c = PrefixCache::default();
        assert_eq!(c.get(0, b"vm:1:1 [0]"), None);
        c.put(0, b"vm:1:1 [0]", 7);
        assert_eq!(c.get(0, b"vm:1:1 [0]"), Some(7));
        assert_eq!(c.get(1, b"vm:1:1 [0]"), None, "another file");
        assert_eq!(c.get(0, b"vm:1:2 [0]"), None, "another tid");
        // A key that maps to the same slot replaces the first one.
        let other = (0u32..)
            .map(|i| format!("h{i}:2:2 [1]").into_bytes())
            .find(|k| slot_of(k) == slot_of(b"vm:1:1 [0]"))
            .expect("some key shares the slot");
        c.put(0, &other, 9);
        assert_eq!(c.get(0, &other), Some(9));
        assert_eq!(c.get(0, b"vm:1:1 [0]"), None);
    }

    proptest::proptest! {
        /// The cache answers a key's last insertion in its file, or nothing (a collision).
        #[test]
        fn answers_the_last_put_or_nothing(
            ops in proptest::collection::vec((0usize..3, proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b':', b'1']), 0..130), 0usize..100), 0..200),
        ) {
            let mut c = PrefixCache::default();
            let mut last = std::collections::HashMap::new();
            for (file, key, process) in &ops {
                c.put(*file, key, *process);
                if key.len() <= MAX_KEY {
                    last.insert((*file, key.clone()), *process);
                }
                let got = c.get(*file, key);
                proptest::prop_assert_eq!(got, last.get(&(*file, key.clone())).copied().filter(|_| key.len() <= MAX_KEY));
            }
            for (file, key, _) in &ops {
                if let Some(p) = c.get(*file, key) {
                    proptest::prop_assert_eq!(Some(&p), last.get(&(*file, key.clone())));
                }
            }
        }
    }

    #[test]
    fn long_prefixes_are_not_kept() {
        let mut c = PrefixCache::default();
        let long = vec![b'x'; MAX_KEY + 1];
        c.put(0, &long, 1);
        assert_eq!(c.get(0, &long), None);
    }
}
