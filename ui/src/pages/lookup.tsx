import { useState } from "preact/hooks";
import { get, MessageStatus, seg } from "../api";
import { ErrorBox, MessagePreview, Table, useLoad } from "../components";
import { bytes, time } from "../format";
import { useLive } from "../live";
import { href } from "../router";

function Result({ topic, id }: { topic: string; id: string }) {
  const status = useLoad(() => get<MessageStatus>(`/topics/${seg(topic)}/messages/${seg(id)}`), [topic, id]);
  if (status.error) return <ErrorBox error={status.error} what={`Message ${id} of ${topic}`} />;
  const s = status.data;
  if (!s) return <p class="muted">Looking up {id}…</p>;
  return (
    <div data-testid="lookup-result">
      <h2>
        Message <span class="mono">{s.id}</span> of <a href={href.topic(topic)}>{topic}</a>
      </h2>
      <dl class="facts">
        <div>
          <dt>Partition, offset</dt>
          <dd>
            {s.partition}, {s.offset}
          </dd>
        </div>
        <div>
          <dt>Published</dt>
          <dd>{time(s.published_ms)}</dd>
        </div>
        <div>
          <dt>Body size</dt>
          <dd>{bytes(s.body_bytes)}</dd>
        </div>
      </dl>
      {s.subscriptions.length === 0 ? (
        <p class="muted">The topic has no subscriptions: nothing has received this message.</p>
      ) : (
        <Table label="State per subscription">
          <thead>
            <tr>
              <th scope="col">Subscription</th>
              <th scope="col">State</th>
              <th scope="col" class="num">
                Attempts
              </th>
              <th scope="col">First delivered</th>
              <th scope="col">Settled</th>
              <th scope="col">Due or deadline</th>
              <th scope="col">Result or reason</th>
            </tr>
          </thead>
          <tbody>
            {s.subscriptions.map((e) => (
              <tr key={e.subscription} data-subscription={e.subscription}>
                <td>
                  <a href={href.subscription(topic, e.subscription)}>{e.subscription}</a>
                </td>
                <td>
                  <span class={`state ${e.state}`}>{e.state.replace("_", " ")}</span>
                </td>
                <td class="num">{e.attempts}</td>
                <td>{time(e.first_delivered_ms)}</td>
                <td>{time(e.settled_ms)}</td>
                <td>{time(e.due_ms)}</td>
                <td>
                  {e.result ?? (e.result_base64 ? `base64 ${e.result_base64}` : null)}
                  {e.reason ? <span class="reason">{e.reason}</span> : null}
                  {e.dead_letter ? (
                    <>
                      {" "}
                      → <a href={href.deadLetters(topic)}>dead letter {e.dead_letter.id}</a>
                    </>
                  ) : null}
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      <h3>Content</h3>
      <MessagePreview topic={topic} id={id} />
    </div>
  );
}

export function LookupPage({ topic, id }: { topic?: string; id?: string }) {
  const live = useLive();
  const [topicInput, setTopic] = useState(topic ?? "");
  const [idInput, setId] = useState(id ?? "");
  const topics = (live.snapshot?.topics ?? []).map((t) => t.name);
  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Message lookup
      </h1>
      <form
        class="panel"
        role="search"
        onSubmit={(e) => {
          e.preventDefault();
          location.hash = href.lookup(topicInput.trim(), idInput.trim());
        }}
      >
        <div class="row">
          <label>
            Topic
            <input name="topic" list="lookup-topics" value={topicInput} onInput={(e) => setTopic(e.currentTarget.value)} required autocomplete="off" />
            <datalist id="lookup-topics">
              {topics.map((t) => (
                <option key={t} value={t} />
              ))}
            </datalist>
          </label>
          <label>
            Message id
            <input name="id" value={idInput} onInput={(e) => setId(e.currentTarget.value)} required placeholder="0-17" autocomplete="off" />
          </label>
        </div>
        <p class="muted">A message id is &lt;partition&gt;-&lt;offset&gt;, as every publish returns it.</p>
        <div class="actions">
          <button type="submit" class="primary">
            Find
          </button>
        </div>
      </form>
      {topic && id ? <Result topic={topic} id={id} /> : null}
    </section>
  );
}
