//! RBAC evaluated as the API server's authorizer does, for tests: the request attributes the API
//! server derives from a URL (verb, API group, resource, subresource, namespace, name), the rules
//! of the (Cluster)Roles that (Cluster)RoleBindings grant to a user, and a coverage report of a
//! recorded session: requests no rule allows, and permissions no request used.
//!
//! Rule matching follows `k8s.io/kubernetes/pkg/apis/rbac/v1` and the RBAC authorizer: a rule
//! matches when its verbs contain the verb or `*`, its API groups the group or `*`, its resources
//! `*`, the resource (no subresource), `resource/subresource` or `*/subresource`, and its
//! resourceNames are empty or contain the request's name (a `create` has no name, so a rule with
//! resourceNames never allows one). A ClusterRoleBinding grants its role everywhere; a RoleBinding
//! grants its Role or ClusterRole only for namespaced requests in its namespace. Subjects match by
//! ServiceAccount (name and namespace), User, or Group (`system:serviceaccounts`,
//! `system:serviceaccounts:<ns>`, `system:authenticated`).
//!
//! Not modelled: aggregated ClusterRoles, `nonResourceURLs` rules (discovery is allowed to every
//! user, as the default `system:discovery` binding does), escalation checks on RBAC writes.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What the API server's authorizer sees of one request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attributes {
    /// The user (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// API group (`""` for the core group).
    pub api_group: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource (`status`), empty when none.
    pub subresource: String,
    /// Namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// Object name, empty for collections and creates (or from a `metadata.name` field selector
    /// on list/watch, as the API server does).
    pub name: String,
}

impl Attributes {
    /// `resource` or `resource/subresource`.
    pub fn full_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The API server's denial message.
    pub fn forbidden_message(&self) -> String {
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", self.namespace)
        };
        format!(
            "{}{} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.resource,
            if self.name.is_empty() {
                String::new()
            } else {
                format!(" \"{}\"", self.name)
            },
            self.user,
            self.verb,
            self.full_resource(),
            self.api_group,
        )
    }
}

/// The user name of a ServiceAccount.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// One granted permission: a single verb on a single resource (and name) of one rule, through one
/// binding. Rules are expanded into these so that an unused verb of a used rule is reported.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    /// `ClusterRole <name>` or `Role <ns>/<name>`.
    pub role: String,
    /// Where it applies: `cluster` or `namespace <ns>`.
    pub scope: String,
    /// API group of the rule (`""` core, `*` any).
    pub api_group: String,
    /// Resource of the rule (`nodes`, `nodes/status`, `*`).
    pub resource: String,
    /// Verb of the rule.
    pub verb: String,
    /// One of the rule's resourceNames, empty when the rule has none.
    pub resource_name: String,
}

impl Permission {
    fn allows(&self, a: &Attributes) -> bool {
        let scope_ok = match self.scope.strip_prefix("namespace ") {
            None => true,
            Some(ns) => a.namespace == ns,
        };
        let group_ok = self.api_group == "*" || self.api_group == a.api_group;
        let verb_ok = self.verb == "*" || self.verb == a.verb;
        let full = a.full_resource();
        let res_ok = self.resource == "*"
            || self.resource == full
            || (!a.subresource.is_empty() && self.resource == format!("*/{}", a.subresource));
        let name_ok = self.resource_name.is_empty() || self.resource_name == a.name;
        scope_ok && group_ok && verb_ok && res_ok && name_ok
    }
}

#[derive(Debug, Clone)]
struct Grant {
    role: String,
    scope: String,
    subjects: Vec<(String, String, String)>,
    rules: Vec<PolicyRule>,
}

/// The RBAC objects of an install, evaluated like the API server's RBAC authorizer.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    grants: Vec<Grant>,
}

fn subject_matches(subject: &(String, String, String), user: &str) -> bool {
    let (kind, name, ns) = subject;
    match kind.as_str() {
        "ServiceAccount" => service_account_user(ns, name) == user,
        "User" => name == user,
        "Group" => {
            let sa_ns = user
                .strip_prefix("system:serviceaccount:")
                .and_then(|r| r.split(':').next());
            name == "system:authenticated"
                || (sa_ns.is_some() && name == "system:serviceaccounts")
                || sa_ns.is_some_and(|n| *name == format!("system:serviceaccounts:{n}"))
        }
        _ => false,
    }
}

impl Authorizer {
    /// Reads the ClusterRoles, Roles and their bindings among `objects` (rendered manifests, any
    /// other kinds ignored). Errors name an object that does not deserialise or a binding whose
    /// role is missing.
    pub fn from_manifests(objects: &[Value]) -> Result<Self, String> {
        let mut cluster_roles: BTreeMap<String, Vec<PolicyRule>> = BTreeMap::new();
        let mut roles: BTreeMap<(String, String), Vec<PolicyRule>> = BTreeMap::new();
        let mut bindings: Vec<Value> = Vec::new();
        for o in objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let de = |what: &str| format!("{what} {}: does not deserialise", o["metadata"]["name"]);
            match kind {
                "ClusterRole" => {
                    let r: ClusterRole = serde_json::from_value(o.clone())
                        .map_err(|e| format!("{}: {e}", de(kind)))?;
                    cluster_roles.insert(
                        r.metadata.name.clone().unwrap_or_default(),
                        r.rules.unwrap_or_default(),
                    );
                }
                "Role" => {
                    let r: Role = serde_json::from_value(o.clone())
                        .map_err(|e| format!("{}: {e}", de(kind)))?;
                    roles.insert(
                        (
                            r.metadata.namespace.clone().unwrap_or_default(),
                            r.metadata.name.clone().unwrap_or_default(),
                        ),
                        r.rules.unwrap_or_default(),
                    );
                }
                "ClusterRoleBinding" | "RoleBinding" => bindings.push(o.clone()),
                _ => {}
            }
        }
        let subjects = |s: Option<Vec<k8s_openapi::api::rbac::v1::Subject>>, default_ns: &str| {
            s.unwrap_or_default()
                .into_iter()
                .map(|s| {
                    let ns = s.namespace.unwrap_or_else(|| default_ns.to_string());
                    (s.kind, s.name, ns)
                })
                .collect::<Vec<_>>()
        };
        let mut grants = Vec::new();
        for b in bindings {
            if b["kind"] == "ClusterRoleBinding" {
                let crb: ClusterRoleBinding = serde_json::from_value(b.clone())
                    .map_err(|e| format!("ClusterRoleBinding {}: {e}", b["metadata"]["name"]))?;
                let name = crb.role_ref.name.clone();
                let rules = cluster_roles.get(&name).cloned().ok_or_else(|| {
                    format!(
                        "ClusterRoleBinding {:?} names ClusterRole {name:?}, which is not rendered",
                        crb.metadata.name
                    )
                })?;
                grants.push(Grant {
                    role: format!("ClusterRole {name}"),
                    scope: "cluster".into(),
                    subjects: subjects(crb.subjects, ""),
                    rules,
                });
            } else {
                let rb: RoleBinding = serde_json::from_value(b.clone())
                    .map_err(|e| format!("RoleBinding {}: {e}", b["metadata"]["name"]))?;
                let ns = rb.metadata.namespace.clone().unwrap_or_default();
                let name = rb.role_ref.name.clone();
                let (role, rules) = if rb.role_ref.kind == "ClusterRole" {
                    (
                        format!("ClusterRole {name}"),
                        cluster_roles.get(&name).cloned(),
                    )
                } else {
                    (
                        format!("Role {ns}/{name}"),
                        roles.get(&(ns.clone(), name.clone())).cloned(),
                    )
                };
                let rules = rules.ok_or_else(|| {
                    format!(
                        "RoleBinding {ns}/{:?} names {role}, which is not rendered",
                        rb.metadata.name
                    )
                })?;
                grants.push(Grant {
                    role,
                    scope: format!("namespace {ns}"),
                    subjects: subjects(rb.subjects, &ns),
                    rules,
                });
            }
        }
        Ok(Self { grants })
    }

    /// Every permission granted to `user`, rules expanded per verb, resource and name.
    pub fn permissions(&self, user: &str) -> Vec<Permission> {
        let mut out = BTreeSet::new();
        for g in &self.grants {
            if !g.subjects.iter().any(|s| subject_matches(s, user)) {
                continue;
            }
            for r in &g.rules {
                let names: Vec<String> = match &r.resource_names {
                    Some(n) if !n.is_empty() => n.clone(),
                    _ => vec![String::new()],
                };
                for group in r.api_groups.iter().flatten() {
                    for res in r.resources.iter().flatten() {
                        for verb in &r.verbs {
                            for name in &names {
                                out.insert(Permission {
                                    role: g.role.clone(),
                                    scope: g.scope.clone(),
                                    api_group: group.clone(),
                                    resource: res.clone(),
                                    verb: verb.clone(),
                                    resource_name: name.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        out.into_iter().collect()
    }

    /// The permissions of the request's user that allow it; empty when it is denied.
    pub fn authorize(&self, a: &Attributes) -> Vec<Permission> {
        self.permissions(&a.user)
            .into_iter()
            .filter(|p| p.allows(a))
            .collect()
    }
}

/// One recorded request with the step of the test that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The request.
    pub attributes: Attributes,
    /// What the code was doing (set by the test driving it).
    pub step: String,
}

/// The result of [`coverage`].
#[derive(Debug, Default)]
pub struct Coverage {
    /// Requests no permission allows.
    pub denied: Vec<Recorded>,
    /// Every permission of the user with the steps that used it (empty: unused).
    pub used_by: BTreeMap<Permission, BTreeSet<String>>,
}

impl Coverage {
    /// The verdict a test asserts: `Err` naming every denied request (a missing permission) and
    /// every unused permission (a surplus one) except those in `allowed_unused`
    /// (`(resource, verb, why)`: a path no test can exercise, with its reason).
    pub fn verdict(&self, allowed_unused: &[(&str, &str, &str)]) -> Result<(), String> {
        let mut problems = Vec::new();
        if !self.denied.is_empty() {
            problems.push(format!(
                "requests the rendered RBAC does not allow (add the permission to erdma_k8s::install and the chart):\n{:#?}",
                self.denied
            ));
        }
        let unused: Vec<_> = self
            .unused()
            .into_iter()
            .filter(|p| {
                !allowed_unused
                    .iter()
                    .any(|(r, verb, _)| *r == p.resource && *verb == p.verb)
            })
            .collect();
        if !unused.is_empty() {
            problems.push(format!(
                "permissions nothing used (remove them from erdma_k8s::install and the chart, or justify them as allowed unused):\n{unused:#?}"
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    /// The permissions nothing used.
    pub fn unused(&self) -> Vec<&Permission> {
        self.used_by
            .iter()
            .filter(|(_, s)| s.is_empty())
            .map(|(p, _)| p)
            .collect()
    }
}

/// Checks the `user`'s requests among `records` against `authz`.
pub fn coverage(authz: &Authorizer, user: &str, records: &[Recorded]) -> Coverage {
    let mut c = Coverage {
        used_by: authz
            .permissions(user)
            .into_iter()
            .map(|p| (p, BTreeSet::new()))
            .collect(),
        ..Coverage::default()
    };
    for r in records.iter().filter(|r| r.attributes.user == user) {
        let by = authz.authorize(&r.attributes);
        if by.is_empty() {
            c.denied.push(r.clone());
        }
        for p in by {
            c.used_by.entry(p).or_default().insert(r.step.clone());
        }
    }
    c
}

/// A markdown table of `c`: one row per permission (verbs of the same rule, resource and names
/// that the same steps used are joined), with the steps that need it.
pub fn markdown_table(c: &Coverage) -> String {
    /// Role, scope, group, resource, name, steps.
    type Row = (String, String, String, String, String, String);
    let mut verbs: BTreeMap<Row, Vec<String>> = BTreeMap::new();
    for (p, steps) in &c.used_by {
        let needed = if steps.is_empty() {
            "**unused**".to_string()
        } else {
            steps.iter().cloned().collect::<Vec<_>>().join("; ")
        };
        let key = (
            p.role.clone(),
            p.scope.clone(),
            p.api_group.clone(),
            p.resource.clone(),
            p.resource_name.clone(),
            needed,
        );
        verbs.entry(key).or_default().push(p.verb.clone());
    }
    let mut out = String::from(
        "| Role (scope) | API group | Resource | Names | Verbs | Needed by |\n|---|---|---|---|---|---|\n",
    );
    for ((role, scope, group, res, name, needed), v) in verbs {
        let group = if group.is_empty() {
            "`\"\"`".to_string()
        } else {
            format!("`{group}`")
        };
        let name = if name.is_empty() {
            "any".to_string()
        } else {
            format!("`{name}`")
        };
        out.push_str(&format!(
            "| {role} ({scope}) | {group} | `{res}` | {name} | {} | {needed} |\n",
            v.join(", ")
        ));
    }
    out
}

/// Keeps the generated section `<!-- rbac:<marker>:begin -->` … `<!-- rbac:<marker>:end -->` of
/// the markdown file `doc` equal to `content`: with `UPDATE=1` in the environment it rewrites the
/// section, else a difference is an error naming the command that regenerates it.
pub fn check_doc_section(doc: &std::path::Path, marker: &str, content: &str) -> Result<(), String> {
    let begin =
        format!("<!-- rbac:{marker}:begin (generated by a test; UPDATE=1 regenerates) -->\n");
    let end = format!("<!-- rbac:{marker}:end -->");
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) else {
        return Err(format!(
            "{} has no section {begin:?} … {end:?}; add both markers",
            doc.display()
        ));
    };
    let current = &text[b + begin.len()..e];
    if current == content {
        return Ok(());
    }
    if std::env::var("UPDATE").is_ok_and(|v| v == "1") {
        let fresh = format!("{}{begin}{content}{}", &text[..b], &text[e..]);
        return std::fs::write(doc, fresh).map_err(|e| format!("{}: {e}", doc.display()));
    }
    Err(format!(
        "the RBAC table {marker} in {} is out of date; regenerate it with UPDATE=1 and review the diff.\n--- in the file\n{current}\n--- from the test\n{content}",
        doc.display()
    ))
}
