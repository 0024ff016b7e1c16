import { useEffect, useState } from "preact/hooks";
import { ApiError, del, get, MessagePage, post, seg, SubscriptionStats, Topic } from "../api";
import { Confirm, Empty, ErrorBox, Notice, Table, useLoad } from "../components";
import { bytes, count, micros, millis, plural, rate } from "../format";
import { Chart, Series } from "../chart";
import { perSecond, refresh, useLive } from "../live";
import { PublishForm } from "../publish";
import { can, useSession } from "../access";
import { href } from "../router";

/**
 * The age of the next message in line per subscription: the first pending one (partition, then
 * offset order), read again on every statistics tick.
 */
function useHeadAges(topic: string, subscriptions: SubscriptionStats[], tick: number | undefined) {
  const [ages, setAges] = useState<Map<string, number | null>>(new Map());
  const names = subscriptions.filter((s) => s.backlog > 0).map((s) => s.name).join("\n");
  useEffect(() => {
    let live = true;
    const wanted = names ? names.split("\n") : [];
    Promise.all(
      wanted.map((name) =>
        get<MessagePage>(`/topics/${seg(topic)}/subscriptions/${seg(name)}/messages?state=pending&limit=1`).then(
          (page) => [name, page.messages[0]?.published_ms ?? null] as const,
          () => [name, null] as const,
        ),
      ),
    ).then((pairs) => {
      if (!live) return;
      const now = Date.now();
      setAges(new Map(pairs.map(([n, published]) => [n, published === null ? null : Math.max(0, now - published)])));
    });
    return () => {
      live = false;
    };
  }, [topic, names, tick]);
  return ages;
}

function Percentiles({ l }: { l: SubscriptionStats["deliver_latency_us"] }) {
  if (!l.count) return <span class="muted">none yet</span>;
  return (
    <span class="nowrap">
      p50 {micros(l.p50)} · p99 {micros(l.p99)}
      <span class="muted"> · max {micros(l.max)}</span>
    </span>
  );
}

interface HistorySample {
  t_ms: number;
  messages_in: number;
  messages_out: number;
  depth: number;
  subscriptions: Record<string, { messages_out: number; acked: number; redelivered: number; backlog: number; in_flight: number; gave_up: number }>;
}

const PALETTE = ["#1f6fb2", "#2e9e5b", "#c4622d", "#7a4fb0", "#b03a5b", "#3a8fa0", "#8a7a22", "#55606b"];

/**
 * The topic's last ten minutes as the broker recorded them (`GET /topics/{topic}/history`, a
 * sample every 5 s): published and delivered per second, acks and redeliveries per second, and
 * each subscription's backlog. Read again every 5 s while the page polls; a reload starts from
 * the same history.
 */
function TopicCharts({ topic, tick }: { topic: string; tick: number }) {
  const history = useLoad(() => get<{ samples: HistorySample[] }>(`/topics/${seg(topic)}/history`), [topic, tick]);
  const samples = history.data?.samples ?? [];
  if (samples.length === 0) return null;
  const t = samples.map((s) => s.t_ms / 1000);
  // Per second between a sample and the one before; none for the first, or across a restart.
  const rates = (pick: (s: HistorySample) => number | undefined) =>
    samples.map((s, i) => {
      const b = samples[i - 1];
      const now = pick(s);
      const before = b ? pick(b) : undefined;
      if (!b || now === undefined || before === undefined) return null;
      return perSecond(now, before, (s.t_ms - b.t_ms) / 1000);
    });
  const names = [...new Set(samples.flatMap((s) => Object.keys(s.subscriptions)))].sort();
  const color = (i: number) => PALETTE[i % PALETTE.length]!;
  const traffic: Series[] = [
    { label: "published", color: color(0), values: rates((s) => s.messages_in) },
    ...names.map((n, i) => ({ label: `delivered ${n}`, color: color(i + 1), values: rates((s) => s.subscriptions[n]?.messages_out) })),
  ];
  const settled: Series[] = names.flatMap((n, i) => [
    { label: `acked ${n}`, color: color(i + 1), values: rates((s) => s.subscriptions[n]?.acked) },
    { label: `redelivered ${n}`, color: color(i + 4), values: rates((s) => s.subscriptions[n]?.redelivered) },
  ]);
  const backlog: Series[] = names.map((n, i) => ({ label: n, color: color(i + 1), values: samples.map((s) => s.subscriptions[n]?.backlog ?? null) }));
  const key = names.join("\u0000");
  return (
    <div class="charts" data-testid="topic-charts">
      <Chart key={`traffic ${key}`} title="Published and delivered per second, last 10 min" t={t} format={(v) => rate(v)} series={traffic} />
      {names.length ? <Chart key={`settled ${key}`} title="Acked and redelivered per second" t={t} format={(v) => rate(v)} series={settled} /> : null}
      {names.length ? <Chart key={`backlog ${key}`} title="Backlog by subscription" t={t} format={(v) => `${count(v)} msg`} series={backlog} /> : null}
    </div>
  );
}

export function TopicPage({ topic }: { topic: string }) {
  const session = useSession();
  const live = useLive();
  const info = useLoad(() => get<Topic>(`/topics/${seg(topic)}`), [topic]);
  const stats = live.snapshot?.topics.find((t) => t.name === topic);
  const subscriptions = stats?.subscriptions ?? [];
  const ages = useHeadAges(topic, subscriptions, live.snapshot?.at);
  const faults = live.snapshot?.status?.faults.filter((f) => f.topic === topic) ?? [];
  const [deleting, setDeleting] = useState<string | null>(null);
  const [purging, setPurging] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const t = info.data;
  const r = live.snapshot?.rates.get(topic);

  async function purge() {
    setPurging(false);
    setError(null);
    try {
      const reply = await post<{ purged: number }>(`/topics/${seg(topic)}/purge`, {});
      setDone(`Purged topic ${topic}: ${plural(reply.purged, "message")} dropped.`);
      refresh();
    } catch (err) {
      setError(err as ApiError);
    }
  }

  async function setPausedState(name: string, paused: boolean) {
    setError(null);
    try {
      await post<void>(`/topics/${seg(topic)}/subscriptions/${seg(name)}/${paused ? "pause" : "resume"}`, {});
      setDone(`${paused ? "Paused" : "Resumed"} subscription ${name}.`);
      refresh();
    } catch (err) {
      setError(err as ApiError);
    }
  }

  async function removeSubscription(name: string) {
    setDeleting(null);
    setError(null);
    try {
      await del(`/topics/${seg(topic)}/subscriptions/${seg(name)}`);
      setDone(`Deleted subscription ${name}.`);
      refresh();
    } catch (err) {
      setError(err as ApiError);
    }
  }

  return (
    <section>
      <p class="crumbs">
        <a href={href.topics()}>Topics</a> /
      </p>
      <h1 id="view-title" tabIndex={-1}>
        {topic}
      </h1>
      {info.error ? <ErrorBox error={info.error} what="Cannot read the topic" /> : null}
      {t ? (
        <dl class="facts wide">
          <div>
            <dt>Storage</dt>
            <dd>
              {t.storage}
              {t.storage === "disk" ? `, fsync ${t.fsync}, retention ${t.retention_ms === null ? "none" : millis(t.retention_ms)}` : `, ${t.overflow} when full`}
            </dd>
          </div>
          <div>
            <dt>Limits</dt>
            <dd>
              {t.max_messages === null ? "no message limit" : `${count(t.max_messages)} msg`}, {t.max_bytes === null ? "no byte limit" : bytes(t.max_bytes)}
            </dd>
          </div>
          <div>
            <dt>Retained</dt>
            <dd>
              {count(stats?.depth ?? t.messages)} msg, {bytes(stats?.depth_bytes ?? t.bytes)}
            </dd>
          </div>
          <div>
            <dt>Rates</dt>
            <dd>
              in {rate(r?.in)}, out {rate(r?.out)}
            </dd>
          </div>
          <div>
            <dt>Totals</dt>
            <dd>
              {count(stats?.messages_in)} msg in ({bytes(stats?.bytes_in)}), {count(stats?.messages_out)} msg out ({bytes(stats?.bytes_out)})
              {stats?.dropped ? `, ${count(stats.dropped)} dropped by drop-oldest` : ""}
            </dd>
          </div>
          <div>
            <dt>Purge</dt>
            <dd>
              {can("purge", topic, session) ? (
                <button type="button" class="danger small" onClick={() => setPurging(true)}>
                  Purge all messages
                </button>
              ) : (
                <span class="muted">needs purge</span>
              )}
            </dd>
          </div>
          <div>
            <dt>Connections</dt>
            <dd>
              {plural(stats?.publishers ?? 0, "publisher")}, {plural(stats?.subscribers ?? 0, "consumer")}
            </dd>
          </div>
        </dl>
      ) : null}
      {t ? (
        <>
          <h2>Partitions</h2>
          <ul class="partitions" aria-label="Partitions">
            {Array.from({ length: t.partitions }, (_, p) => {
              const fault = faults.find((f) => f.partition === p);
              return (
                <li key={p} class={fault ? "bad" : "good"}>
                  Partition <span class="mono">{p}</span>: {fault ? `refuses writes (${fault.reason})` : "takes writes"}
                </li>
              );
            })}
          </ul>
        </>
      ) : null}
      {can("inspect", topic, session) ? <TopicCharts topic={topic} tick={Math.floor((live.snapshot?.at ?? 0) / 5000)} /> : null}
      <h2>Subscriptions</h2>
      <ErrorBox error={error} what="Not done" />
      {done ? <Notice>{done}</Notice> : null}
      {stats && subscriptions.length === 0 ? (
        <Empty>
          No subscriptions yet. A consumer creates one when it subscribes, e.g. <code>ferrymq sub {topic} --subscription workers</code>, or over HTTP with{" "}
          <code>POST /topics/{topic}/subscriptions/workers/poll</code>.
        </Empty>
      ) : null}
      {subscriptions.length ? (
        <Table label="Subscriptions">
          <thead>
            <tr>
              <th scope="col">Subscription</th>
              <th scope="col" class="num">
                Consumers
              </th>
              <th scope="col" class="num">
                Backlog
              </th>
              <th scope="col" class="num" title="Age of the next message in line (first pending, partition then offset order)">
                Oldest waiting
              </th>
              <th scope="col" class="num">
                In flight
              </th>
              <th scope="col" class="num" title="Counted since the broker started">
                Acked
              </th>
              <th scope="col" class="num" title="Counted since the broker started">
                Redelivered
              </th>
              <th scope="col" class="num" title="Counted since the broker started">
                Gave up
              </th>
              <th scope="col" title="Percentiles over every message since the broker started">
                Publish → deliver, since start
              </th>
              <th scope="col" title="Percentiles over every message since the broker started">
                Publish → ack, since start
              </th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {subscriptions.map((s) => (
              <tr key={s.name} data-subscription={s.name}>
                <td>
                  <a href={href.subscription(topic, s.name)}>{s.name}</a>
                  {s.ephemeral ? <span class="muted"> (ephemeral)</span> : null}
                  {s.paused ? <span class="badge paused"> paused</span> : null}
                </td>
                <td class="num">{count(s.consumers)}</td>
                <td class="num">{count(s.backlog)} msg</td>
                <td class="num">{s.backlog === 0 ? "–" : ages.get(s.name) === undefined || ages.get(s.name) === null ? "…" : millis(ages.get(s.name)!)}</td>
                <td class="num">{count(s.in_flight)} msg</td>
                <td class="num">{count(s.acked)} msg</td>
                <td class="num">{count(s.redelivered)} msg</td>
                <td class="num">{s.gave_up ? <a href={href.deadLetters(topic)}>{count(s.gave_up)} msg</a> : "0 msg"}</td>
                <td>
                  <Percentiles l={s.deliver_latency_us} />
                </td>
                <td>
                  <Percentiles l={s.ack_latency_us} />
                </td>
                <td class="nowrap">
                  {!can("pause", topic, session) ? null : (
                    <button type="button" class="small" onClick={() => setPausedState(s.name, !s.paused)} aria-label={`${s.paused ? "Resume" : "Pause"} subscription ${s.name}`}>
                      {s.paused ? "Resume" : "Pause"}
                    </button>
                  )}{" "}
                  {s.ephemeral || !can("manage", topic, session) ? null : (
                    <button type="button" class="danger small" onClick={() => setDeleting(s.name)} aria-label={`Delete subscription ${s.name}`}>
                      Delete
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      ) : null}
      <p>
        <a href={href.deadLetters(topic)}>Dead letters of {topic}</a> · <a href={href.lookup(topic)}>Find a message of {topic} by id</a>
      </p>
      {t && can("publish", topic, session) ? <PublishForm topic={topic} /> : null}
      <Confirm open={deleting !== null} title={`Delete subscription ${deleting ?? ""}?`} action="Delete subscription" onConfirm={() => deleting && removeSubscription(deleting)} onCancel={() => setDeleting(null)}>
        <p>Its position and its record of acks go with it; a consumer that subscribes again under this name starts afresh. Subscriptions with consumers attached cannot be deleted.</p>
      </Confirm>
      <Confirm open={purging} title={`Purge topic ${topic}?`} action="Purge topic" onConfirm={purge} onCancel={() => setPurging(false)}>
        <p>Every message the topic retains is dropped, for every subscription; in-flight messages leave flight. Consumers stay attached and get what is published next. This cannot be undone.</p>
      </Confirm>
    </section>
  );
}
