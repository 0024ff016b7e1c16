//! The dashboard's sessions against a real listener on 127.0.0.1: login, the cookie's
//! attributes, CSRF on every state-changing request (the publish fast path included), logout
//! ending the session on the server, expiry, and the bound on the session table.

use std::net::SocketAddr;
use std::time::Duration;

use ferrymq_broker::auth::{parse_actions, parse_roles};
use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_http::{HttpConfig, HttpServer};
use reqwest::header::{HeaderMap, SET_COOKIE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const ADMIN_PASSWORD: &str = "admin password 1";
const ALICE_PASSWORD: &str = "alice password 1";

struct Api {
    base: String,
    broker: Broker,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A broker with an admin and `alice` (publish and inspect on `orders.*`), served over HTTP
/// with the settings `configure` changes.
async fn serve(users: bool, configure: impl FnOnce(&mut HttpConfig)) -> Api {
    let broker = Broker::open(BrokerConfig::default());
    if users {
        let auth = broker.auth();
        auth.add_user("admin", ADMIN_PASSWORD, parse_roles("admin").unwrap())
            .unwrap();
        auth.add_user("alice", ALICE_PASSWORD, 0).unwrap();
        auth.grant(
            "alice",
            "orders.*",
            parse_actions("publish,inspect").unwrap(),
            0,
        )
        .unwrap();
    }
    let mut config = HttpConfig::for_broker("127.0.0.1:0".parse().unwrap(), &broker);
    configure(&mut config);
    let server = HttpServer::bind(config, broker.clone()).await.unwrap();
    server.readiness().set_ready();
    let addr: SocketAddr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Api {
        base: format!("http://{addr}"),
        broker,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .unwrap(),
        stop: Some(stop),
    }
}

/// A logged-in session: its cookie (as a browser sends it back) and CSRF token.
struct Session {
    cookie: String,
    csrf: String,
    set_cookie: String,
    body: Value,
}

impl Api {
    async fn login(&self, user: &str, password: &str) -> Result<Session, (StatusCode, Value)> {
        let response = self
            .client
            .post(format!("{}/login", self.base))
            .json(&json!({"user": user, "password": password}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        if status != StatusCode::OK {
            assert!(response.headers().get(SET_COOKIE).is_none());
            return Err((status, response.json().await.unwrap()));
        }
        let set_cookie = response
            .headers()
            .get(SET_COOKIE)
            .expect("a login sets its cookie")
            .to_str()
            .unwrap()
            .to_owned();
        let body: Value = response.json().await.unwrap();
        let cookie = set_cookie.split(';').next().unwrap().to_owned();
        Ok(Session {
            cookie,
            csrf: body["csrf_token"].as_str().unwrap().to_owned(),
            set_cookie,
            body,
        })
    }

    /// `method path` with `headers` and an optional JSON body: the status and the body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, HeaderMap, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        };
        (status, headers, body)
    }
}

#[tokio::test]
async fn login_sets_a_strict_http_only_cookie_and_answers_the_csrf_token() {
    let api = serve(true, |_| {}).await;

    let (status, body) = api.login("alice", "wrong password").await.err().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "authentication_failed");
    assert!(!body.to_string().contains("wrong password"), "{body}");
    let (status, _) = api.login("nobody", "wrong password").await.err().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = api.login("", "x").await.err().unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let session = api.login("alice", ALICE_PASSWORD).await.unwrap();
    let attributes: Vec<&str> = session.set_cookie.split("; ").collect();
    assert!(
        attributes[0].starts_with("ferrymq_session="),
        "{attributes:?}"
    );
    let value = attributes[0].trim_start_matches("ferrymq_session=");
    assert_eq!(value.len(), 64, "256 random bits in hex");
    for wanted in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=28800"] {
        assert!(attributes.contains(&wanted), "{wanted} in {attributes:?}");
    }
    assert!(
        !attributes.contains(&"Secure"),
        "plain HTTP: {attributes:?}"
    );
    assert_eq!(session.body["user"], "alice");
    assert_eq!(session.body["login_required"], true);
    assert_eq!(
        session.body["grants"],
        json!([{"pattern": "orders.*", "actions": ["publish", "inspect"]}])
    );
    assert_eq!(session.body["roles"], json!([]));
    assert_eq!(session.csrf.len(), 64);
    assert_ne!(session.csrf, value, "the CSRF token is not the cookie");

    // The page finds its session again after a reload; without the cookie there is none.
    let (status, headers, body) = api
        .call(
            Method::GET,
            "/session",
            &[("cookie", &session.cookie)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(body["user"], "alice");
    assert_eq!(body["csrf_token"], session.csrf.as_str());
    let (status, _, body) = api.call(Method::GET, "/session", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["login_required"], true);
    assert_eq!(body["user"], Value::Null);
    assert_eq!(body["csrf_token"], Value::Null);

    // The cookie authenticates reads, with the user's own view of the topics.
    let admin = api.login("admin", ADMIN_PASSWORD).await.unwrap();
    for topic in ["orders.eu", "payments"] {
        let (status, _, body) = api
            .call(
                Method::POST,
                "/topics",
                &[("cookie", &admin.cookie), ("x-csrf-token", &admin.csrf)],
                Some(json!({"name": topic})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, _, body) = api
        .call(Method::GET, "/topics", &[("cookie", &session.cookie)], None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let names: Vec<&str> = body["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders.eu"]);
}

#[tokio::test]
async fn a_state_changing_request_with_the_cookie_needs_the_csrf_token() {
    let api = serve(true, |_| {}).await;
    let admin = api.login("admin", ADMIN_PASSWORD).await.unwrap();
    let alice = api.login("alice", ALICE_PASSWORD).await.unwrap();
    let create = |headers: Vec<(&'static str, String)>| {
        let api = &api;
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            api.call(
                Method::POST,
                "/topics",
                &headers,
                Some(json!({"name": "orders.eu"})),
            )
            .await
        }
    };
    let (status, _, body) = create(vec![("cookie", admin.cookie.clone())]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "csrf_failed");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("X-CSRF-Token"));
    let (status, _, body) = create(vec![
        ("cookie", admin.cookie.clone()),
        ("x-csrf-token", "0".repeat(64)),
    ])
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "csrf_failed");
    // Another session's token is no better than a wrong one.
    let (status, _, _) = create(vec![
        ("cookie", admin.cookie.clone()),
        ("x-csrf-token", alice.csrf.clone()),
    ])
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, body) = create(vec![
        ("cookie", admin.cookie.clone()),
        ("x-csrf-token", admin.csrf.clone()),
    ])
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The publish route is served past the router, and keeps a keep-alive connection's
    // caller: a session's publish is checked every time all the same.
    let publish = |csrf: Option<String>| {
        let cookie = alice.cookie.clone();
        let api = &api;
        async move {
            let mut headers = vec![("cookie", cookie.as_str())];
            if let Some(csrf) = &csrf {
                headers.push(("x-csrf-token", csrf.as_str()));
            }
            api.call(
                Method::POST,
                "/topics/orders.eu/messages",
                &headers,
                Some(json!({"messages": [{"body": "hello"}]})),
            )
            .await
        }
    };
    let (status, _, body) = publish(None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "csrf_failed");
    let (status, _, body) = publish(Some(alice.csrf.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _, body) = publish(None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _, body) = publish(Some(admin.csrf.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // What the session's user may not do stays refused with the right token.
    let (status, _, body) = api
        .call(
            Method::DELETE,
            "/topics/orders.eu",
            &[("cookie", &alice.cookie), ("x-csrf-token", &alice.csrf)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");

    // An Authorization header is the credential when both are sent: no CSRF token needed.
    let (status, _, body) = api
        .call(
            Method::POST,
            "/topics",
            &[
                ("cookie", &alice.cookie),
                ("authorization", &basic("admin", ADMIN_PASSWORD)),
            ],
            Some(json!({"name": "payments"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[tokio::test]
async fn logout_ends_the_session_on_the_server() {
    let api = serve(true, |_| {}).await;
    let session = api.login("alice", ALICE_PASSWORD).await.unwrap();
    let (status, _, body) = api
        .call(
            Method::POST,
            "/logout",
            &[("cookie", &session.cookie)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "logout needs the token too");
    assert_eq!(body["error"]["code"], "csrf_failed");
    let (status, headers, _) = api
        .call(
            Method::POST,
            "/logout",
            &[("cookie", &session.cookie), ("x-csrf-token", &session.csrf)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let cleared = headers[SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("ferrymq_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );

    // The old cookie, kept by whoever copied it, is refused.
    let (status, headers, body) = api
        .call(Method::GET, "/topics", &[("cookie", &session.cookie)], None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "authentication_failed");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("log in again"));
    assert!(headers.contains_key(WWW_AUTHENTICATE));
    let (_, _, body) = api
        .call(
            Method::GET,
            "/session",
            &[("cookie", &session.cookie)],
            None,
        )
        .await;
    assert_eq!(body["user"], Value::Null);
    assert_eq!(body["login_required"], true);
}

#[tokio::test]
async fn a_session_expires_after_its_lifetime() {
    let api = serve(true, |config| {
        config.session_lifetime = Duration::from_secs(1);
    })
    .await;
    let session = api.login("alice", ALICE_PASSWORD).await.unwrap();
    assert!(session.set_cookie.contains("Max-Age=1"));
    let (status, _, _) = api
        .call(Method::GET, "/topics", &[("cookie", &session.cookie)], None)
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let (status, _, body) = api
        .call(Method::GET, "/topics", &[("cookie", &session.cookie)], None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expired"));
}

#[tokio::test]
async fn the_session_table_is_bounded_and_a_full_table_refuses_logins() {
    let api = serve(true, |config| config.sessions_max = 2).await;
    let admin = api.login("admin", ADMIN_PASSWORD).await.unwrap();
    api.login("alice", ALICE_PASSWORD).await.unwrap();
    let (status, body) = api.login("alice", ALICE_PASSWORD).await.err().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "too_many_sessions");
    // The open sessions are untouched, and a logout makes room.
    let (status, _, _) = api
        .call(
            Method::POST,
            "/logout",
            &[("cookie", &admin.cookie), ("x-csrf-token", &admin.csrf)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    api.login("alice", ALICE_PASSWORD).await.unwrap();
}

#[tokio::test]
async fn a_removed_users_session_is_refused() {
    let api = serve(true, |_| {}).await;
    let admin = api.login("admin", ADMIN_PASSWORD).await.unwrap();
    let alice = api.login("alice", ALICE_PASSWORD).await.unwrap();
    let (status, _, body) = api
        .call(
            Method::DELETE,
            "/users/alice",
            &[("cookie", &admin.cookie), ("x-csrf-token", &admin.csrf)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, _, _) = api
        .call(Method::GET, "/topics", &[("cookie", &alice.cookie)], None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, _, body) = api
        .call(Method::GET, "/session", &[("cookie", &alice.cookie)], None)
        .await;
    assert_eq!(body["user"], Value::Null);
}

#[tokio::test]
async fn a_page_script_is_never_offered_basic() {
    let api = serve(true, |_| {}).await;
    let (status, headers, _) = api
        .call(Method::GET, "/topics", &[("sec-fetch-dest", "empty")], None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers[WWW_AUTHENTICATE], "Bearer realm=\"ferrymq\"");
    let (status, headers, _) = api.call(Method::GET, "/topics", &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers[WWW_AUTHENTICATE]
        .to_str()
        .unwrap()
        .starts_with("Basic"));
    let (status, headers, _) = api
        .call(
            Method::POST,
            "/topics/orders.eu/messages",
            &[("sec-fetch-dest", "empty")],
            Some(json!({"messages": [{"body": "x"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers[WWW_AUTHENTICATE], "Bearer realm=\"ferrymq\"");
    let (status, headers, _) = api
        .call(
            Method::POST,
            "/login",
            &[],
            Some(json!({"user": "alice", "password": "wrong password"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!headers.contains_key(WWW_AUTHENTICATE));
}

#[tokio::test]
async fn without_users_there_is_no_login_and_the_page_needs_none() {
    let api = serve(false, |_| {}).await;
    let (status, _, body) = api.call(Method::GET, "/session", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["login_required"], false);
    let (status, _, body) = api
        .call(
            Method::POST,
            "/login",
            &[],
            Some(json!({"user": "admin", "password": "whatever it is"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "login_not_needed");
    // A stale cookie from an earlier run with users means nothing.
    let (status, _, body) = api
        .call(
            Method::POST,
            "/topics",
            &[("cookie", "ferrymq_session=00")],
            Some(json!({"name": "orders"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Purge and pause are grants of their own over HTTP too: a user granted only one of them may
/// do that and nothing else, and is told which action it lacks.
#[tokio::test]
async fn purge_and_pause_are_grants_of_their_own_over_http() {
    let api = serve(true, |_| {}).await;
    let auth = api.broker.auth();
    auth.add_user("purger", "purger password", 0).unwrap();
    auth.add_user("pauser", "pauser password", 0).unwrap();
    auth.grant("purger", "jobs", parse_actions("purge").unwrap(), 0)
        .unwrap();
    auth.grant("pauser", "jobs", parse_actions("pause").unwrap(), 0)
        .unwrap();
    let bearer = |user: &str| {
        let token = auth.create_token(user, "ops", 0).unwrap();
        format!("Bearer {token}")
    };
    let (purger, pauser, admin) = (bearer("purger"), bearer("pauser"), bearer("admin"));
    let call = |method: Method, path: &'static str, who: &str| {
        let headers = [("authorization", who.to_owned())];
        let api = &api;
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let (status, _, body) = api.call(method, path, &headers, Some(json!({}))).await;
            (status, body)
        }
    };
    let (status, _, body) = api
        .call(
            Method::POST,
            "/topics",
            &[("authorization", admin.as_str())],
            Some(json!({"name": "jobs", "storage": "memory"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let _consumer = api
        .broker
        .subscribe(&ferrymq_protocol::SubscribeRequest::earliest(
            "jobs", "workers",
        ))
        .unwrap();

    let (status, body) = call(Method::POST, "/topics/jobs/purge", &purger).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"purged": 0})));
    let (status, body) = call(Method::DELETE, "/topics/jobs", &purger).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["error"]["message"],
        "user 'purger' (token) may not manage topic 'jobs'"
    );
    let pause = "/topics/jobs/subscriptions/workers/pause";
    let (status, body) = call(Method::POST, pause, &purger).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["error"]["message"],
        "user 'purger' (token) may not pause subscriptions of topic 'jobs' (needs the pause or manage action)"
    );

    let (status, body) = call(Method::POST, pause, &pauser).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(api.broker.subscription_paused("jobs", "workers"), Ok(true));
    let resume = "/topics/jobs/subscriptions/workers/resume";
    let (status, body) = call(Method::POST, resume, &pauser).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = call(Method::POST, "/topics/jobs/purge", &pauser).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs the purge or manage action"),
        "{body}"
    );
    let (status, body) = call(
        Method::DELETE,
        "/topics/jobs/subscriptions/workers",
        &pauser,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}
