//! How fast reconciles may run and how long a failing one waits before its retry.

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
        let mut st = match self.state.lock() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
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
}
