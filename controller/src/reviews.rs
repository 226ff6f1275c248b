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

use crate::mutex::lock;

/// Longest stay of an accepted review.
pub const MAX_KEEP_ACCEPTED: Duration = Duration::from_secs(600);
/// Stay of a refused review.
pub const KEEP_REFUSED: Duration = Duration::from_secs(60);
/// Accepted reviews kept at most (one per agent, with room); the accepted ones are emptied when
/// full.
const ACCEPTED_CAPACITY: usize = 20_000;
/// Refused reviews kept at most, apart from the accepted ones: junk tokens never push out an
/// agent's review, and a flood of them costs at most this many entries.
const REFUSED_CAPACITY: usize = 4_096;

const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

type TokenHash = [u8; 32];

/// What a TokenReview said of a token, as far as the reports server reads it (a whole
/// `TokenReviewStatus`, with its groups and extras, is several times this).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Review {
    pub authenticated: bool,
    /// Whether the token is valid for the audience it was reviewed for.
    pub for_audience: bool,
    /// Why the API server refused it, as it says.
    pub error: Option<String>,
    pub username: String,
    /// The pod the token is bound to, by name and uid.
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// The node the token names, if any.
    pub node_name: Option<String>,
}

impl Review {
    /// What `status` says of a token reviewed for `audience`.
    pub fn of(status: TokenReviewStatus, audience: &str) -> Self {
        let user = status.user.unwrap_or_default();
        let extra = user.extra.unwrap_or_default();
        let first = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
        Self {
            authenticated: status.authenticated.unwrap_or(false),
            for_audience: status.audiences.as_ref().is_some_and(|a| a.iter().any(|a| a == audience)),
            error: status.error,
            username: user.username.unwrap_or_default(),
            pod_name: first(POD_NAME_EXTRA),
            pod_uid: first(POD_UID_EXTRA),
            node_name: first(NODE_NAME_EXTRA),
        }
    }

    fn accepted(&self) -> bool {
        self.authenticated && self.for_audience
    }
}

/// Reviews by token hash, accepted and refused apart.
#[derive(Default)]
pub struct ReviewCache {
    accepted: Mutex<HashMap<TokenHash, (Instant, Review)>>,
    refused: Mutex<HashMap<TokenHash, (Instant, Review)>>,
}

impl ReviewCache {
    /// The kept review of `token`, if still valid at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Review> {
        let key = hash(token);
        [&self.accepted, &self.refused].into_iter().find_map(|entries| {
            let mut entries = lock(entries);
            match entries.get(&key) {
                Some((until, review)) if *until > now => Some(review.clone()),
                Some(_) => {
                    entries.remove(&key);
                    None
                }
                None => None,
            }
        })
    }

    /// Keeps the review of `token` made at `now` (`unix_now` in seconds, for the token's expiry).
    pub fn put(&self, token: &str, review: &Review, now: Instant, unix_now: i64) {
        let (entries, capacity, keep) = if review.accepted() {
            let left = expires_at(token).map_or(MAX_KEEP_ACCEPTED, |exp| {
                Duration::from_secs(u64::try_from(exp.saturating_sub(unix_now)).unwrap_or(0))
            });
            (&self.accepted, ACCEPTED_CAPACITY, left.min(MAX_KEEP_ACCEPTED))
        } else {
            (&self.refused, REFUSED_CAPACITY, KEEP_REFUSED)
        };
        if keep.is_zero() {
            return;
        }
        let mut entries = lock(entries);
        if entries.len() >= capacity {
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= capacity {
                entries.clear();
            }
        }
        entries.insert(hash(token), (now + keep, review.clone()));
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

    fn status(ok: bool) -> Review {
        Review { authenticated: ok, for_audience: ok, ..Default::default() }
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
        assert_eq!(cache.get("not-a-token", now + Duration::from_secs(59)).map(|r| r.authenticated), Some(false));
        assert!(cache.get("not-a-token", now + KEEP_REFUSED + Duration::from_secs(1)).is_none());
        assert!(cache.get("another", now).is_none());
    }

    #[test]
    fn a_flood_of_junk_tokens_never_pushes_out_an_agents_review() {
        let cache = ReviewCache::default();
        let now = Instant::now();
        let agent = jwt(1_000 + 3_600);
        cache.put(&agent, &status(true), now, 1_000);
        for i in 0..(REFUSED_CAPACITY * 2 + 1) {
            cache.put(&format!("junk-{i}"), &status(false), now, 1_000);
        }
        assert!(cache.get(&agent, now).is_some_and(|r| r.authenticated));
        assert!(lock(&cache.refused).len() <= REFUSED_CAPACITY, "the refused ones are bounded");
    }

    #[test]
    fn a_review_keeps_what_the_reports_server_reads() {
        use k8s_openapi::api::authentication::v1::UserInfo;
        let extra = [
            (POD_NAME_EXTRA, "rusty-x7k2p"),
            (POD_UID_EXTRA, "u-1"),
            (NODE_NAME_EXTRA, "node-a"),
            ("authentication.kubernetes.io/credential-id", "JTI=1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), vec![v.to_owned()]))
        .collect();
        let status = TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec!["other".into(), "sked-reports".into()]),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:sked-system:sked-agent".into()),
                groups: Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]),
                extra: Some(extra),
                uid: Some("sa-uid".into()),
            }),
            error: None,
        };
        let review = Review::of(status.clone(), "sked-reports");
        assert!(review.accepted());
        assert_eq!(review.username, "system:serviceaccount:sked-system:sked-agent");
        assert_eq!(review.pod_name.as_deref(), Some("rusty-x7k2p"));
        assert_eq!(review.pod_uid.as_deref(), Some("u-1"));
        assert_eq!(review.node_name.as_deref(), Some("node-a"));
        assert!(!Review::of(status, "another-audience").accepted(), "the audience must be the one reviewed for");
        let refused = Review::of(
            TokenReviewStatus { authenticated: Some(false), error: Some("token expired".into()), ..Default::default() },
            "sked-reports",
        );
        assert!(!refused.accepted());
        assert_eq!(refused.error.as_deref(), Some("token expired"));
    }
}
