import { useState } from "preact/hooks";
import { Entry, get, MessagePage, seg } from "../api";
import { Empty, ErrorBox, MessagePreview, useLoad } from "../components";
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
          <li key={m.id} class="message" data-id={m.id}>
            <h3>
              <a class="mono" href={href.lookup(topic, m.id)}>
                {m.id}
              </a>
            </h3>
            <EntryFacts entry={m} />
            <MessagePreview topic={topic} id={m.id} />
          </li>
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
