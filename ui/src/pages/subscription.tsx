import { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { Entry, get, MessageContent, MessagePage, seg } from "../api";
import { bodyPreview, Empty, ErrorBox, MessagePreview, useLoad } from "../components";
import { time } from "../format";
import { href, ListState } from "../router";

export const PAGE_SIZE = 20;

const tabs: { state: ListState; label: string; empty: string }[] = [
  { state: "pending", label: "Pending", empty: "Nothing is waiting: every message has been delivered. New messages show up here until a consumer takes them." },
  { state: "in_flight", label: "In flight", empty: "Nothing is in flight: no consumer holds an unacked message of this subscription." },
  { state: "acked", label: "Acked", empty: "No acked message is remembered yet (the broker keeps the latest per partition, with their results)." },
  { state: "dead_lettered", label: "Dead-lettered", empty: "No message of this subscription was dead-lettered." },
];

export function EntryFacts({ entry }: { entry: Entry }) {
  return (
    <dl class="facts">
      <div>
        <dt>State</dt>
        <dd>
          <span class={`state ${entry.state}`}>{entry.state.replace("_", " ")}</span>
        </dd>
      </div>
      <div>
        <dt>Attempts</dt>
        <dd>{entry.attempts}</dd>
      </div>
      <div>
        <dt>Published</dt>
        <dd>{time(entry.published_ms)}</dd>
      </div>
      <div>
        <dt>First delivered</dt>
        <dd>{time(entry.first_delivered_ms)}</dd>
      </div>
      {entry.settled_ms ? (
        <>
          <div>
            <dt>{entry.state === "dead_lettered" ? "Dead-lettered" : "Settled"}</dt>
            <dd>{time(entry.settled_ms)}</dd>
          </div>
        </>
      ) : null}
      {entry.due_ms ? (
        <>
          <div>
            <dt>{entry.state === "in_flight" ? "Ack deadline" : "Due"}</dt>
            <dd>{time(entry.due_ms)}</dd>
          </div>
        </>
      ) : null}
      {entry.result !== undefined || entry.result_base64 !== undefined ? (
        <>
          <div>
            <dt>Result</dt>
            <dd class="mono">{entry.result ?? `base64 ${entry.result_base64}`}</dd>
          </div>
        </>
      ) : null}
      {entry.reason ? (
        <>
          <div>
            <dt>Reason</dt>
            <dd class="reason">{entry.reason}</dd>
          </div>
        </>
      ) : null}
    </dl>
  );
}

/** The first line of a message's body preview, cut short: what a compact row shows. */
function BodySnippet({ topic, id }: { topic: string; id: string }) {
  const { data, error } = useLoad(() => get<MessageContent>(`/topics/${seg(topic)}/messages/${seg(id)}/content`), [topic, id]);
  if (error) return <span class="snippet muted">{error.code === "unknown_message" ? "no longer retained" : "unreadable"}</span>;
  if (!data) return <span class="snippet muted">…</span>;
  // The start of the body on one line (JSON folded, a hex dump's first row).
  const preview = bodyPreview(data);
  const line = preview.kind === "hex" ? (preview.text.split("\n")[0] ?? "") : preview.text.replace(/\s+/g, " ").trim();
  return <span class="snippet mono">{line.length > 80 ? `${line.slice(0, 80)}…` : line || "(empty body)"}</span>;
}

/**
 * One message of a listing as a compact row (id, state, attempts, published, the body's first
 * line) that opens to the whole message: its facts, headers and body. `preview` is where its
 * body is read (a dead letter's copy in the dead-letter topic); `actions` stay on the row.
 */
export function MessageRow({
  topic,
  entry,
  preview,
  actions,
}: {
  topic: string;
  entry: Entry;
  preview: { topic: string; id: string } | null;
  actions?: ComponentChildren;
}) {
  const [open, setOpen] = useState(false);
  return (
    <li class="message" data-id={entry.id}>
      <details onToggle={(e) => setOpen((e.currentTarget as HTMLDetailsElement).open)}>
        <summary>
          <a class="mono" href={href.lookup(topic, entry.id)}>
            {entry.id}
          </a>
          <span class={`state ${entry.state}`}>{entry.state.replace("_", " ")}</span>
          <span class="attempts">
            {entry.attempts} {entry.attempts === 1 ? "attempt" : "attempts"}
          </span>
          <span class="muted">{time(entry.published_ms)}</span>
          {preview ? <BodySnippet topic={preview.topic} id={preview.id} /> : <span class="snippet muted">on its way to the dead-letter topic</span>}
        </summary>
        <EntryFacts entry={entry} />
        {open && preview ? <MessagePreview topic={preview.topic} id={preview.id} /> : null}
      </details>
      {actions ? <div class="actions">{actions}</div> : null}
    </li>
  );
}

export function SubscriptionPage({ topic, subscription, state }: { topic: string; subscription: string; state: ListState }) {
  // Tokens of the pages before this one, to go back: the API pages forward only.
  const [pages, setPages] = useState<string[]>([""]);
  const page = pages[pages.length - 1];
  const listing = useLoad(
    () => get<MessagePage>(`/topics/${seg(topic)}/subscriptions/${seg(subscription)}/messages?state=${state}&limit=${PAGE_SIZE}${page ? `&page=${seg(page)}` : ""}`),
    [topic, subscription, state, page],
  );
  const tab = tabs.find((t) => t.state === state)!;
  const messages = listing.data?.messages ?? [];
  return (
    <section>
      <p class="crumbs">
        <a href={href.topics()}>Topics</a> / <a href={href.topic(topic)}>{topic}</a> /
      </p>
      <h1 id="view-title" tabIndex={-1}>
        {subscription}
      </h1>
      <nav class="tabs" aria-label="Message states">
        {tabs.map((t) => (
          <a key={t.state} href={href.subscription(topic, subscription, t.state)} aria-current={t.state === state ? "page" : undefined}>
            {t.label}
          </a>
        ))}
      </nav>
      <div class="toolbar">
        <button type="button" onClick={listing.reload}>
          Refresh
        </button>
        <span class="muted">
          Page {pages.length}
          {state === "acked" || state === "dead_lettered" ? ", newest first" : ", partition then offset order"}
        </span>
      </div>
      <ErrorBox error={listing.error} what="Cannot list the messages" />
      {listing.data && messages.length === 0 ? <Empty>{pages.length > 1 ? "No more messages." : tab.empty}</Empty> : null}
      <ol class="messages" aria-label={`${tab.label} messages`}>
        {messages.map((m) => (
          <MessageRow key={m.id} topic={topic} entry={m} preview={{ topic, id: m.id }} />
        ))}
      </ol>
      <div class="pager">
        <button type="button" disabled={pages.length === 1} onClick={() => setPages(pages.slice(0, -1))}>
          Previous page
        </button>
        <button type="button" disabled={!listing.data?.next_page} onClick={() => listing.data?.next_page && setPages([...pages, listing.data.next_page])}>
          Next page
        </button>
      </div>
    </section>
  );
}
