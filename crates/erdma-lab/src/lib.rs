//! The lab's pod runtime.
//!
//! In the lab (a real kernel in qemu, see `lab/README.md`) the fake kubelet asks the agent for
//! `aliyun/erdma` and prints the Allocate response. This crate turns that response into a real
//! "pod": a process with its own network, mount, PID, UTS and IPC namespaces whose `/dev` is a
//! private tmpfs holding only the standard nodes plus the character devices the response granted,
//! with the response's bind mounts and environment.
//!
//! The work is split the usual way: [`allocation`] and [`cdi`] parse what the kubelet side hands
//! over, [`plan`] turns it into a validated [`plan::PodPlan`] (pure, no I/O), and [`runtime`]
//! executes a plan with Linux system calls.

pub mod allocation;
pub mod cdi;
pub mod link;
pub mod plan;
pub mod probe;
pub mod runtime;
pub mod verbs;
