// The page's frame: a header with the views and the broker's health, and the current view.
//
// Access: while the broker has no users (loopback), every call goes through as it does for curl.
// A 401 from any call means a session is needed: the banner says so and the view underneath stays
// mounted, so nothing typed into its forms is lost (see `setAuthorizationHandler`).

import { useEffect, useState } from "preact/hooks";
import { setAuthorizationHandler } from "./api";
import { ErrorBox } from "./components";
import { useLive } from "./live";
import { DeadLettersPage } from "./pages/dead-letters";
import { LookupPage } from "./pages/lookup";
import { OverviewPage } from "./pages/overview";
import { SubscriptionPage } from "./pages/subscription";
import { TopicPage } from "./pages/topic";
import { TopicsPage } from "./pages/topics";
import { href, Route, useRoute } from "./router";

const views: { page: Route["page"]; label: string; to: string }[] = [
  { page: "overview", label: "Overview", to: href.overview() },
  { page: "topics", label: "Topics", to: href.topics() },
  { page: "dead-letters", label: "Dead letters", to: href.deadLetters() },
  { page: "lookup", label: "Message lookup", to: href.lookup() },
];

function current(route: Route): Route["page"] {
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
    case "not-found":
      return "Not found";
  }
}

export function App() {
  const route = useRoute();
  const live = useLive();
  const [unauthorized, setUnauthorized] = useState(false);
  useEffect(() => {
    setAuthorizationHandler((authorized) => setUnauthorized(!authorized));
    return () => setAuthorizationHandler(null);
  }, []);
  useEffect(() => {
    document.title = `${titleOf(route)} · FerryMQ`;
  }, [route]);
  // A new view starts at its top, with the keyboard focus on its heading.
  useEffect(() => {
    window.scrollTo(0, 0);
    document.getElementById("view-title")?.focus({ preventScroll: true });
  }, [location.hash]);

  const status = live.snapshot?.status;
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
        <nav aria-label="Views">
          {views.map((v) => (
            <a href={v.to} aria-current={current(route) === v.page ? "page" : undefined}>
              {v.label}
            </a>
          ))}
        </nav>
        <span class={`health ${status ? status.status : live.error ? "down" : "unknown"}`} role="status">
          {status ? (status.status === "ok" ? "healthy" : "degraded") : live.error ? "unreachable" : "…"}
          {status ? <span class="muted"> v{status.version}</span> : null}
        </span>
      </header>
      {unauthorized ? (
        <div class="banner">
          <div class="error" role="alert">
            The broker asks for a login for this request. Your page and anything you typed are kept; sign in and try again.
          </div>
        </div>
      ) : null}
      {live.error && live.snapshot ? (
        <div class="banner">
          <ErrorBox error={live.error} what="The statistics stopped updating" />
        </div>
      ) : null}
      <main id="main">
        <View route={route} />
      </main>
    </>
  );
}

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
