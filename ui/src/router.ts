// Views live in the URL's fragment (`#/topics/orders`), so that the broker serves one page for
// all of them, and a view can be bookmarked, reloaded and opened in a new tab.

import { useEffect, useState } from "preact/hooks";

export type ListState = "pending" | "in_flight" | "acked" | "dead_lettered";

export type Route =
  | { page: "overview" }
  | { page: "topics" }
  | { page: "topic"; topic: string }
  | { page: "subscription"; topic: string; subscription: string; state: ListState }
  | { page: "dead-letters"; topic?: string }
  | { page: "lookup"; topic?: string; id?: string }
  | { page: "users" }
  | { page: "user"; name: string }
  | { page: "connections" }
  | { page: "cluster" }
  | { page: "not-found"; path: string };

const listStates: ListState[] = ["pending", "in_flight", "acked", "dead_lettered"];

export function parse(hash: string): Route {
  const [path, query = ""] = hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (parts.length === 0) return { page: "overview" };
  if (parts[0] === "topics") {
    if (parts.length === 1) return { page: "topics" };
    if (parts.length === 2) return { page: "topic", topic: parts[1] };
    if (parts.length === 4 && parts[2] === "subscriptions") {
      const state = params.get("state") as ListState;
      return { page: "subscription", topic: parts[1], subscription: parts[3], state: listStates.includes(state) ? state : "pending" };
    }
  }
  if (parts[0] === "dead-letters" && parts.length <= 2) return { page: "dead-letters", topic: parts[1] };
  if (parts[0] === "lookup" && parts.length <= 3) return { page: "lookup", topic: parts[1], id: parts[2] };
  if (parts[0] === "users" && parts.length === 1) return { page: "users" };
  if (parts[0] === "connections" && parts.length === 1) return { page: "connections" };
  if (parts[0] === "cluster" && parts.length === 1) return { page: "cluster" };
  if (parts[0] === "users" && parts.length === 2) return { page: "user", name: parts[1] };
  return { page: "not-found", path };
}

const e = encodeURIComponent;
export const href = {
  overview: () => "#/",
  topics: () => "#/topics",
  topic: (topic: string) => `#/topics/${e(topic)}`,
  subscription: (topic: string, subscription: string, state: ListState = "pending") =>
    `#/topics/${e(topic)}/subscriptions/${e(subscription)}${state === "pending" ? "" : `?state=${state}`}`,
  deadLetters: (topic?: string) => (topic ? `#/dead-letters/${e(topic)}` : "#/dead-letters"),
  users: () => "#/users",
  connections: () => "#/connections",
  cluster: () => "#/cluster",
  user: (name: string) => `#/users/${e(name)}`,
  lookup: (topic?: string, id?: string) => (topic && id ? `#/lookup/${e(topic)}/${e(id)}` : topic ? `#/lookup/${e(topic)}` : "#/lookup"),
};

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parse(location.hash));
  useEffect(() => {
    const changed = () => setRoute(parse(location.hash));
    window.addEventListener("hashchange", changed);
    return () => window.removeEventListener("hashchange", changed);
  }, []);
  return route;
}
