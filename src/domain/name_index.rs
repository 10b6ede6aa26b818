//! `NameIndex`: a compact hash index from domain names to small values.
//!
//! Names live back to back in one string arena; the hash table holds only an offset, a length and
//! the value (16 bytes a slot with the table's entries), so a million names cost their bytes plus
//! 20 to 40 bytes each (a slot and a control byte, as full as the hash table happens to be), with
//! no allocation per name and no pointer chasing beyond the arena.

use std::hash::BuildHasher;

use hashbrown::HashTable;

#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    offset: u32,
    len: u8,
    value: V,
}

/// Names (at most 255 bytes each) to values of `V`.
#[derive(Debug, Default)]
pub struct NameIndex<V> {
    names: String,
    table: HashTable<Slot<V>>,
    hasher: foldhash::fast::RandomState,
}

fn name_of<'a, V>(names: &'a str, slot: &Slot<V>) -> &'a str {
    &names[slot.offset as usize..slot.offset as usize + slot.len as usize]
}

impl<V: Copy + Default> NameIndex<V> {
    pub fn with_capacity(names: usize, bytes: usize) -> Self {
        NameIndex {
            names: String::with_capacity(bytes),
            table: HashTable::with_capacity(names),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// Makes room for `names` more names of `bytes` bytes in all.
    pub fn reserve(&mut self, names: usize, bytes: usize) {
        self.names.reserve(bytes);
        let (arena, hasher) = (&self.names, &self.hasher);
        self.table
            .reserve(names, |s| hasher.hash_one(name_of(arena, s)));
    }

    pub fn get(&self, name: &str) -> Option<(&str, &V)> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |s| name_of(&self.names, s) == name)
            .map(|s| (name_of(&self.names, s), &s.value))
    }

    /// The value of `name`, inserted as `V::default()` if absent.
    ///
    /// Panics if `name` is longer than 255 bytes or the arena outgrows 4 GiB; domain names are
    /// at most 253 bytes.
    pub fn get_or_insert(&mut self, name: &str) -> &mut V {
        let hash = self.hasher.hash_one(name);
        let (arena, hasher) = (&mut self.names, &self.hasher);
        let found = self
            .table
            .find(hash, |s| name_of(arena, s) == name)
            .is_some();
        if !found {
            let slot = Slot {
                offset: u32::try_from(arena.len()).expect("name arena over 4 GiB"),
                len: u8::try_from(name.len()).expect("name over 255 bytes"),
                value: V::default(),
            };
            arena.push_str(name);
            let arena: &String = arena;
            self.table
                .insert_unique(hash, slot, |s| hasher.hash_one(name_of(arena, s)));
        }
        let arena = &self.names;
        &mut self
            .table
            .find_mut(hash, |s| name_of(arena, s) == name)
            .expect("inserted above")
            .value
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

    /// Heap bytes held (arena and table), for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.names.capacity() + self.table.capacity() * (std::mem::size_of::<Slot<V>>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
