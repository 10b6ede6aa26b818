//! Writes that carry an `Idempotency-Key` (as payment APIs take): the first answer that
//! committed is kept with the write, in its transaction, and a retry with the same key and the
//! same request gets that answer again instead of a second write; the same key on another
//! request is refused. Kept per project, for [`KEPT_SECONDS`], the newest [`KEPT_PER_PROJECT`].

use sha2::{Digest, Sha256};

use super::Put;

/// How long a key's answer is kept.
pub const KEPT_SECONDS: i64 = 24 * 3600;

/// Keys kept per project at most (the oldest go first): a project's retries are recent.
pub const KEPT_PER_PROJECT: i64 = 1_000;

/// Longest key taken.
pub const MAX_KEY_LEN: usize = 255;

/// Why an `Idempotency-Key` header was not taken.
pub fn key_problem(value: &[u8]) -> Option<&'static str> {
    if value.is_empty() || value.len() > MAX_KEY_LEN {
        return Some("Idempotency-Key: 1 to 255 characters");
    }
    (!value.iter().all(|b| b.is_ascii_graphic()))
        .then_some("Idempotency-Key: visible ASCII characters only (no spaces)")
}

/// What a write's first answer was, as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub status: u16,
    /// The JSON body (empty for a `204`).
    pub body: String,
}

/// A write's key, what it asked (`fingerprint`), and which of its answers to keep.
pub struct Once<'a> {
    pub key: &'a str,
    pub fingerprint: String,
    /// The answer to keep for a write that came to a `Put` (none: kept nothing).
    pub remember: &'a (dyn Fn(&Put) -> Option<Remembered> + Sync),
}

/// The fingerprint of a request: its method, what it names and its body's digest.
pub fn fingerprint(method: &str, target: &str, body: &[u8]) -> String {
    format!("{method} {target} {}", hex::encode(Sha256::digest(body)))
}

/// What a write with a key came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done now (or refused: `Full`, `Stale`).
    Put(Put),
    /// Done before: its first answer.
    Replay(Remembered),
    /// The key was used for another request.
    Reused,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_visible_ascii() {
        assert!(key_problem(b"a-1_B.2:3").is_none());
        assert!(key_problem(b"").is_some());
        assert!(key_problem(b"has space").is_some());
        assert!(key_problem("é".as_bytes()).is_some());
        assert!(key_problem(&[b'a'; 256]).is_some());
        assert!(key_problem(&[b'a'; 255]).is_none());
        assert_ne!(fingerprint("PUT", "a", b"x"), fingerprint("PUT", "a", b"y"));
    }
}
