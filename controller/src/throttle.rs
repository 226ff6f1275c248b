//! How fast reconciles may write and how long a failing one waits before its retry.
//!
//! A reconcile takes its rate-limit token at its first write, not when it starts: one that
//! finds nothing to change costs no token, so a new leader's pass over every Scheduler (which
//! writes nothing after a clean failover) does not make a real change wait behind it. A token
//! not there at once is reserved and waited for, and the reconcile starts over from a fresh read
//! (see [`before_write`]): no decision is carried out on what it read before the wait.

use std::cell::Cell;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Delay before retry number `failures` (1 for the first failure): the base delay doubled on
/// each further failure, capped at `max`.
pub fn retry_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(32);
    base.checked_mul(1u32 << exp.min(31)).map_or(max, |d| d.min(max))
}

/// A token bucket shared by every reconcile: `qps` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug, Clone, Copy)]
struct BucketState {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps, burst, state: Mutex::new(BucketState { tokens: burst, at: now }) }
    }

    /// Takes a token (possibly borrowing against the future) and says how long the caller must
    /// wait before its turn. Waiting callers queue in the order they reserved.
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut st = crate::mutex::lock(&self.state);
        let elapsed = now.saturating_duration_since(st.at).as_secs_f64();
        st.tokens = (st.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        st.at = now;
        if st.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-st.tokens / self.qps) }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Where the reconcile running on a task stands with its rate-limit token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// None taken yet: nothing written.
    None,
    /// Taken: the reconcile may write.
    Held,
    /// Reserved, due after this wait: the reconcile must end without writing and start over.
    Due(Duration),
}

tokio::task_local! {
    static TOKEN: Cell<Token>;
}

/// A reconcile pass that must wait `.0` for its token before it writes: it ends, writes
/// nothing, waits, and starts over holding the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled(pub Duration);

/// Runs one reconcile pass; `holds_token` when an earlier pass reserved it and waited.
pub async fn reconcile_pass<F: Future>(holds_token: bool, pass: F) -> F::Output {
    TOKEN.scope(Cell::new(if holds_token { Token::Held } else { Token::None }), pass).await
}

/// Before a write the pass can still give up (nothing written yet, or only what this check
/// already allowed): takes the token if one is there now; otherwise reserves one and returns
/// how long until it comes. Outside a reconcile pass, writes are not limited.
pub fn before_write(bucket: &TokenBucket) -> Result<(), Throttled> {
    TOKEN
        .try_with(|token| match token.get() {
            Token::Held => Ok(()),
            Token::Due(wait) => Err(Throttled(wait)),
            Token::None => {
                let wait = bucket.reserve(Instant::now());
                if wait.is_zero() {
                    token.set(Token::Held);
                    Ok(())
                } else {
                    token.set(Token::Due(wait));
                    Err(Throttled(wait))
                }
            }
        })
        .unwrap_or(Ok(()))
}

/// Before a write the pass carries out whatever happens (an event, a pod's condition: each
/// states what the pass saw, and a newer state triggers a pass of its own): waits for the token
/// if it does not hold one yet.
pub async fn before_late_write(bucket: &TokenBucket) {
    let wait = match TOKEN.try_with(Cell::get) {
        Ok(Token::None) => bucket.reserve(Instant::now()),
        Ok(Token::Due(wait)) => wait,
        Ok(Token::Held) | Err(_) => return,
    };
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    let _ = TOKEN.try_with(|token| token.set(Token::Held));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(300);
        let delays: Vec<u64> = (1..=11).map(|n| retry_delay(base, max, n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(retry_delay(base, max, 1000), max, "no overflow on long streaks");
        assert_eq!(retry_delay(base, max, 0), base);
    }

    #[test]
    fn bucket_allows_a_burst_then_paces_at_qps() {
        let t0 = Instant::now();
        let bucket = TokenBucket::new(5.0, 10, t0);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(t0), Duration::ZERO);
        }
        // The 11th and 12th wait one and two token intervals (200 ms each at 5 qps).
        assert_eq!(bucket.reserve(t0), Duration::from_millis(200));
        assert_eq!(bucket.reserve(t0), Duration::from_millis(400));
        // After a long pause the bucket is full again, but never above the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(later), Duration::ZERO);
        }
        assert!(bucket.reserve(later) > Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_takes_its_token_at_its_first_write_and_only_once() {
        let bucket = TokenBucket::new(5.0, 1, Instant::now());
        // A pass that writes nothing takes nothing: the one token is still there.
        reconcile_pass(false, async {}).await;
        // The first write takes it; the pass's further writes need no other.
        reconcile_pass(false, async {
            assert_eq!(before_write(&bucket), Ok(()));
            assert_eq!(before_write(&bucket), Ok(()));
        })
        .await;
        // The next pass finds none: it is told to wait and start over, and asking again
        // reserves no second token.
        let wait = reconcile_pass(false, async {
            let first = before_write(&bucket);
            assert_eq!(before_write(&bucket), first, "one reservation per pass");
            first
        })
        .await;
        assert_eq!(wait, Err(Throttled(Duration::from_millis(200))));
        // Started over holding the token it reserved, it writes at once.
        reconcile_pass(true, async { assert_eq!(before_write(&bucket), Ok(())) }).await;
        // Outside a pass nothing is limited.
        assert_eq!(before_write(&bucket), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_write_waits_for_the_token_it_lacks() {
        let bucket = TokenBucket::new(5.0, 1, Instant::now());
        assert_eq!(bucket.reserve(Instant::now()), Duration::ZERO, "the one token, taken elsewhere");
        let started = Instant::now();
        reconcile_pass(false, async {
            before_late_write(&bucket).await;
            assert_eq!(before_write(&bucket), Ok(()), "held after the wait");
        })
        .await;
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }
}
