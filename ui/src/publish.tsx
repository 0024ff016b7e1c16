// A form that publishes one test message over the JSON API, with every field a message has.

import { useState } from "preact/hooks";
import { ApiError, post, PublishReply, seg } from "./api";
import { ErrorBox, Notice } from "./components";
import { refresh } from "./live";
import { href } from "./router";

/** Parses `name: value` lines; a line without a colon is refused rather than dropped. */
export function parseHeaders(text: string): Record<string, string> {
  const headers: Record<string, string> = {};
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const colon = line.indexOf(":");
    if (colon <= 0) throw new ApiError(0, "invalid_argument", `header line ${i + 1} is not "name: value"`);
    headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  });
  return headers;
}

export function PublishForm({ topics, topic: fixedTopic, onPublished }: { topics?: string[]; topic?: string; onPublished?: () => void }) {
  const [topic, setTopic] = useState(fixedTopic ?? "");
  const [body, setBody] = useState("");
  const [asJson, setAsJson] = useState(false);
  const [key, setKey] = useState("");
  const [priority, setPriority] = useState("0");
  const [delay, setDelay] = useState("");
  const [headers, setHeaders] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [reply, setReply] = useState<{ topic: string; reply: PublishReply } | null>(null);
  const [busy, setBusy] = useState(false);

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setReply(null);
    const target = (fixedTopic ?? topic).trim();
    try {
      if (!target) throw new ApiError(0, "invalid_argument", "name the topic to publish to");
      const message: Record<string, unknown> = { body };
      if (asJson) {
        try {
          message.body = JSON.parse(body);
        } catch (parseError) {
          throw new ApiError(0, "invalid_argument", `the body is not JSON: ${(parseError as Error).message}`);
        }
      }
      if (key) message.key = key;
      if (priority !== "0") message.priority = Number(priority);
      if (delay.trim()) {
        const ms = Number(delay);
        if (!Number.isInteger(ms) || ms < 0) throw new ApiError(0, "invalid_argument", "the delay is a whole number of milliseconds");
        message.delay_ms = ms;
      }
      const parsedHeaders = parseHeaders(headers);
      if (Object.keys(parsedHeaders).length) message.headers = parsedHeaders;
      setBusy(true);
      const result = await post<PublishReply>(`/topics/${seg(target)}/messages`, message);
      setReply({ topic: target, reply: result });
      refresh();
      onPublished?.();
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  }

  const id = (name: string) => `publish-${name}`;
  return (
    <form class="panel" onSubmit={submit} aria-labelledby={id("title")}>
      <h2 id={id("title")}>Publish a test message</h2>
      {fixedTopic ? null : (
        <label>
          Topic
          <input id={id("topic")} name="topic" list={id("topics")} value={topic} onInput={(e) => setTopic(e.currentTarget.value)} required autocomplete="off" />
          <datalist id={id("topics")}>
            {(topics ?? []).map((t) => (
              <option key={t} value={t} />
            ))}
          </datalist>
        </label>
      )}
      <label>
        Body
        <textarea name="body" rows={3} value={body} onInput={(e) => setBody(e.currentTarget.value)} />
      </label>
      <label class="inline">
        <input type="checkbox" name="json" checked={asJson} onChange={(e) => setAsJson(e.currentTarget.checked)} /> The body is JSON
      </label>
      <div class="row">
        <label>
          Key
          <input name="key" value={key} onInput={(e) => setKey(e.currentTarget.value)} autocomplete="off" />
        </label>
        <label>
          Priority
          <select name="priority" value={priority} onChange={(e) => setPriority(e.currentTarget.value)}>
            {[0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map((p) => (
              <option key={p} value={String(p)}>
                {p}
                {p === 0 ? " (lowest)" : p === 9 ? " (highest)" : ""}
              </option>
            ))}
          </select>
        </label>
        <label>
          Delay (ms)
          <input name="delay" inputMode="numeric" value={delay} onInput={(e) => setDelay(e.currentTarget.value)} placeholder="none" />
        </label>
      </div>
      <label>
        <span>
          Headers, one <code>name: value</code> per line
        </span>
        <textarea name="headers" rows={2} value={headers} onInput={(e) => setHeaders(e.currentTarget.value)} />
      </label>
      <div class="actions">
        <button type="submit" class="primary" disabled={busy}>
          Publish
        </button>
      </div>
      <ErrorBox error={error} what="Not published" />
      {reply ? (
        <Notice>
          Published to {reply.topic} as{" "}
          {reply.reply.ids.map((i) => (
            <a key={i} class="mono" href={href.lookup(reply.topic, i)}>
              {i}
            </a>
          ))}{" "}
          ({reply.reply.durability}).
        </Notice>
      ) : null}
    </form>
  );
}
