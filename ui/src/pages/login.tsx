// The login: a user name and password, checked by the broker (`POST /login`), which answers with
// an HttpOnly session cookie and the CSRF token the page sends with every change. Shown in place
// of the view when a session is needed; the view underneath stays mounted, so a form half-filled
// when the session ended keeps its text for when the user is back.

import { useState } from "preact/hooks";
import { SessionInfo, login } from "../access";
import { ApiError } from "../api";
import { ErrorBox } from "../components";

export function LoginPage({ reason, onLogin }: { reason: string | null; onLogin: (session: SessionInfo) => void }) {
  const [user, setUser] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setBusy(true);
    try {
      const session = await login(user.trim(), password);
      setPassword("");
      onLogin(session);
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  }
  return (
    <section class="login">
      <h1 id="login-title" tabIndex={-1}>
        Log in to FerryMQ
      </h1>
      {reason ? (
        <p class="notice" role="status">
          {reason}
        </p>
      ) : null}
      <form class="panel" onSubmit={submit} aria-labelledby="login-title">
        <label>
          User
          <input name="user" value={user} onInput={(e) => setUser(e.currentTarget.value)} required autocomplete="username" autoFocus />
        </label>
        <label>
          Password
          <input name="password" type="password" value={password} onInput={(e) => setPassword(e.currentTarget.value)} required autocomplete="current-password" />
        </label>
        <div class="actions">
          <button type="submit" class="primary" disabled={busy}>
            Log in
          </button>
        </div>
        <ErrorBox error={error} what="Not logged in" />
      </form>
    </section>
  );
}
