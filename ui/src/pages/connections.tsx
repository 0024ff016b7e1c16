// Who is connected: every client connection, a page at a time, with what it holds and moves.
// Rates are the difference of two listings, as the overview's rates are of two statistics.
// An admin may close one, after a confirmation.

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, Connection, ConnectionPage, del, get } from "../api";
import { Confirm, Empty, ErrorBox, Notice, Table } from "../components";
import { bytes, count, rate, time } from "../format";
import { isAdmin, useSession } from "../access";
import { useLive } from "../live";

/** Connections one page shows: a table of 200 rows renders well within a frame. */
const PAGE = 200;

export function ConnectionsPage() {
  const session = useSession();
  const live = useLive();
  const [after, setAfter] = useState<number[]>([0]);
  const [page, setPage] = useState<ConnectionPage | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [closing, setClosing] = useState<Connection | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const previous = useRef<{ at: number; byId: Map<number, Connection> } | null>(null);
  const [rates, setRates] = useState<Map<number, { in: number; out: number }>>(new Map());
  const start = after[after.length - 1];
  const tick = live.snapshot?.at;

  useEffect(() => {
    let current = true;
    get<ConnectionPage>(`/connections?after=${start}&limit=${PAGE}`).then(
      (next) => {
        if (!current) return;
        const now = Date.now();
        const before = previous.current;
        if (before && now > before.at) {
          const seconds = (now - before.at) / 1000;
          const computed = new Map<number, { in: number; out: number }>();
          for (const c of next.connections) {
            const old = before.byId.get(c.id);
            if (old) computed.set(c.id, { in: (c.messages_in - old.messages_in) / seconds, out: (c.messages_out - old.messages_out) / seconds });
          }
          setRates(computed);
        }
        previous.current = { at: now, byId: new Map(next.connections.map((c) => [c.id, c])) };
        setPage(next);
        setError(null);
      },
      (err) => current && setError(err as ApiError),
    );
    return () => {
      current = false;
    };
  }, [start, tick, done]);

  async function close(c: Connection) {
    setClosing(null);
    setError(null);
    try {
      await del(`/connections/${c.id}`);
      setDone(`Closed connection ${c.id} (${c.peer}).`);
    } catch (err) {
      setError(err as ApiError);
    }
  }

  const admin = isAdmin(session);
  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Connections
      </h1>
      <p class="muted">
        Clients connected now{page ? `: ${count(page.total)}` : ""}. Messages and bytes are counted since each connected; rates over the last refresh.
      </p>
      <ErrorBox error={error} what="Cannot list or close connections" />
      {done ? <Notice>{done}</Notice> : null}
      {page && page.connections.length === 0 ? <Empty>No client is connected.</Empty> : null}
      {page && page.connections.length ? (
        <Table label="Connections">
          <thead>
            <tr>
              <th scope="col" class="num">Id</th>
              <th scope="col">Peer</th>
              <th scope="col">User</th>
              <th scope="col">Client</th>
              <th scope="col">Since</th>
              <th scope="col" class="num" title="Subscriptions / consumers">Subs / cons</th>
              <th scope="col" class="num">In</th>
              <th scope="col" class="num">Out</th>
              <th scope="col" class="num" title="Credit held / delivered and not yet settled">Credit / unacked</th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {page.connections.map((c) => {
              const r = rates.get(c.id);
              return (
                <tr key={c.id} data-connection={c.id}>
                  <td class="num mono">{c.id}</td>
                  <td class="mono">
                    {c.peer}
                    {c.tls ? <span class="muted"> TLS</span> : null}
                    {c.listener === "http" ? <span class="muted"> HTTP</span> : null}
                  </td>
                  <td>{c.user || <span class="muted">anonymous</span>}</td>
                  <td>{c.client_name || <span class="muted">–</span>}</td>
                  <td class="nowrap">{time(c.connected_ms)}</td>
                  <td class="num">
                    {count(c.subscriptions)} / {count(c.consumers)}
                  </td>
                  <td class="num nowrap" title={`${bytes(c.bytes_in)} in`}>
                    {count(c.messages_in)} msg{r ? <span class="muted"> · {rate(r.in)}</span> : null}
                  </td>
                  <td class="num nowrap" title={`${bytes(c.bytes_out)} out`}>
                    {count(c.messages_out)} msg{r ? <span class="muted"> · {rate(r.out)}</span> : null}
                  </td>
                  <td class="num">
                    {count(c.credit)} / {count(c.unacked)}
                  </td>
                  <td>
                    {admin ? (
                      <button type="button" class="danger small" onClick={() => setClosing(c)} aria-label={`Close connection ${c.id}`}>
                        Close
                      </button>
                    ) : null}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </Table>
      ) : null}
      <div class="actions">
        {after.length > 1 ? (
          <button type="button" onClick={() => setAfter(after.slice(0, -1))}>
            Previous page
          </button>
        ) : null}
        {page?.next_after ? (
          <button type="button" onClick={() => setAfter([...after, page.next_after!])}>
            Next page
          </button>
        ) : null}
      </div>
      <Confirm open={closing !== null} title={`Close connection ${closing?.id ?? ""}?`} action="Close connection" onConfirm={() => closing && close(closing)} onCancel={() => setClosing(null)}>
        <p>
          The client at <code>{closing?.peer}</code> is told it was closed by an operator; messages delivered to it and not yet acked go back to their subscriptions. A client that reconnects by itself will come
          back.
        </p>
      </Confirm>
    </section>
  );
}
