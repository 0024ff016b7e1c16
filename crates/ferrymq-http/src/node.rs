//! `GET /node`: the process an operator is looking at. Version and build, uptime, memory, open
//! files against their limit, threads, the data dir's file system and where writes stop, the
//! listeners with their TLS mode, and the settings in force. Secrets are never among them: the
//! settings are what the binary hands over (`HttpConfig::node`), and it leaves them out.
//!
//! The process figures are read from Linux's `/proc/self` and `statvfs`; elsewhere a figure the
//! system does not give is `null`, never a guess.

use std::path::Path;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;

/// What the binary knows of itself that the HTTP layer cannot see: the listeners and the
/// settings in force (secrets left out by whoever fills it).
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// Filled once the listeners are bound (their ports may be ephemeral until then).
    pub listeners: std::sync::Arc<parking_lot::Mutex<Vec<ListenerInfo>>>,
    /// Setting name and value as the operator would write it (`--name` without the dashes).
    pub settings: Vec<(String, String)>,
    /// In cluster mode: this node's view of its Raft groups, asked afresh for every request.
    pub cluster: Option<ClusterProbe>,
}

/// Asks a cluster node for its groups' state (see [`ClusterFacts`]).
#[derive(Clone)]
pub struct ClusterProbe(pub std::sync::Arc<dyn Fn() -> ClusterFacts + Send + Sync>);

impl std::fmt::Debug for ClusterProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterProbe")
    }
}

/// A cluster node and the Raft groups it runs, as it sees them.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClusterFacts {
    pub node_id: u64,
    pub cluster_id: String,
    /// The metadata group's leader, if one is known.
    pub metadata_leader: Option<u64>,
    /// The cluster removed this node (`ferrymq cluster remove-node`).
    pub removed: bool,
    /// Partitions this node leads with a replica more than `lag_entries_max` entries behind or
    /// unreachable.
    pub under_replicated: u64,
    pub groups: Vec<GroupFacts>,
}

/// One Raft group on this node: the metadata (group 0) or a partition.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GroupFacts {
    pub group: u64,
    /// The partition's topic; absent for the metadata group.
    pub topic: Option<String>,
    pub partition: Option<u32>,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    #[schema(example = "leader")]
    pub role: String,
    pub term: u64,
    pub leader: Option<u64>,
    /// The last entry of this node's log, and the last it applied.
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    /// The last entry the group's latest snapshot covers, and the last entry dropped from this
    /// node's log below it: the log is compacted (message bodies stay in the partition's own
    /// log). `null`: no snapshot yet.
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    /// The group's voters, as this node last applied its membership (a replica being added
    /// is a learner, not listed, until it has caught up).
    pub voters: Vec<u64>,
    /// The highest index a leader of the group has told this node is committed since this
    /// node started (`null` before it heard one, and where this node leads).
    pub leader_commit: Option<u64>,
    /// This replica leads, or has applied up to `leader_commit` since this node started (and
    /// stayed within 1000 entries of it since, so that a stream of writes does not make it
    /// flap).
    pub caught_up: bool,
    /// Where this node leads: each other replica and how many entries it is behind (`null`:
    /// nothing known to be replicated to it yet).
    pub followers: Vec<FollowerFacts>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FollowerFacts {
    pub node: u64,
    pub lag_entries: Option<u64>,
}

impl ClusterFacts {
    /// Why this node is not ready to serve yet, empty when it is: the metadata group must have
    /// a leader, and this node must lead it or have applied everything its leader said was
    /// committed since this node started (so a node back from a crash is ready only once it
    /// caught up). Each partition group it follows under a known leader must be caught up
    /// the same way; a partition without a leader is reported by `GET /status`, not here (the
    /// node still serves every other partition).
    pub fn not_ready(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        let Some(metadata) = self.groups.iter().find(|g| g.topic.is_none()) else {
            return vec!["cluster: the metadata group is not running on this node".into()];
        };
        if self.removed {
            return vec![format!(
                "cluster: node {} was removed from the cluster: it serves nothing and may be \
                 stopped (`ferrymq cluster add-node` admits it again)",
                self.node_id
            )];
        }
        if !metadata.voters.is_empty() && !metadata.voters.contains(&self.node_id) {
            // Admitted nodes vote once caught up; removed ones no longer do.
            return vec![format!(
                "cluster: node {} is not a member of the cluster yet: a node started with \
                 --join waits for `ferrymq cluster add-node {}`",
                self.node_id, self.node_id
            )];
        }
        if metadata.leader.is_none() {
            reasons.push("cluster: the metadata group has no leader yet".into());
        } else if !metadata.caught_up {
            reasons.push(lagging("the metadata group", metadata));
        }
        for group in self.groups.iter().filter(|g| g.topic.is_some()) {
            if group.leader.is_some() && !group.caught_up {
                let name = format!(
                    "partition {} of {} (group {})",
                    group.partition.map_or("?".into(), |p| p.to_string()),
                    group.topic.as_deref().unwrap_or_default(),
                    group.group
                );
                reasons.push(lagging(&name, group));
            }
        }
        reasons
    }
}

fn lagging(name: &str, group: &GroupFacts) -> String {
    let show = |index: Option<u64>| index.map_or("none".to_string(), |i| i.to_string());
    match group.leader_commit {
        _ if group.role == "leader" => {
            format!("cluster: {name} is led by this node, but no quorum has acknowledged it lately")
        }
        None => format!(
            "cluster: {name} has not heard from its leader (node {}) since this node started",
            show(group.leader)
        ),
        _ => format!(
            "cluster: {name} is catching up: applied {} of {} committed",
            show(group.applied_index),
            show(group.leader_commit)
        ),
    }
}

/// One listener and how it is protected.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ListenerInfo {
    /// `binary` or `http`.
    #[schema(example = "binary")]
    pub protocol: String,
    #[schema(example = "127.0.0.1:7070")]
    pub addr: String,
    /// `none`, `tls`, or `mutual` (client certificates required or mapped to users).
    #[schema(example = "none")]
    pub tls: String,
}

/// The node: see the module documentation.
#[derive(Serialize, utoipa::ToSchema)]
pub struct NodeInfo {
    #[schema(example = "0.1.0")]
    pub version: &'static str,
    /// Target architecture and operating system, and whether this is a debug build.
    #[schema(example = "x86_64-linux")]
    pub build: String,
    pub debug_build: bool,
    /// Milliseconds since the HTTP listener started.
    pub uptime_ms: u64,
    pub process: ProcessInfo,
    /// Absent for a broker without a data dir (memory topics only).
    pub data_dir: Option<DataDirInfo>,
    pub listeners: Vec<ListenerInfo>,
    /// Name and value of each setting in force; no secret is ever listed.
    pub settings: Vec<Setting>,
    /// In cluster mode, this node's Raft groups; `null` for a broker that runs alone.
    pub cluster: Option<ClusterFacts>,
}

/// The process's resources; `null` where the system does not say.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ProcessInfo {
    /// Resident memory.
    pub resident_bytes: Option<u64>,
    pub open_files: Option<u64>,
    /// The soft limit on open files (the broker raises it to the hard limit at start).
    pub open_files_limit: Option<u64>,
    pub threads: Option<u64>,
}

/// The file system of the data dir.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DataDirInfo {
    pub path: String,
    pub total_bytes: u64,
    /// What the broker may still write (the file system's blocks available to it).
    pub available_bytes: u64,
    pub used_bytes: u64,
    /// Writes stop, with `storage_unavailable`, when `available_bytes` reaches this: the broker
    /// keeps no reserve of its own; reads, acks and deliveries of what is stored go on, and
    /// writes resume by themselves once space is freed (see docs/storage.md).
    pub writes_stop_at_available_bytes: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Setting {
    #[schema(example = "default-storage")]
    pub name: String,
    #[schema(example = "disk")]
    pub value: String,
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(node))
}

/// The node: version, uptime, memory, open files, threads, the data dir's disk, listeners and
/// settings (monitor or admin role, as `/metrics`).
#[utoipa::path(get, path = "/node", tag = "service",
    responses(
        (status = 200, description = "This node", body = NodeInfo),
        (status = 401, description = "`authentication_failed`: the broker has users and the request has no valid credentials", body = crate::error::ErrorBody),
        (status = 403, description = "`forbidden`: the user has neither the monitor nor the admin role", body = crate::error::ErrorBody),
    ))]
async fn node(State(state): State<AppState>) -> Json<NodeInfo> {
    let facts = &state.config.node;
    Json(NodeInfo {
        version: env!("CARGO_PKG_VERSION"),
        build: format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
        debug_build: cfg!(debug_assertions),
        uptime_ms: state.started.elapsed().as_millis() as u64,
        process: process_info(),
        data_dir: state.config.data_dir.as_deref().and_then(data_dir_info),
        listeners: facts.listeners.lock().clone(),
        cluster: facts.cluster.as_ref().map(|probe| (probe.0)()),
        settings: facts
            .settings
            .iter()
            .map(|(name, value)| Setting {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
    })
}

/// The process's resources from `/proc/self` and `getrlimit`.
pub(crate) fn process_info() -> ProcessInfo {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse::<u64>().ok())
    };
    let open_files = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as u64);
    ProcessInfo {
        // VmRSS is in kB.
        resident_bytes: field("VmRSS:").map(|kb| kb * 1024),
        open_files,
        open_files_limit: ferrymq_broker::open_files_limit(),
        threads: field("Threads:"),
    }
}

/// The file system holding `path`, from `statvfs`.
pub(crate) fn data_dir_info(path: &Path) -> Option<DataDirInfo> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value for statvfs to overwrite.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated path and `stat` a writable statvfs.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    let block = stat.f_frsize as u64;
    let total_bytes = stat.f_blocks as u64 * block;
    let free_bytes = stat.f_bfree as u64 * block;
    Some(DataDirInfo {
        path: path.display().to_string(),
        total_bytes,
        available_bytes: stat.f_bavail as u64 * block,
        used_bytes: total_bytes.saturating_sub(free_bytes),
        writes_stop_at_available_bytes: 0,
    })
}

/// The node's gauges for `/metrics`.
pub(crate) fn render_metrics(text: &mut String, state: &AppState) {
    use std::fmt::Write as _;
    let process = process_info();
    let mut gauge = |name: &str, help: &str, value: Option<u64>| {
        if let Some(value) = value {
            let _ = write!(
                text,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            );
        }
    };
    gauge(
        "ferrymq_process_resident_bytes",
        "Resident memory of the broker process.",
        process.resident_bytes,
    );
    gauge(
        "ferrymq_process_open_files",
        "Files and sockets the broker process holds open.",
        process.open_files,
    );
    gauge(
        "ferrymq_process_open_files_limit",
        "The broker process's limit on open files.",
        process.open_files_limit,
    );
    gauge(
        "ferrymq_process_threads",
        "Threads of the broker process.",
        process.threads,
    );
    gauge(
        "ferrymq_uptime_seconds",
        "Seconds since the broker's HTTP listener started.",
        Some(state.started.elapsed().as_secs()),
    );
    if let Some(disk) = state.config.data_dir.as_deref().and_then(data_dir_info) {
        gauge(
            "ferrymq_data_dir_total_bytes",
            "Size of the file system holding the data dir.",
            Some(disk.total_bytes),
        );
        gauge(
            "ferrymq_data_dir_available_bytes",
            "Bytes the broker may still write to the data dir's file system; writes stop at 0.",
            Some(disk.available_bytes),
        );
    }
    if let Some(probe) = &state.config.node.cluster {
        render_cluster(text, &(probe.0)());
    }
}

/// A cluster node's gauges: its role, log positions and followers' lag per group.
fn render_cluster(text: &mut String, facts: &ClusterFacts) {
    use std::fmt::Write as _;
    let _ = write!(
        text,
        "# HELP ferrymq_cluster_under_replicated_partitions Partitions this node leads with a replica behind or unreachable.\n\
         # TYPE ferrymq_cluster_under_replicated_partitions gauge\n\
         ferrymq_cluster_under_replicated_partitions {}\n",
        facts.under_replicated
    );
    let _ = writeln!(
        text,
        "# HELP ferrymq_cluster_group_leader 1 where this node leads the group.\n\
         # TYPE ferrymq_cluster_group_leader gauge"
    );
    let label = |g: &GroupFacts| match (&g.topic, g.partition) {
        (Some(topic), Some(p)) => format!(
            "group=\"{}\",topic=\"{}\",partition=\"{p}\"",
            g.group, topic
        ),
        _ => format!("group=\"{}\",topic=\"\",partition=\"\"", g.group),
    };
    for g in &facts.groups {
        let _ = writeln!(
            text,
            "ferrymq_cluster_group_leader{{{}}} {}",
            label(g),
            u8::from(g.role == "leader")
        );
    }
    let _ = writeln!(
        text,
        "# HELP ferrymq_cluster_applied_index The last log entry this node applied, per group.\n\
         # TYPE ferrymq_cluster_applied_index gauge"
    );
    for g in &facts.groups {
        let _ = writeln!(
            text,
            "ferrymq_cluster_applied_index{{{}}} {}",
            label(g),
            g.applied_index.unwrap_or(0)
        );
    }
    let _ = writeln!(
        text,
        "# HELP ferrymq_cluster_follower_lag_entries Entries a follower is behind, where this node leads.\n\
         # TYPE ferrymq_cluster_follower_lag_entries gauge"
    );
    for g in &facts.groups {
        for f in &g.followers {
            if let Some(lag) = f.lag_entries {
                let _ = writeln!(
                    text,
                    "ferrymq_cluster_follower_lag_entries{{{},follower=\"{}\"}} {lag}",
                    label(g),
                    f.node
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(
        topic: Option<&str>,
        role: &str,
        leader: Option<u64>,
        applied: u64,
        commit: Option<u64>,
    ) -> GroupFacts {
        GroupFacts {
            group: if topic.is_some() { 7 } else { 0 },
            topic: topic.map(str::to_owned),
            partition: topic.map(|_| 0),
            role: role.into(),
            term: 3,
            leader,
            last_log_index: Some(applied),
            applied_index: Some(applied),
            snapshot_index: None,
            purged_index: None,
            voters: vec![],
            leader_commit: commit,
            caught_up: role == "leader" || commit.is_some_and(|c| applied >= c),
            followers: vec![],
        }
    }

    fn facts(groups: Vec<GroupFacts>) -> ClusterFacts {
        ClusterFacts {
            node_id: 2,
            cluster_id: "ferrymq".into(),
            metadata_leader: groups[0].leader,
            removed: false,
            under_replicated: 0,
            groups,
        }
    }

    #[test]
    fn a_node_outside_the_metadata_voters_is_not_ready_and_says_why() {
        let mut metadata = group(None, "learner", Some(1), 5, Some(5));
        metadata.voters = vec![1, 3, 4];
        let reasons = facts(vec![metadata.clone()]).not_ready();
        assert_eq!(reasons.len(), 1);
        assert!(reasons[0].contains("node 2 is not a member"), "{reasons:?}");
        metadata.voters = vec![1, 2, 3];
        assert!(facts(vec![metadata.clone()]).not_ready().is_empty());
        let mut removed = facts(vec![metadata]);
        removed.removed = true;
        assert!(removed.not_ready()[0].contains("node 2 was removed"));
    }

    #[test]
    fn a_node_is_ready_once_its_metadata_group_has_a_leader_and_it_caught_up() {
        let no_leader = facts(vec![group(None, "candidate", None, 5, None)]);
        assert_eq!(
            no_leader.not_ready(),
            ["cluster: the metadata group has no leader yet"]
        );
        let unheard = facts(vec![group(None, "follower", Some(1), 5, None)]);
        assert_eq!(
            unheard.not_ready(),
            ["cluster: the metadata group has not heard from its leader (node 1) since this node started"]
        );
        let behind = facts(vec![group(None, "follower", Some(1), 5, Some(9))]);
        assert_eq!(
            behind.not_ready(),
            ["cluster: the metadata group is catching up: applied 5 of 9 committed"]
        );
        assert!(facts(vec![group(None, "follower", Some(1), 9, Some(9))])
            .not_ready()
            .is_empty());
        assert!(facts(vec![group(None, "leader", Some(2), 9, None)])
            .not_ready()
            .is_empty());
        // Restarted alone, it may take up its old leadership with no quorum to confirm it.
        let unconfirmed = GroupFacts {
            caught_up: false,
            ..group(None, "leader", Some(2), 9, None)
        };
        assert_eq!(
            facts(vec![unconfirmed]).not_ready(),
            ["cluster: the metadata group is led by this node, but no quorum has acknowledged it lately"]
        );
    }

    #[test]
    fn a_partition_behind_its_leader_holds_readiness_but_a_leaderless_one_does_not() {
        let metadata = group(None, "follower", Some(1), 9, Some(9));
        let behind = group(Some("orders"), "follower", Some(3), 10, Some(40));
        let reasons = facts(vec![metadata.clone(), behind]).not_ready();
        assert_eq!(
            reasons,
            ["cluster: partition 0 of orders (group 7) is catching up: applied 10 of 40 committed"]
        );
        let leaderless = group(Some("orders"), "candidate", None, 10, Some(40));
        assert!(facts(vec![metadata.clone(), leaderless])
            .not_ready()
            .is_empty());
        let missing = ClusterFacts {
            groups: vec![],
            ..facts(vec![metadata])
        };
        assert_eq!(
            missing.not_ready(),
            ["cluster: the metadata group is not running on this node"]
        );
    }
}
