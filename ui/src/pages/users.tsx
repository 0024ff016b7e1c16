// Users, their roles and grants, and their API tokens (admins only: the broker refuses everyone
// else, and the page shows its refusal). A token's secret is shown once, when it is created: the
// broker keeps only its hash, so the page cannot show it again.

import { useState } from "preact/hooks";
import { ApiError, del, get, post, seg } from "../api";
import { currentSession, isAdmin } from "../access";
import { Confirm, Empty, ErrorBox, Notice, Table, useLoad } from "../components";
import { time } from "../format";
import { href } from "../router";

interface User {
  name: string;
  roles: string[];
  grants: { pattern: string; actions: string[] }[];
  tokens: number;
}

interface Token {
  name: string;
  created_ms: number;
  expires_ms: number;
}

interface CreatedToken {
  name: string;
  token: string;
  expires_ms: number;
}

const ACTIONS = ["publish", "consume", "inspect", "manage", "purge", "pause"] as const;
const ROLES = ["admin", "monitor"] as const;

/** Runs `action`, keeping its refusal for the form's error box. */
function useSubmit() {
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  async function run(action: () => Promise<void>) {
    setError(null);
    setBusy(true);
    try {
      await action();
    } catch (err) {
      setError(err instanceof ApiError ? err : new ApiError(0, "error", String(err)));
    } finally {
      setBusy(false);
    }
  }
  return { error, setError, busy, run };
}

function grantText(g: { pattern: string; actions: string[] }) {
  return `${g.pattern}: ${g.actions.join(", ")}`;
}

/**
 * `first`: the broker has no user yet. Its first user must be an admin (the broker refuses any
 * other: with users and no admin, nobody could administer it), so the form offers that only.
 */
function AddUserForm({ onAdded, first }: { onAdded: (name: string) => void; first: boolean }) {
  const [name, setName] = useState("");
  const [password, setPassword] = useState("");
  const [again, setAgain] = useState("");
  const [chosen, setRole] = useState("");
  const role = first ? "admin" : chosen;
  const { error, setError, busy, run } = useSubmit();
  function submit(e: Event) {
    e.preventDefault();
    if (password !== again) {
      setError(new ApiError(0, "passwords_differ", "the two passwords differ: type the same one twice"));
      return;
    }
    void run(async () => {
      await post("/users", { name: name.trim(), password, roles: role ? [role] : [] });
      onAdded(name.trim());
      setName("");
      setPassword("");
      setAgain("");
      setRole("");
    });
  }
  return (
    <form class="panel" onSubmit={submit} aria-labelledby="add-user-title">
      <h2 id="add-user-title">Add a user</h2>
      <div class="row">
        <label>
          Name
          <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} required autocomplete="off" placeholder="billing" />
        </label>
        <label>
          Role
          <select name="role" value={role} onChange={(e) => setRole(e.currentTarget.value)} disabled={first}>
            <option value="">none (grants only)</option>
            <option value="monitor">monitor (inspect everything)</option>
            <option value="admin">admin (everything)</option>
          </select>
        </label>
      </div>
      {first ? (
        <p class="muted" data-testid="first-user-note">
          The first user is an admin. Once it exists, the broker asks everyone for a login, this page included: keep its password.
        </p>
      ) : null}
      <div class="row">
        <label>
          Password
          <input name="password" type="password" value={password} onInput={(e) => setPassword(e.currentTarget.value)} required minLength={8} autocomplete="new-password" />
        </label>
        <label>
          Password again
          <input name="password-again" type="password" value={again} onInput={(e) => setAgain(e.currentTarget.value)} required autocomplete="new-password" />
        </label>
      </div>
      <div class="actions">
        <button type="submit" class="primary" disabled={busy}>
          Add user
        </button>
      </div>
      <ErrorBox error={error} what="Not added" />
    </form>
  );
}

export function UsersPage() {
  const listing = useLoad(() => get<{ users: User[] }>("/users"), []);
  const [done, setDone] = useState<string | null>(null);
  const users = listing.data?.users ?? [];
  return (
    <section>
      <h1 id="view-title" tabIndex={-1}>
        Users
      </h1>
      {done ? <Notice>{done}</Notice> : null}
      <ErrorBox error={listing.error} what="Cannot list the users" />
      {listing.data && users.length === 0 ? <Empty>No users.</Empty> : null}
      {users.length ? (
        <Table label="Users">
          <thead>
            <tr>
              <th scope="col">User</th>
              <th scope="col">Roles</th>
              <th scope="col">Grants</th>
              <th scope="col" class="num">
                Tokens
              </th>
            </tr>
          </thead>
          <tbody>
            {users.map((u) => (
              <tr key={u.name} data-user={u.name}>
                <td>
                  <a href={href.user(u.name)}>{u.name}</a>
                </td>
                <td>{u.roles.length ? u.roles.join(", ") : <span class="muted">none</span>}</td>
                <td>
                  {u.grants.length ? (
                    u.grants.map((g) => (
                      <div key={g.pattern} class="mono">
                        {grantText(g)}
                      </div>
                    ))
                  ) : (
                    <span class="muted">none</span>
                  )}
                </td>
                <td class="num">{u.tokens}</td>
              </tr>
            ))}
          </tbody>
        </Table>
      ) : null}
      {isAdmin() ? (
        <AddUserForm
          first={listing.data !== undefined && users.length === 0}
          onAdded={(name) => {
            setDone(`Added user ${name}: open it to grant it topics or a role.`);
            listing.reload();
          }}
        />
      ) : null}
    </section>
  );
}

function GrantForm({ user, onChanged }: { user: string; onChanged: (what: string) => void }) {
  const [pattern, setPattern] = useState("");
  const [actions, setActions] = useState<string[]>([]);
  const [role, setRole] = useState("");
  const { error, setError, busy, run } = useSubmit();
  function submit(e: Event) {
    e.preventDefault();
    if (!role && (!pattern.trim() || actions.length === 0)) {
      setError(new ApiError(0, "incomplete", "name a topic pattern and at least one action, or a role"));
      return;
    }
    void run(async () => {
      const change = role ? { roles: [role] } : { pattern: pattern.trim(), actions };
      await post(`/users/${seg(user)}/grants`, change);
      onChanged(role ? `Granted the ${role} role to ${user}.` : `Granted ${actions.join(", ")} on ${pattern.trim()} to ${user}.`);
      setPattern("");
      setActions([]);
      setRole("");
    });
  }
  const toggle = (a: string, on: boolean) => setActions(on ? [...actions.filter((x) => x !== a), a] : actions.filter((x) => x !== a));
  return (
    <form class="panel" onSubmit={submit} aria-labelledby="grant-title">
      <h2 id="grant-title">Grant</h2>
      <div class="row">
        <label>
          Topic pattern
          <input name="pattern" value={pattern} onInput={(e) => setPattern(e.currentTarget.value)} autocomplete="off" placeholder="orders.* (a prefix), orders, or *" disabled={!!role} />
        </label>
        <label>
          or a role
          <select name="grant-role" value={role} onChange={(e) => setRole(e.currentTarget.value)}>
            <option value="">no role</option>
            {ROLES.map((r) => (
              <option value={r}>{r}</option>
            ))}
          </select>
        </label>
      </div>
      <fieldset class="actions" disabled={!!role}>
        <legend class="sr-only">Actions</legend>
        {ACTIONS.map((a) => (
          <label class="inline" key={a}>
            <input type="checkbox" name={`action-${a}`} checked={actions.includes(a)} onChange={(e) => toggle(a, e.currentTarget.checked)} />
            {a}
          </label>
        ))}
      </fieldset>
      <div class="actions">
        <button type="submit" class="primary" disabled={busy}>
          Grant
        </button>
      </div>
      <ErrorBox error={error} what="Not granted" />
    </form>
  );
}

const DAY_MS = 24 * 3600 * 1000;

function Tokens({ user }: { user: string }) {
  const listing = useLoad(() => get<{ tokens: Token[] }>(`/users/${seg(user)}/tokens`), [user]);
  const [name, setName] = useState("");
  const [days, setDays] = useState("");
  const [created, setCreated] = useState<CreatedToken | null>(null);
  const [copied, setCopied] = useState(false);
  const [revoking, setRevoking] = useState<string | null>(null);
  const { error, busy, run } = useSubmit();
  const tokens = listing.data?.tokens ?? [];
  function submit(e: Event) {
    e.preventDefault();
    void run(async () => {
      const expires_ms = days ? Date.now() + Number(days) * DAY_MS : 0;
      const token = await post<CreatedToken>(`/users/${seg(user)}/tokens`, { name: name.trim(), expires_ms });
      setCopied(false);
      setCreated(token);
      setName("");
      setDays("");
      listing.reload();
    });
  }
  function revoke(token: string) {
    setRevoking(null);
    void run(async () => {
      await del(`/users/${seg(user)}/tokens/${seg(token)}`);
      listing.reload();
    });
  }
  async function copy() {
    if (!created) return;
    try {
      await navigator.clipboard.writeText(created.token);
      setCopied(true);
    } catch {
      // No clipboard (an insecure origin, or refused): the secret stays selectable on the page.
      setCopied(false);
    }
  }
  return (
    <section aria-labelledby="tokens-title">
      <h2 id="tokens-title">API tokens</h2>
      <ErrorBox error={listing.error} what="Cannot list the tokens" />
      {created ? (
        <div class="panel secret" role="status" data-testid="new-token">
          <p>
            <strong>Token {created.name}</strong>: copy it now, <strong>you will not see it again</strong> (the broker keeps only its hash).
          </p>
          <code class="mono" data-testid="token-secret">
            {created.token}
          </code>
          <div class="actions">
            <button type="button" onClick={copy}>
              {copied ? "Copied" : "Copy"}
            </button>
            <button type="button" onClick={() => setCreated(null)}>
              Done
            </button>
          </div>
        </div>
      ) : null}
      {listing.data && tokens.length === 0 ? <Empty>No tokens.</Empty> : null}
      {tokens.length ? (
        <Table label="Tokens">
          <thead>
            <tr>
              <th scope="col">Token</th>
              <th scope="col">Created</th>
              <th scope="col">Expires</th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {tokens.map((t) => (
              <tr key={t.name} data-token={t.name}>
                <td>{t.name}</td>
                <td>{time(t.created_ms)}</td>
                <td>{t.expires_ms ? time(t.expires_ms) : <span class="muted">never</span>}</td>
                <td>
                  <button type="button" class="danger small" onClick={() => setRevoking(t.name)} aria-label={`Revoke token ${t.name}`}>
                    Revoke
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      ) : null}
      <form class="panel" onSubmit={submit} aria-labelledby="token-title">
        <h3 id="token-title">Create a token</h3>
        <div class="row">
          <label>
            Token name
            <input name="token-name" value={name} onInput={(e) => setName(e.currentTarget.value)} required autocomplete="off" placeholder="deploy" />
          </label>
          <label>
            Expires in (days)
            <input name="token-days" type="number" min={1} value={days} onInput={(e) => setDays(e.currentTarget.value)} placeholder="never" />
          </label>
        </div>
        <div class="actions">
          <button type="submit" class="primary" disabled={busy}>
            Create token
          </button>
        </div>
      </form>
      <ErrorBox error={error} what="Not done" />
      <Confirm open={revoking !== null} title={`Revoke token ${revoking ?? ""}?`} action="Revoke token" onConfirm={() => revoking && revoke(revoking)} onCancel={() => setRevoking(null)}>
        <p>Every client using it is refused from its next request on.</p>
      </Confirm>
    </section>
  );
}

export function UserPage({ name }: { name: string }) {
  const listing = useLoad(() => get<{ users: User[] }>("/users"), [name]);
  const [done, setDone] = useState<string | null>(null);
  const [removing, setRemoving] = useState(false);
  // A role the signed-in user is about to take from itself waits for a confirmation.
  const [dropping, setDropping] = useState<string | null>(null);
  const { error, run } = useSubmit();
  const user = listing.data?.users.find((u) => u.name === name);
  const own = currentSession()?.user === name;
  const changed = (what: string) => {
    setDone(what);
    listing.reload();
  };
  const revoke = (change: Record<string, unknown>, what: string) =>
    run(async () => {
      await post(`/users/${seg(name)}/revoke`, change);
      changed(what);
    });
  return (
    <section>
      <p class="crumbs">
        <a href={href.users()}>Users</a> /
      </p>
      <h1 id="view-title" tabIndex={-1}>
        User {name}
      </h1>
      {done ? <Notice>{done}</Notice> : null}
      <ErrorBox error={error} what="Not done" />
      <ErrorBox error={listing.error} what="Cannot read the user" />
      {listing.data && !user ? <Empty>No user named {name}.</Empty> : null}
      {user ? (
        <>
          <h2>Roles and grants</h2>
          <ul class="grants" aria-label="Roles and grants">
            {user.roles.map((r) => (
              <li key={`role-${r}`}>
                role <strong>{r}</strong>{" "}
                <button
                  type="button"
                  class="danger small"
                  onClick={() => (own ? setDropping(r) : revoke({ roles: [r] }, `Took the ${r} role from ${name}.`))}
                  aria-label={`Revoke role ${r}`}
                >
                  Revoke
                </button>
              </li>
            ))}
            {user.grants.map((g) => (
              <li key={g.pattern} data-grant={g.pattern}>
                <span class="mono">{grantText(g)}</span>{" "}
                <button
                  type="button"
                  class="danger small"
                  onClick={() => revoke({ pattern: g.pattern, actions: g.actions }, `Revoked ${g.actions.join(", ")} on ${g.pattern} from ${name}.`)}
                  aria-label={`Revoke ${g.pattern}`}
                >
                  Revoke
                </button>
              </li>
            ))}
            {user.roles.length + user.grants.length === 0 ? <li class="muted">Nothing yet: this user may do nothing.</li> : null}
          </ul>
          <GrantForm user={name} onChanged={changed} />
          <Tokens user={name} />
          <h2>Remove</h2>
          <div class="actions">
            <button type="button" class="danger" onClick={() => setRemoving(true)}>
              Remove user {name}
            </button>
          </div>
        </>
      ) : null}
      <Confirm
        open={removing}
        title={`Remove user ${name}?`}
        action="Remove user"
        onCancel={() => setRemoving(false)}
        onConfirm={() => {
          setRemoving(false);
          void run(async () => {
            await del(`/users/${seg(name)}`);
            location.hash = href.users();
          });
        }}
      >
        <p>Its tokens are revoked, and its connections, streams and dashboard sessions are refused from their next request on.</p>
        {own ? (
          <p>
            <strong>This is you:</strong> this page logs you out.
          </p>
        ) : null}
      </Confirm>
      <Confirm
        open={dropping !== null}
        title={`Take the ${dropping ?? ""} role from yourself?`}
        action="Revoke my role"
        onCancel={() => setDropping(null)}
        onConfirm={() => {
          const r = dropping;
          setDropping(null);
          if (r) void revoke({ roles: [r] }, `Took the ${r} role from ${name}.`);
        }}
      >
        <p>
          You are signed in as {name}: {dropping === "admin" ? "you can no longer manage users, grants or topics you hold no grant on" : "you lose what the role lets you see"}, from your next request on. The
          broker refuses this if you are its last admin.
        </p>
      </Confirm>
    </section>
  );
}
