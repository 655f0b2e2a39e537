// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// erdma SMC-R socket policy: TCP sockets created in selected network namespaces become SMC
// sockets (IPPROTO_SMC, Linux 6.11+). Attached as fmod_ret to update_socket_protocol(), which
// __sys_socket() calls with the family/type/protocol of every socket() system call.
// The namespaces are keyed by their cookie (net->net_cookie, what SO_NETNS_COOKIE returns),
// which unlike an inode number is never reused. The agent owns the map.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_TYPE_MASK 0xf
#define IPPROTO_TCP 6
#define IPPROTO_SMC 256

// Only the fields we read; CO-RE relocates their offsets against the running kernel's BTF.
struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

struct task_struct {
	struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   // network namespace cookie
	__type(value, __u8);  // 1 = SMC on
} smc_netns SEC(".maps");

SEC("fmod_ret/update_socket_protocol")
int BPF_PROG(smc_policy, int family, int type, int protocol)
{
	struct task_struct *task;
	__u64 cookie;

	if (family != AF_INET && family != AF_INET6)
		return protocol;
	// type still carries SOCK_NONBLOCK / SOCK_CLOEXEC here.
	if ((type & SOCK_TYPE_MASK) != SOCK_STREAM)
		return protocol;
	if (protocol != 0 && protocol != IPPROTO_TCP)
		return protocol;
	task = (struct task_struct *)bpf_get_current_task_btf();
	cookie = BPF_CORE_READ(task, nsproxy, net_ns, net_cookie);
	if (!bpf_map_lookup_elem(&smc_netns, &cookie))
		return protocol;
	return IPPROTO_SMC;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
