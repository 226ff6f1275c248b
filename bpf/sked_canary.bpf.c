// SPDX-License-Identifier: GPL-2.0
//
// sked_canary: the smallest sched_ext scheduler. It registers a struct sched_ext_ops that
// names itself and nothing else, so every task uses the kernel's built-in global FIFO. The
// real-kernel tests attach it to prove that sked's agent sees what the kernel runs.
//
// Build against a vmlinux.h generated from the test kernel's BTF:
//   clang -target bpf -O2 -g -D__TARGET_ARCH_x86 -I<dir of vmlinux.h> -c sked_canary.bpf.c
// -DSKED_OPS_NAME='"other"' builds the same scheduler under another ops name (the tests use it
// as a scheduler started by hand).

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#ifndef SKED_OPS_NAME
#define SKED_OPS_NAME "sked_canary"
#endif

char _license[] SEC("license") = "GPL";

SEC(".struct_ops.link")
struct sched_ext_ops sked_canary_ops = {
	.name = SKED_OPS_NAME,
};
