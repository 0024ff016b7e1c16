import { isAdmin, useSession } from "../access";
import { get, Status } from "../api";
import { Chart } from "../chart";
import { Empty, ErrorBox, Table, useLoad } from "../components";
import { bytes, count, millis, percent, rate } from "../format";
import { useLive } from "../live";
import { href } from "../router";

export function Faults({ status }: { status: Status | null }) {
  if (!status) return null;
  if (status.faults.length === 0) {
    return <p class="ok-line">Disks: every partition takes writes.</p>;
  }
  return (
    <div class="error" role="alert">
      <strong>
        {status.faults.length === 1 ? "1 partition refuses writes" : `${status.faults.length} partitions refuse writes`}
      </strong>
      <ul>
        {status.faults.map((f) => (
          <li key={`${f.topic}/${f.partition}`}>
            <a href={href.topic(f.topic)}>{f.topic}</a> partition {f.partition}: {f.reason}.{" "}
            {f.damaged
              ? "Found damaged at start: out of service until repaired (ferrymq verify) and the broker restarted."
              : "Reopened automatically: healthy again once a write reaches the disk (free space, fix permissions)."}
          </li>
        ))}
      </ul>
    </div>
  );
}

interface NodeInfo {
  version: string;
  build: string;
  debug_build: boolean;
  process: { resident_bytes: number | null; open_files: number | null; open_files_limit: number | null; threads: number | null };
  data_dir: { path: string; total_bytes: number; available_bytes: number; used_bytes: number } | null;
  listeners: { protocol: string; addr: string; tls: string }[];
}

/**
 * The node the page is served by (`GET /node`): memory, open files against their limit, the
 * data dir's space and where writes stop, the listeners. For the roles that may read it
 * (monitor, admin, anyone on a broker without users); refreshed with the page's visits.
 */
function NodePanel() {
  const session = useSession();
  const allowed = isAdmin(session) || !!session?.roles.includes("monitor");
  const node = useLoad(() => (allowed ? get<NodeInfo>("/node") : Promise.resolve(null)), [allowed]);
  if (!allowed || !node.data) return node.error ? <ErrorBox error={node.error} what="Cannot read the node" /> : null;
  const n = node.data;
  const p = n.process;
  const disk = n.data_dir;
  return (
    <>
      <h2>This node</h2>
      <ul class="tiles" data-testid="node">
        <li>
          <span class="label">Version</span>
          <span class="value">
            {n.version}
            <span class="muted"> {n.build}{n.debug_build ? ", debug build" : ""}</span>
          </span>
        </li>
        <li>
          <span class="label">Memory (resident)</span>
          <span class="value" data-testid="node-memory">{bytes(p.resident_bytes)}</span>
        </li>
        <li>
          <span class="label" title="Files and sockets open, against the process's limit">Open files</span>
          <span class="value" data-testid="node-files">
            {count(p.open_files)} of {count(p.open_files_limit)}
          </span>
        </li>
        <li>
          <span class="label">Threads</span>
          <span class="value">{count(p.threads)}</span>
        </li>
        {disk ? (
          <li>
            <span class="label" title={`${disk.path}: writes stop when nothing is available`}>Data dir free</span>
            <span class="value" data-testid="node-disk">
              {bytes(disk.available_bytes)} of {bytes(disk.total_bytes)} ({percent(disk.available_bytes, disk.total_bytes)})
            </span>
          </li>
        ) : null}
        {n.listeners.map((l) => (
          <li key={l.protocol}>
            <span class="label">{l.protocol === "binary" ? "Binary protocol" : "HTTP"}</span>
            <span class="value">
              {l.addr}
              <span class="muted"> {l.tls === "none" ? "plaintext" : l.tls === "mutual" ? "TLS, client certificates" : "TLS"}</span>
            </span>
          </li>
        ))}
      </ul>
    </>
  );
}

export function OverviewPage() {
  const { snapshot, history, error } = useLive();
  if (!snapshot) {
    return (
      <section>
        <h1 id="view-title" tabIndex={-1}>
          Overview
        </h1>
        {error ? <ErrorBox error={error} what="Cannot read the broker's statistics" /> : <p class="muted">Reading the broker's statistics…</p>}
      </section>
    );
  }
  const { totals, topics, status, rates } = snapshot;
  const lastIn = history.inRate[history.inRate.length - 1];
  const lastOut = history.outRate[history.outRate.length - 1];
  const busiest = [...topics]
    .map((t) => ({ t, backlog: t.subscriptions.reduce((s, x) => s + x.backlog, 0) }))
    .sort((a, b) => b.backlog - a.backlog || b.t.depth - a.t.depth)
    .slice(0, 10);
  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Overview
      </h1>
      <Faults status={status} />
      <ul class="tiles" aria-label="Totals">
        <li>
          <span class="label">Topics</span>
          <span class="value" data-testid="topics-count">
            {count(topics.length)}
          </span>
        </li>
        <li>
          <span class="label" title="Messages published per second over the last poll (2 s)">In, per s</span>
          <span class="value" data-testid="rate-in">
            {rate(lastIn)}
          </span>
        </li>
        <li>
          <span class="label" title="Messages delivered per second over the last poll (2 s)">Out, per s</span>
          <span class="value" data-testid="rate-out">
            {rate(lastOut)}
          </span>
        </li>
        <li>
          <span class="label" title="Messages waiting, added up over every subscription: a message two subscriptions still wait for counts twice">
            Backlog, all subscriptions
          </span>
          <span class="value" data-testid="backlog">
            {count(totals.backlog)} msg
          </span>
        </li>
        <li>
          <span class="label" title="Messages the topics hold now, each counted once">Retained</span>
          <span class="value" data-testid="retained">
            {count(topics.reduce((sum, t) => sum + t.depth, 0))} msg
          </span>
        </li>
        <li>
          <span class="label" title="Counted since the broker started">Published since start</span>
          <span class="value" data-testid="published">
            {count(totals.in)} msg
          </span>
        </li>
        <li>
          <span class="label">In flight</span>
          <span class="value">{count(totals.inFlight)} msg</span>
        </li>
        <li>
          <span class="label">Connections</span>
          <span class="value" data-testid="connections">
            {count(totals.publishers)} pub · {count(totals.consumers)} sub
          </span>
        </li>
        <li>
          <span class="label" title="Counted since the broker started">Dead-lettered since start</span>
          <span class="value">{count(totals.gaveUp)} msg</span>
        </li>
        <li>
          <span class="label">Uptime</span>
          <span class="value">{status ? millis(status.uptime_ms) : "–"}</span>
        </li>
      </ul>
      <div class="charts">
        <Chart
          title="Messages per second"
          t={history.t}
          format={(v) => rate(v)}
          series={[
            { label: "in", color: "#1f6fb2", values: history.inRate },
            { label: "out", color: "#2e9e5b", values: history.outRate },
          ]}
        />
        <Chart title="Backlog" t={history.t} format={(v) => `${count(v)} msg`} series={[{ label: "backlog", color: "#c4622d", values: history.backlog }]} />
      </div>
      <NodePanel />
      <h2>Topics by backlog</h2>
      {topics.length === 0 ? (
        <Empty>
          No topics yet. Create one on the <a href={href.topics()}>Topics</a> page, or publish and let the broker create it:{" "}
          <code>curl -X POST {location.host}/topics/orders/messages --data-binary hello</code>
        </Empty>
      ) : (
        <Table label="Topics by backlog">
          <thead>
            <tr>
              <th scope="col">Topic</th>
              <th scope="col" class="num">
                Backlog
              </th>
              <th scope="col" class="num">
                Retained
              </th>
              <th scope="col" class="num">
                In
              </th>
              <th scope="col" class="num">
                Out
              </th>
              <th scope="col" class="num">
                Consumers
              </th>
            </tr>
          </thead>
          <tbody>
            {busiest.map(({ t, backlog }) => (
              <tr key={t.name}>
                <td>
                  <a href={href.topic(t.name)}>{t.name}</a>
                </td>
                <td class="num">{count(backlog)} msg</td>
                <td class="num">{count(t.depth)} msg</td>
                <td class="num">{rate(rates.get(t.name)?.in)}</td>
                <td class="num">{rate(rates.get(t.name)?.out)}</td>
                <td class="num">{count(t.subscribers)}</td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
    </section>
  );
}
