//! A restart the kernel asks for (a CPU went on or off line) is not a failure of the revision
//! while the scheduler attaches again within the attach timeout.

use super::tests::{S, T, decide_at, node, pacing, up};
use super::*;

#[test]
fn a_restart_waits_its_attach_timeout_from_when_the_kernel_asked_then_fails() {
    // The canary attached long ago (its pod's own attach deadline is past), then the kernel
    // asked it to restart at 500.
    let restarting = || node("a", T, KernelView::Restarting { since: 500 });
    let waiting = decide_at(&[restarting(), up("b", S)], pacing(1, 1), 560);
    assert_eq!(waiting.failure, None, "within 120 s of the kernel's ask");
    assert_eq!(waiting.recheck_in, Some(60), "looked at again at its deadline");
    assert!(waiting.replace.is_empty(), "down meanwhile: no wave starts");
    let failed = decide_at(&[restarting(), up("b", S)], pacing(1, 1), 620).failure.map(|f| f.cause);
    assert!(
        failed.as_deref().is_some_and(
            |c| c.contains("asked the scheduler to restart 120s ago") && c.contains("did not attach again")
        ),
        "{failed:?}"
    );
    // Back within the deadline: attached again, and the bake counts from then.
    let back = decide_at(&[node("a", T, KernelView::Attached { since: 530 }), up("b", S)], pacing(1, 1), 550);
    assert_eq!((back.failure, back.recheck_in), (None, Some(10)));
}
