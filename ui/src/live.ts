// The broker's statistics, polled while the page is visible and shared by every view: one
// `/stats` and one `/status` per tick whatever is open, and nothing while the tab is hidden, so
// an open dashboard costs the broker little and a forgotten background tab nothing.

import { useEffect, useState } from "preact/hooks";
import { currentSession } from "./access";
import { ApiError, get, Status, TopicStats } from "./api";

export const POLL_INTERVAL_MS = 2000;
/** Points kept for the charts: ten minutes at one per tick. */
const HISTORY_POINTS_MAX = 300;

export interface TopicRates {
  in: number;
  out: number;
}

export interface Snapshot {
  /** Unix ms of the sample. */
  at: number;
  status: Status | null;
  topics: TopicStats[];
  /** Per topic, messages per second since the previous sample (absent on the first). */
  rates: Map<string, TopicRates>;
  totals: { in: number; out: number; backlog: number; inFlight: number; publishers: number; consumers: number; gaveUp: number };
}

export interface History {
  /** Seconds since the epoch, as uPlot wants them. */
  t: number[];
  inRate: (number | null)[];
  outRate: (number | null)[];
  backlog: number[];
}

export interface LiveState {
  snapshot: Snapshot | null;
  history: History;
  error: ApiError | null;
  /** Polls made, answered or not: a view that reads more than the statistics reloads on each. */
  ticks: number;
}

let state: LiveState = { snapshot: null, history: { t: [], inRate: [], outRate: [], backlog: [] }, error: null, ticks: 0 };
const listeners = new Set<(s: LiveState) => void>();
let timer: number | undefined;
let inFlight = false;

function sumTotals(topics: TopicStats[]) {
  const totals = { in: 0, out: 0, backlog: 0, inFlight: 0, publishers: 0, consumers: 0, gaveUp: 0 };
  for (const t of topics) {
    totals.in += t.messages_in;
    totals.out += t.messages_out;
    totals.publishers += t.publishers;
    totals.consumers += t.subscribers;
    for (const s of t.subscriptions) {
      totals.backlog += s.backlog;
      totals.inFlight += s.in_flight;
      totals.gaveUp += s.gave_up;
    }
  }
  return totals;
}

/** A counter that went down (a restart, a deleted topic) gives no rate rather than a negative one. */
export function perSecond(now: number, before: number, seconds: number): number | null {
  return now >= before && seconds > 0 ? (now - before) / seconds : null;
}

/** The totals the broker sampled (`GET /history`), oldest first. */
interface BrokerSample {
  t_ms: number;
  messages_in: number;
  messages_out: number;
  backlog: number;
}

/**
 * The charts' points for the minutes before the page was loaded, from the history the broker
 * keeps (one sample every 5 s): rates from consecutive samples. Only for a user who may read
 * the totals (monitor or admin, or anyone on a broker without users); for others the charts
 * start with the page, as before.
 */
async function brokerHistory(): Promise<History | null> {
  const session = currentSession();
  const allowed = session && (!session.login_required || session.roles.includes("admin") || session.roles.includes("monitor"));
  if (!allowed) return null;
  try {
    const { samples } = await get<{ samples: BrokerSample[] }>("/history");
    const history: History = { t: [], inRate: [], outRate: [], backlog: [] };
    samples.forEach((s, i) => {
      const b = samples[i - 1];
      const seconds = b ? (s.t_ms - b.t_ms) / 1000 : 0;
      history.t.push(s.t_ms / 1000);
      history.inRate.push(b ? perSecond(s.messages_in, b.messages_in, seconds) : null);
      history.outRate.push(b ? perSecond(s.messages_out, b.messages_out, seconds) : null);
      history.backlog.push(s.backlog);
    });
    return history;
  } catch {
    return null; // An older broker without /history: the charts start with the page.
  }
}

async function tick() {
  if (inFlight) return;
  inFlight = true;
  try {
    if (state.history.t.length === 0) {
      const seeded = await brokerHistory();
      if (seeded) state = { ...state, history: seeded };
    }
    const [stats, status] = await Promise.all([get<{ topics: TopicStats[] }>("/stats"), get<Status>("/status")]);
    const at = Date.now();
    const previous = state.snapshot;
    const totals = sumTotals(stats.topics);
    const rates = new Map<string, TopicRates>();
    let inRate: number | null = null;
    let outRate: number | null = null;
    if (previous) {
      const seconds = (at - previous.at) / 1000;
      const before = new Map(previous.topics.map((t) => [t.name, t]));
      for (const t of stats.topics) {
        // A topic new since the last sample had all of its traffic since then.
        const b = before.get(t.name) ?? { messages_in: 0, messages_out: 0 };
        rates.set(t.name, {
          in: perSecond(t.messages_in, b.messages_in, seconds) ?? 0,
          out: perSecond(t.messages_out, b.messages_out, seconds) ?? 0,
        });
      }
      inRate = [...rates.values()].reduce((sum, r) => sum + r.in, 0);
      outRate = [...rates.values()].reduce((sum, r) => sum + r.out, 0);
    }
    const h = state.history;
    const keep = (a: any[]) => a.slice(Math.max(0, a.length + 1 - HISTORY_POINTS_MAX));
    const history: History = {
      t: [...keep(h.t), at / 1000],
      inRate: [...keep(h.inRate), inRate],
      outRate: [...keep(h.outRate), outRate],
      backlog: [...keep(h.backlog), totals.backlog],
    };
    state = { snapshot: { at, status, topics: stats.topics, rates, totals }, history, error: null, ticks: state.ticks + 1 };
  } catch (error) {
    state = { ...state, error: error instanceof ApiError ? error : new ApiError(0, "error", String(error)), ticks: state.ticks + 1 };
  } finally {
    inFlight = false;
  }
  listeners.forEach((l) => l(state));
}

/** Forgets what was polled: another user may not see the topics of the one who logged out. */
export function forget() {
  state = { snapshot: null, history: { t: [], inRate: [], outRate: [], backlog: [] }, error: null, ticks: 0 };
  listeners.forEach((l) => l(state));
}

/**
 * Set while the page waits for a login: every poll would only be refused. The page starts
 * paused, until it knows who it is: a poll before that would meet a 401 on a broker with users
 * and tell a first visitor that a session they never had has ended.
 */
let paused = true;
export function setPaused(value: boolean) {
  paused = value;
  if (paused) unschedule();
  else schedule();
}

function schedule() {
  if (timer !== undefined || listeners.size === 0 || document.hidden || paused) return;
  timer = window.setInterval(tick, POLL_INTERVAL_MS);
  void tick();
}

function unschedule() {
  if (timer !== undefined) window.clearInterval(timer);
  timer = undefined;
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) unschedule();
  else schedule();
});

/** Polls now, without waiting for the next tick (after the page changed something). */
export function refresh() {
  if (!paused) void tick();
}

export function useLive(): LiveState {
  const [current, setCurrent] = useState(state);
  useEffect(() => {
    listeners.add(setCurrent);
    setCurrent(state);
    schedule();
    return () => {
      listeners.delete(setCurrent);
      if (listeners.size === 0) unschedule();
    };
  }, []);
  return current;
}
