// SPDX-License-Identifier: GPL-2.0-only
//
// sked_canary: the smallest sched_ext scheduler. It registers a struct sched_ext_ops that
// names itself and nothing else, so every task uses the kernel's built-in global FIFO. The
// real-kernel tests attach it to prove that sked's agent sees what the kernel runs.
//
// Build against a vmlinux.h generated from the test kernel's BTF:
//   clang -target bpf -O2 -g -D__TARGET_ARCH_x86 -I<dir of vmlinux.h> -c sked_canary.bpf.c
// -DSKED_OPS_NAME='"other"' builds the same scheduler under another ops name (the tests use it
// as a scheduler started by hand). -DSKED_STALL builds a scheduler that never runs tasks named
// sked-stall* once they wake up, with a one-second watchdog: the kernel ejects it for a
// "runnable task stall" as soon as such a task waits (the tests use it to see the kernel's own
// reason reach a Scheduler's status). -DSKED_SLOW builds a scheduler that attaches, stays
// attached and hurts: every task waits in one global FIFO and runs for 250 ms once it gets a
// CPU, so under a CPU-bound load each task waits about that long for its turn (the tests use
// it to see the analysis of a bake roll back a revision the kernel never ejects).

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifndef SKED_OPS_NAME
#define SKED_OPS_NAME "sked_canary"
#endif

char _license[] SEC("license") = "GPL";

#if defined(SKED_STALL) || defined(SKED_SLOW)
void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym;
#endif

#ifdef SKED_SLOW
SEC("struct_ops/slow_enqueue")
void BPF_PROG(slow_enqueue, struct task_struct *p, u64 enq_flags)
{
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, 250ULL * 1000 * 1000, enq_flags);
}
#endif

#ifdef SKED_STALL

static bool victim(const struct task_struct *p)
{
	const char name[] = "sked-stall";

	for (int i = 0; i < sizeof(name) - 1; i++)
		if (p->comm[i] != name[i])
			return false;
	return true;
}

// Every wakeup goes through enqueue (no direct dispatch to an idle CPU).
SEC("struct_ops/stall_select_cpu")
s32 BPF_PROG(stall_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	return prev_cpu;
}

SEC("struct_ops/stall_enqueue")
void BPF_PROG(stall_enqueue, struct task_struct *p, u64 enq_flags)
{
	if (victim(p))
		return; // never dispatched: the watchdog finds it waiting
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, SCX_SLICE_DFL, enq_flags);
}
#endif

SEC(".struct_ops.link")
struct sched_ext_ops sked_canary_ops = {
#ifdef SKED_STALL
	.select_cpu = (void *)stall_select_cpu,
	.enqueue = (void *)stall_enqueue,
	.timeout_ms = 1000,
#endif
#ifdef SKED_SLOW
	.enqueue = (void *)slow_enqueue,
#endif
	.name = SKED_OPS_NAME,
};
