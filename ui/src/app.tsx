// The page's frame: a header with the views, the broker's health and who is logged in, and the
// current view.
//
// Access: the page asks `GET /session` first. While the broker has no users (loopback), every
// call goes through as it does for curl and there is no login. Once users exist, the login page
// comes first; the session's roles and grants decide which views and buttons are shown. A 401
// from any call (the session expired, was ended, or its user removed) brings the login page
// back in place of the view, which stays mounted underneath, so nothing typed into its forms is
// lost: after logging in again as the same user, the view is back as it was.

import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { currentSession, isAdmin, loadSession, logout, SessionInfo, setSession, useSession } from "./access";
import { ApiError, get, setAuthorizationHandler } from "./api";
import { ErrorBox } from "./components";
import { forget, refresh, setPaused, useLive } from "./live";
import { ClusterPage } from "./pages/cluster";
import { ConnectionsPage } from "./pages/connections";
import { DeadLettersPage } from "./pages/dead-letters";
import { LoginPage } from "./pages/login";
import { LookupPage } from "./pages/lookup";
import { OverviewPage } from "./pages/overview";
import { SubscriptionPage } from "./pages/subscription";
import { TopicPage } from "./pages/topic";
import { TopicsPage } from "./pages/topics";
import { UserPage, UsersPage } from "./pages/users";
import { href, Route, useRoute } from "./router";

/**
 * The header's views. `admin`: only for admins of a broker with users; `monitor`: for the monitor
 * and admin roles (everyone on a broker without users); `cluster`: only on a node of a cluster.
 */
const views: { page: Route["page"]; label: string; to: string; admin?: boolean; monitor?: boolean; cluster?: boolean }[] = [
  { page: "overview", label: "Overview", to: href.overview() },
  { page: "topics", label: "Topics", to: href.topics() },
  { page: "dead-letters", label: "Dead letters", to: href.deadLetters() },
  { page: "lookup", label: "Message lookup", to: href.lookup() },
  { page: "connections", label: "Connections", to: href.connections(), monitor: true },
  { page: "cluster", label: "Cluster", to: href.cluster(), monitor: true, cluster: true },
  { page: "users", label: "Users", to: href.users(), admin: true },
];

function current(route: Route): Route["page"] {
  if (route.page === "user") return "users";
  return route.page === "topic" || route.page === "subscription" ? "topics" : route.page;
}

function titleOf(route: Route): string {
  switch (route.page) {
    case "overview":
      return "Overview";
    case "topics":
      return "Topics";
    case "topic":
      return `Topic ${route.topic}`;
    case "subscription":
      return `Subscription ${route.subscription} of ${route.topic}`;
    case "dead-letters":
      return route.topic ? `Dead letters of ${route.topic}` : "Dead letters";
    case "lookup":
      return "Message lookup";
    case "users":
      return "Users";
    case "user":
      return `User ${route.name}`;
    case "connections":
      return "Connections";
    case "cluster":
      return "Cluster";
    case "not-found":
      return "Not found";
  }
}

/** Where the page stands: asking who it is, waiting for a login, or showing views. */
type Phase = { at: "starting" } | { at: "login"; reason: string | null } | { at: "ready" };

export function App() {
  const route = useRoute();
  const session = useSession();
  const [phase, setPhase] = useState<Phase>({ at: "starting" });
  const [startError, setStartError] = useState<ApiError | null>(null);
  // Whether the views have been shown for the session's user: they stay mounted (hidden) while
  // the same user logs in again, and are dropped when another user might see them.
  const [mounted, setMounted] = useState(false);
  // Changes when another user logs in, so that every view starts afresh.
  const [viewKey, setViewKey] = useState(0);
  const [unauthorized, setUnauthorized] = useState(false);
  const loggingIn = useRef(false);

  useEffect(() => {
    loadSession().then(
      (s) => {
        setSession(s);
        if (s.login_required && !s.user) {
          setPaused(true);
          setPhase({ at: "login", reason: null });
        } else {
          setMounted(true);
          setPhase({ at: "ready" });
          setPaused(false);
        }
      },
      (error) => {
        // An older broker without sessions, or none answering: the views say what fails.
        setStartError(error);
        setMounted(true);
        setPhase({ at: "ready" });
        setPaused(false);
      },
    );
  }, []);

  useEffect(() => {
    setAuthorizationHandler((authorized) => {
      if (authorized) return setUnauthorized(false);
      // Before the page knows who it is, the session's own answer decides what comes next.
      if (loggingIn.current || !currentSession()) return;
      if (!currentSession()?.login_required) {
        // The broker had no users when the page asked; if it has some now (its first admin
        // was just added), the login takes the view's place as for an ended session.
        loggingIn.current = true;
        loadSession().then(
          (s) => {
            setSession(s);
            if (s.login_required && !s.user) {
              setPaused(true);
              setPhase({ at: "login", reason: "The broker now has users: log in to go on." });
            } else {
              loggingIn.current = false;
              setUnauthorized(true);
            }
          },
          () => {
            loggingIn.current = false;
            setUnauthorized(true);
          },
        );
        return;
      }
      loggingIn.current = true;
      setPaused(true);
      setPhase({ at: "login", reason: "Your session has ended. Log in again: the page and anything you typed are kept." });
    });
    return () => setAuthorizationHandler(null);
  }, []);

  useEffect(() => {
    document.title = `${phase.at === "login" ? "Log in" : titleOf(route)} · FerryMQ`;
  }, [route, phase]);
  // A new view starts at its top, with the keyboard focus on its heading. A layout effect runs
  // in the same task as the commit that shows the view, so no key pressed after the heading
  // appears can land before the focus does.
  useLayoutEffect(() => {
    if (phase.at !== "ready") return;
    window.scrollTo(0, 0);
    document.getElementById("view-title")?.focus({ preventScroll: true });
  }, [location.hash, phase.at]);

  function loggedIn(next: SessionInfo) {
    const before = currentSession()?.user;
    if (before !== next.user) {
      // Another user: nothing of the previous one's views or statistics may show.
      forget();
      setViewKey((k) => k + 1);
      if (before) location.hash = href.overview();
    }
    setSession(next);
    loggingIn.current = false;
    setMounted(true);
    setPhase({ at: "ready" });
    setPaused(false);
    refresh();
  }

  async function logOut() {
    try {
      await logout();
    } catch {
      // An expired session is as logged out as can be.
    }
    forget();
    setMounted(false);
    setSession({ login_required: true, user: null, roles: [], grants: [], csrf_token: null, expires_ms: null });
    setPaused(true);
    setPhase({ at: "login", reason: "You are logged out." });
  }

  const live = useLive();
  const status = live.snapshot?.status;
  const monitor = isAdmin(session) || !!session?.roles.includes("monitor");
  const clustered = useClustered(phase.at === "ready" && monitor, session?.user ?? null);
  const shown = views.filter((v) => (!v.admin || (session?.login_required && isAdmin(session))) && (!v.monitor || monitor) && (!v.cluster || clustered));
  return (
    <>
      <a class="skip" href="#main" onClick={(e) => (e.preventDefault(), document.getElementById("view-title")?.focus())}>
        Skip to content
      </a>
      <header class="top">
        <a class="brand" href={href.overview()}>
          <img src="./favicon.svg" alt="" width={22} height={22} />
          FerryMQ
        </a>
        <nav aria-label="Views" data-cluster={clustered === null ? "unknown" : String(clustered)}>
          {phase.at === "ready"
            ? shown.map((v) => (
                <a href={v.to} aria-current={current(route) === v.page ? "page" : undefined}>
                  {v.label}
                </a>
              ))
            : null}
        </nav>
        {session?.user && phase.at === "ready" ? (
          <span class="who">
            <span data-testid="user">{session.user}</span>
            <button type="button" class="small" onClick={logOut}>
              Log out
            </button>
          </span>
        ) : null}
        {phase.at === "ready" ? <Health status={status} error={live.error} at={live.snapshot?.at ?? null} /> : null}
      </header>
      {unauthorized ? (
        <div class="banner">
          <div class="error" role="alert">
            The broker asks for a login for this request. Your page and anything you typed are kept; sign in and try again.
          </div>
        </div>
      ) : null}
      {startError ? (
        <div class="banner">
          <ErrorBox error={startError} what="Cannot ask the broker who you are" />
        </div>
      ) : null}
      {live.error && live.snapshot && phase.at === "ready" ? (
        <div class="banner">
          <ErrorBox error={live.error} what="The statistics stopped updating" />
        </div>
      ) : null}
      {phase.at === "login" ? (
        <main id="login">
          <LoginPage reason={phase.reason} onLogin={loggedIn} />
        </main>
      ) : null}
      {phase.at === "starting" ? <p class="boot">Loading…</p> : null}
      {mounted ? (
        <main id="main" key={viewKey} hidden={phase.at !== "ready"}>
          <View route={route} />
        </main>
      ) : null}
    </>
  );
}

/**
 * Whether the broker serving the page is a node of a cluster (`GET /node` names its cluster), asked
 * once the page may read `/node` (monitor or admin, anyone without users), again for each user;
 * `null` until known. Not knowing (the question failed: the overview shows why) hides the
 * Cluster link only: `#/cluster` still opens, and says what the broker answers there.
 */
function useClustered(allowed: boolean, user: string | null): boolean | null {
  const [clustered, setClustered] = useState<boolean | null>(null);
  useEffect(() => {
    if (!allowed) return setClustered(null);
    let current = true;
    get<{ cluster: unknown | null }>("/node").then(
      (node) => current && setClustered(node.cluster !== null && node.cluster !== undefined),
      () => current && setClustered(null),
    );
    return () => {
      current = false;
    };
  }, [allowed, user]);
  return clustered;
}

/**
 * The broker's health as last known: "unreachable" as soon as a poll of /status fails, with how
 * long ago it last answered, never the green of an answer that has stopped coming.
 */
function Health({ status, error, at }: { status: StatusLike | null | undefined; error: ApiError | null; at: number | null }) {
  if (error) {
    const age = at === null ? null : Math.max(0, Math.round((Date.now() - at) / 1000));
    return (
      <span class="health down" role="status" title={error.message}>
        unreachable{age === null ? null : <span class="muted"> · last answer {age} s ago</span>}
      </span>
    );
  }
  if (!status) {
    return (
      <span class="health unknown" role="status">
        …
      </span>
    );
  }
  return (
    <span class={`health ${status.status}`} role="status">
      {status.status === "ok" ? "healthy" : "degraded"}
      <span class="muted"> v{status.version}</span>
    </span>
  );
}

type StatusLike = { status: string; version: string };

function View({ route }: { route: Route }) {
  switch (route.page) {
    case "overview":
      return <OverviewPage />;
    case "topics":
      return <TopicsPage />;
    case "topic":
      return <TopicPage key={route.topic} topic={route.topic} />;
    case "subscription":
      return <SubscriptionPage key={`${route.topic}/${route.subscription}/${route.state}`} topic={route.topic} subscription={route.subscription} state={route.state} />;
    case "dead-letters":
      return <DeadLettersPage key={route.topic ?? ""} topic={route.topic} />;
    case "lookup":
      return <LookupPage key={`${route.topic}/${route.id}`} topic={route.topic} id={route.id} />;
    case "users":
      return <UsersPage />;
    case "user":
      return <UserPage key={route.name} name={route.name} />;
    case "connections":
      return <ConnectionsPage />;
    case "cluster":
      return <ClusterPage />;
    case "not-found":
      return (
        <section>
          <h1 id="view-title" tabIndex={-1}>
            No such view
          </h1>
          <p>
            Nothing lives at <code>#{route.path}</code>. Go to the <a href={href.overview()}>overview</a>.
          </p>
        </section>
      );
  }
}
