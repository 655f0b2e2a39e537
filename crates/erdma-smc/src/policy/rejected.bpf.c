// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Test fixture: a program the verifier must reject (map value used without a NULL check), to
// prove that a rejected load yields a clear error with the verifier's log.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u8);
} smc_netns SEC(".maps");

SEC("fmod_ret/update_socket_protocol")
int BPF_PROG(smc_policy, int family, int type, int protocol)
{
	__u64 key = 0;
	__u8 *v = bpf_map_lookup_elem(&smc_netns, &key);

	return *v + protocol;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
