// The cluster as the node serving the page sees it (`GET /cluster`): every node with its health,
// version, uptime, memory and disk; every replicated partition with its leader, replicas and how
// far each follower is behind; and, called out above the tables, the nodes that are down, the
// partitions that are under-replicated and the leader elections of the last minutes. Any node
// answers, a follower as well as a leader, and a node that is down is listed with the reason it
// could not be asked. Read again on every statistics tick, so only while the tab is visible.

import { Fragment } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, ClusterElection, ClusterNode, ClusterPartition, ClusterState, get } from "../api";
import { Empty, ErrorBox, Table } from "../components";
import { bytes, count, millis, percent, plural, time } from "../format";
import { useLive } from "../live";
import { href } from "../router";

/** Elections this recent are called out above the tables. */
const RECENT_ELECTION_MS = 5 * 60_000;
/** Partitions named in the under-replicated call-out; the table has them all. */
const CALLED_OUT_MAX = 10;

export function ClusterPage() {
  const live = useLive();
  const [cluster, setCluster] = useState<ClusterState | null>(null);
  const [at, setAt] = useState<number | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  // One request at a time: while a node is down the answer may take longer than a tick, and
  // requests piling up would only slow it further.
  const asking = useRef(false);
  const mounted = useRef(true);
  useEffect(
    () => () => {
      mounted.current = false;
    },
    [],
  );

  useEffect(() => {
    if (asking.current) return;
    asking.current = true;
    get<ClusterState>("/cluster").then(
      (next) => {
        asking.current = false;
        if (!mounted.current) return;
        setCluster(next);
        setAt(Date.now());
        setError(null);
      },
      (err) => {
        asking.current = false;
        if (!mounted.current) return;
        setError(err instanceof ApiError ? err : new ApiError(0, "error", String(err)));
      },
    );
  }, [live.ticks]);

  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Cluster
      </h1>
      {error ? (
        <ErrorBox
          error={error}
          what={cluster && at ? `Cannot read the cluster's state (shown as of ${Math.max(0, Math.round((Date.now() - at) / 1000))} s ago)` : "Cannot read the cluster's state"}
        />
      ) : null}
      {!cluster && !error ? <p class="muted">Asking the nodes…</p> : null}
      {cluster ? <ClusterView cluster={cluster} at={at} /> : null}
    </section>
  );
}

const nodeName = (id: number | null) => (id === null ? "none" : `node ${id}`);

function partitionName(topic: string | null, partition: number | null): string {
  return topic === null ? "metadata" : `${topic} partition ${partition ?? "?"}`;
}

function ago(ms: number, now: number): string {
  return `${millis(Math.max(0, now - ms))} ago`;
}

function ClusterView({ cluster, at }: { cluster: ClusterState; at: number | null }) {
  const now = Date.now();
  const byId = new Map(cluster.nodes.map((n) => [n.id, n]));
  const down = cluster.nodes.filter((n) => !n.up);
  const up = cluster.nodes.length - down.length;
  const partitions = [...cluster.partitions].sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
  const under = partitions.filter((p) => p.under_replicated);
  const leaderless = partitions.filter((p) => p.leader === null);
  const recent = cluster.elections.filter((e) => now - e.at_ms <= RECENT_ELECTION_MS);
  return (
    <>
      <dl class="facts">
        <div>
          <dt>Cluster</dt>
          <dd class="mono">{cluster.cluster_id}</dd>
        </div>
        <div>
          <dt>Answered by</dt>
          <dd data-testid="answered-by">
            {nodeName(cluster.node_id)}
            {cluster.metadata_leader === cluster.node_id ? <span class="muted"> (the metadata leader)</span> : null}
          </dd>
        </div>
        <div>
          <dt>Read</dt>
          <dd>{time(at)}</dd>
        </div>
      </dl>

      {down.map((n) => (
        <div class="error" role="alert" key={`down-${n.id}`} data-testid="node-down">
          <strong>Node {n.id} is down</strong>
          {n.addr ? ` (${n.addr})` : null}: {n.error ?? "it did not answer"}
        </div>
      ))}
      {cluster.metadata_leader === null ? (
        <div class="error" role="alert" data-testid="metadata-electing">
          <strong>The metadata group has no leader</strong>: it is electing one. Topics cannot be created or deleted until it has.
        </div>
      ) : null}
      {under.length || cluster.under_replicated ? (
        <div class="error" role="alert" data-testid="under-replicated">
          <strong>{plural(Math.max(cluster.under_replicated, under.length), "partition")} under-replicated</strong>, with a replica down or behind:{" "}
          {under.slice(0, CALLED_OUT_MAX).map((p, i) => (
            <Fragment key={`${p.topic}/${p.partition}`}>
              {i ? ", " : null}
              <a href={href.topic(p.topic)}>{partitionName(p.topic, p.partition)}</a>
            </Fragment>
          ))}
          {under.length > CALLED_OUT_MAX ? ` and ${count(under.length - CALLED_OUT_MAX)} more` : null}.
        </div>
      ) : null}
      {leaderless.length ? (
        <div class="error" role="alert" data-testid="leaderless">
          <strong>{plural(leaderless.length, "partition")} without a leader</strong>, electing one (writes to them wait):{" "}
          {leaderless.map((p) => partitionName(p.topic, p.partition)).join(", ")}.
        </div>
      ) : null}
      {recent.length ? (
        <div class="warn" role="status" data-testid="recent-elections">
          <strong>
            {plural(recent.length, "leader election")} in the last {millis(RECENT_ELECTION_MS)}
          </strong>
          :{" "}
          {recent.slice(0, 5).map((e, i) => (
            <Fragment key={`${e.group}/${e.term}/${e.at_ms}`}>
              {i ? "; " : null}
              {partitionName(e.topic, e.partition)} now led by {nodeName(e.leader)} (term {e.term}, {ago(e.at_ms, now)})
            </Fragment>
          ))}
          {recent.length > 5 ? `; and ${count(recent.length - 5)} more below` : null}.
        </div>
      ) : null}

      <ul class="tiles" data-testid="cluster-tiles">
        <li>
          <span class="label">Nodes up</span>
          <span class="value" data-testid="nodes-up">
            {count(up)} of {count(cluster.nodes.length)}
          </span>
        </li>
        <li>
          <span class="label">Metadata leader</span>
          <span class="value">{cluster.metadata_leader === null ? "electing" : nodeName(cluster.metadata_leader)}</span>
        </li>
        <li>
          <span class="label">Partitions</span>
          <span class="value">{count(partitions.length)}</span>
        </li>
        <li>
          <span class="label">Under-replicated</span>
          <span class="value" data-testid="under-replicated-count">
            {plural(cluster.under_replicated, "partition")}
          </span>
        </li>
      </ul>

      <h2>Nodes</h2>
      <Nodes cluster={cluster} />

      <h2>Partitions</h2>
      {partitions.length ? <Partitions partitions={partitions} byId={byId} /> : <Empty>No replicated topic yet: a topic created on a cluster node gets its partitions here.</Empty>}

      <h2>Elections</h2>
      <p class="muted">Leader changes {nodeName(cluster.node_id)} saw, newest first.</p>
      {cluster.elections.length ? <Elections elections={cluster.elections} now={now} /> : <Empty>{nodeName(cluster.node_id)} has seen no leader change.</Empty>}
    </>
  );
}

function Nodes({ cluster }: { cluster: ClusterState }) {
  return (
    <Table label="Nodes">
      <thead>
        <tr>
          <th scope="col">Node</th>
          <th scope="col" title="Where clients reach it">Address</th>
          <th scope="col">Health</th>
          <th scope="col">Version</th>
          <th scope="col" class="num">Uptime</th>
          <th scope="col" class="num" title="Resident memory">Memory</th>
          <th scope="col" class="num" title="The data dir's file system: used of its size">Disk used</th>
          <th scope="col" class="num" title="Partitions it leads">Leads</th>
          <th scope="col" class="num" title="Partitions it keeps a replica of">Replicas</th>
        </tr>
      </thead>
      <tbody>
        {cluster.nodes.map((n) => (
          <NodeRow key={n.id} node={n} answering={n.id === cluster.node_id} metadataLeader={n.id === cluster.metadata_leader} />
        ))}
      </tbody>
    </Table>
  );
}

function NodeRow({ node: n, answering, metadataLeader }: { node: ClusterNode; answering: boolean; metadataLeader: boolean }) {
  const disk =
    n.disk_used_bytes !== null && n.disk_total_bytes !== null
      ? `${bytes(n.disk_used_bytes)} of ${bytes(n.disk_total_bytes)} (${percent(n.disk_used_bytes, n.disk_total_bytes)})`
      : "–";
  return (
    <tr data-node={n.id} class={n.up ? undefined : "down"}>
      <th scope="row">
        <span class="nowrap">node {n.id}</span>
        {answering ? <div class="muted">serving this page</div> : null}
        {metadataLeader ? <div class="muted">metadata leader</div> : null}
      </th>
      <td class="mono">{n.addr ?? <span class="muted">not announced yet</span>}</td>
      <td class="health-cell">
        <span class={`state ${n.up ? "up" : "down"}`}>{n.up ? "up" : "down"}</span>
        {n.error ? <div class="reason">{n.error}</div> : null}
      </td>
      <td>{n.version ?? "–"}</td>
      <td class="num">{millis(n.uptime_ms)}</td>
      <td class="num">{bytes(n.resident_bytes)}</td>
      <td class="num" title={n.disk_available_bytes === null ? undefined : `${bytes(n.disk_available_bytes)} available`}>
        {disk}
      </td>
      <td class="num">{n.leader_of === null ? "–" : plural(n.leader_of, "partition")}</td>
      <td class="num">{n.replica_of === null ? "–" : plural(n.replica_of, "partition")}</td>
    </tr>
  );
}

/** A follower's lag as its leader measures it; `null` is not 0 but nothing known replicated. */
function lag(entries: number | null): string {
  if (entries === null) return "unknown, nothing replicated yet";
  if (entries === 0) return "in step";
  return `${entries === 1 ? "1 entry" : `${count(entries)} entries`} behind`;
}

function Partitions({ partitions, byId }: { partitions: ClusterPartition[]; byId: Map<number, ClusterNode> }) {
  const isDown = (id: number) => byId.get(id)?.up === false;
  return (
    <Table label="Partitions">
      <thead>
        <tr>
          <th scope="col">Topic</th>
          <th scope="col" class="num">Partition</th>
          <th scope="col">Leader</th>
          <th scope="col">Replicas</th>
          <th scope="col" title="Entries each follower is behind the leader">Follower lag</th>
          <th scope="col">Replication</th>
        </tr>
      </thead>
      <tbody>
        {partitions.map((p) => (
          <tr key={`${p.topic}/${p.partition}`} data-partition={`${p.topic}/${p.partition}`} class={p.under_replicated ? "under" : undefined}>
            <td>
              <a href={href.topic(p.topic)}>{p.topic}</a>
            </td>
            <td class="num" title={`Raft group ${p.group}`}>
              {p.partition}
            </td>
            <td data-testid="leader">{p.leader === null ? <span class="reason">electing</span> : nodeName(p.leader)}</td>
            <td>
              <span data-testid="replicas">{p.replicas.join(", ")}</span>
              {p.replicas.some(isDown) ? (
                <div class="reason">
                  {p.replicas
                    .filter(isDown)
                    .map((r) => `node ${r}`)
                    .join(", ")}{" "}
                  down
                </div>
              ) : null}
            </td>
            <td>
              {p.followers.length === 0 ? <span class="muted">–</span> : null}
              {p.followers.map((f) => (
                <div key={f.node} class="nowrap" data-follower={f.node}>
                  node {f.node}:{" "}
                  {isDown(f.node) ? (
                    <>
                      <span class="reason">down</span>
                      <span class="muted"> (last measured: {lag(f.lag_entries)})</span>
                    </>
                  ) : f.lag_entries === null ? (
                    <span class="reason" title="Nothing is known to be replicated to it yet">
                      {lag(null)}
                    </span>
                  ) : (
                    lag(f.lag_entries)
                  )}
                </div>
              ))}
            </td>
            <td>{p.under_replicated ? <span class="state down">under-replicated</span> : <span class="state up">in sync</span>}</td>
          </tr>
        ))}
      </tbody>
    </Table>
  );
}

function Elections({ elections, now }: { elections: ClusterElection[]; now: number }) {
  return (
    <Table label="Elections">
      <thead>
        <tr>
          <th scope="col">When</th>
          <th scope="col">Group</th>
          <th scope="col" class="num">Term</th>
          <th scope="col">New leader</th>
        </tr>
      </thead>
      <tbody>
        {elections.map((e) => (
          <tr key={`${e.group}/${e.term}/${e.at_ms}`} data-election-group={e.group} data-term={e.term} data-leader={e.leader ?? ""}>
            <td class="nowrap">
              {time(e.at_ms)}
              <span class="muted"> · {ago(e.at_ms, now)}</span>
            </td>
            <td>
              {e.topic === null ? (
                "metadata"
              ) : (
                <>
                  <a href={href.topic(e.topic)}>{e.topic}</a> partition {e.partition ?? "?"}
                </>
              )}
              <span class="muted"> · group {e.group}</span>
            </td>
            <td class="num">{count(e.term)}</td>
            <td>{nodeName(e.leader)}</td>
          </tr>
        ))}
      </tbody>
    </Table>
  );
}
