//! TokenReview results, kept by a hash of the token (never the token itself), so agents that
//! reconnect (a failover, a network blip) and junk tokens cost a bounded number of API calls.
//!
//! An accepted token is kept until it expires (its `exp` claim, read without checking the
//! signature: it only shortens the stay) and at most [`MAX_KEEP_ACCEPTED`]; a refused one for
//! [`KEEP_REFUSED`]. What a review says about the pod is checked again on every stream.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::authentication::v1::TokenReviewStatus;

use crate::sync::lock;

/// Longest stay of an accepted review.
pub const MAX_KEEP_ACCEPTED: Duration = Duration::from_secs(600);
/// Stay of a refused review.
pub const KEEP_REFUSED: Duration = Duration::from_secs(60);
/// Reviews kept at most; the cache is emptied when full.
const CAPACITY: usize = 20_000;

type TokenHash = [u8; 32];

/// TokenReview statuses by token hash.
#[derive(Default)]
pub struct ReviewCache {
    entries: Mutex<HashMap<TokenHash, (Instant, TokenReviewStatus)>>,
}

impl ReviewCache {
    /// The kept review of `token`, if still valid at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<TokenReviewStatus> {
        let key = hash(token);
        let mut entries = lock(&self.entries);
        match entries.get(&key) {
            Some((until, status)) if *until > now => Some(status.clone()),
            Some(_) => {
                entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Keeps the review of `token` made at `now` (`unix_now` in seconds, for the token's expiry).
    pub fn put(&self, token: &str, status: &TokenReviewStatus, now: Instant, unix_now: i64) {
        let keep = if status.authenticated.unwrap_or(false) {
            let left = expires_at(token).map_or(MAX_KEEP_ACCEPTED, |exp| {
                Duration::from_secs(u64::try_from(exp.saturating_sub(unix_now)).unwrap_or(0))
            });
            left.min(MAX_KEEP_ACCEPTED)
        } else {
            KEEP_REFUSED
        };
        if keep.is_zero() {
            return;
        }
        let mut entries = lock(&self.entries);
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(hash(token), (now + keep, status.clone()));
    }
}

fn hash(token: &str) -> TokenHash {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The `exp` claim of a JWT, unverified.
fn expires_at(token: &str) -> Option<i64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes).ok()?.get("exp")?.as_i64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(exp: i64) -> String {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#));
        format!("eyJhbGciOiJFUzI1NiJ9.{payload}.c2ln")
    }

    fn status(ok: bool) -> TokenReviewStatus {
        TokenReviewStatus { authenticated: Some(ok), ..Default::default() }
    }

    #[test]
    fn accepted_reviews_stay_until_the_token_expires_at_most_ten_minutes() {
        let cache = ReviewCache::default();
        let now = Instant::now();
        let short = jwt(1_000 + 120);
        cache.put(&short, &status(true), now, 1_000);
        assert!(cache.get(&short, now + Duration::from_secs(119)).is_some());
        assert!(cache.get(&short, now + Duration::from_secs(121)).is_none(), "expired with the token");
        let long = jwt(1_000 + 86_400);
        cache.put(&long, &status(true), now, 1_000);
        assert!(cache.get(&long, now + MAX_KEEP_ACCEPTED - Duration::from_secs(1)).is_some());
        assert!(cache.get(&long, now + MAX_KEEP_ACCEPTED + Duration::from_secs(1)).is_none());
        let expired = jwt(900);
        cache.put(&expired, &status(true), now, 1_000);
        assert!(cache.get(&expired, now).is_none(), "an expired token is never kept");
    }

    #[test]
    fn refused_and_junk_tokens_stay_a_minute() {
        let cache = ReviewCache::default();
        let now = Instant::now();
        cache.put("not-a-token", &status(false), now, 1_000);
        assert_eq!(cache.get("not-a-token", now + Duration::from_secs(59)).and_then(|s| s.authenticated), Some(false));
        assert!(cache.get("not-a-token", now + KEEP_REFUSED + Duration::from_secs(1)).is_none());
        assert!(cache.get("another", now).is_none());
    }
}
