//! What a connection's last `Authorization` header came to: a keep-alive connection that
//! sends the same header again is not made to read and hash its token again.
//!
//! A memo of a pure function, the header's bytes and its token's SHA-256, nothing else: the
//! digest is looked up in each request's own key snapshot, as a freshly computed one would be,
//! so a key revoked, disabled or expired since is refused exactly as before. The header is
//! compared in constant time: one connection may carry several callers' requests (a proxy that
//! pools its connections), and how far a guess matched the header before it must not show in
//! the time taken. Reading and hashing the token was ~3,700 of a lookup's ~35,700
//! instructions (callgrind, which runs SHA-256 in portable code); the memo's lock and compare
//! are ~150.

use std::sync::Mutex;

use subtle::ConstantTimeEq;

use super::keys::{hash_secret, MAX_TOKEN_LEN};

/// One connection's memo (see the module). Behind a lock only because the stream that holds
/// it is shared by reference; a connection serves one request at a time, so it is never
/// contended.
#[derive(Debug, Default)]
pub struct TokenMemo(Mutex<Memo>);

#[derive(Debug, Default)]
struct Memo {
    /// The header last read (empty: none yet). Its buffer is kept: a new header is copied in.
    header: Vec<u8>,
    digest: [u8; 32],
}

impl TokenMemo {
    /// The SHA-256 of the token `token_of` reads in `header` (`None`: no valid token): the
    /// remembered one when `header` is the header remembered, else read, hashed and
    /// remembered in its place.
    pub fn digest(
        &self,
        header: &[u8],
        token_of: impl FnOnce(&[u8]) -> Option<&[u8]>,
    ) -> Option<[u8; 32]> {
        let Ok(mut memo) = self.0.try_lock() else {
            // Never expected (see the type); reading the header afresh is always right.
            return token_of(header).map(hash_secret);
        };
        if !memo.header.is_empty() && same_bytes(&memo.header, header) {
            return Some(memo.digest);
        }
        let digest = hash_secret(token_of(header)?);
        // A header longer than any token is not kept (its token was trimmed of space).
        if header.len() <= MAX_TOKEN_LEN + "Bearer ".len() {
            memo.header.clear();
            memo.header.extend_from_slice(header);
            memo.digest = digest;
        }
        Some(digest)
    }
}

impl Drop for Memo {
    /// The header holds a secret: its bytes do not outlive the connection in freed memory.
    fn drop(&mut self) {
        for b in self.header.iter_mut() {
            // Volatile: a store to memory about to be freed is otherwise optimised away.
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether two tokens are equal, their bytes compared in constant time: every word is read
/// and the differences gathered before one comparison behind `subtle`'s barrier (`subtle`'s
/// slice comparison puts each byte behind a barrier: several hundred instructions for a
/// header). Only the lengths are compared early: a length says nothing of the bytes.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
    let mut diff = 0u64;
    let (a_words, b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let (a_tail, b_tail) = (a_words.remainder(), b_words.remainder());
    for (x, y) in a_words.zip(b_words) {
        diff |= word(x) ^ word(y);
    }
    for (x, y) in a_tail.iter().zip(b_tail) {
        diff |= u64::from(x ^ y);
    }
    bool::from(diff.ct_eq(&0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_gives_each_headers_own_digest_in_any_order() {
        let memo = TokenMemo::default();
        fn token_of(h: &[u8]) -> Option<&[u8]> {
            h.strip_prefix(b"Bearer ").filter(|t| !t.is_empty())
        }
        let a = b"Bearer drg_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".as_slice();
        let b = b"Bearer drg_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab".as_slice();
        for header in [a, a, b, a, b"Bearer ", b, b, b"Bearer x", b"", a, a] {
            assert_eq!(
                memo.digest(header, token_of),
                token_of(header).map(hash_secret),
                "{header:?}"
            );
        }
    }

    proptest::proptest! {
        /// Equal exactly when the bytes are, whatever the lengths (across the 8-byte words).
        #[test]
        fn same_bytes_is_equality(
            a in proptest::collection::vec(0u8..4, 0..40),
            b in proptest::collection::vec(0u8..4, 0..40),
        ) {
            proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
            proptest::prop_assert!(same_bytes(&a, &a.clone()));
        }
    }
}
