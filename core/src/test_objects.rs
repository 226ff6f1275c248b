//! Objects the unit tests of several deciders build: a started scheduler pod of Scheduler `s`,
//! and its agent's report.

use std::time::Instant;

use sked_api::verdict::Verdict;

use crate::kernel_summary::NodeReport;
use crate::pods::SchedulerPod;

/// A started pod `name` of Scheduler `s`, bound nowhere yet.
pub(crate) fn pod(name: &str) -> SchedulerPod {
    let mut p = SchedulerPod::of(&k8s_openapi::api::core::v1::Pod::default());
    p.name = name.into();
    p.scheduler = Some("s".into());
    p.started = true;
    p
}

/// The report of pod `pod` of Scheduler `s`, with ops `rusty`, received at `received`.
pub(crate) fn report(pod: &str, verdict: Verdict, received: Instant) -> NodeReport {
    NodeReport::arrived("s".into(), pod.into(), verdict, "said".into(), "rusty".into(), received, None)
}
