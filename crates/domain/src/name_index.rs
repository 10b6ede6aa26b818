//! `NameIndex`: a compact hash index from domain names to small values, in shards that a build
//! fills and walks in parallel.
//!
//! Names live back to back in string arenas; the hash tables hold only an offset, a length and
//! the value (16 bytes a slot with the table's entries), so a million names cost their bytes plus
//! 20 to 40 bytes each (a slot and a control byte, as full as the hash table happens to be), with
//! no allocation per name and no pointer chasing beyond the arena.
//!
//! The index is [`SHARDS`] such arenas and tables, a name's shard chosen by bits of its hash that
//! the tables themselves do not use (a lookup costs one more array index into a line that stays
//! in cache). Shards share nothing, so a build of millions of names inserts into and walks each
//! shard on its own thread, and no allocation is larger than a shard's: a table of 3M names is
//! 64 blocks of a few MB, which the allocator hands back to the system whole when a table is
//! dropped, instead of three blocks of 100 MB and their transient doubles while they grow.

use std::hash::BuildHasher;
use std::mem::size_of;

use hashbrown::HashTable;

use super::parallel::for_each_split;

/// How many shards an index has (a power of two).
pub const SHARDS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    offset: u32,
    len: u8,
    value: V,
}

/// One shard: its names' arena and its hash table.
#[derive(Debug, Default)]
pub struct Shard<V> {
    names: String,
    table: HashTable<Slot<V>>,
}

/// Names (at most 255 bytes each) to values of `V`.
#[derive(Debug)]
pub struct NameIndex<V> {
    shards: Box<[Shard<V>]>,
    hasher: foldhash::fast::RandomState,
}

impl<V> Default for NameIndex<V> {
    fn default() -> Self {
        NameIndex {
            shards: (0..SHARDS).map(|_| Shard::new()).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

fn name_of<'a, V>(names: &'a str, slot: &Slot<V>) -> &'a str {
    &names[slot.offset as usize..slot.offset as usize + slot.len as usize]
}

/// The buckets a hash table of `capacity` has: the table fills at most 7/8 of them (and
/// allocates them all, a slot and a control byte each, whatever it holds).
fn buckets(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..=7 => (capacity + 1).next_power_of_two(),
        _ => (capacity * 8 / 7).next_power_of_two(),
    }
}

/// The shard of a hash: bits 32 to 37, which the tables ignore (a table's bucket is picked by the
/// low bits, its control byte by the top 7), so every shard's table still sees well-spread hashes.
pub fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

impl<V> Shard<V> {
    fn new() -> Self {
        Shard {
            names: String::new(),
            table: HashTable::new(),
        }
    }
}

impl<V: Copy + Default> Shard<V> {
    /// Makes room for `names` more names of `bytes` bytes in all.
    pub fn reserve(&mut self, names: usize, bytes: usize, hasher: &impl BuildHasher) {
        self.names.reserve(bytes);
        let arena = &self.names;
        self.table
            .reserve(names, |s| hasher.hash_one(name_of(arena, s)));
    }

    /// The value of `name` (whose hash is `hash`), inserted as `V::default()` if absent.
    ///
    /// Panics if `name` is longer than 255 bytes or the arena outgrows 4 GiB; domain names are
    /// at most 253 bytes.
    pub fn get_or_insert(&mut self, hash: u64, name: &str, hasher: &impl BuildHasher) -> &mut V {
        let arena = &mut self.names;
        let entry = self.table.entry(
            hash,
            |s| name_of(arena, s) == name,
            |s| hasher.hash_one(name_of(arena, s)),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(e) => &mut e.into_mut().value,
            hashbrown::hash_table::Entry::Vacant(e) => {
                let slot = Slot {
                    offset: u32::try_from(arena.len()).expect("name arena over 4 GiB"),
                    len: u8::try_from(name.len()).expect("name over 255 bytes"),
                    value: V::default(),
                };
                arena.push_str(name);
                &mut e.insert(slot).into_mut().value
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.table
            .iter()
            .map(|s| (name_of(&self.names, s), &s.value))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        let names = &self.names;
        self.table
            .iter_mut()
            .map(move |s| (name_of(names, s), &mut s.value))
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Gives back the arena's spare room (it grew by doubling) and the table's, when it holds
    /// much less than it could.
    fn shrink(&mut self, hasher: &impl BuildHasher) {
        self.names.shrink_to_fit();
        let arena = &self.names;
        self.table
            .shrink_to(self.table.len(), |s| hasher.hash_one(name_of(arena, s)));
    }
}

impl<V: Copy + Default + Send + Sync> NameIndex<V> {
    pub fn with_capacity(names: usize, bytes: usize) -> Self {
        let mut index = Self::default();
        index.reserve(names, bytes);
        index
    }

    /// Makes room for `names` more names of `bytes` bytes in all, spread evenly over the shards
    /// (with a margin: the hash spreads them only about evenly).
    pub fn reserve(&mut self, names: usize, bytes: usize) {
        let per = |n: usize| n / SHARDS + n / SHARDS / 16 + 8;
        let hasher = &self.hasher;
        for shard in self.shards.iter_mut() {
            shard.reserve(per(names), per(bytes), hasher);
        }
    }

    /// The hash of `name` in this index (it picks the shard, see [`shard_of`]).
    pub fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    pub fn get(&self, name: &str) -> Option<(&str, &V)> {
        let hash = self.hasher.hash_one(name);
        let shard = &self.shards[shard_of(hash)];
        shard
            .table
            .find(hash, |s| name_of(&shard.names, s) == name)
            .map(|s| (name_of(&shard.names, s), &s.value))
    }

    /// The value of `name`, inserted as `V::default()` if absent.
    ///
    /// Panics if `name` is longer than 255 bytes or the arena outgrows 4 GiB; domain names are
    /// at most 253 bytes.
    pub fn get_or_insert(&mut self, name: &str) -> &mut V {
        let hash = self.hasher.hash_one(name);
        let hasher = &self.hasher;
        self.shards[shard_of(hash)].get_or_insert(hash, name, hasher)
    }

    /// Runs `work` on every shard (with its number and this index's hasher), spread over
    /// `threads` threads; the results in shard order.
    pub fn par_shards_mut<R: Send>(
        &mut self,
        threads: usize,
        work: impl Fn(usize, &mut Shard<V>, &foldhash::fast::RandomState) -> R + Sync,
    ) -> Vec<R> {
        let hasher = &self.hasher;
        for_each_split(&mut self.shards, threads, |i, shard| work(i, shard, hasher))
    }

    /// Runs `work` on every shard, spread over `threads` threads, reading only (`work` may read
    /// the whole index too); the results in shard order.
    pub fn par_shards<'a, R: Send>(
        &'a self,
        threads: usize,
        work: impl Fn(&'a Shard<V>) -> R + Sync,
    ) -> Vec<R> {
        let mut refs: Vec<&'a Shard<V>> = self.shards.iter().collect();
        for_each_split(&mut refs, threads, |_, shard| work(shard))
    }

    /// Gives back the spare room of every shard, once no name will be added.
    pub fn shrink(&mut self, threads: usize) {
        self.par_shards_mut(threads, |_, shard, hasher| shard.shrink(hasher));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.shards.iter().flat_map(Shard::iter)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.shards.iter_mut().flat_map(Shard::iter_mut)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(Shard::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(Shard::is_empty)
    }

    /// Heap bytes held (arenas and tables), for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.names.capacity() + buckets(s.table.capacity()) * (size_of::<Slot<V>>() + 1))
            .sum::<usize>()
            + std::mem::size_of_val(&*self.shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn inserts_finds_and_updates() {
        let mut idx: NameIndex<u8> = NameIndex::with_capacity(2, 16);
        *idx.get_or_insert("a.com") |= 1;
        *idx.get_or_insert("b.com") |= 2;
        *idx.get_or_insert("a.com") |= 4;
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.get("a.com"), Some(("a.com", &5)));
        assert_eq!(idx.get("c.com"), None);
        for i in 0..1000 {
            idx.get_or_insert(&format!("n{i}.com"));
        }
        assert_eq!(idx.len(), 1002);
        assert_eq!(idx.get("n999.com").map(|(k, _)| k), Some("n999.com"));
        let mut names: Vec<_> = idx.iter().map(|(k, _)| k.to_owned()).collect();
        names.sort();
        assert_eq!(names[0], "a.com");
        for (_, v) in idx.iter_mut() {
            *v = 9;
        }
        assert_eq!(idx.get("b.com"), Some(("b.com", &9)));
        idx.shrink(2);
        assert_eq!(idx.get("n5.com"), Some(("n5.com", &9)));
    }

    proptest! {
        /// Inserting through the shards in parallel (each name into the shard its hash picks)
        /// gives the index, and the answers, of inserting one name after another: a plain map's.
        #[test]
        fn parallel_shard_inserts_answer_like_a_map(
            names in proptest::collection::vec("[a-e]{1,4}\\.(com|net)", 0..300),
            probes in proptest::collection::vec("[a-e]{1,4}\\.(com|net|org)", 0..50),
            threads in 1usize..4,
        ) {
            let mut model: HashMap<&str, u32> = HashMap::new();
            let mut serial: NameIndex<u32> = NameIndex::default();
            for (i, n) in names.iter().enumerate() {
                *model.entry(n).or_default() += i as u32;
                *serial.get_or_insert(n) += i as u32;
            }
            let mut parallel: NameIndex<u32> = NameIndex::with_capacity(names.len(), 0);
            let hashes: Vec<u64> = names.iter().map(|n| parallel.hash(n)).collect();
            parallel.par_shards_mut(threads, |s, shard, hasher| {
                for (i, n) in names.iter().enumerate().filter(|(i, _)| shard_of(hashes[*i]) == s) {
                    *shard.get_or_insert(hashes[i], n, hasher) += i as u32;
                }
            });
            parallel.shrink(threads);
            for idx in [&serial, &parallel] {
                prop_assert_eq!(idx.len(), model.len());
                for p in names.iter().chain(&probes) {
                    prop_assert_eq!(idx.get(p).map(|(k, v)| (k.to_owned(), *v)),
                        model.get(p.as_str()).map(|v| (p.clone(), *v)));
                }
                let counted: usize = idx.par_shards(threads, |s| s.len()).into_iter().sum();
                prop_assert_eq!(counted, model.len());
            }
        }
    }
}
