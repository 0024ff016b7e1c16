// Who the page acts as, and what it may do: the session from `POST /login` or `GET /session`
// (user, roles, grants, CSRF token). The broker decides every request; the page only hides what
// the broker would refuse, so that a `monitor` user meets no button that cannot work.
//
// The rules mirror the broker's (docs/security.md): `admin` may do anything, `monitor` may
// inspect every topic, and a grant's pattern is a topic's exact name, a prefix followed by `*`,
// or `*`; a topic's dead-letter topic `<topic>.dlq` is granted what `<topic>` is; `manage`
// implies `purge` and `pause`.

import { useEffect, useState } from "preact/hooks";
import { get, post, setCsrfToken } from "./api";

export type Action = "publish" | "consume" | "inspect" | "manage" | "purge" | "pause";

/** The actions a grant's list allows: itself, and purge and pause where it has manage. */
function allows(actions: string[], action: Action): boolean {
  return actions.includes(action) || ((action === "purge" || action === "pause") && actions.includes("manage"));
}

export interface Grant {
  pattern: string;
  actions: string[];
}

export interface SessionInfo {
  /** Whether the broker has users; without any, every field below is empty and all is allowed. */
  login_required: boolean;
  user: string | null;
  roles: string[];
  grants: Grant[];
  csrf_token: string | null;
  expires_ms: number | null;
}

let session: SessionInfo | null = null;
const listeners = new Set<(s: SessionInfo | null) => void>();

export function setSession(next: SessionInfo | null) {
  session = next;
  setCsrfToken(next?.csrf_token ?? "");
  listeners.forEach((l) => l(session));
}

/** The session, re-rendering the caller when it changes. */
export function useSession(): SessionInfo | null {
  const [current, setCurrent] = useState(session);
  useEffect(() => {
    listeners.add(setCurrent);
    setCurrent(session);
    return () => void listeners.delete(setCurrent);
  }, []);
  return current;
}

export const loadSession = () => get<SessionInfo>("/session");
export const login = (user: string, password: string) => post<SessionInfo>("/login", { user, password });
export const logout = () => post<void>("/logout", {});

function open(s: SessionInfo | null): boolean {
  return !s || !s.login_required;
}

export function isAdmin(s: SessionInfo | null = session): boolean {
  return open(s) || s!.roles.includes("admin");
}

export function patternMatches(pattern: string, topic: string): boolean {
  if (pattern === "*") return true;
  if (pattern.endsWith("*")) return topic.startsWith(pattern.slice(0, -1));
  return pattern === topic;
}

/** Whether the session may take `action` on `topic`. */
export function can(action: Action, topic: string, s: SessionInfo | null = session): boolean {
  if (isAdmin(s)) return true;
  if (action === "inspect" && s!.roles.includes("monitor")) return true;
  const names = topic.endsWith(".dlq") ? [topic, topic.slice(0, -4)] : [topic];
  return s!.grants.some((g) => allows(g.actions, action) && names.some((n) => patternMatches(g.pattern, n)));
}

/** Whether the session may take `action` on some topic (to show a form that names its topic). */
export function canSomewhere(action: Action, s: SessionInfo | null = session): boolean {
  return isAdmin(s) || s!.grants.some((g) => allows(g.actions, action));
}

export function currentSession(): SessionInfo | null {
  return session;
}
