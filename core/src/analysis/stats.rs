//! Robust statistics for the analysis: medians, median absolute deviations, and the normal
//! quantile a spread is read against. Hand-written: a few lines each, and core takes no
//! dependency for them.

use sked_api::SignalSummary;

/// The median of `values` (none when empty; values that are not finite are left out).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 })
}

/// The median of `values` and their median absolute deviation from it.
pub fn summary(values: Vec<f64>) -> Option<SignalSummary> {
    let count = values.len();
    let centre = median(values.clone())?;
    let spread = median(values.into_iter().map(|v| (v - centre).abs()).collect())?;
    Some(SignalSummary {
        median: round(centre),
        spread: round(spread),
        samples: i32::try_from(count).unwrap_or(i32::MAX),
    })
}

/// A value to four significant digits: what status keeps (a summary does not move with the
/// last bit of a float, and reads short).
pub fn round(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let digits = 3 - v.abs().log10().floor() as i32;
    let scale = 10f64.powi(digits);
    (v * scale).round() / scale
}

/// The median absolute deviation scaled to a standard deviation for normal data.
pub const MAD_TO_SD: f64 = 1.4826;

/// The standard normal quantile of `p` (0 < p < 1): Acklam's rational approximation, good to
/// about 1e-9, enough to set a threshold.
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] =
        [7.784_695_709_041_462e-3, 3.224_671_290_700_398e-1, 2.445_134_137_142_996, 3.754_408_661_907_416];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The chance that `Binomial(n, p)` is `k` or more (0 < p < 1), summed in log space.
pub fn binomial_tail(n: usize, k: usize, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    let (lp, lq) = (p.ln(), (-p).ln_1p());
    let mut log_choose = 0.0;
    let mut tail = 0.0;
    for i in 0..=n {
        if i > 0 {
            log_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        if i >= k {
            tail += (log_choose + i as f64 * lp + (n - i) as f64 * lq).exp();
        }
    }
    tail.min(1.0)
}

/// The largest chance `p` a node may fail by chance such that `n` nodes reach `k` failures
/// with probability at most `alpha` (bisection: the tail grows with `p`).
pub fn largest_node_chance(n: usize, k: usize, alpha: f64) -> f64 {
    let (mut lo, mut hi) = (1e-9, 0.5);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if binomial_tail(n, k, mid) > alpha { hi = mid } else { lo = mid }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_spreads_and_quantiles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN]), None);
        let s = summary(vec![1.0, 2.0, 3.0, 4.0, 100.0]).unwrap_or_else(|| panic!("a summary"));
        assert_eq!((s.median, s.spread, s.samples), (3.0, 1.0, 5));
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
        assert!((normal_quantile(0.05) + 1.644_854).abs() < 1e-5);
        assert!((normal_quantile(0.999) - 3.090_232).abs() < 1e-5);
        assert_eq!(round(0.123_456_7), 0.1235);
        assert!((binomial_tail(1, 1, 0.3) - 0.3).abs() < 1e-12);
        assert!((binomial_tail(2, 1, 0.5) - 0.75).abs() < 1e-12);
        assert!((largest_node_chance(1, 1, 0.002) - 0.002).abs() < 1e-9);
        let p = largest_node_chance(256, 26, 0.005);
        assert!((binomial_tail(256, 26, p) - 0.005).abs() < 1e-6 && p > 0.04 && p < 0.08, "{p}");
        assert_eq!(round(123_456.7), 123_500.0);
    }
}
