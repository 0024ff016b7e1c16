// Pieces every page uses: errors, empty states, confirmation, message previews, data loading.

import { ComponentChildren } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError, get, MessageContent, seg } from "./api";
import { bytes as formatBytes, time } from "./format";

export function ErrorBox({ error, what }: { error: ApiError | Error | null | undefined; what?: string }) {
  if (!error) return null;
  const code = error instanceof ApiError ? error.code : "";
  return (
    <div class="error" role="alert">
      {what ? <strong>{what}: </strong> : null}
      {error.message}
      {code ? <span class="code"> ({code})</span> : null}
    </div>
  );
}

export function Notice({ children }: { children: ComponentChildren }) {
  return (
    <div class="notice" role="status">
      {children}
    </div>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <div class="empty">{children}</div>;
}

/** Loads `load()` when `deps` change; `reload` loads again. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[]) {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<ApiError | null>(null);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const reload = useCallback(() => {
    const mine = ++generation.current;
    setLoading(true);
    load().then(
      (value) => {
        if (mine !== generation.current) return;
        setData(value);
        setError(null);
        setLoading(false);
      },
      (e) => {
        if (mine !== generation.current) return;
        setError(e instanceof ApiError ? e : new ApiError(0, "error", String(e)));
        setLoading(false);
      },
    );
  }, deps);
  useEffect(reload, deps);
  return { data, error, loading, reload };
}

/** A modal question with a destructive answer; Escape or "Cancel" says no. */
export function Confirm({
  open,
  title,
  children,
  action,
  onConfirm,
  onCancel,
}: {
  open: boolean;
  title: string;
  children: ComponentChildren;
  action: string;
  onConfirm: () => void;
  onCancel: () => void;
}) {
  const dialog = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = dialog.current!;
    if (open && !d.open) d.showModal();
    if (!open && d.open) d.close();
  }, [open]);
  return (
    <dialog ref={dialog} onCancel={(e) => (e.preventDefault(), onCancel())} aria-labelledby="confirm-title">
      <h2 id="confirm-title">{title}</h2>
      <div>{children}</div>
      <div class="actions">
        <button type="button" onClick={onCancel} autofocus>
          Cancel
        </button>
        <button type="button" class="danger" onClick={onConfirm}>
          {action}
        </button>
      </div>
    </dialog>
  );
}

function base64Bytes(b64: string): Uint8Array {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

const PREVIEW_BYTES_MAX = 4096;
const HEX_BYTES_MAX = 512;

function hexDump(data: Uint8Array): string {
  const lines: string[] = [];
  const shown = Math.min(data.length, HEX_BYTES_MAX);
  for (let at = 0; at < shown; at += 16) {
    const row = data.subarray(at, Math.min(at + 16, shown));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const text = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(6, "0")}  ${hex.padEnd(47)}  ${text}`);
  }
  if (data.length > shown) lines.push(`… ${data.length - shown} more bytes`);
  return lines.join("\n");
}

/** How a body is shown: pretty JSON, text, or a hex dump of what is not UTF-8. */
export function bodyPreview(content: Pick<MessageContent, "body" | "body_base64" | "headers">): { kind: string; text: string } {
  if (content.body_base64 !== undefined) return { kind: "hex", text: hexDump(base64Bytes(content.body_base64)) };
  const body = content.body ?? "";
  // Valid UTF-8 is not always text: control characters other than whitespace mean binary.
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(body)) return { kind: "hex", text: hexDump(new TextEncoder().encode(body)) };
  const contentType = content.headers.find(([n]) => n.toLowerCase() === "content-type")?.[1] ?? "";
  const looksJson = /json/i.test(contentType) || /^\s*[[{]/.test(body);
  if (looksJson) {
    try {
      const pretty = JSON.stringify(JSON.parse(body), null, 2);
      return { kind: "JSON", text: clip(pretty) };
    } catch {
      // Not JSON after all: shown as text.
    }
  }
  return { kind: "text", text: clip(body) };
}

function clip(text: string): string {
  return text.length > PREVIEW_BYTES_MAX ? text.slice(0, PREVIEW_BYTES_MAX) + `\n… ${text.length - PREVIEW_BYTES_MAX} more characters` : text;
}

/** A message's headers and body, fetched when shown. */
export function MessagePreview({ topic, id }: { topic: string; id: string }) {
  const { data, error, loading } = useLoad(() => get<MessageContent>(`/topics/${seg(topic)}/messages/${seg(id)}/content`), [topic, id]);
  if (loading && !data) return <p class="muted">Loading the message…</p>;
  if (error) {
    const gone = error.code === "unknown_message";
    return <p class="muted">{gone ? "The body is no longer retained by the topic." : `The body could not be read: ${error.message}`}</p>;
  }
  if (!data) return null;
  const preview = bodyPreview(data);
  return (
    <div class="preview">
      <dl class="facts">
        <div>
          <dt>Body</dt>
          <dd>
            {formatBytes(data.body_bytes)}, shown as {preview.kind}
          </dd>
        </div>
        {data.key !== undefined || data.key_base64 !== undefined ? (
          <>
            <div>
              <dt>Key</dt>
              <dd class="mono">{data.key ?? `base64 ${data.key_base64}`}</dd>
            </div>
          </>
        ) : null}
        <div>
          <dt>Priority</dt>
          <dd>{data.priority}</dd>
        </div>
        {data.delay_ms ? (
          <>
            <div>
              <dt>Delay</dt>
              <dd>{data.delay_ms} ms</dd>
            </div>
          </>
        ) : null}
      </dl>
      {data.headers.length ? (
        <table class="headers">
          <caption>Headers</caption>
          <tbody>
            {data.headers.map(([name, value], i) => (
              <tr key={i}>
                <th scope="row" class="mono">
                  {name}
                </th>
                <td class="mono">
                  {value}
                  {/-ms$/.test(name) && /^\d{12,14}$/.test(value) ? <span class="muted"> ({time(Number(value))})</span> : null}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <p class="muted">No headers.</p>
      )}
      <pre class={`body ${preview.kind}`} tabIndex={0} aria-label="Message body">
        {preview.text || "(empty body)"}
      </pre>
    </div>
  );
}

export function Table({ children, label }: { children: ComponentChildren; label: string }) {
  return (
    <div class="table-wrap" role="region" aria-label={label} tabIndex={0}>
      <table>{children}</table>
    </div>
  );
}
