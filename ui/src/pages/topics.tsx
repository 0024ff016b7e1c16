import { useEffect, useState } from "preact/hooks";
import { ApiError, del, get, post, seg, Topic } from "../api";
import { Confirm, Empty, ErrorBox, Notice, Table, useLoad } from "../components";
import { bytes, count, plural, rate } from "../format";
import { refresh, useLive } from "../live";
import { PublishForm } from "../publish";
import { can, canSomewhere, useSession } from "../access";
import { href } from "../router";

function CreateTopicForm({ onCreated }: { onCreated: (name: string) => void }) {
  const [name, setName] = useState("");
  const [partitions, setPartitions] = useState("1");
  const [storage, setStorage] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setBusy(true);
    try {
      const request: Record<string, unknown> = { name: name.trim(), partitions: Number(partitions) };
      if (storage) request.storage = storage;
      const created = await post<Topic>("/topics", request);
      setName("");
      onCreated(created.name);
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  }
  return (
    <form class="panel" onSubmit={submit} aria-labelledby="create-title">
      <h2 id="create-title">Create a topic</h2>
      <div class="row">
        <label>
          Name
          <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} required autocomplete="off" placeholder="orders" />
        </label>
        <label>
          Partitions
          <input name="partitions" type="number" min={1} max={1024} value={partitions} onInput={(e) => setPartitions(e.currentTarget.value)} required />
        </label>
        <label>
          Storage
          <select name="storage" value={storage} onChange={(e) => setStorage(e.currentTarget.value)}>
            <option value="">the broker's default</option>
            <option value="disk">disk (durable)</option>
            <option value="memory">memory (transient)</option>
          </select>
        </label>
      </div>
      <div class="actions">
        <button type="submit" class="primary" disabled={busy}>
          Create
        </button>
      </div>
      <ErrorBox error={error} what="Not created" />
    </form>
  );
}

export function TopicsPage() {
  const live = useLive();
  const session = useSession();
  const listing = useLoad(() => get<{ topics: Topic[] }>("/topics"), []);
  const [deleting, setDeleting] = useState<Topic | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const stats = new Map((live.snapshot?.topics ?? []).map((t) => [t.name, t]));
  // Topics created or deleted elsewhere (a publisher's auto-create, another operator) show up
  // here as soon as the statistics name them.
  const liveNames = (live.snapshot?.topics ?? []).map((t) => t.name).sort().join("\n");
  useEffect(() => {
    if (live.snapshot) listing.reload();
  }, [liveNames]);
  const topics = listing.data?.topics ?? [];
  const names = new Set(topics.map((t) => t.name));

  async function remove(topic: Topic) {
    setDeleting(null);
    setError(null);
    try {
      await del(`/topics/${seg(topic.name)}`);
      setDone(`Deleted topic ${topic.name}.`);
      listing.reload();
      refresh();
    } catch (err) {
      setError(err as ApiError);
    }
  }

  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Topics
      </h1>
      <ErrorBox error={error} what="Not deleted" />
      {done ? <Notice>{done}</Notice> : null}
      {listing.error ? <ErrorBox error={listing.error} what="Cannot list the topics" /> : null}
      {listing.data && topics.length === 0 ? (
        <Empty>No topics yet: create one below, or publish a message to a new name (the broker creates topics on first use unless told not to).</Empty>
      ) : null}
      {topics.length ? (
        <Table label="Topics">
          <thead>
            <tr>
              <th scope="col">Topic</th>
              <th scope="col">Storage</th>
              <th scope="col" class="num">
                Partitions
              </th>
              <th scope="col" class="num">
                Retained
              </th>
              <th scope="col" class="num">
                Backlog
              </th>
              <th scope="col" class="num">
                In
              </th>
              <th scope="col" class="num">
                Out
              </th>
              <th scope="col" class="num">
                Subscriptions
              </th>
              <th scope="col" class="num">
                Dead letters
              </th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {topics.map((t) => {
              const s = stats.get(t.name);
              const backlog = s ? s.subscriptions.reduce((sum, x) => sum + x.backlog, 0) : undefined;
              const gaveUp = s ? s.subscriptions.reduce((sum, x) => sum + x.gave_up, 0) : 0;
              const dlq = `${t.name}.dlq`;
              const r = live.snapshot?.rates.get(t.name);
              return (
                <tr key={t.name} data-topic={t.name}>
                  <td>
                    <a href={href.topic(t.name)}>{t.name}</a>
                  </td>
                  <td>
                    {t.storage}
                    {t.storage === "disk" ? <span class="muted"> · fsync {t.fsync}</span> : null}
                  </td>
                  <td class="num">{t.partitions}</td>
                  <td class="num">
                    {count(s?.depth ?? t.messages)} msg
                    <div class="muted">{bytes(s?.depth_bytes ?? t.bytes)}</div>
                  </td>
                  <td class="num">{backlog === undefined ? "–" : `${count(backlog)} msg`}</td>
                  <td class="num">{rate(r?.in)}</td>
                  <td class="num">{rate(r?.out)}</td>
                  <td class="num">{t.subscriptions.length}</td>
                  <td class="num">
                    {names.has(dlq) || gaveUp > 0 ? <a href={href.deadLetters(t.name)}>{count(gaveUp)} msg</a> : count(gaveUp) + " msg"}
                  </td>
                  <td>
                    {can("manage", t.name, session) ? (
                      <button type="button" class="danger small" onClick={() => setDeleting(t)} aria-label={`Delete topic ${t.name}`}>
                        Delete
                      </button>
                    ) : null}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </Table>
      ) : null}
      <div class="columns">
        {canSomewhere("manage", session) ? (
          <CreateTopicForm
            onCreated={(name) => {
              setDone(`Created topic ${name}.`);
              listing.reload();
              refresh();
            }}
          />
        ) : null}
        {canSomewhere("publish", session) ? <PublishForm topics={topics.filter((t) => can("publish", t.name, session)).map((t) => t.name)} /> : null}
      </div>
      <Confirm
        open={deleting !== null}
        title={`Delete topic ${deleting?.name ?? ""}?`}
        action="Delete topic"
        onConfirm={() => deleting && remove(deleting)}
        onCancel={() => setDeleting(null)}
      >
        <p>
          Its retained messages ({plural(deleting?.messages ?? 0, "message")}) and its subscriptions ({plural(deleting?.subscriptions.length ?? 0, "subscription")}) go with it. This
          cannot be undone.
        </p>
      </Confirm>
    </section>
  );
}
