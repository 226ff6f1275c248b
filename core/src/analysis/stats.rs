//! Robust statistics for the analysis: medians, median absolute deviations, the normal tail
//! and the binomial tail a spread is read against. Hand-written: a few lines each, and core
//! takes no dependency for them.

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
/// about 1e-9 (the tests check [`normal_upper_tail`] against it).
#[cfg(test)]
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

/// The chance that a standard normal exceeds `z`: `erfc(z / sqrt 2) / 2`, with the complementary
/// error function of Numerical Recipes (Chebyshev fit, relative error under 1.2e-7).
pub fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    const C: [f64; 10] = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let poly = C.iter().rev().fold(0.0, |acc, c| acc * t + c);
    let erfc = t * (-x * x + poly).exp();
    0.5 * if x >= 0.0 { erfc } else { 2.0 - erfc }
}

/// The chance that `n` nodes reach `k` failures when each fails by chance with
/// `m x P(Z > z - s e)`: every node is read against one centre, estimated with a standard error
/// of `s` standard deviations, off by `e`, a standard normal draw shared by all (averaged over
/// it, trapezoid rule on [-6, 6]). One draw shared by the `m` signals too: their centres' errors
/// are independent in truth, and a shared one makes the chance no smaller (the tail is convex in
/// the node's chance where it matters).
pub fn shared_centre_tail(n: usize, k: usize, m: f64, z: f64, s: f64) -> f64 {
    const STEPS: i32 = 48;
    let h = 12.0 / f64::from(STEPS);
    let mut total = 0.0;
    for i in 0..=STEPS {
        let e = -6.0 + h * f64::from(i);
        let weight = if i == 0 || i == STEPS { 0.5 } else { 1.0 };
        let density = (-0.5 * e * e).exp() / (std::f64::consts::TAU).sqrt();
        let p = (m * normal_upper_tail(z - s * e)).clamp(1e-300, 1.0 - 1e-12);
        total += weight * density * binomial_tail(n, k, p);
    }
    (total * h).min(1.0)
}

/// The smallest `z` (to 1e-4) whose [`shared_centre_tail`] is at most `alpha` (bisection on
/// [0, 12]: the tail falls as `z` grows).
pub fn shared_centre_z(n: usize, k: usize, m: f64, alpha: f64, s: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 12.0);
    while hi - lo > 1e-4 {
        let mid = (lo + hi) / 2.0;
        if shared_centre_tail(n, k, m, mid, s) > alpha { lo = mid } else { hi = mid }
    }
    hi
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
        assert_eq!(round(123_456.7), 123_500.0);
    }

    #[test]
    fn tails_of_a_threshold_read_against_an_estimated_centre() {
        for z in [-2.0, 0.0, 1.0, 1.959_964, 3.090_232] {
            let p = normal_upper_tail(z);
            assert!((normal_quantile(1.0 - p) - z).abs() < 1e-5, "{z}: {p}");
        }
        // A centre known exactly: the binomial tail of the node's chance.
        let z = 2.0;
        let exact = binomial_tail(256, 26, 3.0 * normal_upper_tail(z));
        assert!((shared_centre_tail(256, 26, 3.0, z, 0.0) - exact).abs() < 1e-9);
        // An estimated one: the chance of a quorum grows, and the threshold with it; one node
        // alone (k = 1) hardly cares.
        assert!(shared_centre_tail(256, 26, 3.0, z, 0.18) > 2.0 * exact);
        let known = shared_centre_z(256, 26, 3.0, 0.005, 0.0);
        let estimated = shared_centre_z(256, 26, 3.0, 0.005, 0.18);
        assert!((binomial_tail(256, 26, 3.0 * normal_upper_tail(known)) - 0.005).abs() < 1e-4);
        assert!(estimated > known + 0.1 && estimated < known + 0.8, "{known} {estimated}");
        let alone = shared_centre_z(256, 1, 3.0, 0.005, 0.18) - shared_centre_z(256, 1, 3.0, 0.005, 0.0);
        assert!(alone > 0.0 && alone < 0.2, "{alone}");
    }
}
