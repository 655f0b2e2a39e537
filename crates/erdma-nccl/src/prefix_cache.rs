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
const MAX_KEY: usize = 128;

/// Direct-mapped cache: prefix bytes and file → process index. Memory: at most
/// `SLOTS * MAX_KEY` bytes of keys.
#[derive(Debug, Default)]
pub struct PrefixCache {
    slots: Vec<Option<Slot>>,
}

#[derive(Debug)]
struct Slot {
    file: usize,
    process: usize,
    key: Vec<u8>,
}

impl PrefixCache {
    /// Forgets every prefix (a process index they name was superseded: a process restarted).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }

    /// The process remembered for `pre` in `file`.
    pub fn get(&self, file: usize, pre: &[u8]) -> Option<usize> {
        let slot = self.slots.get(slot_of(pre))?.as_ref()?;
        (slot.file == file && slot.key == pre).then_some(slot.process)
    }

    /// Remembers that `pre` in `file` belongs to `process` (replacing what the slot held).
    pub fn put(&mut self, file: usize, pre: &[u8], process: usize) {
        if pre.len() > MAX_KEY {
            return;
        }
        if self.slots.is_empty() {
            self.slots.resize_with(SLOTS, || None);
        }
        let slot = &mut self.slots[slot_of(pre)];
        match slot {
            Some(s) => {
                s.file = file;
                s.process = process;
                s.key.clear();
                s.key.extend_from_slice(pre);
            }
            None => {
                *slot = Some(Slot {
                    file,
                    process,
                    key: pre.to_vec(),
                });
            }
        }
    }
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

    #[test]
    fn long_prefixes_are_not_kept() {
        let mut c = PrefixCache::default();
        let long = vec![b'x'; MAX_KEY + 1];
        c.put(0, &long, 1);
        assert_eq!(c.get(0, &long), None);
    }
}
