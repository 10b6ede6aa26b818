//! Typos of the big providers: a name one edit away from a curated free provider (`gmial.com`,
//! `hotmial.com`, `outlok.com`, `gmail.con`) gets that provider as a suggestion.
//!
//! One edit is an insertion, a deletion, a substitution or a swap of two adjacent characters
//! (Damerau). Found without an exact comparison against every provider: providers are grouped by
//! length (a name one edit away is at most one byte longer or shorter), and each carries the set
//! of byte values it uses as a 64-bit mask. One edit brings in at most one value and takes away at
//! most one, so a provider whose mask differs from the name's by more in either direction is
//! passed over with two bit counts; the few left are checked exactly. About 1,400 instructions for
//! a name near no provider of the shipped list, where looking up each of the name's deletions in a hash
//! index of the providers' deletions took 2,300 (callgrind, a lookup of `d4242.com`). Pure: no I/O.

/// Suggestions for names one edit away from a provider.
#[derive(Debug, Default)]
pub struct TypoIndex {
    providers: Vec<Box<str>>,
    /// At each length: the byte mask and index (into `providers`) of every provider of that
    /// length, in the order the providers were given.
    by_len: Vec<Vec<(u64, u32)>>,
}

/// Names longer than this are no typo of a provider (and are not worth the work).
const MAX_LEN: usize = 64;
/// Providers whose first label is shorter get no suggestions: one edit from `aim.com` or
/// `gmx.de` is a third of the name, and real organisations live there (`arm.com`, `gmu.de`).
/// Measured on the shipped organisation domains: with 3- and 4-letter providers indexed,
/// `arm.com` was "corrected" to `aim.com`.
const MIN_LABEL: usize = 5;

/// The byte values `s` uses, one bit each: a distinct bit for every byte of a domain name
/// (letters, digits, `-`, `.`), others folded onto the rest (a shared bit only lets more
/// providers through to the exact check).
fn mask(s: &[u8]) -> u64 {
    s.iter().fold(0, |m, &b| {
        let bit = match b {
            b'a'..=b'z' => b - b'a',
            b'0'..=b'9' => 26 + (b - b'0'),
            b'-' => 36,
            b'.' => 37,
            _ => 38 + b % 26,
        };
        m | 1 << bit
    })
}

impl TypoIndex {
    /// Indexes `providers`, the most important first (the first wins a tie).
    pub fn build<'a>(providers: impl IntoIterator<Item = &'a str>) -> TypoIndex {
        let mut index = TypoIndex::default();
        for provider in providers {
            let label = provider.split('.').next().unwrap_or_default();
            if provider.len() > MAX_LEN || !provider.is_ascii() || label.len() < MIN_LABEL {
                continue;
            }
            let id = index.providers.len() as u32;
            index.providers.push(provider.into());
            if index.by_len.len() <= provider.len() {
                index.by_len.resize_with(provider.len() + 1, Vec::new);
            }
            index.by_len[provider.len()].push((mask(provider.as_bytes()), id));
        }
        index
    }

    /// The provider `name` is most likely a typo of: one edit away, and not a provider itself.
    pub fn suggest(&self, name: &str) -> Option<&str> {
        if self.providers.is_empty() || name.len() > MAX_LEN || !name.is_ascii() {
            return None;
        }
        let (n, m) = (name.len(), mask(name.as_bytes()));
        let at = |len: usize| self.by_len.get(len).map_or(&[][..], Vec::as_slice);
        if at(n)
            .iter()
            .any(|&(pm, id)| pm == m && *self.providers[id as usize] == *name)
        {
            return None;
        }
        let mut best: Option<u32> = None;
        for len in n.saturating_sub(1)..=n + 1 {
            for &(pm, id) in at(len) {
                if best.is_some_and(|b| id > b) {
                    break; // In order of importance: nothing later here can win.
                }
                let near = (m & !pm).count_ones() <= 1 && (pm & !m).count_ones() <= 1;
                if near && one_edit(name, &self.providers[id as usize]) {
                    best = Some(id);
                    break;
                }
            }
        }
        best.map(|id| &*self.providers[id as usize])
    }

    /// How many providers are indexed (those with a first label of `MIN_LABEL` or more).
    pub fn len(&self) -> usize {
        self.providers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }
}

/// Whether `a` and `b` (ASCII) are exactly one edit apart: one insertion, deletion,
/// substitution, or swap of adjacent characters.
pub fn one_edit(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a == b {
        return false;
    }
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    match a.len() as isize - b.len() as isize {
        0 => a[1..] == b[1..] || (a.len() >= 2 && a[0] == b[1] && a[1] == b[0] && a[2..] == b[2..]),
        1 => a[1..] == *b,
        -1 => *a == b[1..],
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAJOR: [&str; 8] = [
        "gmail.com",
        "hotmail.com",
        "outlook.com",
        "yahoo.com",
        "icloud.com",
        "proton.me",
        "yandex.ru",
        "gmail.de",
    ];

    #[test]
    fn one_edit_is_exactly_one() {
        for (a, b) in [
            ("gmial.com", "gmail.com"),
            ("outlok.com", "outlook.com"),
            ("gmaill.com", "gmail.com"),
            ("gmail.con", "gmail.com"),
            ("gmail.co", "gmail.com"),
            ("yaho.com", "yahoo.com"),
        ] {
            assert!(one_edit(a, b) && one_edit(b, a), "{a} {b}");
        }
        for (a, b) in [
            ("gmail.com", "gmail.com"),
            ("gamil.co", "gmail.com"),
            ("gm.com", "gmail.com"),
            ("abc", "cba"),
        ] {
            assert!(!one_edit(a, b), "{a} {b}");
        }
    }

    #[test]
    fn the_issues_typos_are_suggested_and_providers_are_not() {
        let index = TypoIndex::build(MAJOR);
        for (typo, provider) in [
            ("gmial.com", "gmail.com"),
            ("hotmial.com", "hotmail.com"),
            ("outlok.com", "outlook.com"),
            ("yaho.com", "yahoo.com"),
            ("gmail.con", "gmail.com"),
            ("icloud.co", "icloud.com"),
        ] {
            assert_eq!(index.suggest(typo), Some(provider), "{typo}");
        }
        // A provider itself, even one edit from another (gmail.de / gmail.com), and far names.
        for name in ["gmail.com", "gmail.de", "example.com", "gmailbox.com", ""] {
            assert_eq!(index.suggest(name), None, "{name}");
        }
        // Ties go to the provider given first.
        let index = TypoIndex::build(["yahoo.de", "yahoo.fr"]);
        assert_eq!(index.suggest("yahoo.dr"), Some("yahoo.de"));
        // Short providers are not indexed: arm.com is no typo of aim.com.
        let index = TypoIndex::build(["aim.com", "live.com"]);
        assert!(index.is_empty());
        assert_eq!(index.suggest("arm.com"), None);
    }

    /// The index answers exactly as a scan of every indexed provider, in order, would: the
    /// length groups and byte masks only skip providers that cannot be one edit away.
    #[test]
    fn the_index_agrees_with_a_scan_of_every_provider() {
        let providers: Vec<&str> = MAJOR
            .into_iter()
            .chain([
                "yahoo.de",
                "yahoo.fr",
                "gmx.net",
                "posteo.de",
                "tutanota.com",
                "mail.ru",
            ])
            .collect();
        let index = TypoIndex::build(providers.iter().copied());
        let indexed: Vec<&str> = providers
            .iter()
            .copied()
            .filter(|p| p.split('.').next().unwrap().len() >= MIN_LABEL)
            .collect();
        let scan = |name: &str| -> Option<&str> {
            if indexed.contains(&name) {
                return None;
            }
            indexed.iter().copied().find(|p| one_edit(name, p))
        };
        let mut names: Vec<String> = indexed.iter().flat_map(|p| generated_typos(p)).collect();
        names.extend(
            [
                "example.com",
                "d4242.com",
                "",
                "a",
                "gmail.com",
                "yahoo.dr",
                "gmail.co.uk",
                "gmai1.com",
                "GMAIL.COM",
                "gmail-com",
                "mail.com",
                "yahoo.d",
                "yahoo.dee",
            ]
            .map(String::from),
        );
        // Every byte substitution, printable ASCII included (bytes outside a domain name's
        // alphabet share mask bits).
        for p in ["gmail.com", "proton.me", "yahoo.de"] {
            for i in 0..p.len() {
                for c in 0x21u8..0x7f {
                    let mut b = p.as_bytes().to_vec();
                    b[i] = c;
                    names.push(String::from_utf8(b).unwrap());
                }
            }
        }
        for name in &names {
            assert_eq!(index.suggest(name), scan(name), "{name}");
        }
    }

    /// Every deletion, adjacent swap, doubled letter and substitution by a neighbouring key of
    /// `p`: the typos people make.
    fn generated_typos(p: &str) -> Vec<String> {
        let keyboard = ["qwertyuiop", "asdfghjkl", "zxcvbnm"];
        let neighbours = |c: u8| -> Vec<u8> {
            let mut out = Vec::new();
            for row in keyboard.map(str::as_bytes) {
                if let Some(i) = row.iter().position(|&r| r == c) {
                    out.extend(i.checked_sub(1).map(|j| row[j]));
                    out.extend(row.get(i + 1));
                }
            }
            out
        };
        let b = p.as_bytes();
        let mut typos = Vec::new();
        for i in 0..b.len() {
            let mut t = b.to_vec();
            t.remove(i);
            typos.push(t);
            let mut t = b.to_vec();
            t.insert(i, b[i]);
            typos.push(t);
            if i + 1 < b.len() {
                let mut t = b.to_vec();
                t.swap(i, i + 1);
                typos.push(t);
            }
            for n in neighbours(b[i]) {
                let mut t = b.to_vec();
                t[i] = n;
                typos.push(t);
            }
        }
        let mut out: Vec<String> = typos
            .into_iter()
            .map(|t| String::from_utf8(t).unwrap())
            .filter(|t| t != p)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Precision and recall on typos generated from the major providers.
    #[test]
    fn precision_and_recall_on_generated_typos() {
        let index = TypoIndex::build(MAJOR);
        let (mut right, mut wrong, mut total) = (0, 0, 0);
        for p in MAJOR {
            for t in generated_typos(p) {
                if MAJOR.contains(&t.as_str()) {
                    continue; // another provider, not a typo
                }
                total += 1;
                match index.suggest(&t) {
                    Some(s) if s == p => right += 1,
                    Some(_) => wrong += 1,
                    None => {}
                }
            }
        }
        eprintln!("generated typos: {total}, suggested right {right}, wrong {wrong}");
        let recall = f64::from(right) / f64::from(total);
        let precision = f64::from(right) / f64::from(right + wrong);
        assert!(recall > 0.98, "recall {recall} ({right}/{total})");
        assert!(precision > 0.98, "precision {precision} ({wrong} wrong)");
    }

    /// The same over the whole shipped curated list, as the gateway indexes it. A typo one edit
    /// from two providers (`yahoo.dr`: `yahoo.de`, `yahoo.fr`) may fairly get either: such a
    /// suggestion counts as ambiguous, not wrong; a wrong one is more than one edit away.
    #[test]
    fn precision_and_recall_over_the_shipped_curated_list() {
        let shipped: Vec<&str> = include_str!("../../../data/free_providers.txt")
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .filter(|l| !l.is_empty())
            .collect();
        let index = TypoIndex::build(shipped.iter().copied());
        assert!(index.len() > 100, "{} providers indexed", index.len());
        let (mut total, mut right, mut ambiguous, mut wrong, mut missed) = (0u32, 0u32, 0, 0, 0);
        for p in &index.providers {
            for t in generated_typos(p) {
                if shipped.contains(&t.as_str()) {
                    continue;
                }
                total += 1;
                match index.suggest(&t) {
                    Some(s) if s == &**p => right += 1,
                    Some(s) if one_edit(&t, s) => ambiguous += 1,
                    Some(_) => wrong += 1,
                    None => missed += 1,
                }
            }
        }
        eprintln!(
            "{} providers, {total} typos: right {right}, ambiguous {ambiguous}, wrong {wrong}, \
             missed {missed}",
            index.len()
        );
        assert_eq!((wrong, missed), (0, 0));
        let exact = f64::from(right) / f64::from(total);
        assert!(
            exact > 0.97,
            "the typed provider itself for {exact} of typos"
        );
    }
}
