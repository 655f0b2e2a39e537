//! `local.nri`: whether the container runtime offers NRI on this node, and which path the agent
//! uses (NRI at sandbox creation, or the device plugin's PreStart) for SMC-R, memlock and
//! `rdma.max`.

use crate::check::Check;

const ID: &str = "local.nri";
const ENABLE: &str = "containerd 1.7: set [plugins.\"io.containerd.nri.v1.nri\"] disable = false in /etc/containerd/config.toml and restart containerd (on by default from containerd 2.0; CRI-O >= 1.26 has it), then restart the erdma agent pod on this node";

/// Judges the runtime's socket (`socket_exists`) and the agent's `/healthz` `nri` object (when an
/// agent answered).
pub fn check(socket: &str, socket_exists: bool, agent: Option<&serde_json::Value>) -> Check {
    let Some(view) = agent else {
        return if socket_exists {
            Check::info(
                ID,
                format!(
                    "the runtime offers NRI ({socket} exists); no agent answered, so which path it uses is not known"
                ),
                "pass --agent-addr to ask the agent",
            )
        } else {
            Check::info(
                ID,
                format!(
                    "the runtime offers no NRI ({socket} is missing): SMC-R goes through PreStartContainer, and containers get no memlock or rdma.max adjustment"
                ),
                ENABLE,
            )
        };
    };
    let used = view["used"].as_bool().unwrap_or(false);
    let connected = view["connected"].as_bool().unwrap_or(false);
    let path = view["smcr_path"].as_str().unwrap_or("unknown");
    let mode = view["mode"].as_str().unwrap_or("unknown");
    // Absent from agents before the cgroup v1 route: nothing is said about it then.
    let route = view["rdma_max_route"].as_str().unwrap_or("");
    let cgroup = view["cgroup_version"].as_str().unwrap_or("unknown");
    let limits = match route {
        "unified" => format!("; rdma.max: in the NRI adjustment (cgroup {cgroup})"),
        "rdma-cgroup" => format!(
            "; rdma.max: written into each container's rdma cgroup at StartContainer (cgroup {cgroup}: the runtime refuses unified)"
        ),
        _ => String::new(),
    };
    match (used, connected, socket_exists) {
        (true, true, _) if route == "none" => Check::warn(
            ID,
            format!(
                "the agent's NRI plugin is registered with the runtime ({socket}), but this node runs cgroup {cgroup} without the rdma controller's hierarchy: containers get memlock but no rdma.max (Warning Events ErdmaRdmaLimitNotApplied)"
            ),
            "mount the rdma cgroup v1 hierarchy at /sys/fs/cgroup/rdma or move the node to cgroup v2, then restart the erdma agent pod on this node",
        ),
        (true, true, _) => Check::pass(
            ID,
            format!(
                "the agent's NRI plugin is registered with the runtime ({socket}); SMC-R path: {path}{limits}"
            ),
        ),
        (true, false, _) => Check::warn(
            ID,
            format!(
                "the agent uses NRI (--nri {mode}) but is not registered with the runtime: {}",
                view["last_error"].as_str().unwrap_or("not connected yet")
            ),
            ENABLE,
        ),
        (false, _, true) if mode != "off" => Check::warn(
            ID,
            format!(
                "the runtime offers NRI ({socket} exists) but the agent uses the {path} path: the socket appeared after the agent started"
            ),
            "restart the erdma agent pod on this node so that it registers with NRI",
        ),
        (false, _, _) => Check::info(
            ID,
            format!(
                "NRI not used (--nri {mode}, {socket} {}); SMC-R path: {path}; containers get no memlock or rdma.max adjustment",
                if socket_exists {
                    "exists"
                } else {
                    "is missing"
                }
            ),
            ENABLE,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;
    use serde_json::json;

    #[test]
    fn every_combination_says_what_is_used() {
        let s = "/var/run/nri/nri.sock";
        assert_eq!(check(s, false, None).status, Status::Info);
        assert_eq!(check(s, true, None).status, Status::Info);
        let ok = json!({"mode": "auto", "used": true, "connected": true, "smcr_path": "nri"});
        let c = check(s, true, Some(&ok));
        assert_eq!(c.status, Status::Pass);
        assert!(c.message.contains("SMC-R path: nri"), "{}", c.message);
        let v1 = json!({"mode": "auto", "used": true, "connected": true, "smcr_path": "nri",
            "cgroup_version": "v1", "rdma_max_route": "rdma-cgroup"});
        let c = check(s, true, Some(&v1));
        assert_eq!(c.status, Status::Pass);
        assert!(
            c.message
                .contains("rdma cgroup at StartContainer (cgroup v1"),
            "{}",
            c.message
        );
        let bare = json!({"mode": "auto", "used": true, "connected": true, "smcr_path": "nri",
            "cgroup_version": "hybrid", "rdma_max_route": "none"});
        let c = check(s, true, Some(&bare));
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("cgroup hybrid without"), "{}", c.message);
        assert!(c.hint.unwrap().contains("/sys/fs/cgroup/rdma"));
        let down = json!({"mode": "on", "used": true, "connected": false, "smcr_path": "nri", "last_error": "NRI socket: refused"});
        let c = check(s, false, Some(&down));
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("refused"));
        let late =
            json!({"mode": "auto", "used": false, "connected": false, "smcr_path": "prestart"});
        assert_eq!(check(s, true, Some(&late)).status, Status::Warn);
        let c = check(s, false, Some(&late));
        assert_eq!(c.status, Status::Info);
        assert!(c.hint.unwrap().contains("disable = false"));
    }
}
