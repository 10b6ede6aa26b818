//! A map split in shards, each shared between copies until one of them changes it: a copy
//! costs the number of shards, a change its own shard's entries, whatever the map holds.
//! The sets a gateway holds by project (overrides, records) are copied at each write.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Arc;

/// Shards a map: a copy touches this many shared counts, a change `len / SHARDS` entries.
const SHARDS: usize = 64;

/// A map of `K` to `V` in 64 shards (see the module), each a `HashMap` hashing with `S`.
#[derive(Debug)]
pub struct Shards<K, V, S = RandomState> {
    shards: Vec<Arc<HashMap<K, V, S>>>,
}

impl<K, V, S> Clone for Shards<K, V, S> {
    fn clone(&self) -> Self {
        Shards {
            shards: self.shards.clone(),
        }
    }
}

impl<K, V, S: Default> Default for Shards<K, V, S> {
    fn default() -> Self {
        Shards {
            shards: (0..SHARDS).map(|_| Arc::new(HashMap::default())).collect(),
        }
    }
}

/// The shard of `key`: FNV-1a over what it hashes (the map inside hashes again with its own
/// keys; this one only spreads, and costs a few instructions a byte on the request path).
fn shard_of<Q: Hash + ?Sized>(key: &Q) -> usize {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            // MurmurHash3's finaliser: FNV alone leaves short keys' high bits alike.
            let mut h = self.0;
            h ^= h >> 33;
            h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^= h >> 33;
            h
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    key.hash(&mut h);
    // The high bits mix best; SHARDS is a power of two.
    (h.finish() >> 58) as usize % SHARDS
}

impl<K: Hash + Eq, V, S: BuildHasher> Shards<K, V, S> {
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].get(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|s| s.values())
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.is_empty())
    }

    /// The shards, in their fixed order (a key is always in the same one): for what keeps
    /// each shard apart, as a file a shard.
    pub fn shards(&self) -> impl ExactSizeIterator<Item = &HashMap<K, V, S>> {
        self.shards.iter().map(|s| &**s)
    }

    /// Whether shard `i` is shared with `other`'s (then the two hold the same there).
    pub fn shares(&self, other: &Shards<K, V, S>, i: usize) -> bool {
        Arc::ptr_eq(&self.shards[i], &other.shards[i])
    }

    /// The shards of `self` and `other` that are not shared, side by side: where the two
    /// maps may differ (a copy changed in a few keys differs in their shards alone).
    pub fn unshared<'a>(
        &'a self,
        other: &'a Shards<K, V, S>,
    ) -> impl Iterator<Item = (&'a HashMap<K, V, S>, &'a HashMap<K, V, S>)> {
        (self.shards.iter().zip(&other.shards))
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .map(|(a, b)| (&**a, &**b))
    }
}

impl<K: Hash + Eq + Clone, V: Clone, S: BuildHasher + Clone> Shards<K, V, S> {
    /// The value of `key` to change (its shard copied first when another map shares it).
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.holding(key)?.get_mut(key)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        Arc::make_mut(&mut self.shards[shard_of(&key)]).insert(key, value)
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.holding(key)?.remove(key)
    }

    /// The shard holding `key` to change (copied first when another map shares it); none
    /// when it holds no `key` (nothing copied).
    fn holding<Q>(&mut self, key: &Q) -> Option<&mut HashMap<K, V, S>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = &mut self.shards[shard_of(key)];
        shard.contains_key(key).then(|| Arc::make_mut(shard))
    }

    /// The value of `key`, made `V::default()` first when there is none.
    pub fn or_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        Arc::make_mut(&mut self.shards[shard_of(&key)])
            .entry(key)
            .or_default()
    }

    /// Every value to change, each shard another map shares copied first: for rewrites of
    /// every entry, which cost every entry anyway.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        (self.shards.iter_mut()).flat_map(|s| Arc::make_mut(s).values_mut())
    }

    /// Keeps the entries `keep` holds to (every shard copied, as [`values_mut`](Self::values_mut)).
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        for shard in &mut self.shards {
            Arc::make_mut(shard).retain(&mut keep);
        }
    }
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> FromIterator<(K, V)> for Shards<K, V, S> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut maps: Vec<HashMap<K, V, S>> = (0..SHARDS).map(|_| HashMap::default()).collect();
        for (k, v) in iter {
            maps[shard_of(&k)].insert(k, v);
        }
        Shards {
            shards: maps.into_iter().map(Arc::new).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_shares_every_shard_a_change_did_not_touch() {
        let a: Shards<Arc<str>, u32> = (0..1_000)
            .map(|i| (Arc::from(format!("p{i}")), i))
            .collect();
        assert_eq!(a.len(), 1_000);
        assert!(
            a.shards.iter().all(|s| s.len() < 40),
            "spread over the shards"
        );
        let mut b = a.clone();
        assert_eq!(b.unshared(&a).count(), 0);
        *b.get_mut("p7").unwrap() = 70;
        b.insert(Arc::from("new"), 1);
        assert_eq!(b.remove("p9"), Some(9));
        assert_eq!(b.remove("absent"), None);
        assert!(b.get_mut("absent").is_none());
        assert!(
            b.unshared(&a).count() <= 3,
            "the shards of p7, new and p9 alone"
        );
        assert_eq!((a.get("p7"), b.get("p7")), (Some(&7), Some(&70)));
        assert!(b.contains_key("new") && !a.contains_key("new"));
        assert_eq!((a.len(), b.len()), (1_000, 1_000));
        *b.or_default(Arc::from("zero")) += 2;
        assert_eq!(b.get("zero"), Some(&2));
        assert_eq!(b.iter().count(), b.values().count());
        assert!(Shards::<String, u8>::default().is_empty());
        b.values_mut().for_each(|v| *v += 1);
        b.retain(|k, _| &**k != "zero");
        assert_eq!(
            (b.get("p7"), b.get("zero"), a.get("p7")),
            (Some(&71), None, Some(&7))
        );
    }
}
