import { useState } from "preact/hooks";
import { ApiError, Entry, get, MessagePage, post, RequeueReply, seg, Topic } from "../api";
import { Confirm, Empty, ErrorBox, Notice, useLoad } from "../components";
import { count, plural } from "../format";
import { refresh, useLive } from "../live";
import { href } from "../router";
import { can, useSession } from "../access";
import { MessageRow, PAGE_SIZE } from "./subscription";

/** The dead-letter topic a topic's subscriptions use unless told otherwise. */
export const deadLetterTopic = (topic: string) => `${topic}.dlq`;

type Requeue = (selection: Record<string, unknown>, what: string) => Promise<RequeueReply | null>;

function SubscriptionDeadLetters({ topic, subscription, requeue }: { topic: string; subscription: string; requeue: Requeue }) {
  const mayRequeue = can("manage", topic, useSession());
  const [pages, setPages] = useState<string[]>([""]);
  const page = pages[pages.length - 1];
  const listing = useLoad(
    () => get<MessagePage>(`/topics/${seg(topic)}/subscriptions/${seg(subscription)}/messages?state=dead_lettered&limit=${PAGE_SIZE}${page ? `&page=${seg(page)}` : ""}`),
    [topic, subscription, page],
  );
  const [requeued, setRequeued] = useState<Map<string, RequeueReply>>(new Map());
  const messages = listing.data?.messages ?? [];
  if (listing.data && messages.length === 0 && pages.length === 1) return null;
  async function one(entry: Entry) {
    if (!entry.dead_letter) return;
    const reply = await requeue({ id: entry.dead_letter.id }, `dead letter ${entry.dead_letter.id}`);
    if (reply) setRequeued(new Map(requeued).set(entry.id, reply));
    // The listing again: it names the copy now.
    listing.reload();
  }
  return (
    <section aria-labelledby={`dl-${subscription}`}>
      <h2 id={`dl-${subscription}`}>
        Subscription <a href={href.subscription(topic, subscription, "dead_lettered")}>{subscription}</a>
      </h2>
      <ErrorBox error={listing.error} what="Cannot list the dead letters" />
      <ol class="messages" aria-label={`Dead letters of ${subscription}`}>
        {messages.map((m) => {
          const done = requeued.get(m.id);
          const copy = m.dead_letter?.requeued_as;
          return (
            <MessageRow
              key={m.id}
              topic={topic}
              entry={m}
              preview={m.dead_letter ? { topic: deadLetterTopic(topic), id: m.dead_letter.id } : null}
              actions={
                <>
                  {m.dead_letter ? <span class="muted">dead letter {m.dead_letter.id}</span> : null}
                  {copy ? (
                    <span class="requeued" data-testid="requeued-as">
                      requeued as <a href={href.lookup(topic, copy)}>{copy}</a>
                    </span>
                  ) : null}
                  {!mayRequeue || !m.dead_letter || copy ? null : (
                    <button type="button" class="small" onClick={() => one(m)} disabled={done !== undefined} aria-label={`Requeue ${m.id}`}>
                      Requeue
                    </button>
                  )}
                  {done && !copy ? <span role="status">{done.requeued ? "Requeued." : "Already requeued before: skipped."}</span> : null}
                </>
              }
            />
          );
        })}
      </ol>
      {pages.length > 1 || listing.data?.next_page ? (
        <div class="pager">
          <button type="button" disabled={pages.length === 1} onClick={() => setPages(pages.slice(0, -1))}>
            Previous page
          </button>
          <button type="button" disabled={!listing.data?.next_page} onClick={() => listing.data?.next_page && setPages([...pages, listing.data.next_page])}>
            Next page
          </button>
        </div>
      ) : null}
    </section>
  );
}

function TopicDeadLetters({ topic }: { topic: string }) {
  const mayRequeue = can("manage", topic, useSession());
  const dlq = deadLetterTopic(topic);
  const info = useLoad(() => get<Topic>(`/topics/${seg(topic)}`), [topic]);
  // From the listing rather than by name: a topic that never had a dead letter has no
  // dead-letter topic, and that is no error.
  const dlqInfo = useLoad(() => get<{ topics: Topic[] }>("/topics").then((list) => list.topics.find((t) => t.name === dlq) ?? null), [dlq]);
  const [error, setError] = useState<ApiError | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const [confirmAll, setConfirmAll] = useState(false);
  const [confirmPurge, setConfirmPurge] = useState(false);
  const [range, setRange] = useState({ partition: "0", first: "", last: "" });
  const [generation, setGeneration] = useState(0);

  const requeue: Requeue = async (selection, what) => {
    setError(null);
    setNotice(null);
    try {
      const reply = await post<RequeueReply>(`/topics/${seg(dlq)}/requeue`, selection);
      setNotice(`Requeued ${what}: ${count(reply.requeued)} sent back to their subscription, ${count(reply.skipped)} skipped (requeued before, or not dead letters).`);
      refresh();
      dlqInfo.reload();
      return reply;
    } catch (err) {
      setError(err as ApiError);
      return null;
    }
  };

  async function purge() {
    setConfirmPurge(false);
    setError(null);
    setNotice(null);
    try {
      const reply = await post<{ purged: number }>(`/topics/${seg(dlq)}/purge`, {});
      setNotice(`Purged ${dlq}: ${plural(reply.purged, "dead letter")} dropped.`);
      refresh();
      dlqInfo.reload();
      setGeneration(generation + 1);
    } catch (err) {
      setError(err as ApiError);
    }
  }

  const subscriptions = info.data?.subscriptions ?? [];
  return (
    <>
      <p class="crumbs">
        <a href={href.deadLetters()}>Dead letters</a> / <a href={href.topic(topic)}>{topic}</a>
      </p>
      <h1 id="view-title" tabIndex={-1}>
        Dead letters of {topic}
      </h1>
      <ErrorBox error={info.error} what="Cannot read the topic" />
      <ErrorBox error={dlqInfo.error} what="Cannot read the dead-letter topic" />
      {dlqInfo.data === null ? (
        <Empty>
          Nothing has died here: the dead-letter topic <span class="mono">{dlq}</span> is created when the first message of {topic} gives up (after its subscription's
          max attempts, or a consumer's dead-letter nack).
        </Empty>
      ) : null}
      {dlqInfo.data ? (
        <>
          <p>
            The dead-letter topic <a href={href.topic(dlq)}>{dlq}</a> retains {plural(dlqInfo.data.messages, "message")}. Requeueing publishes a dead letter again to the
            partition it died in, for the subscription it died in only, at most once.
          </p>
          <div class="panel" hidden={!mayRequeue}>
            <h2>Requeue several</h2>
            <form
              class="row"
              onSubmit={(e) => {
                e.preventDefault();
                const first = Number(range.first);
                const last = range.last === "" ? first : Number(range.last);
                requeue({ partition: Number(range.partition), first, last }, `offsets ${first} to ${last} of partition ${range.partition}`).then(() =>
                  setGeneration(generation + 1),
                );
              }}
            >
              <label>
                Partition of {dlq}
                <input name="partition" type="number" min={0} value={range.partition} onInput={(e) => setRange({ ...range, partition: e.currentTarget.value })} required />
              </label>
              <label>
                First offset
                <input name="first" type="number" min={0} value={range.first} onInput={(e) => setRange({ ...range, first: e.currentTarget.value })} required />
              </label>
              <label>
                Last offset
                <input name="last" type="number" min={0} value={range.last} onInput={(e) => setRange({ ...range, last: e.currentTarget.value })} placeholder="= first" />
              </label>
              <div class="actions">
                <button type="submit">Requeue range</button>
                <button type="button" class="danger" onClick={() => setConfirmAll(true)}>
                  Requeue all
                </button>
                <button type="button" class="danger" onClick={() => setConfirmPurge(true)}>
                  Purge dead letters
                </button>
              </div>
            </form>
          </div>
        </>
      ) : null}
      <ErrorBox error={error} what="Not requeued" />
      {notice ? <Notice>{notice}</Notice> : null}
      {dlqInfo.data
        ? subscriptions.map((s) => <SubscriptionDeadLetters key={`${s}/${generation}`} topic={topic} subscription={s} requeue={requeue} />)
        : null}
      <Confirm
        open={confirmAll}
        title={`Requeue every dead letter of ${dlq}?`}
        action="Requeue all"
        onCancel={() => setConfirmAll(false)}
        onConfirm={() => {
          setConfirmAll(false);
          requeue({ all: true }, "all").then(() => setGeneration(generation + 1));
        }}
      >
        <p>Each of the retained dead letters ({plural(dlqInfo.data?.messages ?? 0, "message")}) that was not requeued before goes back to its subscription, to be delivered again.</p>
      </Confirm>
      <Confirm open={confirmPurge} title={`Purge every dead letter of ${dlq}?`} action="Purge dead letters" onCancel={() => setConfirmPurge(false)} onConfirm={purge}>
        <p>The {plural(dlqInfo.data?.messages ?? 0, "message")} the dead-letter topic retains are dropped and cannot be requeued any more. This cannot be undone.</p>
      </Confirm>
    </>
  );
}

export function DeadLettersPage({ topic }: { topic?: string }) {
  const live = useLive();
  if (topic) {
    return (
      <section>
        <TopicDeadLetters topic={topic} />
      </section>
    );
  }
  const topics = live.snapshot?.topics ?? [];
  const names = new Set(topics.map((t) => t.name));
  const sources = topics
    .filter((t) => !t.name.endsWith(".dlq"))
    .map((t) => ({ name: t.name, gaveUp: t.subscriptions.reduce((s, x) => s + x.gave_up, 0), dlq: topics.find((d) => d.name === deadLetterTopic(t.name)) }))
    .filter((t) => t.gaveUp > 0 || t.dlq);
  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Dead letters
      </h1>
      <ErrorBox error={live.error} what="Cannot read the broker's statistics" />
      {live.snapshot && sources.length === 0 ? (
        <Empty>No dead letters anywhere. A message lands here once it gives up (its subscription's max attempts) or a consumer dead-letters it with a reason.</Empty>
      ) : null}
      <ul class="cards">
        {sources.map((s) => (
          <li key={s.name}>
            <a href={href.deadLetters(s.name)}>{s.name}</a>
            <span>
              {count(s.dlq?.depth ?? 0)} retained in {names.has(deadLetterTopic(s.name)) ? deadLetterTopic(s.name) : "no dead-letter topic yet"}; {count(s.gaveUp)} gave up
              since the broker started
            </span>
          </li>
        ))}
      </ul>
    </section>
  );
}
