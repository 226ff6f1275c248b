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
// reason reach a Scheduler's status). -DSKED_SLOW builds a scheduler that runs the same work in
// longer turns: a task whose turn ended waits in one global FIFO and runs for 250 ms once it
// gets a CPU, while a task that wakes up runs at once, cutting the current turn short (the tests
// use it to see that a slice length alone fails none of the slice-neutral signals: CPU-bound
// tasks wait in longer turns, as many of them as before). -DSKED_STRAND builds a scheduler that
// attaches, stays attached and strands work: a task that may run on CPU 0 waits for CPU 0
// alone, so the other CPUs idle beside waiting tasks (the tests use it to see the analysis of a
// bake roll back a revision that hurts by the slice-neutral signals: waiting tasks, idle CPUs
// beside them, utilisation). Every variant records how the kernel disabled it, so that its
// loader registers it again when the kernel asks for a restart (a CPU going on or off line).

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifndef SKED_OPS_NAME
#define SKED_OPS_NAME "sked_canary"
#endif

char _license[] SEC("license") = "GPL";

#if defined(SKED_STALL) || defined(SKED_SLOW) || defined(SKED_STRAND)
void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym;
#endif

#ifdef SKED_SLOW
#define SLOW_SLICE (250ULL * 1000 * 1000)

SEC("struct_ops/slow_enqueue")
void BPF_PROG(slow_enqueue, struct task_struct *p, u64 enq_flags)
{
	// A task that wakes up (a kthread, the agent) runs next on its CPU: were it queued behind
	// 250 ms turns, each wakeup would wait that long, and more tasks would be waiting at any
	// time: a harm to every task that sleeps, not the slice length alone.
	if (enq_flags & SCX_ENQ_WAKEUP) {
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, SLOW_SLICE, enq_flags | SCX_ENQ_PREEMPT);
		return;
	}
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, SLOW_SLICE, enq_flags);
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

#ifdef SKED_STRAND
s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
bool bpf_cpumask_test_cpu(u32 cpu, const struct cpumask *cpumask) __ksym;

// The queue only CPU 0 takes tasks from. Not SCX_DSQ_GLOBAL: every CPU takes from that one.
#define STRAND_DSQ 0x5ced
// Short turns, so that run delay per timeslice stays about what it was: the harm shows as
// tasks waiting while a CPU idles, not as longer waits per turn.
#define STRAND_SLICE (5ULL * 1000 * 1000)

SEC("struct_ops.s/strand_init")
s32 BPF_PROG(strand_init)
{
	return scx_bpf_create_dsq(STRAND_DSQ, -1);
}

// Every wakeup goes through enqueue: the kernel's default would hand a waking task straight to
// an idle CPU.
SEC("struct_ops/strand_select_cpu")
s32 BPF_PROG(strand_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	return prev_cpu;
}

SEC("struct_ops/strand_enqueue")
void BPF_PROG(strand_enqueue, struct task_struct *p, u64 enq_flags)
{
	// A task CPU 0 may not run (a per-CPU kthread) runs on its own CPU, so the watchdog never
	// finds one waiting; so does CPU 0's last task, which CPU 0 would otherwise leave queued
	// when it goes idle (SCX_OPS_ENQ_LAST sends it here instead of keeping it running).
	if (!bpf_cpumask_test_cpu(0, p->cpus_ptr) ||
	    ((enq_flags & SCX_ENQ_LAST) && bpf_get_smp_processor_id() == 0)) {
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, STRAND_SLICE, enq_flags);
		return;
	}
	// Every other task waits for CPU 0, even when another CPU is idle; CPU 0 is woken if it
	// idles (an idle CPU does not look at a queue by itself).
	scx_bpf_dsq_insert(p, STRAND_DSQ, STRAND_SLICE, enq_flags);
	scx_bpf_kick_cpu(0, SCX_KICK_IDLE);
}

// Only CPU 0 takes from the shared queue; the others run what is on their local queues.
SEC("struct_ops/strand_dispatch")
void BPF_PROG(strand_dispatch, s32 cpu, struct task_struct *prev)
{
	if (cpu == 0)
		scx_bpf_dsq_move_to_local(STRAND_DSQ);
}
#endif

// How the kernel last disabled the scheduler: its exit code, for the loader to register again
// when the kernel asks it to (SCX_ECODE_ACT_RESTART, as on a CPU going on or off line), as
// scx_utils schedulers do. In .bss: the loader reads it through the object's .bss map.
struct sked_exit_info {
	s64 exit_code;
	u64 exited;
};
struct sked_exit_info sked_exit = {};

SEC("struct_ops/canary_exit")
void BPF_PROG(canary_exit, struct scx_exit_info *ei)
{
	sked_exit.exit_code = ei->exit_code;
	sked_exit.exited = 1;
}

SEC(".struct_ops.link")
struct sched_ext_ops sked_canary_ops = {
	.exit = (void *)canary_exit,
#ifdef SKED_STALL
	.select_cpu = (void *)stall_select_cpu,
	.enqueue = (void *)stall_enqueue,
	.timeout_ms = 1000,
#endif
#ifdef SKED_SLOW
	.enqueue = (void *)slow_enqueue,
#endif
#ifdef SKED_STRAND
	.init = (void *)strand_init,
	.select_cpu = (void *)strand_select_cpu,
	.enqueue = (void *)strand_enqueue,
	.dispatch = (void *)strand_dispatch,
	// A task whose slice ends with nothing else to run on its CPU goes through enqueue too;
	// without it the kernel keeps such a task running, and a CPU other than 0 with it.
	.flags = SCX_OPS_ENQ_LAST,
#endif
	.name = SKED_OPS_NAME,
};
